//! The real containerd + runc test bed, and CRI helpers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cri::image_service_client::ImageServiceClient;
use cri::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1 as cri;
use tonic::transport::Channel;

/// The workload image and the sandbox image the test bed imports.
pub const BUSYBOX: &str = "localhost/testbed/busybox:1.35";
pub const PAUSE: &str = "localhost/testbed/pause:3.9";

/// One containerd instance of the test bed.
#[derive(Debug, Clone)]
pub struct Testbed {
    /// The test bed's work dir (`QOSLET_TESTBED`, default /tmp/qoslet-testbed).
    pub work: PathBuf,
    pub instance: String,
    /// "1.6", "1.7" or "2.1".
    pub version: String,
    /// containerd's CRI socket.
    pub sock: PathBuf,
    /// Every test pod's cgroup parent lives under this (cgroup v1 relative path).
    pub cgroup_prefix: String,
    /// How its containerd places pods in cgroups.
    pub driver: Driver,
}

/// Where a test's containerd puts pods: this host's test bed (the cgroupfs
/// driver on cgroup v1, containerd run by `testbed.sh`), or the VM test bed's
/// guest (the systemd driver on cgroup v2, containerd the system's service;
/// `integration/vm/suite.sh` runs the tests there with
/// `QOSLET_TEST_NODE=systemd-v2`). The same test reads the same setting from
/// either node's files ([`Testbed::cg`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    CgroupfsV1,
    SystemdV2,
}

/// True inside the VM test bed's guest (`QOSLET_TEST_NODE=systemd-v2`).
pub fn on_systemd_v2() -> bool {
    std::env::var_os("QOSLET_TEST_NODE").is_some_and(|v| v == "systemd-v2")
}

/// A setting of a cgroup, named once for both hierarchies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    /// v1 `cpu.shares`; v2 `cpu.weight`.
    CpuShares,
    /// v1 `cpu.cfs_quota_us`; v2 `cpu.max`'s quota (`max` read as -1).
    CpuQuota,
    /// v1 `cpu.cfs_period_us`; v2 `cpu.max`'s period.
    CpuPeriod,
    /// v1 `cpu.cfs_burst_us`; v2 `cpu.max.burst`.
    CpuBurst,
    /// `cpu.idle` (both).
    CpuIdle,
    /// v1 `memory.limit_in_bytes`; v2 `memory.max`.
    MemoryLimit,
    /// The CPUs the cgroup may run on: v1 `cpuset.cpus`; v2 `cpuset.cpus.effective`
    /// (v2's `cpuset.cpus` holds only what was written).
    Cpuset,
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/testbed.sh")
}

pub fn work_dir() -> PathBuf {
    std::env::var_os("QOSLET_TESTBED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/qoslet-testbed"))
}

impl Testbed {
    /// The main instance (containerd 1.6). Panics with instructions when it is not up.
    pub fn main() -> Self {
        Self::instance("main", "1.6")
    }

    /// The containerd 1.7 instance (NRI, GetContainerEvents).
    pub fn ctd17() -> Self {
        Self::instance("ctd17", "1.7")
    }

    /// The containerd 2.1 instance (Debian sid's 2.1.9, NRI v0.8), started if
    /// it is not up. NRI plugins register with it; its pods do not start on
    /// this machine (runc fails), so no test runs pods on it.
    pub fn ctd21() -> Self {
        Self::start_instance("ctd21", "2.1")
    }

    pub fn instance(name: &str, version: &str) -> Self {
        let work = work_dir();
        let tb = Self {
            sock: work.join(name).join("containerd.sock"),
            work,
            instance: name.into(),
            version: version.into(),
            cgroup_prefix: CGROUP_PREFIX.into(),
            driver: Driver::CgroupfsV1,
        };
        if on_systemd_v2() {
            return Self::systemd_v2(version);
        }
        assert!(
            std::os::unix::net::UnixStream::connect(&tb.sock).is_ok(),
            "the real-runtime test bed is not running ({} does not answer).\n\
             These tests need root and a real containerd: run `integration/testbed/testbed.sh up` \
             (and `CONTAINERD=1.7 INSTANCE=ctd17 integration/testbed/testbed.sh up`, \
             `CONTAINERD=2.1 INSTANCE=ctd21 integration/testbed/testbed.sh up`), or `integration/run-tests.sh`.",
            tb.sock.display()
        );
        tb
    }

    /// The guest's containerd ([`crate::node::containerd`]: its system 1.7
    /// unless the suite names another), whatever `version` the host's test asked
    /// for: one containerd in the guest runs pods at a time.
    fn systemd_v2(_version: &str) -> Self {
        let node = crate::node::Node::systemd_v2();
        Self {
            work: PathBuf::from("/root/images"),
            instance: node.unit.into(),
            version: crate::node::containerd().version.into(),
            sock: node.sock,
            cgroup_prefix: String::new(),
            driver: Driver::SystemdV2,
        }
    }

    /// Starts (installing nothing new) a private containerd instance `name`; `version` is "1.6", "1.7" or "2.1".
    /// In the guest: its system containerd.
    pub fn start_instance(name: &str, version: &str) -> Self {
        if !on_systemd_v2() {
            run_script(&["up"], name, version);
        }
        Self::instance(name, version)
    }

    /// Stops containerd and waits until it is gone (in the guest: `systemctl
    /// stop`, which also cancels a restart systemd scheduled after a kill).
    pub fn stop_containerd(&self) {
        match self.driver {
            Driver::CgroupfsV1 => run_script(&["stop-containerd"], &self.instance, self.version()),
            Driver::SystemdV2 => {
                crate::node::systemctl(&["stop", &self.instance]);
            }
        }
    }

    pub fn start_containerd(&self) {
        match self.driver {
            Driver::CgroupfsV1 => run_script(&["start-containerd"], &self.instance, self.version()),
            Driver::SystemdV2 => {
                crate::node::systemctl(&["start", &self.instance]);
            }
        }
    }

    /// Stops this instance (in the guest: leaves the system containerd running).
    pub fn down(&self) {
        match self.driver {
            Driver::CgroupfsV1 => run_script(&["down"], &self.instance, self.version()),
            Driver::SystemdV2 => {
                crate::node::systemctl(&["start", &self.instance]);
            }
        }
    }

    /// The OCI archive of the test images (served by [`crate::registry::Registry`]).
    pub fn images_tar(&self) -> PathBuf {
        match self.driver {
            Driver::CgroupfsV1 => self.work.join("images-v2.oci.tar"),
            Driver::SystemdV2 => self.work.join("testbed.oci.tar"),
        }
    }

    fn version(&self) -> &str {
        &self.version
    }

    /// The containerd PID (from the script's pid file; in the guest, systemd's MainPID).
    pub fn containerd_pid(&self) -> Option<i32> {
        if self.driver == Driver::SystemdV2 {
            let pid = crate::node::systemctl(&["show", "-P", "MainPID", &self.instance]);
            return pid.parse().ok().filter(|p| *p > 0);
        }
        std::fs::read_to_string(self.work.join(&self.instance).join("containerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn grpcurl(&self) -> PathBuf {
        self.work.join("bin/grpcurl")
    }

    /// A fresh cgroup parent for one pod, under the test prefix, where kubelet
    /// puts a Guaranteed pod (`<root>/kubepods/pod<name>`).
    pub fn cgroup_parent(&self, pod: &str) -> String {
        self.cgroup_parent_in("", pod)
    }

    /// The same for a pod of Kubernetes QoS `qos` (`burstable`, `besteffort`;
    /// "" for Guaranteed).
    /// With the systemd driver: the pod's slice, `pod` as its uid.
    pub fn cgroup_parent_in(&self, qos: &str, pod: &str) -> String {
        if self.driver == Driver::SystemdV2 {
            return crate::node::Node::slice(qos, pod);
        }
        let qos = if qos.is_empty() {
            String::new()
        } else {
            format!("/{qos}")
        };
        format!(
            "{}/{}/kubepods{qos}/pod{}",
            self.cgroup_prefix, self.instance, pod
        )
    }
}

impl Testbed {
    /// A container's cgroup, as [`Testbed::cg`] takes it: under the pod's
    /// cgroup parent `cgp`, a directory named by its id (cgroupfs) or its
    /// `cri-containerd-<id>.scope` within the slices' nesting (systemd).
    pub fn container_cg(&self, cgp: &str, id: &str) -> String {
        match self.driver {
            Driver::CgroupfsV1 => format!("{cgp}/{id}"),
            Driver::SystemdV2 => {
                let pod = qoslet_cgroups::CgroupPath::pod(cgp).expect("a pod slice");
                pod.container(id)
                    .expect("a container scope")
                    .as_str()
                    .to_string()
            }
        }
    }

    /// A pod's own cgroup (its cgroup parent, nested as systemd nests slices).
    pub fn pod_cg(&self, cgp: &str) -> String {
        match self.driver {
            Driver::CgroupfsV1 => cgp.to_string(),
            Driver::SystemdV2 => qoslet_cgroups::CgroupPath::pod(cgp)
                .expect("a pod slice")
                .as_str()
                .to_string(),
        }
    }

    /// The value of `knob` in cgroup `cg` (relative to the hierarchy's root; ""
    /// for the root), read from the node's real files, trimmed; panics when
    /// unreadable.
    pub fn cg(&self, cg: &str, knob: Knob) -> String {
        match self.driver {
            Driver::CgroupfsV1 => {
                let (ctl, file) = match knob {
                    Knob::CpuShares => ("cpu", "cpu.shares"),
                    Knob::CpuQuota => ("cpu", "cpu.cfs_quota_us"),
                    Knob::CpuPeriod => ("cpu", "cpu.cfs_period_us"),
                    Knob::CpuBurst => ("cpu", "cpu.cfs_burst_us"),
                    Knob::CpuIdle => ("cpu", "cpu.idle"),
                    Knob::MemoryLimit => ("memory", "memory.limit_in_bytes"),
                    Knob::Cpuset => ("cpuset", "cpuset.cpus"),
                };
                cgroup_v1(ctl, cg, file)
            }
            Driver::SystemdV2 => {
                let read = |file: &str| {
                    crate::read_trimmed(
                        &Path::new("/sys/fs/cgroup")
                            .join(cg.trim_start_matches('/'))
                            .join(file),
                    )
                };
                let max = || {
                    let v = read("cpu.max");
                    let (q, p) = v.split_once(' ').unwrap_or((&v, ""));
                    (
                        if q == "max" {
                            "-1".to_string()
                        } else {
                            q.to_string()
                        },
                        p.to_string(),
                    )
                };
                match knob {
                    Knob::CpuShares => read("cpu.weight"),
                    Knob::CpuQuota => max().0,
                    Knob::CpuPeriod => max().1,
                    Knob::CpuBurst => read("cpu.max.burst"),
                    Knob::CpuIdle => read("cpu.idle"),
                    Knob::MemoryLimit => read("memory.max"),
                    Knob::Cpuset => read("cpuset.cpus.effective"),
                }
            }
        }
    }

    /// The memory cgroup `cg` charges now, in MiB (v1 `memory.usage_in_bytes`,
    /// v2 `memory.current`); 0 when unreadable.
    pub fn memory_usage_mib(&self, cg: &str) -> u64 {
        let file = match self.driver {
            Driver::CgroupfsV1 => return usage_mib(cg),
            Driver::SystemdV2 => Path::new("/sys/fs/cgroup")
                .join(cg.trim_start_matches('/'))
                .join("memory.current"),
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
            >> 20
    }

    /// kubelet's `kubepods` cgroup on this node, as qoslet's configuration
    /// names cgroups (`eviction.cgroupScope`): under the test bed's kubelet
    /// root on the host, `/kubepods.slice` with the systemd driver.
    pub fn kubepods_cg(&self) -> String {
        match self.driver {
            Driver::CgroupfsV1 => {
                format!(
                    "{}/kubepods",
                    crate::process::kubelet_cgroup_root(&self.sock)
                )
            }
            Driver::SystemdV2 => "/kubepods.slice".into(),
        }
    }

    /// What [`Knob::CpuShares`] reads after the runtime applied `shares`: the
    /// shares themselves on v1, on v2 the weight the guest's runc (trixie's 1.1)
    /// converts them to (`1 + (shares - 2) * 9999 / 262142`; newer runc releases
    /// convert with a curve, and a guest with one fails here, as it should).
    pub fn shares_read(&self, shares: u64) -> String {
        match self.driver {
            Driver::CgroupfsV1 => shares.to_string(),
            Driver::SystemdV2 => (1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142).to_string(),
        }
    }

    /// The file of `knob` inside a container of this node, where the container
    /// sees its own cgroup (v1: under the controller's mount; v2: the root of its
    /// cgroup namespace).
    pub fn file_in_container(&self, knob: Knob) -> &'static str {
        match (self.driver, knob) {
            (Driver::CgroupfsV1, Knob::CpuShares) => "/sys/fs/cgroup/cpu/cpu.shares",
            (Driver::SystemdV2, Knob::CpuShares) => "/sys/fs/cgroup/cpu.weight",
            (Driver::CgroupfsV1, Knob::MemoryLimit) => {
                "/sys/fs/cgroup/memory/memory.limit_in_bytes"
            }
            (Driver::SystemdV2, Knob::MemoryLimit) => "/sys/fs/cgroup/memory.max",
            (d, k) => panic!("no in-container file for {k:?} on {d:?}"),
        }
    }
}

fn run_script(args: &[&str], instance: &str, version: &str) {
    let out = Command::new(script())
        .args(args)
        .env("INSTANCE", instance)
        .env("CONTAINERD", version)
        .env("QOSLET_TESTBED", work_dir())
        .output()
        .expect("run testbed.sh");
    assert!(
        out.status.success(),
        "testbed.sh {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every test pod's cgroup parent lives under this (testbed.sh's CGROUP_PARENT_PREFIX).
pub const CGROUP_PREFIX: &str = "/qoslet-test";

/// CRI clients over one channel.
#[derive(Clone)]
pub struct Cri {
    pub rt: RuntimeServiceClient<Channel>,
    pub img: ImageServiceClient<Channel>,
}

impl Cri {
    pub async fn connect(sock: impl AsRef<Path>) -> Self {
        Self::from_channel(crate::channel(sock).await)
    }

    pub fn lazy(sock: impl AsRef<Path>) -> Self {
        Self::from_channel(crate::lazy_channel(sock))
    }

    pub fn from_channel(ch: Channel) -> Self {
        Self {
            rt: RuntimeServiceClient::new(ch.clone()).max_decoding_message_size(16 << 20),
            img: ImageServiceClient::new(ch).max_decoding_message_size(16 << 20),
        }
    }

    /// RunPodSandbox with host network, returns the sandbox id.
    pub async fn run_pod(&mut self, cfg: &cri::PodSandboxConfig) -> Result<String, tonic::Status> {
        Ok(self
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id)
    }

    pub async fn create(
        &mut self,
        pod: &str,
        pod_cfg: &cri::PodSandboxConfig,
        c: cri::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        Ok(self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(c),
                sandbox_config: Some(pod_cfg.clone()),
            })
            .await?
            .into_inner()
            .container_id)
    }

    pub async fn start(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .map(|_| ())
    }

    /// Whether pod sandbox `id` is ready (false once stopped, or unknown).
    pub async fn sandbox_ready(&mut self, id: &str) -> bool {
        self.rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
            .map(|s| {
                s.into_inner()
                    .status
                    .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            })
            .unwrap_or(false)
    }

    pub async fn status(&mut self, id: &str) -> Result<cri::ContainerStatus, tonic::Status> {
        Ok(self
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .unwrap_or_default())
    }

    /// Stops and removes a pod (and its containers), ignoring errors.
    pub async fn remove_pod(&mut self, id: &str) {
        let _ = self
            .rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await;
        let _ = self
            .rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await;
    }
}

/// Host network (no CNI on the test bed), own PID namespace, the pod's IPC.
fn host_network() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A host-network pod config under `cgroup_parent`.
pub fn pod_config(name: &str, cgroup_parent: &str) -> cri::PodSandboxConfig {
    let ns = host_network();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "qoslet-e2e".into(),
            attempt: 0,
        }),
        log_directory: work_dir().join("pods").join(name).display().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        annotations: HashMap::from([("qoslet.test/owner".to_string(), "integration".to_string())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(ns),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox container running `script` under `sh -c`, with `resources`.
pub fn container_config(
    name: &str,
    script: &str,
    resources: Option<cri::LinuxContainerResources>,
) -> cri::ContainerConfig {
    let ns = host_network();
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("trap 'exit 0' TERM; {script}"),
        ],
        log_path: format!("{name}/0.log"),
        labels: HashMap::from([("container".to_string(), name.to_string())]),
        linux: Some(cri::LinuxContainerConfig {
            resources,
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(ns),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// A long-running container script that exits promptly on SIGTERM.
pub const SLEEP_LOOP: &str = "while true; do sleep 0.2; done";

/// A cgroup's `memory.usage_in_bytes` in MiB (0 when unreadable).
pub fn usage_mib(cgroup: &str) -> u64 {
    cgroup_v1("memory", cgroup, "memory.usage_in_bytes")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        >> 20
}

/// Reads a cgroup v1 file, trimmed: `/sys/fs/cgroup/<controller>/<cgroup path>/<file>`.
pub fn cgroup_v1(controller: &str, cgroup: &str, file: &str) -> String {
    crate::read_trimmed(
        &Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(cgroup.trim_start_matches('/'))
            .join(file),
    )
}

/// Removes the (empty) pod-level cgroup dirs runc leaves behind under
/// `cgroup_parent`; a systemd slice (`*.slice`, the guest's pods) is stopped
/// through systemd instead, as kubelet does.
pub fn remove_cgroup_dirs(cgroup_parent: &str) {
    if cgroup_parent.ends_with(".slice") && !cgroup_parent.contains('/') {
        let _ = Command::new("systemctl")
            .args(["stop", cgroup_parent])
            .output();
        return;
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for ss in rd.flatten() {
            let d = ss.path().join(cgroup_parent.trim_start_matches('/'));
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// Removes the test's pods and cgroups even when the test fails (spinning
/// pods left behind would skew every later CPU measurement).
pub struct Cleanup {
    pub sock: PathBuf,
    pub pods: Vec<String>,
    pub cgroups: Vec<String>,
}

impl Cleanup {
    /// Removes pods through the runtime at `sock` (direct, not through qoslet).
    pub fn new(sock: &Path) -> Self {
        Self {
            sock: sock.into(),
            pods: Vec::new(),
            cgroups: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (sock, pods, cgroups) = (
            self.sock.clone(),
            std::mem::take(&mut self.pods),
            std::mem::take(&mut self.cgroups),
        );
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut direct = Cri::connect(&sock).await;
                for p in &pods {
                    direct.remove_pod(p).await;
                }
            });
            for cg in &cgroups {
                remove_cgroup_dirs(cg);
            }
        })
        .join();
    }
}

/// `python3 integration/peers/SCRIPT`, with the peers' PyPI packages (the
/// HTTP/2 and gRPC implementations that are not Rust's) on its path.
pub fn python_peer(script: &str) -> std::process::Command {
    let pkgs = work_dir().join("py-peers");
    assert!(
        pkgs.join("h2").is_dir() && pkgs.join("grpc").is_dir(),
        "{} lacks the peers' Python packages: run `integration/testbed/testbed.sh install`",
        pkgs.display()
    );
    let mut c = std::process::Command::new("python3");
    c.env("PYTHONPATH", pkgs).arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("peers")
            .join(script),
    );
    c
}

/// This machine's first disk (in `/proc/partitions`): its device path and `major:minor`.
pub fn first_disk() -> (String, String) {
    let parts = std::fs::read_to_string("/proc/partitions").unwrap();
    parts
        .lines()
        .skip(2)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = format!("/dev/{}", f.get(3)?);
            Path::new(&path)
                .exists()
                .then(|| (path, format!("{}:{}", f[0], f[1])))
        })
        .expect("a disk in /proc/partitions")
}

/// Runs `cmd` under `sh -c` in container `id` (ExecSync, 30 s), asserting it exits 0.
pub async fn exec(rt: &mut Cri, id: &str, cmd: &str) {
    let r = rt
        .rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
            timeout: 30,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.exit_code,
        0,
        "{cmd}: {:?}",
        String::from_utf8_lossy(&r.stderr)
    );
}
