//! What the front end implements: one method per NRI request, called off the
//! async workers (`spawn_blocking`) with a deadline, so a handler may read and
//! write cgroup files. Every method has an answer of "no change" as its
//! default; none answers NOT_FOUND (a runtime fails pods on that).
//!
//! `Err` is a refusal: the runtime fails the pod or container operation with
//! its message. A handler that wants fail-open on its own errors answers
//! `Ok` with no change. A handler that overruns its deadline or panics is
//! answered for by the session with "no change" (fail-open) and counted.

use qoslet_proto::nri as api;

use crate::events::Event;
use crate::ttrpc::{code, Status};

/// A refusal of the operation, as the runtime will report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
}

impl Refusal {
    /// A refusal with code INVALID_ARGUMENT.
    pub fn invalid(message: impl Into<String>) -> Refusal {
        Refusal {
            code: code::INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    pub fn with_code(code: i32, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// A refusal's message is cut to this many bytes: the runtime passes it on
/// to kubelet inside a gRPC status (`grpc-message`, percent-encoded; gRPC
/// C-core clients refuse metadata past 8 KiB).
pub const MAX_REFUSAL_MESSAGE: usize = 1024;

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        let mut message = r.message;
        if message.len() > MAX_REFUSAL_MESSAGE {
            let mut end = MAX_REFUSAL_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        Status::new(r.code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_messages_are_cut_on_a_character_boundary() {
        let s: Status = Refusal::invalid("é".repeat(2000)).into();
        assert!(s.message.len() <= MAX_REFUSAL_MESSAGE);
        assert!(s.message.chars().all(|c| c == 'é'));
        let s: Status = Refusal::with_code(8, "short").into();
        assert_eq!((s.code, s.message.as_str()), (8, "short"));
    }
}

/// What the runtime said about itself in Configure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
    /// The NRI API version, when the runtime says (v0.12+).
    pub nri_version: String,
    /// The runtime's request timeout in ms, when it says (v0.8+).
    pub request_timeout_ms: Option<i64>,
    pub registration_timeout_ms: Option<i64>,
    /// The plugin's configuration the runtime holds (usually empty).
    pub config: String,
}

impl From<&api::ConfigureRequest> for RuntimeInfo {
    fn from(r: &api::ConfigureRequest) -> RuntimeInfo {
        RuntimeInfo {
            name: r.runtime_name.clone(),
            version: r.runtime_version.clone(),
            nri_version: r.nri_version.clone(),
            request_timeout_ms: (r.request_timeout > 0).then_some(r.request_timeout),
            registration_timeout_ms: (r.registration_timeout > 0).then_some(r.registration_timeout),
            config: r.config.clone(),
        }
    }
}

/// A pod/container lifecycle event without an answer of its own (StateChange
/// before v0.12, a method per event after).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateChange {
    pub event: Option<Event>,
    pub pod: Option<api::PodSandbox>,
    pub container: Option<api::Container>,
}

/// The plugin's side of the NRI events.
pub trait Handler: Send + Sync + 'static {
    /// The runtime introduced itself (before or after RegisterPlugin's reply).
    fn configure(&self, _runtime: &RuntimeInfo) -> Result<(), Refusal> {
        Ok(())
    }

    /// The runtime's pods and containers at registration, whole (a split
    /// Synchronize is gathered by the session first); returns the updates to
    /// apply to existing containers.
    fn synchronize(
        &self,
        _pods: Vec<api::PodSandbox>,
        _containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, Refusal> {
        Ok(vec![])
    }

    /// A container is being created: the adjustment, updates of other
    /// containers, evictions.
    fn create_container(
        &self,
        _req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Refusal> {
        Ok(api::CreateContainerResponse::default())
    }

    /// A CreateContainer call finished after the session had answered it with
    /// "no change" (it overran its deadline): the container was created
    /// without the adjustment, so what the call recorded is not so.
    fn create_abandoned(&self, _container_id: &str) {}

    /// A container's resources are being updated (kubelet's
    /// UpdateContainerResources); updates returned apply after it.
    fn update_container(
        &self,
        _req: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, Refusal> {
        Ok(api::UpdateContainerResponse::default())
    }

    fn stop_container(
        &self,
        _req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, Refusal> {
        Ok(api::StopContainerResponse::default())
    }

    /// Every other subscribed event.
    fn state_change(&self, _change: StateChange) -> Result<(), Refusal> {
        Ok(())
    }

    /// The runtime is shutting the plugin down.
    fn shutdown(&self) {}
}
