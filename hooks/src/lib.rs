//! qoslet's QoS policy, as pure functions: no I/O, no async, no transport.
//!
//! * [`class`]: a pod's QoS class (Koordinator's label, else inferred from the
//!   Kubernetes QoS visible in the sandbox cgroup parent), with where it came from.
//! * [`batch`]: batch resources (`kubernetes.io/batch-cpu`/`batch-memory`) from
//!   Koordinator's `node.koordinator.sh/extended-resource-spec` annotation,
//!   turned into CFS shares, quota and a memory limit.
//! * [`nodeslo`]: Koordinator's NodeSLO fields, what qoslet does with each.
//! * [`quantity`]: Kubernetes resource quantities, parsed exactly.
//! * [`policy`]: the policy config, with Koordinator's NodeSLO names and defaults.
//! * [`warning`]: what was wrong with a pod's input or the host, typed.
//! * [`serde_null`]: a config key written with no value reads as empty.
//! * [`decide`]: per pod and container, what to override in CRI resources and
//!   which cgroup settings to write, each with the rule behind it.
//!
//! Callers (the proxy's hooks) do the I/O; everything here is table-tested.

#![forbid(unsafe_code)]

pub mod batch;
pub mod class;
pub mod decide;
pub mod nodeslo;
pub mod policy;
pub mod quantity;
pub mod serde_null;
pub mod warning;

pub use class::{classify, ClassDecision, ClassSource, KubeQos, PodClass, QosClass, Trust};
pub use warning::Warning;
