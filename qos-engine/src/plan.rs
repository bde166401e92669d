//! A plan: the cgroup writes the plugins want this tick, each with the plugin
//! and the rule behind it, merged so that one file gets one value.
//!
//! Merging (two plugins set the same setting of the same cgroup): the
//! strictest value wins, protecting LS pods. For limits that is the lower
//! one (CFS quota, memory limit/high, burst, shares, fewer CPUs, group
//! identity, each I/O limit); SCHED_IDLE on beats off; for protections
//! (memory.min/low) the higher one.

// settings by (cgroup, knob): names from the store (kubelet's and the
// runtime's ids), not chosen by pod authors; SipHash showed in the tick's profile
use qoslet_metrics::fasthash::FastMap;

use qoslet_cgroups::{CgroupPath, Knob, KnobKind};
pub use qoslet_hooks::decide::Plugin;

/// One desired write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub cgroup: CgroupPath,
    pub knob: Knob,
    /// The plugin that wants it.
    pub plugin: Plugin,
    /// Why, in words.
    pub rule: String,
}

/// The writes of one tick, one per (cgroup, setting), in the order added.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    writes: Vec<Write>,
    index: FastMap<Key, usize>,
    /// What a file goes back to when it leaves the plan, where that is not
    /// the kernel's default (kubelet's quota, cpuset, memory limit).
    restore: FastMap<Key, Knob>,
}

impl PartialEq for Plan {
    fn eq(&self, other: &Self) -> bool {
        self.writes == other.writes
    }
}

impl Eq for Plan {}

/// What identifies "the same file": the cgroup, the knob kind, and the device for I/O limits.
pub type Key = (CgroupPath, KnobKind, Option<qoslet_cgroups::Device>);

/// The key of a write.
pub fn key(w: &Write) -> Key {
    let dev = match &w.knob {
        Knob::IoLimit { device, .. } => Some(*device),
        _ => None,
    };
    (w.cgroup.clone(), w.knob.kind(), dev)
}

/// The stricter of two values of the same knob kind (for I/O limits: field by field).
pub fn strictest(a: &Knob, b: &Knob) -> Knob {
    a.strictest(b)
}

impl Plan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a write; a second write of the same setting of the same cgroup
    /// merges into the first (strictest value, both rules kept).
    pub fn add(&mut self, w: Write) {
        let k = key(&w);
        if let Some(&i) = self.index.get(&k) {
            let cur = &mut self.writes[i];
            let merged = strictest(&cur.knob, &w.knob);
            if merged == w.knob && merged != cur.knob {
                cur.plugin = w.plugin;
            }
            cur.rule = format!("{}; {} ({})", cur.rule, w.rule, w.plugin);
            cur.knob = merged;
            return;
        }
        self.index.insert(k, self.writes.len());
        self.writes.push(w);
    }

    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The write of the file `k` names.
    pub fn get(&self, k: &Key) -> Option<&Write> {
        self.index.get(k).map(|&i| &self.writes[i])
    }

    /// Whether the plan sets the file `k` names.
    pub fn contains(&self, k: &Key) -> bool {
        self.index.contains_key(k)
    }

    /// The value `w`'s file goes back to once no plugin plans it (instead of
    /// the kernel's default): what its owner asked for.
    pub fn restore_to(&mut self, w: &Write, to: Knob) {
        self.restore.entry(key(w)).or_insert(to);
    }

    /// What the file `k` names goes back to when it leaves the plan, if set.
    pub fn restore_of(&self, k: &Key) -> Option<&Knob> {
        self.restore.get(k)
    }

    pub fn len(&self) -> usize {
        self.writes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(cg: &str, knob: Knob, plugin: Plugin) -> Write {
        Write {
            cgroup: CgroupPath::parse(cg).unwrap(),
            knob,
            plugin,
            rule: format!("{plugin} says"),
        }
    }

    fn quota(q: Option<u64>, period: u64) -> Knob {
        Knob::CpuQuota { quota: q, period }
    }

    #[test]
    fn the_strictest_value_wins() {
        let cases = [
            (
                quota(Some(50_000), 100_000),
                quota(None, 100_000),
                quota(Some(50_000), 100_000),
            ),
            (
                quota(Some(60_000), 100_000),
                quota(Some(25_000), 50_000),
                quota(Some(25_000), 50_000),
            ),
            (
                Knob::CpuIdle(false),
                Knob::CpuIdle(true),
                Knob::CpuIdle(true),
            ),
            (
                Knob::GroupIdentity(2),
                Knob::GroupIdentity(-1),
                Knob::GroupIdentity(-1),
            ),
            (
                Knob::MemoryHigh(None),
                Knob::MemoryHigh(Some(1 << 30)),
                Knob::MemoryHigh(Some(1 << 30)),
            ),
            (
                Knob::MemoryMin(1 << 20),
                Knob::MemoryMin(2 << 20),
                Knob::MemoryMin(2 << 20),
            ),
            (
                Knob::CpusetCpus("0-7".into()),
                Knob::CpusetCpus("2,3".into()),
                Knob::CpusetCpus("2,3".into()),
            ),
            (
                Knob::CpuShares(1024),
                Knob::CpuShares(2),
                Knob::CpuShares(2),
            ),
        ];
        for (a, b, want) in cases {
            assert_eq!(strictest(&a, &b), want, "{a:?} vs {b:?}");
            assert_eq!(
                strictest(&b, &a),
                want,
                "{b:?} vs {a:?} (order does not matter)"
            );
        }
        let dev = qoslet_cgroups::Device { major: 8, minor: 0 };
        let io = |r, wr| Knob::IoLimit {
            device: dev,
            limits: qoslet_cgroups::IoLimits {
                read_bps: r,
                write_bps: wr,
                ..Default::default()
            },
        };
        assert_eq!(
            strictest(&io(Some(10), None), &io(Some(20), Some(5))),
            io(Some(10), Some(5))
        );
    }

    #[test]
    fn one_write_per_setting_per_cgroup() {
        let mut p = Plan::new();
        p.add(w(
            "/kubepods/besteffort",
            quota(Some(400_000), 100_000),
            Plugin::BatchResources,
        ));
        p.add(w(
            "/kubepods/besteffort",
            quota(Some(200_000), 100_000),
            Plugin::CpuSuppress,
        ));
        p.add(w(
            "/kubepods/besteffort",
            Knob::CpuIdle(true),
            Plugin::CpuQos,
        ));
        p.add(w(
            "/kubepods/burstable",
            quota(Some(100_000), 100_000),
            Plugin::CpuBurst,
        ));
        assert_eq!(p.writes().len(), 3);
        let be = &p.writes()[0];
        assert_eq!(be.knob, quota(Some(200_000), 100_000));
        assert_eq!(be.plugin, Plugin::CpuSuppress, "the plugin whose value won");
        assert!(be.rule.contains("batch-resources says") && be.rule.contains("cpu-suppress says"));
    }
}
