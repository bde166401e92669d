//! `bench --engine-tick [SECONDS]`: does the QoS engine's tick stall the calls
//! qoslet serves? Two qoslet processes with the same store (500 pods / 1,000
//! containers, from a checkpoint) over the same real cgroup v1 tree (created
//! under `/sys/fs/cgroup/<controller>/qoslet-test/<run>`, the kubelet cgroup
//! root the test bed's qoslet processes are given), both collecting
//! metrics every second; one runs the QoS engine (cfsQuota suppress, CPU burst
//! auto), the other has it off. CRI Version calls alternate between the two for
//! SECONDS (default 60): p50 / p99 / p99.9 / max of each, side by side. The
//! runtime behind both is an in-process fake that answers Version (the store
//! stays as the checkpoint: the fake lists nothing).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use prost::Message;
use qoslet_integration::fake::{FakeBackend, Reply};
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::Cri;
use qoslet_proto::admin::{admin_client::AdminClient, GetPlanRequest};

use super::{us, Samples};

const PODS: usize = 500;
const PER_POD: usize = 2;
const CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "cpuset", "memory", "blkio"];

fn pod_id(i: usize) -> String {
    format!("{i:04}aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
}

fn ctr_id(i: usize, j: usize) -> String {
    format!("{i:04}{j:02}cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc")
}

fn qos_dir(i: usize) -> &'static str {
    if i % 5 < 2 {
        "besteffort"
    } else {
        "burstable"
    }
}

/// The cgroups of the synthetic node (parents first), relative to a controller's root.
fn dirs(root: &str) -> Vec<String> {
    let mut v = vec![
        qoslet_integration::testbed::CGROUP_PREFIX[1..].to_string(),
        root.to_string(),
        format!("{root}/kubepods"),
        format!("{root}/kubepods/burstable"),
        format!("{root}/kubepods/besteffort"),
    ];
    for i in 0..PODS {
        let pod = format!("{root}/kubepods/{}/pod{}", qos_dir(i), pod_id(i));
        v.push(pod.clone());
        for j in 0..PER_POD {
            v.push(format!("{pod}/{}", ctr_id(i, j)));
        }
    }
    v
}

/// cgroup v2 (the VM test bed's guest) rather than v1 (this host).
fn unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The real directories of cgroup `d`: one per v1 controller, or the one v2 directory.
fn dirs_of(d: &str) -> Vec<PathBuf> {
    if unified() {
        vec![Path::new("/sys/fs/cgroup").join(d)]
    } else {
        CONTROLLERS
            .iter()
            .map(|c| Path::new("/sys/fs/cgroup").join(c).join(d))
            .collect()
    }
}

/// A cgroup directory, there already or made now.
fn mkdir(p: &Path) {
    if let Err(e) = std::fs::create_dir(p) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::AlreadyExists,
            "{}: {e}",
            p.display()
        );
    }
}

fn make_tree(root: &str) {
    if unified() {
        // each parent hands its children the controllers the engine writes (pods' and
        // containers' directories are created with their parents already enabled)
        for d in dirs(root) {
            let p = Path::new("/sys/fs/cgroup").join(&d);
            mkdir(&p);
            // (containers are the leaves: their ids end in "c"s)
            if !d.ends_with("cccc") {
                let _ = std::fs::write(
                    p.join("cgroup.subtree_control"),
                    "+cpu +cpuset +memory +io +pids",
                );
            }
        }
        return;
    }
    let cpus = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap_or_default();
    let mems = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.mems").unwrap_or_default();
    for d in dirs(root) {
        for c in CONTROLLERS {
            let p = Path::new("/sys/fs/cgroup").join(c).join(&d);
            mkdir(&p);
            if c == "cpuset" {
                // a v1 cpuset child starts empty; the engine's writes need CPUs in it
                let _ = std::fs::write(p.join("cpuset.cpus"), cpus.trim());
                let _ = std::fs::write(p.join("cpuset.mems"), mems.trim());
            }
        }
    }
}

fn remove_tree(root: &str) {
    // the shared prefix stays (other runs and tests use it)
    for d in dirs(root).iter().skip(1).rev() {
        for p in dirs_of(d) {
            let _ = std::fs::remove_dir(p);
        }
    }
}

fn checkpoint(state: &Path, backend: &str, root: &str) {
    std::fs::create_dir_all(state).unwrap();
    let mut pods = Vec::new();
    let mut containers = Vec::new();
    for i in 0..PODS {
        let be = qos_dir(i) == "besteffort";
        let mut p = qoslet_state::store::PodRecord {
            id: pod_id(i),
            name: format!("pod-{i}"),
            namespace: "bench".into(),
            cgroup_parent: format!("/{root}/kubepods/{}/pod{}", qos_dir(i), pod_id(i)),
            state: qoslet_state::store::PodState::Ready,
            ..Default::default()
        };
        p.labels.insert(
            "koordinator.sh/qosClass".into(),
            if be { "BE" } else { "LS" }.into(),
        );
        pods.push(p);
        for j in 0..PER_POD {
            let requested = (!be).then(|| qoslet_state::store::Resources {
                cpu_quota: 200_000,
                cpu_period: 100_000,
                cpu_shares: 1024,
                memory_limit_in_bytes: 1 << 30,
                ..Default::default()
            });
            containers.push(qoslet_state::store::ContainerRecord {
                id: ctr_id(i, j),
                pod_id: pod_id(i),
                name: format!("c{j}"),
                state: qoslet_state::store::ContainerState::Running,
                requested,
                ..Default::default()
            });
        }
    }
    qoslet_state::checkpoint::Checkpoint::new(state, backend)
        .save(qoslet_state::store::Snapshot { pods, containers })
        .unwrap();
}

/// (The kubelet cgroup root comes from the test bed's environment variable.)
fn config(engine: bool) -> String {
    format!(
        "isolation: false\nmetricsListen: \"\"\nmetricsSnapshot: false\nresyncInterval: 1h\n\
         qosEngine:\n  enable: {engine}\n\
         policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressPolicy: cfsQuota\n\
         \x20 cpuBurstStrategy:\n    policy: auto\n"
    )
}

fn report(name: &str, s: &Samples) -> [f64; 4] {
    let v = [
        us(s.pct(0.5)),
        us(s.pct(0.99)),
        us(s.pct(0.999)),
        us(s.pct(1.0)),
    ];
    println!(
        "  {name:<11} n={:<6} p50 {:>8.1} us  p99 {:>8.1} us  p99.9 {:>8.1} us  max {:>8.1} us",
        s.0.len(),
        v[0],
        v[1],
        v[2],
        v[3]
    );
    v
}

pub async fn run(dir: PathBuf, seconds: u64) {
    // the fake runtime on a thread of its own, so its work is not the clients'
    let sock = dir.join("fake-runtime.sock");
    let root = qoslet_integration::process::kubelet_cgroup_root(&sock)[1..].to_string();
    // the tree goes under the test prefix only, never at a hierarchy's (or the filesystem's) root
    assert!(
        root.starts_with(&qoslet_integration::testbed::CGROUP_PREFIX[1..]) && !root.contains(".."),
        "the synthetic node's root {root:?} is not under the test prefix"
    );
    remove_tree(&root);
    make_tree(&root);
    let version = cri::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "fake".into(),
        runtime_version: "1".into(),
        runtime_api_version: "v1".into(),
    }
    .encode_to_vec();
    let s = sock.clone();
    let (up, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let _fake = FakeBackend::start(&s, move |seen| {
                    if seen.path.ends_with("/Version") {
                        Reply::ok(&version)
                    } else {
                        Reply::status(12, "not in this fake", &[])
                    }
                })
                .await;
                up.send(()).unwrap();
                std::future::pending::<()>().await
            })
    });
    ready.recv().unwrap();
    let backend = format!("unix://{}", sock.display());
    let mut procs = Vec::new();
    for (name, engine) in [("engine-on", true), ("engine-off", false)] {
        let d = dir.join(name);
        checkpoint(&d.join("state"), &backend, &root);
        procs.push(QosletProcess::with_config(&d, &sock, &config(engine), &[]));
    }
    let on = Cri::connect(&procs[0].sock).await;
    let off = Cri::connect(&procs[1].sock).await;
    // the store rebuilt, metrics warm, the engine's first tick (every file written) done
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = std::fs::read_to_string(&procs[0].log).unwrap_or_default();
    let engine_on = log.contains("QoS engine on");
    println!(
        "engine tick bench: {PODS} pods / {} containers in each store, real cgroup {} tree {}; the engine {} in the first qoslet",
        PODS * PER_POD,
        if unified() { "v2" } else { "v1" },
        dirs_of(&root)[0].display(),
        if engine_on { "runs" } else { "DID NOT START (see its log)" }
    );
    let clients = [on, off];
    let mut out: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let t0 = Instant::now();
    let mut i = 0usize;
    while t0.elapsed() < Duration::from_secs(seconds) {
        for k in 0..2 {
            let which = (i + k) % 2;
            let mut c = clients[which].clone();
            let t = Instant::now();
            c.rt.version(cri::VersionRequest::default()).await.unwrap();
            out[which].push(t.elapsed());
        }
        i += 1;
    }
    let [a, b] = out;
    println!("CRI Version over {seconds} s, interleaved:");
    let on = report("engine on", &Samples(a));
    let off = report("engine off", &Samples(b));
    println!(
        "  ratio on/off: p50 {:.3}x  p99 {:.3}x  p99.9 {:.3}x  max {:.3}x  (target p99 and max <= 1.10x)",
        on[0] / off[0],
        on[1] / off[1],
        on[2] / off[2],
        on[3] / off[3]
    );
    let mut admin = AdminClient::new(qoslet_integration::channel(&procs[0].admin).await);
    match admin.get_plan(GetPlanRequest::default()).await {
        Ok(p) => {
            let p = p.into_inner();
            println!(
                "  the engine's last tick: #{} took {:.2} ms, {} settings planned ({} written, {} unchanged, {} errors), BE quota {} us, level {}",
                p.tick,
                p.tick_seconds * 1e3,
                p.written + p.unchanged + p.skipped,
                p.written,
                p.unchanged,
                p.errors.len(),
                p.be_quota_us,
                p.level
            );
        }
        Err(e) => println!("  the engine's plan: {e}"),
    }
    let rss: Vec<u64> = procs.iter().map(|p| p.rss_kib()).collect();
    println!("  RSS: engine on {} KiB, engine off {} KiB", rss[0], rss[1]);
    drop(procs);
    remove_tree(&root);
}
