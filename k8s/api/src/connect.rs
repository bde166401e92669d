//! A client of the API server: from a kubeconfig file, or the in-cluster
//! service account when none is named.

use std::path::{Path, PathBuf};

/// Why there is no client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("kubeconfig {path}: {error}")]
    Kubeconfig { path: PathBuf, error: String },
    #[error("in-cluster configuration (no kubeconfig named): {0}")]
    InCluster(String),
    #[error("kubernetes client: {0}")]
    Client(String),
}

/// A client of the API server `kubeconfig` names (`None`: in-cluster).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ConnectError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |e: String| ConnectError::Kubeconfig {
                path: path.to_path_buf(),
                error: e,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| ConnectError::InCluster(e.to_string()))?,
    };
    let mut config = config;
    // kube 5 retries 429, 503 and 504 up to 15 times, up to 1000 s
    // apart: a PodDisruptionBudget's 429 on an eviction would hold the
    // eviction loop for minutes. Every caller here has its own policy
    // (the watchers back off, an eviction refused moves to the next
    // candidate, status writes retry at their interval).
    config.default_retry = false;
    without_system_roots_over_http(&mut config);
    let https_without_ca = config.cluster_url.scheme_str() == Some("https")
        && config.root_cert.is_none()
        && config.root_cert_file.is_none();
    kube::Client::try_from(config).map_err(|e| {
        let mut msg = e.to_string();
        // (the platform verifier's failure: a bad client key is another error)
        if https_without_ca && msg.contains("root certificate") {
            msg.push_str(
                " (the kubeconfig names no certificate-authority, so the system's CA \
                 certificates are needed, and this node has none)",
            );
        }
        ConnectError::Client(msg)
    })
}

/// A plain-HTTP API server (`kubectl proxy`, a local tunnel) speaks no TLS,
/// but kube builds its TLS setup all the same, and with no CA in the
/// kubeconfig that setup loads the system's CA certificates, failing where
/// there are none (a minimal node or container image; found on the VM test
/// bed's Debian guest, which has no ca-certificates). An empty set of roots
/// of our own keeps that path off: nothing is ever verified against it.
/// (Not behind a proxy: the connection to an `https` proxy needs the roots.)
fn without_system_roots_over_http(config: &mut kube::Config) {
    if config.cluster_url.scheme_str() == Some("http")
        && config.proxy_url.is_none()
        && config.root_cert.is_none()
        && config.root_cert_file.is_none()
    {
        config.root_cert = Some(Vec::new());
    }
}
