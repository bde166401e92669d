//! The CRI proxy service: one HTTP/2 request in, one to the backend out.
//!
//! * Calls qoslet does not intercept (and methods it does not know) are
//!   forwarded as bytes: headers, body and trailers untouched, nothing decoded.
//! * The intercepted calls ([`HookPoint`]) are decoded once, run through the
//!   [`Pipeline`], and forwarded as the original bytes plus the hooks' encoded
//!   patches; the response is recorded in the [`Store`] and returned unchanged.
//! * `GetContainerEvents` streams through, ended cleanly at shutdown.
//! * Server reflection for CRI is answered locally.
//!
//! Message size is limited each way without decoding ([`FrameLimit`]).

use crate::QosletError;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, Uri};
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Limited, StreamBody};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::{Code, Status};
use tracing::{debug, warn};

use crate::backend::{Backend, H2Body, Outgoing, RequestEnd};
use crate::cri::{route, CriRequest, CriResponse, HookPoint, Route};
use crate::grpc::{
    encode_frame, grpc_timeout, parse_header, split_unary, status_of, status_response, too_large,
    FrameLimit, Unary, FRAME_HEADER,
};
use crate::pipeline::{HookContext, Pipeline, Stage};
use qoslet_state::store::{ContainerState, Store};

/// Call counters of the proxy socket.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub calls_total: AtomicU64,
    pub calls_passthrough: AtomicU64,
    pub calls_intercepted: AtomicU64,
    pub backend_unavailable: AtomicU64,
    /// Calls whose stream the runtime reset (its connection alive): the reset
    /// is passed to the client as it came.
    pub backend_resets: AtomicU64,
    pub calls_in_flight: AtomicU64,
    pub calls_refused: AtomicU64,
    pub oversized_messages: AtomicU64,
    pub undecodable_messages: AtomicU64,
    pub connections_terminated: AtomicU64,
}

/// Set on a response that is not one: the call's stream is to be reset with
/// this reason (the runtime reset its own stream, and a client direct to the
/// runtime would have seen that reset, read by gRPC as a status of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetStream(pub h2::Reason);

/// Why a call got no answer from the runtime.
enum NoAnswer {
    /// qoslet answers with this status (runtime unreachable, bad URI).
    Status(Status),
    /// The runtime reset the stream: so does qoslet.
    Reset(h2::Reason),
}

impl NoAnswer {
    fn into_response(self) -> Response<Body> {
        match self {
            NoAnswer::Status(s) => status_response(s),
            NoAnswer::Reset(r) => reset_response(r),
        }
    }
}

/// A response that tells the connection to reset the call's stream.
pub fn reset_response(reason: h2::Reason) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    r.extensions_mut().insert(ResetStream(reason));
    r
}

/// A unary request as read: its body (one whole message, or all of it), how
/// it goes on, and what it holds of the buffer budget until it is answered.
type UnaryRequest = (Bytes, BodyEnd, Option<tokio::sync::OwnedSemaphorePermit>);

/// How a unary request's body goes on after what was read of it.
enum BodyEnd {
    /// It ended (the way the client ended it).
    Ended(RequestEnd),
    /// One whole message is in and the client has not ended its stream yet:
    /// the rest is streamed to the runtime as it comes.
    Open(H2Body),
}

type LocalService = tower::util::BoxCloneSyncService<Request<H2Body>, Response<Body>, Infallible>;

/// The proxy's request handler. Shared by all connections.
pub struct Forwarder {
    backend: Backend,
    pipeline: Pipeline,
    store: Store,
    stats: Arc<ProxyStats>,
    reflection_v1: LocalService,
    reflection_v1alpha: LocalService,
    max_message: usize,
    shutdown: watch::Receiver<bool>,
    /// Bytes of unary request bodies held at once, in KiB, across every
    /// connection: a body is charged its announced size before it is buffered,
    /// so clients cannot make qoslet hold 16 MiB × streams × connections.
    budget: Arc<tokio::sync::Semaphore>,
}

/// [`Forwarder`]'s budget for buffered request bodies (256 MiB).
pub const BUFFER_BUDGET_KIB: u32 = 256 * 1024;

struct InFlight<'a>(&'a AtomicU64);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Forwarder {
    pub fn new(
        backend: Backend,
        pipeline: Pipeline,
        store: Store,
        stats: Arc<ProxyStats>,
        max_message: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(qoslet_proto::CRI_DESCRIPTOR_SET)
            .build_v1()
            .expect("CRI descriptor set is valid");
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(qoslet_proto::CRI_DESCRIPTOR_SET)
            .build_v1alpha()
            .expect("CRI descriptor set is valid");
        Self {
            backend,
            pipeline,
            store,
            stats,
            reflection_v1: LocalService::new(reflection_v1),
            reflection_v1alpha: LocalService::new(reflection_v1alpha),
            max_message,
            shutdown,
            budget: Arc::new(tokio::sync::Semaphore::new(BUFFER_BUDGET_KIB as usize)),
        }
    }

    /// A backend with a connection of its own (for one client connection).
    pub fn own_backend(&self, client: Arc<qoslet_wire::authority::ClientSettings>) -> Backend {
        self.backend.own_connection(Some(client))
    }

    pub fn stats(&self) -> &Arc<ProxyStats> {
        &self.stats
    }

    /// Handles one request. Never fails: errors are gRPC statuses.
    pub async fn handle(&self, req: Request<H2Body>) -> Response<Body> {
        self.handle_on(req, &self.backend).await
    }

    /// [`Forwarder::handle`] on the given backend connection (one per client
    /// connection: a client that stops reading holds back only its own calls,
    /// as it would direct to containerd, never another client's through a
    /// shared connection window).
    pub async fn handle_on(&self, req: Request<H2Body>, backend: &Backend) -> Response<Body> {
        self.stats.calls_total.fetch_add(1, Ordering::Relaxed);
        self.stats.calls_in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&self.stats.calls_in_flight);
        match route(req.uri().path()) {
            Route::Reflection => {
                let svc = if req.uri().path().starts_with("/grpc.reflection.v1alpha.") {
                    self.reflection_v1alpha.clone()
                } else {
                    self.reflection_v1.clone()
                };
                match tower::ServiceExt::oneshot(svc, req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            }
            Route::Intercept(point) => {
                self.stats.calls_intercepted.fetch_add(1, Ordering::Relaxed);
                Box::pin(self.intercept(point, req, backend)).await
            }
            Route::Events => {
                self.stats.calls_passthrough.fetch_add(1, Ordering::Relaxed);
                let resp = self.passthrough(req, backend).await;
                let shutdown = self.shutdown.clone();
                let (store, cap) = (self.store.clone(), self.max_message);
                resp.map(|b| {
                    Body::new(EndOnShutdown {
                        inner: crate::events::Tap::new(b, store, cap),
                        shutdown: Box::pin(async move { wait_true(shutdown).await }),
                        done: false,
                    })
                })
            }
            Route::Passthrough => {
                self.stats.calls_passthrough.fetch_add(1, Ordering::Relaxed);
                self.passthrough(req, backend).await
            }
        }
    }

    /// Forwards a request as bytes, never decoding it. CRI requests are unary,
    /// so their (small) body is read whole first: the size limit is checked on the
    /// frame header before anything is sent, and the backend gets headers and
    /// message in one write. Other services' bodies stream through, limited as
    /// they go.
    async fn passthrough(&self, req: Request<H2Body>, backend: &Backend) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let limit = self.max_message;
        let deadline = grpc_timeout(&parts.headers).map(|d| tokio::time::Instant::now() + d);
        // a unary body is charged against the budget until the runtime answered
        let (body, _charged) = if parts.uri.path().starts_with("/runtime.v1.") {
            match self.read_unary(body, deadline).await {
                Ok((bytes, end, charged)) => (self.outgoing(bytes, end), charged),
                Err(resp) => return resp,
            }
        } else {
            let stats = self.stats.clone();
            let b = Body::new(FrameLimit::request(body, limit).on_violation(move || {
                stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
            }));
            (Outgoing::Stream(b), None)
        };
        match self.send(parts, body, backend).await {
            Ok(resp) => {
                let stats = self.stats.clone();
                resp.map(|b| {
                    Body::new(FrameLimit::response(b, limit).on_violation(move || {
                        stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
                    }))
                })
            }
            Err(no) => no.into_response(),
        }
    }

    /// Reads a unary request body until its end, or until it holds one whole
    /// message and nothing more is there yet (the rest is then streamed to the
    /// runtime as it comes: grpc-go answers a unary call once its message is
    /// in, whether or not the client has ended its stream). Until that message
    /// is in, the client's deadline (`grpc-timeout`) bounds the wait, as it
    /// bounds grpc-go's. Keeps how the client ended the body, to forward it the
    /// same way. Refuses (RESOURCE_EXHAUSTED) as soon as the frame header
    /// announces more than the limit, or the body outgrows it.
    async fn read_unary(
        &self,
        mut body: H2Body,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<UnaryRequest, Response<Body>> {
        let limit = self.max_message;
        // before anything is read: true only when the HEADERS carried END_STREAM
        let mut end = if body.is_end_stream() {
            RequestEnd::Headers
        } else {
            RequestEnd::Data
        };
        let mut buf = BytesMut::new();
        let mut first: Option<Bytes> = None;
        let mut charged: Option<tokio::sync::OwnedSemaphorePermit> = None;
        // a whole message is in: from now on nothing is waited for
        let mut whole = false;
        let late = || status_response(QosletError::DeadlineExceeded.into());
        loop {
            let next = if whole {
                match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)))
                    .await
                {
                    Poll::Ready(next) => next,
                    Poll::Pending => {
                        let bytes = first.unwrap_or_else(|| buf.freeze());
                        return Ok((bytes, BodyEnd::Open(body), charged));
                    }
                }
            } else {
                match deadline {
                    Some(at) => match tokio::time::timeout_at(at, body.frame()).await {
                        Ok(next) => next,
                        Err(_) => return Err(late()),
                    },
                    None => body.frame().await,
                }
            };
            match next {
                Some(Ok(f)) => {
                    let d = match f.into_data() {
                        Ok(d) => d,
                        Err(f) => {
                            if let Ok(t) = f.into_trailers() {
                                end = RequestEnd::Trailers(t);
                            }
                            continue;
                        }
                    };
                    if first.is_none() && buf.is_empty() {
                        first = Some(d); // the common case: one chunk, no copy
                    } else {
                        if let Some(f) = first.take() {
                            buf.extend_from_slice(&f);
                        }
                        buf.extend_from_slice(&d);
                    }
                }
                Some(Err(e)) => {
                    return Err(status_response(
                        QosletError::ReadingRequest(e.to_string()).into(),
                    ))
                }
                None => break,
            }
            let seen = first.as_deref().unwrap_or(&buf);
            whole = parse_header(seen).is_some_and(|h| seen.len() == FRAME_HEADER + h.len);
            let oversized = parse_header(seen).map(|h| h.len > limit).unwrap_or(false)
                || seen.len() > limit + FRAME_HEADER;
            if let (None, Some(h), false) = (&charged, parse_header(seen), oversized) {
                // charged what the message announces before more of it is read
                let kib = (h.len + FRAME_HEADER)
                    .div_ceil(1024)
                    .clamp(1, BUFFER_BUDGET_KIB as usize);
                let room = self.budget.clone().acquire_many_owned(kib as u32);
                charged = match deadline {
                    Some(at) => match tokio::time::timeout_at(at, room).await {
                        Ok(p) => p.ok(),
                        Err(_) => return Err(late()),
                    },
                    None => room.await.ok(),
                };
            }
            if oversized {
                self.stats
                    .oversized_messages
                    .fetch_add(1, Ordering::Relaxed);
                let len = parse_header(seen).map(|h| h.len).unwrap_or(seen.len());
                return Err(status_response(too_large(len, limit)));
            }
        }
        Ok((
            first.unwrap_or_else(|| buf.freeze()),
            BodyEnd::Ended(end),
            charged,
        ))
    }

    /// What goes to the runtime for a unary body read by [`Self::read_unary`]
    /// (`bytes`: as read, or as the hooks patched them).
    fn outgoing(&self, bytes: Bytes, end: BodyEnd) -> Outgoing {
        match end {
            BodyEnd::Ended(end) => Outgoing::Unary { bytes, end },
            BodyEnd::Open(rest) => {
                let stats = self.stats.clone();
                let rest = FrameLimit::request(rest, self.max_message).on_violation(move || {
                    stats.oversized_messages.fetch_add(1, Ordering::Relaxed);
                });
                Outgoing::Started {
                    bytes,
                    rest: Body::new(rest),
                }
            }
        }
    }

    /// Sends a request to the backend with the original method, path, headers
    /// and body; only the URI's scheme/authority are set for the client pool.
    async fn send(
        &self,
        mut parts: http::request::Parts,
        body: Outgoing,
        backend: &Backend,
    ) -> Result<Response<H2Body>, NoAnswer> {
        // h2 hands over an absolute URI when the client sent :scheme and
        // :authority (gRPC clients do): kept as it is, not parsed again
        if parts.uri.scheme().is_none() || parts.uri.authority().is_none() {
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(http::uri::Scheme::HTTP);
            uri.authority = Some(
                parts
                    .uri
                    .authority()
                    .cloned()
                    .unwrap_or_else(|| http::uri::Authority::from_static("localhost")),
            );
            uri.path_and_query = Some(
                parts
                    .uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            );
            parts.uri = Uri::from_parts(uri)
                .map_err(|e| NoAnswer::Status(QosletError::BadUri(e.to_string()).into()))?;
        }
        parts.version = http::Version::HTTP_2;
        backend.request(parts, body).await.map_err(|e| {
            if let Some(reason) = crate::h2io::reset_behind(&e) {
                self.stats.backend_resets.fetch_add(1, Ordering::Relaxed);
                debug!(?reason, "the runtime reset the stream; so does qoslet");
                return NoAnswer::Reset(reason);
            }
            self.stats
                .backend_unavailable
                .fetch_add(1, Ordering::Relaxed);
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            debug!(error = %msg, "backend unavailable");
            NoAnswer::Status(
                QosletError::RuntimeUnavailable {
                    endpoint: backend.endpoint().to_string(),
                    reason: msg,
                }
                .into(),
            )
        })
    }

    /// Decodes an intercepted request and runs the "before" hooks. Shared by
    /// the HTTP/2-terminating path and the frame relay.
    pub(crate) async fn prepare(&self, point: HookPoint, bytes: Bytes) -> Prepared {
        let original = match split_unary(&bytes) {
            Unary::Message(m) => point.decode_request(m).map_err(|e| e.to_string()),
            Unary::Opaque => Err("not a single uncompressed message".to_string()),
        };
        let original = match original {
            Ok(r) => r,
            Err(why) => {
                // not ours to judge: the runtime answers it as it would without qoslet
                self.stats
                    .undecodable_messages
                    .fetch_add(1, Ordering::Relaxed);
                warn!(method = %point, reason = %why, "cannot decode request; forwarding it unchanged without hooks");
                return Prepared::Opaque(bytes);
            }
        };
        if let Some(why) = crate::cri::unsurvivable(&original) {
            // the runtime would die of it, for every pod on the node
            self.stats.calls_refused.fetch_add(1, Ordering::Relaxed);
            warn!(method = %point, reason = why, "request refused: the runtime cannot survive it");
            return Prepared::Refuse(QosletError::BadRequest(format!("qoslet: {why}")).into());
        }
        if !self.pipeline.wants(point, Stage::Before) {
            return Prepared::Forward {
                request: original.clone(),
                original,
                body: bytes,
            };
        }
        let ctx = HookContext {
            store: self.store.clone(),
        };
        match self.pipeline.before(&ctx, original.clone()).await {
            Ok(b) if b.patches.is_empty() => Prepared::Forward {
                original,
                request: b.request,
                body: bytes,
            },
            Ok(b) => {
                let mut pieces: Vec<&[u8]> = vec![&bytes[FRAME_HEADER..]];
                pieces.extend(b.patches.iter().map(Vec::as_slice));
                Prepared::Forward {
                    original,
                    request: b.request,
                    body: encode_frame(&pieces),
                }
            }
            Err(crate::pipeline::Stopped::Refused { refusal, .. }) => {
                // the hook's answer (counted and logged by the pipeline), as it gave it
                Prepared::Refuse(Status::new(refusal.code, refusal.message))
            }
            Err(crate::pipeline::Stopped::Failed(f)) => {
                self.stats.calls_refused.fetch_add(1, Ordering::Relaxed);
                Prepared::Refuse(f.to_status())
            }
        }
    }

    /// After the runtime answered an intercepted call with `code` and `data`
    /// (its framed response message): records it and runs the "after" hooks.
    /// Errs only when a fail-closed hook failed.
    pub(crate) async fn complete(
        &self,
        point: HookPoint,
        original: &CriRequest,
        request: CriRequest,
        code: Option<Code>,
        data: &[u8],
    ) -> Result<(), Status> {
        if code != Some(Code::Ok) {
            return Ok(());
        }
        let Unary::Message(m) = split_unary(data) else {
            return Ok(());
        };
        let decoded = match point.decode_response(m) {
            Ok(d) => d,
            Err(e) => {
                warn!(method = %point, error = %e, "cannot decode runtime response; store not updated");
                return Ok(());
            }
        };
        record(&self.store, original, &decoded);
        if self.pipeline.wants(point, Stage::After) {
            let ctx = HookContext {
                store: self.store.clone(),
            };
            if let Err(f) = self
                .pipeline
                .after(&ctx, Arc::new(request), Arc::new(decoded))
                .await
            {
                self.stats.calls_refused.fetch_add(1, Ordering::Relaxed);
                return Err(f.to_status());
            }
        }
        Ok(())
    }

    /// An intercepted call: decode once, run hooks, forward, record, return the
    /// backend's answer unchanged.
    async fn intercept(
        &self,
        point: HookPoint,
        req: Request<H2Body>,
        backend: &Backend,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let limit = self.max_message;
        // charged against the budget until this call is answered
        let deadline = grpc_timeout(&parts.headers).map(|d| tokio::time::Instant::now() + d);
        let (bytes, end, _charged) = match self.read_unary(body, deadline).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let (original, request, body) = match self.prepare(point, bytes).await {
            Prepared::Forward {
                original,
                request,
                body,
            } => (original, request, body),
            Prepared::Refuse(status) => return status_response(status),
            Prepared::Opaque(bytes) => {
                return match self.send(parts, self.outgoing(bytes, end), backend).await {
                    Ok(resp) => resp.map(Body::new),
                    Err(no) => no.into_response(),
                };
            }
        };
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let resp = match self.send(parts, self.outgoing(body, end), backend).await {
            Ok(r) => r,
            Err(no) => return no.into_response(),
        };
        let (rparts, rbody) = resp.into_parts();
        let collected = match Limited::new(rbody, limit + FRAME_HEADER).collect().await {
            Ok(c) => c,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                self.stats
                    .oversized_messages
                    .fetch_add(1, Ordering::Relaxed);
                return status_response(too_large(limit + 1, limit));
            }
            Err(e) => {
                if let Some(reason) = crate::h2io::reset_behind(&*e) {
                    // reset after its headers: the client has seen nothing yet
                    self.stats.backend_resets.fetch_add(1, Ordering::Relaxed);
                    return reset_response(reason);
                }
                return status_response(QosletError::RuntimeBrokeOff(e.to_string()).into());
            }
        };
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        let code = status_of(&rparts.headers).or_else(|| trailers.as_ref().and_then(status_of));
        if let Err(status) = self.complete(point, &original, request, code, &data).await {
            return status_response(status);
        }
        // a trailers-only answer (the status in its headers, END_STREAM on them)
        // goes back as one: an empty body kubelet's client would read as a stream
        // closed without trailers (INTERNAL)
        if data.is_empty() && trailers.is_none() {
            return Response::from_parts(rparts, Body::empty());
        }
        Response::from_parts(
            rparts,
            Body::new(StreamBody::new(tokio_stream::iter(frames(data, trailers)))),
        )
    }
}

/// The outcome of preparing an intercepted request.
#[allow(clippy::large_enum_variant)] // one per intercepted call, moved once
pub(crate) enum Prepared {
    /// Forward `body` (the original bytes, plus patches if any).
    Forward {
        original: CriRequest,
        request: CriRequest,
        body: Bytes,
    },
    /// Not decodable: forward unchanged; nothing to record.
    Opaque(Bytes),
    /// A fail-closed hook refused the call.
    Refuse(Status),
}

fn frames(data: Bytes, trailers: Option<HeaderMap>) -> Vec<Result<Frame<Bytes>, Infallible>> {
    let mut v = Vec::with_capacity(2);
    if !data.is_empty() {
        v.push(Ok(Frame::data(data)));
    }
    if let Some(t) = trailers {
        v.push(Ok(Frame::trailers(t)));
    }
    v
}

/// Records a successful intercepted call in the store.
pub fn record(store: &Store, req: &CriRequest, resp: &CriResponse) {
    match (req, resp) {
        (CriRequest::RunPodSandbox(r), CriResponse::RunPodSandbox(o)) => {
            if let Some(c) = &r.config {
                store.upsert_pod(crate::records::pod(
                    &o.pod_sandbox_id,
                    c,
                    &r.runtime_handler,
                ));
            }
        }
        (CriRequest::CreateContainer(r), CriResponse::CreateContainer(o)) => {
            if let Some(c) = &r.config {
                store.upsert_container(crate::records::container(
                    &o.container_id,
                    &r.pod_sandbox_id,
                    c,
                ));
            }
        }
        (CriRequest::StartContainer(r), _) => {
            store.set_container_state(&r.container_id, ContainerState::Running)
        }
        (CriRequest::UpdateContainerResources(r), _) => {
            if let Some(l) = &r.linux {
                store.set_container_resources(&r.container_id, crate::records::resources(l));
            }
        }
        (CriRequest::StopContainer(r), _) => {
            store.set_container_state(&r.container_id, ContainerState::Exited)
        }
        (CriRequest::RemoveContainer(r), _) => {
            store.remove_container(&r.container_id);
        }
        (CriRequest::StopPodSandbox(r), _) => store.set_pod_stopped(&r.pod_sandbox_id),
        (CriRequest::RemovePodSandbox(r), _) => {
            store.remove_pod(&r.pod_sandbox_id);
        }
        _ => {}
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Ends a long-lived response stream with UNAVAILABLE trailers when qoslet
/// shuts down, so the client reconnects instead of waiting forever.
struct EndOnShutdown<B> {
    inner: B,
    shutdown: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    done: bool,
}

impl<B> HttpBody for EndOnShutdown<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(f) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(f);
        }
        if self.shutdown.as_mut().poll(cx).is_ready() {
            self.done = true;
            let mut map = HeaderMap::new();
            let _ = Status::from(QosletError::ShuttingDown).add_header(&mut map);
            return Poll::Ready(Some(Ok(Frame::trailers(map))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_proto::cri;
    use qoslet_state::store::PodState;

    #[test]
    fn record_follows_the_lifecycle() {
        let s = Store::new();
        let run = CriRequest::RunPodSandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "p".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            runtime_handler: "runc".into(),
        });
        record(
            &s,
            &run,
            &CriResponse::RunPodSandbox(cri::RunPodSandboxResponse {
                pod_sandbox_id: "P".into(),
            }),
        );
        let create = CriRequest::CreateContainer(cri::CreateContainerRequest {
            pod_sandbox_id: "P".into(),
            config: Some(cri::ContainerConfig::default()),
            sandbox_config: None,
        });
        record(
            &s,
            &create,
            &CriResponse::CreateContainer(cri::CreateContainerResponse {
                container_id: "C".into(),
            }),
        );
        assert_eq!(s.counts(), (1, 1));
        record(
            &s,
            &CriRequest::StartContainer(cri::StartContainerRequest {
                container_id: "C".into(),
            }),
            &CriResponse::StartContainer(Default::default()),
        );
        assert_eq!(s.container("C").unwrap().state, ContainerState::Running);
        record(
            &s,
            &CriRequest::UpdateContainerResources(cri::UpdateContainerResourcesRequest {
                container_id: "C".into(),
                linux: Some(cri::LinuxContainerResources {
                    cpu_quota: 7,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            &CriResponse::UpdateContainerResources(Default::default()),
        );
        assert_eq!(s.container("C").unwrap().requested.unwrap().cpu_quota, 7);
        record(
            &s,
            &CriRequest::StopPodSandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: "P".into(),
            }),
            &CriResponse::StopPodSandbox(Default::default()),
        );
        assert_eq!(s.pod("P").unwrap().state, PodState::NotReady);
        assert_eq!(s.container("C").unwrap().state, ContainerState::Exited);
        record(
            &s,
            &CriRequest::RemovePodSandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: "P".into(),
            }),
            &CriResponse::RemovePodSandbox(Default::default()),
        );
        assert_eq!(s.counts(), (0, 0));
    }
}
