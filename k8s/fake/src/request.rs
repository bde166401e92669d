//! What a request names: its RBAC attributes, its query, and the
//! collections, kinds and field selectors of its path.

use std::collections::BTreeMap;

use serde_json::Value;

/// The RBAC attributes of a request: (verb, API group, resource with its
/// subresource as `resource/sub`), as the API server's request-info resolver
/// gives them for `/api/v1/...` and `/apis/<group>/<version>/...`.
pub(crate) fn attributes(method: &str, path: &str, query: &str) -> (String, String, String) {
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
pub(crate) fn allowed(rules: &[Value], verb: &str, group: &str, resource: &str) -> bool {
    let has = |list: &Value, want: &str| {
        list.as_array()
            .is_some_and(|a| a.iter().any(|v| v == "*" || v == want))
    };
    rules.iter().any(|r| {
        has(&r["verbs"], verb) && has(&r["apiGroups"], group) && has(&r["resources"], resource)
    })
}

pub(crate) fn is_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["api", "v1", _] | ["apis", _, _, _])
}

/// A namespaced collection of the core group (`/api/v1/namespaces/<ns>/configmaps`):
/// listed and watched only (objects are put there with [`FakeApiServer::apply`]).
pub(crate) fn is_namespaced_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["api", "v1", "namespaces", _, _])
}

pub(crate) fn api_version(path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", v, ..] => v.to_string(),
        ["apis", g, v, ..] => format!("{g}/{v}"),
        _ => "v1".into(),
    }
}

pub(crate) fn list_kind(path: &str) -> String {
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
pub(crate) fn matches(o: &Value, selector: Option<&String>) -> bool {
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

pub(crate) fn parse_query(q: &str) -> BTreeMap<String, String> {
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
