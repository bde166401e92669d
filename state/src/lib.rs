//! qoslet's state: every pod and container on the node, what was asked for
//! them and what qoslet applied, kept private on disk and shared as one
//! inventory. Transport-neutral: the front ends (the CRI proxy, the NRI plugin)
//! build the records from their own messages; nothing here knows CRI, NRI,
//! tonic or hyper.
//!
//! * [`store`]: the in-memory store, its generation (any number of
//!   subscribers) and the resync bookkeeping that lets a runtime listing race
//!   kubelet's calls safely.
//! * [`checkpoint`]: the store's checkpoint in the state dir, and the task
//!   that writes it when the store changes.
//! * [`statefile`]: the private state dir (0700/0600, atomic no-follow writes,
//!   capped reads, the instance lock).
//! * [`inventory`]: the ready pods and running containers with validated
//!   cgroup paths and classes, built once per store generation for every room.
//! * [`cluster`]: what the API server says of a pod (priority, requests,
//!   tolerations), joined to the records by pod UID.
//! * [`endpoint`]: how a runtime endpoint is spelled (the checkpoint names its runtime).

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod cluster;
pub mod endpoint;
pub mod inventory;
pub mod statefile;
pub mod store;

pub use cluster::{ClusterPod, PodAmounts};
pub use inventory::{ContainerEntry, Inventories, Inventory, InventorySource, PodEntry};
pub use store::{
    ContainerRecord, ContainerState, PodRecord, PodState, Resources, Snapshot, Source, Store,
};
