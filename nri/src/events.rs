//! NRI events and the subscription mask a plugin answers Configure with.
//!
//! Event E is bit `1 << (E - 1)`. A runtime fails the registration of a plugin
//! that subscribes to an event it does not know, and reads 0 as "everything",
//! so a mask here is never empty and holds only the events every runtime
//! qoslet supports knows (v0.6.1's, 1 to 11).

pub use qoslet_proto::nri::Event;

/// The last event NRI v0.6.1 knows; later ones (12 to 14) arrived in v0.10.
pub const LAST_V061: Event = Event::RemoveContainer;

/// The events a plugin subscribes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventMask(u32);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MaskError {
    #[error("no events: a runtime reads an empty subscription as every event")]
    Empty,
    #[error("event {0:?} is not known to NRI v0.6.1 runtimes (their registration would fail)")]
    Unknown(Event),
}

impl EventMask {
    /// The mask of `events`, refused if empty or if one is unknown to v0.6.1.
    pub fn of(events: &[Event]) -> Result<EventMask, MaskError> {
        let mut bits = 0u32;
        for &e in events {
            if e == Event::Unknown || e as i32 > LAST_V061 as i32 {
                return Err(MaskError::Unknown(e));
            }
            bits |= 1 << (e as i32 - 1);
        }
        if bits == 0 {
            return Err(MaskError::Empty);
        }
        Ok(EventMask(bits))
    }

    /// The value of ConfigureResponse.events.
    pub fn bits(self) -> i32 {
        self.0 as i32
    }

    pub fn contains(self, e: Event) -> bool {
        e != Event::Unknown && (e as i32) <= 31 && self.0 & (1 << (e as i32 - 1)) != 0
    }
}

/// The short, stable name of an event (counters, logs).
pub fn name(e: Event) -> &'static str {
    match e {
        Event::Unknown => "unknown",
        Event::RunPodSandbox => "run_pod_sandbox",
        Event::StopPodSandbox => "stop_pod_sandbox",
        Event::RemovePodSandbox => "remove_pod_sandbox",
        Event::CreateContainer => "create_container",
        Event::PostCreateContainer => "post_create_container",
        Event::StartContainer => "start_container",
        Event::PostStartContainer => "post_start_container",
        Event::UpdateContainer => "update_container",
        Event::PostUpdateContainer => "post_update_container",
        Event::StopContainer => "stop_container",
        Event::RemoveContainer => "remove_container",
        Event::UpdatePodSandbox => "update_pod_sandbox",
        Event::PostUpdatePodSandbox => "post_update_pod_sandbox",
        Event::ValidateContainerAdjustment => "validate_container_adjustment",
    }
}

/// The event of a v0.12 per-event method (`RunPodSandbox`, ...), if it is one.
pub fn of_method(method: &str) -> Option<Event> {
    Some(match method {
        "RunPodSandbox" => Event::RunPodSandbox,
        "StopPodSandbox" => Event::StopPodSandbox,
        "RemovePodSandbox" => Event::RemovePodSandbox,
        "PostCreateContainer" => Event::PostCreateContainer,
        "StartContainer" => Event::StartContainer,
        "PostStartContainer" => Event::PostStartContainer,
        "PostUpdateContainer" => Event::PostUpdateContainer,
        "RemoveContainer" => Event::RemoveContainer,
        "UpdatePodSandbox" => Event::UpdatePodSandbox,
        "PostUpdatePodSandbox" => Event::PostUpdatePodSandbox,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        let m = EventMask::of(&[Event::RunPodSandbox, Event::CreateContainer]).unwrap();
        assert_eq!(m.bits(), 0b1001);
        assert!(m.contains(Event::CreateContainer));
        assert!(!m.contains(Event::StartContainer));
        let all: Vec<Event> = (1..=11).map(|i| Event::try_from(i).unwrap()).collect();
        assert_eq!(EventMask::of(&all).unwrap().bits(), (1 << 11) - 1);
        assert_eq!(EventMask::of(&[]), Err(MaskError::Empty));
        assert_eq!(
            EventMask::of(&[Event::UpdatePodSandbox]),
            Err(MaskError::Unknown(Event::UpdatePodSandbox))
        );
        assert_eq!(
            EventMask::of(&[Event::Unknown]),
            Err(MaskError::Unknown(Event::Unknown))
        );
    }

    #[test]
    fn per_event_methods() {
        assert_eq!(of_method("StartContainer"), Some(Event::StartContainer));
        assert_eq!(of_method("CreateContainer"), None);
        assert_eq!(name(Event::RemoveContainer), "remove_container");
    }
}
