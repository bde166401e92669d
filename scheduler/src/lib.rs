//! Load-aware placement for kube-scheduler's extender API (crate
//! `qoslet-scheduler`, issue 47): Koordinator LoadAware's semantics, so that
//! a vanilla kube-scheduler places pods by what nodes really use (the
//! NodeMetric qoslet reports) and not only by requests.
//!
//! * [`args`]: `LoadAwareSchedulingArgs` with its own field names, defaults
//!   and validation.
//! * [`estimate`]: what a pod will use before its node reports it.
//! * [`load`]: one node's load, kept incrementally as LoadAware's assign
//!   cache keeps it (NodeMetric usage plus the estimates it does not show yet).
//! * [`rank`]: Filter and Score, and the extender's 0-10 scale.
//!
//! Pure: no I/O, no async. The node cache (list/watch of Nodes, NodeMetrics
//! and Pods) and the HTTP front come next and feed these.

pub mod args;
pub mod estimate;
pub mod load;
pub mod rank;

#[cfg(test)]
mod tests;
