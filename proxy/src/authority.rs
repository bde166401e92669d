//! What h2 would misjudge in a client's header blocks, put right before h2
//! reads them.
//!
//! 1. **A unix socket path as `:authority`.** kubelet before 1.26, crictl and
//!    grpcurl 1.8 (grpc-go dialing a unix path) send `:authority:
//!    /run/qoslet/qoslet.sock`. containerd (grpc-go) accepts it; Rust's HTTP/2
//!    server (h2) rejects the stream with PROTOCOL_ERROR because a path is not a
//!    valid URI authority. A proxy that kubelet cannot tell from containerd must
//!    accept it too: such a block is re-encoded with `localhost`.
//! 2. **A malformed request** (an upper-case, empty or invalid field name, a
//!    value with control characters, an unknown pseudo-header, a method that
//!    does not parse: [`h2_refuses_field`]). RFC 9113 §8.1.1 makes it a stream
//!    error, and containerd resets just that stream (PROTOCOL_ERROR); h2's
//!    HPACK decoder takes it for a connection error and closes the connection
//!    with every call of kubelet's on it. Such a block is handed to h2 as a
//!    stand-in that h2 resets at stream level, with the same code.
//!
//! [`AuthorityFix`] wraps the server side of a connection and HPACK-decodes
//! each client header block ([`crate::hpack`], tracking the client's dynamic
//! table). A well-formed block
//! goes to h2 as it came. After the first block that had to be changed, h2's
//! table no longer matches the client's, so the connection switches to rewrite
//! mode: every later block is re-encoded as literals without indexing. DATA
//! frames are never changed. Anything that does not parse (or exceeds the
//! limits of [`crate::limits`], which are h2's own) is passed on as it is, for
//! h2 to judge. The client's SETTINGS_MAX_HEADER_LIST_SIZE is noted on the way
//! ([`ClientSettings`]) for the runtime connection made on the client's behalf.

use std::io;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::h2frame::{
    headers_fragment, literal_block, put_literal, write_header_frames, ACK, CONTINUATION,
    END_HEADERS, END_STREAM, FRAME_HEADER, HEADERS, PADDED, PREFACE, PRIORITY, SETTINGS,
};
use crate::hpack::Decoder;
/// A header block larger than this (encoded) is not decoded here (passed on
/// for h2 to judge with the same limit).
const MAX_BLOCK: usize = crate::limits::MAX_HEADER_LIST;
/// The most a block may decode to (names + values + 32 per field, as RFC 7541
/// counts) before h2 refuses its stream (431, REFUSED_STREAM).
const MAX_DECODED: usize = crate::limits::MAX_HEADER_LIST;
/// Past this (h2's four times the limit) h2 stops decoding and ends the
/// connection: a small block of references to one large table entry (an HPACK
/// bomb) stops being read here too, instead of costing seconds.
const MAX_DECODED_ABUSE: usize = 4 * MAX_DECODED;
/// CONTINUATION frames one block may take (h2's own limit at qoslet's settings).
const MAX_CONTINUATIONS: u32 = crate::limits::MAX_CONTINUATIONS as u32;
/// The largest frame qoslet's HTTP/2 server accepts (`SETTINGS_MAX_FRAME_SIZE`),
/// and the size rewritten header blocks are split at.
pub const SERVER_MAX_FRAME: usize = crate::limits::MAX_FRAME;
/// The dynamic table size qoslet's HTTP/2 server advertises (h2's default):
/// a client's size update above it is a decoding error (RFC 7541 §6.3).
const SERVER_HEADER_TABLE: usize = 4096;

/// Whether `v` is acceptable to h2 as an `:authority`.
pub fn valid_authority(v: &[u8]) -> bool {
    http::uri::Authority::try_from(v).is_ok()
}

/// A header block spread over several frames, held until its last: only as
/// the frames came (its HPACK fragment is taken out of them once, at the end).
struct Block {
    stream_id: u32,
    end_stream: bool,
    raw: BytesMut,
    fragment_len: usize,
    /// CONTINUATION frames without END_HEADERS, as h2 counts them.
    continuations: u32,
    /// Its HEADERS frame names its own stream as its dependency.
    self_dependent: bool,
}

impl Block {
    /// The HPACK fragment of the frames held.
    fn fragment(&self) -> BytesMut {
        let mut out = BytesMut::with_capacity(self.fragment_len);
        let mut p = &self.raw[..];
        while p.len() >= FRAME_HEADER {
            let len = u32::from_be_bytes([0, p[0], p[1], p[2]]) as usize;
            let (ty, flags, payload) = (p[3], p[4], &p[FRAME_HEADER..FRAME_HEADER + len]);
            if ty == HEADERS {
                // checked when the block began
                out.extend_from_slice(headers_fragment(flags, payload).unwrap_or_default());
            } else {
                out.extend_from_slice(payload);
            }
            p = &p[FRAME_HEADER + len..];
        }
        out
    }
}

/// Whether h2's HPACK decoder refuses this field outright (a connection error,
/// GOAWAY PROTOCOL_ERROR): an empty, upper-case or otherwise invalid name, a
/// value with control characters, an unknown pseudo-header, a method or status
/// that does not parse, a pseudo-header value that is not UTF-8. containerd
/// (Go's HTTP/2) resets just that stream for each of them.
pub fn h2_refuses_field(name: &[u8], value: &[u8]) -> bool {
    if name.is_empty() {
        return true;
    }
    if name[0] == b':' {
        let utf8 = std::str::from_utf8(value).is_ok();
        return match &name[1..] {
            b"authority" | b"scheme" | b"path" | b"protocol" => !utf8,
            b"method" => http::Method::from_bytes(value).is_err(),
            b"status" => http::StatusCode::from_bytes(value).is_err(),
            _ => true,
        };
    }
    http::HeaderName::from_lowercase(name).is_err() || http::HeaderValue::from_bytes(value).is_err()
}

/// What h2 would make of a decoded block.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    /// An `:authority` h2 refuses (a socket path): repaired.
    bad_authority: bool,
    /// A field h2's HPACK decoder refuses outright ([`h2_refuses_field`]): a
    /// connection error in h2, a stream error by RFC 9113 §8.1.1.
    refused: bool,
    /// A block h2 decodes and calls malformed (a connection-specific field,
    /// `te` other than `trailers`, a pseudo-header after a regular field or
    /// twice): a clean stream reset only when it comes in one frame (h2 judges
    /// each frame's fields on their own and, mid-block, loses the verdict or
    /// the block).
    malformed: bool,
}

/// Whether h2's `HeaderBlock::load` calls this field malformed, given the
/// pseudo-headers seen so far (`pseudo`, a bit each) and whether a regular
/// field came before.
fn h2_malformed_field(name: &[u8], value: &[u8], pseudo: &mut u8, regular: &mut bool) -> bool {
    if let Some(p) = name.strip_prefix(b":") {
        let bit = match p {
            b"authority" => 1,
            b"method" => 2,
            b"scheme" => 4,
            b"path" => 8,
            b"protocol" => 16,
            b"status" => 32,
            _ => return false, // refused outright instead
        };
        let repeated = *pseudo & bit != 0;
        *pseudo |= bit;
        return repeated || *regular;
    }
    *regular = true;
    matches!(
        name,
        b"connection" | b"transfer-encoding" | b"upgrade" | b"keep-alive" | b"proxy-connection"
    ) || (name == b"te" && value != b"trailers")
}

/// How a header block came.
#[derive(Clone, Copy)]
struct How {
    /// In more than one frame.
    multi: bool,
    /// With a priority on its own stream.
    self_dependent: bool,
}

/// What decoding a client's header block gave.
enum Decoded {
    /// What h2 would make of it (its fields, re-encoded as literals, are in
    /// the rewrite buffer unless `over`).
    Headers(Verdict),
    /// Decoded to more than [`MAX_DECODED`] (h2 decodes the rest and refuses
    /// the stream, 431 and REFUSED_STREAM): nothing in the rewrite buffer.
    TooBig(Verdict),
    /// Not HPACK, or decoding to more than [`MAX_DECODED_ABUSE`] (an HPACK
    /// bomb): h2 ends the connection.
    Bad,
}

/// Decodes `block` with the client's table, judging each field as h2 would,
/// and re-encodes it into `rewrite` as literals (a socket-path `:authority`
/// as `localhost`), in case the block must be handed on rewritten.
fn decode(decoder: &mut Decoder, block: &[u8], rewrite: &mut BytesMut) -> Decoded {
    rewrite.clear();
    let mut size = 0usize;
    let mut verdict = Verdict::default();
    let (mut pseudo, mut regular) = (0u8, false);
    let r = decoder.decode(block, |n, v| {
        size = size.saturating_add(n.len() + v.len() + 32);
        if size > MAX_DECODED_ABUSE {
            return ControlFlow::Break(());
        }
        if h2_refuses_field(n, v) {
            verdict.refused = true;
        } else {
            if n == b":authority" && !valid_authority(v) {
                verdict.bad_authority = true;
            }
            if h2_malformed_field(n, v, &mut pseudo, &mut regular) {
                verdict.malformed = true;
            }
        }
        if size <= MAX_DECODED {
            let v: &[u8] = if n == b":authority" && !valid_authority(v) {
                b"localhost"
            } else {
                v
            };
            put_literal(rewrite, n, v);
        }
        ControlFlow::Continue(())
    });
    match r {
        Ok(()) if size > MAX_DECODED_ABUSE => Decoded::Bad,
        Ok(()) if size > MAX_DECODED => {
            rewrite.clear();
            Decoded::TooBig(verdict)
        }
        Ok(()) => Decoded::Headers(verdict),
        Err(_) => Decoded::Bad,
    }
}

/// What a malformed request is handed to h2 as: a block h2 decodes and then
/// refuses as malformed (a connection-specific field, RFC 9113 §8.2.2), so it
/// resets that stream with PROTOCOL_ERROR, as containerd does, and the
/// connection lives on.
const MALFORMED_STAND_IN: [(&[u8], &[u8]); 4] = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/"),
    (b"connection", b"qoslet-malformed-request"),
];

fn new_decoder() -> Box<Decoder> {
    Box::new(Decoder::new(SERVER_HEADER_TABLE))
}

/// Whether a HEADERS frame's priority names its own stream: h2 resets the
/// stream (PROTOCOL_ERROR, RFC 9113 §5.3.1) before it decodes the block, so
/// its HPACK table would miss the block's entries.
fn self_dependent(flags: u8, stream_id: u32, payload: &[u8]) -> bool {
    if flags & PRIORITY == 0 {
        return false;
    }
    let p = if flags & PADDED != 0 {
        payload.get(1..)
    } else {
        Some(payload)
    };
    p.and_then(|p| p.get(..4))
        .is_some_and(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & 0x7fff_ffff == stream_id)
}

enum Mode {
    Preface,
    Detect(Box<Decoder>),
    Rewrite(Box<Decoder>),
    Passthrough,
}

/// A connection wrapper that repairs invalid `:authority` values (see module docs).
pub struct AuthorityFix<S> {
    io: S,
    /// The connection is beyond repair (a block qoslet could not re-encode after
    /// it began rewriting): reads fail, so the HTTP/2 server closes it.
    failed: bool,
    inbuf: BytesMut,
    out: BytesMut,
    mode: Mode,
    block: Option<Block>,
    eof: bool,
    rewritten: u64,
    malformed: u64,
    drop_ack: bool,
    client: Arc<ClientSettings>,
    /// The block being judged, re-encoded as literals (reused).
    scratch: BytesMut,
}

impl<S> AuthorityFix<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            failed: false,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            mode: Mode::Preface,
            block: None,
            eof: false,
            rewritten: 0,
            malformed: 0,
            drop_ack: false,
            client: Arc::default(),
            scratch: BytesMut::new(),
        }
    }

    /// Also drops the client's first SETTINGS ACK: the relay already sent the
    /// client a SETTINGS frame of its own before handing the connection over,
    /// and the HTTP/2 server must not see the acknowledgement of it.
    pub fn dropping_first_settings_ack(mut self) -> Self {
        self.drop_ack = true;
        self
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// What the client's SETTINGS said (shared: read when the runtime
    /// connection for this client is made).
    pub fn client_settings(&self) -> Arc<ClientSettings> {
        self.client.clone()
    }

    /// Malformed requests handed to h2 as a stream error so far.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// Header blocks rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Gives up on parsing: everything pending goes out as it came.
    fn passthrough(&mut self) {
        if let Some(b) = self.block.take() {
            self.out.extend_from_slice(&b.raw);
        }
        let rest = self.inbuf.split();
        self.out.extend_from_slice(&rest);
        self.mode = Mode::Passthrough;
    }

    /// Moves what can be processed from `inbuf` to `out`.
    fn process(&mut self) {
        loop {
            match self.mode {
                Mode::Passthrough => {
                    let rest = self.inbuf.split();
                    self.out.extend_from_slice(&rest);
                    return;
                }
                Mode::Preface => {
                    let n = self.inbuf.len().min(PREFACE.len());
                    if self.inbuf[..n] != PREFACE[..n] {
                        return self.passthrough();
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    let p = self.inbuf.split_to(PREFACE.len());
                    self.out.extend_from_slice(&p);
                    self.mode = Mode::Detect(new_decoder());
                }
                Mode::Detect(_) | Mode::Rewrite(_) => {
                    if self.inbuf.len() < FRAME_HEADER {
                        return;
                    }
                    let len = u32::from_be_bytes([0, self.inbuf[0], self.inbuf[1], self.inbuf[2]])
                        as usize;
                    if len > SERVER_MAX_FRAME {
                        // never buffered: h2 refuses it (FRAME_SIZE_ERROR)
                        return self.give_up();
                    }
                    if self.inbuf.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame = self.inbuf.split_to(FRAME_HEADER + len).freeze();
                    self.frame(frame);
                }
            }
        }
    }

    fn frame(&mut self, frame: Bytes) {
        let (ty, flags) = (frame[3], frame[4]);
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        if ty == SETTINGS && flags & ACK != 0 && self.drop_ack && self.block.is_none() {
            self.drop_ack = false;
            return;
        }
        if ty == SETTINGS && flags & ACK == 0 && stream_id == 0 {
            self.settings(payload);
        }
        match ty {
            HEADERS if self.block.is_none() => {
                let Some(fragment) = headers_fragment(flags, payload) else {
                    return self.passthrough_with(&frame);
                };
                let end_stream = flags & END_STREAM != 0;
                let self_dependent = self_dependent(flags, stream_id, payload);
                if flags & END_HEADERS != 0 {
                    // the common case, one frame: judged where it lies
                    let how = How {
                        multi: false,
                        self_dependent,
                    };
                    return self.finish(stream_id, end_stream, fragment, &frame, how);
                }
                self.block = Some(Block {
                    stream_id,
                    end_stream,
                    fragment_len: fragment.len(),
                    raw: BytesMut::from(&frame[..]),
                    continuations: 0,
                    self_dependent,
                });
            }
            CONTINUATION
                if self
                    .block
                    .as_ref()
                    .is_some_and(|b| b.stream_id == stream_id) =>
            {
                let b = self.block.as_mut().expect("checked");
                b.fragment_len += payload.len();
                b.raw.extend_from_slice(&frame);
                if flags & END_HEADERS == 0 {
                    b.continuations += 1;
                }
                // empty CONTINUATIONs grow nothing but the frame count
                if b.fragment_len > MAX_BLOCK || b.continuations > MAX_CONTINUATIONS {
                    return self.give_up();
                }
                if flags & END_HEADERS != 0 {
                    let b = self.block.take().expect("block in progress");
                    let fragment = b.fragment();
                    let how = How {
                        multi: true,
                        self_dependent: b.self_dependent,
                    };
                    self.finish(b.stream_id, b.end_stream, &fragment, &b.raw, how);
                }
            }
            // h2 calls this a protocol error
            _ if self.block.is_some() => {
                if matches!(self.mode, Mode::Rewrite(_)) {
                    self.fail();
                } else {
                    self.passthrough_with(&frame);
                }
            }
            _ => self.out.extend_from_slice(&frame),
        }
    }

    /// Stops parsing. Before any rewrite everything goes to h2 as it came (h2
    /// judges it with its own limits); once blocks have been rewritten, h2's
    /// HPACK state no longer matches the client's, so the connection is closed.
    fn give_up(&mut self) {
        if matches!(self.mode, Mode::Rewrite(_)) {
            self.fail()
        } else {
            self.passthrough()
        }
    }

    fn fail(&mut self) {
        self.failed = true;
        self.block = None;
        self.inbuf.clear();
        self.mode = Mode::Passthrough;
    }

    fn passthrough_with(&mut self, frame: &[u8]) {
        if let Some(b) = self.block.take() {
            self.out.extend_from_slice(&b.raw);
        }
        self.out.extend_from_slice(frame);
        self.passthrough();
    }

    /// A whole header block: `fragment` its HPACK bytes, `raw` its frames.
    fn finish(&mut self, stream_id: u32, end_stream: bool, fragment: &[u8], raw: &[u8], how: How) {
        let rewriting = matches!(self.mode, Mode::Rewrite(_));
        let decoder = match &mut self.mode {
            Mode::Detect(d) | Mode::Rewrite(d) => d,
            _ => unreachable!("finish only runs while parsing"),
        };
        let (verdict, over) = match decode(decoder, fragment, &mut self.scratch) {
            Decoded::Headers(v) => (v, false),
            Decoded::TooBig(v) => (v, true),
            Decoded::Bad => {
                if !rewriting {
                    // h2 judges it as it came
                    self.out.extend_from_slice(raw);
                }
                return self.give_up();
            }
        };
        let bad = verdict.bad_authority;
        // a block h2 calls malformed is a clean reset only as the one frame it
        // came in; re-encoded (it may be split) or in several frames, h2 would
        // lose the verdict or the block, so it gets the stand-in. A block too
        // large is h2's to refuse as it came; re-encoded, it is a stand-in.
        let malformed = verdict.refused
            || how.self_dependent
            || (verdict.malformed && (how.multi || bad || rewriting))
            || (over && (bad || rewriting));
        if !rewriting {
            if !bad && !malformed {
                // a well-formed block (or one h2 refuses on its own, keeping
                // its table): h2 gets it as it came, and decodes the same
                // table state
                self.out.extend_from_slice(raw);
                return self.shrink_scratch();
            }
            let Mode::Detect(d) = std::mem::replace(&mut self.mode, Mode::Passthrough) else {
                unreachable!()
            };
            // from here on h2's HPACK table is not the client's: every block is
            // re-encoded as literals
            self.mode = Mode::Rewrite(d);
            if malformed {
                tracing::debug!("malformed request from the client; h2 resets its stream");
            } else {
                tracing::debug!(
                    "client sends a unix path as :authority; rewriting its header blocks"
                );
            }
        }
        self.rewritten += 1;
        if malformed {
            self.malformed += 1;
            let block = literal_block(MALFORMED_STAND_IN);
            write_header_frames(
                &mut self.out,
                stream_id,
                end_stream,
                &block,
                SERVER_MAX_FRAME,
            );
        } else {
            write_header_frames(
                &mut self.out,
                stream_id,
                end_stream,
                &self.scratch,
                SERVER_MAX_FRAME,
            );
        }
        self.shrink_scratch();
    }

    /// A large block's copy is not kept for the connection's life.
    fn shrink_scratch(&mut self) {
        if self.scratch.capacity() > 64 << 10 {
            self.scratch = BytesMut::new();
        }
    }

    /// A client SETTINGS frame: its SETTINGS_MAX_HEADER_LIST_SIZE is noted.
    fn settings(&self, payload: &[u8]) {
        for p in payload.chunks_exact(6) {
            if u16::from_be_bytes([p[0], p[1]]) == 0x6 {
                let v = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
                self.client.header_list.store(v as u64, Ordering::Relaxed);
            }
        }
    }
}

/// What a client connection's SETTINGS said, as far as qoslet mirrors it
/// towards the runtime (see [`crate::limits::runtime_header_list`]).
#[derive(Debug)]
pub struct ClientSettings {
    /// SETTINGS_MAX_HEADER_LIST_SIZE, or `u64::MAX` while none was advertised.
    header_list: AtomicU64,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            header_list: AtomicU64::new(u64::MAX),
        }
    }
}

impl ClientSettings {
    /// The client's advertised header-list limit, if it advertised one.
    pub fn max_header_list(&self) -> Option<u32> {
        u32::try_from(self.header_list.load(Ordering::Relaxed)).ok()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.failed && this.out.is_empty() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "client header block qoslet could not re-encode after rewriting :authority",
                )));
            }
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // a truncated frame at EOF goes out as it is
                let rest = this.inbuf.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.out.extend_from_slice(&rest);
                continue;
            }
            if matches!(this.mode, Mode::Passthrough) && this.inbuf.is_empty() {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            // not zeroed: 16 KiB of memset on every read was half the
            // proxy's instructions per call
            let mut tmp = [const { std::mem::MaybeUninit::<u8>::uninit() }; 16 * 1024];
            let mut rb = ReadBuf::uninit(&mut tmp);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
                if let Some(b) = this.block.take() {
                    this.out.extend_from_slice(&b.raw);
                }
            } else {
                this.inbuf.extend_from_slice(rb.filled());
                this.process();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h2frame::{write_frame, PADDED};
    use tokio::io::AsyncReadExt;

    fn client_stream(blocks: &[Vec<(&[u8], &[u8])>], split_at: usize) -> Vec<u8> {
        let mut enc = fluke_hpack::Encoder::new();
        let mut out = BytesMut::from(PREFACE);
        write_frame(&mut out, 0x4, 0, 0, &[]); // SETTINGS
        for (i, headers) in blocks.iter().enumerate() {
            let sid = 1 + 2 * i as u32;
            let block = enc.encode(headers.iter().copied());
            if block.len() > split_at {
                write_frame(&mut out, HEADERS, 0, sid, &block[..split_at]);
                write_frame(&mut out, CONTINUATION, END_HEADERS, sid, &block[split_at..]);
            } else {
                write_frame(&mut out, HEADERS, END_HEADERS, sid, &block);
            }
            write_frame(&mut out, 0x0, END_STREAM, sid, b"\0\0\0\0\x01x"); // DATA
        }
        out.to_vec()
    }

    /// Reads everything through the wrapper, feeding the input in small pieces.
    async fn run(input: Vec<u8>) -> (Vec<u8>, u64) {
        let (mut a, b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for c in input.chunks(7) {
                a.write_all(c).await.unwrap();
            }
        });
        let mut fix = AuthorityFix::new(b);
        let mut out = Vec::new();
        fix.read_to_end(&mut out).await.unwrap();
        writer.await.unwrap();
        (out, fix.rewritten())
    }

    /// Decodes the header blocks of an HTTP/2 client byte stream.
    fn blocks_of(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        assert!(bytes.starts_with(PREFACE));
        let mut p = &bytes[PREFACE.len()..];
        let mut dec = fluke_hpack::Decoder::new();
        let mut out = vec![];
        let mut acc = Vec::new();
        while !p.is_empty() {
            let len = u32::from_be_bytes([0, p[0], p[1], p[2]]) as usize;
            let (ty, flags) = (p[3], p[4]);
            let payload = &p[9..9 + len];
            if ty == HEADERS || ty == CONTINUATION {
                acc.extend_from_slice(if ty == HEADERS {
                    headers_fragment(flags, payload).unwrap()
                } else {
                    payload
                });
                if flags & END_HEADERS != 0 {
                    out.push(dec.decode(&acc).unwrap());
                    acc.clear();
                }
            }
            p = &p[9 + len..];
        }
        out
    }

    fn req(authority: &'static [u8], path: &'static [u8]) -> Vec<(&'static [u8], &'static [u8])> {
        vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-go/1.44.0"),
            (b"te", b"trailers"),
        ]
    }

    #[tokio::test]
    async fn valid_authority_passes_byte_for_byte() {
        let input = client_stream(
            &[req(b"localhost", b"/a/B"), req(b"localhost", b"/a/C")],
            10_000,
        );
        let (out, n) = run(input.clone()).await;
        assert_eq!(out, input);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn unix_path_authority_is_rewritten_in_every_block() {
        let long = b"/x/".repeat(3000).leak(); // forces CONTINUATION frames in and out
        let input = client_stream(
            &[
                req(b"/run/qoslet/qoslet.sock", b"/a/B"),
                req(b"/run/qoslet/qoslet.sock", long),
                req(b"/run/qoslet/qoslet.sock", b"/a/B"),
            ],
            20,
        );
        let (out, n) = run(input.clone()).await;
        assert_eq!(n, 3);
        let before = blocks_of(&input);
        let after = blocks_of(&out);
        assert_eq!(after.len(), 3);
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(a.len(), b.len());
            for ((bn, bv), (an, av)) in b.iter().zip(a) {
                assert_eq!(an, bn);
                if an == b":authority" {
                    assert_eq!(av, b"localhost");
                } else {
                    assert_eq!(av, bv, "{}", String::from_utf8_lossy(an));
                }
            }
        }
    }

    /// Issue 27 item 4: a request h2 would close the connection for (an
    /// upper-case name) reaches h2 as a stand-in it resets at stream level;
    /// the blocks before it went as they came, the ones after are re-encoded
    /// whole (h2's table no longer matches the client's).
    #[tokio::test]
    async fn a_malformed_request_becomes_a_stream_error_and_later_blocks_survive() {
        let mut bad = req(b"localhost", b"/a/Bad");
        bad.push((b"X-Upper", b"v"));
        let input = client_stream(
            &[req(b"localhost", b"/a/B"), bad, req(b"localhost", b"/a/C")],
            10_000,
        );
        let (out, n) = run(input.clone()).await;
        assert_eq!(n, 2, "the stand-in and the block after it");
        let after = blocks_of(&out);
        assert_eq!(after.len(), 3);
        assert_eq!(after[0], blocks_of(&input)[0]);
        let stand_in: Vec<(Vec<u8>, Vec<u8>)> = MALFORMED_STAND_IN
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(after[1], stand_in);
        assert_eq!(after[2], blocks_of(&input)[2]);
    }

    /// Second review of issue 27: a block h2 calls malformed (`connection`,
    /// `te: gzip`, a pseudo-header after a regular field) is a clean stream
    /// reset in h2 only as one frame; split over frames, h2 would end the
    /// connection or serve it, so it gets the stand-in. As one frame it goes to
    /// h2 as it came.
    #[tokio::test]
    async fn blocks_h2_calls_malformed_get_the_stand_in_only_across_frames() {
        let stand_in: Vec<(Vec<u8>, Vec<u8>)> = MALFORMED_STAND_IN
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        for extra in [
            (&b"connection"[..], &b"close"[..]),
            (b"te", b"gzip"),
            (b":path", b"/again"),
        ] {
            let mut bad = req(b"localhost", b"/a/Bad");
            bad.push(extra);
            // one frame: as it came, and the connection stays unrewritten
            let input = client_stream(&[bad.clone(), req(b"localhost", b"/a/C")], 10_000);
            let (out, n) = run(input.clone()).await;
            assert_eq!((out, n), (input, 0), "{extra:?}");
            // across frames: the stand-in, the next block re-encoded whole
            let input = client_stream(&[bad, req(b"localhost", b"/a/C")], 20);
            let (out, n) = run(input.clone()).await;
            assert_eq!(n, 2, "{extra:?}");
            let after = blocks_of(&out);
            assert_eq!(after[0], stand_in, "{extra:?}");
            assert_eq!(after[1], blocks_of(&input)[1]);
        }
    }

    /// Review of issue 27: h2 resets a stream whose HEADERS names itself as
    /// its dependency before it decodes the block, so its table would miss
    /// the block's entries: the block gets the stand-in (the same reset), and
    /// later blocks are re-encoded. Another stream's dependency passes.
    #[tokio::test]
    async fn a_self_dependent_priority_gets_the_stand_in() {
        let stand_in: Vec<(Vec<u8>, Vec<u8>)> = MALFORMED_STAND_IN
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        for (dependency, padded) in [(1u32, false), (1, true), (3, false)] {
            let mut enc = fluke_hpack::Encoder::new();
            let mut input = BytesMut::from(PREFACE);
            write_frame(&mut input, SETTINGS, 0, 0, &[]);
            let first = req(b"localhost", b"/a/B");
            let mut payload = Vec::new();
            if padded {
                payload.push(2);
            }
            payload.extend_from_slice(&dependency.to_be_bytes());
            payload.push(15); // weight
            payload.extend_from_slice(&enc.encode(first.iter().copied()));
            if padded {
                payload.extend_from_slice(&[0, 0]);
            }
            let flags = END_HEADERS | END_STREAM | PRIORITY | if padded { PADDED } else { 0 };
            write_frame(&mut input, HEADERS, flags, 1, &payload);
            let second = enc.encode(req(b"localhost", b"/a/C").iter().copied());
            write_frame(&mut input, HEADERS, END_HEADERS | END_STREAM, 3, &second);
            let (out, n) = run(input.to_vec()).await;
            if dependency == 3 {
                assert_eq!(
                    (&out[..], n),
                    (&input[..], 0),
                    "another stream's priority passes"
                );
                continue;
            }
            assert_eq!(n, 2, "padded: {padded}");
            let after = blocks_of(&out);
            assert_eq!(after[0], stand_in);
            let expect: Vec<(Vec<u8>, Vec<u8>)> = req(b"localhost", b"/a/C")
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect();
            assert_eq!(
                after[1], expect,
                "the next block decoded with the client's table"
            );
        }
    }

    /// A block that decodes past the header-list limit is h2's to refuse as
    /// it came (h2 decodes it to its end, so the tables stay equal): nothing
    /// is rewritten, and a malformed request after it still gets a reset of
    /// its own stream.
    #[tokio::test]
    async fn an_oversized_block_is_h2s_and_the_connection_is_still_judged() {
        // 4,200 references to one 4 KiB entry: ~17 MiB decoded, a few KiB sent
        let big = vec![b'v'; 4000];
        let mut huge: Vec<(&[u8], &[u8])> = req(b"localhost", b"/a/B");
        huge.extend(std::iter::repeat_n((&b"x-big"[..], &big[..]), 4200));
        let mut bad = req(b"localhost", b"/a/D");
        bad.push((b"X-Upper", b"v"));
        let input = client_stream(&[huge.clone(), req(b"localhost", b"/a/C")], 16 << 10);
        assert!(input.len() < 64 << 10);
        let (out, n) = run(input.clone()).await;
        assert_eq!((out, n), (input, 0), "passed on as it came");
        let input = client_stream(&[huge, bad], 16 << 10);
        let (out, n) = run(input).await;
        assert_eq!(n, 1, "the malformed request after it is judged");
        assert_eq!(
            blocks_of(&out)[1][3],
            (b"connection".to_vec(), b"qoslet-malformed-request".to_vec())
        );
    }

    #[test]
    fn what_h2_refuses_outright() {
        for (n, v) in [
            (&b"X-Upper"[..], &b"v"[..]),
            (b"", b"v"),
            (b"a b", b"v"),
            (b"x-a", b"a\x01b"),
            (b":foo", b"bar"),
            (b":method", b"P OST"),
            (b":path", b"\xff"),
        ] {
            assert!(h2_refuses_field(n, v), "{n:?}");
        }
        for (n, v) in [
            (&b"x-lower"[..], &b"v\tw"[..]),
            (b":method", b"POST"),
            (b":path", b"/runtime.v1.RuntimeService/Version"),
            (b"x-bin", b"\x80\xff"),
            (b":authority", b"/run/qoslet.sock"),
        ] {
            assert!(!h2_refuses_field(n, v), "{n:?}");
        }
    }

    #[test]
    fn the_clients_header_list_limit_is_noted() {
        let mut f = AuthorityFix::new(());
        let settings = f.client_settings();
        assert_eq!(settings.max_header_list(), None);
        let mut input = BytesMut::from(PREFACE);
        // SETTINGS: MAX_CONCURRENT_STREAMS 100, MAX_HEADER_LIST_SIZE 16384
        write_frame(
            &mut input,
            SETTINGS,
            0,
            0,
            &[0, 3, 0, 0, 0, 100, 0, 6, 0, 0, 0x40, 0],
        );
        f.inbuf.extend_from_slice(&input);
        f.process();
        assert_eq!(settings.max_header_list(), Some(16384));
        assert_eq!(&f.out[..], &input[..]);
    }

    #[tokio::test]
    async fn garbage_is_passed_on_untouched() {
        let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(run(input.clone()).await.0, input);
        let mut bad = PREFACE.to_vec();
        bad.extend_from_slice(&[0, 0, 3, HEADERS, END_HEADERS | PADDED, 0, 0, 0, 1, 9, 1, 2]); // padding > payload
        bad.extend_from_slice(b"trailing");
        assert_eq!(run(bad.clone()).await.0, bad);
        let truncated = PREFACE
            .iter()
            .chain(&[0u8, 0, 50, HEADERS, 4, 0, 0, 0, 1, 1, 2])
            .copied()
            .collect::<Vec<_>>();
        assert_eq!(run(truncated.clone()).await.0, truncated);
    }

    /// Issue 11 item 4: random client byte streams (after a valid preface:
    /// random frames, header blocks with random and hostile `:authority`
    /// values, CONTINUATION runs, bad HPACK) fed in random chunks never panic,
    /// and what the filter holds and emits stays bounded by what it was given.
    #[test]
    fn random_client_streams_never_panic_and_stay_bounded() {
        let mut rng = crate::fuzz::Rng::new(21);
        for _ in 0..3_000 {
            let mut input = BytesMut::from(PREFACE);
            let mut enc = fluke_hpack::Encoder::new();
            for _ in 0..1 + rng.below(12) {
                let sid = (rng.below(8) as u32) * 2 + 1;
                match rng.below(4) {
                    0 => {
                        let auth: Vec<u8> = match rng.below(3) {
                            0 => b"localhost".to_vec(),
                            1 => b"/run/qoslet/qoslet.sock".to_vec(),
                            _ => {
                                let n = 1 + rng.below(40);
                                rng.bytes(n)
                            }
                        };
                        let block = enc.encode(vec![
                            (&b":method"[..], &b"POST"[..]),
                            (&b":path"[..], &b"/runtime.v1.RuntimeService/Version"[..]),
                            (&b":authority"[..], &auth[..]),
                        ]);
                        let block = if rng.below(4) == 0 {
                            rng.mutate(&block)
                        } else {
                            block
                        };
                        let cut = rng.below(block.len() + 1);
                        let flags = if cut == block.len() { END_HEADERS } else { 0 };
                        write_frame(&mut input, HEADERS, flags, sid, &block[..cut]);
                        if cut < block.len() {
                            write_frame(&mut input, CONTINUATION, END_HEADERS, sid, &block[cut..]);
                        }
                    }
                    1 => {
                        let n = rng.below(200);
                        let p = rng.bytes(n);
                        let (ty, flags) = (rng.below(10) as u8, rng.next() as u8);
                        write_frame(&mut input, ty, flags, sid, &p);
                    }
                    2 => {
                        for _ in 0..rng.below(6) {
                            let n = rng.below(300);
                            let p = rng.bytes(n);
                            write_frame(&mut input, CONTINUATION, 0, sid, &p);
                        }
                    }
                    _ => {
                        let n = rng.below(64);
                        input.extend_from_slice(&rng.bytes(n));
                    }
                }
            }
            let mut f = AuthorityFix::new(());
            let mut at = 0;
            while at < input.len() {
                let end = (at + 1 + rng.below(700)).min(input.len());
                f.inbuf.extend_from_slice(&input[at..end]);
                f.process();
                at = end;
                assert!(f.inbuf.len() <= input.len());
                assert!(
                    f.out.len() <= 4 * input.len() + 4096,
                    "output bounded by input"
                );
            }
        }
    }

    /// Review of issue 11: an HPACK bomb (one 4 KiB table entry, then a
    /// megabyte of one-byte references to it: 4 GB once decoded) stops at
    /// h2's abuse budget (four times the header-list limit) and is h2's to
    /// refuse; a block decoding to just over the limit is decoded to its end
    /// (the table stays the client's), as h2 does; a size update whose
    /// integer does not end and one above the server's table size are
    /// refused.
    #[test]
    fn hpack_bombs_and_decoder_errors_are_contained() {
        let mut entry = vec![0x40, 0x01, b'x', 0x7f]; // literal, new name "x", 4063-byte value
        let mut len_rest = 4063 - 127;
        while len_rest >= 128 {
            entry.push((len_rest % 128) as u8 | 0x80);
            len_rest /= 128;
        }
        entry.push(len_rest as u8);
        entry.extend(std::iter::repeat_n(b'v', 4063));
        let scratch = &mut BytesMut::new();
        let mut bomb = entry.clone();
        bomb.extend(std::iter::repeat_n(0xbe, 1 << 20)); // index 62: the entry above
        assert!(matches!(
            decode(&mut new_decoder(), &bomb, scratch),
            Decoded::Bad
        ));
        // 4,200 references: ~17 MiB decoded
        let mut big = vec![0x82];
        big.extend_from_slice(&entry);
        big.extend(std::iter::repeat_n(0xbe, 4200));
        let mut d = new_decoder();
        assert!(
            matches!(decode(&mut d, &big, scratch), Decoded::TooBig(v) if v == Verdict::default())
        );
        assert!(scratch.is_empty(), "nothing kept of a block h2 refuses");
        assert!(
            matches!(decode(&mut d, &[0xbe], scratch), Decoded::Headers(_)),
            "the entry is there"
        );
        assert!(matches!(
            decode(&mut new_decoder(), &[0x3f], scratch),
            Decoded::Bad
        ));
        assert!(matches!(
            decode(&mut new_decoder(), &[0x3f, 0x80, 0x80, 0x80, 0x80], scratch),
            Decoded::Bad
        ));
        // a size update to 8192, above the 4096 h2 advertised
        assert!(matches!(
            decode(&mut new_decoder(), &[0x3f, 0xe1, 0x3f, 0x82], scratch),
            Decoded::Bad
        ));
        // through the filter: passed on to h2 as it came, nothing rewritten
        let mut f = AuthorityFix::new(());
        let mut input = BytesMut::from(PREFACE);
        write_frame(&mut input, HEADERS, END_HEADERS, 1, &[0x3f]);
        f.inbuf.extend_from_slice(&input);
        f.process();
        assert_eq!(&f.out[..], &input[..]);
        assert_eq!(f.rewritten(), 0);
    }

    /// Review of issue 11: empty CONTINUATION frames (which grow no fragment)
    /// end the parsing after h2's own limit (1,280), and a frame longer than
    /// the server's maximum is never buffered.
    #[test]
    fn empty_continuations_and_oversized_frames_are_not_held() {
        let mut f = AuthorityFix::new(());
        let mut input = BytesMut::from(PREFACE);
        write_frame(&mut input, HEADERS, 0, 1, &[0x82]);
        for _ in 0..MAX_CONTINUATIONS + 10 {
            write_frame(&mut input, CONTINUATION, 0, 1, &[]);
        }
        f.inbuf.extend_from_slice(&input);
        f.process();
        assert!(f.block.is_none() && matches!(f.mode, Mode::Passthrough));
        assert_eq!(&f.out[..], &input[..], "passed on as it came");

        let mut f = AuthorityFix::new(());
        let mut input = BytesMut::from(PREFACE);
        input.extend_from_slice(&[0x20, 0x00, 0x00, HEADERS, END_HEADERS, 0, 0, 0, 1]); // 2 MiB announced
        input.extend_from_slice(&[0; 100]);
        f.inbuf.extend_from_slice(&input);
        f.process();
        assert!(matches!(f.mode, Mode::Passthrough));
        assert!(f.inbuf.is_empty(), "not held waiting for 2 MiB");
    }
}
