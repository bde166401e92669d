//! A minimal read-only OCI distribution registry on 127.0.0.1, serving the test
//! bed's offline image tarball, so `PullImage` can be tested without internet
//! (containerd's CRI pulls from loopback registries over plain HTTP).

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// A running registry. Dropping it stops it.
pub struct Registry {
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Registry {
    /// Serves the OCI layout inside `tarball` (extracted under `scratch`).
    pub async fn start(tarball: &Path, scratch: &Path) -> Self {
        let root = scratch.join("oci");
        std::fs::create_dir_all(&root).unwrap();
        let st = Command::new("tar")
            .arg("-xf")
            .arg(tarball)
            .arg("-C")
            .arg(&root)
            .status()
            .expect("tar");
        assert!(st.success(), "cannot extract {}", tarball.display());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((io, _)) = listener.accept().await else {
                    return;
                };
                let root = root.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let root = root.clone();
                        async move { Ok::<_, Infallible>(serve(&root, req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), svc)
                        .await;
                });
            }
        });
        Self { addr, task }
    }

    /// The pullable reference of a test bed image (`localhost/testbed/busybox:1.35` -> `127.0.0.1:PORT/testbed/busybox:1.35`).
    pub fn reference(&self, image: &str) -> String {
        format!("{}/{}", self.addr, image.trim_start_matches("localhost/"))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn blob_path(root: &Path, digest: &str) -> Option<PathBuf> {
    let hex = digest.strip_prefix("sha256:")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(root.join("blobs/sha256").join(hex))
}

/// Finds a manifest descriptor in index.json by repository and tag.
fn manifest_for(root: &Path, repo: &str, reference: &str) -> Option<(String, String)> {
    if reference.starts_with("sha256:") {
        return Some((
            reference.to_string(),
            "application/vnd.oci.image.manifest.v1+json".into(),
        ));
    }
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("index.json")).ok()?).ok()?;
    // the test images are named localhost/<repo>, qoslet's own by its registry's path
    let (local, named) = (
        format!("localhost/{repo}:{reference}"),
        format!("{repo}:{reference}"),
    );
    index["manifests"].as_array()?.iter().find_map(|m| {
        let name = m["annotations"]["io.containerd.image.name"].as_str()?;
        (name == local || name == named).then(|| {
            (
                m["digest"].as_str().unwrap_or_default().to_string(),
                m["mediaType"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

fn serve(root: &Path, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let head = req.method() == http::Method::HEAD;
    let not_found = || {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    if path == "/v2/" || path == "/v2" {
        return Response::new(Full::new(Bytes::from_static(b"{}")));
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found();
    };
    let (repo, kind, reference) = if let Some((repo, r)) = rest.split_once("/manifests/") {
        (repo, "manifest", r)
    } else if let Some((repo, r)) = rest.split_once("/blobs/") {
        (repo, "blob", r)
    } else {
        return not_found();
    };
    let (digest, media) = if kind == "manifest" {
        match manifest_for(root, repo, reference) {
            Some(d) => d,
            None => return not_found(),
        }
    } else {
        (reference.to_string(), "application/octet-stream".into())
    };
    let Some(file) = blob_path(root, &digest) else {
        return not_found();
    };
    let Ok(data) = std::fs::read(&file) else {
        return not_found();
    };
    Response::builder()
        .header("content-type", media)
        .header("docker-content-digest", digest)
        .header("content-length", data.len())
        .body(Full::new(if head {
            Bytes::new()
        } else {
            Bytes::from(data)
        }))
        .unwrap()
}
