//! Writing decided knobs to a cgroup, and recording the outcome in the store.

use qoslet_cgroups::{CgroupError, CgroupPath, Cgroups, Knob};
use qoslet_hooks::decide::Decision;
use qoslet_hooks::QosClass;
use qoslet_state::store::Store;
use tracing::{debug, warn};

use crate::IsolationError;

/// Writes knobs to a cgroup. Every knob is tried: one the kernel refuses does
/// not keep the others from being applied. Each failure is logged; the first
/// is the event's error. Blocking: front ends call the events off the thread
/// that serves the runtime's caller.
pub(crate) fn write(cgroups: Option<&Cgroups>, cg: &CgroupPath, knobs: &[Knob]) -> Written {
    let Some(c) = cgroups else {
        return Written::default();
    };
    let mut failed = Vec::new();
    for k in knobs {
        match c.apply(cg, k) {
            Ok(_) => debug!(cgroup = %cg, knob = ?k, "applied"),
            // the pod or container ended meanwhile: nothing to isolate, nothing to record
            Err(e @ CgroupError::Gone { .. }) => {
                debug!(knob = k.name(), error = %e, "cgroup setting not applied");
                return Written { failed, gone: true };
            }
            Err(e) => {
                warn!(cgroup = %cg, knob = k.name(), error = %e, "cgroup setting not applied");
                failed.push((k.clone(), e));
            }
        }
    }
    Written {
        failed,
        gone: false,
    }
}

/// What [`write`] could not write: each knob with its error.
#[derive(Default)]
pub(crate) struct Written {
    failed: Vec<(Knob, CgroupError)>,
    /// The cgroup was gone (its pod or container ended): nothing was written
    /// after that, and nothing is to be recorded.
    pub(crate) gone: bool,
}

impl Written {
    /// Why the write of `knob` failed (`None`: it did not fail).
    fn failure(&self, knob: Option<&Knob>) -> Option<&CgroupError> {
        let knob = knob?;
        self.failed.iter().find(|(k, _)| k == knob).map(|(_, e)| e)
    }

    /// The event's result: the first failure.
    pub(crate) fn result(self) -> Result<(), IsolationError> {
        match self.failed.into_iter().next() {
            Some((_, e)) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// `applied` entries as they are: a setting whose write failed says so.
    pub(crate) fn entries(&self, ds: &[&Decision], v2: bool) -> Vec<(String, String)> {
        ds.iter()
            .map(|d| {
                let (setting, value) = d.setting(v2);
                let v = match self.failure(d.knob()) {
                    Some(e) => format!("failed: {value} ({}): {e}", d.because),
                    None => format!("{value} ({})", d.because),
                };
                (setting, v)
            })
            .collect()
    }
}

/// Records a container's class and settings in the store.
pub(crate) fn record(store: &Store, container: &str, class: QosClass, rules: &[(String, String)]) {
    store.set_container_applied(container, "class", class.as_str());
    for (k, v) in rules {
        store.set_container_applied(container, k, v);
    }
}
