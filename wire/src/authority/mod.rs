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
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::h2frame::{
    headers_fragment, literal_block, put_field, write_header_frames, ACK, CONTINUATION,
    END_HEADERS, END_STREAM, FRAME_HEADER, HEADERS, PADDED, PREFACE, PRIORITY, SETTINGS,
};
use crate::hpack::Notes;

mod judge;
#[cfg(test)]
mod tests;

pub use judge::{h2_refuses_field, FieldNote, H2Judge, NameKind};
use judge::{Credit, Judge};
/// The client's HPACK decoding context, judging as it goes.
type Decoder = crate::hpack::Decoder<H2Judge>;
/// The most a block may decode to (names + values + 32 per field, as RFC 7541
/// counts): h2 refuses a stream whose block reaches it (431, REFUSED_STREAM).
const MAX_DECODED: usize = crate::limits::MAX_HEADER_LIST;
/// CONTINUATION frames one block may take (h2's own limit at qoslet's settings).
const MAX_CONTINUATIONS: u32 = crate::limits::MAX_CONTINUATIONS as u32;
/// The largest frame qoslet's HTTP/2 server accepts (`SETTINGS_MAX_FRAME_SIZE`),
/// and the size rewritten header blocks are split at.
pub const SERVER_MAX_FRAME: usize = crate::limits::MAX_FRAME;
/// The dynamic table size qoslet's HTTP/2 server advertises (h2's default):
/// a client's size update above it is a decoding error (RFC 7541 §6.3).
const SERVER_HEADER_TABLE: usize = 4096;
/// What copying blocks out (to re-encode them as literals) may cost one
/// connection, as a credit: it starts at [`CREDIT_START`], earns
/// [`REWRITE_PER_BYTE`] per HPACK byte the client sends and
/// [`CREDIT_PER_SECOND`], up to [`CREDIT_CAP`]; every copy is paid from it,
/// whether the copy is sent on or not. A block whose copy would overdraw it
/// (references to large entries: an HPACK bomb) is not copied further and,
/// if it had to be re-encoded, gets the stand-in (a stream reset). grpc-go's
/// requests decode to about 15 times what they take on the wire and a
/// reference to a long token to a few hundred times (a few KiB, which time
/// pays), so a legitimate client is never refused; a block of one-byte
/// references to a 4 KiB entry decodes to 4,096 times.
const REWRITE_PER_BYTE: i64 = 64;
const CREDIT_START: i64 = 64 << 10;
const CREDIT_PER_SECOND: i64 = 1 << 20;
const CREDIT_CAP: i64 = 1 << 20;
/// Re-decoding h2 would do of a block as it came: a complete Huffman-coded
/// name waiting in a block's leftover for its value is decoded again on each
/// CONTINUATION (quadratic work on the thread serving kubelet). Past this
/// much plus [`REDECODE_PER_BYTE`] per byte of the block, the block is handed
/// to h2 re-encoded (no Huffman), and a block qoslet gives up on is not
/// handed on at all (the connection is closed). No client sends such names.
const REDECODE_BASE: usize = 1 << 10;
const REDECODE_PER_BYTE: usize = 4;
/// Buffers larger than this are not kept once empty.
const KEEP_BUFFER: usize = 64 << 10;
/// A client's PUSH_PROMISE (h2 decodes its block, then ends the connection).
const PUSH_PROMISE: u8 = 0x5;

/// Whether `v` is acceptable to h2 as an `:authority`.
pub fn valid_authority(v: &[u8]) -> bool {
    http::uri::Authority::try_from(v).is_ok()
}

/// A header block spread over several frames, held until its last as the
/// frames came; its fields are judged frame by frame, as h2 decodes them.
struct Block {
    stream_id: u32,
    end_stream: bool,
    raw: BytesMut,
    /// The incomplete field the frames so far ended with.
    leftover: BytesMut,
    /// CONTINUATION frames without END_HEADERS, as h2 counts them.
    continuations: u32,
    /// Its HEADERS frame names its own stream as its dependency.
    self_dependent: bool,
}

/// How a header block came.
#[derive(Clone, Copy)]
struct How {
    /// In more than one frame.
    multi: bool,
    /// With a priority on its own stream.
    self_dependent: bool,
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
    Box::new(Decoder::new(SERVER_HEADER_TABLE, H2Judge))
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
    /// The judgement of the block being read.
    judge: Judge,
    /// That block, re-encoded as literals (reused).
    scratch: BytesMut,
    /// What copying blocks out may still take (see [`REWRITE_PER_BYTE`]).
    credit: Credit,
    /// What copying blocks out has taken so far.
    copied: u64,
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
            judge: Judge::default(),
            scratch: BytesMut::new(),
            credit: Credit::new(),
            copied: 0,
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
                let self_dependent = self_dependent(flags, stream_id, payload);
                let Some(fragment) = headers_fragment(flags, payload) else {
                    // padding past the frame's end: h2 ends the connection
                    // (RFC 9113 §6.2), or, for a stream that depends on
                    // itself, resets the stream without decoding the block,
                    // whose entries the client's table has: the tables part
                    return if self_dependent {
                        self.fail()
                    } else {
                        self.give_up_with(&frame)
                    };
                };
                let end_stream = flags & END_STREAM != 0;
                let last = flags & END_HEADERS != 0;
                self.judge = Judge::new(
                    matches!(self.mode, Mode::Rewrite(_)),
                    self.credit.available(),
                );
                self.scratch.clear();
                let Some(used) = self.judge_fragment(fragment, fragment.len(), last) else {
                    return if self_dependent {
                        self.fail()
                    } else {
                        self.give_up_with(&frame)
                    };
                };
                if last {
                    // the common case, one frame: judged where it lies
                    let how = How {
                        multi: false,
                        self_dependent,
                    };
                    return self.finish(stream_id, end_stream, &frame, how);
                }
                self.block = Some(Block {
                    stream_id,
                    end_stream,
                    raw: BytesMut::from(&frame[..]),
                    leftover: BytesMut::from(&fragment[used..]),
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
                let last = flags & END_HEADERS != 0;
                let b = self.block.as_mut().expect("checked");
                b.raw.extend_from_slice(&frame);
                if !last {
                    b.continuations += 1;
                }
                // empty CONTINUATIONs grow nothing but the frame count
                if b.continuations > MAX_CONTINUATIONS {
                    return self.give_up();
                }
                let mut buf = std::mem::take(&mut b.leftover);
                buf.extend_from_slice(payload);
                if last {
                    self.judge.malformed_early = self.judge.verdict.malformed;
                }
                let Some(used) = self.judge_fragment(&buf, payload.len(), last) else {
                    return self.give_up();
                };
                buf.advance(used);
                let j = &mut self.judge;
                j.redecoded = j
                    .redecoded
                    .saturating_add(crate::hpack::pending_huffman_name(&buf));
                if j.redecoded
                    > REDECODE_BASE.saturating_add(j.sent.saturating_mul(REDECODE_PER_BYTE))
                {
                    // from here on every field is kept for the re-encoding
                    j.h2_quadratic = true;
                    j.copy_all = true;
                }
                let b = self.block.as_mut().expect("checked");
                b.leftover = buf;
                if last {
                    let b = self.block.take().expect("block in progress");
                    let how = How {
                        multi: true,
                        self_dependent: b.self_dependent,
                    };
                    self.finish(b.stream_id, b.end_stream, &b.raw, how);
                }
            }
            // h2 decodes a client's PUSH_PROMISE block, then ends the
            // connection: the tables must not part before that
            PUSH_PROMISE if self.block.is_none() => self.give_up_with(&frame),
            // h2 calls this a protocol error
            _ if self.block.is_some() => self.give_up_with(&frame),
            _ => self.out.extend_from_slice(&frame),
        }
    }

    /// Decodes what `buf` holds of the current block (`sent` of it new from
    /// the client), judging each field: the bytes decoded, or `None` when it
    /// is not HPACK (h2 ends the connection).
    fn judge_fragment(&mut self, buf: &[u8], sent: usize, last: bool) -> Option<usize> {
        let (Mode::Detect(decoder) | Mode::Rewrite(decoder)) = &mut self.mode else {
            unreachable!("blocks are only judged while parsing");
        };
        let (judge, rewrite) = (&mut self.judge, &mut self.scratch);
        judge.sent = judge.sent.saturating_add(sent);
        decoder
            .decode(buf, last, |n, v, note, never| {
                judge.field(n, v, note, never, rewrite)
            })
            .ok()
    }

    /// Stops parsing. Before any rewrite everything goes to h2 as it came (h2
    /// judges it with its own limits); once blocks have been rewritten, h2's
    /// HPACK state no longer matches the client's, so the connection is closed.
    /// So it is when the block held would cost h2 quadratic work as it came.
    fn give_up(&mut self) {
        if self.cannot_pass() {
            self.fail()
        } else {
            self.passthrough()
        }
    }

    /// Whether what is held may not go to h2 as it came.
    fn cannot_pass(&self) -> bool {
        matches!(self.mode, Mode::Rewrite(_)) || (self.block.is_some() && self.judge.h2_quadratic)
    }

    /// [`Self::give_up`], with `frame` (not held yet) after what is held.
    fn give_up_with(&mut self, frame: &[u8]) {
        if self.cannot_pass() {
            self.fail()
        } else {
            self.passthrough_with(frame)
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

    /// A whole header block, judged: `raw` its frames.
    fn finish(&mut self, stream_id: u32, end_stream: bool, raw: &[u8], how: How) {
        // the copy is paid for whether it is sent on or not
        self.credit.settle(self.judge.sent, self.scratch.len());
        self.copied = self.copied.saturating_add(self.scratch.len() as u64);
        self.finish_block(stream_id, end_stream, raw, how);
    }

    fn finish_block(&mut self, stream_id: u32, end_stream: bool, raw: &[u8], how: How) {
        let rewriting = matches!(self.mode, Mode::Rewrite(_));
        let j = &self.judge;
        let verdict = j.verdict;
        let bad = verdict.bad_authority || j.h2_quadratic;
        let needs_rewrite = bad || rewriting;
        // a block h2 calls malformed is a clean reset only as the one frame it
        // came in; re-encoded (it may be split) or in several frames, h2 would
        // lose the verdict or the block, so it gets the stand-in. A block too
        // large is h2's to refuse as it came; one that must be re-encoded and
        // cannot be (too large, or over the rewrite budget) is a stand-in.
        // (malformed only in the last frame: h2 decoded every frame, and
        // resets just the stream)
        let malformed = verdict.refused
            || how.self_dependent
            || (verdict.malformed && ((how.multi && j.malformed_early) || needs_rewrite))
            || (needs_rewrite && (j.over || j.short || j.skipped));
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
            } else if j.h2_quadratic {
                tracing::debug!("a header block h2 would decode quadratically; rewriting");
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
        if self.scratch.capacity() > KEEP_BUFFER {
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
                    "client header block qoslet could not pass on (its HPACK table is \
                     re-encoded, or h2 would decode the block quadratically)",
                )));
            }
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                if this.out.is_empty() && this.out.capacity() > KEEP_BUFFER {
                    this.out = BytesMut::new();
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // a truncated frame at EOF goes out as it is (not once
                // rewriting: it may be a header block)
                let rest = this.inbuf.split();
                if matches!(this.mode, Mode::Rewrite(_)) {
                    return Poll::Ready(Ok(()));
                }
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
                let dropped = this.cannot_pass();
                if let Some(b) = this.block.take() {
                    // unfinished: h2 judges it as it came, unless h2's table
                    // is not the client's any more or h2 would decode it
                    // quadratically (then it is dropped)
                    if dropped {
                        this.inbuf.clear(); // its truncated last frame
                    } else {
                        this.out.extend_from_slice(&b.raw);
                    }
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
