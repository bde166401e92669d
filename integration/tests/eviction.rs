//! Eviction on the real containerd 1.6 + runc and this machine's real cgroup
//! v1 (needs root and the test bed). qoslet's `eviction:` section scopes the
//! node to the test bed's pods (`cgroupScope`) with a small `memoryCapacity`,
//! so pressure comes from a few hundred MiB, not from filling the machine:
//! a BE pod that grows anonymous memory past `memory.available` is stopped at
//! the runtime, an LS pod beside it keeps running, another BE pod is refused
//! while MemoryPressure lasts and admitted after the transition period; in a
//! dry run nothing is stopped and nothing refused.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use qoslet_integration::process::{kubelet_cgroup_root, QosletProcess};
use qoslet_integration::testbed::{
    container_config, pod_config, usage_mib, Cleanup, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{channel, eventually, free_port, http_get, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, ListEvictionsRequest, ListEvictionsResponse};
use tonic::transport::Channel;

/// The tests share the test bed's kubepods as their scope: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Anonymous memory held by a shell variable: 320 MiB of 'a'.
const GROW: &str = "x=$(head -c 335544320 /dev/zero | tr '\\0' a); while true; do sleep 0.2; done";

fn config(dry_run: bool, root: &str) -> String {
    format!(
        "eviction:\n  dryRun: {dry_run}\n  memoryCapacity: 640Mi\n  cgroupScope: {root}/kubepods\n  \
         enforceNodeAllocatable: false\n  evictionHard:\n    memory.available: 300Mi\n  \
         evictionPressureTransitionPeriod: 6s\n"
    )
}

/// What the admin API's ListEvictions answers.
async fn evictions(admin: &AdminClient<Channel>) -> Result<ListEvictionsResponse, tonic::Status> {
    let mut a = admin.clone();
    let r = a.list_evictions(ListEvictionsRequest::default()).await;
    Ok(r?.into_inner())
}

/// The record of `sandbox`'s eviction with outcome "stopped", once qoslet
/// has it: the sandbox shows NOTREADY at the runtime a moment before
/// StopPodSandbox answers qoslet, and qoslet logs the eviction, refuses the
/// pod's re-admission and records it only after that answer.
async fn stopped_record(q: &QosletProcess, sandbox: &str) -> qoslet_proto::admin::EvictionRecord {
    let admin = AdminClient::new(channel(&q.admin).await);
    eventually("the eviction recorded", Duration::from_secs(10), || async {
        evictions(&admin)
            .await
            .ok()?
            .records
            .into_iter()
            .find(|r| r.sandbox_id == sandbox && r.outcome == "stopped")
    })
    .await
}

/// An LS pod (Burstable) sleeping, and a BE pod (BestEffort) that grows
/// memory, through qoslet; returns (ls sandbox, be sandbox, when BE started).
async fn pods(
    q: &QosletProcess,
    tb: &Testbed,
    cleanup: &mut Cleanup,
    tag: &str,
) -> (String, String, Instant, String) {
    let mut through = Cri::connect(&q.sock).await;
    let ls_name = unique(&format!("{tag}-ls"));
    let ls_parent = tb.cgroup_parent_in("burstable", &ls_name);
    let ls = through
        .run_pod(&pod_config(&ls_name, &ls_parent))
        .await
        .unwrap();
    cleanup.pods.push(ls.clone());
    cleanup.cgroups.push(ls_parent.clone());
    let res = cri::LinuxContainerResources {
        cpu_shares: 256,
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    };
    let c = through
        .create(
            &ls,
            &pod_config(&ls_name, &ls_parent),
            container_config("app", SLEEP_LOOP, Some(res)),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();

    let be_name = unique(&format!("{tag}-be"));
    let be_parent = tb.cgroup_parent_in("besteffort", &be_name);
    let be = through
        .run_pod(&pod_config(&be_name, &be_parent))
        .await
        .unwrap();
    cleanup.pods.push(be.clone());
    cleanup.cgroups.push(be_parent.clone());
    let res = cri::LinuxContainerResources {
        cpu_shares: 2,
        ..Default::default()
    };
    let c = through
        .create(
            &be,
            &pod_config(&be_name, &be_parent),
            container_config("grow", GROW, Some(res)),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    (ls, be, Instant::now(), be_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_memory_pressure_evicts_the_be_pod_refuses_be_admission_and_spares_ls() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let port = free_port();
    let dir = scratch("eviction");
    let listen = format!("--metrics-listen=127.0.0.1:{port}");
    let q = QosletProcess::with_config(&dir, &tb.sock, &config(false, &root), &[listen.as_str()]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let (ls, be, started, _) = pods(&q, &tb, &mut cleanup, "evict").await;

    // the BE pod is stopped at the runtime once it holds its memory
    eventually("the BE pod stopped", Duration::from_secs(30), || {
        let (mut d, be) = (direct.clone(), be.clone());
        async move { (!d.sandbox_ready(&be).await).then_some(()) }
    })
    .await;
    let took = started.elapsed();
    stopped_record(&q, &be).await;
    let log = q.log_text();
    assert!(
        log.contains("evicted") && log.contains("memory.available"),
        "{log}"
    );
    assert!(
        log.contains("The node was low on resource: memory."),
        "kubelet's message: {log}"
    );
    // the LS pod beside it keeps running
    assert!(direct.sandbox_ready(&ls).await, "the LS pod was touched");

    // MemoryPressure holds for the transition period: a BE pod is refused,
    // naming the signal, what was observed and the threshold; an LS pod is not
    let mut through = Cri::connect(&q.sock).await;
    let name = unique("evict-be2");
    let parent = tb.cgroup_parent_in("besteffort", &name);
    cleanup.cgroups.push(parent.clone());
    let refused = through.run_pod(&pod_config(&name, &parent)).await;
    let st = refused.expect_err("a BE pod admitted under memory pressure");
    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
    assert!(
        st.message().contains("MemoryPressure") && st.message().contains("best-effort"),
        "{}",
        st.message()
    );
    let name_ls = unique("evict-ls2");
    let parent_ls = tb.cgroup_parent_in("burstable", &name_ls);
    cleanup.cgroups.push(parent_ls.clone());
    let ls2 = through
        .run_pod(&pod_config(&name_ls, &parent_ls))
        .await
        .unwrap();
    cleanup.pods.push(ls2);

    // after the transition period the BE pod is admitted
    let admitted = eventually(
        "BE admitted after the transition period",
        Duration::from_secs(20),
        || {
            let (mut t, name, parent) = (through.clone(), name.clone(), parent.clone());
            async move { t.run_pod(&pod_config(&name, &parent)).await.ok() }
        },
    )
    .await;
    cleanup.pods.push(admitted);

    // the admin API (qoslet explain, qoslet evictions) says why, with the figures
    let admin = AdminClient::new(channel(&q.admin).await);
    let list = evictions(&admin).await.unwrap();
    assert!(list.enabled && !list.dry_run);
    let ev = list
        .records
        .iter()
        .find(|r| r.sandbox_id == be)
        .unwrap_or_else(|| panic!("no record of the eviction: {list:?}"));
    assert_eq!(
        (ev.reason.as_str(), ev.signal.as_str(), ev.outcome.as_str()),
        ("node-pressure", "memory.available", "stopped")
    );
    assert!(
        ev.observed < ev.threshold && ev.threshold == 300 << 20,
        "{ev:?}"
    );
    assert_eq!(ev.grace_seconds, 1, "a hard threshold's grace");
    let refusal = list
        .records
        .iter()
        .find(|r| r.reason == "admission" && r.name == name)
        .unwrap_or_else(|| panic!("no record of the refusal: {list:?}"));
    assert_eq!(refusal.signal, "memory.available");
    let out = std::process::Command::new(qoslet_integration::process::qoslet_bin())
        .args([
            "explain",
            &format!("--admin=unix://{}", q.admin.display()),
            &name,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refused admission") && text.contains("memory.available"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // /metrics counts it, by reason
    let (_, m) = http_get(port, "/metrics");
    assert!(
        m.lines()
            .any(|l| l.starts_with("qoslet_evictions_total{reason=\"node-pressure\"} 1")),
        "{m}"
    );
    assert!(m.contains("qoslet_admission_refusals_total"), "{m}");
    // the kernel woke the loop (cgroup v1's memory threshold notification)
    let wakeups: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("qoslet_eviction_wakeups_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(wakeups >= 1.0, "no notification woke the loop: {m}");
    eprintln!("BE pod stopped {took:?} after its container started (it allocates 320 MiB first)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_dry_run_evicts_nothing_and_refuses_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let dir = scratch("eviction-dry");
    let q = QosletProcess::with_config(&dir, &tb.sock, &config(true, &root), &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let (ls, be, _, _) = pods(&q, &tb, &mut cleanup, "dry").await;
    eventually("a dry-run decision", Duration::from_secs(30), || {
        let q = &q;
        async move { q.log_text().contains("dry run: would evict").then_some(()) }
    })
    .await;
    assert!(
        direct.sandbox_ready(&be).await,
        "dry run stopped the BE pod"
    );
    assert!(direct.sandbox_ready(&ls).await);
    let mut through = Cri::connect(&q.sock).await;
    let name = unique("dry-be2");
    let parent = tb.cgroup_parent_in("besteffort", &name);
    cleanup.cgroups.push(parent.clone());
    let id = through.run_pod(&pod_config(&name, &parent)).await.unwrap();
    cleanup.pods.push(id);
    assert!(q.log_text().contains("dry run: would refuse"));
}

/// A 64 MiB tmpfs under `dir` to stand for nodefs (small enough to fill),
/// unmounted when the guard drops.
fn tmpfs_nodefs(dir: &std::path::Path) -> (std::path::PathBuf, Unmount) {
    let fs = dir.join("nodefs");
    std::fs::create_dir_all(&fs).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&fs)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs for nodefs");
    (fs.clone(), Unmount(fs))
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn ctr(sock: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("ctr")
        .args(["--connect-timeout", "2s", "-a"])
        .arg(sock)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .expect("ctr");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn image_listed(cri: &mut Cri, name: &str) -> bool {
    cri.img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images
        .iter()
        .any(|i| i.repo_tags.iter().any(|t| t == name))
}

/// Disk pressure on nodefs (a 64 MiB tmpfs filled past `nodefs.available`):
/// node-level reclaim removes an image no container uses, before any pod is
/// touched; the sandbox image and the images in use stay; then, the pressure
/// lasting, the BE pod is evicted; a BE pod is refused under DiskPressure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_disk_pressure_collects_an_unused_image_before_any_pod() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let dir = scratch("eviction-disk");
    let (fs, _unmount) = tmpfs_nodefs(&dir);
    // an image no container uses (its own id; a tag of an image in use would
    // be in use): the test bed's spare image, imported again (a run before
    // this one collected it)
    let unused = "localhost/testbed/spare:1".to_string();
    let tar = tb.work.join("images-v2.oci.tar").display().to_string();
    ctr(
        &tb.sock,
        &["images", "import", "--snapshotter", "overlayfs", &tar],
    );
    let mut direct = Cri::connect(&tb.sock).await;
    assert!(image_listed(&mut direct, &unused).await);

    let config = format!(
        "eviction:\n  nodefsPath: {}\n  imagefsPath: {}\n  evictionHard:\n    nodefs.available: 40Mi\n  \
         evictionPressureTransitionPeriod: 5s\n  imageMinimumGCAge: 0s\n",
        fs.display(),
        fs.display()
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &config, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut through = Cri::connect(&q.sock).await;
    let name = unique("disk-be");
    let parent = tb.cgroup_parent_in("besteffort", &name);
    let be = through.run_pod(&pod_config(&name, &parent)).await.unwrap();
    cleanup.pods.push(be.clone());
    cleanup.cgroups.push(parent.clone());
    let c = through
        .create(
            &be,
            &pod_config(&name, &parent),
            container_config("idle", SLEEP_LOOP, None),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();

    // 30 MiB written: 34 MiB available < 40 MiB
    std::fs::write(fs.join("fill"), vec![1u8; 30 << 20]).unwrap();
    eventually(
        "the unused image collected",
        Duration::from_secs(20),
        || {
            let (mut d, unused) = (direct.clone(), unused.clone());
            async move { (!image_listed(&mut d, &unused).await).then_some(()) }
        },
    )
    .await;
    assert!(
        direct.sandbox_ready(&be).await,
        "a pod was touched before node-level reclaim"
    );
    for kept in [
        qoslet_integration::testbed::BUSYBOX,
        qoslet_integration::testbed::PAUSE,
    ] {
        assert!(image_listed(&mut direct, kept).await, "{kept} removed");
    }
    // a BE pod is refused under DiskPressure
    let other = unique("disk-be2");
    let other_parent = tb.cgroup_parent_in("besteffort", &other);
    cleanup.cgroups.push(other_parent.clone());
    let st = through
        .run_pod(&pod_config(&other, &other_parent))
        .await
        .expect_err("a BE pod admitted under DiskPressure");
    assert!(st.message().contains("DiskPressure"), "{}", st.message());
    // the pressure lasts (the file is not an image): the BE pod goes
    eventually(
        "the BE pod evicted for disk",
        Duration::from_secs(20),
        || {
            let (mut d, be) = (direct.clone(), be.clone());
            async move { (!d.sandbox_ready(&be).await).then_some(()) }
        },
    )
    .await;
    drop(q);
    std::fs::remove_file(fs.join("fill")).unwrap();
    let log = std::fs::read_to_string(dir.join("qoslet.log")).unwrap_or_default();
    assert!(log.contains("node-level reclaim"), "{log}");
    for kept in [
        qoslet_integration::testbed::BUSYBOX,
        qoslet_integration::testbed::PAUSE,
    ] {
        assert!(image_listed(&mut direct, kept).await, "{kept} removed");
    }
}

/// Koordinator's BE memory model alone (no kubelet thresholds): the NodeSLO
/// policy's `memoryEvictThresholdPercent` over the scope evicts the pod
/// labelled BE, not the LS pod, and the evicted pod is refused re-admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_be_memory_eviction_by_koordinators_policy() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let dir = scratch("eviction-koord");
    let config = format!(
        "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    memoryEvictThresholdPercent: 40\n\
         eviction:\n  beMemoryEvict: true\n  memoryCapacity: 640Mi\n  cgroupScope: {root}/kubepods\n"
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &config, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let mut through = Cri::connect(&q.sock).await;
    let ls_name = unique("koord-ls");
    let ls_parent = tb.cgroup_parent_in("burstable", &ls_name);
    let ls = through
        .run_pod(&pod_config(&ls_name, &ls_parent))
        .await
        .unwrap();
    cleanup.pods.push(ls.clone());
    cleanup.cgroups.push(ls_parent.clone());
    let be_name = unique("koord-be");
    let be_parent = tb.cgroup_parent_in("besteffort", &be_name);
    let mut be_cfg = pod_config(&be_name, &be_parent);
    be_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    let be = through.run_pod(&be_cfg).await.unwrap();
    cleanup.pods.push(be.clone());
    cleanup.cgroups.push(be_parent.clone());
    let c = through
        .create(&be, &be_cfg, container_config("grow", GROW, None))
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    eventually(
        "the BE pod evicted by the BE model",
        Duration::from_secs(30),
        || {
            let (mut d, be) = (direct.clone(), be.clone());
            async move { (!d.sandbox_ready(&be).await).then_some(()) }
        },
    )
    .await;
    assert_eq!(stopped_record(&q, &be).await.reason, "be-memory");
    assert!(direct.sandbox_ready(&ls).await, "the LS pod was touched");
    let log = q.log_text();
    assert!(log.contains("model=\"be-memory\""), "{log}");
    // kubelet recreates the sandbox: refused for a while
    let st = through
        .run_pod(&be_cfg)
        .await
        .expect_err("the evicted BE pod admitted again at once");
    assert!(st.message().contains("evicted"), "{}", st.message());
}

/// Issue 30: qoslet killed (SIGKILL) right after an eviction and started
/// again does not admit the evicted pod when kubelet recreates its sandbox
/// (it would grow and be evicted a second time): the records of the previous
/// run are kept in the state dir (0600) and read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_restart_under_pressure_does_not_evict_twice() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let dir = scratch("eviction-restart");
    let mut q = QosletProcess::with_config(&dir, &tb.sock, &config(false, &root), &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let (ls, be, _, be_name) = pods(&q, &tb, &mut cleanup, "restart").await;
    eventually("the BE pod stopped", Duration::from_secs(30), || {
        let (mut d, be) = (direct.clone(), be.clone());
        async move { (!d.sandbox_ready(&be).await).then_some(()) }
    })
    .await;
    // the record, then the file that holds it (the file is written once
    // before the stop too, naming the victim only)
    stopped_record(&q, &be).await;
    let file = q.state_dir.join("evictions.json");
    eventually("the records written", Duration::from_secs(5), || {
        let (file, be) = (file.clone(), be.clone());
        async move {
            let text = std::fs::read_to_string(&file).ok()?;
            (text.contains(&be) && text.contains("\"stopped\"")).then_some(())
        }
    })
    .await;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "evictions.json is private");
    }
    q.kill9();
    q.restart();
    // kubelet recreates the evicted pod's sandbox (next attempt, same UID):
    // refused, though the pressure is gone with the pod
    let through = Cri::connect(&q.sock).await;
    let mut again = pod_config(&be_name, &tb.cgroup_parent_in("besteffort", &be_name));
    again.metadata.as_mut().unwrap().attempt = 1;
    let st = eventually(
        "the recreated sandbox refused",
        Duration::from_secs(10),
        || {
            let (mut t, again) = (through.clone(), again.clone());
            async move { t.run_pod(&again).await.err() }
        },
    )
    .await;
    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
    assert!(
        st.message().contains("was evicted") && st.message().contains("node-pressure"),
        "{}",
        st.message()
    );
    // the restarted agent lists the previous run's eviction
    let admin = AdminClient::new(channel(&q.admin).await);
    let list = evictions(&admin).await.unwrap();
    assert!(
        list.records
            .iter()
            .any(|r| r.sandbox_id == be && r.outcome == "stopped"),
        "{list:?}"
    );
    assert!(
        q.log_text()
            .contains("eviction records of the previous run restored"),
        "{}",
        q.log_text()
    );
    assert!(direct.sandbox_ready(&ls).await, "the LS pod was touched");
}

/// A BE pod labelled BE in a trusted namespace, asking `milli` batch-cpu,
/// spinning on CPU.
async fn spinning_be(
    through: &mut Cri,
    tb: &Testbed,
    cleanup: &mut Cleanup,
    tag: &str,
    milli: u32,
) -> String {
    let name = unique(tag);
    let parent = tb.cgroup_parent_in("besteffort", &name);
    let mut cfg = pod_config(&name, &parent);
    cfg.labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    cfg.annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        format!(
            r#"{{"containers":{{"spin":{{"requests":{{"kubernetes.io/batch-cpu":"{milli}"}},"limits":{{"kubernetes.io/batch-cpu":"{milli}"}}}}}}}}"#
        ),
    );
    let id = through.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(id.clone());
    cleanup.cgroups.push(parent);
    let res = cri::LinuxContainerResources {
        cpu_shares: 2,
        cpu_period: 100_000,
        ..Default::default()
    };
    let c = through
        .create(
            &id,
            &cfg,
            container_config("spin", "while :; do :; done", Some(res)),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    id
}

/// Issue 30: Koordinator's BE CPU-satisfaction eviction with spinning BE
/// pods under a suppressed quota. `cpuSuppressMinPercent: 30` holds the
/// besteffort quota at 0.6 of this machine's 2 cores; two BE pods ask 1000m
/// batch-cpu each: satisfaction 600 / 2000 = 30% <= 60%, so 2000 x (80% -
/// 30%) = 1000m must be released: one pod (its request covers it), and the
/// other stays through the 20 s cool-down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_be_cpu_satisfaction_evicts_just_enough() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let be_parent = format!("{root}/kubepods/besteffort");
    let unlimit = || {
        let f = std::path::Path::new("/sys/fs/cgroup/cpu")
            .join(be_parent.trim_start_matches('/'))
            .join("cpu.cfs_quota_us");
        let _ = std::fs::write(f, "-1");
    };
    let yaml = format!(
        "trust:\n  namespaces: [qoslet-e2e]\n\
         policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressPolicy: cfsQuota\n    \
         cpuSuppressThresholdPercent: 1\n    cpuSuppressMinPercent: 30\n    memoryEvictThresholdPercent: 100\n    \
         cpuEvictBESatisfactionLowerPercent: 60\n    cpuEvictBESatisfactionUpperPercent: 80\n    \
         cpuEvictBEUsageThresholdPercent: 50\n    cpuEvictTimeWindowSeconds: 3\n\
         qosEngine:\n  beParent: {be_parent}\n\
         eviction:\n  beCpuEvict: true\n  cgroupScope: {root}/kubepods\n"
    );
    let dir = scratch("eviction-cpu");
    let q = QosletProcess::with_config(&dir, &tb.sock, &yaml, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let mut through = Cri::connect(&q.sock).await;
    let a = spinning_be(&mut through, &tb, &mut cleanup, "cpu-a", 1000).await;
    let b = spinning_be(&mut through, &tb, &mut cleanup, "cpu-b", 1000).await;
    // the engine cuts the besteffort quota to the floor
    eventually(
        "the BE quota cut to 0.6 cores",
        Duration::from_secs(20),
        || async {
            let q: i64 =
                qoslet_integration::testbed::cgroup_v1("cpu", &be_parent, "cpu.cfs_quota_us")
                    .parse()
                    .unwrap_or(-1);
            (q > 0 && q <= 61_000).then_some(())
        },
    )
    .await;
    // one of them goes (not before the 20 s after start koordlet waits too)
    let stopped = eventually("a BE pod evicted for CPU", Duration::from_secs(60), || {
        let (mut d, a, b) = (direct.clone(), a.clone(), b.clone());
        async move {
            let (ra, rb) = (d.sandbox_ready(&a).await, d.sandbox_ready(&b).await);
            (!ra || !rb).then_some((ra, rb))
        }
    })
    .await;
    assert!(
        stopped.0 || stopped.1,
        "both evicted in one round: {stopped:?}"
    );
    let survivor = if stopped.0 { a.clone() } else { b.clone() };
    let victim = if stopped.0 { b.clone() } else { a.clone() };
    let ev = stopped_record(&q, &victim).await;
    assert_eq!(ev.reason, "be-cpu-satisfaction", "{ev:?}");
    assert!(
        ev.message
            .contains("cpuEvictBESatisfactionLowerPercent 60%")
            && ev.observed <= 60,
        "{ev:?}"
    );
    // within the cool-down the other one keeps running
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        direct.sandbox_ready(&survivor).await,
        "a second pod within the cool-down"
    );
    drop(q);
    unlimit();
}

/// A BE pod (BestEffort) holding `mib` MiB of anonymous memory.
async fn holding(
    through: &mut Cri,
    tb: &Testbed,
    cleanup: &mut Cleanup,
    tag: &str,
    mib: u64,
) -> (String, String) {
    let name = unique(tag);
    let parent = tb.cgroup_parent_in("besteffort", &name);
    let id = through.run_pod(&pod_config(&name, &parent)).await.unwrap();
    cleanup.pods.push(id.clone());
    cleanup.cgroups.push(parent.clone());
    let script = format!(
        "x=$(head -c {} /dev/zero | tr '\\0' a); while true; do sleep 0.2; done",
        mib << 20
    );
    let res = cri::LinuxContainerResources {
        cpu_shares: 2,
        ..Default::default()
    };
    let c = through
        .create(
            &id,
            &pod_config(&name, &parent),
            container_config("hold", &script, Some(res)),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    (id, parent)
}

/// Issue 30: the `eviction:` section is reloaded while qoslet runs, and a
/// soft threshold waits its grace period: two BE pods hold 260 and 110 MiB
/// of a 640 MiB node while no threshold is set; the file then sets
/// `evictionSoft memory.available: 300Mi` with a 4 s grace period. MemoryPressure
/// is raised at once, the larger pod is evicted no sooner than 4 s later
/// (kubelet's ranking: both BestEffort, the larger use first), and only one
/// (the other brings the node back under the threshold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_reloaded_soft_threshold_waits_its_grace_and_takes_the_larger_pod() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let root = kubelet_cgroup_root(&tb.sock);
    let dir = scratch("eviction-soft");
    let base = format!(
        "eviction:\n  memoryCapacity: 640Mi\n  cgroupScope: {root}/kubepods\n  \
         enforceNodeAllocatable: false\n  evictionPressureTransitionPeriod: 5s\n"
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &base, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let mut through = Cri::connect(&q.sock).await;
    let (big, big_cg) = holding(&mut through, &tb, &mut cleanup, "soft-big", 260).await;
    let (small, small_cg) = holding(&mut through, &tb, &mut cleanup, "soft-small", 110).await;
    eventually(
        "both pods hold their memory",
        Duration::from_secs(60),
        || {
            let (b, s) = (big_cg.clone(), small_cg.clone());
            async move { (usage_mib(&b) >= 255 && usage_mib(&s) >= 105).then_some(()) }
        },
    )
    .await;
    assert!(direct.sandbox_ready(&big).await && direct.sandbox_ready(&small).await);
    // the soft threshold, by editing the file qoslet runs with
    std::fs::write(
        dir.join("qoslet.yaml"),
        format!(
            "{base}  evictionSoft:\n    memory.available: 300Mi\n  evictionSoftGracePeriod:\n    memory.available: 4s\n"
        ),
    )
    .unwrap();
    let admin = AdminClient::new(channel(&q.admin).await);
    // a lower bound of the wait: raised no later than the answer that first
    // showed MemoryPressure, evicted no earlier than the start of the last
    // look that still found the pod ready
    let raised = eventually("MemoryPressure raised", Duration::from_secs(15), || async {
        evictions(&admin)
            .await
            .ok()?
            .conditions
            .iter()
            .any(|c| c == "MemoryPressure")
            .then(Instant::now)
    })
    .await;
    let last_ready = std::sync::Arc::new(std::sync::Mutex::new(raised));
    eventually("the larger pod evicted", Duration::from_secs(20), || {
        let (mut d, big, last) = (direct.clone(), big.clone(), last_ready.clone());
        async move {
            let asked = Instant::now();
            if d.sandbox_ready(&big).await {
                *last.lock().unwrap() = asked;
                return None;
            }
            Some(())
        }
    })
    .await;
    let evicted = *last_ready.lock().unwrap();
    let waited = evicted - raised;
    assert!(
        waited >= Duration::from_millis(3500),
        "the pod last seen ready {waited:?} after the soft threshold was met (grace 4 s)"
    );
    assert!(
        q.log_text().contains("eviction: section reloaded"),
        "{}",
        q.log_text()
    );
    // one pod only: the smaller one stays
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        direct.sandbox_ready(&small).await,
        "the smaller pod was evicted too"
    );
    let list = evictions(&admin).await.unwrap();
    let ev: Vec<_> = list
        .records
        .iter()
        .filter(|r| r.reason == "node-pressure")
        .collect();
    assert_eq!(ev.len(), 1, "{list:?}");
    assert_eq!(ev[0].sandbox_id, big);
    assert_eq!(ev[0].threshold, 300 << 20);
    eprintln!("soft threshold met -> eviction: {waited:?}");
}

/// Issue 30: disk pressure ranks pods by their own disk use, as kubelet's
/// summary counts it (the containers' writable layers from the runtime,
/// logs, emptyDir volumes): of two BE pods, the one that wrote 16 MiB into
/// its container's filesystem goes first, with kubelet's message naming the
/// container and its use; the other still runs then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_disk_pressure_ranks_pods_by_their_disk_use() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let dir = scratch("eviction-disk-rank");
    let (fs, _unmount) = tmpfs_nodefs(&dir);
    // images first seen an hour ago at most are kept: node-level reclaim
    // frees nothing here, pods go
    let config = format!(
        "eviction:\n  nodefsPath: {}\n  imagefsPath: {}\n  evictionHard:\n    nodefs.available: 40Mi\n  \
         evictionPressureTransitionPeriod: 5s\n  imageMinimumGCAge: 1h\n",
        fs.display(),
        fs.display()
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &config, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let mut through = Cri::connect(&q.sock).await;
    let pod = |tag: &str, script: String| {
        let name = unique(tag);
        let parent = tb.cgroup_parent_in("besteffort", &name);
        (name, parent, script)
    };
    let light = pod("disk-light", SLEEP_LOOP.to_string());
    let heavy = pod(
        "disk-heavy",
        format!("head -c {} /dev/zero > /big; {SLEEP_LOOP}", 16 << 20),
    );
    let mut ids = vec![];
    for (name, parent, script) in [&light, &heavy] {
        let id = through.run_pod(&pod_config(name, parent)).await.unwrap();
        cleanup.pods.push(id.clone());
        cleanup.cgroups.push(parent.clone());
        let c = through
            .create(
                &id,
                &pod_config(name, parent),
                container_config("writer", script, None),
            )
            .await
            .unwrap();
        through.start(&c).await.unwrap();
        ids.push(id);
    }
    let (light_id, heavy_id) = (ids[0].clone(), ids[1].clone());
    // the heavy pod's 16 MiB written, and seen by the runtime (containerd
    // refreshes its snapshot usage every 10 s)
    eventually(
        "the runtime reports the heavy writable layer",
        Duration::from_secs(40),
        || {
            let (mut d, heavy) = (direct.clone(), heavy_id.clone());
            async move {
                let stats =
                    d.rt.list_container_stats(cri::ListContainerStatsRequest {
                        filter: Some(cri::ContainerStatsFilter {
                            pod_sandbox_id: heavy,
                            ..Default::default()
                        }),
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .stats;
                stats
                    .iter()
                    .any(|s| {
                        s.writable_layer
                            .as_ref()
                            .and_then(|w| w.used_bytes.as_ref())
                            .is_some_and(|u| u.value >= 16 << 20)
                    })
                    .then_some(())
            }
        },
    )
    .await;
    std::fs::write(fs.join("fill"), vec![1u8; 30 << 20]).unwrap();
    eventually("a pod evicted for disk", Duration::from_secs(30), || {
        let (mut d, a, b) = (direct.clone(), light_id.clone(), heavy_id.clone());
        async move { (!d.sandbox_ready(&a).await || !d.sandbox_ready(&b).await).then_some(()) }
    })
    .await;
    let light_ready = direct.sandbox_ready(&light_id).await;
    let heavy_ready = direct.sandbox_ready(&heavy_id).await;
    drop(q);
    std::fs::remove_file(fs.join("fill")).unwrap();
    assert!(
        !heavy_ready && light_ready,
        "the pod with more disk use goes first (heavy ready {heavy_ready}, light ready {light_ready})"
    );
    let log = std::fs::read_to_string(dir.join("qoslet.log")).unwrap_or_default();
    assert!(
        log.contains("Container writer was using 16") && log.contains("ephemeral-storage"),
        "{log}"
    );
}
