//! The NRI front end: the plugin's events ([`qoslet_nri`], protocol only)
//! turned into the store's records and the isolation room's events, and the
//! front end the agent core shows (`mode: "nri"`).
//!
//! * [`records`]: NRI messages -> store records; the patch -> an NRI adjustment.
//! * [`handler`]: [`NriHandler`], each event as the CRI proxy handles its call.
//! * [`front`]: [`NriFront`], counters and the runtime for `qoslet status`.
//! * [`preinstalled`]: the socket a runtime hands a plugin it started (fd 3).

pub mod front;
pub mod handler;
pub mod preinstalled;
pub mod records;

pub use front::NriFront;
pub use handler::NriHandler;

use qoslet_nri::{Event, EventMask};

/// The events the front end subscribes to (every one NRI v0.6.1 knows that
/// the store or isolation uses).
pub fn events() -> EventMask {
    EventMask::of(&[
        Event::RunPodSandbox,
        Event::StopPodSandbox,
        Event::RemovePodSandbox,
        Event::CreateContainer,
        Event::StartContainer,
        Event::UpdateContainer,
        Event::StopContainer,
        Event::RemoveContainer,
    ])
    .expect("a valid mask")
}
