//! Co-location's pure logic (crate `qoslet-colocation`): what a node can lend
//! to batch work and the rules around it, with no I/O and no async, so that
//! every number is table-tested and explained the same way whoever asks (the
//! agent writing its Node, `qoslet batch-resources` offline).
//!
//! * [`priority`]: Koordinator's priority class and QoS class of a pod.
//! * [`strategy`]: the `colocation-config` (Koordinator's `ColocationStrategy`):
//!   its fields and defaults, validation, the manager's merge and the
//!   per-node resolution (the first matching `nodeConfigs` entry, the node's
//!   annotation and labels).
//! * [`batch`]: koord-manager's BatchResource calculation, each term kept.
//! * [`sync`]: when the result is written to the Node, and when it is removed.
//!
//! It must not read files, call the API server or know the agent: the
//! cluster side (`qoslet-kube`) turns the cluster's objects and the metrics
//! cache into its inputs.

pub mod batch;
pub mod priority;
pub mod slo;
pub mod strategy;
pub mod sync;

use serde::Serialize;

/// `kubernetes.io/batch-cpu`: milli-cores, written as an integer count.
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
/// `kubernetes.io/batch-memory`: bytes.
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";

/// Saturating, as amounts never come near `i64`'s bounds (a node's bytes).
impl std::ops::Add for Res {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self::new(
            self.cpu.saturating_add(o.cpu),
            self.memory.saturating_add(o.memory),
        )
    }
}

impl std::ops::Sub for Res {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self::new(
            self.cpu.saturating_sub(o.cpu),
            self.memory.saturating_sub(o.memory),
        )
    }
}

/// CPU in milli-cores and memory in bytes (a ResourceList masked to the two).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Res {
    pub cpu: i64,
    pub memory: i64,
}

impl Res {
    pub const fn new(cpu: i64, memory: i64) -> Self {
        Self { cpu, memory }
    }
    /// Element-wise maximum (`quotav1.Max`).
    pub fn max(self, o: Self) -> Self {
        Self::new(self.cpu.max(o.cpu), self.memory.max(o.memory))
    }
    /// Each amount at least 0.
    pub fn clamp0(self) -> Self {
        self.max(Self::default())
    }
}

/// A Go duration as Kubernetes writes one (`5m0s`, `1h`, `90s`, `1.5h`).
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let mut rest = s.trim();
    if rest.is_empty() || rest.len() > 64 {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += n * mult;
    }
    // (a duration too large for a Duration does not parse: never a panic)
    (total.is_finite() && total >= 0.0)
        .then(|| std::time::Duration::try_from_secs_f64(total).ok())
        .flatten()
}

#[cfg(test)]
mod tests;
