//! One eviction decision over N pods (default 1,000): kubelet's cycle
//! (observe with a hard and a soft memory threshold met, rank, victims with
//! their messages) and Koordinator's BE memory task (sort + release), p50 /
//! p99 over many runs. `decision_bench [--pods N] [--runs N]`.

use std::time::{Duration, Instant};

use qoslet_eviction::koord::{
    self, BeCpu, CpuEvictPolicy, CpuHistory, CpuPolicy, MemoryPolicy, NodeMemory,
};
use qoslet_eviction::kubelet::{Kubelet, Observation, Settings};
use qoslet_eviction::{Amount, ContainerStats, Pod, PodStats, Requests, Signal, Threshold};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn main() {
    let n = arg("--pods", 1000);
    let runs = arg("--runs", 2000);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pods: Vec<Pod> = (0..n)
        .map(|i| {
            let ws = (rnd() % 2048) as i64 * (1 << 20);
            Pod {
                uid: format!("uid-{i}"),
                namespace: "bench".into(),
                name: format!("pod-{i}"),
                priority: Some((rnd() % 3) as i32 - 1),
                be_labelled: i % 2 == 0,
                requests: Requests {
                    memory: (rnd() % 1024) as i64 * (1 << 20),
                    ..Default::default()
                },
                stats: Some(PodStats {
                    working_set: Some(ws),
                    memory_used: Some(ws / 2),
                    containers: vec![ContainerStats {
                        name: "app".into(),
                        working_set: Some(ws),
                        memory_request: 0,
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect();
    let t = |v: i64, grace: u64| Threshold {
        signal: Signal::MemoryAvailable,
        value: Amount::Quantity(v),
        grace: Duration::from_secs(grace),
        min_reclaim: Some(Amount::Quantity(100 << 20)),
        binary: true,
    };
    let mut k = Kubelet::new(Settings {
        thresholds: vec![t(1 << 30, 0), t(2 << 30, 30)],
        ..Default::default()
    });
    let obs = [(
        Signal::MemoryAvailable,
        Observation {
            available: 512 << 20,
            capacity: 64 << 30,
            at: None,
        },
    )]
    .into();
    let mut kubelet_times = Vec::with_capacity(runs);
    for r in 0..runs {
        let start = Instant::now();
        let p = k.observe(Duration::from_secs(r as u64), &obs);
        let v = k.victims(p.starved.as_ref().expect("met"), &pods, &obs);
        assert!(!v.is_empty());
        kubelet_times.push(start.elapsed());
    }
    let policy = MemoryPolicy::new(Some(70), None).unwrap();
    let node = NodeMemory {
        used: 60 << 30,
        capacity: 64 << 30,
    };
    let mut koord_times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let task = koord::memory_task(policy, node, &pods).expect("over the threshold");
        let round = koord::execute(std::slice::from_ref(&task), &pods, |_| false, |_, _| true);
        assert!(!round.evicted.is_empty());
        koord_times.push(start.elapsed());
    }
    // Koordinator's BE CPU task: a 60 s window of samples, satisfaction 30 %
    let cpu = CpuPolicy {
        lower_percent: 60,
        upper_percent: 80,
        usage_threshold_percent: 90,
        window: Duration::from_secs(60),
        policy: CpuEvictPolicy::ByRealLimit,
    };
    let mut history = CpuHistory::default();
    for s in 0..60u64 {
        history.push(
            Duration::from_secs(s),
            BeCpu {
                real_limit: 6_000,
                request: 20_000,
                usage: 5_900,
            },
            Duration::from_secs(62),
        );
    }
    let mut cpu_pods = pods.clone();
    for (i, p) in cpu_pods.iter_mut().enumerate() {
        p.requests.batch_cpu_milli = 20 + i as i64 % 50;
        if let Some(s) = p.stats.as_mut() {
            s.cpu_milli = Some(10 + i as i64 % 37);
        }
    }
    let mut cpu_times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let w = history
            .window(Duration::from_secs(59), cpu.window)
            .expect("samples");
        let task = koord::cpu_task(&cpu, &w, 20, None, &cpu_pods)
            .expect("valid")
            .expect("low satisfaction");
        let round = koord::execute(
            std::slice::from_ref(&task),
            &cpu_pods,
            |_| false,
            |_, _| true,
        );
        assert!(!round.evicted.is_empty());
        cpu_times.push(start.elapsed());
    }
    println!(
        "kubelet cycle (observe + rank + victims with messages), {n} pods, {runs} runs: p50 {:?}  p99 {:?}",
        pct(&mut kubelet_times, 0.5),
        pct(&mut kubelet_times, 0.99)
    );
    println!(
        "Koordinator BE memory task (sort + release), {n} pods, {runs} runs: p50 {:?}  p99 {:?}",
        pct(&mut koord_times, 0.5),
        pct(&mut koord_times, 0.99)
    );
    println!(
        "Koordinator BE CPU task (60-sample window + sort + release), {n} pods, {runs} runs: p50 {:?}  p99 {:?}",
        pct(&mut cpu_times, 0.5),
        pct(&mut cpu_times, 0.99)
    );
}
