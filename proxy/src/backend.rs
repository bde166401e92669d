//! The backend runtime (containerd): a raw HTTP/2 connection per client
//! connection for forwarding bytes (that client's calls multiplexed on it, as
//! its own connection to containerd would carry them), and a typed CRI channel
//! for qoslet's own calls (Version, List*, *Status).
//!
//! Both reconnect on their own: when containerd restarts, calls fail while it
//! is down and succeed again afterwards, without restarting qoslet. The raw
//! connection is a bare `hyper::client::conn::http2` sender (no pool: one
//! backend, one connection), re-established on the first call after it closed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};

use crate::endpoint::{parse_unix, EndpointError};

type Sender = hyper::client::conn::http2::SendRequest<Body>;

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
    Http { path: PathBuf, source: hyper::Error },
}

/// The raw connection, shared by all forwarded calls.
struct RawConn {
    path: Arc<PathBuf>,
    current: std::sync::Mutex<Option<Sender>>,
    connecting: tokio::sync::Mutex<()>,
}

impl RawConn {
    fn live(&self) -> Option<Sender> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    async fn sender(&self) -> Result<Sender, BackendError> {
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
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .max_frame_size(1 << 20)
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_header_list_size(16 << 20)
            .handshake(TokioIo::new(io));
        let (sender, conn) = tokio::time::timeout(Duration::from_secs(5), handshake)
            .await
            .map_err(|_| BackendError::HandshakeTimeout { path: path.clone() })?
            .map_err(|source| BackendError::Http {
                path: path.clone(),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "backend connection ended");
            }
        });
        tracing::debug!(path = %path.display(), "connected to the runtime");
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender.clone());
        Ok(sender)
    }
}

/// Connections to the backend runtime.
#[derive(Clone)]
pub struct Backend {
    endpoint: String,
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
            endpoint: endpoint.to_string(),
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
    pub fn own_connection(&self) -> Self {
        Self {
            endpoint: self.endpoint.clone(),
            path: self.path.clone(),
            raw: Arc::new(RawConn {
                path: self.path.clone(),
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

    /// Sends a request as it is (the URI needs a scheme and authority) on the
    /// shared raw connection, reconnecting first if it closed.
    pub async fn request(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, BackendError> {
        let mut sender = self.raw.sender().await?;
        let path = || (*self.raw.path).clone();
        sender.ready().await.map_err(|source| BackendError::Http {
            path: path(),
            source,
        })?;
        sender
            .send_request(req)
            .await
            .map_err(|source| BackendError::Http {
                path: path(),
                source,
            })
    }

    /// A typed CRI RuntimeService client.
    pub fn runtime(
        &self,
    ) -> qoslet_proto::cri::runtime_service_client::RuntimeServiceClient<Channel> {
        qoslet_proto::cri::runtime_service_client::RuntimeServiceClient::new(self.typed.clone())
            .max_decoding_message_size(crate::grpc::DEFAULT_MAX_MESSAGE)
    }
}
