//! The `qoslet` binary as a child process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// The qoslet binary next to this test executable (`target/<profile>/qoslet`).
/// Build it first: `cargo build --workspace --bins` (the test scripts do).
pub fn qoslet_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("QOSLET_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("qoslet");
    assert!(
        bin.is_file(),
        "{} not found: run `cargo build --workspace --bins` first (or set QOSLET_BIN)",
        bin.display()
    );
    bin
}

/// A qoslet proxy process with its own sockets and state dir.
pub struct QosletProcess {
    pub child: Child,
    pub dir: PathBuf,
    pub sock: PathBuf,
    pub admin: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    pub backend: PathBuf,
    /// Extra flags, kept for restarts.
    pub extra: Vec<String>,
    /// `qoslet nri` on this NRI socket (`None`: `qoslet proxy`).
    pub nri: Option<PathBuf>,
}

impl QosletProcess {
    /// Starts `qoslet proxy` in front of `backend` with everything under `dir`,
    /// and waits until its admin socket answers.
    pub fn start(dir: &Path, backend: &Path) -> Self {
        Self::start_with(dir, backend, &[])
    }

    pub fn start_with(dir: &Path, backend: &Path, extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        std::fs::create_dir_all(dir).unwrap();
        let (sock, admin, state_dir, log) = (
            dir.join("qoslet.sock"),
            dir.join("admin.sock"),
            dir.join("state"),
            dir.join("qoslet.log"),
        );
        let before = serving_lines(&log);
        let child = spawn(&sock, &admin, &state_dir, &log, backend, &extra, None);
        let p = Self {
            nri: None,
            extra,
            child,
            dir: dir.into(),
            sock,
            admin,
            state_dir,
            log,
            backend: backend.into(),
        };
        p.wait_ready(before);
        p
    }

    /// Starts `qoslet nri` as an external plugin of the runtime at `backend`
    /// (its NRI socket beside it, `nri.sock`), and waits until its admin
    /// socket answers (registration follows: see [`Self::wait_registered`]).
    pub fn start_nri(dir: &Path, backend: &Path, extra: &[&str]) -> Self {
        Self::start_nri_at(dir, backend, &backend.with_file_name("nri.sock"), extra)
    }

    /// [`Self::start_nri`] with the runtime's NRI socket given (a system
    /// containerd's: `/run/nri/nri.sock`).
    pub fn start_nri_at(dir: &Path, backend: &Path, nri: &Path, extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        std::fs::create_dir_all(dir).unwrap();
        let nri = nri.to_path_buf();
        let (admin, state_dir, log) = (
            dir.join("admin.sock"),
            dir.join("state"),
            dir.join("qoslet.log"),
        );
        let before = serving_lines(&log);
        let child = spawn(&nri, &admin, &state_dir, &log, backend, &extra, Some(&nri));
        let p = Self {
            nri: Some(nri.clone()),
            extra,
            child,
            dir: dir.into(),
            sock: nri,
            admin,
            state_dir,
            log,
            backend: backend.into(),
        };
        p.wait_ready(before);
        p
    }

    /// Waits until the NRI plugin counts `n` registrations with the runtime,
    /// each followed by its Synchronize.
    pub async fn wait_registered(&self, n: u64) {
        let mut c =
            qoslet_proto::admin::admin_client::AdminClient::new(crate::lazy_channel(&self.admin));
        for _ in 0..400 {
            if let Ok(s) = c.get_status(qoslet_proto::admin::GetStatusRequest {}).await {
                if s.into_inner().counters.is_some_and(|c| {
                    c.nri_registrations >= n
                        && c.nri_events.get("synchronize").copied().unwrap_or(0) >= n
                }) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "qoslet nri did not register {n} times; log:\n{}",
            self.log_text()
        );
    }

    /// Starts `qoslet proxy` with `yaml` as its config file (written to
    /// `dir/qoslet.yaml`) and `extra` flags.
    pub fn with_config(dir: &Path, backend: &Path, yaml: &str, extra: &[&str]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("qoslet.yaml");
        std::fs::write(&config, yaml).unwrap();
        let flag = format!("--config={}", config.display());
        let mut args = vec![flag.as_str()];
        args.extend_from_slice(extra);
        Self::start_with(dir, backend, &args)
    }

    /// Starts a second process with the same settings (used to test refusal).
    pub fn spawn_again(&self) -> Child {
        spawn(
            &self.sock,
            &self.admin,
            &self.state_dir,
            &self.dir.join("qoslet-2.log"),
            &self.backend,
            &[],
            self.nri.as_deref(),
        )
    }

    /// Up: its sockets take connections and its agent core has started since
    /// the spawn (`before`: the log's "qoslet agent serving" lines then). A
    /// socket alone is not enough: qoslet binds its CRI and admin sockets
    /// first, and the kernel queues connections while the agent still takes
    /// its state dir (a guest under emulation showed that window).
    fn wait_ready(&self, before: usize) {
        // 30 s: a debug binary's first start in the VM guest (software emulation,
        // its pages read over 9p) takes several seconds
        for _ in 0..1200 {
            if std::os::unix::net::UnixStream::connect(&self.admin).is_ok()
                && (self.nri.is_some()
                    || std::os::unix::net::UnixStream::connect(&self.sock).is_ok())
                && serving_lines(&self.log) > before
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("qoslet did not come up; log:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL, then wait.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait up to `timeout` for the exit status.
    pub fn sigterm(&mut self, timeout: Duration) -> ExitStatus {
        signal(self.pid(), libc::SIGTERM);
        wait_timeout(&mut self.child, timeout)
            .unwrap_or_else(|| panic!("qoslet did not exit within {timeout:?} after SIGTERM"))
    }

    /// Restarts the process (same sockets and state dir) after it exited.
    pub fn restart(&mut self) {
        let before = serving_lines(&self.log);
        self.child = spawn(
            &self.sock,
            &self.admin,
            &self.state_dir,
            &self.log,
            &self.backend,
            &self.extra,
            self.nri.as_deref(),
        );
        self.wait_ready(before);
    }

    /// Resident set size in KiB (from /proc).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }
}

impl Drop for QosletProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubelet's `--cgroup-root` as the test bed lays pods out for the containerd
/// instance (or fake runtime) at `backend` (`.../<dir>/<name>.sock`:
/// `/qoslet-test/<dir>`); `/` (kubelet's default) for the VM guest's own
/// containerd.
pub fn kubelet_cgroup_root(backend: &Path) -> String {
    // the VM guest's containerd: kubelet's own root, systemd's kubepods.slice at the top
    if crate::testbed::on_systemd_v2() && backend == crate::node::containerd().sock {
        return "/".into();
    }
    let instance = backend
        .parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{}/{instance}", crate::testbed::CGROUP_PREFIX)
}

fn spawn(
    sock: &Path,
    admin: &Path,
    state: &Path,
    log: &Path,
    backend: &Path,
    extra: &[String],
    nri: Option<&Path>,
) -> Child {
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(qoslet_bin());
    match nri {
        Some(nri) => cmd
            .arg("nri")
            .arg(format!("--nri-socket={}", nri.display())),
        None => cmd
            .arg("proxy")
            .arg(format!("--listen=unix://{}", sock.display()))
            .arg(format!("--runtime-endpoint=unix://{}", backend.display())),
    };
    cmd.arg(format!("--admin-listen=unix://{}", admin.display()))
        .arg(format!("--state-dir={}", state.display()))
        // tests run in parallel: no fixed Prometheus port unless a test asks for one
        .args(
            (!extra.iter().any(|a| a.starts_with("--metrics-listen")))
                .then_some("--metrics-listen="),
        )
        .args(extra)
        // (whatever the filter, the agent core's start is logged: readiness reads it)
        .env(
            "QOSLET_LOG",
            std::env::var("QOSLET_LOG")
                .map(|f| format!("{f},qoslet_agent::core=info"))
                .unwrap_or_else(|_| "info".into()),
        )
        // the test bed's pods live under <prefix>/<instance>/kubepods, the instance
        // being the backend socket's directory (Testbed::cgroup_parent)
        .env("QOSLET_KUBELET_CGROUP_ROOT", kubelet_cgroup_root(backend))
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("spawn qoslet")
}

/// How many times the agent core said it serves in the log at `log`.
fn serving_lines(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("qoslet agent serving")
        .count()
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY-free: kill(2) through the `kill` command keeps this crate free of unsafe code
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Waits for a child with a timeout.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// VmRSS of a process in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`, ...); 0 when absent.
pub fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
