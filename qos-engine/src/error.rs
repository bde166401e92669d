//! What can go wrong in the engine, typed: a policy refused while parsed
//! ([`InvalidPolicy`]), a write or reconcile that failed on this host
//! ([`EngineError`]), and a condition the operator should know of
//! ([`Warning`]). Errors and warnings come back tick after tick while their
//! cause lasts; [`Once`] logs each (kind, subject) once while it lasts, not
//! once per wording (a failed write of another value to the same file is the
//! same failure) and not forever (one that comes back after it was gone for
//! [`FORGET_AFTER`] ticks is logged again).

use std::collections::HashMap;

use qoslet_cgroups::{CgroupError, CgroupPath, Device, KnobKind};

/// Why a policy is refused, whichever source offered it: it is never
/// applied in part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPolicy {
    /// A field name neither qoslet nor Koordinator defines.
    #[error(transparent)]
    Field(#[from] qoslet_hooks::nodeslo::NodeSloError),
    /// A section whose values do not parse (a wrong type, an unknown enum value).
    #[error("{section}: {message}")]
    Parse {
        section: &'static str,
        message: String,
    },
    /// A value out of its range.
    #[error(transparent)]
    Range(#[from] qoslet_hooks::policy::PolicyError),
}

/// What an error or warning is about, for deduplication: one per kind and
/// subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Write,
    Restore,
    WidenCpuset,
    Resctrl,
    GroupIdentitySysctl,
    NoCfsBurst,
    PodBurst,
    NoBeParent,
}

/// A (kind, subject) pair: what [`Once`] deduplicates on.
pub type Key = (Kind, String);

/// A write or reconcile of the engine that failed (the others of the tick
/// still ran). The cgroup layer's error is kept as its text: I/O errors are
/// not `Clone`, and the last tick's report is shared with the admin API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A planned write (the text names the file and the value).
    #[error("{error}")]
    Write {
        cgroup: CgroupPath,
        knob: KnobKind,
        /// The device of an I/O limit (one file, one line per device).
        device: Option<Device>,
        error: String,
    },
    /// Putting back a setting that left the plan.
    #[error("restoring {cgroup}: {error}")]
    Restore {
        cgroup: CgroupPath,
        knob: KnobKind,
        device: Option<Device>,
        error: String,
    },
    /// Widening a cpuset before narrower ones are written under it.
    #[error("{error}")]
    WidenCpuset { path: String, error: String },
    /// A resctrl group's schemata or tasks.
    #[error("resctrl group {group}: {error}")]
    Resctrl { group: String, error: String },
    /// `kernel.sched_group_identity_enabled` could not be turned on.
    #[error("group identity sysctl not set: {error}")]
    GroupIdentitySysctl { error: String },
}

impl EngineError {
    /// A failed write of the plan's entry `key`.
    pub fn write(key: &crate::plan::Key, e: &CgroupError) -> Self {
        EngineError::Write {
            cgroup: key.0.clone(),
            knob: key.1,
            device: key.2,
            error: e.to_string(),
        }
    }

    pub fn key(&self) -> Key {
        let file = |cgroup: &CgroupPath, knob: &KnobKind, device: &Option<Device>| match device {
            Some(d) => format!("{cgroup} {} {d}", knob.name()),
            None => format!("{cgroup} {}", knob.name()),
        };
        match self {
            EngineError::Write {
                cgroup,
                knob,
                device,
                ..
            } => (Kind::Write, file(cgroup, knob, device)),
            EngineError::Restore {
                cgroup,
                knob,
                device,
                ..
            } => (Kind::Restore, file(cgroup, knob, device)),
            // without a path (an unsupported knob, a refused path): by its text
            EngineError::WidenCpuset { path, error } if path.is_empty() => {
                (Kind::WidenCpuset, error.clone())
            }
            EngineError::WidenCpuset { path, .. } => (Kind::WidenCpuset, path.clone()),
            EngineError::Resctrl { group, .. } => (Kind::Resctrl, group.clone()),
            EngineError::GroupIdentitySysctl { .. } => (Kind::GroupIdentitySysctl, String::new()),
        }
    }
}

/// A condition of the node or of a pod's input that the engine works around.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Warning {
    #[error("cpuBurstStrategy asks for CFS burst, but this kernel has no cpu.cfs_burst_us / cpu.max.burst; only quota scaling is done")]
    NoCfsBurst,
    /// A pod's cpuBurst annotation that is ignored or capped, and why.
    #[error("pod {pod}: {detail}")]
    PodBurst { pod: String, detail: String },
    #[error("no besteffort parent cgroup found (set qosEngine.beParent); CPU suppress is off until it appears")]
    NoBeParent,
}

impl Warning {
    pub fn key(&self) -> Key {
        match self {
            Warning::NoCfsBurst => (Kind::NoCfsBurst, String::new()),
            Warning::PodBurst { pod, .. } => (Kind::PodBurst, pod.clone()),
            Warning::NoBeParent => (Kind::NoBeParent, String::new()),
        }
    }
}

/// Ticks a reported (kind, subject) must go unreported before it is
/// forgotten and logged again when it comes back: longer than the executor's
/// longest drift-check back-off at the default 10 ticks between checks
/// (a failure seen only at each check is one failure, not one per check).
pub const FORGET_AFTER: u64 = 1000;

/// The most (kind, subject) pairs remembered; beyond it the set starts over
/// (each then logged once more).
const MAX_REMEMBERED: usize = 20_000;

/// Logs each (kind, subject) once while it lasts: [`Once::first`] is true
/// the first time it is reported, and again only after it went unreported
/// for [`FORGET_AFTER`] ticks ([`Once::end_tick`] counts them). Holds what
/// failed in that window, at most [`MAX_REMEMBERED`].
#[derive(Debug, Default)]
pub struct Once {
    /// Each key and the tick it was last reported in.
    seen: HashMap<Key, u64>,
    tick: u64,
}

impl Once {
    /// Whether `key` is new: not reported in the last [`FORGET_AFTER`] ticks.
    pub fn first(&mut self, key: Key) -> bool {
        if self.seen.len() >= MAX_REMEMBERED && !self.seen.contains_key(&key) {
            self.seen.clear();
        }
        match self.seen.insert(key, self.tick) {
            Some(last) => self.tick - last > FORGET_AFTER,
            None => true,
        }
    }

    /// The tick is over: what went unreported for [`FORGET_AFTER`] ticks is forgotten.
    pub fn end_tick(&mut self) {
        self.tick += 1;
        if self.tick.is_multiple_of(64) {
            let tick = self.tick;
            self.seen.retain(|_, last| tick - *last <= FORGET_AFTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_kind_and_subject_while_it_lasts() {
        let cg = CgroupPath::parse("kubepods/podA").unwrap();
        let e = |v: &str| EngineError::Write {
            cgroup: cg.clone(),
            knob: KnobKind::CpuQuota,
            device: None,
            error: format!("failed to write {v:?}: EINVAL"),
        };
        let mut once = Once::default();
        // another value written to the same file: the same failure
        assert!(once.first(e("10").key()));
        assert!(!once.first(e("20").key()));
        // another file of the same cgroup, another device's line, another pod: their own
        let other = EngineError::Write {
            cgroup: cg.clone(),
            knob: KnobKind::CpuShares,
            device: None,
            error: "x".into(),
        };
        assert!(once.first(other.key()));
        let io = |minor: u32| EngineError::Write {
            cgroup: cg.clone(),
            knob: KnobKind::IoLimit,
            device: Some(Device { major: 253, minor }),
            error: "x".into(),
        };
        assert!(once.first(io(0).key()));
        assert!(once.first(io(16).key()), "another device: its own failure");
        assert!(!once.first(io(16).key()));
        let pod = |p: &str, d: &str| Warning::PodBurst {
            pod: p.into(),
            detail: d.into(),
        };
        assert!(once.first(pod("a", "x").key()));
        assert!(!once.first(pod("a", "y").key()));
        assert!(once.first(pod("b", "x").key()));
        // a failure seen only every few ticks (at each drift check) is one failure
        for _ in 0..5 {
            for _ in 0..100 {
                once.end_tick();
            }
            assert!(!once.first(e("30").key()));
        }
        // gone for longer than FORGET_AFTER ticks: logged again when it comes back
        for _ in 0..=FORGET_AFTER + 64 {
            once.end_tick();
        }
        assert!(once.seen.len() <= 1, "forgotten: {:?}", once.seen);
        assert!(once.first(e("40").key()));
    }

    #[test]
    fn the_texts_are_the_ones_operators_know() {
        assert_eq!(
            EngineError::Resctrl {
                group: "BE".into(),
                error: "no such group".into()
            }
            .to_string(),
            "resctrl group BE: no such group"
        );
        assert!(Warning::NoBeParent
            .to_string()
            .contains("qosEngine.beParent"));
    }
}
