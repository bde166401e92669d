//! The NRI room's errors.

use crate::events::MaskError;
use crate::mux::MuxError;
use crate::ttrpc::{Status, TtrpcError};

/// Why a session with the runtime ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    #[error("invalid plugin name {0:?} (letters, digits and . _ + - only)")]
    Name(String),
    #[error("invalid plugin index {0:?} (exactly two digits)")]
    Index(String),
    #[error(transparent)]
    Mask(#[from] MaskError),
    #[error("cannot connect to the NRI socket {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the NRI connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the runtime broke the mux: {0}")]
    Mux(#[from] MuxError),
    #[error("the runtime broke ttrpc: {0}")]
    Protocol(String),
    #[error("registration failed: {0}")]
    Register(CallError),
}

/// Why a call to the runtime (RegisterPlugin, UpdateContainers) failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CallError {
    #[error("the connection to the runtime is closed")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("the runtime answered {0}")]
    Status(Status),
    #[error(transparent)]
    TooLarge(#[from] TtrpcError),
    #[error("the runtime's answer does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
}
