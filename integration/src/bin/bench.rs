//! qoslet's proxy benchmark against the real containerd: latency of Version,
//! ListContainers (with 50+ containers), ContainerStatus and a full pod
//! lifecycle, through qoslet vs. directly to containerd, interleaved in one run;
//! then qoslet's RSS idle and across many pod lifecycles.
//!
//! Needs root and the test bed (`integration/testbed/testbed.sh up`). Run:
//!   cargo build --release --workspace --bins && target/release/bench [--quick] [--lifecycles N]
//!   target/release/bench --engine-tick [SECONDS]   (no test bed needed: see engine_tick.rs)

use std::time::{Duration, Instant};

#[path = "bench/engine_tick.rs"]
mod engine_tick;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{self, container_config, pod_config, Cri, Testbed, SLEEP_LOOP};
use qoslet_integration::{scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, QueryMetricsRequest};

struct Samples(Vec<Duration>);

impl Samples {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn report(name: &str, direct: &Samples, via: &Samples, target: f64) {
    let (d50, v50, d99, v99) = (
        direct.pct(0.5),
        via.pct(0.5),
        direct.pct(0.99),
        via.pct(0.99),
    );
    println!(
        "{name:<22} n={:<5} direct p50 {:>9.1} us  p99 {:>9.1} us | via p50 {:>9.1} us  p99 {:>9.1} us | ratio p50 {:.3}x  p99 {:.3}x  (target <= {target:.2}x)",
        direct.0.len(),
        us(d50),
        us(d99),
        us(v50),
        us(v99),
        us(v50) / us(d50),
        us(v99) / us(d99)
    );
}

/// Runs `f` on both clients `n` times, alternating which goes first.
async fn interleaved<F, Fut>(n: usize, direct: &Cri, via: &Cri, f: F) -> (Samples, Samples)
where
    F: FnMut(Cri) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut v = rotated(n, &[direct, via], f).await.into_iter();
    (v.next().unwrap(), v.next().unwrap())
}

/// Runs `f` on every client `n` times, each round starting one client later,
/// so each client goes first (and last) equally often.
async fn rotated<F, Fut>(n: usize, clients: &[&Cri], mut f: F) -> Vec<Samples>
where
    F: FnMut(Cri) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let m = clients.len();
    let mut out: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); m];
    for i in 0..n {
        for k in 0..m {
            let which = (i + k) % m;
            let t = Instant::now();
            f(clients[which].clone()).await;
            out[which].push(t.elapsed());
        }
    }
    out.into_iter().map(Samples).collect()
}

/// One small call through every path in one interleaved run: direct, the two
/// byte relays (the floor of any out-of-process proxy here) and qoslet.
async fn small_call<F, Fut>(name: &str, n: usize, paths: &Paths, f: F)
where
    F: FnMut(Cri) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let s = rotated(
        n,
        &[
            &paths.direct,
            &paths.relay_async,
            &paths.relay_threads,
            &paths.qoslet,
        ],
        f,
    )
    .await;
    report(name, &s[0], &s[3], 1.10);
    report("  byte relay (async)", &s[0], &s[1], 1.10);
    report("  byte relay (threads)", &s[0], &s[2], 1.10);
    let floor = if s[1].pct(0.5) <= s[2].pct(0.5) {
        &s[1]
    } else {
        &s[2]
    };
    println!(
        "  qoslet over the faster byte relay: p50 {:+.1} us ({:.3}x), p99 {:+.1} us",
        us(s[3].pct(0.5)) - us(floor.pct(0.5)),
        us(s[3].pct(0.5)) / us(floor.pct(0.5)),
        us(s[3].pct(0.99)) - us(floor.pct(0.99)),
    );
}

struct Paths {
    direct: Cri,
    relay_async: Cri,
    relay_threads: Cri,
    /// qoslet (HTTP/2 terminated per call: the one data plane).
    qoslet: Cri,
}

async fn lifecycle(mut c: Cri, tb: &Testbed, tag: &str) {
    let name = unique(tag);
    let cgp = tb.cgroup_parent(&name);
    let cfg = pod_config(&name, &cgp);
    let pod = c.run_pod(&cfg).await.expect("RunPodSandbox");
    let res = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let ctr = c
        .create(&pod, &cfg, container_config("app", SLEEP_LOOP, Some(res)))
        .await
        .expect("CreateContainer");
    c.start(&ctr).await.expect("StartContainer");
    c.status(&ctr).await.expect("ContainerStatus");
    c.rt.stop_container(cri::StopContainerRequest {
        container_id: ctr.clone(),
        timeout: 5,
    })
    .await
    .expect("StopContainer");
    c.rt.remove_container(cri::RemoveContainerRequest { container_id: ctr })
        .await
        .expect("RemoveContainer");
    c.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .expect("StopPodSandbox");
    c.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await
    .expect("RemovePodSandbox");
    testbed::remove_cgroup_dirs(&cgp);
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let lifecycles: usize = args
        .iter()
        .position(|a| a == "--lifecycles")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 50 } else { 1000 });
    let scale = if quick { 5 } else { 1 };
    if let Some(i) = args.iter().position(|a| a == "--loop") {
        // diagnostic: N sequential calls on SOCK (Version, or `list`: ListContainers,
        // `status`: ContainerStatus of the first container), for CPU accounting from outside
        let (sock, n): (&str, usize) = (&args[i + 1], args[i + 2].parse().unwrap());
        let what = args.get(i + 3).map(String::as_str).unwrap_or("version");
        let mut c = Cri::connect(sock).await;
        let first = match what {
            "status" => {
                c.rt.list_containers(cri::ListContainersRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .containers
                    .first()
                    .map(|x| x.id.clone())
                    .expect("a container on the node")
            }
            _ => String::new(),
        };
        let t = Instant::now();
        for _ in 0..n {
            match what {
                "list" => {
                    c.rt.list_containers(cri::ListContainersRequest::default())
                        .await
                        .unwrap();
                }
                "status" => {
                    c.rt.container_status(cri::ContainerStatusRequest {
                        container_id: first.clone(),
                        verbose: false,
                    })
                    .await
                    .unwrap();
                }
                _ => {
                    c.rt.version(cri::VersionRequest::default()).await.unwrap();
                }
            }
        }
        println!(
            "{n} {what} calls on {sock}: {:.1} us each",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
        return;
    }

    if let Some(i) = args.iter().position(|a| a == "--byte-relay") {
        // on its own current-thread runtime, like qoslet's
        let (listen, backend) = (args[i + 1].clone(), args[i + 2].clone());
        return std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(byte_relay(&listen, &backend))
        })
        .join()
        .unwrap();
    }
    if let Some(i) = args.iter().position(|a| a == "--byte-relay-threads") {
        return byte_relay_threads(&args[i + 1], &args[i + 2]);
    }
    if let Some(i) = args.iter().position(|a| a == "--engine-tick") {
        let seconds = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(60);
        return engine_tick::run(scratch("bench-engine-tick"), seconds).await;
    }
    let tb = Testbed::main();
    let dir = scratch("bench");
    // the floor any out-of-process proxy pays here: byte relays (no HTTP/2 at all), each in its
    // own process (this binary): one on a current-thread async runtime like qoslet's, one with
    // a blocking thread per direction (no event loop at all)
    let relays: Vec<(std::path::PathBuf, std::process::Child)> =
        ["--byte-relay", "--byte-relay-threads"]
            .iter()
            .map(|mode| {
                let sock = dir.join(format!("{}.sock", &mode[2..]));
                let child = std::process::Command::new(std::env::current_exe().unwrap())
                    .arg(mode)
                    .arg(&sock)
                    .arg(&tb.sock)
                    .spawn()
                    .expect("spawn a byte relay");
                (sock, child)
            })
            .collect();
    for (sock, _) in &relays {
        for _ in 0..100 {
            if sock.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let q = QosletProcess::start(&dir, &tb.sock);
    let direct = Cri::connect(&tb.sock).await;
    let via = Cri::connect(&q.sock).await;
    println!(
        "qoslet bench: containerd {} at {}, qoslet pid {}",
        tb.version,
        tb.sock.display(),
        q.pid()
    );

    // 55 containers in one pod, for ListContainers
    let name = unique("bench-list");
    let cgp = tb.cgroup_parent(&name);
    let cfg = pod_config(&name, &cgp);
    let mut setup = direct.clone();
    let pod = setup.run_pod(&cfg).await.unwrap();
    let mut first = String::new();
    for i in 0..55 {
        let id = setup
            .create(
                &pod,
                &cfg,
                container_config(&format!("c{i}"), SLEEP_LOOP, None),
            )
            .await
            .unwrap();
        if i == 0 {
            setup.start(&id).await.unwrap();
            first = id;
        }
    }
    let n_ctr = setup
        .rt
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .len();
    let idle_rss = q.rss_kib();
    println!("setup: {n_ctr} containers on the node; qoslet RSS idle {idle_rss} KiB\n");

    let paths = Paths {
        direct: direct.clone(),
        relay_async: Cri::connect(&relays[0].0).await,
        relay_threads: Cri::connect(&relays[1].0).await,
        qoslet: via.clone(),
    };
    // warm every path (connections, caches) before timing
    rotated(
        100,
        &[
            &paths.direct,
            &paths.relay_async,
            &paths.relay_threads,
            &paths.qoslet,
        ],
        |mut c| async move {
            c.rt.version(cri::VersionRequest::default()).await.unwrap();
        },
    )
    .await;
    small_call("Version", 2000 / scale, &paths, |mut c| async move {
        c.rt.version(cri::VersionRequest::default()).await.unwrap();
    })
    .await;
    small_call(
        &format!("ListContainers ({n_ctr})"),
        500 / scale,
        &paths,
        |mut c| async move {
            c.rt.list_containers(cri::ListContainersRequest::default())
                .await
                .unwrap();
        },
    )
    .await;
    let id = first.clone();
    small_call("ContainerStatus", 1000 / scale, &paths, move |mut c| {
        let id = id.clone();
        async move {
            c.status(&id).await.unwrap();
        }
    })
    .await;
    let tbr = &tb;
    let (d, v) = interleaved(if quick { 6 } else { 30 }, &direct, &via, |c| async move {
        lifecycle(c, tbr, "bench-lc").await
    })
    .await;
    report("pod lifecycle (7 calls)", &d, &v, 1.02);
    setup.remove_pod(&pod).await;
    testbed::remove_cgroup_dirs(&cgp);

    // the isolation hook: decision time, and CreateContainer with hooks on vs off vs direct
    decisions();
    let q_off =
        QosletProcess::with_config(&dir.join("hooks-off"), &tb.sock, "isolation: false\n", &[]);
    let via_off = Cri::connect(&q_off.sock).await;
    let name = unique("bench-be");
    let cgp = tb.cgroup_parent(&name);
    let mut be_cfg = pod_config(&name, &cgp);
    be_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    be_cfg.annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        r#"{"containers":{"c":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#.into(),
    );
    let mut setup = direct.clone();
    let be_pod = setup.run_pod(&be_cfg).await.unwrap();
    let n = if quick { 10 } else { 40 };
    let (mut d, mut on, mut off) = (vec![], vec![], vec![]);
    for i in 0..n {
        for k in 0..3 {
            let which = (i + k) % 3;
            let mut c = [&direct, &via, &via_off][which].clone();
            let t = Instant::now();
            let id = c
                .create(&be_pod, &be_cfg, container_config("c", SLEEP_LOOP, None))
                .await
                .unwrap();
            [&mut d, &mut on, &mut off][which].push(t.elapsed());
            setup
                .rt
                .remove_container(cri::RemoveContainerRequest { container_id: id })
                .await
                .unwrap();
        }
    }
    let (d, on, off) = (Samples(d), Samples(on), Samples(off));
    println!(
        "CreateContainer (BE, batch) n={n}: direct p50 {:.0} us | qoslet hooks off p50 {:.0} us ({:.3}x) | qoslet hooks on p50 {:.0} us ({:.3}x)",
        us(d.pct(0.5)),
        us(off.pct(0.5)),
        us(off.pct(0.5)) / us(d.pct(0.5)),
        us(on.pct(0.5)),
        us(on.pct(0.5)) / us(d.pct(0.5))
    );
    setup.remove_pod(&be_pod).await;
    testbed::remove_cgroup_dirs(&cgp);
    drop(q_off);

    // RSS across lifecycles (2 at a time, like kubelet's parallel pod workers), through the
    // whole agent and through a proxy-only qoslet (`metrics: false`, so no engine either): the
    // agent keeps a removed container's series for the cache's raw window (10 minutes), the
    // proxy path (hooks, store, checkpoint) keeps nothing of a removed pod
    let q_lean =
        QosletProcess::with_config(&dir.join("proxy-only"), &tb.sock, "metrics: false\n", &[]);
    let via_lean = Cri::connect(&q_lean.sock).await;
    // warm the proxy-only path like the agent's was, so both start from a served state
    for _ in 0..10 {
        lifecycle(via_lean.clone(), &tb, "bench-rss").await;
    }
    let lean_idle = q_lean.rss_kib();
    println!("\nRSS across {lifecycles} pod lifecycles through each:");
    let row = |done: usize, t: f64, agent: u64, lean: u64, entities: usize| {
        println!(
            "  after {done:>5} lifecycles: agent {agent:>6} KiB ({entities:>4} entities in the metrics cache) | proxy only {lean:>6} KiB  ({t:.0} s)"
        )
    };
    row(0, 0.0, q.rss_kib(), lean_idle, cache_entities(&q).await);
    let step = (lifecycles / 4).max(1);
    let mut done = 0;
    let t0 = Instant::now();
    while done < lifecycles {
        let batch = step.min(lifecycles - done);
        let mut tasks = vec![];
        for client in [&via, &via_lean] {
            for w in 0..2 {
                let (c, tb) = (client.clone(), tb.clone());
                let n = batch / 2 + if w == 0 { batch % 2 } else { 0 };
                tasks.push(tokio::spawn(async move {
                    for _ in 0..n {
                        lifecycle(c.clone(), &tb, "bench-rss").await;
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        done += batch;
        row(
            done,
            t0.elapsed().as_secs_f64(),
            q.rss_kib(),
            q_lean.rss_kib(),
            cache_entities(&q).await,
        );
    }
    for (_, mut child) in relays {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (st, lean) = (q.rss_kib(), q_lean.rss_kib());
    println!(
        "\nRSS idle -> after {lifecycles} lifecycles: agent {idle_rss} -> {st} KiB ({:+.1}%), proxy only {lean_idle} -> {lean} KiB ({:+.1}%)",
        (st as f64 / idle_rss as f64 - 1.0) * 100.0,
        (lean as f64 / lean_idle as f64 - 1.0) * 100.0
    );
}

/// Entities (node, pods, containers) the agent's metrics cache holds.
async fn cache_entities(q: &QosletProcess) -> usize {
    let mut admin = AdminClient::new(qoslet_integration::channel(&q.admin).await);
    admin
        .query_metrics(QueryMetricsRequest::default())
        .await
        .map(|r| r.into_inner().available.len())
        .unwrap_or(0)
}

/// `--byte-relay LISTEN BACKEND`: copies bytes between each client and a new
/// backend connection, nothing else.
async fn byte_relay(listen: &str, backend: &str) {
    let listener = tokio::net::UnixListener::bind(listen).unwrap();
    while let Ok((mut a, _)) = listener.accept().await {
        let backend = backend.to_string();
        tokio::spawn(async move {
            if let Ok(mut b) = tokio::net::UnixStream::connect(&backend).await {
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
        });
    }
}

/// `--byte-relay-threads LISTEN BACKEND`: the same with a blocking thread per
/// direction and connection (no event loop).
fn byte_relay_threads(listen: &str, backend: &str) {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    fn pump(mut from: UnixStream, mut to: UnixStream) {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
    let listener = UnixListener::bind(listen).unwrap();
    for a in listener.incoming().flatten() {
        let Ok(b) = UnixStream::connect(backend) else {
            continue;
        };
        let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        std::thread::spawn(move || pump(a, b));
        std::thread::spawn(move || pump(b2, a2));
    }
}

/// Time of one isolation decision (class + container decision), pure CPU.
fn decisions() {
    use std::collections::BTreeMap;
    let labels: BTreeMap<String, String> =
        [("koordinator.sh/qosClass".to_string(), "BE".to_string())].into();
    let annotations: BTreeMap<String, String> = [(
        "node.koordinator.sh/extended-resource-spec".to_string(),
        r#"{"containers":{"c":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#.to_string(),
    )]
    .into();
    let features = qoslet_cgroups::Features {
        cpu_idle: true,
        cpu_burst: true,
        ..Default::default()
    };
    let policy = qoslet_hooks::policy::ResourceQosStrategy::default();
    let ctx = qoslet_hooks::decide::Context {
        features: &features,
        v2: false,
        policy: &policy,
        page_size: 4096,
        node: &qoslet_hooks::decide::NodeFacts {
            online_cpus: (0..16).collect(),
            milli_cpus: 16_000,
            memory_bytes: 64 << 30,
            ..Default::default()
        },
        devices: &BTreeMap::new(),
        share_pool: None,
    };
    let trust = qoslet_hooks::Trust::default();
    let n = 100_000;
    let t = Instant::now();
    let mut sink = 0usize;
    for _ in 0..n {
        let class = qoslet_hooks::classify(
            std::hint::black_box(&labels),
            "default",
            "/kubepods/besteffort/pod1",
            &trust,
        )
        .pod_class()
        .unwrap();
        let d = qoslet_hooks::decide::container(
            class,
            "c",
            std::hint::black_box(&annotations),
            qoslet_hooks::batch::SpecBatch::Unknown,
            &Default::default(),
            &ctx,
        );
        sink += d.decisions.len();
    }
    let per = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("isolation decision per container (class + batch annotation + decision): {per:.2} us (target < 20 us) [{sink}]");
}
