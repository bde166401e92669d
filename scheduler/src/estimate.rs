//! LoadAware's default estimator (`estimator/default_estimator.go`): what a
//! pod will use before its node reports it.

use std::collections::BTreeMap;

use qoslet_colocation::Res;

use crate::args::PerResource;

/// 0.25 core: a pod that asks for no CPU.
pub const DEFAULT_MILLI_CPU: i64 = 250;
/// 200 MiB: a pod that asks for no memory.
pub const DEFAULT_MEMORY: i64 = 200 << 20;

/// A pod as the estimator and the filter see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Koordinator's priority class (`koord-prod`, ...; `None`: none).
    pub priority_class: Option<&'static str>,
    /// The pod's requests and limits as the scheduler sums them
    /// (`PodRequests`/`PodLimits`), by resource name: `cpu` in milli-cores,
    /// every other resource in its units (`kubernetes.io/batch-cpu` is
    /// already milli-cores).
    pub requests: BTreeMap<String, i64>,
    pub limits: BTreeMap<String, i64>,
    /// Owned by a DaemonSet: always passes the filter.
    pub daemonset: bool,
}

impl PodFacts {
    pub fn is_prod(&self) -> bool {
        self.priority_class == Some("koord-prod")
    }
}

/// The resource a pod of `class` asks for in place of `cpu`/`memory`
/// (`TranslateResourceNameByPriorityClass`; `None` for free pods: no
/// mapping, so no estimate).
fn translated(class: Option<&str>, cpu: bool) -> Option<&'static str> {
    match (class, cpu) {
        (None | Some("koord-prod"), true) => Some("cpu"),
        (None | Some("koord-prod"), false) => Some("memory"),
        (Some("koord-batch"), true) => Some(qoslet_colocation::BATCH_CPU),
        (Some("koord-batch"), false) => Some(qoslet_colocation::BATCH_MEMORY),
        (Some("koord-mid"), true) => Some("kubernetes.io/mid-cpu"),
        (Some("koord-mid"), false) => Some("kubernetes.io/mid-memory"),
        _ => None,
    }
}

/// The estimate of `pod` with scaling factors `factors` (percent): per
/// resource the larger of its limit and request, times the factor,
/// rounded, capped at the limit; 250m / 200 MiB when it asks for none.
pub fn estimate(pod: &PodFacts, factors: PerResource) -> Res {
    let one = |cpu: bool, factor: i64| -> i64 {
        let Some(name) = translated(pod.priority_class, cpu) else {
            return 0;
        };
        let limit = pod.limits.get(name).copied().unwrap_or(0);
        let request = pod.requests.get(name).copied().unwrap_or(0);
        let q = limit.max(request);
        // the defaults are for cpu, memory and the batch resources; a mid
        // pod that asks for no mid resource estimates nothing
        if q <= 0 && name.starts_with("kubernetes.io/mid-") {
            return 0;
        }
        if q <= 0 {
            return if cpu {
                DEFAULT_MILLI_CPU
            } else {
                DEFAULT_MEMORY
            };
        }
        // Go's math.Round on a float64
        let e = (q as f64 * factor as f64 / 100.0).round() as i64;
        if limit > 0 && e > limit {
            limit
        } else {
            e
        }
    };
    Res::new(one(true, factors.cpu), one(false, factors.memory))
}
