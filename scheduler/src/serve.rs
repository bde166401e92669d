//! The HTTP front kube-scheduler calls: `POST /filter`, `POST /prioritize`,
//! and `GET /healthz`, `/livez`, `/metrics`. HTTP/1.1 (kube-scheduler's Go
//! client, keep-alive); a body over the limit is refused (413), one that
//! does not arrive within [`BODY_TIMEOUT`] is dropped (408), headers must
//! come within [`HEADER_TIMEOUT`].
//!
//! Bodies are read under a budget of bytes ([`BODY_BUDGET`]), each frame
//! taking its bytes as it arrives: memory stays bounded, and a client that
//! trickles a body, or declares a large one and sends nothing, holds only
//! what it has sent, not a slot kube-scheduler's requests would wait for.
//! A frame that finds no budget within [`BUDGET_WAIT`] is answered 503; the
//! whole body must arrive within [`BODY_TIMEOUT`] (408), inside
//! kube-scheduler's 5 s.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response};
use tokio::sync::watch as signal;
use tracing::{debug, warn};

use crate::extender::Extender;
use crate::watch::{now_ms, Kind, Status};
use crate::wire;

/// A request's headers must arrive within this time; also how long an idle
/// keep-alive connection is kept: above Go's 90 s (`IdleConnTimeout`), so
/// kube-scheduler closes an idle connection before the front does (a POST
/// written as the server closes would not be sent again).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(120);
/// A request's body must arrive within this time from the request's start,
/// budget waits included (under kube-scheduler's default `httpTimeout` of
/// 5 s).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(4);
/// The bytes of request bodies read at once.
pub const BODY_BUDGET: usize = 64 << 20;
/// How long a body waits for its part of the budget.
pub const BUDGET_WAIT: Duration = Duration::from_secs(1);
/// The largest body read by default: a `NodeNames` request of 5,000 nodes
/// is 64 KiB; a `Nodes` request (the extender not `nodeCacheCapable`)
/// carries whole Node objects, 3 to 20 KiB each: raise it for that.
pub const DEFAULT_MAX_BODY: u64 = 16 << 20;
/// At most this many connections at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Latency buckets, seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// One verb's latency histogram and answers.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The front's counters.
#[derive(Debug, Default)]
pub struct Stats {
    filter: Histogram,
    prioritize: Histogram,
    /// Requests refused: malformed, too large, too slow, wrong method or path.
    bad_requests: AtomicU64,
}

/// What the front serves.
pub struct Front {
    pub ext: Arc<Extender>,
    pub status: Arc<Status>,
    pub stats: Stats,
    pub max_body: usize,
    /// [`BODY_BUDGET`] (or the body limit, when larger), in bytes.
    budget: tokio::sync::Semaphore,
}

impl Front {
    pub fn new(ext: Arc<Extender>, status: Arc<Status>, max_body: usize) -> Self {
        Self {
            ext,
            status,
            stats: Stats::default(),
            max_body,
            budget: tokio::sync::Semaphore::new(BODY_BUDGET.max(max_body)),
        }
    }
}

/// The verb a path names: its last segment (kube-scheduler posts to
/// `<urlPrefix>/<verb>`, and a `urlPrefix` may have a path of its own).
fn verb(path: &str) -> Option<&'static str> {
    match path.trim_end_matches('/').rsplit('/').next() {
        Some("filter") => Some("filter"),
        Some("prioritize") => Some("prioritize"),
        _ => None,
    }
}

fn reply(code: u16, ctype: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

impl Front {
    async fn respond(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().trim_end_matches('/').to_string();
        let verb = verb(&path);
        match (req.method(), path.as_str()) {
            (&Method::POST, _) if verb.is_some() => {}
            (&Method::GET | &Method::HEAD, "/metrics") => {
                return reply(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    self.render(),
                )
            }
            (&Method::GET | &Method::HEAD, "/healthz") => {
                return match self.unready() {
                    None => reply(200, TEXT, "ok\n"),
                    Some(why) => reply(503, TEXT, format!("not ready: {why}\n")),
                }
            }
            (&Method::GET | &Method::HEAD, "/livez") => return reply(200, TEXT, "ok\n"),
            (_, "/metrics" | "/healthz" | "/livez") => {
                self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                return reply(405, TEXT, "method not allowed\n");
            }
            _ if verb.is_some() => {
                self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                return reply(405, TEXT, "method not allowed\n");
            }
            _ => {
                self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                return reply(
                    404,
                    TEXT,
                    "not found: POST /filter or /prioritize; GET /healthz, /livez or /metrics\n",
                );
            }
        }
        let started = Instant::now();
        let bytes = match self.read_body(req.into_body()).await {
            Ok(b) => b,
            Err(answer) => {
                self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                return answer;
            }
        };
        let args = match wire::decode(&bytes) {
            Ok(a) => a,
            Err(e) => {
                self.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                return reply(400, TEXT, format!("{e}\n"));
            }
        };
        let (out, h) = if verb == Some("filter") {
            (self.ext.filter(&args, now_ms()), &self.stats.filter)
        } else {
            (self.ext.prioritize(&args, now_ms()), &self.stats.prioritize)
        };
        h.observe(started.elapsed());
        reply(200, JSON, out)
    }

    /// A request's body, read within [`BODY_TIMEOUT`] from its start, each
    /// frame taking its bytes from the budget as it arrives (a client
    /// holds only what it has sent, whatever it declared); a declared
    /// length over the limit is refused before anything is read.
    async fn read_body(
        &self,
        mut body: hyper::body::Incoming,
    ) -> Result<Vec<u8>, Response<Full<Bytes>>> {
        let too_large = || {
            reply(
                413,
                TEXT,
                format!("the request body is over {} bytes\n", self.max_body),
            )
        };
        let declared = hyper::body::Body::size_hint(&body).exact();
        if declared.is_some_and(|n| n > self.max_body as u64) {
            return Err(too_large());
        }
        let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
        let late = || reply(408, TEXT, "the request body did not arrive in time\n");
        let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(1 << 20) as usize);
        let mut held: Option<tokio::sync::SemaphorePermit<'_>> = None;
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => return Err(late()),
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(reply(400, TEXT, format!("reading the request body: {e}\n")))
                }
                Ok(Some(Ok(f))) => f,
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            if buf.len() + data.len() > self.max_body {
                return Err(too_large());
            }
            let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let wait = deadline.min(tokio::time::Instant::now() + BUDGET_WAIT);
            match tokio::time::timeout_at(wait, self.budget.acquire_many(n)).await {
                Ok(Ok(p)) => match held.as_mut() {
                    Some(h) => h.merge(p),
                    None => held = Some(p),
                },
                _ => {
                    return Err(reply(
                        503,
                        TEXT,
                        "busy: too many request bodies being read\n",
                    ))
                }
            }
            buf.extend_from_slice(data);
        }
        Ok(buf)
    }

    /// Why the cache should not be trusted now (`None`: it can).
    pub fn unready(&self) -> Option<String> {
        let bad: Vec<String> = Kind::ALL
            .iter()
            .filter(|k| self.status.of(**k).state() != "ok")
            .map(|k| format!("the {} watch is {}", k.as_str(), self.status.of(*k).state()))
            .collect();
        (!bad.is_empty()).then(|| bad.join(", "))
    }

    /// `/metrics`, Prometheus' text format.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut o = String::with_capacity(4096);
        let _ = writeln!(
            o,
            "# HELP qoslet_extender_request_seconds Time to answer a filter or prioritize request (body read, decoded, answered).\n\
             # TYPE qoslet_extender_request_seconds histogram"
        );
        for (verb, h) in [
            ("filter", &self.stats.filter),
            ("prioritize", &self.stats.prioritize),
        ] {
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "qoslet_extender_request_seconds_bucket{{verb=\"{verb}\",le=\"{b}\"}} {}",
                    h.buckets[i].load(Ordering::Relaxed)
                );
            }
            let n = h.count.load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "qoslet_extender_request_seconds_bucket{{verb=\"{verb}\",le=\"+Inf\"}} {n}\n\
                 qoslet_extender_request_seconds_sum{{verb=\"{verb}\"}} {}\n\
                 qoslet_extender_request_seconds_count{{verb=\"{verb}\"}} {n}",
                h.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
            );
        }
        let _ = writeln!(
            o,
            "# HELP qoslet_extender_bad_requests_total Requests refused: malformed, too large, too slow, wrong method or path.\n\
             # TYPE qoslet_extender_bad_requests_total counter\n\
             qoslet_extender_bad_requests_total {}",
            self.stats.bad_requests.load(Ordering::Relaxed)
        );
        let sizes = self.ext.cache.read().map(|c| c.sizes()).unwrap_or_default();
        let _ = writeln!(
            o,
            "# HELP qoslet_extender_cache_objects What the cache holds, by kind (tentative: pods assumed on the node they scored best on).\n\
             # TYPE qoslet_extender_cache_objects gauge\n\
             qoslet_extender_cache_objects{{kind=\"nodes\"}} {}\n\
             qoslet_extender_cache_objects{{kind=\"nodemetrics\"}} {}\n\
             qoslet_extender_cache_objects{{kind=\"pods\"}} {}\n\
             qoslet_extender_cache_objects{{kind=\"tentative\"}} {}",
            sizes.nodes, sizes.node_metrics, sizes.pods, sizes.tentative
        );
        let _ = writeln!(
            o,
            "# HELP qoslet_extender_watch_up Each watch's state: 1 ok, 0 starting (not listed yet) or stale (the cache keeps what it knew).\n\
             # TYPE qoslet_extender_watch_up gauge"
        );
        for k in Kind::ALL {
            let ok = self.status.of(k).state() == "ok";
            let _ = writeln!(
                o,
                "qoslet_extender_watch_up{{watch=\"{}\",state=\"{}\"}} {}",
                k.as_str(),
                self.status.of(k).state(),
                u8::from(ok)
            );
        }
        for (name, help, f) in [
            (
                "qoslet_extender_watch_events_total",
                "Watch events applied to the cache (a relist's objects included).",
                (|w: &crate::watch::WatchStatus| w.events.load(Ordering::Relaxed))
                    as fn(&crate::watch::WatchStatus) -> u64,
            ),
            (
                "qoslet_extender_watch_relists_total",
                "Lists of a kind (at start, after a 410 or a broken watch).",
                |w| w.relists.load(Ordering::Relaxed),
            ),
            (
                "qoslet_extender_watch_errors_total",
                "Watch errors (retried with backoff).",
                |w| w.errors.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
            for k in Kind::ALL {
                let _ = writeln!(
                    o,
                    "{name}{{watch=\"{}\"}} {}",
                    k.as_str(),
                    f(self.status.of(k))
                );
            }
        }
        o
    }
}

/// Serves `front` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    front: Arc<Front>,
    mut shutdown: signal::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            warn!(
                max = MAX_CONNECTIONS,
                "at the connection cap: a new connection closed"
            );
            continue;
        };
        let _ = stream.set_nodelay(true);
        let front = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req| {
                let front = front.clone();
                async move { Ok::<_, Infallible>(front.respond(req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                debug!(error = %e, "connection ended");
            }
        });
    }
}
