//! Helpers for qoslet's end-to-end tests and benchmarks.
//!
//! * [`testbed`]: the real containerd the tests run against (started by
//!   `integration/testbed/testbed.sh up`), CRI clients and pod/container configs.
//! * [`process`]: the `qoslet` binary as a child process (start, SIGTERM, SIGKILL).
//! * [`fake`]: a recording HTTP/2 backend, to see the exact bytes qoslet forwards.
//! * [`raw`]: a raw HTTP/2 gRPC client, to send bytes qoslet's proto does not know.
//!
//! Tests that need the real runtime fail loudly when it is not up; they never skip.

pub mod fake;
pub mod kubelet;
pub mod node;
pub mod process;
pub mod raw;
pub mod registry;
pub mod testbed;

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A file's contents, trimmed (a cgroup or proc file); panics naming the path
/// when unreadable.
pub fn read_trimmed(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// A free TCP port on 127.0.0.1 (for `--metrics-listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over plain HTTP/1.1: (status line, body).
pub fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// A tonic channel to a unix socket.
pub async fn channel(path: impl AsRef<Path>) -> Channel {
    let path = path.as_ref().to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .expect("connect to unix socket")
}

/// A lazily connecting tonic channel (does not fail while the socket is down).
pub fn lazy_channel(path: impl AsRef<Path>) -> Channel {
    let path = path.as_ref().to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!(
        "{prefix}-{}-{t}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where scratch dirs go: under the test bed's work dir for the test bed's
/// tests, else (tests that run anywhere, as any user) a temp dir of this user's.
fn scratch_root() -> std::path::PathBuf {
    if cfg!(feature = "testbed") || std::env::var_os("QOSLET_TESTBED").is_some() {
        testbed::work_dir().join("scratch")
    } else {
        use std::os::unix::fs::MetadataExt;
        // (the owner of /proc/self is this process's user)
        let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
        std::env::temp_dir().join(format!("qoslet-scratch-{uid}"))
    }
}

/// A fresh scratch dir for one test ([`scratch_root`]).
pub fn scratch(name: &str) -> std::path::PathBuf {
    let d = scratch_root().join(unique(name));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What [`start_proxy`] returns: the running proxy, its CRI socket, its admin socket.
pub type Started = (
    qoslet_proxy::Running,
    std::path::PathBuf,
    std::path::PathBuf,
);

/// Starts an in-process proxy in front of `backend` with sockets under `dir`.
pub async fn start_proxy(dir: &Path, backend: &Path, pipeline: qoslet_proxy::Pipeline) -> Started {
    let sock = dir.join("qoslet.sock");
    let admin = dir.join("admin.sock");
    let cfg = qoslet_proxy::ProxyConfig {
        listen: format!("unix://{}", sock.display()),
        admin_listen: format!("unix://{}", admin.display()),
        runtime_endpoint: format!("unix://{}", backend.display()),
        state_dir: dir.join("state"),
        drain_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let running = qoslet_proxy::start(cfg, pipeline)
        .await
        .expect("start proxy");
    (running, sock, admin)
}

/// The admin API's QueryMetrics for `entity`'s `series` over `window` seconds:
/// its aggregations by name (empty when the query fails).
pub async fn query(
    admin: &Path,
    entity: &str,
    series: &str,
    window: u32,
) -> std::collections::HashMap<String, f64> {
    qoslet_proto::admin::admin_client::AdminClient::new(channel(admin).await)
        .query_metrics(qoslet_proto::admin::QueryMetricsRequest {
            entity: entity.into(),
            series: series.into(),
            window_seconds: window,
            aggregations: vec![],
        })
        .await
        .map(|r| r.into_inner().values)
        .unwrap_or_default()
}
