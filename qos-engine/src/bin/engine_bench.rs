//! One QoS engine tick at node scale: plan (all plugins, merged) and execute
//! on a synthetic cgroup v1 tree (tmpfs) shaped like the kernel's.
//!
//! `engine_bench [--pods 500] [--containers-per-pod 2] [--ticks 300]`
//!
//! Prints the first tick (everything written), the steady state (same inputs:
//! the target is < 5 ms per tick and 0 writes), and a tick where LS load
//! jumps (one suppress write).

use std::time::{Duration, Instant};

use qoslet_cgroups::Cgroups;
use qoslet_qos_engine::burst::BurstPolicy;
use qoslet_qos_engine::engine::{Engine, Env, Policy};
use qoslet_qos_engine::policy::CpuSuppressPolicy;
use qoslet_qos_engine::synth::{self, Shape};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pods = synth::flag::<usize>(&args, "--pods", 500);
    let per_pod = synth::flag::<usize>(&args, "--containers-per-pod", 2);
    let ticks = synth::flag::<usize>(&args, "--ticks", 300);
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let root = base.join(format!("qoslet-engine-bench-{}", std::process::id()));
    let shape = Shape {
        ls_pods: pods * 3 / 5,
        be_pods: pods - pods * 3 / 5,
        containers_per_pod: per_pod,
        ls_limit_cores: 2.0,
        cpus: 64,
    };
    let mut pods_v = synth::build(&root, &shape).expect("synthetic tree");
    let cg = Cgroups::detect(&root).expect("tree detected");
    let env = Env {
        features: cg.host().features.clone(),
        v2: false,
        page_size: 4096,
        ..Default::default()
    };
    let mut policy = Policy::default();
    policy.threshold.enable = true;
    policy.threshold.cpu_suppress_policy = CpuSuppressPolicy::CfsQuota;
    policy.burst.policy = BurstPolicy::Auto;
    synth::set_usage(&mut pods_v, 24.0, 16.0);
    let state = |pods: &Vec<qoslet_qos_engine::reconcile::Pod>, cg: &Cgroups| {
        let usage = pods.iter().map(|p| p.cpu_cores).sum::<f64>() + 1.0;
        synth::node_state(64, usage, 1.0, pods, synth::be_quota(cg).unwrap())
    };
    let mut engine = Engine::new(10);
    let containers: usize = pods_v.iter().map(|p| p.containers.len()).sum();
    println!(
        "engine_bench: {} pods ({} LS, {} BE), {containers} containers, 64 CPUs, cfsQuota suppress + burst auto, drift check every 10 ticks",
        pods_v.len(), shape.ls_pods, shape.be_pods
    );

    let t0 = Instant::now();
    let s = state(&pods_v, &cg);
    let t = engine.plan(&s, &policy, &env);
    let plan_cold = t0.elapsed();
    let r = engine.execute(&t.plan, &cg);
    println!(
        "first tick: {} settings planned, {} files written, {} errors, {:.2} ms (plan {:.2} ms)",
        t.plan.len(),
        r.written,
        r.errors.len(),
        t0.elapsed().as_secs_f64() * 1e3,
        plan_cold.as_secs_f64() * 1e3
    );
    if !r.errors.is_empty() {
        eprintln!("errors: {:?}", &r.errors[..r.errors.len().min(5)]);
        std::process::exit(1);
    }

    let (mut total, mut plan_t, mut state_t) = (Vec::new(), Vec::new(), Vec::new());
    let (mut written, mut read) = (0usize, 0usize);
    for _ in 0..ticks {
        let a = Instant::now();
        let s = state(&pods_v, &cg);
        let b = Instant::now();
        let t = engine.plan(&s, &policy, &env);
        let c = Instant::now();
        let r = engine.execute(&t.plan, &cg);
        total.push(a.elapsed());
        state_t.push(b - a);
        plan_t.push(c - b);
        written += r.written;
        read += r.unchanged;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "steady, {ticks} ticks: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms per tick (state copy p50 {:.2} ms, plan p50 {:.2} ms); {written} files written, {:.0} files re-read per tick (drift check)",
        ms(pct(&mut total.clone(), 0.5)),
        ms(pct(&mut total.clone(), 0.99)),
        ms(pct(&mut total, 1.0)),
        ms(pct(&mut state_t, 0.5)),
        ms(pct(&mut plan_t, 0.5)),
        read as f64 / ticks as f64
    );

    synth::set_usage(&mut pods_v, 40.0, 16.0);
    let a = Instant::now();
    let s = state(&pods_v, &cg);
    let t = engine.plan(&s, &policy, &env);
    let r = engine.execute(&t.plan, &cg);
    println!(
        "LS load jump: {} files written (level {}, allowance {:.2} cores), {:.2} ms",
        r.written,
        t.level.as_str(),
        t.allowance_cores,
        ms(a.elapsed())
    );
    let _ = std::fs::remove_dir_all(&root);
    if written != 0 {
        eprintln!("FAIL: a steady state wrote {written} files");
        std::process::exit(1);
    }
}
