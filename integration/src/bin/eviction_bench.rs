//! qoslet's eviction benchmarks, on the test bed's containerd 1.6 and this
//! machine's real cgroup v1 (`integration/testbed/testbed.sh up`, root):
//!
//! - pressure → evictor call: `--runs` (default 20) BE pods, one after the
//!   other, each growing 320 MiB of anonymous memory past `memory.available`
//!   in a scope of 640 MiB; the kernel's memory threshold notification wakes
//!   qoslet, which reads the scope, decides and calls the evictor. The figure
//!   is qoslet's own: from the notification to the evictor's call (the
//!   `latency_ms` of each `evicted` log line), p50 / p99 (target < 1 s p99;
//!   kubelet polls every 10 s);
//! - the agent idle with eviction on (thresholds set, no pressure) vs off,
//!   CPU over `--idle-secs` each (the notifier costs nothing per tick).
//!
//!   cargo build --release --workspace --bins && target/release/eviction_bench [--runs 20] [--idle-secs 20]

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use qoslet_integration::process::{kubelet_cgroup_root, QosletProcess};
use qoslet_integration::testbed::{container_config, pod_config, Cri, Testbed};
use qoslet_integration::{scratch, unique};

const GROW: &str = "x=$(head -c 335544320 /dev/zero | tr '\\0' a); while true; do sleep 0.2; done";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(root: &str, eviction: bool) -> String {
    if !eviction {
        return "eviction:\n  enable: false\n".into();
    }
    format!(
        "eviction:\n  memoryCapacity: 640Mi\n  cgroupScope: {root}/kubepods\n  enforceNodeAllocatable: false\n  \
         evictionHard:\n    memory.available: 300Mi\n  evictionPressureTransitionPeriod: 1s\n"
    )
}

/// utime + stime of `pid`, seconds (USER_HZ = 100).
fn cpu_seconds(pid: i32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = arg("--runs", 20);
    let idle = arg("--idle-secs", 20);
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;

    // idle CPU with eviction on vs off
    for on in [true, false] {
        let dir = scratch(if on { "evb-idle-on" } else { "evb-idle-off" });
        let mut q = QosletProcess::with_config(&dir, &tb.sock, &config(&root, on), &[]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (c0, t0) = (cpu_seconds(q.pid()), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let used = cpu_seconds(q.pid()) - c0;
        println!(
            "agent idle, eviction {}: {:.2} % of a core over {idle} s (RSS {} KiB)",
            if on {
                "on (a memory threshold armed)"
            } else {
                "off"
            },
            used * 100.0 / t0.elapsed().as_secs_f64(),
            q.rss_kib()
        );
        q.sigterm(Duration::from_secs(10));
    }

    let dir = scratch("evb");
    let q = QosletProcess::with_config(&dir, &tb.sock, &config(&root, true), &[]);
    let mut through = Cri::connect(&q.sock).await;
    let mut stopped_after = vec![];
    for i in 0..runs {
        let name = unique(&format!("evb-{i}"));
        let parent = tb.cgroup_parent_in("besteffort", &name);
        let cfg = pod_config(&name, &parent);
        // admitted once the last run's pressure has passed
        let id = loop {
            match through.run_pod(&cfg).await {
                Ok(id) => break id,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let res = cri::LinuxContainerResources {
            cpu_shares: 2,
            ..Default::default()
        };
        let c = through
            .create(&id, &cfg, container_config("grow", GROW, Some(res)))
            .await
            .unwrap();
        through.start(&c).await.unwrap();
        let t0 = Instant::now();
        while direct.sandbox_ready(&id).await && t0.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stopped_after.push(t0.elapsed().as_secs_f64());
        direct.remove_pod(&id).await;
        qoslet_integration::testbed::remove_cgroup_dirs(&parent);
    }
    let log = q.log_text();
    let mut lat: Vec<f64> = log
        .lines()
        .filter(|l| l.contains(" evicted ") || l.ends_with("evicted"))
        .filter_map(|l| {
            let v = l.split("latency_ms=Some(").nth(1)?;
            v.split(')').next()?.parse().ok()
        })
        .collect();
    println!(
        "pressure -> evictor call (kernel notification to the CRI stop), {} of {runs} evictions: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms (target < 1000 ms p99)",
        lat.len(),
        if lat.is_empty() { f64::NAN } else { pct(&mut lat, 0.5) },
        if lat.is_empty() { f64::NAN } else { pct(&mut lat, 0.99) },
        lat.iter().cloned().fold(0.0, f64::max)
    );
    if !stopped_after.is_empty() {
        println!(
            "BE container start -> sandbox stopped (includes allocating 320 MiB): p50 {:.2} s  p99 {:.2} s",
            pct(&mut stopped_after.clone(), 0.5),
            pct(&mut stopped_after, 0.99)
        );
    }
}
