//! A recording HTTP/2 backend on a unix socket: it stands in for containerd
//! when a test must see the exact bytes, headers and timing qoslet forwards.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Either, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;

/// A request as the backend saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// How the request's body ended.
    pub ended: Ended,
}

/// How a request's body ended on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// END_STREAM on the HEADERS (no DATA frame at all).
    Headers,
    /// END_STREAM on a DATA frame.
    Data,
    /// Trailers (a second HEADERS frame) ended it.
    Trailers(HeaderMap),
}

/// What the backend answers.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// Wait before sending response headers.
    pub delay: Duration,
    /// Body chunks, each sent after its delay.
    pub chunks: Vec<(Duration, Bytes)>,
    /// Trailers (grpc-status etc.).
    pub trailers: HeaderMap,
    /// Send the trailers as the response headers, with END_STREAM and no body
    /// (gRPC's "trailers-only" answer, what grpc-go sends for an error status).
    pub trailers_only: bool,
}

impl Reply {
    /// One message and OK.
    pub fn ok(message: &[u8]) -> Self {
        Self {
            chunks: vec![(Duration::ZERO, crate::raw::frame(message))],
            trailers: status_map(0, ""),
            ..Default::default()
        }
    }

    /// An error status (in trailers), with extra trailer metadata.
    pub fn status(code: i32, message: &str, extra: &[(&'static str, &str)]) -> Self {
        let mut trailers = status_map(code, message);
        for (k, v) in extra {
            trailers.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        Self {
            trailers,
            ..Default::default()
        }
    }

    /// [`Reply::status`] as a trailers-only answer (one HEADERS frame with END_STREAM).
    pub fn trailers_only(code: i32, message: &str) -> Self {
        Self {
            trailers: status_map(code, message),
            trailers_only: true,
            ..Default::default()
        }
    }

    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

fn status_map(code: i32, message: &str) -> HeaderMap {
    let mut m = HeaderMap::new();
    m.insert(
        "grpc-status",
        HeaderValue::from_str(&code.to_string()).unwrap(),
    );
    if !message.is_empty() {
        m.insert("grpc-message", HeaderValue::from_str(message).unwrap());
    }
    m
}

type Responder = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// The running fake backend. Dropping it stops it.
pub struct FakeBackend {
    pub sock: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The headers of each request as it arrived (before its body).
    arrived: Arc<Mutex<Vec<HeaderMap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeBackend {
    /// Serves on `sock`, answering each request with `respond(seen)`.
    pub async fn start(
        sock: &Path,
        respond: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let _ = std::fs::remove_file(sock);
        let listener = UnixListener::bind(sock).expect("bind fake backend");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let arrived: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
        let respond: Responder = Arc::new(respond);
        let (s, a) = (seen.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((io, _)) = listener.accept().await else {
                    return;
                };
                let (s, a, respond) = (s.clone(), a.clone(), respond.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (s, respond) = (s.clone(), respond.clone());
                        a.lock().unwrap().push(req.headers().clone());
                        async move { Ok::<_, Infallible>(handle(req, s, respond).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_frame_size(1 << 20)
                        .serve_connection(TokioIo::new(io), svc)
                        .await;
                });
            }
        });
        Self {
            sock: sock.into(),
            seen,
            arrived,
            task,
        }
    }

    /// Everything received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The headers of every request that arrived so far, its body read or not.
    pub fn arrived(&self) -> Vec<HeaderMap> {
        self.arrived.lock().unwrap().clone()
    }

    /// Requests received on `path`.
    pub fn seen_on(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = Either<
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
    Empty<Bytes>,
>;

async fn handle(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Responder,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    // before anything is read, h2 tells whether the HEADERS carried END_STREAM
    let on_headers = hyper::body::Body::is_end_stream(&body);
    let (body, ended) = match body.collect().await {
        Ok(c) => {
            let ended = match (on_headers, c.trailers()) {
                (true, _) => Ended::Headers,
                (false, Some(t)) => Ended::Trailers(t.clone()),
                (false, None) => Ended::Data,
            };
            (c.to_bytes(), ended)
        }
        Err(_) => (Bytes::new(), Ended::Data),
    };
    let s = Seen {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body,
        ended,
    };
    let reply = respond(&s);
    seen.lock().unwrap().push(s);
    // no timer for no delay (a zero sleep still waits for the timer wheel's next tick)
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if reply.trailers_only {
        let mut b = Response::builder().header("content-type", "application/grpc");
        for (k, v) in &reply.trailers {
            b = b.header(k, v);
        }
        return b.body(Either::Right(Empty::new())).unwrap();
    }
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        for (d, c) in reply.chunks {
            if !d.is_zero() {
                tokio::time::sleep(d).await;
            }
            if tx.send(Ok(Frame::data(c))).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Frame::trailers(reply.trailers))).await;
    });
    Response::builder()
        .header("content-type", "application/grpc")
        .header("x-backend", "fake")
        .body(Either::Left(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
        .unwrap()
}
