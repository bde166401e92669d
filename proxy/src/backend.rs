//! The backend runtime (containerd): a raw HTTP/2 connection per client
//! connection for forwarding bytes (that client's calls multiplexed on it, as
//! its own connection to containerd would carry them), and a typed CRI channel
//! for qoslet's own calls (Version, List*, *Status).
//!
//! Both reconnect on their own: when containerd restarts, calls fail while it
//! is down and succeed again afterwards, without restarting qoslet. The raw
//! connection is a bare `h2::client` sender (no pool: one
//! backend, one connection), re-established on the first call after it closed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body::Body as _;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};

pub use crate::h2io::H2Body;
use qoslet_wire::endpoint::{parse_unix, EndpointError};

type Sender = h2::client::SendRequest<Bytes>;

/// Why a request could not be sent to the backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("connect {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("HTTP/2 handshake with {path} timed out")]
    HandshakeTimeout { path: PathBuf },
    #[error("HTTP/2 with {path}: {source}")]
    Http { path: PathBuf, source: h2::Error },
}

/// What a forwarded call sends: a unary body known whole (its headers and
/// body go out in one write) and the way the client ended it, or a body that
/// streams.
pub enum Outgoing {
    Unary {
        bytes: Bytes,
        end: RequestEnd,
    },
    /// A unary call whose message is in while the client has not ended its
    /// stream yet: the message goes at once, the rest streams as it comes.
    Started {
        bytes: Bytes,
        rest: Body,
    },
    Stream(Body),
}

/// How the client ended a request's body, kept as it was on the way to the
/// runtime: grpc-go answers each ending differently (issue 48). END_STREAM on
/// the HEADERS leaves its handler waiting for a message until the call's
/// deadline (then DEADLINE_EXCEEDED); END_STREAM on a DATA frame, even an empty
/// one, ends the message (an empty body is UNKNOWN at once); trailers from a
/// client are a stream error (RST_STREAM PROTOCOL_ERROR). Sending an empty
/// body one way when the client sent it the other changes the answer, or
/// leaves the call unanswered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RequestEnd {
    /// END_STREAM on the HEADERS: no body at all.
    Headers,
    /// END_STREAM on the last DATA frame (the common case).
    #[default]
    Data,
    /// The body ended with trailers (a HEADERS frame after the data).
    Trailers(http::HeaderMap),
}

/// A raw connection: h2's client, driven directly (a unary call's HEADERS and
/// DATA are queued together and leave in one write; through hyper's client they
/// left in two, each a wake-up of containerd's reader).
struct RawConn {
    path: Arc<PathBuf>,
    /// The client this connection serves (its header-list limit is advertised
    /// to the runtime), or none for qoslet's own connection.
    client: Option<Arc<qoslet_wire::authority::ClientSettings>>,
    current: std::sync::Mutex<Option<(Sender, Arc<AtomicBool>)>>,
    connecting: tokio::sync::Mutex<()>,
}

impl RawConn {
    fn live(&self) -> Option<(Sender, Arc<AtomicBool>)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(_, closed)| !closed.load(Ordering::Acquire))
            .cloned()
    }

    /// The connection (made if there is none), and the flag that retires it.
    async fn sender(&self) -> Result<(Sender, Arc<AtomicBool>), BackendError> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let path = (*self.path).clone();
        let io = UnixStream::connect(&path)
            .await
            .map_err(|source| BackendError::Connect {
                path: path.clone(),
                source,
            })?;
        // the frame size stays the RFC's (qoslet_wire::limits::MAX_FRAME: containerd
        // sends 16 KiB frames, and h2's CONTINUATION limit follows this setting);
        // the header-list limit is the client's own, so containerd refuses
        // trailers the client would refuse, as it does direct
        let header_list = qoslet_wire::limits::runtime_header_list(
            self.client.as_ref().and_then(|c| c.max_header_list()),
        );
        let handshake = h2::client::Builder::new()
            .initial_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_header_list_size(header_list)
            .handshake::<_, Bytes>(io);
        let (sender, conn) = tokio::time::timeout(Duration::from_secs(5), handshake)
            .await
            .map_err(|_| BackendError::HandshakeTimeout { path: path.clone() })?
            .map_err(|source| BackendError::Http {
                path: path.clone(),
                source,
            })?;
        let closed = Arc::new(AtomicBool::new(false));
        let c = closed.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "backend connection ended");
            }
            c.store(true, Ordering::Release);
        });
        tracing::debug!(path = %path.display(), "connected to the runtime");
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((sender.clone(), closed.clone()));
        Ok((sender, closed))
    }
}

/// Connections to the backend runtime.
#[derive(Clone)]
pub struct Backend {
    /// Shared: a `Backend` is cloned for every call.
    endpoint: Arc<str>,
    path: Arc<PathBuf>,
    raw: Arc<RawConn>,
    typed: Channel,
}

impl Backend {
    /// Prepares (lazily) the connections to `endpoint` (`unix:///path`).
    pub fn new(endpoint: &str) -> Result<Self, EndpointError> {
        let path = Arc::new(parse_unix(endpoint)?);
        let raw = Arc::new(RawConn {
            path: path.clone(),
            client: None,
            current: Default::default(),
            connecting: Default::default(),
        });
        let p = path.clone();
        let typed = Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let p = p.clone();
                async move { UnixStream::connect(&*p).await.map(TokioIo::new) }
            }));
        Ok(Self {
            endpoint: Arc::from(endpoint),
            path,
            raw,
            typed,
        })
    }

    /// The same backend with a raw connection of its own (made on first use):
    /// each kubelet connection gets one, so a client that stops reading stalls
    /// only its own connection's window, never every client's (one shared
    /// connection window would let a few stalled 4 MiB answers freeze all CRI
    /// calls on the node).
    pub fn own_connection(
        &self,
        client: Option<Arc<qoslet_wire::authority::ClientSettings>>,
    ) -> Self {
        Self {
            endpoint: self.endpoint.clone(),
            path: self.path.clone(),
            raw: Arc::new(RawConn {
                path: self.path.clone(),
                client,
                current: Default::default(),
                connecting: Default::default(),
            }),
            typed: self.typed.clone(),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn socket_path(&self) -> &std::path::Path {
        &self.path
    }

    /// Sends a request as it is (the URI needs a scheme and authority) on this
    /// backend's raw connection, reconnecting first if it closed.
    pub async fn request(
        &self,
        parts: http::request::Parts,
        body: Outgoing,
    ) -> Result<http::Response<H2Body>, BackendError> {
        let Outgoing::Unary { bytes, end } = &body else {
            return self.request_once(parts, body).await;
        };
        // a unary call containerd's GOAWAY (or REFUSED_STREAM) turned away was never
        // processed: it is sent once more on a fresh connection, as grpc-go's own
        // transparent retry would do for kubelet talking to containerd directly
        let again = (
            parts.method.clone(),
            parts.uri.clone(),
            parts.version,
            parts.headers.clone(),
            bytes.clone(),
            end.clone(),
        );
        match self.request_once(parts, body).await {
            Err(BackendError::Http { source, .. })
                if source.is_remote()
                    && (source.is_go_away()
                        || source.reason() == Some(h2::Reason::REFUSED_STREAM)) =>
            {
                let (method, uri, version, headers, bytes, end) = again;
                let (mut p, ()) = http::Request::new(()).into_parts();
                p.method = method;
                p.uri = uri;
                p.version = version;
                p.headers = headers;
                self.request_once(p, Outgoing::Unary { bytes, end }).await
            }
            r => r,
        }
    }

    async fn request_once(
        &self,
        parts: http::request::Parts,
        body: Outgoing,
    ) -> Result<http::Response<H2Body>, BackendError> {
        let path = || (*self.raw.path).clone();
        let (sender, closed) = self.raw.sender().await?;
        // a connection that refuses new streams (containerd's GOAWAY) is retired:
        // the next call makes a new one
        let http = |source: h2::Error| {
            if source.is_go_away() || source.is_io() {
                closed.store(true, Ordering::Release);
            }
            BackendError::Http {
                path: path(),
                source,
            }
        };
        let mut sender = sender.ready().await.map_err(http)?;
        let head = http::Request::from_parts(parts, ());
        let (answer, send) = match body {
            // a body that ended on its HEADERS: none is sent (not even an empty DATA frame)
            Outgoing::Unary {
                end: RequestEnd::Headers,
                ..
            } => sender.send_request(head, true).map_err(http)?,
            Outgoing::Stream(body) if body.is_end_stream() => {
                sender.send_request(head, true).map_err(http)?
            }
            Outgoing::Unary { bytes, end } => {
                let (answer, mut send) = sender.send_request(head, false).map_err(http)?;
                // queued with the HEADERS: one write (h2 holds what the window defers);
                // an empty body still ends on a DATA frame of its own, as the client's did
                match end {
                    RequestEnd::Trailers(t) => {
                        if !bytes.is_empty() {
                            send.send_data(bytes, false).map_err(http)?;
                        }
                        send.send_trailers(t).map_err(http)?;
                    }
                    _ => send.send_data(bytes, true).map_err(http)?,
                }
                (answer, send)
            }
            Outgoing::Started { bytes, rest } => {
                let (answer, mut send) = sender.send_request(head, false).map_err(http)?;
                send.send_data(bytes, false).map_err(http)?;
                let (cancel, cancelled) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    crate::h2io::pipe(rest, &mut send, Some(cancelled), h2::Reason::CANCEL).await
                });
                let resp = answer.await.map_err(http)?;
                return Ok(resp.map(|recv| H2Body::with_cancel(recv, cancel)));
            }
            Outgoing::Stream(body) => {
                let (answer, mut send) = sender.send_request(head, false).map_err(http)?;
                // the body streams in its own task; dropping the answer ends it
                let (cancel, cancelled) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    crate::h2io::pipe(body, &mut send, Some(cancelled), h2::Reason::CANCEL).await
                });
                let resp = answer.await.map_err(http)?;
                return Ok(resp.map(|recv| H2Body::with_cancel(recv, cancel)));
            }
        };
        drop(send);
        let resp = answer.await.map_err(http)?;
        Ok(resp.map(H2Body::new))
    }

    /// A typed CRI RuntimeService client.
    pub fn runtime(
        &self,
    ) -> qoslet_proto::cri::runtime_service_client::RuntimeServiceClient<Channel> {
        qoslet_proto::cri::runtime_service_client::RuntimeServiceClient::new(self.typed.clone())
            .max_decoding_message_size(crate::grpc::DEFAULT_MAX_MESSAGE)
    }
}
