//! The QoS engine: every tick, plugins turn (state, metrics, policy) into
//! desired cgroup writes; the writes are merged into one [`plan::Plan`]
//! (where two plugins set the same file, the strictest value wins, protecting
//! LS pods) and handed to the cgroups executor.
//!
//! * [`policy`]: `resourceUsedThresholdWithBE`, with NodeSLO's names and defaults.
//! * [`plan`]: desired writes with the rule behind each, and their merge.
//! * [`suppress`]: CPU suppress, the BE allowance and its `cfsQuota` policy.
//! * [`cpuset`]: the `cpuset` suppress policy (BE cores sized to the allowance).
//! * [`reconcile`]: what the runtime hooks set, re-derived from the current policy (drift, reload).
//! * [`resctrl`]: class resctrl groups' schemata and tasks kept in sync.
//! * [`engine`]: one tick (state in, merged plan out) and the engine's memory between ticks.
//! * [`error`]: typed policy errors, engine errors and warnings, and logging each once while it lasts.
//! * [`execute`]: the executor (ordered, idempotent, cached, with drift checks).
//! * [`burst`]: CPU burst and quota scaling for LS pods (`cpuBurstStrategy`).
//! * [`source`]: the policy as published (NodeSLO parsed, devices resolved) and its channel.
//! * [`runner`]: the 1 s loop on a thread of its own (after each metrics tick), the last tick
//!   for the admin API and Prometheus, and putting back what qoslet changed.
//!
//! * [`sim`]: the seed scenario (1,024 cores, an LS burst) driving the real engine.
//! * [`synth`]: a synthetic node (kernel-shaped cgroup tree and pods) for the bench and the simulation.
//!
//! Plugins are pure functions, table-tested without a filesystem.

#![forbid(unsafe_code)]

pub mod burst;
pub mod cpuset;
pub mod engine;
pub mod error;
pub mod execute;
pub mod plan;
pub mod policy;
pub mod reconcile;
pub mod resctrl;
pub mod runner;
pub mod sim;
pub mod source;
pub mod suppress;
pub mod synth;

/// Test support: kernel-shaped file trees in a temp dir (the cgroups crate's one helper).
#[cfg(test)]
pub(crate) mod testing {
    pub use qoslet_cgroups::testing::tree;
}
