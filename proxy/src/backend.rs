//! The backend runtime (containerd): a raw HTTP/2 client for forwarding bytes,
//! and a typed CRI channel for qoslet's own calls (Version, List*, *Status).
//!
//! Both reconnect on their own: when containerd restarts, calls fail while it
//! is down and succeed again afterwards, without restarting qoslet.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};

use crate::endpoint::{parse_unix, EndpointError};

type Connector = tower::util::BoxCloneSyncService<Uri, TokioIo<UnixStream>, std::io::Error>;

/// The raw HTTP/2 client type.
pub type RawClient = Client<Connector, Body>;

/// Connections to the backend runtime.
#[derive(Clone)]
pub struct Backend {
    endpoint: String,
    path: Arc<PathBuf>,
    raw: RawClient,
    typed: Channel,
}

impl Backend {
    /// Prepares (lazily) the connections to `endpoint` (`unix:///path`).
    pub fn new(endpoint: &str) -> Result<Self, EndpointError> {
        let path = Arc::new(parse_unix(endpoint)?);
        let p = path.clone();
        let connector = Connector::new(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move { UnixStream::connect(&*p).await.map(TokioIo::new) }
        }));
        let raw = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_max_frame_size(Some(1 << 20))
            .http2_initial_stream_window_size(Some(4 << 20))
            .http2_initial_connection_window_size(Some(16 << 20))
            .pool_idle_timeout(None)
            .build(connector);
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

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn socket_path(&self) -> &std::path::Path {
        &self.path
    }

    /// The raw client (requests need an absolute `http://` URI).
    pub fn raw(&self) -> &RawClient {
        &self.raw
    }

    /// A typed CRI RuntimeService client.
    pub fn runtime(
        &self,
    ) -> qoslet_proto::cri::runtime_service_client::RuntimeServiceClient<Channel> {
        qoslet_proto::cri::runtime_service_client::RuntimeServiceClient::new(self.typed.clone())
            .max_decoding_message_size(crate::grpc::DEFAULT_MAX_MESSAGE)
    }
}
