//! A real node of its own: the cgroup v2 + systemd guest of the VM test bed
//! (`integration/vm/`), where containerd runs as the system's service with
//! `SystemdCgroup = true`, as under a kubelet with `cgroupDriver: systemd`.
//! The tests of `tests/node_v2.rs` run inside that guest.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use qoslet_cgroups::CgroupPath;

use crate::testbed::{container_config, pod_config, Cri, SLEEP_LOOP};

/// A containerd of the guest: its version, systemd unit, CRI and NRI sockets.
#[derive(Debug, Clone)]
pub struct Containerd {
    pub version: &'static str,
    pub unit: &'static str,
    pub sock: PathBuf,
    pub nri: PathBuf,
}

/// The guest's containerd the tests use: the system's 1.7 (trixie's), or the
/// one `QOSLET_TEST_CONTAINERD` names: `2.1` is Debian sid's, beside it with
/// sockets of its own (`integration/vm/guest/containerd21.*`).
pub fn containerd() -> Containerd {
    match std::env::var("QOSLET_TEST_CONTAINERD").as_deref() {
        Ok("2.1") => Containerd {
            version: "2.1",
            unit: "containerd21.service",
            sock: "/run/containerd21/containerd.sock".into(),
            nri: "/run/nri21/nri.sock".into(),
        },
        Ok("" | "1.7") | Err(_) => Containerd {
            version: "1.7",
            unit: "containerd.service",
            sock: "/run/containerd/containerd.sock".into(),
            nri: "/run/nri/nri.sock".into(),
        },
        Ok(v) => panic!("QOSLET_TEST_CONTAINERD={v}: the guest has containerd 1.7 and 2.1"),
    }
}

/// The node: its containerd and cgroup v2 root.
#[derive(Debug, Clone)]
pub struct Node {
    /// containerd's CRI socket.
    pub sock: PathBuf,
    /// containerd's NRI socket.
    pub nri: PathBuf,
    /// containerd's systemd unit.
    pub unit: &'static str,
    pub cgroup_root: PathBuf,
}

impl Node {
    /// The node this test runs on; panics with instructions unless it is a
    /// cgroup v2 + systemd node with containerd answering.
    pub fn systemd_v2() -> Self {
        let c = containerd();
        let n = Self {
            sock: c.sock,
            nri: c.nri,
            unit: c.unit,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        };
        assert!(
            n.cgroup_root.join("cgroup.controllers").is_file()
                && Path::new("/run/systemd/system").is_dir(),
            "not a cgroup v2 + systemd node: these tests run in the VM test bed \
             (integration/vm/suite.sh, or integration/run-tests.sh)"
        );
        assert!(
            std::os::unix::net::UnixStream::connect(&n.sock).is_ok(),
            "containerd does not answer on {}",
            n.sock.display()
        );
        n
    }

    /// kubelet's cgroup parent for a pod of QoS `qos` (`burstable`, `besteffort`,
    /// "" for Guaranteed) with the systemd driver: the pod's slice name, its
    /// uid's dashes as underscores (`kubepods-besteffort-pod<uid>.slice`).
    pub fn slice(qos: &str, uid: &str) -> String {
        let uid = uid.replace('-', "_");
        if qos.is_empty() {
            format!("kubepods-pod{uid}.slice")
        } else {
            format!("kubepods-{qos}-pod{uid}.slice")
        }
    }

    /// The cgroup directory of a pod (`container` None) or of one of its
    /// containers (`cri-containerd-<id>.scope`), as systemd nests it.
    pub fn cgroup_dir(&self, slice: &str, container: Option<&str>) -> PathBuf {
        let pod = CgroupPath::pod(slice).expect("a pod slice");
        let p = match container {
            Some(id) => pod.container(id).expect("a container scope"),
            None => pod,
        };
        self.cgroup_root.join(p.as_str())
    }

    /// A file of that cgroup, trimmed (panics when unreadable).
    pub fn read(&self, slice: &str, container: Option<&str>, file: &str) -> String {
        crate::read_trimmed(&self.cgroup_dir(slice, container).join(file))
    }

    /// The systemd unit of a pod's slice or a container's scope.
    pub fn unit(slice: &str, container: Option<&str>) -> String {
        match container {
            Some(id) => format!("cri-containerd-{id}.scope"),
            None => slice.to_string(),
        }
    }
}

/// `systemctl ARGS...`, asserted to succeed; its stdout.
pub fn systemctl(args: &[&str]) -> String {
    let o = std::process::Command::new("systemctl")
        .args(args)
        .output()
        .expect("systemctl");
    assert!(
        o.status.success(),
        "systemctl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A BE pod's batch resources (Koordinator's extended-resource-spec annotation).
pub const SPEC: &str = r#"{"containers":{"batch":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#;

/// A pod uid without dashes' trouble: systemd slice names take them as nesting.
pub fn uid(tag: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!("{tag}{}x{t}", std::process::id())
}

/// A pod config with Koordinator's QoS label and, if any, its batch resources.
pub fn classed(name: &str, slice: &str, class: &str, spec: Option<&str>) -> cri::PodSandboxConfig {
    let mut p = pod_config(name, slice);
    p.labels
        .insert("koordinator.sh/qosClass".into(), class.into());
    if let Some(s) = spec {
        p.annotations.insert(
            "node.koordinator.sh/extended-resource-spec".into(),
            s.into(),
        );
    }
    p
}

/// What kubelet sends for a BestEffort container (batch resources are not cpu/memory).
pub fn besteffort() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 0,
        cpu_shares: 2,
        ..Default::default()
    }
}

/// A BE pod with batch resources (one container) through `cri`: its id, the
/// container's, its slice.
pub async fn be_pod(cri: &mut Cri, tag: &str) -> (String, String, String) {
    let name = uid(tag);
    let slice = Node::slice("besteffort", &name);
    let cfg = classed(&name, &slice, "BE", Some(SPEC));
    let pod = cri.run_pod(&cfg).await.unwrap();
    let ctr = cri
        .create(
            &pod,
            &cfg,
            container_config("batch", SLEEP_LOOP, Some(besteffort())),
        )
        .await
        .unwrap();
    cri.start(&ctr).await.unwrap();
    (pod, ctr, slice)
}

/// What qoslet sets for a BE pod, as the v2 files show it.
pub fn be_files(node: &Node, slice: &str, ctr: &str) -> Vec<(String, String)> {
    let c = Some(ctr);
    [
        ("scope cpu.max", node.read(slice, c, "cpu.max")),
        ("scope cpu.weight", node.read(slice, c, "cpu.weight")),
        ("scope memory.max", node.read(slice, c, "memory.max")),
        ("slice cpu.idle", node.read(slice, None, "cpu.idle")),
        ("slice cpu.max", node.read(slice, None, "cpu.max")),
        ("slice memory.max", node.read(slice, None, "memory.max")),
        ("slice io.max", node.read(slice, None, "io.max")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
