//! The CRDs qoslet renders, and Koordinator's objects in them.

use super::*;

/// The committed CRDs are what `qoslet crd` prints now (regenerate:
/// `qoslet crd > deploy/kubernetes/crds/koordinator-slo.yaml`).
#[test]
fn the_committed_crds_are_current() {
    let want = crate::crd::crds_yaml();
    let have = include_str!("../../../deploy/kubernetes/crds/koordinator-slo.yaml");
    if have != want {
        let _ = std::fs::write(std::env::temp_dir().join("qoslet-crds.yaml"), &want);
        panic!("deploy/kubernetes/crds/koordinator-slo.yaml is stale: `qoslet crd` prints otherwise (written to $TMPDIR/qoslet-crds.yaml)");
    }
}

/// Koordinator's objects are accepted by the types: the default NodeSLO,
/// the status example of KUBE.md, and the status qoslet's reporter writes.
#[test]
fn koordinators_objects_fit_the_types() {
    let slo = nodeslo("node-1", 65);
    let o: crate::crd::NodeSLO = serde_json::from_value(slo).unwrap();
    assert!(o.spec.resource_qos_strategy.is_some());
    let example = json!({"updateTime":"2026-07-24T06:52:45Z",
     "nodeMetric":{"nodeUsage":{"resources":{"cpu":"2350m","memory":"10Gi"}},
       "aggregatedNodeUsages":[{"usage":{"avg":{"resources":{"cpu":"2","memory":"9Gi"}},"p50":{"resources":{}},
          "p90":{"resources":{}},"p95":{"resources":{}},"p99":{"resources":{}}},"duration":"5m0s"}],
       "systemUsage":{"resources":{"cpu":"300m","memory":"1Gi"}},
       "aggregatedSystemUsages":[{"usage":{"avg":{"resources":{}}},"duration":"5m0s"}]},
     "podsMetric":[{"name":"web-0","namespace":"default","podUsage":{"resources":{"cpu":"500m","memory":"512Mi"}},
       "priority":"koord-prod","qos":"LS"}],
     "hostApplicationMetric":[{"name":"nginx","usage":{"resources":{}},"priority":"koord-prod","qos":"LS"}],
     "prodReclaimableMetric":{"resource":{"resources":{"cpu":"1","memory":"2Gi"}}}});
    let s: crate::crd::NodeMetricStatus = serde_json::from_value(example).unwrap();
    assert_eq!(s.pods_metric[0].qos.as_deref(), Some("LS"));
    // what the reporter writes fits Koordinator's status exactly: read
    // into the types and written again, nothing lost or added
    let mut c = crate::nodemetric::Collected::default();
    c.pods.push(crate::nodemetric::PodUsage {
        namespace: "a".into(),
        name: "b".into(),
        usage: Default::default(),
        priority: Some("koord-batch"),
        qos: Some("BE"),
    });
    c.node_aggregated
        .push((Duration::from_secs(300), [Some(Default::default()); 5]));
    let written = crate::nodemetric::status_json(&c, "2026-12-04T10:00:00Z");
    let s: crate::crd::NodeMetricStatus = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(serde_json::to_value(&s).unwrap(), written);
    // the CRDs: cluster-scoped, the status subresource, served and stored v1alpha1
    use kube::CustomResourceExt;
    for crd in [crate::crd::NodeSLO::crd(), crate::crd::NodeMetric::crd()] {
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, "slo.koordinator.sh");
        let v = &crd.spec.versions[0];
        assert!(v.served && v.storage && v.subresources.as_ref().unwrap().status.is_some());
    }
}
