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

#[cfg(test)]
mod tests {
    /// A plain-HTTP server gets an empty root set of its own (so kube's TLS
    /// setup never reads the system's CA store, which a minimal node lacks: the
    /// VM test bed's guest runs the cluster tests without one); an HTTPS server
    /// without a CA in its kubeconfig keeps the system's roots, so does a
    /// server behind a proxy, and a CA given is kept as given.
    #[test]
    fn plain_http_needs_no_system_ca_certificates() {
        let mut http = kube::Config::new("http://127.0.0.1:8001".parse().unwrap());
        super::without_system_roots_over_http(&mut http);
        assert_eq!(http.root_cert, Some(Vec::new()));
        let mut https = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        super::without_system_roots_over_http(&mut https);
        assert_eq!(https.root_cert, None);
        let mut proxied = kube::Config::new("http://10.0.0.1:8080".parse().unwrap());
        proxied.proxy_url = Some("https://proxy.example:3128".parse().unwrap());
        super::without_system_roots_over_http(&mut proxied);
        assert_eq!(proxied.root_cert, None, "the proxy's TLS needs the roots");
        let mut given = kube::Config::new("http://127.0.0.1:8001".parse().unwrap());
        given.root_cert = Some(vec![vec![1, 2, 3]]);
        super::without_system_roots_over_http(&mut given);
        assert_eq!(given.root_cert, Some(vec![vec![1, 2, 3]]));
    }
}
