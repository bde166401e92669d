//! Writes: a status by PUT or merge patch (with the field ownership the
//! fake keeps), and an Eviction.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::{created, lock, ok, respond, status, Body, FakeApiServer, State};

impl FakeApiServer {
    /// A write of `<collection>/<name>/status`: the collection and the
    /// stored object, or the answer (404 for no such object, 409 for an
    /// injected conflict or a `metadata.resourceVersion` in `body` that is
    /// not the stored one).
    #[allow(clippy::result_large_err)] // a test server's answer, once per request
    fn status_target<'p>(
        s: &mut State,
        path: &'p str,
        body: &Value,
    ) -> Result<(&'p str, Value), Response<Body>> {
        let Some((coll, name)) = path
            .strip_suffix("/status")
            .and_then(|p| p.rsplit_once('/'))
        else {
            return Err(status(404, "not found", "NotFound"));
        };
        let Some(stored) = s.objects.get(coll).and_then(|m| m.get(name)).cloned() else {
            return Err(status(404, &format!("\"{name}\" not found"), "NotFound"));
        };
        let conflict = || {
            status(409, "the object has been modified; please apply your changes to the latest version and try again", "Conflict")
        };
        if s.conflicts > 0 {
            s.conflicts -= 1;
            return Err(conflict());
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
    pub(crate) fn put_status(&self, path: &str, body: Value) -> Response<Body> {
        let mut s = lock(&self.state);
        let (coll, mut stored) = match Self::status_target(&mut s, path, &body) {
            Ok(t) => t,
            Err(r) => return r,
        };
        stored["status"] = body["status"].clone();
        s.status_writes
            .push((std::time::Instant::now(), path.to_string(), body));
        ok(self.store(&mut s, coll, stored))
    }

    /// PATCH `<collection>/<name>/status` with a JSON merge patch (RFC 7386,
    /// `application/merge-patch+json`): only `status` taken; a
    /// `metadata.resourceVersion` in the patch is a precondition (409 when
    /// stale), as the API server makes it; injected conflicts apply.
    /// The field manager (`fieldManager`, else `unknown`) becomes the
    /// owner of every field the patch sets (`metadata.managedFields`, an
    /// `Update` of the `status` subresource) and no other manager owns them.
    pub(crate) fn patch_status(
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
        let mut s = lock(&self.state);
        let (coll, mut stored) = match Self::status_target(&mut s, path, &body) {
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
        s.status_writes
            .push((std::time::Instant::now(), path.to_string(), body));
        ok(self.store(&mut s, coll, stored))
    }

    /// policy/v1 Eviction, as the API server answers it: 404 without the
    /// pod, 409 when the UID precondition does not hold, 429 when a budget
    /// protects it, else 201 and the pod deleted gracefully
    /// (`deletionTimestamp` set: kubelet would stop it).
    pub(crate) fn evict(&self, ns: &str, name: &str, body: &Value) -> Response<Body> {
        let key = format!("{ns}/{name}");
        let mut s = lock(&self.state);
        let pod = s
            .objects
            .get("/api/v1/pods")
            .and_then(|m| m.get(&key))
            .cloned();
        let Some(pod) = pod else {
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
        if s.protected.contains(&key) {
            // as the API server answers it: the cause names the budget
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                "reason": "TooManyRequests", "code": 429,
                "details": {"causes": [{"reason": "DisruptionBudget",
                    "message": format!("The disruption budget {name}-pdb needs 1 healthy pods and has 1 currently")}]}});
            return respond(StatusCode::TOO_MANY_REQUESTS, body);
        }
        s.evictions.push(body.clone());
        let mut p = pod;
        p["metadata"]["deletionTimestamp"] = json!("2026-12-04T00:00:00Z");
        p["metadata"]["deletionGracePeriodSeconds"] = opts["gracePeriodSeconds"]
            .as_i64()
            .map_or(json!(30), |g| json!(g));
        self.store(&mut s, "/api/v1/pods", p);
        let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        created(ok)
    }
}

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
