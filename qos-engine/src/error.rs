//! What can go wrong in the engine, typed: a policy refused while parsed
//! ([`InvalidPolicy`]), a write or reconcile that failed on this host
//! ([`EngineError`]), and a condition the operator should know of
//! ([`Warning`]). Errors and warnings come back tick after tick while their
//! cause lasts; [`Once`] logs each (kind, subject) once while it lasts, not
//! once per wording (a failed write of another value to the same file is the
//! same failure) and not forever (one that comes back after it cleared is
//! logged again).

use std::collections::HashSet;

use qoslet_cgroups::{CgroupError, CgroupPath, KnobKind};

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
        error: String,
    },
    /// Putting back a setting that left the plan.
    #[error("restoring {cgroup}: {error}")]
    Restore {
        cgroup: CgroupPath,
        knob: KnobKind,
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
    pub fn write(cgroup: &CgroupPath, knob: KnobKind, e: &CgroupError) -> Self {
        EngineError::Write {
            cgroup: cgroup.clone(),
            knob,
            error: e.to_string(),
        }
    }

    pub fn key(&self) -> Key {
        match self {
            EngineError::Write { cgroup, knob, .. } => {
                (Kind::Write, format!("{cgroup} {}", knob.name()))
            }
            EngineError::Restore { cgroup, knob, .. } => {
                (Kind::Restore, format!("{cgroup} {}", knob.name()))
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

/// Logs each (kind, subject) once while it lasts: [`Once::first`] is true
/// the first tick it is reported, and [`Once::end_tick`] forgets whatever was
/// not reported since the last one, so a failure that clears and comes back
/// is logged again. Holds only what is failing now (no unbounded set).
#[derive(Debug, Default)]
pub struct Once {
    seen: HashSet<Key>,
    now: HashSet<Key>,
}

impl Once {
    /// Whether `key` is new: reported neither the tick before nor already in this one.
    pub fn first(&mut self, key: Key) -> bool {
        let before = self.seen.contains(&key);
        self.now.insert(key) && !before
    }

    /// The tick is over: what was not reported in it is forgotten.
    pub fn end_tick(&mut self) {
        self.seen = std::mem::take(&mut self.now);
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
            error: format!("failed to write {v:?}: EINVAL"),
        };
        let mut once = Once::default();
        // another value written to the same file: the same failure
        assert!(once.first(e("10").key()));
        assert!(!once.first(e("20").key()));
        // another file of the same cgroup, another pod: their own
        let other = EngineError::Write {
            cgroup: cg.clone(),
            knob: KnobKind::CpuShares,
            error: "x".into(),
        };
        assert!(once.first(other.key()));
        assert!(once.first(
            Warning::PodBurst {
                pod: "a".into(),
                detail: "x".into()
            }
            .key()
        ));
        assert!(!once.first(
            Warning::PodBurst {
                pod: "a".into(),
                detail: "y".into()
            }
            .key()
        ));
        assert!(once.first(
            Warning::PodBurst {
                pod: "b".into(),
                detail: "x".into()
            }
            .key()
        ));
        once.end_tick();
        // still failing the next tick: not logged again
        assert!(!once.first(e("30").key()));
        once.end_tick();
        // it cleared for a tick, then came back: logged again
        once.end_tick();
        assert!(once.first(e("40").key()));
        assert_eq!(once.seen.len() + once.now.len(), 1);
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
