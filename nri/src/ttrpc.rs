//! ttrpc framing on prost: within one mux connection, each message is a
//! 10-byte header (u32 length, u32 stream id, u8 type, u8 flags, big-endian)
//! and a payload, which for requests and responses is a `ttrpc.Request` /
//! `ttrpc.Response` envelope ([`qoslet_proto::ttrpc`]). Unary calls only:
//! NRI uses no streams. Clients number their streams with odd ids.
//!
//! Owns framing and envelopes: no I/O, no NRI methods. A message longer than
//! [`MAX_MESSAGE`] is not buffered: its bytes are skipped and the stream is
//! reported, so the server answers RESOURCE_EXHAUSTED as ttrpc does.

use bytes::{Buf, Bytes, BytesMut};
use prost::Message as _;
use qoslet_proto::ttrpc as env;

/// Bytes of a message header.
pub const HEADER: usize = 10;
/// ttrpc's message limit (either side refuses a longer one).
pub const MAX_MESSAGE: usize = 4 << 20;

/// Message types.
pub const REQUEST: u8 = 1;
pub const RESPONSE: u8 = 2;
/// Stream data (ttrpc streaming; NRI does not use it).
pub const DATA: u8 = 3;

/// gRPC status codes as ttrpc carries them.
pub mod code {
    pub const OK: i32 = 0;
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

/// One ttrpc message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub stream: u32,
    pub kind: u8,
    pub flags: u8,
    pub payload: Bytes,
}

/// What the deframer yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    Message(Frame),
    /// A message over [`MAX_MESSAGE`], skipped.
    TooLarge {
        stream: u32,
        kind: u8,
        len: usize,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TtrpcError {
    #[error("a message of {0} bytes (ttrpc's limit is {MAX_MESSAGE})")]
    TooLarge(usize),
}

/// Encodes one message, header and payload.
pub fn encode(stream: u32, kind: u8, flags: u8, payload: &[u8]) -> Result<Vec<u8>, TtrpcError> {
    if payload.len() > MAX_MESSAGE {
        return Err(TtrpcError::TooLarge(payload.len()));
    }
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Reassembles the messages of one connection from its stream's pieces.
#[derive(Debug, Default)]
pub struct Deframer {
    buf: BytesMut,
    /// Bytes of a too-large message still to skip.
    skip: usize,
}

impl Deframer {
    pub fn new() -> Deframer {
        Deframer::default()
    }

    /// Adds a piece of the connection's stream.
    pub fn push(&mut self, piece: &[u8]) {
        let piece = if self.skip > 0 {
            let n = self.skip.min(piece.len());
            self.skip -= n;
            &piece[n..]
        } else {
            piece
        };
        self.buf.extend_from_slice(piece);
    }

    /// Bytes buffered (a partial message).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole message, `None` until one is complete.
    pub fn next_message(&mut self) -> Option<Inbound> {
        if self.skip > 0 || self.buf.len() < HEADER {
            return None;
        }
        let len = u32::from_be_bytes(self.buf[0..4].try_into().unwrap()) as usize;
        let stream = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
        let (kind, flags) = (self.buf[8], self.buf[9]);
        if len > MAX_MESSAGE {
            self.buf.advance(HEADER);
            let n = len.min(self.buf.len());
            self.buf.advance(n);
            self.skip = len - n;
            return Some(Inbound::TooLarge { stream, kind, len });
        }
        if self.buf.len() < HEADER + len {
            self.buf.reserve(HEADER + len - self.buf.len());
            return None;
        }
        self.buf.advance(HEADER);
        let payload = self.buf.split_to(len).freeze();
        Some(Inbound::Message(Frame {
            stream,
            kind,
            flags,
            payload,
        }))
    }
}

/// A call's failure as ttrpc carries it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("status {code}: {message}")]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Status {
    pub fn new(code: i32, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }
}

/// A request envelope for `service`/`method`.
pub fn request(service: &str, method: &str, payload: Vec<u8>, timeout_nano: i64) -> Vec<u8> {
    env::Request {
        service: service.to_string(),
        method: method.to_string(),
        payload,
        timeout_nano,
        metadata: vec![],
    }
    .encode_to_vec()
}

/// A response envelope: the payload, or the status.
pub fn response(result: Result<Vec<u8>, Status>) -> Vec<u8> {
    match result {
        Ok(payload) => env::Response {
            status: None,
            payload,
        },
        Err(s) => env::Response {
            status: Some(env::Status {
                code: s.code,
                message: s.message,
            }),
            payload: vec![],
        },
    }
    .encode_to_vec()
}

/// A response envelope read back: the payload, or the status when not OK.
pub fn read_response(bytes: &[u8]) -> Result<Bytes, Status> {
    let r = env::Response::decode(bytes)
        .map_err(|e| Status::new(code::INTERNAL, format!("malformed ttrpc response: {e}")))?;
    match r.status {
        Some(s) if s.code != code::OK => Err(Status::new(s.code, s.message)),
        _ => Ok(Bytes::from(r.payload)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_ttrpc() {
        // captured: the first message a Go ttrpc client sends on a fresh
        // connection is stream 1, type request, no flags
        let m = encode(1, REQUEST, 0, b"\x0a\x01x").unwrap();
        assert_eq!(m, b"\x00\x00\x00\x03\x00\x00\x00\x01\x01\x00\x0a\x01x");
        let mut d = Deframer::new();
        d.push(&m[..4]);
        assert_eq!(d.next_message(), None);
        d.push(&m[4..]);
        assert_eq!(
            d.next_message(),
            Some(Inbound::Message(Frame {
                stream: 1,
                kind: REQUEST,
                flags: 0,
                payload: Bytes::from_static(b"\x0a\x01x"),
            }))
        );
        assert_eq!(d.next_message(), None);
    }

    #[test]
    fn too_large_messages_are_skipped_and_reported() {
        let big = (MAX_MESSAGE + 5) as u32;
        let mut d = Deframer::new();
        let mut head = big.to_be_bytes().to_vec();
        head.extend_from_slice(&7u32.to_be_bytes());
        head.extend_from_slice(&[REQUEST, 0]);
        d.push(&head);
        d.push(&[0u8; 100]);
        assert_eq!(
            d.next_message(),
            Some(Inbound::TooLarge {
                stream: 7,
                kind: REQUEST,
                len: MAX_MESSAGE + 5
            })
        );
        // the rest of the big message is dropped as it arrives
        let mut left = MAX_MESSAGE + 5 - 100;
        while left > 0 {
            let n = left.min(65536);
            d.push(&vec![0u8; n]);
            left -= n;
            assert_eq!(d.next_message(), None);
        }
        assert_eq!(d.buffered(), 0);
        d.push(&encode(9, RESPONSE, 0, b"ok").unwrap());
        assert!(matches!(
            d.next_message(),
            Some(Inbound::Message(Frame { stream: 9, .. }))
        ));
        assert!(encode(1, REQUEST, 0, &vec![0; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn a_register_plugin_request_byte_for_byte() {
        // protobuf encoded by hand: Request{service, method, payload =
        // RegisterPluginRequest{"qoslet", "10"}, timeout_nano = 5 s}
        let payload = b"\x0a\x06qoslet\x12\x0210".to_vec();
        let got = request(
            "nri.pkg.api.v1alpha1.Runtime",
            "RegisterPlugin",
            payload.clone(),
            5_000_000_000,
        );
        let mut want =
            b"\x0a\x1cnri.pkg.api.v1alpha1.Runtime\x12\x0eRegisterPlugin\x1a\x0c".to_vec();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"\x20\x80\xe4\x97\xd0\x12");
        assert_eq!(got, want);
    }

    #[test]
    fn envelopes_round_trip() {
        let ok = response(Ok(b"abc".to_vec()));
        assert_eq!(read_response(&ok).unwrap(), Bytes::from_static(b"abc"));
        let err = response(Err(Status::new(code::INVALID_ARGUMENT, "no")));
        assert_eq!(
            read_response(&err),
            Err(Status::new(code::INVALID_ARGUMENT, "no"))
        );
        // an explicit OK status with a payload is a success
        let explicit = env::Response {
            status: Some(env::Status {
                code: 0,
                message: String::new(),
            }),
            payload: b"p".to_vec(),
        }
        .encode_to_vec();
        assert_eq!(read_response(&explicit).unwrap(), Bytes::from_static(b"p"));
        assert_eq!(read_response(b"\xff").unwrap_err().code, code::INTERNAL);
    }
}
