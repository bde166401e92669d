//! Metrics: what every container, pod and the node really use.
//!
//! * [`clock`]: series time, monotonic and anchored to the wall clock once.
//! * [`codec`]: values as compact integer codes (exact near zero, 0.25 % above),
//!   delta- and run-length-coded.
//! * [`metric`]: the kinds of series, their units and resolutions.
//! * [`tsdb`]: the bounded in-memory time-series cache (10 minutes raw, 24 hours
//!   of per-minute rollups) and its queries (last, avg, min, max, percentiles, trend).
//! * `service` (feature `service`, the agent's): the running service: the collection loop, the periodic snapshot,
//!   `/metrics`, the admin API's metrics RPCs, and the tick source the engine follows.

#![forbid(unsafe_code)]

pub mod clock;
pub mod codec;
pub mod collect;
pub mod fasthash;
pub mod metric;
pub mod parse;
pub mod prom;
#[cfg(feature = "service")]
pub mod service;
pub mod tsdb;

pub use clock::{SeriesClock, Stamp};
pub use metric::Metric;
pub use tsdb::{write_snapshot_locked, Agg, Loaded, NodeIdentity, QueryError, SnapshotError, Tsdb};
