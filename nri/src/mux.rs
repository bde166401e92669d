//! The trunk mux: one socket carries two logical byte streams, the plugin's
//! service (connection 1, the runtime calls) and the runtime's service
//! (connection 2, the plugin calls). Each frame is a 4-byte big-endian
//! connection id, a 4-byte big-endian length and that many bytes of the
//! connection's stream: a slice of ttrpc bytes, not a whole message.
//!
//! Owns framing only: no ttrpc, no I/O. Frames this side sends are at most
//! [`MAX_FRAME`] bytes, header included, whatever the message size: the
//! runtime's reader (Go, `pkg/net/multiplex`) hands each frame to a 4 KiB
//! read buffer and fails the whole connection with ENOMEM on a larger one.
//! Frames from the runtime may be larger (its writer does not split); they are
//! accepted up to the runtime's own limit, [`MAX_INBOUND`], and handed on in
//! pieces as they arrive, so a large frame is never buffered whole.

use bytes::{Buf, Bytes, BytesMut};

/// Bytes of a frame header: connection id, payload length.
pub const HEADER: usize = 8;
/// The largest frame sent, header included.
pub const MAX_FRAME: usize = 4096;
/// The largest payload of one sent frame.
pub const MAX_CHUNK: usize = MAX_FRAME - HEADER;
/// The largest frame payload accepted from the runtime (its mux refuses to
/// send more in one frame).
pub const MAX_INBOUND: usize = 1 << 24;

/// The two logical connections of the trunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Conn {
    /// Connection 1: the plugin serves `nri.pkg.api.v1alpha1.Plugin`.
    Plugin,
    /// Connection 2: the runtime serves `nri.pkg.api.v1alpha1.Runtime`.
    Runtime,
}

impl Conn {
    /// The id on the wire.
    pub fn id(self) -> u32 {
        match self {
            Conn::Plugin => 1,
            Conn::Runtime => 2,
        }
    }

    /// The connection with wire id `id`, if it is one of the two.
    pub fn from_id(id: u32) -> Option<Conn> {
        match id {
            1 => Some(Conn::Plugin),
            2 => Some(Conn::Runtime),
            _ => None,
        }
    }
}

/// What makes the trunk unusable (the connection is closed and redialled).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MuxError {
    #[error("a frame for unknown connection {0}")]
    UnknownConn(u32),
    #[error("a frame of {0} bytes (the runtime's limit is {MAX_INBOUND})")]
    Oversized(u32),
}

/// Appends `bytes` for `conn` to `out` as frames of at most [`MAX_FRAME`] bytes.
/// Nothing is appended for empty `bytes`.
pub fn encode(conn: Conn, bytes: &[u8], out: &mut Vec<u8>) {
    out.reserve(bytes.len() + bytes.len().div_ceil(MAX_CHUNK) * HEADER);
    for chunk in bytes.chunks(MAX_CHUNK) {
        out.extend_from_slice(&conn.id().to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// Splits the runtime's trunk bytes into pieces of each connection's stream.
#[derive(Debug, Default)]
pub struct Demux {
    buf: BytesMut,
    /// The connection and the payload bytes left of the frame being read.
    frame: Option<(Conn, usize)>,
}

impl Demux {
    pub fn new() -> Demux {
        Demux::default()
    }

    /// Adds bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not handed out yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next piece of a connection's stream, `None` when more bytes are
    /// needed. Pieces of one connection come in order; a frame may come as
    /// several pieces.
    pub fn next_piece(&mut self) -> Result<Option<(Conn, Bytes)>, MuxError> {
        loop {
            match self.frame {
                Some((conn, left)) => {
                    if left == 0 {
                        self.frame = None;
                        continue;
                    }
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(self.buf.len());
                    let piece = self.buf.split_to(n).freeze();
                    self.frame = Some((conn, left - n));
                    return Ok(Some((conn, piece)));
                }
                None => {
                    if self.buf.len() < HEADER {
                        return Ok(None);
                    }
                    let id = u32::from_be_bytes(self.buf[0..4].try_into().unwrap());
                    let len = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
                    let conn = Conn::from_id(id).ok_or(MuxError::UnknownConn(id))?;
                    if len as usize > MAX_INBOUND {
                        return Err(MuxError::Oversized(len));
                    }
                    self.buf.advance(HEADER);
                    self.frame = Some((conn, len as usize));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_split_at_4096_bytes_header_included() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut out = vec![];
        encode(Conn::Runtime, &data, &mut out);
        let mut at = 0;
        let mut sizes = vec![];
        while at < out.len() {
            let id = u32::from_be_bytes(out[at..at + 4].try_into().unwrap());
            let len = u32::from_be_bytes(out[at + 4..at + 8].try_into().unwrap()) as usize;
            assert_eq!(id, 2);
            assert!(HEADER + len <= MAX_FRAME);
            sizes.push(len);
            at += HEADER + len;
        }
        assert_eq!(sizes, vec![4088, 4088, 1824]);
        let mut d = Demux::new();
        d.push(&out);
        let mut got = vec![];
        while let Some((c, p)) = d.next_piece().unwrap() {
            assert_eq!(c, Conn::Runtime);
            got.extend_from_slice(&p);
        }
        assert_eq!(got, data);
    }

    #[test]
    fn captured_frame_bytes() {
        // a RegisterPlugin call's first frame as the runtime's mux reads it:
        // connection 2, length 5
        let mut out = vec![];
        encode(Conn::Runtime, b"hello", &mut out);
        assert_eq!(out, b"\x00\x00\x00\x02\x00\x00\x00\x05hello");
        let mut out = vec![];
        encode(Conn::Plugin, b"", &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn unknown_connection_and_oversized_frames_are_errors() {
        let mut d = Demux::new();
        d.push(b"\x00\x00\x00\x03\x00\x00\x00\x01x");
        assert_eq!(d.next_piece(), Err(MuxError::UnknownConn(3)));
        let mut d = Demux::new();
        d.push(b"\x00\x00\x00\x00\x00\x00\x00\x01x");
        assert_eq!(d.next_piece(), Err(MuxError::UnknownConn(0)));
        let mut d = Demux::new();
        d.push(b"\x00\x00\x00\x01\x01\x00\x00\x01");
        assert_eq!(d.next_piece(), Err(MuxError::Oversized(0x0100_0001)));
        // the runtime's own limit is accepted, and handed on as it arrives
        let mut d = Demux::new();
        d.push(b"\x00\x00\x00\x01\x01\x00\x00\x00abc");
        assert_eq!(
            d.next_piece().unwrap(),
            Some((Conn::Plugin, Bytes::from_static(b"abc")))
        );
        assert_eq!(d.next_piece().unwrap(), None);
    }

    #[test]
    fn empty_frames_and_partial_headers() {
        let mut d = Demux::new();
        d.push(b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00");
        assert_eq!(d.next_piece().unwrap(), None);
        d.push(b"\x02\x00\x00\x00\x02ok");
        assert_eq!(
            d.next_piece().unwrap(),
            Some((Conn::Runtime, Bytes::from_static(b"ok")))
        );
        assert_eq!(d.buffered(), 0);
    }
}
