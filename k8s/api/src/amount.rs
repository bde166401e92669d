//! A pod's requests and limits as Kubernetes sums them
//! (`k8s.io/component-helpers/resource`: `PodRequests`, `PodLimits`), by
//! resource name: CPU in millicores, every other resource in its units.

use qoslet_hooks::quantity::Quantity;

use crate::view::{ContainerView, PodView, ResourceList, ResourcesView};

/// Which of a pod's amounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// `PodRequests`.
    Requests,
    /// `PodLimits`: a container without a limit adds nothing (the
    /// scheduler's sum: LoadAware's estimator reads it).
    Limits,
    /// The pod's bound: 0 (none) when a regular container has no limit, as
    /// kubelet sizes the pod's cgroup (the node agent reads it).
    Bound,
}

/// A quantity of `name` in `list`: CPU in millicores, others in whole
/// units (`None`: absent or not a quantity).
pub fn quantity(list: Option<&ResourceList>, name: &str) -> Option<i64> {
    let q = Quantity::parse(list?.get(name)?.trim()).ok()?;
    if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    }
}

/// A container's amount; a request missing where a limit is set is the
/// limit (the API server's defaulting: a pod read from a file may lack it).
pub fn container_amount(c: &ContainerView, which: Which, name: &str) -> Option<i64> {
    let r: Option<&ResourcesView> = c.resources.as_ref();
    let limit = || quantity(r.and_then(|r| r.limits.as_ref()), name);
    match which {
        Which::Requests => quantity(r.and_then(|r| r.requests.as_ref()), name).or_else(limit),
        Which::Limits | Which::Bound => limit(),
    }
}

/// The regular containers of a pod.
pub fn containers(p: &PodView) -> &[ContainerView] {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.as_deref())
        .unwrap_or_default()
}

/// A pod's amount of `name`: the regular containers summed with the
/// sidecars (init containers that keep running); each other init container
/// runs alone with the sidecars started before it, and the pod needs at
/// least the most of those; the overhead is added to a total that is not
/// zero. Pod-level resources (Kubernetes 1.32+), when set for the resource,
/// are the pod's amount instead (plus the overhead).
pub fn pod_amount(p: &PodView, which: Which, name: &str) -> i64 {
    let spec = p.spec.as_ref();
    let containers = containers(p);
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let overhead = spec.and_then(|s| s.overhead.as_ref());
    let level = spec.and_then(|s| s.resources.as_ref());
    // pod-level resources, when set for this resource, are the pod's (a
    // pod-level request missing where its limit is set is the limit)
    let pod_level = level.and_then(|r| {
        let limit = quantity(r.limits.as_ref(), name);
        match which {
            Which::Requests => quantity(r.requests.as_ref(), name).or(limit),
            Which::Limits | Which::Bound => limit,
        }
    });
    if let Some(v) = pod_level.filter(|v| *v > 0) {
        return v.saturating_add(quantity(overhead, name).unwrap_or(0));
    }
    if which == Which::Bound
        && containers
            .iter()
            .any(|c| container_amount(c, which, name).is_none())
    {
        return 0;
    }
    let of = |c: &ContainerView| container_amount(c, which, name).unwrap_or(0);
    let mut sidecars = 0i64;
    let mut init_max = 0i64;
    for c in init {
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.saturating_add(of(c));
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(of(c)));
        }
    }
    let regular = containers
        .iter()
        .map(of)
        .fold(0i64, i64::saturating_add)
        .saturating_add(sidecars);
    let total = regular.max(init_max).max(0);
    if total == 0 {
        return 0;
    }
    total.saturating_add(quantity(overhead, name).unwrap_or(0))
}
