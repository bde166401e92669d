//! qoslet's CRI front end: the proxy between kubelet and containerd, its
//! interception pipeline and CRI <-> state. It plugs into the agent core
//! (`qoslet-agent`: state dir, checkpoint, admin API); the store is
//! `qoslet-state`'s.
//!
//! Layout:
//! * [`server`]: wiring (sockets, store rebuild, serve, drain), and each
//!   kubelet connection served on h2, paired with a runtime connection of its own.
//! * [`forward`]: the per-call logic: pass-through as bytes, interception, reflection.
//! * [`h2io`]: bodies read from and written into h2 streams (both sides).
//! * [`grpc`]: gRPC framing, status responses and size limits.
//! * [`cri`]: which CRI calls are intercepted, as typed values.
//! * [`pipeline`]: hooks, their timeouts and failure policies.
//! * [`records`]: CRI messages -> the store's records (the only place they are built from CRI).
//! * [`rebuild`]: the store rebuilt from the runtime's listing (at start, and resyncs).
//! * [`backend`]: connections to containerd (each kubelet connection its own).
//!
//! The socket and HTTP/2 edge (endpoints, the wire limits, the HPACK judge in
//! front of h2) is `qoslet-wire`'s, shared with the admin socket.
//! * [`front`]: the proxy as the agent's front end (mode, counters, runtime probe).
//! * [`isolation`]: the isolation room's events as a CRI hook (CRI <-> its
//!   neutral inputs and patch; the NRI plugin is the other adapter).
//!
//! This crate decides no QoS policy: decisions are the isolation room's, and
//! they arrive, like any policy, as [`pipeline::Hook`]s.

pub mod admission;
pub mod backend;
pub mod cri;
pub mod events;
pub mod forward;
pub mod front;
#[cfg(test)]
mod fuzz;
pub mod grpc;
pub mod h2io;
pub mod isolation;
pub mod pipeline;
pub mod rebuild;
pub mod records;
pub mod server;

pub use pipeline::{FailurePolicy, Hook, HookSettings, Pipeline, Refusal, Verdict};
pub use qoslet_agent::QosletError;
pub use server::{bind, serve, start, Bound, ProxyConfig, Running, StartError};
