//! qoslet's Kubernetes install, run for real (issue 45) on the VM test bed's
//! cgroup v2 + systemd node with containerd 1.7: the manifests as
//! `kubectl kustomize` renders them, the image `integration/image/build.sh`
//! builds, and the calls kubelet makes for the pod ([`kubelet`]: no kubelet
//! runs here). The API server the pod's service account reaches is the fake
//! one, over TLS with a bearer token, on the pod network's gateway.
//!
//! `integration/vm/suite.sh` prepares what these tests read from
//! `QOSLET_VM_DEPLOY`: `nri.yaml` (deploy/kubernetes/nri rendered),
//! `qoslet-image.tar`, `qoslet` (the release binary the image holds) and
//! `tls/` (a CA, and the API server's certificate for 10.88.0.1).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use qoslet_integration::kubelet::{self, ApiServer, KubeletPod, NodeInfo};
use qoslet_integration::node::{be_files, be_pod, uid, Node};
use qoslet_integration::process::{signal, wait_timeout};
use qoslet_integration::testbed::{container_config, Cleanup, Cri};
use qoslet_integration::{eventually, lazy_channel, read_trimmed, scratch};
use qoslet_kube_fake::FakeApiServer;
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest, GetStatusResponse};
use serde_json::{json, Value};

/// The pod network's gateway (integration/vm/guest/10-qoslet-vm.conflist,
/// `isGateway`): where the pod reaches the API server, as it would reach the
/// `kubernetes` Service.
const API_HOST: &str = "10.88.0.1";
const NODESLOS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";
const PODS: &str = "/api/v1/pods";
/// The admin socket the manifests' config names, on the host through the
/// `run` hostPath (what `kubectl exec ... qoslet status` talks to).
const ADMIN: &str = "/run/qoslet/admin.sock";

fn deploy() -> PathBuf {
    let d = PathBuf::from(std::env::var("QOSLET_VM_DEPLOY").unwrap_or_default());
    assert!(
        d.join("nri.yaml").is_file() && d.join("qoslet-image.tar").is_file(),
        "QOSLET_VM_DEPLOY ({}) lacks the rendered manifests and the image: \
         these tests run in the VM suite (integration/vm/suite.sh install)",
        d.display()
    );
    d
}

fn hostname() -> String {
    read_trimmed(Path::new("/proc/sys/kernel/hostname"))
}

fn mem_total() -> i64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: i64 = m
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib << 10
}

/// The node's InternalIP: its first global IPv4 address off the pod bridge.
fn node_ip() -> String {
    let o = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .expect("ip");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.contains(" cni0 ") && !l.contains(" veth"))
        .find_map(|l| l.split_whitespace().nth(3))
        .and_then(|a| a.split('/').next())
        .unwrap_or_default()
        .to_string()
}

/// The image imported as on an air-gapped node (`ctr images import`), then
/// the manifest's `image` found the way kubelet finds it for
/// `imagePullPolicy: IfNotPresent` (ImageStatus; absent, kubelet would pull
/// and fail here): its id, which kubelet passes to CreateContainer.
async fn import_image(node: &Node, cri: &mut Cri, tar: &Path, image: &str) -> String {
    let o = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&node.sock)
        .args([
            "-n",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
        ])
        .arg(tar)
        .output()
        .expect("ctr");
    assert!(
        o.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // containerd's CRI image store learns of the import from its events
    let what = format!(
        "the manifest's image {image} in CRI after the import (kustomize images: vs build.sh)"
    );
    let found = eventually(&what, Duration::from_secs(10), || {
        let mut cri = cri.clone();
        async move {
            cri.img
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .ok()?
                .into_inner()
                .image
        }
    })
    .await;
    found.id
}

async fn status() -> Option<GetStatusResponse> {
    AdminClient::new(lazy_channel(ADMIN))
        .get_status(GetStatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Registered with containerd's NRI (and synchronised), by a process up
/// less than `younger_than`.
async fn registered(younger_than: Duration) -> Option<GetStatusResponse> {
    let s = status().await?;
    let c = s.counters.as_ref()?;
    (s.mode == "nri"
        && c.nri_registrations >= 1
        && c.nri_events.get("synchronize").copied().unwrap_or(0) >= 1
        && s.uptime_seconds <= younger_than.as_secs())
    .then_some(s)
}

/// A process's resident memory in KiB: (anonymous, file-backed), from
/// `/proc/<pid>/status` (`RssAnon`, `RssFile`).
fn rss(pid: i32) -> Rss {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| -> u64 {
        st.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Rss {
        anon: field("RssAnon:"),
        file: field("RssFile:"),
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Rss {
    anon: u64,
    file: u64,
}

impl std::fmt::Display for Rss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} KiB ({} anonymous, {} file-backed)",
            self.anon + self.file,
            self.anon,
            self.file
        )
    }
}

/// The resident memory of every process in a container's cgroup.
fn container_rss(node: &Node, slice: &str, ctr: &str) -> Rss {
    let procs = read_trimmed(&node.cgroup_dir(slice, Some(ctr)).join("cgroup.procs"));
    procs
        .lines()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .map(rss)
        .fold(Rss::default(), |a, b| Rss {
            anon: a.anon + b.anon,
            file: a.file + b.file,
        })
}

/// A node where qoslet never ran: no state dir (checkpoint, metrics
/// snapshot, eviction history) and no admin socket of an earlier run.
fn fresh_node() {
    for d in ["/var/lib/qoslet", "/run/qoslet"] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// The effective capabilities of every process in a container's cgroup.
fn container_caps(node: &Node, slice: &str, ctr: &str) -> Vec<u64> {
    read_trimmed(&node.cgroup_dir(slice, Some(ctr)).join("cgroup.procs"))
        .lines()
        .filter_map(|p| {
            let st = std::fs::read_to_string(format!("/proc/{}/status", p.trim())).ok()?;
            let hex = st
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .collect()
}

/// The log's WARN and ERROR lines (a missing mount or privilege shows there).
fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

/// A host process killed when dropped (a failed test leaves no plugin
/// registered for the next test file).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A BestEffort pod (as the API server has it) on this node.
fn api_pod(name: &str, node: &str) -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "qoslet-e2e", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-07T10:00:00Z"},
        "spec": {"nodeName": node, "priority": 0, "terminationGracePeriodSeconds": 3,
                 "containers": [{"name": "batch", "image": "busybox", "resources": {}}]},
        "status": {"phase": "Running", "qosClass": "BestEffort"}
    })
}

/// A BE pod created straight through containerd (kubelet's path in NRI
/// mode), known to the API server.
async fn be(
    fake: Option<&FakeApiServer>,
    cri: &mut Cri,
    cleanup: &mut Cleanup,
    tag: &str,
) -> (String, String, String) {
    let (pod, ctr, slice) = be_pod(cri, tag).await;
    cleanup.pods.push(pod.clone());
    if let Some(f) = fake {
        let name = slice_name(&slice);
        f.apply(PODS, api_pod(&name, &hostname()));
    }
    (pod, ctr, slice)
}

/// The pod name [`be_pod`] gave (its slice carries it).
fn slice_name(slice: &str) -> String {
    slice
        .trim_start_matches("kubepods-besteffort-pod")
        .trim_end_matches(".slice")
        .to_string()
}

/// Isolated as qoslet isolates a BE pod with batch resources on this node:
/// the container's CFS quota from its batch-cpu limit (1 core), the pod's
/// slice SCHED_IDLE (the NodeSLO's BE cpuQOS).
fn isolated(node: &Node, slice: &str, ctr: &str) -> bool {
    let f = be_files(node, slice, ctr);
    f[0].1 == "100000 100000" && f[3].1 == "1"
}

/// The user's overlay (docs/deploy.md): the config file with a memory
/// threshold (kubelet's `evictionHard`) scoped to the pods' slice, on a node
/// of 640 MiB for the test.
fn with_eviction_threshold(config: &str) -> String {
    let from = "  evictionHard: {}\n";
    assert!(
        config.contains(from),
        "the NRI overlay's config file no longer has `{}`: update this test",
        from.trim()
    );
    config.replace(
        from,
        "  evictionHard:\n    memory.available: 300Mi\n  memoryCapacity: 640Mi\n  \
         cgroupScope: kubepods.slice\n  enforceNodeAllocatable: false\n",
    )
}

/// deploy/kubernetes/nri, as kubelet would run its DaemonSet's pod on this
/// node: it registers over the host's NRI socket through its hostPath mount,
/// reads this node's NodeSLO through its service account (TLS, token),
/// isolates a BE pod created before it (Synchronize) and one created after,
/// serves /healthz and /metrics on the pod's IP (the probes' port), keeps
/// working through a restart of its container, and evicts a BE pod through
/// the Eviction API under memory pressure. Figures: container start to NRI
/// registration, and the agent's RSS in its container next to the same
/// binary with the same config as a host process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_daemonset_runs_as_kubelet_would_run_it() {
    let node = Node::systemd_v2();
    assert_eq!(
        node.unit, "containerd.service",
        "the DaemonSet's paths are containerd 1.7's"
    );
    let deploy = deploy();
    fresh_node();
    let objects = kubelet::objects(&std::fs::read_to_string(deploy.join("nri.yaml")).unwrap());
    let mut direct = Cri::connect(&node.sock).await;
    let mut cleanup = Cleanup::new(&node.sock);
    let ds = kubelet::find(&objects, "DaemonSet", "qoslet");
    let spec_image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent",
        "an imported image is used only with IfNotPresent"
    );
    let image = import_image(
        &node,
        &mut direct,
        &deploy.join("qoslet-image.tar"),
        &spec_image,
    )
    .await;

    let tls = deploy.join("tls");
    let ca = std::fs::read(tls.join("ca.crt")).unwrap();
    let token = format!("qoslet-vm-token-{}", uid("t"));
    let api = ApiServer {
        host: API_HOST.into(),
        port: 443,
        ca_pem: ca,
        token: token.clone(),
    };
    let info = NodeInfo {
        name: hostname(),
        root: "/var/lib/kubelet".into(),
        memory_bytes: mem_total(),
        ip: node_ip(),
    };
    // kubelet makes its root dir; the DaemonSet mounts it (type Directory)
    std::fs::create_dir_all(&info.root).unwrap();
    let mut pod = KubeletPod::from_daemonset(&objects, "qoslet", info.clone(), api);
    assert_eq!(pod.qos_class(), "Burstable");
    cleanup.cgroups.push(pod.cgroup_parent());
    let config = {
        let cm = pod.configmap_mut("qoslet-config");
        let text = cm["data"]["qoslet.yaml"].as_str().unwrap().to_string();
        cm["data"]["qoslet.yaml"] = json!(with_eviction_threshold(&text));
        text
    };

    // a BE pod that runs before qoslet does
    let (_, before_ctr, before_slice) = be(None, &mut direct, &mut cleanup, "inb").await;
    assert!(
        !isolated(&node, &before_slice, &before_ctr),
        "no qoslet yet"
    );

    let sandbox = pod
        .run_sandbox(&mut direct)
        .await
        .unwrap_or_else(|e| panic!("kubelet could not start the DaemonSet's pod: {e}"));
    cleanup.pods.push(sandbox.clone());
    assert!(
        !pod.ip.is_empty(),
        "the pod has its own network (hostNetwork: false)"
    );
    // the API server, on the gateway now that the bridge has it
    let fake = FakeApiServer::start_tls(
        format!("{API_HOST}:443").parse().unwrap(),
        &std::fs::read(tls.join("apiserver.crt")).unwrap(),
        &std::fs::read(tls.join("apiserver.key")).unwrap(),
        &token,
    )
    .await;
    fake.apply(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": info.name},
               "status": {"capacity": {"cpu": "2", "memory": "2Gi"},
                          "allocatable": {"cpu": "2", "memory": "2Gi"}}}),
    );
    fake.apply(
        NODESLOS,
        json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
               "metadata": {"name": info.name},
               "spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": true}}}}}),
    );
    // the rendered ClusterRole is all the pod's service account may do
    let role = kubelet::find(&objects, "ClusterRole", "qoslet");
    fake.authorize(role["rules"].as_array().unwrap());
    fake.apply(PODS, pod.api_object());
    fake.apply(PODS, api_pod(&slice_name(&before_slice), &info.name));

    let started = Instant::now();
    let ctr = pod
        .start_container(&mut direct, "qoslet", &image, 0)
        .await
        .unwrap_or_else(|e| panic!("kubelet could not start the DaemonSet's pod: {e}"));
    let running = started.elapsed();
    let pod_slice = pod.cgroup_parent();
    let s = eventually("NRI registration", Duration::from_secs(60), || async {
        registered(started.elapsed() + Duration::from_secs(1)).await
    })
    .await;
    let to_register = started.elapsed();
    eprintln!(
        "figure: CreateContainer + StartContainer {} ms, then NRI registration {} ms later \
         (qoslet {})",
        running.as_millis(),
        (to_register - running).as_millis(),
        s.version
    );
    // the BE pod from before, by Synchronize; the NodeSLO through the
    // service account
    eventually(
        "the earlier BE pod isolated",
        Duration::from_secs(20),
        || async { isolated(&node, &before_slice, &before_ctr).then_some(()) },
    )
    .await;
    let s = eventually("the cluster side up", Duration::from_secs(30), || async {
        let s = status().await?;
        (s.policy_source == "cluster"
            && !s.cluster.is_empty()
            && s.cluster.iter().all(|w| w.state == "ok"))
        .then_some(s)
    })
    .await;
    eprintln!("cluster watches: {:?}", s.cluster);
    // the manifest's probes, as kubelet's prober sends them, on the pod's IP
    // (kubelet probes from the container's start: the startup probe must
    // pass within periodSeconds x failureThreshold of it, each answer within
    // timeoutSeconds)
    let startup = pod.http_probe("qoslet", "startupProbe");
    eventually("the startup probe", startup.deadline(), || async {
        (startup.run(&pod.ip) == Some(200)).then_some(())
    })
    .await;
    assert!(
        started.elapsed() < startup.deadline(),
        "the startup probe passed {:?} after the container started; kubelet kills it after {:?}",
        started.elapsed(),
        startup.deadline()
    );
    for which in ["readinessProbe", "livenessProbe"] {
        let p = pod.http_probe("qoslet", which);
        assert_eq!(p.run(&pod.ip), Some(200), "{which}: {p:?}");
    }
    // what Prometheus scrapes: the container's `metrics` port
    let (code, metrics) =
        kubelet::http_get(&pod.ip, startup.port, "/metrics", Duration::from_secs(5))
            .expect("/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("qoslet_nri_"), "{metrics:.2000}");

    // a BE pod created now: isolated at its creation
    let (_, after_ctr, after_slice) = be(Some(&fake), &mut direct, &mut cleanup, "ina").await;
    let f = be_files(&node, &after_slice, &after_ctr);
    assert!(
        isolated(&node, &after_slice, &after_ctr),
        "{f:?}\n{}",
        pod.log("qoslet", 0)
    );

    // the privileges it was given are the ones it has: the bounding set of
    // the manifest (ALL dropped, SYS_RESOURCE added), nothing more
    let caps = container_caps(&node, &pod_slice, &ctr);
    assert_eq!(
        caps,
        vec![1 << 24],
        "CapEff of the container's processes (CAP_SYS_RESOURCE = bit 24)"
    );

    // confined as containerd confines a container on an AppArmor node
    for pid in read_trimmed(&node.cgroup_dir(&pod_slice, Some(&ctr)).join("cgroup.procs")).lines() {
        let label = read_trimmed(Path::new(&format!("/proc/{}/attr/current", pid.trim())));
        assert_eq!(
            label, "cri-containerd.apparmor.d (enforce)",
            "AppArmor label of {pid}"
        );
    }

    // the agent's memory ten seconds after it registered
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed() - to_register))
        .await;
    let rss_container = container_rss(&node, &pod_slice, &ctr);

    // a restart of its container (kubelet after a failed liveness probe)
    pod.stop_container(&mut direct, &ctr).await;
    let log0 = pod.log("qoslet", 0);
    assert!(
        log0.contains("final checkpoint written"),
        "qoslet did not stop cleanly on kubelet's SIGTERM:\n{log0}"
    );
    // a mount, a path or a privilege the manifest lacks shows as a warning
    assert!(
        warnings(&log0).is_empty(),
        "warnings in the pod's log:\n{log0}"
    );
    // a BE pod created while it is down: isolated once it is back (Synchronize)
    let (_, down_ctr, down_slice) = be(Some(&fake), &mut direct, &mut cleanup, "ind").await;
    assert!(
        !isolated(&node, &down_slice, &down_ctr),
        "no qoslet while it restarts"
    );
    let restarted = Instant::now();
    let ctr1 = pod
        .start_container(&mut direct, "qoslet", &image, 1)
        .await
        .unwrap_or_else(|e| panic!("the restarted container: {e}"));
    eventually(
        "NRI registration after the restart",
        Duration::from_secs(60),
        || async { registered(restarted.elapsed() + Duration::from_secs(1)).await },
    )
    .await;
    eventually(
        "the BE pod created while qoslet was down isolated",
        Duration::from_secs(20),
        || async { isolated(&node, &down_slice, &down_ctr).then_some(()) },
    )
    .await;
    let (_, again_ctr, again_slice) = be(Some(&fake), &mut direct, &mut cleanup, "inr").await;
    assert!(
        isolated(&node, &again_slice, &again_ctr),
        "{:?}\n{}",
        be_files(&node, &again_slice, &again_ctr),
        pod.log("qoslet", 1)
    );

    // memory pressure: a BE pod grows 320 MiB of a 640 MiB node whose
    // threshold is 300 MiB available: evicted through the Eviction API
    let hog_name = uid("inh");
    let hog_slice = Node::slice("besteffort", &hog_name);
    let hog_cfg = qoslet_integration::node::classed(&hog_name, &hog_slice, "BE", None);
    let hog = direct.run_pod(&hog_cfg).await.unwrap();
    cleanup.pods.push(hog.clone());
    fake.apply(PODS, api_pod(&hog_name, &info.name));
    let c = direct
        .create(
            &hog,
            &hog_cfg,
            container_config(
                "batch",
                "x=$(head -c 335544320 /dev/zero | tr '\\0' a); while true; do sleep 0.2; done",
                None,
            ),
        )
        .await
        .unwrap();
    direct.start(&c).await.unwrap();
    let evicted = eventually(
        "the BE pod evicted through the API",
        Duration::from_secs(90),
        || async { fake.evictions().into_iter().next() },
    )
    .await;
    assert_eq!(
        evicted["metadata"]["name"],
        json!(hog_name),
        "{evicted}\n{}",
        pod.log("qoslet", 1)
    );
    assert_eq!(evicted["metadata"]["namespace"], "qoslet-e2e");
    let t = Instant::now();
    while !fake
        .list("/api/v1/events")
        .iter()
        .any(|e| e["involvedObject"]["name"] == hog_name.as_str() && e["reason"] == "Evicted")
    {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no Evicted Event on the pod; refused by RBAC: {:?}; seen: {:?}\n{}",
            fake.forbidden(),
            fake.seen()
                .iter()
                .filter(|s| s.method != "GET")
                .collect::<Vec<_>>(),
            pod.log("qoslet", 1)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // kubelet then kills it
    direct.remove_pod(&hog).await;
    fake.delete(PODS, &hog_name);
    let rss_after = container_rss(&node, &pod_slice, &ctr1);
    assert_eq!(
        fake.forbidden(),
        vec![],
        "requests the ClusterRole does not allow"
    );

    // the pod deleted; the same binary and config as a host process
    pod.stop_container(&mut direct, &ctr1).await;
    pod.remove(&mut direct).await;
    let host_rss = host_process_rss(&deploy, &pod, &config, &fake, &token).await;
    eprintln!(
        "figure: agent RSS 10 s after registration: {rss_container} in its container, \
         {host_rss} as a host process (same binary, same config); {rss_after} in the \
         container after the eviction"
    );
    drop(cleanup);
}

/// `qoslet nri` from the image's own binary, on the host, with the pod's
/// config (the cluster reached through a kubeconfig with the same CA and
/// token): its RSS ten seconds after it registered.
async fn host_process_rss(
    deploy: &Path,
    pod: &KubeletPod,
    config: &str,
    fake: &FakeApiServer,
    token: &str,
) -> Rss {
    let dir = scratch("install-host");
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, &pod.api.ca_pem).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: vm\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: vm\n  user:\n    token: {token}\ncontexts:\n- name: vm\n  \
             context:\n    cluster: vm\n    user: vm\ncurrent-context: vm\n",
            fake.url(),
            ca.display()
        ),
    )
    .unwrap();
    let mut yaml = with_eviction_threshold(config);
    for (from, to) in [
        (
            "  # nodeName: from $NODE_NAME (the pod's spec.nodeName)\n",
            format!("  nodeName: {}\n", pod.node.name),
        ),
        (
            "  # kubeconfig: unset = the pod's service account (qoslet-system/qoslet)\n",
            format!("  kubeconfig: {}\n", kubeconfig.display()),
        ),
    ] {
        assert!(
            yaml.contains(from),
            "the config file lacks `{}`",
            from.trim()
        );
        yaml = yaml.replace(from, &to);
    }
    let file = dir.join("qoslet.yaml");
    std::fs::write(&file, yaml).unwrap();
    let log = std::fs::File::create(dir.join("qoslet.log")).unwrap();
    // from the guest's own disk, as the image's layer is (not the 9p share,
    // whose pages would count differently)
    let bin = dir.join("qoslet");
    std::fs::copy(deploy.join("qoslet"), &bin).unwrap();
    // a state dir of its own: it does not start from the container's
    // checkpoint and metrics snapshot
    let mut child = Reaped(
        std::process::Command::new(&bin)
            .args(["nri", "--config"])
            .arg(&file)
            .arg(format!("--state-dir={}", dir.join("state").display()))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the release binary"),
    );
    let t = Instant::now();
    let up = eventually(
        "the host process registered",
        Duration::from_secs(60),
        || async { registered(t.elapsed() + Duration::from_secs(1)).await },
    )
    .await;
    let registered_after = t.elapsed();
    assert_eq!(up.mode, "nri");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss = rss(child.0.id() as i32);
    signal(child.0.id() as i32, libc::SIGTERM);
    assert!(
        wait_timeout(&mut child.0, Duration::from_secs(40)).is_some(),
        "qoslet did not stop on SIGTERM"
    );
    let log = std::fs::read_to_string(dir.join("qoslet.log")).unwrap_or_default();
    assert!(
        warnings(&log).is_empty(),
        "warnings as a host process:\n{log}"
    );
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "figure: the host process registered {} ms after its start",
        registered_after.as_millis()
    );
    rss
}

/// The test catches what the manifest lacks: the same DaemonSet without its
/// NRI socket mount starts (kubelet sees nothing wrong) but never registers:
/// live (a restart would not help) but not ready (`kubectl get ds` shows
/// it, a rollout stops on it), and its log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_nri_mount_the_daemonset_pod_never_registers() {
    let node = Node::systemd_v2();
    let deploy = deploy();
    fresh_node();
    let mut objects = kubelet::objects(&std::fs::read_to_string(deploy.join("nri.yaml")).unwrap());
    let ds = objects
        .iter_mut()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let mounts = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap();
    let before = mounts.len();
    mounts.retain(|m| m["name"] != "nri");
    assert_eq!(
        mounts.len(),
        before - 1,
        "the manifest mounts the NRI socket's directory"
    );
    let image_name = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string();
    let mut direct = Cri::connect(&node.sock).await;
    let mut cleanup = Cleanup::new(&node.sock);
    let image = import_image(
        &node,
        &mut direct,
        &deploy.join("qoslet-image.tar"),
        &image_name,
    )
    .await;
    let info = NodeInfo {
        name: hostname(),
        root: "/var/lib/kubelet".into(),
        memory_bytes: mem_total(),
        ip: node_ip(),
    };
    std::fs::create_dir_all(&info.root).unwrap();
    let api = ApiServer {
        host: API_HOST.into(),
        port: 443,
        ca_pem: std::fs::read(deploy.join("tls/ca.crt")).unwrap(),
        token: "unused".into(),
    };
    let mut pod = KubeletPod::from_daemonset(&objects, "qoslet", info, api);
    cleanup.cgroups.push(pod.cgroup_parent());
    let sandbox = pod.run_sandbox(&mut direct).await.unwrap();
    cleanup.pods.push(sandbox);
    let started = Instant::now();
    pod.start_container(&mut direct, "qoslet", &image, 0)
        .await
        .expect("kubelet starts it: nothing it checks is missing");
    let mut log = String::new();
    while started.elapsed() < Duration::from_secs(15) {
        assert!(
            registered(started.elapsed() + Duration::from_secs(1))
                .await
                .is_none(),
            "registered without the NRI socket"
        );
        log = pod.log("qoslet", 0);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        log.contains("NRI connect failed") && log.contains("/var/run/nri/nri.sock"),
        "the log says why:\n{log}"
    );
    let (live, ready) = (
        pod.http_probe("qoslet", "livenessProbe"),
        pod.http_probe("qoslet", "readinessProbe"),
    );
    assert_eq!(live.run(&pod.ip), Some(200), "live: {live:?}");
    assert_eq!(ready.run(&pod.ip), Some(503), "not ready: {ready:?}");
    let (_, why) = kubelet::http_get(&pod.ip, ready.port, &ready.path, ready.timeout).unwrap();
    assert!(why.contains("nri.sock"), "/readyz says why: {why}");
    pod.remove(&mut direct).await;
}

// ---------------------------------------------------------------------------------------
// Proxy mode: the installer DaemonSet (deploy/kubernetes/proxy), its install surviving a
// restart and a reboot, and the documented uninstall. Run by suite.sh in this order, the
// guest rebooted between the two (both #[ignore]: they change the node for the tests after).
// ---------------------------------------------------------------------------------------

/// What the test keeps across the reboot (the guest's /var/tmp is on its disk).
const KEEP: &str = "/var/tmp/qoslet-vm-install";
/// The host paths the installer writes under, and the uninstall puts back.
const TOUCHED: [&str; 5] = [
    "/usr/local/bin",
    "/etc/qoslet",
    "/etc/systemd/system",
    "/var/lib/qoslet",
    "/run/qoslet",
];

/// Every file, directory and link under `TOUCHED`: path -> (kind and mode,
/// content or link target), as the uninstall must leave them.
fn host_files() -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    fn walk(p: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        use std::os::unix::fs::MetadataExt;
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return;
        };
        let mode = format!(
            "{:o} {}:{}",
            m.permissions().mode() & 0o7777,
            m.uid(),
            m.gid()
        );
        let key = p.display().to_string();
        if m.file_type().is_symlink() {
            let t = std::fs::read_link(p).unwrap_or_default();
            out.insert(key, format!("link -> {}", t.display()));
        } else if m.is_dir() {
            out.insert(key, format!("dir {mode}"));
            let mut kids: Vec<_> = std::fs::read_dir(p)
                .map(|r| r.filter_map(|e| e.ok()).map(|e| e.path()).collect())
                .unwrap_or_default();
            kids.sort();
            for k in kids {
                walk(&k, out);
            }
        } else {
            let data = std::fs::read(p).unwrap_or_default();
            // FNV-1a of the content: a changed byte shows
            let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
            });
            out.insert(key, format!("file {mode} {} bytes {h:016x}", data.len()));
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for t in TOUCHED {
        walk(Path::new(t), &mut out);
    }
    out
}

fn systemctl_out(args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new("systemctl")
        .args(args)
        .output()
        .expect("systemctl");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).trim().to_string(),
    )
}

/// The CRI socket answers through qoslet: Version names containerd, and
/// ListPodSandbox answers.
async fn cri_through_qoslet() -> Result<String, String> {
    let sock = Path::new("/run/qoslet/qoslet.sock");
    if !sock.exists() {
        return Err("no /run/qoslet/qoslet.sock".into());
    }
    let mut cri = Cri::from_channel(lazy_channel(sock));
    let v = cri
        .rt
        .version(cri::VersionRequest::default())
        .await
        .map_err(|e| format!("Version: {e}"))?
        .into_inner();
    cri.rt
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .map_err(|e| format!("ListPodSandbox: {e}"))?;
    Ok(format!("{} {}", v.runtime_name, v.runtime_version))
}

/// deploy/kubernetes/proxy's installer pod, as kubelet would run it on this
/// node: it installs qoslet as a host service from its own image, ordered
/// after containerd, with kubelet's drop-in and the config in place;
/// systemctl shows it active, kubelet's exec readiness probe passes, the CRI
/// socket answers through it, and it survives `systemctl restart qoslet`.
/// The host's files before the install are kept for the uninstall's check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "changes the node: run by integration/vm/suite.sh, then the guest reboots"]
async fn proxy_installer_installs_qoslet_as_a_host_service() {
    let node = Node::systemd_v2();
    let deploy = deploy();
    fresh_node();
    let _ = std::fs::remove_dir_all(KEEP);
    std::fs::create_dir_all(KEEP).unwrap();
    let before = host_files();
    std::fs::copy(
        "/proc/sys/kernel/random/boot_id",
        Path::new(KEEP).join("boot_id"),
    )
    .unwrap();
    std::fs::write(
        Path::new(KEEP).join("before.json"),
        serde_json::to_string_pretty(&before).unwrap(),
    )
    .unwrap();
    assert!(
        !before.contains_key("/etc/systemd/system/qoslet.service"),
        "installed already"
    );

    let objects = kubelet::objects(&std::fs::read_to_string(deploy.join("proxy.yaml")).unwrap());
    let ds = kubelet::find(&objects, "DaemonSet", "qoslet-installer");
    let c0 = &ds["spec"]["template"]["spec"]["containers"][0];
    let mut direct = Cri::connect(&node.sock).await;
    let mut cleanup = Cleanup::new(&node.sock);
    let image = import_image(
        &node,
        &mut direct,
        &deploy.join("qoslet-image.tar"),
        c0["image"].as_str().unwrap(),
    )
    .await;
    // the API server where the host reaches it (QOSLET_API_SERVER "": the
    // kubernetes Service address the pod is given)
    let token = format!("qoslet-vm-token-{}", uid("p"));
    let tls = deploy.join("tls");
    let api = ApiServer {
        host: "127.0.0.1".into(),
        port: 6443,
        ca_pem: std::fs::read(tls.join("ca.crt")).unwrap(),
        token: token.clone(),
    };
    let fake = FakeApiServer::start_tls(
        "127.0.0.1:6443".parse().unwrap(),
        &std::fs::read(tls.join("apiserver.crt")).unwrap(),
        &std::fs::read(tls.join("apiserver.key")).unwrap(),
        &token,
    )
    .await;
    let info = NodeInfo {
        name: hostname(),
        root: "/var/lib/kubelet".into(),
        memory_bytes: mem_total(),
        ip: node_ip(),
    };
    fake.apply(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": info.name},
               "status": {"capacity": {"cpu": "2", "memory": "2Gi"},
                          "allocatable": {"cpu": "2", "memory": "2Gi"}}}),
    );
    let role = kubelet::find(&objects, "ClusterRole", "qoslet");
    fake.authorize(role["rules"].as_array().unwrap());
    std::fs::create_dir_all(&info.root).unwrap();
    let mut pod = KubeletPod::from_daemonset(&objects, "qoslet-installer", info.clone(), api);
    cleanup.cgroups.push(pod.cgroup_parent());
    let sandbox = pod
        .run_sandbox(&mut direct)
        .await
        .unwrap_or_else(|e| panic!("kubelet could not start the installer pod: {e}"));
    cleanup.pods.push(sandbox);
    let ctr = pod
        .start_container(&mut direct, "installer", &image, 0)
        .await
        .unwrap_or_else(|e| panic!("kubelet could not start the installer: {e}"));
    // kubelet's exec readiness probe: qoslet.service active, its socket there
    eventually(
        "the installer pod ready",
        Duration::from_secs(120),
        || async {
            (pod.exec_probe(&mut direct.clone(), &ctr, "installer", "readinessProbe")
                .await
                == Some(0))
            .then_some(())
        },
    )
    .await;
    let log = pod.log("installer", 0);
    assert!(log.contains("installed /usr/local/bin/qoslet"), "{log}");
    assert_eq!(
        std::fs::read(deploy.join("qoslet")).unwrap(),
        std::fs::read("/usr/local/bin/qoslet").unwrap(),
        "the image's binary on the host"
    );
    let (active, state) = systemctl_out(&["is-active", "qoslet.service"]);
    assert!(active, "qoslet.service {state}");
    let (_, after) = systemctl_out(&["show", "-p", "After", "--value", "qoslet.service"]);
    assert!(
        after.split_whitespace().any(|u| u == "containerd.service"),
        "After={after}"
    );
    let (_, enabled) = systemctl_out(&["is-enabled", "qoslet.service"]);
    assert_eq!(enabled, "enabled");
    assert!(Path::new("/etc/systemd/system/kubelet.service.d/20-qoslet.conf").is_file());
    let cfg = std::fs::read_to_string("/etc/qoslet/qoslet.yaml").unwrap();
    assert!(
        cfg.contains(&format!("{}:9316", info.ip)),
        "metricsListen on the node IP:\n{cfg}"
    );
    let v = eventually("CRI through qoslet", Duration::from_secs(30), || async {
        cri_through_qoslet().await.ok()
    })
    .await;
    assert!(v.starts_with("containerd"), "{v}");
    // the host's qoslet reaches the API server with the copied credentials
    eventually(
        "the host's qoslet on the API server",
        Duration::from_secs(60),
        || async {
            fake.seen()
                .iter()
                .any(|s| s.path == "/api/v1/pods")
                .then_some(())
        },
    )
    .await;

    // systemctl restart qoslet: back, the socket answers
    let (ok, _) = systemctl_out(&["restart", "qoslet.service"]);
    assert!(ok, "systemctl restart qoslet");
    eventually(
        "CRI through qoslet after a restart",
        Duration::from_secs(60),
        || async { cri_through_qoslet().await.ok() },
    )
    .await;
    assert_eq!(
        fake.forbidden(),
        vec![],
        "requests the ClusterRole does not allow"
    );

    // what must survive the reboot
    let installed = host_files();
    std::fs::write(
        Path::new(KEEP).join("installed.json"),
        serde_json::to_string_pretty(&installed).unwrap(),
    )
    .unwrap();
    // the pod goes (kubelet is not here after the reboot); qoslet.service stays
    pod.stop_container(&mut direct, &ctr).await;
    assert!(
        pod.log("installer", 0)
            .contains("qoslet.service keeps running"),
        "{}",
        pod.log("installer", 0)
    );
    pod.remove(&mut direct).await;
    assert!(systemctl_out(&["is-active", "qoslet.service"]).0);
}

/// After the guest rebooted: qoslet.service came back by itself (enabled,
/// ordered after containerd), the CRI socket answers through it, nothing
/// the install wrote was lost; then the documented uninstall (docs/deploy.md,
/// "Uninstalling", proxy mode) puts every file back as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by integration/vm/suite.sh after proxy_installer_installs_qoslet_as_a_host_service and a reboot"]
async fn proxy_install_survives_a_reboot_and_uninstalls_cleanly() {
    let _node = Node::systemd_v2();
    let read = |f: &str| -> std::collections::BTreeMap<String, String> {
        serde_json::from_str(
            &std::fs::read_to_string(Path::new(KEEP).join(f)).unwrap_or_else(|e| {
                panic!(
                    "{KEEP}/{f}: {e} (run proxy_installer_installs_qoslet_as_a_host_service first)"
                )
            }),
        )
        .unwrap()
    };
    let (before, installed) = (read("before.json"), read("installed.json"));
    assert_ne!(
        std::fs::read_to_string(Path::new(KEEP).join("boot_id")).unwrap(),
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap(),
        "the guest has not rebooted since the install"
    );
    let (_, boot) = systemctl_out(&[
        "show",
        "-p",
        "ActiveEnterTimestampMonotonic",
        "--value",
        "qoslet.service",
    ]);
    assert!(
        systemctl_out(&["is-active", "qoslet.service"]).0,
        "qoslet.service is not active after the reboot"
    );
    assert_ne!(boot, "0");
    let v = eventually(
        "CRI through qoslet after the reboot",
        Duration::from_secs(60),
        || async { cri_through_qoslet().await.ok() },
    )
    .await;
    assert!(v.starts_with("containerd"), "{v}");
    // nothing lost: what the install wrote is there, byte for byte (the
    // state dir's own files, which qoslet rewrites as it runs, and /run, a
    // tmpfs, aside)
    let now = host_files();
    for (path, what) in &installed {
        if (path.starts_with("/var/lib/qoslet/") && !path.starts_with("/var/lib/qoslet/kube"))
            || path.starts_with("/run/")
        {
            continue;
        }
        assert_eq!(now.get(path), Some(what), "{path} after the reboot");
    }

    // the documented uninstall, step by step
    let sh = |cmd: &str| {
        let o = std::process::Command::new("sh")
            .args(["-c", cmd])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    sh("rm /etc/systemd/system/kubelet.service.d/20-qoslet.conf && rmdir --ignore-fail-on-non-empty /etc/systemd/system/kubelet.service.d && systemctl daemon-reload");
    sh("systemctl disable --now qoslet");
    sh("/usr/local/bin/qoslet restore --config /etc/qoslet/qoslet.yaml");
    sh("rm -rf /usr/local/bin/qoslet* /etc/qoslet /etc/systemd/system/qoslet.service* /var/lib/qoslet /run/qoslet && systemctl daemon-reload");
    assert!(!systemctl_out(&["is-active", "qoslet.service"]).0);
    let after = host_files();
    let diff: Vec<String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: was {v}, now {:?}", after.get(k)))
        .chain(
            after
                .iter()
                .filter(|(k, _)| !before.contains_key(*k))
                .map(|(k, v)| format!("{k}: left behind ({v})")),
        )
        .collect();
    assert!(
        diff.is_empty(),
        "the host is not as it was:\n{}",
        diff.join("\n")
    );
    let _ = std::fs::remove_dir_all(KEEP);
}
