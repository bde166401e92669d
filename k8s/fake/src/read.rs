//! Reads: a list or a get, and a watch from the history and the live
//! changes, each through its field selector.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::request::{api_version, is_collection, is_namespaced_collection, list_kind, matches};
use crate::{lock, ok, respond, status, Body, FakeApiServer};

/// One recorded change.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) collection: String,
    pub(crate) kind: &'static str,
    pub(crate) object: Value,
    /// The object before a MODIFIED: a watch with a field selector sees an
    /// object that comes to match as ADDED and one that stops matching as
    /// DELETED, as the API server's watch cache sends them.
    pub(crate) old: Option<Value>,
}

impl Change {
    /// The event a watch with `selector` gets, if any: an object leaving
    /// the selector is DELETED as it was before (with the new
    /// resourceVersion), as the API server's watch cache sends it.
    pub(crate) fn seen_through(&self, selector: Option<&String>) -> Option<Value> {
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

impl FakeApiServer {
    pub(crate) fn list_or_get(
        &self,
        path: &str,
        params: &BTreeMap<String, String>,
    ) -> Response<Body> {
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

    pub(crate) fn watch(&self, path: &str, params: &BTreeMap<String, String>) -> Response<Body> {
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
        // subscribed under the lock: a change applied after the backlog's
        // snapshot reaches this watch live (one in both is sent once: `last`)
        let mut live;
        // and an end of every watch from now on ends this one
        let ended = self.end.clone().notified_owned();
        let (backlog, expired, current) = {
            let s = lock(&self.state);
            live = self.changes.subscribe();
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
        let path = path.to_string();
        tokio::spawn(async move {
            tokio::pin!(ended);
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
                last = c.rv;
                if let Some(ev) = c.seen_through(selector.as_ref()) {
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
