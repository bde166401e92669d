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

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One recorded change.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
    /// The object before a MODIFIED: a watch with a field selector sees an
    /// object that comes to match as ADDED and one that stops matching as
    /// DELETED, as the API server's watch cache sends them.
    old: Option<Value>,
}

impl Change {
    /// The event a watch with `selector` gets, if any: an object leaving
    /// the selector is DELETED as it was before (with the new
    /// resourceVersion), as the API server's watch cache sends it.
    fn seen_through(&self, selector: Option<&String>) -> Option<Value> {
        let now = matches(&self.object, selector);
        let before = self.old.as_ref().map(|o| matches(o, selector));
        let (kind, object) = match (self.kind, before, now) {
            ("MODIFIED", Some(false), true) => ("ADDED", self.object.clone()),
            ("MODIFIED", Some(true), false) => {
                let mut o = self.old.clone().unwrap_or_default();
                o["metadata"]["resourceVersion"] =
                    self.object["metadata"]["resourceVersion"].clone();
                ("DELETED", o)
            }
            (k, _, true) => (k, self.object.clone()),
            _ => return None,
        };
        Some(json!({"type": kind, "object": object}))
    }
}

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
    pub fn apply(&self, collection: &str, mut object: Value) -> Value {
        let mut s = lock(&self.state);
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
        drop(s);
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
        drop(s);
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
                if self.get(&path, &name).is_some() {
                    return status(409, &format!("\"{name}\" already exists"), "AlreadyExists");
                }
                let mut o = body;
                o["metadata"]["creationTimestamp"] = json!("2026-12-04T00:00:00Z");
                created(self.apply(&path, o))
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

    /// A write of `<collection>/<name>/status`: the collection and the
    /// stored object, or the answer (404 for no such object, 409 for an
    /// injected conflict or a `metadata.resourceVersion` in `body` that is
    /// not the stored one).
    #[allow(clippy::result_large_err)] // a test server's answer, once per request
    fn status_target<'p>(
        &self,
        path: &'p str,
        body: &Value,
    ) -> Result<(&'p str, Value), Response<Body>> {
        let Some((coll, name)) = path
            .strip_suffix("/status")
            .and_then(|p| p.rsplit_once('/'))
        else {
            return Err(status(404, "not found", "NotFound"));
        };
        let Some(stored) = self.get(coll, name) else {
            return Err(status(404, &format!("\"{name}\" not found"), "NotFound"));
        };
        let conflict = || {
            status(409, "the object has been modified; please apply your changes to the latest version and try again", "Conflict")
        };
        {
            let mut s = lock(&self.state);
            if s.conflicts > 0 {
                s.conflicts -= 1;
                return Err(conflict());
            }
        }
        let rv = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !rv.is_empty() && stored["metadata"]["resourceVersion"].as_str() != Some(rv) {
            return Err(conflict());
        }
        Ok((coll, stored))
    }

    /// PUT `<collection>/<name>/status`: optimistic concurrency on
    /// `metadata.resourceVersion` (409 when stale), only `status` taken
    /// (the spec stays as stored), a new resourceVersion.
    fn put_status(&self, path: &str, body: Value) -> Response<Body> {
        let (coll, mut stored) = match self.status_target(path, &body) {
            Ok(t) => t,
            Err(r) => return r,
        };
        stored["status"] = body["status"].clone();
        lock(&self.state)
            .status_writes
            .push((std::time::Instant::now(), path.to_string(), body));
        ok(self.apply(coll, stored))
    }

    /// PATCH `<collection>/<name>/status` with a JSON merge patch (RFC 7386,
    /// `application/merge-patch+json`): only `status` taken; a
    /// `metadata.resourceVersion` in the patch is a precondition (409 when
    /// stale), as the API server makes it; injected conflicts apply.
    /// The field manager (`fieldManager`, else `unknown`) becomes the
    /// owner of every field the patch sets (`metadata.managedFields`, an
    /// `Update` of the `status` subresource) and no other manager owns them.
    fn patch_status(
        &self,
        path: &str,
        content_type: Option<&str>,
        manager: Option<&str>,
        body: Value,
    ) -> Response<Body> {
        if content_type != Some("application/merge-patch+json") {
            return status(
                415,
                "the fake takes merge patches only",
                "UnsupportedMediaType",
            );
        }
        let (coll, mut stored) = match self.status_target(path, &body) {
            Ok(t) => t,
            Err(r) => return r,
        };
        if !body["status"].is_null() {
            merge_patch(&mut stored["status"], &body["status"]);
            own(
                &mut stored["metadata"],
                manager.unwrap_or("unknown"),
                &json!({"status": body["status"]}),
            );
        }
        lock(&self.state)
            .status_writes
            .push((std::time::Instant::now(), path.to_string(), body));
        ok(self.apply(coll, stored))
    }

    /// policy/v1 Eviction, as the API server answers it: 404 without the
    /// pod, 409 when the UID precondition does not hold, 429 when a budget
    /// protects it, else 201 and the pod deleted gracefully
    /// (`deletionTimestamp` set: kubelet would stop it).
    fn evict(&self, ns: &str, name: &str, body: &Value) -> Response<Body> {
        let key = format!("{ns}/{name}");
        let Some(pod) = self.get("/api/v1/pods", &key) else {
            return status(404, &format!("pods \"{name}\" not found"), "NotFound");
        };
        if body["kind"] != "Eviction" || body["apiVersion"] != "policy/v1" {
            return status(400, "not a policy/v1 Eviction", "BadRequest");
        }
        let opts = &body["deleteOptions"];
        if let Some(uid) = opts["preconditions"]["uid"].as_str() {
            if pod["metadata"]["uid"].as_str() != Some(uid) {
                return status(
                    409,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        pod["metadata"]["uid"].as_str().unwrap_or("")
                    ),
                    "Conflict",
                );
            }
        }
        if lock(&self.state).protected.contains(&key) {
            // as the API server answers it: the cause names the budget
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                "reason": "TooManyRequests", "code": 429,
                "details": {"causes": [{"reason": "DisruptionBudget",
                    "message": format!("The disruption budget {name}-pdb needs 1 healthy pods and has 1 currently")}]}});
            return respond(StatusCode::TOO_MANY_REQUESTS, body);
        }
        lock(&self.state).evictions.push(body.clone());
        let mut p = pod;
        p["metadata"]["deletionTimestamp"] = json!("2026-12-04T00:00:00Z");
        p["metadata"]["deletionGracePeriodSeconds"] = opts["gracePeriodSeconds"]
            .as_i64()
            .map_or(json!(30), |g| json!(g));
        self.apply("/api/v1/pods", p);
        let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        created(ok)
    }

    fn list_or_get(&self, path: &str, params: &BTreeMap<String, String>) -> Response<Body> {
        let s = lock(&self.state);
        if let Some(objs) = s.objects.get(path).or_else(|| {
            // a collection with nothing in it yet
            (is_collection(path) || is_namespaced_collection(path)).then_some(&EMPTY)
        }) {
            let items: Vec<&Value> = objs
                .values()
                .filter(|o| matches(o, params.get("fieldSelector")))
                .collect();
            let body = json!({
                "kind": list_kind(path),
                "apiVersion": api_version(path),
                "metadata": {"resourceVersion": s.rv.to_string()},
                "items": items,
            });
            return ok(body);
        }
        // a single object: <collection>/<name>
        if let Some((coll, name)) = path.rsplit_once('/') {
            if let Some(o) = s.objects.get(coll).and_then(|m| m.get(name)) {
                return ok(o.clone());
            }
            if is_collection(coll) {
                // as the API server names a missing object
                let plural = coll.rsplit('/').next().unwrap_or("");
                let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("{plural} \"{name}\" not found"), "reason": "NotFound",
                    "details": {"name": name, "kind": plural}, "code": 404});
                return respond(StatusCode::NOT_FOUND, body);
            }
        }
        status(
            404,
            "the server could not find the requested resource",
            "NotFound",
        )
    }

    fn watch(&self, path: &str, params: &BTreeMap<String, String>) -> Response<Body> {
        let from: u64 = params
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let selector = params.get("fieldSelector").cloned();
        let bookmarks = params
            .get("allowWatchBookmarks")
            .is_some_and(|b| b == "true");
        let timeout = params
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
        let line = |v: Value| {
            let mut b = serde_json::to_vec(&v).unwrap_or_default();
            b.push(b'\n');
            Ok(Frame::data(Bytes::from(b)))
        };
        let (backlog, expired, current) = {
            let s = lock(&self.state);
            if from != 0 && from < s.compacted {
                (vec![], true, s.rv)
            } else {
                (
                    s.history
                        .iter()
                        .filter(|c| c.rv > from && c.collection == path)
                        .cloned()
                        .collect::<Vec<_>>(),
                    false,
                    s.rv,
                )
            }
        };
        let mut live = self.changes.subscribe();
        let end = self.end.clone();
        let path = path.to_string();
        tokio::spawn(async move {
            let ended = end.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if expired {
                let _ = tx
                    .send(line(json!({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("too old resource version: {from} ({current})"),
                        "reason": "Expired", "code": 410}})))
                    .await;
                return;
            }
            let mut last = from;
            for c in backlog {
                if let Some(ev) = c.seen_through(selector.as_ref()) {
                    last = c.rv;
                    if tx.send(line(ev)).await.is_err() {
                        return;
                    }
                }
            }
            let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(3600)));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = &mut ended => return,
                    _ = &mut deadline => return,
                    _ = tick.tick(), if bookmarks => {
                        let b = json!({"type": "BOOKMARK", "object": {
                            "kind": list_kind(&path).trim_end_matches("List"),
                            "apiVersion": api_version(&path),
                            "metadata": {"resourceVersion": last.max(current).to_string()}}});
                        if tx.send(line(b)).await.is_err() {
                            return;
                        }
                    }
                    c = live.recv() => match c {
                        Ok(c) if c.collection == path && c.rv > last => {
                            last = c.rv;
                            if let Some(ev) = c.seen_through(selector.as_ref()) {
                                if tx.send(line(ev)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
        let stream = tokio_stream_of(rx);
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap_or_else(|_| status(500, "response", "InternalError"))
    }
}

static EMPTY: BTreeMap<String, Value> = BTreeMap::new();

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
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
/// Server-side field ownership, as far as the fake keeps it: `manager`
/// owns each leaf `patch` sets (a `null` leaf is owned by no one any more).
fn own(metadata: &mut Value, manager: &str, patch: &Value) {
    fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, bool)>) {
        match v {
            Value::Object(o) if !o.is_empty() => {
                for (k, v) in o {
                    path.push(format!("f:{k}"));
                    leaves(v, path, out);
                    path.pop();
                }
            }
            other => out.push((path.clone(), !other.is_null())),
        }
    }
    fn remove(tree: &mut Value, path: &[String]) {
        if let [first, rest @ ..] = path {
            if rest.is_empty() {
                if let Some(o) = tree.as_object_mut() {
                    o.remove(first);
                }
            } else if let Some(t) = tree.get_mut(first) {
                remove(t, rest);
                if t.as_object().is_some_and(|o| o.is_empty()) {
                    if let Some(o) = tree.as_object_mut() {
                        o.remove(first);
                    }
                }
            }
        }
    }
    let mut set = Vec::new();
    leaves(patch, &mut Vec::new(), &mut set);
    if !metadata["managedFields"].is_array() {
        metadata["managedFields"] = json!([]);
    }
    let entries = metadata["managedFields"].as_array_mut().expect("an array");
    if !entries
        .iter()
        .any(|e| e["manager"] == manager && e["subresource"] == "status")
    {
        entries.push(
            json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                            "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {}}),
        );
    }
    for e in entries.iter_mut() {
        let mine = e["manager"] == manager && e["subresource"] == "status";
        for (path, keep) in &set {
            if mine && *keep {
                let mut t = &mut e["fieldsV1"];
                for k in path {
                    if !t.is_object() {
                        *t = json!({});
                    }
                    t = t
                        .as_object_mut()
                        .expect("an object")
                        .entry(k.clone())
                        .or_insert(json!({}));
                }
            } else {
                remove(&mut e["fieldsV1"], path);
            }
        }
    }
    entries.retain(|e| e["fieldsV1"].as_object().is_some_and(|o| !o.is_empty()));
}

/// RFC 7386: objects merge key by key, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

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

/// The RBAC attributes of a request: (verb, API group, resource with its
/// subresource as `resource/sub`), as the API server's request-info resolver
/// gives them for `/api/v1/...` and `/apis/<group>/<version>/...`.
fn attributes(method: &str, path: &str, query: &str) -> (String, String, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _v, rest @ ..] => (String::new(), rest.to_vec()),
        ["apis", g, _v, rest @ ..] => (g.to_string(), rest.to_vec()),
        _ => (String::new(), Vec::new()),
    };
    let rest: Vec<&str> = match rest.as_slice() {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail.to_vec(),
        r => r.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [r] => (r.to_string(), false),
        [r, _name] => (r.to_string(), true),
        [r, _name, sub, ..] => (format!("{r}/{sub}"), true),
        _ => (String::new(), false),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named, watch) {
        ("GET", _, true) => "watch",
        ("GET", false, _) => "list",
        ("GET", true, _) => "get",
        ("POST", _, _) => "create",
        ("PUT", _, _) => "update",
        ("PATCH", _, _) => "patch",
        ("DELETE", true, _) => "delete",
        ("DELETE", false, _) => "deletecollection",
        _ => "",
    };
    (verb.to_string(), group, resource)
}

/// Whether a ClusterRole's `rules` allow `verb` on `group`/`resource`.
fn allowed(rules: &[Value], verb: &str, group: &str, resource: &str) -> bool {
    let has = |list: &Value, want: &str| {
        list.as_array()
            .is_some_and(|a| a.iter().any(|v| v == "*" || v == want))
    };
    rules.iter().any(|r| {
        has(&r["verbs"], verb) && has(&r["apiGroups"], group) && has(&r["resources"], resource)
    })
}

fn is_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["api", "v1", _] | ["apis", _, _, _])
}

/// A namespaced collection of the core group (`/api/v1/namespaces/<ns>/configmaps`):
/// listed and watched only (objects are put there with [`FakeApiServer::apply`]).
fn is_namespaced_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["api", "v1", "namespaces", _, _])
}

fn api_version(path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", v, ..] => v.to_string(),
        ["apis", g, v, ..] => format!("{g}/{v}"),
        _ => "v1".into(),
    }
}

fn list_kind(path: &str) -> String {
    let plural = path.trim_matches('/').rsplit('/').next().unwrap_or("");
    let kind = match plural {
        "nodes" => "Node",
        "pods" => "Pod",
        "nodeslos" => "NodeSLO",
        "nodemetrics" => "NodeMetric",
        "events" => "Event",
        "configmaps" => "ConfigMap",
        _ => "Object",
    };
    format!("{kind}List")
}

/// A field selector of `a.b=v` terms (`,`-joined), as the API server
/// supports for these resources.
fn matches(o: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| {
        // `f=v`, `f==v`, `f!=v`; a field that is absent is ""
        let (field, want, equal) = match term.split_once("!=") {
            Some((f, w)) => (f, w, false),
            None => match term.split_once('=') {
                Some((f, w)) => (f, w.trim_start_matches('='), true),
                None => return false,
            },
        };
        let mut v = o;
        for part in field.split('.') {
            v = &v[part];
        }
        (v.as_str().unwrap_or("") == want) == equal
    })
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((decode(k), decode(v)))
        })
        .collect()
}

/// Percent-decoding (query values: `metadata.name%3Dnode-1`).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_rbac_attributes_as_the_api_server_resolves_them() {
        let a = |m: &str, p: &str, q: &str| attributes(m, p, q);
        let t = |v: &str, g: &str, r: &str| (v.to_string(), g.to_string(), r.to_string());
        assert_eq!(
            a("GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dn"),
            t("list", "", "pods")
        );
        assert_eq!(
            a("GET", "/api/v1/pods", "watch=true&resourceVersion=5"),
            t("watch", "", "pods")
        );
        assert_eq!(
            a("POST", "/api/v1/namespaces/ns/pods/p/eviction", ""),
            t("create", "", "pods/eviction")
        );
        assert_eq!(
            a("POST", "/api/v1/namespaces/ns/events", ""),
            t("create", "", "events")
        );
        assert_eq!(
            a(
                "PUT",
                "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/n/status",
                ""
            ),
            t("update", "slo.koordinator.sh", "nodemetrics/status")
        );
        assert_eq!(
            a("GET", "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/n", ""),
            t("get", "slo.koordinator.sh", "nodemetrics")
        );
        let rules = [
            serde_json::json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}),
        ];
        assert!(allowed(&rules, "watch", "", "pods"));
        assert!(!allowed(&rules, "get", "", "pods"));
        assert!(!allowed(&rules, "create", "", "pods/eviction"));
    }
}
