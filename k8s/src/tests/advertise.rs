//! Issue 46: this node's batch resources on its Node, against the fake API
//! server (merge patches of the status subresource with a resourceVersion
//! precondition, as the API server takes them). Koordinator's
//! TestPluginCalculate node and pods; the clock is the test's.

use std::sync::Arc;

use qoslet_colocation::batch::PodInput;
use qoslet_colocation::strategy::ColocationConfig;
use qoslet_colocation::Res;
use serde_json::{json, Value};

use super::fake_with_client;
use crate::advertise::{AdvertiseStatus, Advertiser, BatchMode};
use crate::sloconfig::SloConfig;
use crate::view::NodeView;

const NODES: &str = "/api/v1/nodes";
const G: i64 = 1_000_000_000;
const T0: i64 = 1_796_000_000;

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {"pool": "batch"}},
           "status": {"capacity": {"cpu": "100", "memory": "120G", "pods": "110"},
                      "allocatable": {"cpu": "100", "memory": "120G", "pods": "110"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

fn rfc3339(t: i64) -> String {
    let ts = k8s_openapi::jiff::Timestamp::from_second(t).unwrap();
    format!("{}", ts.strftime("%Y-%m-%dT%H:%M:%SZ"))
}

/// A report's status at `t`: system 7/12G, podA using `a_cpu` cores and 11G,
/// podB (BE) 10/10G, podC 22/22G.
fn figures(t: i64, a_cpu: f64) -> Arc<Value> {
    let pod = |name: &str, cpu: f64, mem: i64| json!({"namespace": "test", "name": name, "podUsage": {"resources": {"cpu": format!("{}m", (cpu * 1000.0) as i64), "memory": format!("{mem}G")}}});
    Arc::new(json!({"updateTime": rfc3339(t),
        "nodeMetric": {"nodeUsage": {"resources": {"cpu": "50", "memory": "55G"}}, "systemUsage": {"resources": {"cpu": "7", "memory": "12G"}}},
        "podsMetric": [pod("podA", a_cpu, 11), pod("podB", 10.0, 10), pod("podC", 22.0, 22)]}))
}

fn pods() -> Vec<PodInput> {
    let p = |name: &str, phase: &str, qos: Option<&str>, kube: &str, req: Res| PodInput {
        namespace: "test".into(),
        name: name.into(),
        phase: Some(phase.into()),
        qos_label: qos.map(str::to_string),
        kube_qos: Some(kube.into()),
        request: req,
        ..Default::default()
    };
    vec![
        p(
            "podA",
            "Running",
            Some("LS"),
            "Guaranteed",
            Res::new(20_000, 20 * G),
        ),
        p("podB", "Running", Some("BE"), "BestEffort", Res::default()),
        p(
            "podC",
            "Pending",
            None,
            "Guaranteed",
            Res::new(20_000, 40 * G),
        ),
    ]
}

fn config() -> ColocationConfig {
    ColocationConfig::parse(r#"{"enable": true, "cpuReclaimThresholdPercent": 65, "memoryReclaimThresholdPercent": 65}"#).unwrap()
}

fn read(c: &ColocationConfig) -> SloConfig {
    SloConfig::Read(Arc::new(c.clone()))
}

fn view(fake: &qoslet_kube_fake::FakeApiServer) -> Option<Arc<NodeView>> {
    fake.get(NODES, "node-1")
        .map(|v| Arc::new(serde_json::from_value(v).unwrap()))
}

fn shown(fake: &qoslet_kube_fake::FakeApiServer) -> (Value, Value) {
    let n = fake.get(NODES, "node-1").unwrap();
    let k = |f: &str| {
        json!([
            n["status"][f]["kubernetes.io/batch-cpu"],
            n["status"][f]["kubernetes.io/batch-memory"]
        ])
    };
    (k("capacity"), k("allocatable"))
}

#[tokio::test]
async fn the_node_gains_and_loses_the_keys_as_ls_load_moves() {
    let (fake, dir, client) = fake_with_client("advertise-load").await;
    fake.apply(NODES, node());
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::Auto, status.clone());
    let cfg = config();
    // Koordinator's case 1: 25 cores, 33G, in capacity and allocatable
    let e = tick_with(&mut a, &fake, &cfg, T0, 11.0, T0 + 5)
        .await
        .unwrap();
    assert_eq!(
        e.due.map(|d| d.to_string()).as_deref(),
        Some("nothing written since start")
    );
    let want = json!(["25000", "33000000000"]);
    assert_eq!(shown(&fake), (want.clone(), want));
    assert_eq!(status.state(), "advertising");
    let n = fake.get(NODES, "node-1").unwrap();
    assert_eq!(n["status"]["capacity"]["cpu"], "100", "kubelet's keys stay");
    assert_eq!(n["status"]["conditions"][0]["reason"], "KubeletReady");
    // the same load a minute later: within resourceDiffThreshold, no write
    let writes = fake.status_writes().len();
    let e = tick_with(&mut a, &fake, &cfg, T0 + 60, 11.5, T0 + 65)
        .await
        .unwrap();
    assert!(e.due.is_none());
    assert_eq!(fake.status_writes().len(), writes);
    // podA starts burning 30 cores: 100 - 35 - 7 - (30 + 22) = 6 cores
    let e = tick_with(&mut a, &fake, &cfg, T0 + 120, 30.0, T0 + 125)
        .await
        .unwrap();
    assert!(e
        .due
        .unwrap()
        .to_string()
        .starts_with("kubernetes.io/batch-cpu moves from 25000 to 6000"));
    assert_eq!(shown(&fake).1, json!(["6000", "33000000000"]));
    // the figures stop: 15 minutes on they are still trusted (the write due
    // every updateTimeThresholdSeconds keeps the values), a second later not
    let e = tick_with(&mut a, &fake, &cfg, T0 + 120, 30.0, T0 + 120 + 900)
        .await
        .unwrap();
    assert!(matches!(e.outcome, crate::batch::Outcome::Advertise(_)));
    assert_eq!(
        e.due.unwrap().to_string(),
        "the last write was 895 s ago (updateTimeThresholdSeconds)"
    );
    let e = tick_with(&mut a, &fake, &cfg, T0 + 120, 30.0, T0 + 120 + 901)
        .await
        .unwrap();
    assert!(matches!(
        e.outcome,
        crate::batch::Outcome::Remove { degraded: true, .. }
    ));
    // removed, not zeroed
    assert_eq!(shown(&fake), (json!([null, null]), json!([null, null])));
    let n = fake.get(NODES, "node-1").unwrap();
    assert!(n["status"]["allocatable"]
        .get("kubernetes.io/batch-cpu")
        .is_none());
    assert_eq!(n["status"]["allocatable"]["memory"], "120G");
    assert_eq!(status.state(), "removed");
    // co-location turned off in the colocation-config: nothing comes back
    let off = ColocationConfig::parse(r#"{"enable": false}"#).unwrap();
    let e = tick_with(&mut a, &fake, &off, T0 + 2000, 11.0, T0 + 2005)
        .await
        .unwrap();
    assert!(e.due.is_none() && e.next() == qoslet_colocation::sync::Advertised::NONE);
    // `on` writes whatever the config's enable says
    let mut on = Advertiser::new(
        a_client(&dir).await,
        "node-1".into(),
        BatchMode::On,
        Arc::new(AdvertiseStatus::default()),
    );
    tick_with(&mut on, &fake, &off, T0 + 2000, 11.0, T0 + 2005)
        .await
        .unwrap();
    assert_eq!(
        shown(&fake).1,
        json!(["20000", "33000000000"]),
        "cluster default 60 %"
    );
    std::fs::remove_dir_all(dir).ok();
}

async fn a_client(dir: &std::path::Path) -> kube::Client {
    crate::KubernetesConfig {
        enable: true,
        kubeconfig: Some(dir.join("kubeconfig")),
        node_name: Some("node-1".into()),
        ..Default::default()
    }
    .client()
    .await
    .unwrap()
}

#[tokio::test]
async fn kubelets_concurrent_status_update_is_not_lost_and_conflicts_are_retried() {
    let (fake, dir, client) = fake_with_client("advertise-conflict").await;
    fake.apply(NODES, node());
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    // the advertiser's view is the Node before kubelet's update
    let before = view(&fake);
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["conditions"][0]["reason"] = json!("KubeletReadyAgain");
    n["status"]["allocatable"]["memory"] = json!("100G");
    fake.apply(NODES, n);
    a.step(
        &read(&config()),
        Some(figures(T0, 11.0)),
        before,
        &pods(),
        T0,
    )
    .await
    .unwrap();
    let n = fake.get(NODES, "node-1").unwrap();
    assert_eq!(
        n["status"]["conditions"][0]["reason"], "KubeletReadyAgain",
        "kubelet's update kept"
    );
    assert_eq!(n["status"]["allocatable"]["memory"], "100G");
    // computed again on the Node read after the 409: kubelet now reserves
    // 20G, more than the system's 12G: 120 - 42 - 20 - 33
    assert_eq!(
        n["status"]["allocatable"]["kubernetes.io/batch-memory"],
        "25000000000"
    );
    // two injected conflicts more: still written
    fake.conflict_next(2);
    tick(&mut a, &fake, T0 + 60, 40.0).await.unwrap();
    assert_eq!(
        fake.get(NODES, "node-1").unwrap()["status"]["allocatable"]["kubernetes.io/batch-cpu"],
        "0"
    );
    let mut text = String::new();
    let mut o = qoslet_metrics::prom::Out::new(std::mem::take(&mut text));
    status.render(&mut o);
    let text = o.into_text();
    assert!(
        text.contains("qoslet_batch_resources_write_errors_total{kind=\"conflict\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("qoslet_batch_resources_writes_total{reason=\"moved\"} 1"),
        "{text}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// One step of `a` at `t` with the usual inputs: the test config, figures
/// of `load` cores at `t`, the fake's Node and the test pods.
async fn tick(
    a: &mut Advertiser,
    fake: &qoslet_kube_fake::FakeApiServer,
    t: i64,
    load: f64,
) -> Option<crate::batch::Explanation> {
    tick_with(a, fake, &config(), t, load, t).await
}

/// One step of `a` at `now` under `cfg`, with figures of `load` cores
/// reported at `at`, the fake's Node and the test pods.
async fn tick_with(
    a: &mut Advertiser,
    fake: &qoslet_kube_fake::FakeApiServer,
    cfg: &ColocationConfig,
    at: i64,
    load: f64,
    now: i64,
) -> Option<crate::batch::Explanation> {
    a.step(
        &read(cfg),
        Some(figures(at, load)),
        view(fake),
        &pods(),
        now,
    )
    .await
}

/// koord-manager's status update makes it the keys' field manager (a real
/// API server records it); on an API server that keeps no field managers,
/// values qoslet did not write stop it for good.
#[tokio::test]
async fn another_writer_is_detected_and_not_fought() {
    let (fake, dir, client) = fake_with_client("advertise-other").await;
    fake.apply(NODES, node());
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    tick(&mut a, &fake, T0, 11.0).await.unwrap();
    // koord-manager writes its own value: it owns the keys now
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["allocatable"]["kubernetes.io/batch-cpu"] = json!("12345");
    n["status"]["capacity"]["kubernetes.io/batch-cpu"] = json!("12345");
    n["metadata"]["managedFields"] = json!([{"manager": "koord-manager", "operation": "Update", "apiVersion": "v1",
        "subresource": "status", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:allocatable": {"f:kubernetes.io/batch-cpu": {}, "f:kubernetes.io/batch-memory": {}},
                                  "f:capacity": {"f:kubernetes.io/batch-cpu": {}, "f:kubernetes.io/batch-memory": {}}}}}]);
    fake.apply(NODES, n);
    let writes = fake.status_writes().len();
    for t in [T0 + 60, T0 + 400, T0 + 2000] {
        assert!(tick_with(&mut a, &fake, &config(), t, 30.0, t)
            .await
            .is_none());
    }
    assert_eq!(fake.status_writes().len(), writes, "never written again");
    assert_eq!(status.state(), "yielded");
    assert_eq!(shown(&fake).1[0], "12345");
    super::until(
        "the Event on the Node",
        std::time::Duration::from_secs(5),
        || {
            fake.list("/api/v1/events")
                .iter()
                .filter(|e| e["reason"] == "BatchResourcesYielded")
                .count()
                == 1
        },
    )
    .await;
    // an API server without field managers: a value qoslet did not write stops it for good
    let (fake, dir2, client) = fake_with_client("advertise-other2").await;
    fake.apply(NODES, node());
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    tick(&mut a, &fake, T0, 11.0).await.unwrap();
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["allocatable"]["kubernetes.io/batch-cpu"] = json!("12345");
    n["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    fake.apply(NODES, n);
    assert!(tick_with(&mut a, &fake, &config(), T0 + 60, 30.0, T0 + 60)
        .await
        .is_none());
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["allocatable"]
        .as_object_mut()
        .unwrap()
        .remove("kubernetes.io/batch-cpu");
    fake.apply(NODES, n);
    assert!(
        tick_with(&mut a, &fake, &config(), T0 + 120, 30.0, T0 + 120)
            .await
            .is_none()
    );
    assert_eq!(status.state(), "yielded");
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_dir_all(dir2).ok();
}

#[tokio::test]
async fn an_api_server_gone_for_a_minute_leaves_the_values_in_place() {
    let (fake, dir, client) = fake_with_client("advertise-gone").await;
    fake.apply(NODES, node());
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    tick(&mut a, &fake, T0, 11.0).await.unwrap();
    let last = view(&fake);
    let writes = fake.status_writes().len();
    fake.go_down();
    // 20 minutes of reports while it is gone, the load moving: every write
    // fails, and the figures being fresh, nothing is taken off (no degrade)
    for s in (60..=1200).step_by(60) {
        let e = a
            .step(
                &read(&config()),
                Some(figures(T0 + s, 30.0)),
                last.clone(),
                &pods(),
                T0 + s,
            )
            .await
            .unwrap();
        assert!(matches!(e.outcome, crate::batch::Outcome::Advertise(_)));
        assert_eq!(status.state(), "failing");
    }
    assert_eq!(fake.status_writes().len(), writes);
    fake.come_back().await;
    a.step(
        &read(&config()),
        Some(figures(T0 + 1260, 30.0)),
        last,
        &pods(),
        T0 + 1260,
    )
    .await
    .unwrap();
    // back: the new value, written once, not a removal
    assert_eq!(shown(&fake).1, json!(["6000", "33000000000"]));
    assert_eq!(fake.status_writes().len(), writes + 1);
    assert_eq!(status.state(), "advertising");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn keys_another_field_manager_owns_are_left_alone_from_the_start() {
    let (fake, dir, client) = fake_with_client("advertise-owner").await;
    let mut n = node();
    n["status"]["allocatable"]["kubernetes.io/batch-cpu"] = json!("5000");
    n["status"]["capacity"]["kubernetes.io/batch-cpu"] = json!("5000");
    n["metadata"]["managedFields"] = json!([
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "subresource": "status", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:status": {"f:allocatable": {"f:cpu": {}, "f:memory": {}}, "f:conditions": {}}}},
        {"manager": "koord-manager", "operation": "Update", "apiVersion": "v1", "subresource": "status", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:status": {"f:allocatable": {"f:kubernetes.io/batch-cpu": {}}, "f:capacity": {"f:kubernetes.io/batch-cpu": {}}}}}
    ]);
    fake.apply(NODES, n);
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    assert!(tick_with(&mut a, &fake, &config(), T0, 11.0, T0)
        .await
        .is_none());
    assert!(fake.status_writes().is_empty(), "not one write");
    assert_eq!(status.state(), "yielded");
    // qoslet's own writes make it the keys' owner, kubelet's fields stay kubelet's
    let (fake, dir2, client) = fake_with_client("advertise-owner2").await;
    fake.apply(NODES, node());
    let mut a = Advertiser::new(
        client,
        "node-1".into(),
        BatchMode::On,
        Arc::new(AdvertiseStatus::default()),
    );
    tick(&mut a, &fake, T0, 11.0).await.unwrap();
    let v = view(&fake).unwrap();
    assert_eq!(crate::advertise::other_owner(&v), None);
    let mf = fake.get(NODES, "node-1").unwrap()["metadata"]["managedFields"].clone();
    assert_eq!(mf[0]["manager"], "qoslet", "{mf:#}");
    assert!(
        !mf[0]["fieldsV1"]["f:status"]["f:allocatable"]["f:kubernetes.io/batch-memory"].is_null()
    );
    tick(&mut a, &fake, T0 + 60, 30.0).await.unwrap();
    assert_eq!(
        shown(&fake).1[0],
        "6000",
        "its own keys are no other writer's"
    );
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_dir_all(dir2).ok();
}

const CONFIGMAPS: &str = "/api/v1/namespaces/koordinator-system/configmaps";

fn configmap(colocation: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
           "data": {"colocation-config": colocation, "resource-threshold-config": "{\"clusterStrategy\": {\"enable\": false}}"}})
}

/// The whole loop as the agent runs it: the reporter's figures, the
/// ConfigMap followed, `auto` writing what its colocation-config says.
#[tokio::test]
async fn auto_follows_the_configmap_and_a_bad_value_keeps_the_last_good_one() {
    use std::time::Duration;
    let (fake, dir, client) = fake_with_client("advertise-auto").await;
    let mut n = node();
    n["status"]["capacity"] = json!({"cpu": "8", "memory": "16Gi"});
    n["status"]["allocatable"] = json!({"cpu": "8", "memory": "16Gi"});
    fake.apply(NODES, n);
    fake.apply(CONFIGMAPS, configmap(r#"{"enable": true}"#));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (node_cache, node_view) = tokio::sync::watch::channel(None);
    let (figures, figures_rx) = tokio::sync::watch::channel(None);
    let (colocation, colocation_rx) = tokio::sync::watch::channel(SloConfig::Unknown);
    let watching = colocation_rx.clone();
    let status = Arc::new(crate::status::ClusterStatus::default());
    let adv = Arc::new(AdvertiseStatus::default());
    let _ = status.batch.set(adv.clone());
    let store = qoslet_state::Store::default();
    let tasks = vec![
        tokio::spawn(crate::node::follow(
            client.clone(),
            "node-1".into(),
            qoslet_qos_engine::runner::Reserved::from_file(None),
            node_cache,
            status.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::nodemetric::report(
            client.clone(),
            "node-1".into(),
            Arc::new(super::nodemetric::Table(Some(super::nodemetric::figures()))),
            crate::nodemetric::ReportSettings {
                create: false,
                interval: Some(Duration::from_millis(300)),
                write: false,
                figures: Some(figures),
                colocation: None,
            },
            status.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::sloconfig::follow(
            client.clone(),
            "node-1".into(),
            Default::default(),
            colocation,
            qoslet_agent::hub::PolicyHub::new(None),
            node_view.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::advertise::advertise(
            Advertiser::new(client, "node-1".into(), BatchMode::Auto, adv.clone()),
            crate::advertise::Inputs {
                colocation: colocation_rx,
                figures: figures_rx,
                node: node_view,
                store,
            },
            stopped,
        )),
    ];
    let s = Duration::from_secs(10);
    let has = |f: &qoslet_kube_fake::FakeApiServer| {
        !f.get(NODES, "node-1").unwrap()["status"]["allocatable"]["kubernetes.io/batch-cpu"]
            .is_null()
    };
    // (the advertiser's state follows the API server's answer, which the
    // Node in the fake precedes)
    super::until("batch resources advertised", s, || {
        has(&fake) && adv.state() == "advertising"
    })
    .await;
    // a bad value: a Warning Event on the ConfigMap, the last good one stays
    fake.apply(CONFIGMAPS, configmap(r#"{"enable": fals"#));
    super::until("the Warning Event on the ConfigMap", s, || {
        fake.list("/api/v1/events").iter().any(|e| {
            e["reason"] == "ColocationCfgUnmarshalFailed"
                && e["involvedObject"]["kind"] == "ConfigMap"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("colocation-config"))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(has(&fake), "the last good colocation-config stays in force");
    assert!(
        matches!(&*watching.borrow(), SloConfig::Read(c) if c.cluster.enable == Some(true)),
        "the good value, not none"
    );
    // co-location turned off: the keys go
    fake.apply(CONFIGMAPS, configmap(r#"{"enable": false}"#));
    super::until("batch resources removed", s, || {
        !has(&fake) && adv.state() == "removed"
    })
    .await;
    let mut text = String::new();
    status.render(&mut text);
    assert!(
        text.contains("qoslet_batch_resources_state{state=\"removed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("qoslet_batch_resources_writes_total{reason=\"disappeared\"} 1"),
        "{text}"
    );
    stop.send(true).unwrap();
    for t in tasks {
        let _ = t.await;
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A qoslet restart: the keys its predecessor wrote stay until the first
/// figures (seconds to a minute later), and go only when none came for
/// degradeTimeMinutes.
#[tokio::test]
async fn a_restart_does_not_take_the_keys_off_before_the_first_figures() {
    let (fake, dir, client) = fake_with_client("advertise-restart").await;
    fake.apply(NODES, node());
    let mut first = Advertiser::new(
        client.clone(),
        "node-1".into(),
        BatchMode::Auto,
        Arc::new(AdvertiseStatus::default()),
    );
    tick_with(&mut first, &fake, &config(), T0, 11.0, T0)
        .await
        .unwrap();
    let writes = fake.status_writes().len();
    // the new process: no figures yet
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::Auto, status.clone());
    for t in [T0 + 30, T0 + 90, T0 + 30 + 900] {
        assert!(a
            .step(&read(&config()), None, view(&fake), &pods(), t)
            .await
            .is_none());
        assert_eq!(status.state(), "waiting");
    }
    assert_eq!(fake.status_writes().len(), writes);
    assert_eq!(shown(&fake).1, json!(["25000", "33000000000"]));
    // its own keys (field manager qoslet) are not another writer's: the first figures write
    let e = tick_with(&mut a, &fake, &config(), T0 + 60, 30.0, T0 + 60)
        .await
        .unwrap();
    assert_eq!(e.due.unwrap().to_string(), "nothing written since start");
    assert_eq!(shown(&fake).1, json!(["6000", "33000000000"]));
    // ... and with no figures at all for degradeTimeMinutes, the keys go
    let mut b = Advertiser::new(
        a_client(&dir).await,
        "node-1".into(),
        BatchMode::Auto,
        Arc::new(AdvertiseStatus::default()),
    );
    assert!(b
        .step(&read(&config()), None, view(&fake), &pods(), T0 + 100)
        .await
        .is_none());
    let e = b
        .step(&read(&config()), None, view(&fake), &pods(), T0 + 100 + 901)
        .await
        .unwrap();
    assert!(matches!(
        e.outcome,
        crate::batch::Outcome::Remove { degraded: true, .. }
    ));
    assert_eq!(shown(&fake).1, json!([null, null]));
    std::fs::remove_dir_all(dir).ok();
}

/// The rights the manifests grant (base ClusterRole + components/colocation),
/// enforced by the fake: a write and a conflict's read again need nothing more.
#[tokio::test]
async fn the_manifests_rbac_is_enough_through_a_conflict() {
    let (fake, dir, client) = fake_with_client("advertise-rbac").await;
    let mut rules = Vec::new();
    for doc in [
        include_str!("../../../deploy/kubernetes/base/rbac.yaml"),
        include_str!("../../../deploy/kubernetes/components/colocation/rbac.yaml"),
    ] {
        for part in doc.split("\n---\n") {
            let o: Value = serde_saphyr::from_str(part).unwrap();
            if o["kind"] == "ClusterRole" {
                rules.extend(o["rules"].as_array().unwrap().iter().cloned());
            }
        }
    }
    assert!(!rules.is_empty());
    fake.apply(NODES, node());
    fake.authorize(&rules);
    let mut a = Advertiser::new(
        client,
        "node-1".into(),
        BatchMode::On,
        Arc::new(AdvertiseStatus::default()),
    );
    let before = view(&fake);
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["conditions"][0]["reason"] = json!("KubeletReadyAgain");
    fake.apply(NODES, n);
    a.step(
        &read(&config()),
        Some(figures(T0, 11.0)),
        before,
        &pods(),
        T0,
    )
    .await
    .unwrap();
    assert_eq!(shown(&fake).1, json!(["25000", "33000000000"]));
    assert_eq!(fake.forbidden(), vec![]);
    std::fs::remove_dir_all(dir).ok();
}

/// Field managers as a real API server keeps them: qoslet's entry merged
/// into `ancient-changes` is still qoslet's; a Node created again (another
/// UID) has nothing of qoslet's; another writer that leaves (an operator
/// removes its keys) hands them back.
#[tokio::test]
async fn field_managers_ancient_changes_a_node_created_again_and_a_writer_that_leaves() {
    let (fake, dir, client) = fake_with_client("advertise-managers").await;
    let owned = |manager: &str| {
        json!({"manager": manager, "operation": "Update", "apiVersion": "v1", "subresource": "status", "fieldsType": "FieldsV1",
               "fieldsV1": {"f:status": {"f:allocatable": {"f:kubernetes.io/batch-cpu": {}, "f:kubernetes.io/batch-memory": {}}}}})
    };
    let mut n = node();
    n["status"]["allocatable"]["kubernetes.io/batch-cpu"] = json!("25000");
    n["metadata"]["managedFields"] = json!([owned("ancient-changes")]);
    fake.apply(NODES, n);
    let status = Arc::new(AdvertiseStatus::default());
    let mut a = Advertiser::new(client, "node-1".into(), BatchMode::On, status.clone());
    tick(&mut a, &fake, T0, 11.0).await.unwrap();
    assert_eq!(status.state(), "advertising");
    assert_eq!(shown(&fake).1, json!(["25000", "33000000000"]));
    // the Node deleted and created again by kubelet: no keys, no managers
    fake.delete(NODES, "node-1");
    fake.apply(NODES, node());
    tick(&mut a, &fake, T0 + 60, 11.0).await.unwrap();
    assert_eq!(status.state(), "advertising", "not another writer");
    assert_eq!(shown(&fake).1, json!(["25000", "33000000000"]));
    // an operator's kubectl patch takes the keys: qoslet stands back while it owns them
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["allocatable"]["kubernetes.io/batch-cpu"] = json!("1000");
    n["metadata"]["managedFields"] = json!([owned("kubectl-patch")]);
    fake.apply(NODES, n);
    assert!(
        tick_with(&mut a, &fake, &config(), T0 + 120, 11.0, T0 + 120)
            .await
            .is_none()
    );
    assert_eq!(status.state(), "yielded");
    // ... and the operator removes them: handed back
    let mut n = fake.get(NODES, "node-1").unwrap();
    n["status"]["allocatable"]
        .as_object_mut()
        .unwrap()
        .remove("kubernetes.io/batch-cpu");
    n["status"]["allocatable"]
        .as_object_mut()
        .unwrap()
        .remove("kubernetes.io/batch-memory");
    // (the operator's removal leaves no one owning the keys; kubelet's fields stay kubelet's)
    n["metadata"]["managedFields"] = json!([{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
        "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]);
    fake.apply(NODES, n);
    tick(&mut a, &fake, T0 + 180, 11.0).await.unwrap();
    assert_eq!(status.state(), "advertising");
    assert_eq!(shown(&fake).1, json!(["25000", "33000000000"]));
    std::fs::remove_dir_all(dir).ok();
}

/// `on` writes Koordinator's defaults where the ConfigMap cannot be read;
/// `auto` waits, as it does before the first read.
#[tokio::test]
async fn an_unreadable_configmap() {
    let (fake, dir, client) = fake_with_client("advertise-unreadable").await;
    fake.apply(NODES, node());
    let forbidden = SloConfig::Unreadable("configmaps is forbidden".into());
    let mut auto = Advertiser::new(
        client.clone(),
        "node-1".into(),
        BatchMode::Auto,
        Arc::new(AdvertiseStatus::default()),
    );
    assert!(auto
        .step(
            &forbidden,
            Some(figures(T0, 11.0)),
            view(&fake),
            &pods(),
            T0
        )
        .await
        .is_none());
    assert!(auto
        .step(
            &SloConfig::Unknown,
            Some(figures(T0, 11.0)),
            view(&fake),
            &pods(),
            T0
        )
        .await
        .is_none());
    assert!(fake.status_writes().is_empty());
    let mut on = Advertiser::new(
        client,
        "node-1".into(),
        BatchMode::On,
        Arc::new(AdvertiseStatus::default()),
    );
    assert!(on
        .step(
            &SloConfig::Unknown,
            Some(figures(T0, 11.0)),
            view(&fake),
            &pods(),
            T0
        )
        .await
        .is_none());
    on.step(
        &forbidden,
        Some(figures(T0, 11.0)),
        view(&fake),
        &pods(),
        T0,
    )
    .await
    .unwrap();
    // the defaults' 60 %: 100 - 40 - 7 - 33
    assert_eq!(shown(&fake).1, json!(["20000", "33000000000"]));
    std::fs::remove_dir_all(dir).ok();
}
