//! The `cpuset` suppress policy, as koordlet's cpusuppress `adjustByCPUSet`
//! and `calculateBESuppressCPUSetPolicy` pick it: BE gets a set of cores
//! sized to the BE allowance (at least 2), from the CPUs no LSE pod is bound
//! to (kubelet's reserved CPUs included, as koordlet has them); CPUs bound to LSR pods are BE's in
//! proportion to their share of those. Within each group, CPUs are taken
//! round-robin over the (NUMA node, socket) buckets, largest first,
//! hyper-thread sibling pairs first, from the lowest core ids. Growing is
//! limited to 10 % of the node's CPUs per tick; shrinking is immediate.

use std::collections::{BTreeMap, BTreeSet};

/// The fewest cores BE gets.
pub const MIN_BE_CPUS: usize = 2;

/// Where a CPU sits (`/sys/devices/system/cpu/cpuN/topology`): its core
/// (hyper-thread siblings share it) and its socket (`physical_package_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPlace {
    pub core: u32,
    pub socket: u32,
}

/// What the policy reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// The CPUs BE may take, per NUMA node (online, within kubelet's shared
    /// pool and the v1 ceiling).
    pub numa: Vec<Vec<u32>>,
    /// Core and socket by CPU id (a CPU missing here is its own core on socket 0).
    pub places: BTreeMap<u32, CpuPlace>,
    /// CPUs bound to LSE pods: never BE's.
    pub lse: BTreeSet<u32>,
    /// CPUs bound to LSR pods: BE's in proportion.
    pub lsr: BTreeSet<u32>,
    /// The BE allowance in cores.
    pub allowance_cores: f64,
    /// The BE cpuset now (`None`: not set by qoslet yet).
    pub current: Option<BTreeSet<u32>>,
    /// All the node's CPUs (a tick grows BE by at most 10 % of them).
    pub node_cpus: usize,
}

pub use qoslet_cgroups::cgroup::{format_cpu_list as format_cpus, parse_cpu_list as parse_cpus};

/// One candidate CPU.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    id: u32,
    core: u32,
    bucket: (u32, u32),
}

/// The BE cpuset to write (`None`: unchanged).
pub fn be_cpuset(i: &Input) -> Option<BTreeSet<u32>> {
    let place = |id: u32| {
        i.places.get(&id).copied().unwrap_or(CpuPlace {
            core: id,
            socket: 0,
        })
    };
    let (mut lsr, mut ls) = (Vec::new(), Vec::new());
    for (node, cpus) in i.numa.iter().enumerate() {
        for &id in cpus.iter().filter(|c| !i.lse.contains(c)) {
            let p = place(id);
            let cpu = Cpu {
                id,
                core: p.core,
                bucket: (node as u32, p.socket),
            };
            if i.lsr.contains(&id) {
                lsr.push(cpu);
            } else {
                ls.push(cpu);
            }
        }
    }
    let avail = lsr.len() + ls.len();
    if avail == 0 {
        return None;
    }
    let a = if i.allowance_cores.is_finite() {
        i.allowance_cores.max(0.0)
    } else {
        0.0
    };
    let mut want = (a.ceil() as usize).clamp(MIN_BE_CPUS.min(avail), avail);
    let cur_n = i.current.as_ref().map(BTreeSet::len).unwrap_or(avail);
    if want > cur_n {
        let step = (i.node_cpus.max(avail) as f64 * 0.10).ceil().max(1.0) as usize;
        want = want.min(cur_n + step);
    }
    // LSR's CPUs in proportion to their share (rounded down), the rest from the others
    let from_lsr = want * lsr.len() / avail;
    let mut chosen = pick(from_lsr, &lsr);
    chosen.extend(pick(want - from_lsr, &ls));
    (Some(&chosen) != i.current.as_ref()).then_some(chosen)
}

/// `n` CPUs of `cpus` as koordlet's `calculateBESuppressCPUSetPolicy` picks
/// them: buckets per (NUMA node, socket), each in (core, id) order, the
/// largest bucket first (then the lowest first CPU); hyper-thread sibling
/// pairs taken round-robin over the buckets while two or more are wanted,
/// then single CPUs round-robin.
fn pick(n: usize, cpus: &[Cpu]) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    if n == 0 || cpus.len() < n {
        return out;
    }
    let mut by: BTreeMap<(u32, u32), Vec<Cpu>> = BTreeMap::new();
    for c in cpus {
        by.entry(c.bucket).or_default().push(*c);
    }
    let mut buckets: Vec<Vec<Cpu>> = by.into_values().collect();
    for b in &mut buckets {
        b.sort_by_key(|c| (c.core, c.id));
    }
    buckets.sort_by(|x, y| y.len().cmp(&x.len()).then(x[0].id.cmp(&y[0].id)));
    let mut need = n;
    // sibling pairs, one per bucket per round, until a round takes none
    let mut i = 0;
    let mut before_round = usize::MAX;
    loop {
        if need <= 1 {
            break;
        }
        if i == 0 {
            if before_round == need {
                break;
            }
            before_round = need;
        }
        let b = &buckets[i];
        if let Some(j) = (0..b.len().saturating_sub(1))
            .find(|&j| !out.contains(&b[j].id) && b[j].core == b[j + 1].core)
        {
            out.insert(b[j].id);
            out.insert(b[j + 1].id);
            need -= 2;
        }
        i = (i + 1) % buckets.len();
    }
    // then single CPUs, from where the pairs stopped
    let start = i;
    let mut before_round = usize::MAX;
    loop {
        if need == 0 {
            break;
        }
        if i == start {
            if before_round == need {
                break;
            }
            before_round = need;
        }
        if let Some(c) = buckets[i].iter().find(|c| !out.contains(&c.id)) {
            out.insert(c.id);
            need -= 1;
        }
        i = (i + 1) % buckets.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    /// Two sockets, one NUMA node each, 4 cores x 2 hyper-threads, numbered as
    /// Linux does: CPUs 0-3 socket 0 and 4-7 socket 1 (first threads), 8-11
    /// and 12-15 their siblings; core ids restart per socket.
    fn ht_node() -> (Vec<Vec<u32>>, BTreeMap<u32, CpuPlace>) {
        let places = (0..16)
            .map(|c| {
                (
                    c,
                    CpuPlace {
                        core: c % 4,
                        socket: (c / 4) % 2,
                    },
                )
            })
            .collect();
        let numa = vec![
            vec![0, 1, 2, 3, 8, 9, 10, 11],
            vec![4, 5, 6, 7, 12, 13, 14, 15],
        ];
        (numa, places)
    }

    fn input(allowance: f64, lse: &[u32], lsr: &[u32], current: Option<&[u32]>) -> Input {
        let (numa, places) = ht_node();
        Input {
            numa,
            places,
            lse: set(lse),
            lsr: set(lsr),
            allowance_cores: allowance,
            current: current.map(set),
            node_cpus: 16,
        }
    }

    /// Values worked out by hand from koordlet's cpusuppress `adjustByCPUSet`
    /// (LSE out, LSR in proportion, at least 2) and
    /// `calculateBESuppressCPUSetPolicy` (buckets per NUMA node and socket,
    /// largest first, sibling pairs round-robin, then singles).
    #[test]
    fn picked_as_koordlets_cpu_suppress() {
        // (allowance, LSE, LSR, expected)
        let table: &[(f64, &[u32], &[u32], &str)] = &[
            // 4 cores: a sibling pair from each socket, lowest cores first
            (3.2, &[], &[], "0,4,8,12"),
            // 3: a pair from socket 0, then a single from socket 1
            (3.0, &[], &[], "0,4,8"),
            // never below 2
            (0.0, &[], &[], "0,8"),
            (f64::NAN, &[], &[], "0,8"),
            // LSR on socket 0's first two cores (4 of 16 CPUs): 8 CPUs, 8 x 4/16 = 2
            // from LSR's (a pair), 6 from the rest (socket 1 has more left: first)
            (7.5, &[], &[0, 8, 1, 9], "0,2,4-5,8,10,12-13"),
            // LSE's CPUs are never BE's
            (2.0, &[4, 5, 6, 7, 12, 13, 14, 15], &[], "0,8"),
            (16.0, &[4, 5, 6, 7, 12, 13, 14, 15], &[], "0-3,8-11"),
        ];
        for (a, lse, lsr, want) in table {
            let got = be_cpuset(&input(*a, lse, lsr, None)).unwrap();
            assert_eq!(
                format_cpus(&got),
                *want,
                "allowance {a} LSE {lse:?} LSR {lsr:?}"
            );
        }
        // without a topology every CPU is its own core: singles, round-robin
        let mut i = input(3.0, &[], &[], None);
        i.places.clear();
        i.numa = vec![(0..8).collect(), (8..16).collect()];
        assert_eq!(format_cpus(&be_cpuset(&i).unwrap()), "0-1,8");
    }

    #[test]
    fn grows_stepwise_shrinks_at_once_and_holds_when_steady() {
        // 16 CPUs: growth is at most ceil(1.6) = 2 cores per tick
        let got = be_cpuset(&input(12.0, &[], &[], Some(&[0, 8]))).unwrap();
        assert_eq!(format_cpus(&got), "0,4,8,12");
        let cur: Vec<u32> = got.iter().copied().collect();
        assert_eq!(
            be_cpuset(&input(3.9, &[], &[], Some(&cur))),
            None,
            "steady: no write"
        );
        let wide = [0, 1, 4, 5, 8, 9, 12, 13];
        let got = be_cpuset(&input(2.0, &[], &[], Some(&wide))).unwrap();
        assert_eq!(format_cpus(&got), "0,8", "shrinking is immediate");
    }

    #[test]
    fn odd_inputs() {
        assert_eq!(
            be_cpuset(&input(4.0, &(0..16).collect::<Vec<_>>(), &[], None)),
            None,
            "every CPU bound to LSE: nothing to take"
        );
        // one CPU left: it is all BE gets
        let mut i = input(4.0, &[], &[], None);
        i.numa = vec![vec![3]];
        assert_eq!(format_cpus(&be_cpuset(&i).unwrap()), "3");
        assert_eq!(format_cpus(&set(&[0, 1, 2, 5, 7, 8])), "0-2,5,7-8");
        assert_eq!(format_cpus(&BTreeSet::new()), "");
    }
}
