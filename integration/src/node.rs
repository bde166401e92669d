//! A real node of its own: the cgroup v2 + systemd guest of the VM test bed
//! (`integration/vm/`), where containerd runs as the system's service with
//! `SystemdCgroup = true`, as under a kubelet with `cgroupDriver: systemd`.
//! The tests of `tests/node_v2.rs` run inside that guest.

use std::path::{Path, PathBuf};

use qoslet_cgroups::CgroupPath;

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
