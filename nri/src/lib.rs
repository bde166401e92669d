//! The NRI room: containerd's Node Resource Interface, plugin side, protocol
//! only. No Rust crate implements NRI, so qoslet owns it (see
//! docs/design-decisions.md): the trunk [`mux`], [`ttrpc`] framing on prost
//! (unary calls only; the registry's `ttrpc` crate would bring a second
//! protobuf stack), a [`session`] (serve, register, answer, call), the
//! [`plugin`] (reconnect with backoff) and the [`Handler`] trait the NRI front
//! end implements. The messages are `qoslet_proto::nri`, declared by the
//! project with upstream's field numbers.
//!
//! Policy lives elsewhere: this crate never decides what a container gets.

pub mod error;
pub mod events;
pub mod handler;
pub mod mux;
pub mod plugin;
pub mod session;
pub mod ttrpc;

pub use error::{CallError, NriError};
pub use events::{Event, EventMask};
pub use handler::{Handler, Refusal, RuntimeInfo, StateChange};
pub use plugin::{Backoff, Plugin};
pub use qoslet_proto::nri as api;
pub use session::{Counters, Ended, Options, RuntimeClient};
