//! Figures of the batch-resource calculation and its write rule (issue 46):
//!   cargo run --release -p qoslet-colocation --bin colocation_bench
//! 1. `batch::calculate` over 250 and 1,000 pods (and as many pod metrics):
//!    p50 / p99 of 2,000 runs each.
//! 2. Node writes an hour under koord-manager's rule (`sync::due`, the
//!    defaults: 10 %, 300 s), one report a minute, at a steady load and one
//!    that oscillates by ±5 % and ±20 % of the high-priority usage (a sine of
//!    period 10 minutes plus a deterministic jitter); 250 pods whose
//!    high-priority use is about a third of the node (batch-cpu about 26
//!    cores: ±20 % of the use moves it by about ±25 %).

use std::time::Instant;

use qoslet_colocation::batch::{calculate, MetricInput, NodeInput, PodInput, PodMetric};
use qoslet_colocation::strategy::Strategy;
use qoslet_colocation::sync::{due, Advertised};
use qoslet_colocation::Res;

const G: i64 = 1 << 30;

fn node() -> NodeInput {
    NodeInput {
        capacity_cpu: Some(96_000),
        capacity_memory: Some(512 * G),
        allocatable_cpu: Some(94_000),
        allocatable_memory: Some(500 * G),
        reservation: None,
    }
}

/// `n` pods, a third of them BE, and their metrics at `load` × their base use.
fn cluster(n: usize, load: f64) -> (Vec<PodInput>, MetricInput) {
    let mut pods = Vec::with_capacity(n);
    let mut m = MetricInput {
        update_time: Some(0),
        system: Res::new(2_000, 8 * G),
        pods: Vec::with_capacity(n),
        host_apps: vec![],
    };
    for i in 0..n {
        let be = i % 3 == 0;
        pods.push(PodInput {
            namespace: format!("ns-{}", i % 20),
            name: format!("pod-{i}"),
            phase: Some("Running".into()),
            qos_label: be.then(|| "BE".into()),
            kube_qos: Some(if be { "BestEffort" } else { "Burstable" }.into()),
            request: if be {
                Res::default()
            } else {
                Res::new(50, 64 << 20)
            },
            ..Default::default()
        });
        let base = 150.0 + (i % 7) as f64 * 10.0;
        m.pods.push(PodMetric {
            namespace: format!("ns-{}", i % 20),
            name: format!("pod-{i}"),
            usage: Res::new((base * load) as i64, ((48 << 20) as f64 * load) as i64),
            priority: None,
        });
    }
    (pods, m)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut s = Strategy::defaults();
    s.enable = Some(true);
    println!("calculate (one node, its pods and pod metrics):");
    for n in [250, 1000] {
        let (pods, m) = cluster(n, 1.0);
        let mut t = Vec::with_capacity(2000);
        let mut cpu = 0;
        for _ in 0..2000 {
            let start = Instant::now();
            let b = calculate(&s, &node(), &pods, &m);
            t.push(start.elapsed().as_secs_f64() * 1e6);
            cpu = b.cpu;
        }
        println!(
            "  {n:>5} pods: p50 {:.1} µs, p99 {:.1} µs  (batch-cpu {cpu}m)",
            pct(&mut t, 0.5),
            pct(&mut t, 0.99),
        );
    }
    println!("Node writes an hour (one report a minute, resourceDiffThreshold 0.1, updateTimeThresholdSeconds 300):");
    for (name, amp) in [("steady", 0.0), ("±5 %", 0.05), ("±20 %", 0.20)] {
        let mut shown = Advertised::NONE;
        let mut last: Option<i64> = None;
        let mut writes = 0;
        for minute in 0..60i64 {
            let now = minute * 60;
            let phase = (minute as f64) * std::f64::consts::TAU / 10.0;
            let jitter = ((minute * 7919) % 13) as f64 / 13.0 - 0.5;
            let load = 1.0 + amp * (0.8 * phase.sin() + 0.4 * jitter);
            let (pods, m) = cluster(250, load);
            let b = calculate(&s, &node(), &pods, &m);
            let next = Advertised {
                cpu: Some(b.cpu),
                memory: Some(b.memory),
            };
            if due(shown, next, last.map(|t| now - t), &s).is_some() {
                writes += 1;
                shown = next;
                last = Some(now);
            }
        }
        println!("  {name:<7} {writes} writes");
    }
}
