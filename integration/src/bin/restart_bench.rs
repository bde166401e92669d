//! Restart benchmark (issues 15 and 16): how long until a qoslet that starts
//! on a node with 500 pods / 1,500 containers answers `ListPods` complete.
//!
//! The runtime is a fake CRI server (no real containerd can hold 500 pods on a
//! 2-core test machine) that answers like containerd 1.6: verbose statuses
//! with containerd's `info` JSON (config, cgroup parent, resources, ~2 KiB
//! each), each after a configurable delay (default 1 ms, containerd's own cost
//! per verbose status on this machine is below that). Three starts of the real
//! qoslet binary, each timed from spawn to a complete `ListPods`:
//!
//! * cold: no checkpoint, everything from the runtime (2 listings + 2,000
//!   statuses, 8 at a time);
//! * warm: after a SIGTERM (final checkpoint written), with the checkpoint;
//! * kill -9: after SIGKILL, from the last checkpoint the 100 ms writer left.
//!
//! `restart_bench [--pods 500] [--containers-per-pod 3] [--delay-us 1000] [--runs 3]`

use std::time::{Duration, Instant};

use prost::Message;
use qoslet_integration::fake::{FakeBackend, Reply};
use qoslet_integration::process::QosletProcess;
use qoslet_integration::{channel, scratch};
use qoslet_proto::admin::{admin_client::AdminClient, ListPodsRequest};
use qoslet_proto::cri;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sandbox_id(i: u64) -> String {
    format!("{:064x}", 0x5b00_0000_u64 + i)
}

fn container_id(i: u64, j: u64) -> String {
    format!("{:064x}", 0xc000_0000_u64 + i * 16 + j)
}

/// containerd 1.6's verbose `info` for a sandbox (shape as on the test bed).
fn pod_info(i: u64) -> String {
    format!(
        r#"{{"pid":{pid},"processStatus":"running","netNamespaceClosed":false,"image":"registry.k8s.io/pause:3.6","snapshotKey":"{id}","snapshotter":"overlayfs","runtimeHandler":"","runtimeType":"io.containerd.runc.v2","runtimeOptions":null,"config":{{"metadata":{{"name":"pod-{i}","uid":"uid-{i}","namespace":"bench","attempt":0}},"hostname":"pod-{i}","log_directory":"/var/log/pods/bench_pod-{i}_uid-{i}","dns_config":{{"servers":["10.96.0.10"],"searches":["bench.svc.cluster.local","svc.cluster.local","cluster.local"],"options":["ndots:5"]}},"port_mappings":[],"labels":{{"app":"bench","io.kubernetes.pod.name":"pod-{i}","io.kubernetes.pod.namespace":"bench","io.kubernetes.pod.uid":"uid-{i}"}},"annotations":{{"kubernetes.io/config.seen":"2026-12-01T00:00:00Z","kubernetes.io/config.source":"api"}},"linux":{{"cgroup_parent":"/kubepods/burstable/poduid-{i}","security_context":{{"namespace_options":{{"network":0,"pid":1,"ipc":0}},"seccomp":{{"profile_type":1}}}},"overhead":{{}},"resources":{{"cpu_period":100000,"cpu_quota":300000,"cpu_shares":307,"memory_limit_in_bytes":201326592}}}}}}}}"#,
        pid = 1000 + i,
        id = sandbox_id(i),
    )
}

/// containerd 1.6's verbose `info` for a container.
fn container_info(i: u64, j: u64) -> String {
    format!(
        r#"{{"sandboxID":"{sb}","pid":{pid},"removing":false,"snapshotKey":"{id}","snapshotter":"overlayfs","runtimeType":"io.containerd.runc.v2","runtimeOptions":null,"config":{{"metadata":{{"name":"c{j}","attempt":0}},"image":{{"image":"sha256:{id}"}},"command":["/bin/sh","-c","sleep inf"],"envs":[{{"key":"KUBERNETES_SERVICE_HOST","value":"10.96.0.1"}},{{"key":"KUBERNETES_SERVICE_PORT","value":"443"}}],"mounts":[{{"container_path":"/var/run/secrets/kubernetes.io/serviceaccount","host_path":"/var/lib/kubelet/pods/uid-{i}/volumes/kubernetes.io~projected/kube-api-access","readonly":true}}],"labels":{{"io.kubernetes.container.name":"c{j}","io.kubernetes.pod.name":"pod-{i}","io.kubernetes.pod.namespace":"bench","io.kubernetes.pod.uid":"uid-{i}"}},"annotations":{{"io.kubernetes.container.hash":"1234abcd","io.kubernetes.container.restartCount":"0"}},"log_path":"c{j}/0.log","linux":{{"resources":{{"cpu_period":100000,"cpu_quota":100000,"cpu_shares":102,"memory_limit_in_bytes":67108864,"oom_score_adj":936}},"security_context":{{"namespace_options":{{"pid":1}},"run_as_user":{{}},"masked_paths":["/proc/acpi","/proc/kcore"],"readonly_paths":["/proc/bus","/proc/fs"],"seccomp":{{"profile_type":1}}}}}}}},"runtimeSpec":{{"ociVersion":"1.0.2-dev"}}}}"#,
        sb = sandbox_id(i),
        pid = 100_000 + i * 16 + j,
        id = container_id(i, j),
    )
}

/// CPU time (user + system) a process has used so far, in ms.
fn cpu_ms(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command name (which may hold spaces): state is field 3
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks * 1000.0 / 100.0 // USER_HZ
}

async fn complete(admin: &std::path::Path, pods: usize, containers: usize) -> bool {
    let Ok(mut c) = tokio::time::timeout(Duration::from_millis(500), async {
        AdminClient::new(channel(admin).await)
    })
    .await
    else {
        return false;
    };
    match c.list_pods(ListPodsRequest::default()).await {
        Ok(r) => {
            let r = r.into_inner();
            r.pods.len() == pods
                && r.pods.iter().map(|p| p.containers.len()).sum::<usize>() == containers
        }
        Err(_) => false,
    }
}

/// Time from `start` until ListPods is complete (polled every 2 ms).
async fn until_complete(
    admin: &std::path::Path,
    start: Instant,
    pods: usize,
    containers: usize,
) -> Duration {
    loop {
        if complete(admin, pods, containers).await {
            return start.elapsed();
        }
        if start.elapsed() > Duration::from_secs(60) {
            panic!("ListPods not complete after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods = arg("--pods", 500);
    let per_pod = arg("--containers-per-pod", 3);
    let delay = Duration::from_micros(arg("--delay-us", 1000));
    let runs = arg("--runs", 3);
    let containers = pods * per_pod;
    let dir = scratch("restart-bench");
    let items: Vec<cri::PodSandbox> = (0..pods)
        .map(|i| cri::PodSandbox {
            id: sandbox_id(i),
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("pod-{i}"),
                uid: format!("uid-{i}"),
                namespace: "bench".into(),
                attempt: 0,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 1,
            runtime_handler: String::new(),
            ..Default::default()
        })
        .collect();
    let listed: Vec<cri::Container> = (0..pods)
        .flat_map(|i| {
            (0..per_pod).map(move |j| cri::Container {
                id: container_id(i, j),
                pod_sandbox_id: sandbox_id(i),
                metadata: Some(cri::ContainerMetadata {
                    name: format!("c{j}"),
                    attempt: 0,
                }),
                state: cri::ContainerState::ContainerRunning as i32,
                created_at: 1,
                ..Default::default()
            })
        })
        .collect();
    let list_pods = cri::ListPodSandboxResponse { items }.encode_to_vec();
    let list_ctrs = cri::ListContainersResponse { containers: listed }.encode_to_vec();
    let backend = FakeBackend::start(&dir.join("runtime.sock"), move |s| match s.path.as_str() {
        "/runtime.v1.RuntimeService/ListPodSandbox" => Reply::ok(&list_pods).delayed(delay * 5),
        "/runtime.v1.RuntimeService/ListContainers" => Reply::ok(&list_ctrs).delayed(delay * 5),
        "/runtime.v1.RuntimeService/PodSandboxStatus" => {
            let req = cri::PodSandboxStatusRequest::decode(&s.body[5..]).unwrap();
            let i = u64::from_str_radix(&req.pod_sandbox_id, 16).unwrap() - 0x5b00_0000;
            Reply::ok(
                &cri::PodSandboxStatusResponse {
                    status: Some(cri::PodSandboxStatus {
                        id: req.pod_sandbox_id.clone(),
                        state: cri::PodSandboxState::SandboxReady as i32,
                        ..Default::default()
                    }),
                    info: [("info".to_string(), pod_info(i))].into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            )
            .delayed(delay)
        }
        "/runtime.v1.RuntimeService/ContainerStatus" => {
            let req = cri::ContainerStatusRequest::decode(&s.body[5..]).unwrap();
            let n = u64::from_str_radix(&req.container_id, 16).unwrap() - 0xc000_0000;
            Reply::ok(
                &cri::ContainerStatusResponse {
                    status: Some(cri::ContainerStatus {
                        id: req.container_id.clone(),
                        state: cri::ContainerState::ContainerRunning as i32,
                        ..Default::default()
                    }),
                    info: [("info".to_string(), container_info(n / 16, n % 16))].into(),
                }
                .encode_to_vec(),
            )
            .delayed(delay)
        }
        "/runtime.v1.RuntimeService/Version" => Reply::ok(
            &cri::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "fake".into(),
                runtime_version: "1.6".into(),
                runtime_api_version: "v1".into(),
            }
            .encode_to_vec(),
        ),
        _ => Reply::ok(b""),
    })
    .await;
    println!(
        "restart_bench: {pods} pods, {containers} containers; fake runtime answers each status after {delay:?} (listings after {:?})",
        delay * 5
    );
    let (mut cold, mut warm, mut killed) = (Vec::new(), Vec::new(), Vec::new());
    let mut cold_cpu = Vec::new();
    for run in 0..runs {
        let qdir = dir.join(format!("q{run}"));
        // no engine and no metrics: the restart path only (the proxy, its store, the admin API)
        let extra = ["--metrics-listen="];
        let t = Instant::now();
        let mut q = QosletProcess::start_with(&qdir, &backend.sock, &extra);
        cold.push(until_complete(&q.admin, t, pods as usize, containers as usize).await);
        cold_cpu.push(cpu_ms(q.pid()));
        assert!(q.sigterm(Duration::from_secs(30)).success());
        let t = Instant::now();
        q.restart();
        warm.push(until_complete(&q.admin, t, pods as usize, containers as usize).await);
        // the checkpoint writer has written the state (100 ms coalescing) before the kill
        tokio::time::sleep(Duration::from_millis(300)).await;
        q.kill9();
        let t = Instant::now();
        q.restart();
        killed.push(until_complete(&q.admin, t, pods as usize, containers as usize).await);
        let rss = q.rss_kib();
        println!(
            "  run {}: cold {:>7.1} ms (qoslet CPU {:.0} ms)   warm (checkpoint) {:>7.1} ms   after kill -9 {:>7.1} ms   RSS {:.1} MiB",
            run + 1,
            cold[run as usize].as_secs_f64() * 1e3,
            cold_cpu[run as usize],
            warm[run as usize].as_secs_f64() * 1e3,
            killed[run as usize].as_secs_f64() * 1e3,
            rss as f64 / 1024.0
        );
    }
    let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default().as_secs_f64() * 1e3;
    println!(
        "worst of {runs}: cold {:.1} ms, warm {:.1} ms, kill -9 {:.1} ms (target < 1000 ms, nothing lost: every pod and container listed)",
        worst(&cold),
        worst(&warm),
        worst(&killed)
    );
    let calls = backend.seen().len();
    println!("runtime calls served: {calls}");
}
