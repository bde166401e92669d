//! Eviction decisions, pure (no I/O, no async): kubelet's node-pressure model
//! ([`kubelet`]: signals, thresholds, grace periods, minimum reclaim, node
//! conditions, ranking, admission) and Koordinator's BE model ([`koord`]:
//! BE memory and CPU-satisfaction eviction, cool-downs). The agent observes,
//! reclaims and stops pods; this room decides, and is table-tested with
//! kubelet's and koordlet's own test cases as data.

pub mod config;
pub mod evictor;
pub mod koord;
pub mod kubelet;
pub mod pod;
pub mod signal;
pub mod threshold;

#[cfg(test)]
mod tests;

pub use config::{Eviction, EvictionConfig, EvictionConfigError};
pub use pod::{ContainerStats, FsUse, Pod, PodStats, Requests};
pub use signal::{Condition, Resource, Signal};
pub use threshold::{Amount, Threshold, ThresholdError, ThresholdMaps};
