//! qoslet's metrics benchmark on a synthetic cgroup v1 tree of 500 pods and
//! 1,000 containers (in tmpfs, shaped like the kernel's files):
//!
//! 1. collection cost per container per tick (the real collector);
//! 2. the time-series cache at full retention (24 h of 1 s samples for every
//!    series of every pod and container): bytes held and process RSS;
//! 3. query latency p50/p99 over that cache (random entity, series, window, aggregation);
//! 4. the whole agent: the real `qoslet proxy` with that cache (loaded from its
//!    snapshot) and the 1,500 cgroups in its store, collecting every second: RSS and CPU.
//!
//! Run: cargo build --release --workspace --bins && target/release/metrics_bench [--hours H] [--skip-agent] [--collect-only] [--skip-collection] [--agent-secs S] [--batch on|off]
//! (`QOSLET_BIN` picks the agent binary: old and new side by side; `--batch`:
//! the cluster side on against the in-process fake API server, a Node and
//! Koordinator's ConfigMap with co-location on, reporting the NodeMetric
//! every 30 s, with `batchResources` on or off: what writing batch
//! resources costs)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use qoslet_cgroups::{CgroupPath, Host};
use qoslet_metrics::collect::{Collector, Kind, Target};
use qoslet_metrics::{Agg, Metric, Tsdb};

const PODS: usize = 500;
const PER_POD: usize = 2;

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal, mean 0, sd 1.
    fn gauss(&mut self) -> f64 {
        (0..4).map(|_| self.f()).sum::<f64>() * 1.732 - 3.464
    }
}

fn rss_kib() -> u64 {
    qoslet_integration::process::rss_kib(std::process::id() as i32)
}

/// (command name, user + system CPU ticks) of a `/proc/.../stat` file.
fn stat_ticks(path: &Path) -> (String, u64) {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let name = s
        .split_once('(')
        .and_then(|x| x.1.rsplit_once(')'))
        .map(|x| x.0.to_string())
        .unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (name, t(11) + t(12))
}

fn put(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn pod_id(i: usize) -> String {
    format!("{i:04}{}", "a".repeat(60))
}
fn ctr_id(i: usize, j: usize) -> String {
    format!("{i:04}{j:02}{}", "c".repeat(58))
}

/// Writes one cgroup's files (v1) with counters at tick `n`.
fn write_cgroup(root: &Path, cg: &str, n: u64, salt: u64) {
    let cpu_ns = n * (200_000_000 + salt % 400_000_000);
    put(
        &root.join("cpu").join(cg).join("cpu.stat"),
        &format!(
            "nr_periods {}\nnr_throttled {}\nthrottled_time {}\nnr_bursts 0\nburst_time 0\n",
            n * 10,
            n * (salt % 3),
            n * (salt % 3) * 1_000_000
        ),
    );
    put(
        &root.join("cpuacct").join(cg).join("cpuacct.usage"),
        &format!("{cpu_ns}\n"),
    );
    let usage = (64 << 20) + (salt % 512) * (1 << 20);
    put(
        &root.join("memory").join(cg).join("memory.usage_in_bytes"),
        &format!("{usage}\n"),
    );
    put(&root.join("memory").join(cg).join("memory.stat"), &format!("cache {c}\nrss {r}\nrss_huge 0\nshmem 0\nmapped_file 0\ndirty 0\nwriteback 0\nswap 0\npgpgin 1\npgpgout 1\npgfault 1\npgmajfault 0\ninactive_anon 0\nactive_anon {r}\ninactive_file {i}\nactive_file {i}\nunevictable 0\nhierarchical_memory_limit 9223372036854771712\ntotal_cache {c}\ntotal_rss {r}\ntotal_rss_huge 0\ntotal_shmem 0\ntotal_mapped_file 0\ntotal_dirty 0\ntotal_writeback 0\ntotal_swap 0\ntotal_pgpgin 1\ntotal_pgpgout 1\ntotal_pgfault 1\ntotal_pgmajfault 0\ntotal_inactive_anon 0\ntotal_active_anon {r}\ntotal_inactive_file {i}\ntotal_active_file {i}\ntotal_unevictable 0\n", c = usage / 4, r = usage * 3 / 4, i = usage / 8));
    put(
        &root.join("memory").join(cg).join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    );
    put(&root.join("blkio").join(cg).join("blkio.throttle.io_service_bytes_recursive"), &format!("254:0 Read {}\n254:0 Write {}\n254:0 Sync 0\n254:0 Async 0\n254:0 Discard 0\n254:0 Total 0\nTotal 0\n", n * 4096, n * 8192));
    put(&root.join("blkio").join(cg).join("blkio.throttle.io_serviced_recursive"), &format!("254:0 Read {n}\n254:0 Write {n}\n254:0 Sync 0\n254:0 Async 0\n254:0 Discard 0\n254:0 Total 0\nTotal 0\n"));
}

/// Ticks between re-reads of idle counters (the collector's SLOW_EVERY).
const SLOW: u64 = 10;

#[derive(Clone, Copy, PartialEq)]
enum Mix {
    All,
    Realistic,
}

/// Moves the counters of the tree to tick `n` (not timed).
fn move_counters(tree: &Tree, n: u64, mix: Mix) {
    for (i, t) in tree.targets.iter().enumerate() {
        let cg = t.cgroup.as_str();
        let salt = i as u64 * 7919;
        std::fs::write(
            tree.root.join("cpuacct").join(cg).join("cpuacct.usage"),
            format!("{}\n", n * (200_000_000 + salt % 400_000_000)),
        )
        .unwrap();
        if mix == Mix::All || i % 4 == 0 {
            std::fs::write(tree.root.join("cpu").join(cg).join("cpu.stat"), format!("nr_periods {}\nnr_throttled {}\nthrottled_time {}\nnr_bursts 0\nburst_time 0\n", n * 10, n * 3, n * 3_000_000)).unwrap();
        } else {
            // no CFS quota: the kernel counts no periods
            std::fs::write(
                tree.root.join("cpu").join(cg).join("cpu.stat"),
                "nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n",
            )
            .unwrap();
        }
        if mix == Mix::All || i % 5 == 0 {
            let b = tree.root.join("blkio").join(cg);
            std::fs::write(b.join("blkio.throttle.io_service_bytes_recursive"), format!("254:0 Read {}\n254:0 Write {}\n254:0 Sync 0\n254:0 Async 0\n254:0 Discard 0\n254:0 Total 0\nTotal 0\n", n * 4096, n * 8192)).unwrap();
            std::fs::write(b.join("blkio.throttle.io_serviced_recursive"), format!("254:0 Read {n}\n254:0 Write {n}\n254:0 Sync 0\n254:0 Async 0\n254:0 Discard 0\n254:0 Total 0\nTotal 0\n")).unwrap();
        }
    }
}

struct Tree {
    root: PathBuf,
    targets: Vec<std::sync::Arc<Target>>,
}

fn build_tree(root: &Path, n: u64) -> Tree {
    for c in ["cpu", "cpuacct", "memory", "blkio"] {
        put(&root.join(c).join("cgroup.procs"), "");
    }
    let mut targets = Vec::new();
    for i in 0..PODS {
        let pcg = format!("kubepods/pod{i}");
        write_cgroup(root, &pcg, n, i as u64 * 7919);
        let class = if i % 3 == 0 { "BE" } else { "LS" };
        targets.push(std::sync::Arc::new(Target {
            entity: format!("pod/{}", pod_id(i)),
            kind: Kind::Pod,
            cgroup: CgroupPath::parse(&pcg).unwrap(),
            namespace: "bench".into(),
            pod: format!("pod-{i}"),
            container: String::new(),
            qos_class: class.into(),
            pod_entity: format!("pod/{}", pod_id(i)),
        }));
        for j in 0..PER_POD {
            let ccg = format!("{pcg}/{}", ctr_id(i, j));
            write_cgroup(root, &ccg, n, (i * 10 + j) as u64 * 104729);
            targets.push(std::sync::Arc::new(Target {
                entity: format!("container/{}", ctr_id(i, j)),
                kind: Kind::Container,
                cgroup: CgroupPath::parse(&ccg).unwrap(),
                namespace: "bench".into(),
                pod: format!("pod-{i}"),
                container: format!("c{j}"),
                qos_class: class.into(),
                pod_entity: format!("pod/{}", pod_id(i)),
            }));
        }
    }
    Tree {
        root: root.into(),
        targets,
    }
}

/// Synthetic but realistic per-entity series: CPU noisy around a per-entity
/// mean, throttling on a quarter of them, memory drifting by pages, I/O bursty on a fifth.
struct Gen {
    cpu_mean: f64,
    throttled: bool,
    io: bool,
    mem: f64,
}

fn samples(g: &mut Gen, rng: &mut Rng, out: &mut Vec<(Metric, f64)>) {
    out.clear();
    let cpu = (g.cpu_mean * (1.0 + 0.2 * rng.gauss())).max(0.0);
    out.push((Metric::CpuUsage, cpu));
    let thr = if g.throttled {
        (0.2 + 0.1 * rng.gauss()).clamp(0.0, 1.0)
    } else {
        0.0
    };
    out.push((Metric::CpuThrottledRatio, thr));
    out.push((Metric::CpuThrottledTime, thr * 0.1));
    if rng.f() < 0.1 {
        g.mem += 4096.0 * ((rng.next() % 129) as f64 - 64.0);
        g.mem = g.mem.max(16.0 * 1048576.0);
    }
    out.push((Metric::MemoryUsage, g.mem));
    out.push((Metric::MemoryWorkingSet, g.mem * 0.9));
    out.push((Metric::MemoryRss, g.mem * 0.7));
    out.push((Metric::MemoryCache, g.mem * 0.3));
    out.push((Metric::OomKills, 0.0));
    let io = if g.io && rng.f() < 0.3 {
        1e6 * rng.f()
    } else {
        0.0
    };
    out.push((Metric::IoReadBytes, io));
    out.push((Metric::IoWriteBytes, io * 0.5));
    out.push((Metric::IoReadOps, io / 4096.0));
    out.push((Metric::IoWriteOps, io / 8192.0));
}

fn now() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hours: u32 = args
        .iter()
        .position(|a| a == "--hours")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(24);
    let skip_agent = args.iter().any(|a| a == "--skip-agent");
    // the agent's CPU is measured over this many seconds (A/B runs: longer)
    let agent_secs: u64 = args
        .iter()
        .position(|a| a == "--agent-secs")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(30);
    let batch: Option<String> = args
        .iter()
        .position(|a| a == "--batch")
        .and_then(|i| args.get(i + 1).cloned());
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("qoslet-metrics-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cg_root = dir.join("cgroup");
    println!(
        "synthetic cgroup v1 tree: {PODS} pods x {PER_POD} containers under {}",
        cg_root.display()
    );

    // 1. collection cost, at the agent's pace (one tick a second: cold caches),
    //    with every counter of every cgroup moving (worst case) and with a
    //    realistic mix (CPU usage always; CFS throttling on the quarter with a
    //    quota; I/O on a fifth)
    let tree = build_tree(&cg_root, 1);
    let collection = !args.iter().any(|a| a == "--skip-collection");
    for (label, mix) in [
        ("every counter moving", Mix::All),
        ("realistic mix", Mix::Realistic),
    ]
    .into_iter()
    .filter(|_| collection)
    {
        let host = Host::detect(&tree.root).unwrap();
        let mut c = Collector::new(host, Path::new("/proc"));
        let t0 = now();
        let mut times = Vec::new();
        for n in 1..=(2 * SLOW + 2) {
            move_counters(&tree, n, mix);
            std::thread::sleep(Duration::from_millis(if n > 2 { 1000 } else { 0 }));
            let s = Instant::now();
            let tick = c.tick(t0 + n as u32, n * 1_000_000_000, &tree.targets);
            if n > 2 {
                times.push(s.elapsed());
            }
            assert_eq!(
                tick.readings.len(),
                tree.targets.len(),
                "skipped {}",
                tick.skipped
            );
        }
        times.sort();
        let med = times[times.len() / 2];
        println!(
            "collection ({label}): {} cgroups, median {:.2} ms per tick = {:.1} us per cgroup (max {:.2} ms); at 1 s interval {:.2}% of a core",
            tree.targets.len(),
            med.as_secs_f64() * 1e3,
            med.as_secs_f64() * 1e6 / tree.targets.len() as f64,
            times[times.len() - 1].as_secs_f64() * 1e3,
            med.as_secs_f64() * 100.0
        );
    }

    if args.iter().any(|a| a == "--collect-only") {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // 2. the cache at full retention
    let rss0 = rss_kib();
    let mut db = Tsdb::new(1);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut gens: Vec<(String, Gen)> = std::iter::once("node".to_string())
        .chain(tree.targets.iter().map(|t| t.entity.clone()))
        .map(|e| {
            let g = Gen {
                cpu_mean: 0.05 + 1.45 * rng.f(),
                throttled: rng.f() < 0.25,
                io: rng.f() < 0.2,
                mem: (32.0 + 2000.0 * rng.f()) * 1048576.0,
            };
            (e, g)
        })
        .collect();
    let end = now();
    let secs = hours * 3600;
    let start = end - secs + 1;
    let fill = Instant::now();
    let mut buf = Vec::with_capacity(16);
    for ts in start..=end {
        for (e, g) in gens.iter_mut() {
            samples(g, &mut rng, &mut buf);
            db.record(e, ts, &buf);
        }
    }
    let filled = fill.elapsed();
    let rss1 = rss_kib();
    let series = db.series_count();
    let data = db.data_bytes();
    println!(
        "cache: {hours} h of 1 s samples, {} entities, {series} series, filled in {:.0} s; sample data {:.1} MiB ({:.0} bytes/series); process RSS +{:.1} MiB",
        gens.len(),
        filled.as_secs_f64(),
        data as f64 / 1048576.0,
        data as f64 / series as f64,
        (rss1.saturating_sub(rss0)) as f64 / 1024.0
    );

    for (m, n, raw, roll) in db.bytes_by_metric() {
        println!(
            "  {:<22} {n:>6} series: raw {:>6.1} MiB ({:>5.0} B/series), rollups {:>6.1} MiB ({:>5.0} B/series)",
            m.name(),
            raw as f64 / 1048576.0,
            raw as f64 / n as f64,
            roll as f64 / 1048576.0,
            roll as f64 / n as f64
        );
    }

    // 3. queries
    let windows = [10u32, 60, 600, 3600, 6 * 3600, 86_400];
    let aggs = [
        Agg::Avg,
        Agg::Max,
        Agg::Quantile(0.5),
        Agg::Quantile(0.99),
        Agg::Trend,
        Agg::Last,
    ];
    let metrics = [
        Metric::CpuUsage,
        Metric::MemoryWorkingSet,
        Metric::CpuThrottledRatio,
        Metric::IoReadBytes,
    ];
    let mut by_window: HashMap<u32, Vec<Duration>> = HashMap::new();
    let mut all = Vec::new();
    for i in 0..if secs > 0 { 6000usize } else { 0 } {
        let (e, _) = &gens[(rng.next() as usize) % gens.len()];
        let w = windows[i % windows.len()];
        let a = aggs[(rng.next() as usize) % aggs.len()];
        let m = metrics[(rng.next() as usize) % metrics.len()];
        let s = Instant::now();
        let r = db.query(e, m, w.min(secs), a, end);
        let d = s.elapsed();
        // I/O and throttling keep no quantiles beyond the raw 10 minutes
        assert!(
            r.is_ok() || matches!(r, Err(qoslet_metrics::QueryError::NoQuantiles(_))),
            "{e} {m:?} {w} {a:?}: {r:?}"
        );
        by_window.entry(w).or_default().push(d);
        all.push(d);
    }
    let pct = |v: &mut Vec<Duration>, p: f64| {
        if v.is_empty() {
            return 0.0;
        }
        v.sort();
        v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
    };
    println!(
        "queries: p50 {:.1} us, p99 {:.1} us over {} random queries (target p99 < 1000 us)",
        pct(&mut all, 0.5),
        pct(&mut all, 0.99),
        all.len()
    );
    let mut ws: Vec<_> = by_window.into_iter().collect();
    ws.sort_by_key(|(w, _)| *w);
    for (w, mut v) in ws {
        println!(
            "  window {w:>6} s: p50 {:>8.1} us  p99 {:>8.1} us",
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }

    if skip_agent {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // 4. the whole agent with that cache and store
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        state.join("metrics.snapshot"),
        db.to_snapshot(&qoslet_metrics::NodeIdentity::of_host(
            std::path::Path::new("/proc"),
        )),
    )
    .unwrap();
    let snap_mib = std::fs::metadata(state.join("metrics.snapshot"))
        .unwrap()
        .len() as f64
        / 1048576.0;
    drop(db);
    let backend = format!("unix://{}", dir.join("no-runtime.sock").display());
    let mut pods = Vec::new();
    let mut containers = Vec::new();
    for i in 0..PODS {
        let mut p = qoslet_state::store::PodRecord {
            id: pod_id(i),
            name: format!("pod-{i}"),
            namespace: "bench".into(),
            cgroup_parent: format!("/kubepods/pod{i}"),
            state: qoslet_state::store::PodState::Ready,
            ..Default::default()
        };
        p.labels.insert(
            "koordinator.sh/qosClass".into(),
            if i % 3 == 0 { "BE" } else { "LS" }.into(),
        );
        pods.push(p);
        for j in 0..PER_POD {
            containers.push(qoslet_state::store::ContainerRecord {
                id: ctr_id(i, j),
                pod_id: pod_id(i),
                name: format!("c{j}"),
                state: qoslet_state::store::ContainerState::Running,
                ..Default::default()
            });
        }
    }
    qoslet_state::checkpoint::Checkpoint::new(&state, &backend)
        .save(qoslet_state::store::Snapshot { pods, containers })
        .unwrap();
    let cfg = dir.join("qoslet.yaml");
    let mut yaml = format!(
        "cgroupRoot: {}\nisolation: false\nmetricsListen: \"\"\nresyncInterval: 1h\n",
        tree.root.display()
    );
    // the cluster side against the fake API server (its runtime lives until the end)
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let fake = batch.as_ref().map(|mode| {
        let fake = rt.block_on(qoslet_kube_fake::FakeApiServer::start());
        fake.apply("/api/v1/nodes", serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-1"},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi"}, "allocatable": {"cpu": "62", "memory": "250Gi"}}}));
        fake.apply("/api/v1/namespaces/koordinator-system/configmaps", serde_json::json!({"apiVersion": "v1",
            "kind": "ConfigMap", "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
            "data": {"colocation-config": "{\"enable\": true}"}}));
        std::fs::write(dir.join("kubeconfig"), fake.kubeconfig()).unwrap();
        yaml.push_str(&format!(
            "kubernetes:\n  enable: true\n  kubeconfig: {}\n  nodeName: node-1\n  createNodeMetric: true\n  reportInterval: 30s\n  batchResources: {mode}\n",
            dir.join("kubeconfig").display()
        ));
        fake
    });
    std::fs::write(&cfg, yaml).unwrap();
    let bin = qoslet_integration::process::qoslet_bin();
    let log = std::fs::File::create(dir.join("qoslet.log")).unwrap();
    let mut child = std::process::Command::new(&bin)
        .args([
            "proxy",
            &format!("--listen=unix://{}", dir.join("q.sock").display()),
            &format!("--admin-listen=unix://{}", dir.join("a.sock").display()),
            &format!("--runtime-endpoint={backend}"),
            &format!("--state-dir={}", state.display()),
            &format!("--config={}", cfg.display()),
        ])
        .env("QOSLET_LOG", "warn")
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // counters keep moving while the agent collects
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mover = {
        let stop = stop.clone();
        let tree = Tree {
            root: tree.root.clone(),
            targets: tree.targets.clone(),
        };
        std::thread::spawn(move || {
            let mut n = 100u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                move_counters(&tree, n, Mix::Realistic);
                n += 1;
                std::thread::sleep(Duration::from_millis(1000));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(15));
    let cpu_ticks = |pid: i32| stat_ticks(Path::new(&format!("/proc/{pid}/stat"))).1;
    let hz = 100.0; // USER_HZ
    let threads = |pid: i32| -> HashMap<String, u64> {
        let mut m = HashMap::new();
        for e in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let (name, t) = stat_ticks(&e.path().join("stat"));
            *m.entry(name).or_insert(0) += t;
        }
        m
    };
    let (c0, w0, th0) = (cpu_ticks(pid), Instant::now(), threads(pid));
    std::thread::sleep(Duration::from_secs(agent_secs));
    let (c1, w1, th1) = (cpu_ticks(pid), w0.elapsed(), threads(pid));
    for (name, t) in &th1 {
        let d = t - th0.get(name).copied().unwrap_or(0);
        println!(
            "  agent thread {name:<16} {:.2}% of a core",
            d as f64 / hz / w1.as_secs_f64() * 100.0
        );
    }
    let rss = qoslet_integration::process::rss_kib(pid);
    let (anon, file) = (
        qoslet_integration::process::status_kib(pid, "RssAnon"),
        qoslet_integration::process::status_kib(pid, "RssFile"),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = mover.join();
    qoslet_integration::process::signal(pid, libc::SIGTERM);
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("qoslet.log")).unwrap_or_default();
    let loaded = !log.contains("snapshot ignored");
    if let (Some(mode), Some(fake)) = (&batch, &fake) {
        let node = fake.get("/api/v1/nodes", "node-1").unwrap_or_default();
        println!(
            "cluster side on (fake API server), batchResources {mode}: Node batch-cpu {}, NodeMetric {}",
            node["status"]["allocatable"]["kubernetes.io/batch-cpu"],
            if fake.get("/apis/slo.koordinator.sh/v1alpha1/nodemetrics", "node-1").is_some() { "reported" } else { "missing" }
        );
    }
    drop(fake);
    drop(rt);
    println!(
        "agent: qoslet proxy with {} pods / {} containers in its store, {hours} h cache loaded from a {snap_mib:.1} MiB snapshot ({}), collecting every 1 s (realistic mix): RSS {:.1} MiB (target 64; anonymous {:.1}, file-backed {:.1}), CPU {:.2}% of a core over {:.0} s (target < 2%)",
        PODS,
        PODS * PER_POD,
        if loaded { "loaded" } else { "NOT loaded" },
        rss as f64 / 1024.0,
        anon as f64 / 1024.0,
        file as f64 / 1024.0,
        (c1 - c0) as f64 / hz / w1.as_secs_f64() * 100.0,
        w1.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
