//! The HTTP/2 frame relay: kubelet's connection and one connection to the
//! runtime, paired 1:1, with frames passed through as bytes.
//!
//! Terminating HTTP/2 on both sides (h2 + HPACK twice per call) costs about
//! 100 µs of CPU per call on small machines; a relay costs almost nothing, and
//! is also the most transparent proxy there is: headers, metadata, unknown
//! methods and frame types reach containerd byte for byte.
//!
//! How it works:
//! * At accept, qoslet sends the client an empty SETTINGS frame (gRPC clients
//!   wait for the server's first SETTINGS) and reads until the first request's
//!   header block. A reflection request (grpcurl) or an unreachable runtime
//!   hands the connection to the HTTP/2-terminating path ([`crate::forward`]),
//!   with the bytes read so far replayed and our SETTINGS' ACK removed.
//! * Client -> runtime: frames are forwarded unchanged. Header blocks are
//!   HPACK-decoded (mirroring the client's encoder table) to learn each
//!   stream's method; if one must change (an intercepted call drops
//!   `content-length`, as its body may grow; kubelet never sends one), it and
//!   every later block are re-encoded as literals without indexing. For
//!   intercepted calls the request DATA is held until
//!   END_STREAM, decoded once, run through the hooks, and forwarded as the
//!   original bytes plus patches (or refused: RST to the runtime, a gRPC status
//!   to the client).
//! * Runtime -> client: header blocks are decoded and re-encoded the same way,
//!   so neither side's HPACK table depends on what qoslet drops or adds. Intercepted responses are held until complete,
//!   recorded in the store and run through the "after" hooks.
//! * Flow control: the runtime's connection-level WINDOW_UPDATEs are reduced by
//!   the bytes qoslet added (patches); bytes qoslet drops are credited back to
//!   their sender. Requests or responses of intercepted calls larger than 32 KiB
//!   (far above any CRI message) are passed through without interception.
//! * The 16 MiB message limit is enforced per stream by following gRPC frame
//!   headers inside DATA, both ways.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tonic::{Code, Status};
use tracing::{debug, warn};

use crate::cri::{route, CriRequest, HookPoint, Route};
use crate::forward::{Forwarder, Prepared};
use crate::grpc::{parse_header, too_large};
use crate::h2frame::*;
use crate::hpack::{Decoder, Headers};

/// Held request/response bytes above this are passed through uninspected.
const HOLD_CAP: usize = 32 * 1024;
/// How long a new connection may take to send its first request.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Room made in a connection's read buffer before each read.
const READ_CHUNK: usize = 64 * 1024;

fn decoder() -> Decoder {
    Decoder::default()
}

/// What to do with a new connection.
pub(crate) enum Start {
    /// Relay it: the runtime connection is open, `pending` holds the client's
    /// bytes so far (preface included) with our SETTINGS' ACK removed.
    Relay {
        backend: UnixStream,
        pending: BytesMut,
        dec: Decoder,
        ack_dropped: bool,
    },
    /// Hand it to the HTTP/2-terminating path with these bytes replayed first.
    /// `runtime_down`: chosen because the runtime was unreachable (the
    /// connection should move back to the relay once it is up again).
    Terminate {
        replay: Bytes,
        ack_dropped: bool,
        runtime_down: bool,
    },
    /// The client went away (or sent nothing in time).
    Closed,
}

/// Sends our SETTINGS, reads the client's start and decides.
pub(crate) async fn start(client: &mut UnixStream, backend_path: &std::path::Path) -> Start {
    // an empty SETTINGS frame: the server preface gRPC clients wait for
    if client
        .write_all(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0])
        .await
        .is_err()
    {
        return Start::Closed;
    }
    let mut raw = BytesMut::new();
    let first = tokio::time::timeout(FIRST_REQUEST_TIMEOUT, async {
        loop {
            match scan_start(&raw) {
                Scan::Need => {}
                other => return Some(other),
            }
            let mut chunk = [0u8; 16 * 1024];
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let scan = match first {
        Ok(Some(s)) => s,
        Ok(None) if raw.is_empty() => return Start::Closed,
        // EOF or timeout mid-way: let the HTTP/2 server produce the right error
        Ok(None) | Err(_) => {
            return Start::Terminate {
                replay: raw.freeze(),
                ack_dropped: false,
                runtime_down: false,
            }
        }
    };
    let Scan::Ready { path, ack_at } = scan else {
        return Start::Terminate {
            replay: raw.freeze(),
            ack_dropped: false,
            runtime_down: false,
        };
    };
    let mut pending = raw;
    let ack_dropped = if let Some(at) = ack_at {
        let tail = pending.split_off(at);
        pending.extend_from_slice(&tail[FRAME_HEADER..]);
        true
    } else {
        false
    };
    if route(&path) == Route::Reflection {
        return Start::Terminate {
            replay: pending.freeze(),
            ack_dropped,
            runtime_down: false,
        };
    }
    match UnixStream::connect(backend_path).await {
        Ok(backend) => {
            // the first block is decoded again by the pump, with a fresh mirror table
            Start::Relay {
                backend,
                pending,
                dec: decoder(),
                ack_dropped,
            }
        }
        Err(e) => {
            debug!(error = %e, "runtime unreachable; serving this connection with the terminating path");
            Start::Terminate {
                replay: pending.freeze(),
                ack_dropped,
                runtime_down: true,
            }
        }
    }
}

enum Scan {
    Need,
    /// Not HTTP/2 as expected.
    Odd,
    Ready {
        path: String,
        ack_at: Option<usize>,
    },
}

/// Looks at the client's bytes so far: the preface, frames, the first header block.
fn scan_start(raw: &[u8]) -> Scan {
    let n = raw.len().min(PREFACE.len());
    if raw[..n] != PREFACE[..n] {
        return Scan::Odd;
    }
    if raw.len() < PREFACE.len() {
        return Scan::Need;
    }
    let mut at = PREFACE.len();
    let mut ack_at = None;
    let mut block: Option<Vec<u8>> = None;
    while raw.len() >= at + FRAME_HEADER {
        let len = u32::from_be_bytes([0, raw[at], raw[at + 1], raw[at + 2]]) as usize;
        if len > (1 << 20) {
            return Scan::Odd;
        }
        if raw.len() < at + FRAME_HEADER + len {
            return Scan::Need;
        }
        let (ty, flags) = (raw[at + 3], raw[at + 4]);
        let payload = &raw[at + FRAME_HEADER..at + FRAME_HEADER + len];
        match ty {
            SETTINGS if flags & ACK != 0 && ack_at.is_none() && block.is_none() => {
                ack_at = Some(at)
            }
            HEADERS if block.is_none() => match headers_fragment(flags, payload) {
                Some(f) => block = Some(f.to_vec()),
                None => return Scan::Odd,
            },
            CONTINUATION if block.is_some() => {
                block.as_mut().expect("checked").extend_from_slice(payload)
            }
            _ if block.is_some() => return Scan::Odd,
            _ => {}
        }
        if matches!(ty, HEADERS | CONTINUATION) && flags & END_HEADERS != 0 {
            let Ok(h) = decoder().decode(block.as_deref().unwrap_or_default()) else {
                return Scan::Odd;
            };
            let path = h
                .iter()
                .find(|(n, _)| n == b":path")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            return Scan::Ready { path, ack_at };
        }
        at += FRAME_HEADER + len;
    }
    Scan::Need
}

/// gRPC message framing followed through DATA payloads, for the size limit.
#[derive(Default)]
struct MsgScan {
    remaining: usize,
    header: [u8; 5],
    have: usize,
}

impl MsgScan {
    /// Returns the size of an oversized message, if one starts in `data`.
    fn scan(&mut self, mut data: &[u8], limit: usize) -> Option<usize> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let len = parse_header(&self.header).map(|h| h.len).unwrap_or(0);
                if len > limit {
                    return Some(len);
                }
                self.remaining = len;
            }
        }
        None
    }
}

/// A held response of an intercepted call.
#[derive(Default)]
struct Held {
    blocks: Vec<(Headers, bool)>,
    data: BytesMut,
    data_frames: BytesMut,
    flow: u32,
}

#[derive(Default)]
struct Stream {
    point: Option<HookPoint>,
    events: bool,
    client_done: bool,
    backend_done: bool,
    /// Request DATA held for interception (payload, raw frames, flow-controlled bytes).
    req: Option<(BytesMut, BytesMut, u32)>,
    req_scan: MsgScan,
    resp_scan: MsgScan,
    /// Response frames held for recording/after-hooks.
    resp: Option<Held>,
    /// What the hooks saw, for the after stage.
    prepared: Option<(CriRequest, CriRequest)>,
    /// qoslet answered the client itself: runtime frames for it are dropped.
    taken: bool,
    /// Response headers went out to the client (trailers-only is no longer possible).
    resp_started: bool,
}

/// Stream ids hashed with murmur3's 64-bit finalizer: a few instructions
/// instead of SipHash's hundred, several times per call. Not DoS-resistant:
/// the ids come from kubelet on a root-only socket, and must only grow.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u32(&mut self, i: u32) {
        self.0 = u64::from(i);
    }

    fn finish(&self) -> u64 {
        let mut k = self.0;
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^ (k >> 33)
    }
}

#[derive(Default)]
struct Shared {
    streams: HashMap<u32, Stream, BuildHasherDefault<IdHasher>>,
    /// Bytes qoslet added toward the runtime, withheld from its WINDOW_UPDATEs to the client.
    debt: u64,
    max_stream: u32,
}

/// Both write halves.
struct Writers {
    client: tokio::sync::Mutex<OwnedWriteHalf>,
    backend: tokio::sync::Mutex<OwnedWriteHalf>,
}

impl Writers {
    async fn to_client(&self, b: &[u8]) -> bool {
        b.is_empty() || self.client.lock().await.write_all(b).await.is_ok()
    }
    async fn to_backend(&self, b: &[u8]) -> bool {
        b.is_empty() || self.backend.lock().await.write_all(b).await.is_ok()
    }
}

struct Conn {
    fwd: Arc<Forwarder>,
    shared: Mutex<Shared>,
    w: Writers,
    limit: usize,
}

impl Conn {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish_if_done(s: &mut Shared, id: u32) {
        if s.streams
            .get(&id)
            .is_some_and(|st| st.client_done && st.backend_done)
        {
            s.streams.remove(&id);
        }
    }
}

/// Relays one connection until either side closes (or shutdown drains it).
pub(crate) async fn relay(
    client: UnixStream,
    backend: UnixStream,
    pending: BytesMut,
    dec: Decoder,
    ack_dropped: bool,
    fwd: Arc<Forwarder>,
) {
    let (cr, cw) = client.into_split();
    let (br, bw) = backend.into_split();
    let limit = fwd.max_message();
    let mut shutdown = fwd.shutdown_signal();
    let conn = Arc::new(Conn {
        fwd,
        shared: Mutex::default(),
        w: Writers {
            client: cw.into(),
            backend: bw.into(),
        },
        limit,
    });
    let up = upstream(conn.clone(), cr, pending, dec, ack_dropped);
    let down = downstream(conn.clone(), br);
    tokio::pin!(up, down);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = &mut up => break,
            _ = &mut down => break,
            _ = crate::server::stopped(&mut shutdown), if !draining => {
                draining = true;
                drain(&conn).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(20)), if draining => {
                if conn.lock().streams.is_empty() {
                    break;
                }
            }
        }
    }
    // dropping the halves closes both connections
}

/// SIGTERM: tell the client to open no new streams, end event streams, let the rest finish.
async fn drain(conn: &Conn) {
    let mut to_client = BytesMut::new();
    let mut to_backend = BytesMut::new();
    goaway(&mut to_client, 0x7fff_ffff, 0);
    {
        let mut s = conn.lock();
        for (id, st) in s
            .streams
            .iter_mut()
            .filter(|(_, st)| st.events && !st.taken)
        {
            st.taken = true;
            st.client_done = true;
            st.backend_done = true;
            let status = Status::unavailable("qoslet is shutting down");
            if st.resp_started {
                trailers(&mut to_client, *id, &status)
            } else {
                trailers_only(&mut to_client, *id, &status)
            }
            rst_stream(&mut to_backend, *id, CANCEL);
        }
        s.streams.retain(|_, st| !(st.events && st.taken));
    }
    conn.w.to_client(&to_client).await;
    conn.w.to_backend(&to_backend).await;
}

/// Client -> runtime.
async fn upstream(
    conn: Arc<Conn>,
    mut cr: tokio::net::unix::OwnedReadHalf,
    mut buf: BytesMut,
    mut dec: Decoder,
    mut ack_dropped: bool,
) {
    let stats = conn.fwd.stats().clone();
    // the preface goes first, as it came
    if buf.len() >= PREFACE.len() {
        let p = buf.split_to(PREFACE.len());
        if !conn.w.to_backend(&p).await {
            return;
        }
    }
    let mut block: Option<(u32, u8, BytesMut, BytesMut)> = None; // stream, first flags, fragment, raw
    let mut reencode = false;
    // buffers reused across reads: frames out, a block re-encoded as literals, the
    // block's content-length
    let (mut to_backend, mut to_client) = (BytesMut::new(), BytesMut::new());
    let (mut lit, mut cl) = (BytesMut::new(), Vec::new());
    loop {
        let mut spawn: Vec<(u32, HookPoint, Bytes, Bytes, u32)> = vec![];
        while let Some(f) = take_frame(&mut buf) {
            match f.ty {
                SETTINGS if f.flags & ACK != 0 && !ack_dropped => ack_dropped = true, // ours
                HEADERS | CONTINUATION => {
                    let assembled;
                    // a block in one frame (the usual case) is decoded where it lies
                    let (sid, flags, frag, raw): (u32, u8, &[u8], &[u8]) =
                        if block.is_none() && f.ty == HEADERS && f.flags & END_HEADERS != 0 {
                            let frag = headers_fragment(f.flags, f.payload()).unwrap_or_default();
                            (f.stream, f.flags, frag, &f.raw)
                        } else {
                            match (&mut block, f.ty) {
                                (None, HEADERS) => {
                                    let frag =
                                        headers_fragment(f.flags, f.payload()).unwrap_or_default();
                                    block = Some((
                                        f.stream,
                                        f.flags,
                                        BytesMut::from(frag),
                                        BytesMut::from(&f.raw[..]),
                                    ));
                                }
                                (Some((sid, _, frag, raw)), CONTINUATION) if *sid == f.stream => {
                                    frag.extend_from_slice(f.payload());
                                    raw.extend_from_slice(&f.raw);
                                }
                                _ => {
                                    // not a valid sequence: pass it on for the runtime to judge
                                    if let Some((_, _, _, raw)) = block.take() {
                                        to_backend.extend_from_slice(&raw);
                                    }
                                    to_backend.extend_from_slice(&f.raw);
                                    continue;
                                }
                            }
                            if f.flags & END_HEADERS == 0 {
                                continue;
                            }
                            assembled = block.take().expect("block");
                            (assembled.0, assembled.1, &assembled.2, &assembled.3)
                        };
                    // decoded once: the route and content-length noted, and the block re-encoded
                    // as literals on the side when it may have to change (re-encoding already on,
                    // or an intercepted call: pseudo-headers come first, so :path is known before
                    // any regular header)
                    lit.clear();
                    let (mut routed, mut has_cl, mut want_lit) = (None, false, true);
                    let decoded = dec.decode_each(frag, |n, v| {
                        // the first :path decides (a second one is the runtime's to refuse)
                        if n == b":path" && routed.is_none() {
                            let r = route(&String::from_utf8_lossy(v));
                            want_lit = reencode || matches!(r, Route::Intercept(_));
                            routed = Some(r);
                        }
                        if n == b"content-length" {
                            has_cl = true;
                            cl.clear();
                            cl.extend_from_slice(v);
                        } else if want_lit {
                            put_literal(&mut lit, n, v);
                        }
                    });
                    if decoded.is_err() {
                        // not decodable: the runtime judges it (and the connection)
                        to_backend.extend_from_slice(raw);
                        continue;
                    }
                    let end = flags & END_STREAM != 0;
                    let mut intercepted = false;
                    let mut s = conn.lock();
                    if sid > s.max_stream {
                        s.max_stream = sid;
                        stats.calls_total.fetch_add(1, Ordering::Relaxed);
                        let mut st = Stream {
                            client_done: end,
                            ..Default::default()
                        };
                        match routed.unwrap_or(Route::Passthrough) {
                            Route::Intercept(p) if !end => {
                                intercepted = true;
                                stats.calls_intercepted.fetch_add(1, Ordering::Relaxed);
                                st.point = Some(p);
                                st.req = Some((BytesMut::new(), BytesMut::new(), 0));
                            }
                            Route::Events => {
                                stats.calls_passthrough.fetch_add(1, Ordering::Relaxed);
                                st.events = true;
                                static SAID: std::sync::atomic::AtomicBool =
                                    std::sync::atomic::AtomicBool::new(false);
                                if !SAID.swap(true, Ordering::Relaxed) {
                                    tracing::warn!("relay: true relays kubelet's container event stream unread: container exits reach the store at the next resync (the default terminating path reads them)");
                                }
                            }
                            _ => {
                                stats.calls_passthrough.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        s.streams.insert(sid, st);
                    } else if let Some(st) = s.streams.get_mut(&sid) {
                        st.client_done |= end;
                    }
                    drop(s);
                    // forwarded as they came, until a block must change (an intercepted call
                    // whose body may grow must lose its content-length; kubelet never sends one):
                    // from then on every block is re-encoded as literals, so the runtime's HPACK
                    // table no longer depends on the client's
                    if intercepted && has_cl {
                        reencode = true;
                    }
                    if reencode {
                        if has_cl && !intercepted {
                            put_literal(&mut lit, b"content-length", &cl);
                        }
                        write_header_frames(&mut to_backend, sid, end, &lit);
                    } else {
                        to_backend.extend_from_slice(raw);
                    }
                }
                DATA => {
                    let end = f.flags & END_STREAM != 0;
                    let mut s = conn.lock();
                    let Some(st) = s.streams.get_mut(&f.stream) else {
                        to_backend.extend_from_slice(&f.raw);
                        continue;
                    };
                    st.client_done |= end;
                    if st.taken {
                        window_update(&mut to_client, 0, f.payload().len() as u32); // credit what we drop
                        let id = f.stream;
                        Conn::finish_if_done(&mut s, id);
                        continue;
                    }
                    let data = data_payload(f.flags, f.payload()).unwrap_or_default();
                    if let Some((payload, raw, flow)) = st.req.as_mut() {
                        payload.extend_from_slice(data);
                        raw.extend_from_slice(&f.raw);
                        *flow += f.payload().len() as u32;
                        if payload.len() > HOLD_CAP || (end && st.backend_done) {
                            // far larger than any CRI request (or already answered by the
                            // runtime): pass it through uninspected
                            warn!(
                                stream = f.stream,
                                bytes = payload.len(),
                                "intercepted request not held; forwarded without hooks"
                            );
                            stats.undecodable_messages.fetch_add(1, Ordering::Relaxed);
                            let (payload, raw, flow) = st.req.take().expect("held");
                            st.point = None;
                            if let Some(len) = st.req_scan.scan(&payload, conn.limit) {
                                stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
                                st.taken = true;
                                st.client_done = true;
                                st.backend_done = true;
                                rst_stream(&mut to_backend, f.stream, CANCEL);
                                trailers_only(
                                    &mut to_client,
                                    f.stream,
                                    &too_large(len, conn.limit),
                                );
                                rst_stream(&mut to_client, f.stream, CANCEL);
                                window_update(&mut to_client, 0, flow);
                                continue;
                            }
                            to_backend.extend_from_slice(&raw);
                            let id = f.stream;
                            Conn::finish_if_done(&mut s, id);
                        } else if end {
                            let (payload, raw, flow) = st.req.take().expect("held");
                            st.resp = Some(Held::default());
                            spawn.push((
                                f.stream,
                                st.point.expect("intercepted"),
                                payload.freeze(),
                                raw.freeze(),
                                flow,
                            ));
                        }
                        continue;
                    }
                    if let Some(len) = st.req_scan.scan(data, conn.limit) {
                        stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
                        st.taken = true;
                        st.client_done = true;
                        st.backend_done = true;
                        rst_stream(&mut to_backend, f.stream, CANCEL);
                        trailers_only(&mut to_client, f.stream, &too_large(len, conn.limit));
                        rst_stream(&mut to_client, f.stream, CANCEL);
                        window_update(&mut to_client, 0, f.payload().len() as u32);
                        continue;
                    }
                    to_backend.extend_from_slice(&f.raw);
                    let id = f.stream;
                    Conn::finish_if_done(&mut s, id);
                }
                RST_STREAM => {
                    let mut s = conn.lock();
                    let taken = s.streams.remove(&f.stream).is_some_and(|st| st.taken);
                    drop(s);
                    if !taken {
                        to_backend.extend_from_slice(&f.raw);
                    }
                }
                _ => to_backend.extend_from_slice(&f.raw),
            }
        }
        if !conn.w.to_backend(&to_backend).await || !conn.w.to_client(&to_client).await {
            return;
        }
        to_backend.clear();
        to_client.clear();
        for (id, point, payload, raw, flow) in spawn {
            let conn = conn.clone();
            tokio::spawn(
                async move { intercept_request(conn, id, point, payload, raw, flow).await },
            );
        }
        // read straight into the frame buffer (its space is reclaimed once the frames
        // split off it are gone)
        buf.reserve(READ_CHUNK);
        match cr.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Runs the "before" stage of an intercepted call and forwards (or refuses) it.
async fn intercept_request(
    conn: Arc<Conn>,
    id: u32,
    point: HookPoint,
    payload: Bytes,
    raw: Bytes,
    flow: u32,
) {
    let mut to_backend = BytesMut::new();
    let mut to_client = BytesMut::new();
    match conn.fwd.prepare(point, payload.clone()).await {
        Prepared::Forward {
            original,
            request,
            body,
        } => {
            if body == payload {
                to_backend.extend_from_slice(&raw); // unchanged: byte for byte
            } else {
                write_data_frames(&mut to_backend, id, true, &body);
                let added = body.len() as u64;
                let mut s = conn.lock();
                // the runtime will credit every byte we send; the client only sent `flow`
                s.debt += added.saturating_sub(flow as u64);
                if (flow as u64) > added {
                    window_update(&mut to_client, 0, (flow as u64 - added) as u32);
                }
            }
            if let Some(st) = conn.lock().streams.get_mut(&id) {
                st.prepared = Some((original, request));
            }
        }
        Prepared::Opaque(_) => {
            to_backend.extend_from_slice(&raw);
            if let Some(st) = conn.lock().streams.get_mut(&id) {
                st.resp = None; // nothing to record
            }
        }
        Prepared::Refuse(status) => {
            if let Some(st) = conn.lock().streams.get_mut(&id) {
                st.taken = true;
                st.backend_done = true;
                st.client_done = true;
            }
            conn.lock().streams.remove(&id);
            rst_stream(&mut to_backend, id, CANCEL);
            trailers_only(&mut to_client, id, &status);
            window_update(&mut to_client, 0, flow); // the runtime never sees these bytes
        }
    }
    conn.w.to_backend(&to_backend).await;
    conn.w.to_client(&to_client).await;
}

/// Runtime -> client.
async fn downstream(conn: Arc<Conn>, mut br: tokio::net::unix::OwnedReadHalf) {
    let stats = conn.fwd.stats().clone();
    let mut dec = decoder();
    let mut buf = BytesMut::new();
    let mut block: Option<(u32, u8, BytesMut)> = None;
    // buffers reused across reads
    let (mut to_client, mut to_backend, mut lit) =
        (BytesMut::new(), BytesMut::new(), BytesMut::new());
    loop {
        buf.reserve(READ_CHUNK);
        match br.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut complete: Vec<(u32, Held)> = vec![];
        while let Some(f) = take_frame(&mut buf) {
            match f.ty {
                HEADERS | CONTINUATION => {
                    let assembled;
                    // a block in one frame (the usual case) is decoded where it lies
                    let (sid, flags, frag): (u32, u8, &[u8]) =
                        if block.is_none() && f.ty == HEADERS && f.flags & END_HEADERS != 0 {
                            let frag = headers_fragment(f.flags, f.payload()).unwrap_or_default();
                            (f.stream, f.flags, frag)
                        } else {
                            match (&mut block, f.ty) {
                                (None, HEADERS) => {
                                    let frag =
                                        headers_fragment(f.flags, f.payload()).unwrap_or_default();
                                    block = Some((f.stream, f.flags, BytesMut::from(frag)));
                                }
                                (Some((sid, _, frag)), CONTINUATION) if *sid == f.stream => {
                                    frag.extend_from_slice(f.payload())
                                }
                                _ => return, // a broken runtime connection: close
                            }
                            if f.flags & END_HEADERS == 0 {
                                continue;
                            }
                            assembled = block.take().expect("block");
                            (assembled.0, assembled.1, &assembled.2)
                        };
                    let end = flags & END_STREAM != 0;
                    let mut s = conn.lock();
                    // every block is decoded (the table must follow the runtime's encoder);
                    // what qoslet forwards is the block re-encoded as literals
                    match s.streams.get_mut(&sid) {
                        Some(st) if st.taken => {
                            if dec.decode_each(frag, |_, _| {}).is_err() {
                                return;
                            }
                        }
                        Some(st) if st.resp.is_some() => {
                            let Ok(headers) = dec.decode(frag) else {
                                return;
                            };
                            st.resp.as_mut().expect("held").blocks.push((headers, end));
                            if end {
                                st.backend_done = true;
                                complete.push((sid, st.resp.take().expect("held")));
                            }
                        }
                        other => {
                            lit.clear();
                            if dec
                                .decode_each(frag, |n, v| put_literal(&mut lit, n, v))
                                .is_err()
                            {
                                return;
                            }
                            if let Some(st) = other {
                                st.resp_started = true;
                                st.backend_done |= end;
                            }
                            write_header_frames(&mut to_client, sid, end, &lit);
                            Conn::finish_if_done(&mut s, sid);
                        }
                    }
                }
                DATA => {
                    let end = f.flags & END_STREAM != 0;
                    let mut s = conn.lock();
                    let Some(st) = s.streams.get_mut(&f.stream) else {
                        to_client.extend_from_slice(&f.raw);
                        continue;
                    };
                    if st.taken {
                        window_update(&mut to_backend, 0, f.payload().len() as u32);
                        continue;
                    }
                    let data = data_payload(f.flags, f.payload()).unwrap_or_default();
                    if let Some(h) = st.resp.as_mut() {
                        h.data.extend_from_slice(data);
                        h.data_frames.extend_from_slice(&f.raw);
                        h.flow += f.payload().len() as u32;
                        if h.data.len() > HOLD_CAP {
                            // too large to hold: release what we have and stop inspecting
                            let h = st.resp.take().expect("held");
                            st.resp_started = true;
                            let _ = st.resp_scan.scan(&h.data, usize::MAX); // keep following the framing
                            for (hs, e) in &h.blocks {
                                let b = literal_block(
                                    hs.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
                                );
                                write_header_frames(&mut to_client, f.stream, *e, &b);
                            }
                            to_client.extend_from_slice(&h.data_frames);
                        } else if end {
                            st.backend_done = true;
                            complete.push((f.stream, st.resp.take().expect("held")));
                        }
                        continue;
                    }
                    if let Some(len) = st.resp_scan.scan(data, conn.limit) {
                        stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
                        let started = st.resp_started;
                        st.taken = true;
                        st.backend_done = true;
                        st.client_done = true;
                        rst_stream(&mut to_backend, f.stream, CANCEL);
                        window_update(&mut to_backend, 0, f.payload().len() as u32);
                        let status = too_large(len, conn.limit);
                        if started {
                            trailers(&mut to_client, f.stream, &status)
                        } else {
                            trailers_only(&mut to_client, f.stream, &status)
                        }
                        continue;
                    }
                    st.backend_done |= end;
                    to_client.extend_from_slice(&f.raw);
                    let id = f.stream;
                    Conn::finish_if_done(&mut s, id);
                }
                WINDOW_UPDATE if f.stream == 0 && f.payload().len() == 4 => {
                    let inc = u32::from_be_bytes([
                        f.payload()[0],
                        f.payload()[1],
                        f.payload()[2],
                        f.payload()[3],
                    ]) & 0x7fff_ffff;
                    let mut s = conn.lock();
                    let pay = (s.debt.min(inc as u64)) as u32;
                    s.debt -= pay as u64;
                    drop(s);
                    if pay == 0 {
                        to_client.extend_from_slice(&f.raw);
                    } else {
                        window_update(&mut to_client, 0, inc - pay);
                    }
                }
                RST_STREAM => {
                    let mut s = conn.lock();
                    let taken = s.streams.remove(&f.stream).is_some_and(|st| st.taken);
                    drop(s);
                    if !taken {
                        to_client.extend_from_slice(&f.raw);
                    }
                }
                _ => to_client.extend_from_slice(&f.raw),
            }
        }
        if !conn.w.to_client(&to_client).await || !conn.w.to_backend(&to_backend).await {
            return;
        }
        to_client.clear();
        to_backend.clear();
        for (id, held) in complete {
            let conn = conn.clone();
            tokio::spawn(async move { complete_response(conn, id, held).await });
        }
    }
}

/// Records an intercepted call's answer, runs the "after" hooks, and releases
/// the answer (or the fail-closed hook's status) to the client.
async fn complete_response(conn: Arc<Conn>, id: u32, held: Held) {
    let prepared = conn
        .lock()
        .streams
        .get_mut(&id)
        .and_then(|st| st.prepared.take());
    let code = held
        .blocks
        .iter()
        .rev()
        .find_map(|(h, _)| {
            h.iter()
                .find(|(n, _)| n == b"grpc-status")
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<i32>().ok())
        })
        .map(Code::from_i32);
    let mut to_client = BytesMut::new();
    let mut to_backend = BytesMut::new();
    let verdict = match prepared {
        Some((original, request)) => {
            conn.fwd
                .complete(original.point(), &original, request, code, &held.data)
                .await
        }
        None => Ok(()),
    };
    match verdict {
        Ok(()) => {
            let n = held.blocks.len();
            for (i, (hs, end)) in held.blocks.iter().enumerate() {
                let b = literal_block(hs.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
                if i == 0 {
                    write_header_frames(
                        &mut to_client,
                        id,
                        *end && n == 1 && held.data_frames.is_empty(),
                        &b,
                    );
                    to_client.extend_from_slice(&held.data_frames);
                } else {
                    write_header_frames(&mut to_client, id, *end, &b);
                }
            }
        }
        Err(status) => {
            trailers_only(&mut to_client, id, &status);
            window_update(&mut to_backend, 0, held.flow); // the client never sees these bytes
        }
    }
    {
        let mut s = conn.lock();
        if let Some(st) = s.streams.get_mut(&id) {
            st.backend_done = true;
        }
        Conn::finish_if_done(&mut s, id);
    }
    conn.w.to_client(&to_client).await;
    conn.w.to_backend(&to_backend).await;
}

/// A connection whose first bytes were already read: they are replayed first.
pub(crate) struct Replay {
    prefix: Bytes,
    io: UnixStream,
}

impl Replay {
    pub(crate) fn new(prefix: Bytes, io: UnixStream) -> Self {
        Self { prefix, io }
    }
}

impl AsyncRead for Replay {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let p = self.prefix.split_to(n);
            buf.put_slice(&p);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(headers: &[(&[u8], &[u8])]) -> Vec<u8> {
        fluke_hpack::Encoder::new().encode(headers.iter().copied())
    }

    fn start_bytes(ack_first: bool, path: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::from(PREFACE);
        write_frame(&mut out, SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
        if ack_first {
            write_frame(&mut out, SETTINGS, ACK, 0, &[]);
        }
        let b = block(&[
            (b":method", b"POST"),
            (b":path", path),
            (b":authority", b"/run/x.sock"),
        ]);
        write_frame(&mut out, HEADERS, 0, 1, &b[..3]);
        write_frame(&mut out, CONTINUATION, END_HEADERS, 1, &b[3..]);
        out.to_vec()
    }

    #[test]
    fn the_start_scan_finds_the_first_path_and_our_ack() {
        let bytes = start_bytes(true, b"/runtime.v1.RuntimeService/Version");
        for cut in 0..bytes.len() {
            assert!(
                matches!(scan_start(&bytes[..cut]), Scan::Need),
                "cut at {cut}"
            );
        }
        let Scan::Ready { path, ack_at } = scan_start(&bytes) else {
            panic!("not ready")
        };
        assert_eq!(path, "/runtime.v1.RuntimeService/Version");
        assert_eq!(ack_at, Some(PREFACE.len() + FRAME_HEADER + 6));
        let Scan::Ready { path, ack_at } = scan_start(&start_bytes(
            false,
            b"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        )) else {
            panic!("not ready")
        };
        assert_eq!(route(&path), Route::Reflection);
        assert_eq!(ack_at, None);
        assert!(matches!(scan_start(b"GET / HTTP/1.1\r\n"), Scan::Odd));
        let mut bad = BytesMut::from(PREFACE);
        write_frame(&mut bad, HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff]);
        assert!(matches!(scan_start(&bad), Scan::Odd), "undecodable block");
    }

    #[test]
    fn message_sizes_are_followed_across_data_frames() {
        let mut m = MsgScan::default();
        let mut msg = vec![0u8, 0, 0, 0, 10];
        msg.extend([1u8; 10]);
        msg.extend([0u8, 0, 0, 0, 20]); // a second, larger message
        assert_eq!(m.scan(&msg[..3], 10), None);
        assert_eq!(m.scan(&msg[3..12], 10), None);
        assert_eq!(m.scan(&msg[12..], 10), Some(20));
    }

    #[test]
    fn decoders_mirror_indexed_blocks() {
        // the second block refers to entries the first one inserted
        let mut enc = fluke_hpack::Encoder::new();
        let h: [(&[u8], &[u8]); 2] = [
            (b":path", b"/runtime.v1.RuntimeService/Version"),
            (b"x-custom", b"value"),
        ];
        let b1 = enc.encode(h.iter().copied());
        let b2 = enc.encode(h.iter().copied());
        assert!(b2.len() < b1.len(), "indexed the second time");
        let mut dec = decoder();
        let d1 = dec.decode(&b1).unwrap();
        let d2 = dec.decode(&b2).unwrap();
        assert_eq!(d1, d2);
        assert_eq!(d2[1], (b"x-custom".to_vec(), b"value".to_vec()));
    }
}
