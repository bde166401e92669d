//! An in-process fake API server for tests: it speaks the real HTTP/JSON
//! protocol a client (kube's watcher, kubectl) uses, over a TCP socket:
//!
//! * list (`GET <collection>`): `{"kind": "<Kind>List", "metadata":
//!   {"resourceVersion"}, "items"}`, filtered by a `fieldSelector` of
//!   `metadata.name=` / `spec.nodeName=`;
//! * watch (`?watch=true&resourceVersion=N`): one JSON event per line
//!   (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` when `allowWatchBookmarks`),
//!   from the history after N; N older than the compacted history is `ERROR`
//!   410 Expired (the client lists again); `timeoutSeconds` ends the watch;
//! * what tests make happen: objects applied and deleted (a global
//!   resourceVersion counter, as etcd's), every watch ended, the history
//!   compacted, the next requests failing with a status, the server gone
//!   (its socket closed) and back on the same port.
//!
//! * over TLS with a bearer token when started with [`FakeApiServer::start_tls`]
//!   (what a pod's in-cluster config reaches: `https://`, the service
//!   account's `ca.crt` and `token`): a request without the token is 401;
//! * RBAC when given a ClusterRole's rules ([`FakeApiServer::authorize`]):
//!   a request its rules do not allow is 403, as the API server's RBAC
//!   authorizer answers (verb from method and query, API group, resource
//!   and subresource from the path).
//!
//! No real kube-apiserver can run on the project's machines: this is what
//! the cluster side is tested against, with real object JSON as fixtures.
//!
//! Here: the server, the controls tests use, authentication, RBAC and the
//! dispatch; `read.rs` lists, gets and watches; `write.rs` takes status
//! writes and evictions; `request.rs` reads what a request names.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

mod read;
mod request;
mod write;

use read::Change;
use request::{allowed, attributes, is_collection, parse_query};
pub use write::merge_patch;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A request the server saw (method, path and query), for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// collection path -> name -> object
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    history: Vec<Change>,
    /// Watches may not start before this resourceVersion (410 Expired).
    compacted: u64,
    /// The next requests answered with this status (count, code).
    failing: Option<(usize, u16)>,
    seen: Vec<Seen>,
    /// Pods (`namespace/name`) a PodDisruptionBudget protects: their
    /// evictions are refused with 429.
    protected: std::collections::BTreeSet<String>,
    /// The bodies of the evictions accepted.
    evictions: Vec<Value>,
    /// Resources (collection paths) the server does not serve (a CRD not
    /// installed): every request under them is 404 naming nothing.
    unserved: std::collections::BTreeSet<String>,
    /// Status writes accepted: (when, path, body).
    status_writes: Vec<(std::time::Instant, String, Value)>,
    /// The next status writes answered 409 Conflict (as when another
    /// writer changed the object), however current their resourceVersion.
    conflicts: usize,
    /// The `Authorization: Bearer` token every request must carry (TLS mode).
    token: Option<String>,
    /// A ClusterRole's `rules`: when set, what they do not allow is 403.
    rbac: Option<Vec<Value>>,
    /// Requests refused by RBAC: (verb, group, resource, path).
    forbidden: Vec<(String, String, String, String)>,
}

/// The fake API server. Collections are paths such as
/// `/apis/slo.koordinator.sh/v1alpha1/nodeslos` or `/api/v1/nodes`.
pub struct FakeApiServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    /// Closing every watch: each watch stream ends when this fires.
    end: Arc<tokio::sync::Notify>,
    accept: Mutex<Option<JoinHandle<()>>>,
    /// The connections being served (closed when the server goes down: a
    /// client's pooled connection must not outlive it).
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// TLS mode: each connection is a TLS session first.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeApiServer {
    /// Serves on 127.0.0.1, a free port.
    pub async fn start() -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::new(listener, None, None)
    }

    /// Serves HTTPS on `bind` with the PEM certificate chain `cert` and its
    /// PKCS#8/RSA/SEC1 PEM key `key` (rustls' safe default versions, ring),
    /// and answers 401 to a
    /// request whose `Authorization` is not `Bearer <token>`: what a pod's
    /// service account reaches.
    pub async fn start_tls(bind: SocketAddr, cert: &[u8], key: &[u8], token: &str) -> Arc<Self> {
        use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .expect("the certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(key).expect("the key PEM");
        // ring's provider, as qoslet's kube client has it (deprecated for its
        // lack of post-quantum key exchange, which the client lacks too)
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the certificate and its key");
        let listener = TcpListener::bind(bind).await.expect("bind");
        Self::new(
            listener,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            Some(token.to_string()),
        )
    }

    fn new(
        listener: TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
        token: Option<String>,
    ) -> Arc<Self> {
        let addr = listener.local_addr().expect("addr");
        let (changes, _) = broadcast::channel(1024);
        let me = Arc::new(Self {
            addr,
            state: Arc::new(Mutex::new(State {
                token,
                ..State::default()
            })),
            changes,
            end: Arc::default(),
            accept: Mutex::new(None),
            conns: Arc::default(),
            tls,
        });
        me.serve(listener);
        me
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port` (`https://` in TLS mode).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig for this server in plain-HTTP mode (no credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\n",
            self.url()
        )
    }

    fn serve(self: &Arc<Self>, listener: TcpListener) {
        let me = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let me2 = me.clone();
                let tls = me.tls.clone();
                let conn = tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let me = me2.clone();
                        async move { Ok::<_, Infallible>(me.handle(req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                        Some(tls) => {
                            // a handshake that fails (a client refusing the
                            // certificate) ends the connection, as a server's would
                            if let Ok(stream) = tls.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                    .await;
                            }
                        }
                    }
                });
                let mut conns = me.conns.lock().unwrap_or_else(|e| e.into_inner());
                conns.retain(|c| !c.is_finished());
                conns.push(conn);
            }
        });
        *self.accept.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// From now on, RBAC: a request that `rules` (a ClusterRole's) do not
    /// allow is answered 403 Forbidden.
    pub fn authorize(&self, rules: &[Value]) {
        lock(&self.state).rbac = Some(rules.to_vec());
    }

    /// The requests RBAC refused: (verb, API group, resource, path).
    pub fn forbidden(&self) -> Vec<(String, String, String, String)> {
        lock(&self.state).forbidden.clone()
    }

    /// The server goes away: its socket is closed and every watch ended.
    pub fn go_down(&self) {
        if let Some(t) = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            c.abort();
        }
        self.end_watches();
    }

    /// ... and comes back on the same port, with the same objects.
    pub async fn come_back(self: &Arc<Self>) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    /// Ends every watch now (as an API server does at its timeout or restart).
    pub fn end_watches(&self) {
        self.end.notify_waiters();
    }

    /// Forgets the history: a watch from an older resourceVersion gets 410.
    pub fn compact(&self) {
        let mut s = lock(&self.state);
        s.compacted = s.rv;
        s.history.clear();
    }

    /// The next `n` requests are answered with `code` (a Status).
    pub fn fail_next(&self, n: usize, code: u16) {
        lock(&self.state).failing = Some((n, code));
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }

    /// A PodDisruptionBudget now protects `namespace/name`: its evictions get
    /// 429, as the API server answers when a budget allows no disruption.
    pub fn protect(&self, namespace: &str, name: &str) {
        lock(&self.state)
            .protected
            .insert(format!("{namespace}/{name}"));
    }

    /// The eviction bodies accepted so far.
    pub fn evictions(&self) -> Vec<Value> {
        lock(&self.state).evictions.clone()
    }

    /// The server stops serving `collection` (its CRD removed).
    pub fn unserve(&self, collection: &str) {
        lock(&self.state).unserved.insert(collection.to_string());
    }

    /// Status writes accepted so far: (when, path, body).
    pub fn status_writes(&self) -> Vec<(std::time::Instant, String, Value)> {
        lock(&self.state).status_writes.clone()
    }

    /// The next `n` status writes get 409 Conflict.
    pub fn conflict_next(&self, n: usize) {
        lock(&self.state).conflicts = n;
    }

    /// The objects of `collection` (namespaced ones keyed `namespace/name`).
    pub fn list(&self, collection: &str) -> Vec<Value> {
        lock(&self.state)
            .objects
            .get(collection)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Creates or replaces `object` in `collection` (keyed by its
    /// `metadata.name`, or `namespace/name` when it has a namespace: pods live
    /// in `/api/v1/pods`), with a new resourceVersion; returns the object as
    /// stored.
    pub fn apply(&self, collection: &str, object: Value) -> Value {
        self.store(&mut lock(&self.state), collection, object)
    }

    /// [`apply`](Self::apply) under the caller's lock: a write that reads
    /// the stored object, checks it and stores the result holds the lock
    /// throughout, as the API server's storage makes a write atomic.
    fn store(&self, s: &mut State, collection: &str, mut object: Value) -> Value {
        s.rv += 1;
        let rv = s.rv;
        let name = key_of(&object);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}-{rv}", name.replace('/', "-")));
        }
        let old = s
            .objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, object.clone());
        let c = Change {
            rv,
            collection: collection.to_string(),
            kind: if old.is_some() { "MODIFIED" } else { "ADDED" },
            object: object.clone(),
            old,
        };
        s.history.push(c.clone());
        // sent under the lock: watches get changes in resourceVersion order
        // (two writers at once would otherwise race, and a watch drops what
        // comes after a newer change), and a watch subscribing under it
        // gets each change either in its backlog or live
        let _ = self.changes.send(c);
        object
    }

    /// Deletes `name` from `collection` (a DELETED event with a new resourceVersion).
    pub fn delete(&self, collection: &str, name: &str) {
        let mut s = lock(&self.state);
        let Some(mut object) = s.objects.get_mut(collection).and_then(|m| m.remove(name)) else {
            return;
        };
        s.rv += 1;
        let rv = s.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let c = Change {
            rv,
            collection: collection.to_string(),
            kind: "DELETED",
            object,
            old: None,
        };
        s.history.push(c.clone());
        // (under the lock, as in apply)
        let _ = self.changes.send(c);
    }

    /// The stored object, if any.
    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        lock(&self.state)
            .objects
            .get(collection)
            .and_then(|m| m.get(name))
            .cloned()
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let method = req.method().to_string();
        {
            let mut s = lock(&self.state);
            if let Some(token) = &s.token {
                let bearer = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                if bearer != Some(token.as_str()) {
                    return status(401, "Unauthorized", "Unauthorized");
                }
            }
            // seen: authenticated requests (what RBAC then refuses included)
            s.seen.push(Seen {
                method: method.clone(),
                path: path.clone(),
                query: query.clone(),
            });
            if let Some(rules) = &s.rbac {
                let (verb, group, resource) = attributes(&method, &path, &query);
                if !allowed(rules, &verb, &group, &resource) {
                    let msg =
                        format!("cannot {verb} resource \"{resource}\" in API group \"{group}\"");
                    s.forbidden.push((verb, group, resource, path.clone()));
                    return status(403, &msg, "Forbidden");
                }
            }
            if let Some((n, code)) = s.failing {
                s.failing = (n > 1).then_some((n - 1, code));
                return status(code, "injected failure", "InternalError");
            }
            if s.unserved
                .iter()
                .any(|c| path == *c || path.starts_with(&format!("{c}/")))
            {
                return status(
                    404,
                    "the server could not find the requested resource",
                    "NotFound",
                );
            }
        }
        let params = parse_query(&query);
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if method == "GET" {
            if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
                return self.watch(&path, &params);
            }
            return self.list_or_get(&path, &params);
        }
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let Ok(body) = serde_json::from_slice::<Value>(&body) else {
            return status(400, "the body is not JSON", "BadRequest");
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
                self.evict(ns, name, &body)
            }
            ("PUT", [.., "status"]) => self.put_status(&path, body),
            ("PATCH", [.., "status"]) => self.patch_status(
                &path,
                content_type.as_deref(),
                params.get("fieldManager").map(String::as_str),
                body,
            ),
            ("POST", _) if is_collection(&path) => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if name.is_empty() {
                    return status(422, "metadata.name: Required value", "Invalid");
                }
                let mut s = lock(&self.state);
                let key = key_of(&body);
                if s.objects.get(&path).is_some_and(|m| m.contains_key(&key)) {
                    return status(409, &format!("\"{name}\" already exists"), "AlreadyExists");
                }
                let mut o = body;
                o["metadata"]["creationTimestamp"] = json!("2026-12-04T00:00:00Z");
                created(self.store(&mut s, &path, o))
            }
            ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
                if body["metadata"]["namespace"]
                    .as_str()
                    .is_some_and(|n| n != *ns)
                {
                    return status(
                        400,
                        "the namespace of the body does not match",
                        "BadRequest",
                    );
                }
                let mut o = body;
                o["metadata"]["namespace"] = json!(ns);
                let stored = self.apply("/api/v1/events", o);
                created(stored)
            }
            _ => status(405, "method not supported by the fake", "MethodNotAllowed"),
        }
    }
}

fn ok(v: Value) -> Response<Body> {
    respond(StatusCode::OK, v)
}

fn created(v: Value) -> Response<Body> {
    respond(StatusCode::CREATED, v)
}

/// An object's key in its collection: `namespace/name`, or `name`.
fn key_of(o: &Value) -> String {
    let name = o["metadata"]["name"].as_str().expect("metadata.name");
    match o["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn respond(code: StatusCode, v: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(
            serde_json::to_vec(&v).unwrap_or_default(),
        ))))
        .unwrap_or_else(|_| Response::new(BodyExt::boxed(Full::new(Bytes::new()))))
}

/// A Kubernetes `Status` response.
pub(crate) fn status(code: u16, message: &str, reason: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        ))))
        .unwrap_or_else(|_| Response::new(BodyExt::boxed(Full::new(Bytes::new()))))
}
