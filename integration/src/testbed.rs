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
        };
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

    /// Starts (installing nothing new) a private containerd instance `name`; `version` is "1.6", "1.7" or "2.1".
    pub fn start_instance(name: &str, version: &str) -> Self {
        run_script(&["up"], name, version);
        Self::instance(name, version)
    }

    pub fn stop_containerd(&self) {
        run_script(&["stop-containerd"], &self.instance, self.version());
    }

    pub fn start_containerd(&self) {
        run_script(&["start-containerd"], &self.instance, self.version());
    }

    pub fn down(&self) {
        run_script(&["down"], &self.instance, self.version());
    }

    fn version(&self) -> &str {
        &self.version
    }

    /// The containerd PID (from the script's pid file).
    pub fn containerd_pid(&self) -> Option<i32> {
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
    pub fn cgroup_parent_in(&self, qos: &str, pod: &str) -> String {
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

/// Reads a cgroup v1 file: `/sys/fs/cgroup/<controller>/<cgroup path>/<file>`.
/// A cgroup's `memory.usage_in_bytes` in MiB (0 when unreadable).
pub fn usage_mib(cgroup: &str) -> u64 {
    cgroup_v1("memory", cgroup, "memory.usage_in_bytes")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        >> 20
}

pub fn cgroup_v1(controller: &str, cgroup: &str, file: &str) -> String {
    let p = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// Removes the (empty) pod-level cgroup dirs runc leaves behind under `cgroup_parent`.
pub fn remove_cgroup_dirs(cgroup_parent: &str) {
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
