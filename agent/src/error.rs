//! The one mapping from qoslet's own errors to gRPC statuses: every status
//! qoslet itself answers with (on the CRI path and on the admin API) is a
//! [`QosletError`] turned into a [`Status`] here, so a code is chosen in one
//! place. Statuses the runtime sends are passed through untouched.

use tonic::Status;

/// An error qoslet answers a call with.
#[derive(Debug, thiserror::Error)]
pub enum QosletError {
    /// The runtime cannot be reached (kubelet retries, as with containerd itself).
    #[error("qoslet: runtime {endpoint} unavailable: {reason}")]
    RuntimeUnavailable { endpoint: String, reason: String },
    /// The runtime's answer stopped before its end (containerd killed mid-answer).
    #[error("qoslet: the runtime's answer broke off: {0}")]
    RuntimeBrokeOff(String),
    /// A call still running when the drain deadline came.
    #[error("qoslet is shutting down")]
    ShuttingDown,
    /// The client's request body failed while being read (it went away).
    #[error("qoslet: reading request: {0}")]
    ReadingRequest(String),
    /// A request whose URI could not be rebuilt for the runtime.
    #[error("qoslet: bad request URI: {0}")]
    BadUri(String),
    /// The client's deadline (`grpc-timeout`) passed before its request
    /// message was in: answered as grpc-go answers it.
    #[error("context deadline exceeded")]
    DeadlineExceeded,
    /// A message over the size limit, in grpc-go's words (kubelet knows them).
    #[error("grpc: received message larger than max ({len} vs. {limit})")]
    TooLarge { len: usize, limit: usize },
    /// A fail-closed hook that failed (`timed_out`: it ran out of time). The
    /// message names the hook, its stage and the call.
    #[error("qoslet: {message}")]
    HookFailed { message: String, timed_out: bool },
    /// A part of the agent that is not running in this qoslet (metrics, engine).
    #[error("{0}")]
    Off(String),
    /// An admin request with a bad argument.
    #[error("{0}")]
    BadRequest(String),
    /// What an admin request asks for is not there.
    #[error("{0}")]
    NotFound(String),
    /// An admin request that this data cannot answer.
    #[error("{0}")]
    Unanswerable(String),
    /// Work that did not finish within its budget.
    #[error("{0}")]
    Late(String),
    /// qoslet's own failure (a panicked task).
    #[error("{0}")]
    Internal(String),
}

impl From<QosletError> for Status {
    fn from(e: QosletError) -> Status {
        use QosletError::*;
        let msg = e.to_string();
        match e {
            RuntimeUnavailable { .. } | RuntimeBrokeOff(_) | ShuttingDown | Off(_) => {
                Status::unavailable(msg)
            }
            ReadingRequest(_) => Status::cancelled(msg),
            BadUri(_) | BadRequest(_) => Status::invalid_argument(msg),
            TooLarge { .. } => Status::resource_exhausted(msg),
            HookFailed {
                timed_out: true, ..
            }
            | Late(_)
            | DeadlineExceeded => Status::deadline_exceeded(msg),
            HookFailed { .. } | Internal(_) => Status::internal(msg),
            NotFound(_) => Status::not_found(msg),
            Unanswerable(_) => Status::failed_precondition(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_error_has_its_code_and_words() {
        for (e, code, words) in [
            (
                QosletError::RuntimeUnavailable {
                    endpoint: "unix:///c.sock".into(),
                    reason: "refused".into(),
                },
                Code::Unavailable,
                "qoslet: runtime unix:///c.sock unavailable: refused",
            ),
            (
                QosletError::TooLarge { len: 17, limit: 16 },
                Code::ResourceExhausted,
                "grpc: received message larger than max (17 vs. 16)",
            ),
            (
                QosletError::ShuttingDown,
                Code::Unavailable,
                "qoslet is shutting down",
            ),
            (
                QosletError::ReadingRequest("reset".into()),
                Code::Cancelled,
                "qoslet: reading request: reset",
            ),
            (
                QosletError::Off("metrics are off".into()),
                Code::Unavailable,
                "metrics are off",
            ),
            (
                QosletError::Unanswerable("no quantiles".into()),
                Code::FailedPrecondition,
                "no quantiles",
            ),
            (
                QosletError::HookFailed {
                    message: "hook isolation before CreateContainer timed out after 2s".into(),
                    timed_out: true,
                },
                Code::DeadlineExceeded,
                "qoslet: hook isolation before CreateContainer timed out after 2s",
            ),
            (
                QosletError::HookFailed {
                    message: "hook isolation panicked".into(),
                    timed_out: false,
                },
                Code::Internal,
                "qoslet: hook isolation panicked",
            ),
            (
                QosletError::Late("too slow".into()),
                Code::DeadlineExceeded,
                "too slow",
            ),
        ] {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, words));
        }
    }
}
