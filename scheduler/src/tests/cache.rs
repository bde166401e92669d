//! The cache: bindings, moves, relists, tentative assignments, and the
//! NodeMetric read as LoadAware reads it.

use qoslet_colocation::Res;
use qoslet_kube_api::view::NodeMetricView;
use serde_json::json;

use crate::cache::Cache;
use crate::facts::metric_facts;
use crate::load::{name_key, uid_key, Assigned};

fn a(name: &str, at: i64) -> Assigned {
    Assigned {
        name: name_key("default", name),
        prod: false,
        estimate: Res::new(100, 1 << 20),
        assigned_at: at,
        deadline: 0,
    }
}

fn pods(c: &Cache, node: &str) -> usize {
    c.load(node).map_or(0, |l| l.pods())
}

#[test]
fn bindings_and_relists() {
    let mut c = Cache::new(false);
    c.set_pod("u1", "n1", a("p1", 1_000));
    // the same binding again, without a PodScheduled time: the first
    // assign time stays
    c.set_pod("u1", "n1", a("p1", 5_000));
    assert_eq!(
        c.load("n1")
            .unwrap()
            .pod(uid_key("u1"))
            .unwrap()
            .assigned_at,
        1_000
    );
    assert_eq!(c.sizes().pods, 1);
    // a relist: u1 is gone (deleted while the watch was down), u2 new; a
    // tentative assignment stays
    c.assume("u9", "n1", a("p9", 0), 100);
    c.replace_pods(vec![("u2".into(), "n2".into(), a("p2", 6_000))]);
    assert_eq!((pods(&c, "n1"), pods(&c, "n2"), c.sizes().pods), (1, 1, 1));
    assert_eq!(c.assumed("u9"), Some("n1"));
    c.forget("u9");
    assert!(c.load("n1").is_none(), "an empty load is dropped");
    // a deletion names the node of the pod's last state; a pod never bound
    // is nothing to the cache
    c.remove_pod("u3", None);
    c.remove_pod("u2", Some("n2"));
    c.remove_pod("u2", Some("n2"));
    assert_eq!(c.sizes().pods, 0);
    assert!(c.load("n2").is_none());
}

#[test]
fn tentative_assignments_end_at_binding_and_ttl() {
    let mut c = Cache::new(false);
    c.assume("u1", "n1", a("p1", 0), 100);
    assert_eq!((c.assumed("u1"), pods(&c, "n1")), (Some("n1"), 1));
    // bound elsewhere: the guess goes, the binding counts
    c.set_pod("u1", "n2", a("p1", 0));
    assert_eq!(
        (c.assumed("u1"), pods(&c, "n1"), pods(&c, "n2")),
        (None, 0, 1)
    );
    assert!(c.is_bound("u1", "n2"));
    // a pod bound there is not assumed there
    c.assume("u1", "n2", a("p1", 0), 100);
    assert_eq!(
        (c.assumed("u1"), pods(&c, "n2"), c.sizes().pods),
        (None, 1, 1)
    );
    // assumed twice: the later time holds
    c.assume("u9", "n1", a("p9", 0), 100);
    c.assume("u9", "n1", a("p9", 0), 200);
    assert!(c.has_expired(100));
    c.expire(150);
    assert_eq!(c.assumed("u9"), Some("n1"));
    assert!(!c.has_expired(199));
    c.expire(200);
    assert_eq!(
        (c.assumed("u9"), pods(&c, "n1"), c.sizes().tentative),
        (None, 0, 0)
    );
}

/// A pod bound on one node and (by a late guess) tentative on another,
/// deleted while the watch was down: the relist takes the binding away,
/// the guess ends at its time.
#[test]
fn a_relist_drops_a_binding_even_when_the_pod_is_assumed_elsewhere() {
    let mut c = Cache::new(false);
    c.set_pod("u1", "b", a("p1", 0));
    c.tentative_for_test("u1", "a", a("p1", 0), 100);
    c.replace_pods(vec![]);
    assert_eq!((pods(&c, "a"), pods(&c, "b"), c.sizes().pods), (1, 0, 0));
    c.expire(100);
    assert!(c.load("a").is_none());
}

#[test]
fn metrics_relisted_and_counted() {
    let mut c = Cache::new(false);
    let m = |cpu: i64| crate::load::MetricFacts {
        node_usage: Some(Res::new(cpu, 0)),
        report_interval_secs: 60,
        ..Default::default()
    };
    c.set_metric("n1", m(1));
    c.set_metric("n1", m(2));
    c.set_metric("n2", m(3));
    assert_eq!(c.sizes().node_metrics, 2);
    c.replace_metrics(vec![("n2".into(), m(4))]);
    assert_eq!(c.sizes().node_metrics, 1);
    assert!(c.load("n1").is_none());
    c.remove_metric("n2");
    c.remove_metric("n2");
    assert_eq!(c.sizes().node_metrics, 0);
}

/// Go skips empty usage lists: a pod reported with `podUsage: {}` has no
/// usage (its whole estimate counts), an empty window is no window; a
/// `status.nodeMetric` without `nodeUsage` is zero usage, not none.
#[test]
fn empty_usages_as_go_reads_them() {
    let m: NodeMetricView = serde_json::from_value(json!({
        "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
        "metadata": {"name": "n"}, "spec": {},
        "status": {"updateTime": "2026-12-07T10:00:00Z",
            "nodeMetric": {"aggregatedNodeUsages": [{"duration": "5m", "usage": {"p95": {}, "p99": {"resources": {"cpu": "2"}}}}]},
            "podsMetric": [{"namespace": "default", "name": "empty", "podUsage": {}},
                           {"namespace": "default", "name": "full", "podUsage": {"resources": {"cpu": "1", "memory": "1Gi"}}}]}}))
    .unwrap();
    let f = metric_facts(&m);
    assert_eq!(f.node_usage, Some(Res::default()));
    assert_eq!(f.report_interval_secs, 60);
    assert_eq!(f.aggregated.len(), 1);
    assert_eq!(f.aggregated[&("p99".to_string(), 300)], Res::new(2_000, 0));
    assert!(!f.pods.contains_key(&name_key("default", "empty")));
    assert_eq!(
        f.pods[&name_key("default", "full")],
        (Res::new(1_000, 1 << 30), false)
    );
    // without status.nodeMetric: no usage at all (the filter passes)
    let bare: NodeMetricView =
        serde_json::from_value(json!({"apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric", "metadata": {"name": "n"}, "spec": {}, "status": {}}))
        .unwrap();
    assert_eq!(metric_facts(&bare).node_usage, None);
}

/// Koordinator's fields are all `omitempty`: a NodeMetric without `spec` or
/// `status` is still one (a list that failed on it would fail whole).
#[test]
fn a_bare_nodemetric_decodes() {
    let m: Result<NodeMetricView, _> =
        serde_json::from_value(json!({"apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric", "metadata": {"name": "n"}}));
    assert!(m.is_ok(), "{m:?}");
}

/// Late answers around a bound pod: assumed on another node, then on its
/// own; the binding stays, counted once, when the other assumption ends.
#[test]
fn late_answers_never_turn_a_binding_tentative() {
    let mut c = Cache::new(false);
    c.set_pod("u1", "n1", a("p1", 0));
    c.assume("u1", "n2", a("p1", 0), 100);
    assert_eq!(c.assumed("u1"), Some("n2"));
    assert!(c.is_bound("u1", "n1"));
    c.assume("u1", "n1", a("p1", 0), 200);
    assert_eq!(c.assumed("u1"), Some("n2"), "its own node is not assumed");
    c.expire(300);
    assert!(c.is_bound("u1", "n1"));
    assert_eq!((pods(&c, "n1"), pods(&c, "n2")), (1, 0));
    assert_eq!(c.sizes().pods, 1);
    c.remove_pod("u1", Some("n1"));
    assert_eq!((pods(&c, "n1"), c.sizes().pods), (0, 0));
}
