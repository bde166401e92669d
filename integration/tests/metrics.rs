//! Metrics on the real containerd 1.6 + runc and this machine's real cgroup v1:
//! what qoslet reports matches what the containers really use and what the
//! kernel files say (needs root and the test bed).

use std::io::Write;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{self, cgroup_v1, container_config, pod_config, Cri, Testbed};
use qoslet_integration::{channel, eventually, free_port, http_get, query, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, NodeSummaryRequest};

const SPIN: &str = "while :; do :; done";
/// 64 MiB written to the pod's /dev/shm (tmpfs: charged to the writer, not reclaimable file cache).
const HOLD_64M: &str =
    "dd if=/dev/zero of=/dev/shm/hold bs=1M count=64 2>/dev/null; while true; do sleep 0.2; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_usage_matches_the_containers_and_the_kernel() {
    let tb = Testbed::main();
    let dir = scratch("metrics");
    let port = free_port();
    let mut q = QosletProcess::start_with(
        &dir,
        &tb.sock,
        &[
            &format!("--metrics-listen=127.0.0.1:{port}"),
            "--metrics-interval=1s",
        ],
    );
    let mut via = Cri::connect(&q.sock).await;
    let name = unique("usage");
    let cgp = tb.cgroup_parent(&name);
    let mut pod_cfg = pod_config(&name, &cgp);
    pod_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "LS".into());
    let pod = via.run_pod(&pod_cfg).await.unwrap();
    let half = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        ..Default::default()
    };
    let spin = via
        .create(&pod, &pod_cfg, container_config("spin", SPIN, Some(half)))
        .await
        .unwrap();
    via.start(&spin).await.unwrap();
    let mem = via
        .create(&pod, &pod_cfg, container_config("mem", HOLD_64M, None))
        .await
        .unwrap();
    via.start(&mem).await.unwrap();
    let started = std::time::Instant::now();
    let (spin_e, mem_e) = (format!("container/{spin}"), format!("container/{mem}"));

    // a spinning container with a 0.5-core quota reads 0.5 cores (±10 %)
    let cpu = eventually("5 s of CPU samples", Duration::from_secs(30), || {
        let (admin, e) = (q.admin.clone(), spin_e.clone());
        async move {
            // a full 5 s window of samples, none from the start-up second
            if started.elapsed() < Duration::from_secs(7) {
                return None;
            }
            let v = query(&admin, &e, "cpu_usage", 5).await;
            let (min, avg) = (v.get("min").copied()?, v.get("avg").copied()?);
            (min > 0.3).then_some(avg)
        }
    })
    .await;
    eprintln!("spinning container at a 0.5-core quota: {cpu:.3} cores");
    assert!(
        (cpu - 0.5).abs() <= 0.05,
        "spinning at a 0.5-core quota read {cpu} cores"
    );
    let v = query(&q.admin, &spin_e, "cpu_throttled_ratio", 5).await;
    assert!(v["avg"] > 0.5, "throttled most periods: {v:?}");
    let cg = format!("{cgp}/{spin}");
    let (periods, throttled) = {
        let s = cgroup_v1("cpu", &cg, "cpu.stat");
        let get = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(&format!("{k} ")))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        (get("nr_periods"), get("nr_throttled"))
    };
    assert!(
        throttled * 2 > periods,
        "the kernel agrees: {throttled}/{periods} throttled"
    );

    // a container holding 64 MiB reads a working set of 64 MiB (±10 %), as the kernel says
    let ws = eventually("64 MiB held", Duration::from_secs(30), || {
        let (admin, e) = (q.admin.clone(), mem_e.clone());
        async move {
            let v = query(&admin, &e, "memory_working_set", 2).await;
            v.get("last").copied().filter(|w| *w > 32.0 * 1048576.0)
        }
    })
    .await;
    let mib = ws / 1048576.0;
    eprintln!("container holding 64 MiB: working set {mib:.2} MiB");
    assert!(
        (mib - 64.0).abs() <= 6.4,
        "holding 64 MiB read a working set of {mib:.1} MiB"
    );
    let mcg = format!("{cgp}/{mem}");
    let usage: f64 = cgroup_v1("memory", &mcg, "memory.usage_in_bytes")
        .parse()
        .unwrap();
    let inactive: f64 = cgroup_v1("memory", &mcg, "memory.stat")
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .unwrap()
        .parse()
        .unwrap();
    let kernel = usage - inactive;
    assert!(
        (ws - kernel).abs() <= kernel * 0.02,
        "qoslet {ws} vs kernel {kernel} (usage {usage} - inactive_file {inactive})"
    );

    // the node summary has the pod and both containers; system + pods <= node
    let sum = AdminClient::new(channel(&q.admin).await)
        .node_summary(NodeSummaryRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sum.cpu_capacity_cores, num_cpus() as f64);
    assert!(sum
        .pods
        .iter()
        .any(|p| p.entity == format!("pod/{pod}") && p.qos_class == "LS"));
    let c = sum.containers.iter().find(|c| c.entity == spin_e).unwrap();
    assert_eq!(
        (c.container.as_str(), c.namespace.as_str()),
        ("spin", "qoslet-e2e")
    );
    assert!(sum.cpu_usage_cores >= 0.4, "{sum:?}");

    // Prometheus text on /metrics, valid for promtool; /healthz answers
    let (status, body) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    let want = format!(
        "qoslet_container_memory_working_set_bytes{{namespace=\"qoslet-e2e\",pod=\"{name}\",container=\"mem\",qos_class=\"LS\"}}"
    );
    assert!(body.contains(&want), "{want} missing");
    assert!(body.contains("qoslet_container_cpu_cfs_throttled_periods_total{"));
    // the front end's counters (what `qoslet status` shows) are scraped too
    let calls: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("qoslet_front_calls_total{mode=\"proxy\"} "))
        .and_then(|v| v.parse().ok())
        .expect("qoslet_front_calls_total");
    assert!(calls >= 3.0, "the pod's calls through qoslet: {calls}");
    assert!(body.contains("qoslet_hook_refusals_total{mode=\"proxy\"} 0\n"));
    assert!(body.contains("qoslet_hook_failures_total{mode=\"proxy\",kind=\"timeout\"} 0\n"));
    if let Ok(promtool) = std::env::var("QOSLET_PROMTOOL") {
        let mut child = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(http_get(port, "/healthz").0.contains("200"));
    assert!(http_get(port, "/nope").0.contains("404"));

    // `qoslet top` shows them (one frame)
    let out = std::process::Command::new(qoslet_integration::process::qoslet_bin())
        .args([
            "top",
            "--once",
            &format!("--admin=unix://{}", q.admin.display()),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&name) && text.contains("spin") && text.contains("mem"),
        "{text}"
    );

    // a restart keeps the history (snapshot in the state dir)
    let before = query(&q.admin, "node", "cpu_usage", 120).await;
    assert!(before.contains_key("avg"));
    assert!(q.sigterm(Duration::from_secs(10)).success());
    assert!(q.state_dir.join("metrics.snapshot").exists());
    q.restart();
    // the admin socket answers once the store is rebuilt, the metrics service
    // a moment later (its loops start then: longer on a busy machine); until
    // then a query is refused
    eventually(
        "the metrics service answers",
        Duration::from_secs(20),
        || {
            let admin = q.admin.clone();
            async move {
                query(&admin, "node", "cpu_usage", 120)
                    .await
                    .contains_key("avg")
                    .then_some(())
            }
        },
    )
    .await;
    let after = query(&q.admin, &spin_e, "cpu_usage", 60).await;
    assert!(
        after.contains_key("p50"),
        "history survived the restart: {after:?}"
    );

    // a removed pod's containers leave the summary
    let mut via = Cri::connect(&q.sock).await;
    via.remove_pod(&pod).await;
    eventually("removed containers gone", Duration::from_secs(10), || {
        let admin = q.admin.clone();
        let spin_e = spin_e.clone();
        async move {
            let s = AdminClient::new(channel(&admin).await)
                .node_summary(NodeSummaryRequest {})
                .await
                .ok()?
                .into_inner();
            (s.timestamp > 0 && !s.containers.iter().any(|c| c.entity == spin_e)).then_some(())
        }
    })
    .await;
    testbed::remove_cgroup_dirs(&cgp);
}

fn num_cpus() -> usize {
    std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count()
}
