//! The `cpuset` suppress policy: BE pods get a set of cores sized to the BE
//! allowance (at least 2), taken from the share pool (the CPUs no LSE/LSR pod
//! is bound to), spread over NUMA nodes in proportion to each node's share
//! pool, from the highest CPU ids down. Growing is limited to 10 % of the
//! node's CPUs per tick; shrinking is immediate.

use std::collections::BTreeSet;

/// The fewest cores BE gets.
pub const MIN_BE_CPUS: usize = 2;

/// What the policy reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Online CPUs per NUMA node.
    pub numa: Vec<Vec<u32>>,
    /// CPUs bound to LSE/LSR pods (out of the share pool).
    pub exclusive: BTreeSet<u32>,
    /// The BE allowance in cores.
    pub allowance_cores: f64,
    /// The BE cpuset now (`None`: not set by qoslet yet).
    pub current: Option<BTreeSet<u32>>,
}

pub use qoslet_cgroups::cgroup::{format_cpu_list as format_cpus, parse_cpu_list as parse_cpus};

/// The BE cpuset to write (`None`: unchanged).
pub fn be_cpuset(i: &Input) -> Option<BTreeSet<u32>> {
    let pools: Vec<Vec<u32>> = i
        .numa
        .iter()
        .map(|n| {
            n.iter()
                .copied()
                .filter(|c| !i.exclusive.contains(c))
                .collect()
        })
        .collect();
    let pool_total: usize = pools.iter().map(Vec::len).sum();
    if pool_total == 0 {
        return None;
    }
    let all: usize = i.numa.iter().map(Vec::len).sum();
    let a = if i.allowance_cores.is_finite() {
        i.allowance_cores.max(0.0)
    } else {
        0.0
    };
    let mut want = (a.ceil() as usize).clamp(MIN_BE_CPUS.min(pool_total), pool_total);
    let cur_n = i.current.as_ref().map(BTreeSet::len).unwrap_or(pool_total);
    if want > cur_n {
        let step = (all as f64 * 0.10).ceil().max(1.0) as usize;
        want = want.min(cur_n + step);
    }
    // per node, in proportion to its share pool (largest remainders get the rest)
    let mut take: Vec<usize> = pools.iter().map(|p| want * p.len() / pool_total).collect();
    let mut rest = want - take.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..pools.len()).collect();
    order.sort_by_key(|&n| std::cmp::Reverse((want * pools[n].len()) % pool_total));
    for n in order.into_iter().cycle().take(pools.len() * 2) {
        if rest == 0 {
            break;
        }
        if take[n] < pools[n].len() {
            take[n] += 1;
            rest -= 1;
        }
    }
    let chosen: BTreeSet<u32> = pools
        .iter()
        .zip(&take)
        .flat_map(|(p, &k)| p.iter().rev().take(k).copied())
        .collect();
    (Some(&chosen) != i.current.as_ref()).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    fn two_nodes() -> Vec<Vec<u32>> {
        vec![(0..8).collect(), (8..16).collect()]
    }

    fn input(allowance: f64, exclusive: &[u32], current: Option<&[u32]>) -> Input {
        Input {
            numa: two_nodes(),
            exclusive: set(exclusive),
            allowance_cores: allowance,
            current: current.map(set),
        }
    }

    #[test]
    fn sized_to_the_allowance_spread_over_nodes() {
        // 4 cores, from the top of each node's share pool
        let got = be_cpuset(&input(3.2, &[], None)).unwrap();
        assert_eq!(format_cpus(&got), "6-7,14-15");
        // LSR bound to 4-7: node 0's pool is 0-3 (4), node 1's 8-15 (8): 6 cores split 2:4
        let got = be_cpuset(&input(6.0, &[4, 5, 6, 7], None)).unwrap();
        assert_eq!(format_cpus(&got), "2-3,12-15");
        // never below 2 cores
        let got = be_cpuset(&input(0.0, &[], None)).unwrap();
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn grows_stepwise_shrinks_at_once_and_holds_when_steady() {
        // 16 CPUs: growth is at most ceil(1.6) = 2 cores per tick
        let cur = [7, 15];
        let got = be_cpuset(&input(12.0, &[], Some(&cur))).unwrap();
        assert_eq!(got.len(), 4);
        let cur: Vec<u32> = got.iter().copied().collect();
        assert_eq!(
            be_cpuset(&input(3.9, &[], Some(&cur))),
            None,
            "steady: no write"
        );
        let got = be_cpuset(&input(2.0, &[], Some(&[4, 5, 6, 7, 12, 13, 14, 15]))).unwrap();
        assert_eq!(format_cpus(&got), "7,15", "shrinking is immediate");
    }

    #[test]
    fn odd_inputs() {
        assert_eq!(
            be_cpuset(&input(4.0, &(0..16).collect::<Vec<_>>(), None)),
            None,
            "no share pool"
        );
        assert_eq!(be_cpuset(&input(f64::NAN, &[], None)).unwrap().len(), 2);
        assert_eq!(format_cpus(&set(&[0, 1, 2, 5, 7, 8])), "0-2,5,7-8");
        assert_eq!(format_cpus(&BTreeSet::new()), "");
    }
}
