//! The agent core every front end plugs into: the state dir and the store's
//! checkpoint, the admin API, and the views of the agent's loops (metrics,
//! engine). It runs with no CRI listener; the CRI proxy and the NRI plugin are
//! front ends ([`front::FrontEnd`]) that attach to it.
//!
//! * [`core`]: [`Agent`]: start (admin socket, state-dir lock, checkpoint), attach, finish.
//! * [`admin`]: the admin gRPC API, its health service and reflection.
//! * [`front`]: what a front end shows the admin API (mode, counters, runtime).
//! * [`loops`]: metrics collection and the QoS engine over the store.
//! * [`hub`]: the policy hub: sources offer, the policy in force is published.
//! * [`eviction`]: the eviction loop (the `qoslet-eviction` room's models over
//!   the node's readings), its view for admission, the CRI evictor.
//! * [`error`]: [`QosletError`], the one mapping of qoslet's own errors to gRPC statuses.

#![forbid(unsafe_code)]

pub mod admin;
pub mod core;
pub mod error;
pub mod eviction;
pub mod front;
pub mod hub;
pub mod loops;

pub use crate::core::{Agent, AgentConfig, AgentError};
pub use admin::Views;
pub use error::QosletError;
pub use front::{BoxFuture, FrontEnd};
pub use hub::{PolicyHub, Source};
pub use loops::{EngineLoop, Loops};
