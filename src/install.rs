//! `qoslet install`: puts qoslet on its node as a systemd service in front of
//! containerd (proxy mode), from qoslet's own image. The qoslet-installer
//! DaemonSet (`deploy/kubernetes/proxy`) runs it: the proxy is in kubelet's
//! runtime path, so it cannot be a pod (a dead qoslet pod could not be
//! restarted by a kubelet that reaches the runtime only through it).
//!
//! Why in the binary and not a script: qoslet's image has no shell (one
//! binary and its libraries), and the same image serves both modes; the
//! units it installs are compiled in, so a binary never meets units of
//! another release.
//!
//! What it writes on the host (under `--host`, the hostPath mounts), and
//! nothing else:
//! * `/usr/local/bin/qoslet` (the previous one kept as `qoslet.previous`);
//! * `/etc/qoslet/qoslet.yaml` (the qoslet-config ConfigMap's, `${HOST_IP}`
//!   filled in; a local edit is kept beside it, a file marked
//!   `# qoslet-installer: unmanaged` is left alone);
//! * `/etc/systemd/system/qoslet.service` and
//!   `qoslet.service.d/10-qoslet-installer.conf` (NODE_NAME);
//! * `/etc/systemd/system/kubelet.service.d/20-qoslet.conf` (ordering only);
//! * `/var/lib/qoslet/kube/{token,ca.crt,kubeconfig}` (0700 dir, 0600 token),
//!   and `.restart-pending` while a restart is owed;
//! * `/etc/qoslet/.qoslet-installer.last` (what it wrote last: an edit is
//!   told from it).
//!
//! It runs the host's `systemctl` (`daemon-reload`, `enable`, `start` or
//! `restart` of qoslet.service) in PID 1's mount namespace (setns after fork:
//! hostPID and a privileged container). It never restarts kubelet nor
//! changes its runtime endpoint: an operator does that node by node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The unit and kubelet's drop-in this release installs (deploy/systemd,
/// deploy/kubelet-drop-in.conf).
const SERVICE: &str = include_str!("../deploy/systemd/qoslet.service");
const KUBELET_DROPIN: &str = include_str!("../deploy/kubelet-drop-in.conf");
/// A config file holding this line is never touched.
const UNMANAGED: &str = "# qoslet-installer: unmanaged";
const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a host command (systemctl, `qoslet --version`, `check-config`) may take.
const HOST_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Install or upgrade, then keep the service's API credentials fresh
    /// (the pod's main process).
    Run,
    /// Install or upgrade, and exit.
    Once,
    /// Exit 0 when qoslet.service is active and its CRI socket exists (the
    /// pod's readiness probe).
    Ready,
}

#[derive(clap::Args, Debug, Clone)]
pub struct InstallArgs {
    #[arg(value_enum, default_value_t = Action::Run)]
    pub action: Action,
    /// Where the host's directories are mounted (hostPath volumes).
    #[arg(long, value_name = "DIR", default_value = "/host")]
    pub host: PathBuf,
    /// The binary installed (default: this one, the image's).
    #[arg(long, value_name = "FILE")]
    pub binary: Option<PathBuf>,
    /// qoslet's config for the host (the qoslet-config ConfigMap).
    #[arg(long, value_name = "FILE", default_value = "/config/qoslet.yaml")]
    pub config: PathBuf,
    /// The pod's projected service account token and cluster CA (`token`, `ca.crt`).
    #[arg(long, value_name = "DIR", default_value = "/var/run/secrets/qoslet")]
    pub credentials: PathBuf,
    /// How often the credentials are copied again (kubelet refreshes the token).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub refresh: Duration,
    /// The API server qoslet's kubeconfig names ("": the kubernetes Service,
    /// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
    #[arg(long, env = "QOSLET_API_SERVER", default_value = "")]
    pub api_server: String,
    /// This node's name (the pod's spec.nodeName), for qoslet's cluster side.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// This node's IP (the pod's status.hostIP): metricsListen's `${HOST_IP}`.
    #[arg(long, env = "HOST_IP")]
    pub host_ip: Option<String>,
    #[arg(long, env = "KUBERNETES_SERVICE_HOST", hide = true)]
    pub service_host: Option<String>,
    #[arg(
        long,
        env = "KUBERNETES_SERVICE_PORT",
        hide = true,
        default_value = "443"
    )]
    pub service_port: String,
    /// Runs the host's commands through this program instead of in PID 1's
    /// mount namespace (tests against a fake host).
    #[arg(long, hide = true)]
    pub host_exec: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::config::parse_duration(s).map_err(|e| e.to_string())
}

fn log(msg: impl std::fmt::Display) {
    println!("qoslet-installer: {msg}");
}

pub async fn run(a: InstallArgs) -> Result<()> {
    let i = Installer::new(a)?;
    match i.a.action {
        Action::Ready => {
            if i.ready() {
                Ok(())
            } else {
                bail!("qoslet.service is not active or /run/qoslet/qoslet.sock takes no connection")
            }
        }
        Action::Once => i.install(),
        Action::Run => {
            i.install()?;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(i.a.refresh) => i.credentials()?,
                    r = crate::wait_for_signal() => {
                        r?;
                        log("stopping; qoslet.service keeps running");
                        return Ok(());
                    }
                }
            }
        }
    }
}

pub struct Installer {
    a: InstallArgs,
    binary: PathBuf,
}

impl Installer {
    pub fn new(a: InstallArgs) -> Result<Self> {
        let binary = match &a.binary {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("this binary's path")?,
        };
        Ok(Self { a, binary })
    }

    /// A host path (`/etc/qoslet`) under the mount (`/host/etc/qoslet`).
    fn at(&self, host_path: &str) -> PathBuf {
        self.a.host.join(host_path.trim_start_matches('/'))
    }

    /// Runs a host command (its systemctl, its libc) in PID 1's mount
    /// namespace, killed after [`HOST_TIMEOUT`]: its output, or why it failed.
    fn host(&self, args: &[&str]) -> Result<std::process::Output> {
        use std::process::{Command, Stdio};
        let what = || format!("run {} on the host", args.join(" "));
        // the namespace's fd must live until the child has forked
        let mut ns = None;
        let mut c = match &self.a.host_exec {
            Some(p) => {
                let mut c = Command::new(p);
                c.args(args);
                c
            }
            None => {
                let f = std::fs::File::open("/proc/1/ns/mnt")
                    .context("PID 1's mount namespace (/proc/1/ns/mnt; the pod needs hostPID)")?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
                ns = Some(f);
                let mut c = Command::new(args[0]);
                // the lookup of args[0] happens in the child, after setns: the host's PATH
                c.args(&args[1..]).env("PATH", PATH_ENV);
                // SAFETY: runs in the forked child before exec; setns(2) is
                // async-signal-safe and the child is single-threaded, which
                // entering a mount namespace requires. It also moves the
                // child's root and working directory to the host's root.
                #[allow(unsafe_code)]
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
                        if libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                c
            }
        };
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // ETXTBSY: a binary just written, whose write descriptor a process
        // forked meanwhile (by another thread) still holds: try again
        let mut child = None;
        for _ in 0..20 {
            match c.spawn() {
                Ok(ch) => {
                    child = Some(ch);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e).with_context(what),
            }
        }
        drop(ns);
        let mut child = child.with_context(what)?;
        // drain the pipes while waiting, so a chatty command cannot block
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        let so = std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(o) = out.as_mut() {
                let _ = std::io::Read::read_to_end(o, &mut v);
            }
            v
        });
        let se = std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(e) = err.as_mut() {
                let _ = std::io::Read::read_to_end(e, &mut v);
            }
            v
        });
        let deadline = std::time::Instant::now() + HOST_TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().with_context(what)? {
                break s;
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{}: no answer within {HOST_TIMEOUT:?} (killed)", what());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(std::process::Output {
            status,
            stdout: so.join().unwrap_or_default(),
            stderr: se.join().unwrap_or_default(),
        })
    }

    /// A host command that must succeed.
    fn host_ok(&self, args: &[&str]) -> Result<String> {
        let o = self.host(args)?;
        if !o.status.success() {
            bail!(
                "{} on the host: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    }

    fn active(&self) -> bool {
        self.host(&["systemctl", "is-active", "--quiet", "qoslet.service"])
            .is_ok_and(|o| o.status.success())
    }

    /// The CRI socket takes a connection now (a stale socket file of a
    /// qoslet that died refuses it).
    fn serving(&self) -> bool {
        std::os::unix::net::UnixStream::connect(self.at("/run/qoslet/qoslet.sock")).is_ok()
    }

    pub fn ready(&self) -> bool {
        self.serving() && self.active()
    }

    /// The service account's token and the cluster CA, copied where the
    /// host's qoslet reads them. The token is bound to this pod: deleting the
    /// pod revokes it, the next pod writes a new one; kube-rs re-reads the
    /// token file at least once a minute.
    pub fn credentials(&self) -> Result<()> {
        let token = std::fs::read(self.a.credentials.join("token")).unwrap_or_default();
        if token.is_empty() {
            bail!(
                "no service account token at {}",
                self.a.credentials.join("token").display()
            );
        }
        let ca = std::fs::read(self.a.credentials.join("ca.crt"))
            .with_context(|| format!("{}", self.a.credentials.join("ca.crt").display()))?;
        let kube = self.at("/var/lib/qoslet/kube");
        std::fs::create_dir_all(&kube).context("create /var/lib/qoslet/kube")?;
        set_mode(&kube, 0o700)?;
        if put(&kube.join("token"), &token, 0o600)? {
            log("API token refreshed");
        }
        if put(&kube.join("ca.crt"), &ca, 0o644)? {
            log("cluster CA written");
        }
        Ok(())
    }

    fn api_server(&self) -> Result<String> {
        if !self.a.api_server.is_empty() {
            return Ok(self.a.api_server.clone());
        }
        let Some(h) = self.a.service_host.as_deref().filter(|h| !h.is_empty()) else {
            bail!("KUBERNETES_SERVICE_HOST is not set (set QOSLET_API_SERVER)");
        };
        let h = if h.contains(':') {
            format!("[{h}]")
        } else {
            h.to_string()
        };
        Ok(format!("https://{h}:{}", self.a.service_port))
    }

    /// qoslet's kubeconfig; true when it changed (qoslet reads it at start only).
    fn kubeconfig(&self) -> Result<bool> {
        let server = self.api_server()?;
        let text = format!(
            "# Written by qoslet-installer (deploy/kubernetes/proxy): qoslet's cluster credentials, the\n\
             # qoslet-system/qoslet service account's token, refreshed by the installer pod.\n\
             apiVersion: v1\nkind: Config\nclusters:\n  - name: cluster\n    cluster:\n      server: {server}\n      \
             certificate-authority: /var/lib/qoslet/kube/ca.crt\nusers:\n  - name: qoslet\n    user:\n      \
             tokenFile: /var/lib/qoslet/kube/token\ncontexts:\n  - name: qoslet\n    context:\n      cluster: cluster\n      \
             user: qoslet\ncurrent-context: qoslet\n"
        );
        put(
            &self.at("/var/lib/qoslet/kube/kubeconfig"),
            text.as_bytes(),
            0o600,
        )
    }

    /// Stages the image's binary beside the host's as `qoslet.new` when it
    /// differs, after checking it runs there (its libc, its CPU): its
    /// version, or None when the host has it already.
    fn stage_binary(&self) -> Result<Option<String>> {
        let new = std::fs::read(&self.binary)
            .with_context(|| format!("the image's binary {}", self.binary.display()))?;
        if std::fs::read(self.at("/usr/local/bin/qoslet")).is_ok_and(|old| old == new) {
            return Ok(None);
        }
        let staged = self.at("/usr/local/bin/qoslet.new");
        write_synced(&staged, &new, 0o755).context("write /usr/local/bin/qoslet.new")?;
        let refused = |why: String| {
            let _ = std::fs::remove_file(&staged);
            anyhow::anyhow!("the image's qoslet does not run on this host ({why}); nothing changed")
        };
        match self.host(&["/usr/local/bin/qoslet.new", "--version"]) {
            Ok(o) if o.status.success() => {
                Ok(Some(String::from_utf8_lossy(&o.stdout).trim().to_string()))
            }
            Ok(o) => Err(refused(format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ))),
            Err(e) => Err(refused(format!("{e:#}"))),
        }
    }

    /// The staged binary in place, the old one kept as `qoslet.previous`.
    fn commit_binary(&self, version: &str) -> Result<()> {
        let bin = self.at("/usr/local/bin/qoslet");
        if bin.exists() {
            let prev_tmp = self.at("/usr/local/bin/qoslet.previous.qoslet-installer.tmp");
            let old = std::fs::read(&bin).context("read /usr/local/bin/qoslet")?;
            write_synced(&prev_tmp, &old, 0o755).context("keep /usr/local/bin/qoslet.previous")?;
            std::fs::rename(&prev_tmp, self.at("/usr/local/bin/qoslet.previous"))
                .context("keep /usr/local/bin/qoslet.previous")?;
            log("previous binary kept as /usr/local/bin/qoslet.previous");
        }
        std::fs::rename(self.at("/usr/local/bin/qoslet.new"), &bin)
            .context("replace /usr/local/bin/qoslet")?;
        sync_dir(bin.parent().unwrap_or(Path::new("/")));
        log(format!("installed /usr/local/bin/qoslet ({version})"));
        Ok(())
    }

    /// The config that will be in force: the ConfigMap's (`${HOST_IP}` filled
    /// in), or the node's own when it is marked unmanaged (None then).
    fn rendered_config(&self) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
        let Some(ip) = self.a.host_ip.as_deref().filter(|s| !s.is_empty()) else {
            bail!("HOST_IP (status.hostIP) is not set");
        };
        let ip = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let src = std::fs::read_to_string(&self.a.config)
            .with_context(|| format!("{}", self.a.config.display()))?;
        let rendered = src.replace("${HOST_IP}", &ip).into_bytes();
        let current = std::fs::read(self.at("/etc/qoslet/qoslet.yaml")).ok();
        Ok((rendered, current))
    }

    /// Whether qoslet (`bin`, a host path) accepts `config` as it would at
    /// start: what it refuses must not be restarted into, or kubelet loses
    /// its runtime.
    fn check_config(&self, bin: &str, config: &[u8]) -> Result<()> {
        let etc = self.at("/etc/qoslet");
        std::fs::create_dir_all(&etc).context("create /etc/qoslet")?;
        let check = etc.join("qoslet.yaml.check");
        std::fs::write(&check, config).context("write /etc/qoslet/qoslet.yaml.check")?;
        let verdict = self.host(&[
            bin,
            "check-config",
            "--config",
            "/etc/qoslet/qoslet.yaml.check",
        ]);
        let _ = std::fs::remove_file(&check);
        match verdict {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => bail!(
                "qoslet refuses the config it would run with ({}); the node keeps its running qoslet and config",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => Err(e.context("cannot check the config")),
        }
    }

    /// Writes the ConfigMap's config (checked already); true when it
    /// changed. A file that is not what the installer wrote last (a local
    /// edit) is kept beside it as `qoslet.yaml.<UTC time>`.
    fn write_config(&self, rendered: &[u8], current: Option<&[u8]>) -> Result<bool> {
        let etc = self.at("/etc/qoslet");
        let f = etc.join("qoslet.yaml");
        let last = etc.join(".qoslet-installer.last");
        if current == Some(rendered) {
            // (what the installer wrote, as far as the next run can tell)
            put(&last, rendered, 0o600)?;
            return Ok(false);
        }
        if let Some(cur) = current {
            if std::fs::read(&last).ok().as_deref() != Some(cur) {
                let kept = format!("qoslet.yaml.{}", utc_stamp());
                write_synced(&etc.join(&kept), cur, 0o644)
                    .with_context(|| format!("keep /etc/qoslet/{kept}"))?;
                log(format!(
                    "/etc/qoslet/qoslet.yaml was edited on the node: kept as /etc/qoslet/{kept}, replaced by the ConfigMap's"
                ));
            }
        }
        put(&f, rendered, 0o644)?;
        put(&last, rendered, 0o600)?;
        log("wrote /etc/qoslet/qoslet.yaml");
        Ok(true)
    }

    /// qoslet's unit and its NODE_NAME drop-in (true when either changed),
    /// and kubelet's ordering drop-in (`.1` true when it changed).
    fn units(&self) -> Result<(bool, bool)> {
        let Some(node) = self.a.node_name.as_deref().filter(|s| !s.is_empty()) else {
            bail!("NODE_NAME is not set");
        };
        let units = self.at("/etc/systemd/system");
        let mut changed = false;
        if put(&units.join("qoslet.service"), SERVICE.as_bytes(), 0o644)? {
            log("wrote /etc/systemd/system/qoslet.service");
            changed = true;
        }
        for d in ["qoslet.service.d", "kubelet.service.d"] {
            std::fs::create_dir_all(units.join(d)).with_context(|| format!("create {d}"))?;
        }
        let dropin = format!(
            "# Written by qoslet-installer: this node's name, for qoslet's cluster side\n[Service]\nEnvironment=NODE_NAME={node}\n"
        );
        if put(
            &units.join("qoslet.service.d/10-qoslet-installer.conf"),
            dropin.as_bytes(),
            0o644,
        )? {
            log("wrote /etc/systemd/system/qoslet.service.d/10-qoslet-installer.conf");
            changed = true;
        }
        let kubelet = put(
            &units.join("kubelet.service.d/20-qoslet.conf"),
            KUBELET_DROPIN.as_bytes(),
            0o644,
        )?;
        if kubelet {
            log("wrote /etc/systemd/system/kubelet.service.d/20-qoslet.conf (takes effect at kubelet's next start)");
        }
        Ok((changed, kubelet))
    }

    /// Install or upgrade. Everything is checked before anything that
    /// qoslet reads at start changes: the new binary runs on the host, and it
    /// (or the installed one) accepts the config it will run with. A restart
    /// owed is recorded first (`/var/lib/qoslet/kube/.restart-pending`), so
    /// an install cut short (SIGTERM, an error) restarts at the next run.
    pub fn install(&self) -> Result<()> {
        self.host_ok(&["systemctl", "--version"]).context(
            "cannot run the host's systemctl in PID 1's mount namespace (the pod needs hostPID and \
             privileged; proxy mode needs a systemd host, else use deploy/kubernetes/nri)",
        )?;
        self.credentials()?;
        let pending = self.at("/var/lib/qoslet/kube/.restart-pending");
        let staged = self.stage_binary()?;
        let (rendered, current) = self.rendered_config()?;
        let unmanaged = current.as_deref().is_some_and(|c| {
            c.windows(UNMANAGED.len())
                .any(|w| w == UNMANAGED.as_bytes())
        });
        let in_force = if unmanaged {
            current.clone().unwrap_or_default()
        } else {
            rendered.clone()
        };
        let checker = if staged.is_some() {
            "/usr/local/bin/qoslet.new"
        } else {
            "/usr/local/bin/qoslet"
        };
        if let Err(e) = self.check_config(checker, &in_force) {
            let _ = std::fs::remove_file(self.at("/usr/local/bin/qoslet.new"));
            return Err(e);
        }
        let mut restart = pending.exists();
        restart |= self.kubeconfig()?;
        if let Some(v) = &staged {
            std::fs::write(&pending, b"binary\n").context("record the restart owed")?;
            self.commit_binary(v)?;
            restart = true;
        }
        if unmanaged {
            log("/etc/qoslet/qoslet.yaml is marked unmanaged: left as it is");
        } else if self.write_config(&rendered, current.as_deref())? {
            std::fs::write(&pending, b"config\n").context("record the restart owed")?;
            restart = true;
        }
        let (units, kubelet) = self.units()?;
        restart |= units;
        let stale = self
            .host(&[
                "systemctl",
                "show",
                "-p",
                "NeedDaemonReload",
                "--value",
                "qoslet.service",
            ])
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "yes");
        if units || kubelet || stale {
            self.host_ok(&["systemctl", "daemon-reload"])?;
        }
        self.host_ok(&["systemctl", "enable", "--quiet", "qoslet.service"])?;
        if restart && self.active() {
            // an upgrade: kubelet's calls get UNAVAILABLE while qoslet drains
            // and starts again, and kubelet retries them; the DaemonSet rolls
            // one node at a time
            log("restarting qoslet.service (binary, config, credentials file or unit changed)");
            self.host_ok(&["systemctl", "restart", "qoslet.service"])?;
        } else {
            self.host_ok(&["systemctl", "start", "qoslet.service"])?;
        }
        let _ = std::fs::remove_file(&pending);
        let mut waited = 0;
        while !self.serving() && waited < 600 {
            std::thread::sleep(Duration::from_millis(100));
            waited += 1;
        }
        if self.serving() {
            log("qoslet.service is running; /run/qoslet/qoslet.sock takes connections");
        } else {
            log("warning: /run/qoslet/qoslet.sock takes no connection after 60 s: see 'journalctl -u qoslet' on the node");
            if let Ok(o) = self.host(&["systemctl", "status", "--no-pager", "qoslet.service"]) {
                log(String::from_utf8_lossy(&o.stdout).trim());
            }
        }
        log("kubelet is not switched by this installer: set containerRuntimeEndpoint node by node (docs/deploy.md)");
        Ok(())
    }
}

/// Writes `data` to `path` unless it holds it already, through a temp file
/// beside it renamed over it (a running binary, or qoslet reading its
/// config, never sees half a file); true when it wrote.
fn put(path: &Path, data: &[u8], mode: u32) -> Result<bool> {
    if std::fs::read(path).is_ok_and(|cur| cur == data) {
        set_mode(path, mode)?;
        return Ok(false);
    }
    // beside it, its whole name kept (`qoslet.yaml.qoslet-installer.tmp`)
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".qoslet-installer.tmp");
    let tmp = path.with_file_name(name);
    write_synced(&tmp, data, mode)?;
    std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    sync_dir(path.parent().unwrap_or(Path::new("/")));
    Ok(true)
}

/// Writes a file with `mode` and syncs it to disk (a power cut after the
/// rename that follows must not leave an empty unit or binary).
fn write_synced(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).with_context(|| format!("write {}", path.display()))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", path.display()))?;
    set_mode(path, mode)
}

/// Syncs a directory (a rename in it, durable).
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {:o} {}", mode, p.display()))
}

/// Now as `YYYYmmddTHHMMSSZ`.
fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // civil from days (Howard Hinnant's algorithm)
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    //! The installer against a fake host: a directory tree for the host's
    //! mounts, and a stand-in for "a command in PID 1's mount namespace"
    //! that records systemctl's calls and runs the host's binaries from the
    //! tree.
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const STUB: &str = r#"#!/bin/sh
case "$1" in
systemctl)
    shift
    echo "$*" >>"$FAKE/systemctl.log"
    case "$1" in
    --version) echo "systemd 252" ;;
    is-active) [ -f "$FAKE/active" ] ;;
    start | restart)
        touch "$FAKE/active"
        # a qoslet listening on its socket for a while (a restart replaces it)
        python3 -c 'import os, socket, sys, time
p = sys.argv[1]
os.path.exists(p) and os.unlink(p)
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(8); time.sleep(20)' \
            "$FAKE/host/run/qoslet/qoslet.sock" >/dev/null 2>&1 &
        ;;
    esac
    ;;
/*)
    p=$1
    shift
    exec "$FAKE/host$p" "$@"
    ;;
*) exec "$@" ;;
esac
"#;

    /// The proxy overlay's config, as the ConfigMap has it.
    const CONFIG: &str = include_str!("../deploy/kubernetes/proxy/qoslet.yaml");

    struct Fake {
        root: PathBuf,
        args: InstallArgs,
    }

    impl Fake {
        fn new(name: &str, host_ip: &str, service_host: &str) -> Fake {
            let root = std::env::temp_dir()
                .join(format!("qoslet-installer-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for d in [
                "host/usr/local/bin",
                "host/etc/systemd/system",
                "host/var/lib/qoslet",
                "host/run/qoslet",
                "img",
                "config",
                "sa",
            ] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            std::fs::write(root.join("config/qoslet.yaml"), CONFIG).unwrap();
            std::fs::write(root.join("sa/token"), "token-1").unwrap();
            std::fs::write(root.join("sa/ca.crt"), "CA\n").unwrap();
            // the stub reads $FAKE: a wrapper per fake host sets it
            let stub = root.join("host-exec.sh");
            std::fs::write(&stub, STUB).unwrap();
            let wrapper = root.join("host-exec");
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nFAKE='{}' exec /bin/sh '{}' \"$@\"\n",
                    root.display(),
                    stub.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
            let args = InstallArgs {
                action: Action::Once,
                host: root.join("host"),
                binary: Some(root.join("img/qoslet")),
                config: root.join("config/qoslet.yaml"),
                credentials: root.join("sa"),
                refresh: Duration::from_secs(30),
                api_server: String::new(),
                node_name: Some("node-1".into()),
                host_ip: Some(host_ip.into()),
                service_host: Some(service_host.into()),
                service_port: "443".into(),
                host_exec: Some(wrapper),
            };
            let f = Fake { root, args };
            f.image("0.1.0", true, false);
            f
        }

        /// The image's binary: a script answering --version (or failing as
        /// a binary built for another libc), and check-config.
        fn image(&self, version: &str, runs: bool, refuses_config: bool) {
            let refuse = if refuses_config {
                "[ \"$1\" = check-config ] && { echo \"key kubernetes.qps: 0 is not within 0.1 and 1000\" >&2; exit 1; }\n"
            } else {
                ""
            };
            let body = if runs {
                format!("#!/bin/sh\n{refuse}echo \"qoslet {version}\"\n")
            } else {
                "#!/bin/sh\necho 'cannot execute: GLIBC_2.38 not found' >&2\nexit 127\n".into()
            };
            let b = self.root.join("img/qoslet");
            std::fs::write(&b, body).unwrap();
            std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
        }

        fn host(&self, p: &str) -> PathBuf {
            self.root.join("host").join(p.trim_start_matches('/'))
        }

        fn read(&self, p: &str) -> String {
            std::fs::read_to_string(self.host(p)).unwrap_or_default()
        }

        /// One `qoslet install once`: its result and systemctl's calls.
        fn run(&self) -> (Result<()>, Vec<String>) {
            let log = self.root.join("systemctl.log");
            let _ = std::fs::remove_file(&log);
            let r = Installer::new(self.args.clone()).unwrap().install();
            let calls = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect();
            (r, calls)
        }

        fn ready(&self) -> bool {
            Installer::new(self.args.clone()).unwrap().ready()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn installs_then_changes_only_what_changed() {
        let f = Fake::new("v4", "10.0.0.5", "10.96.0.1");
        assert!(!f.ready(), "ready before any install");
        let (r, calls) = f.run();
        r.unwrap();
        assert_eq!(
            f.read("/usr/local/bin/qoslet"),
            std::fs::read_to_string(f.root.join("img/qoslet")).unwrap()
        );
        let cfg = f.read("/etc/qoslet/qoslet.yaml");
        assert!(
            cfg.contains("10.0.0.5:9316") && !cfg.contains("${HOST_IP}"),
            "{cfg}"
        );
        assert!(
            cfg.contains("kubeconfig: /var/lib/qoslet/kube/kubeconfig"),
            "{cfg}"
        );
        assert_eq!(f.read("/etc/systemd/system/qoslet.service"), SERVICE);
        assert_eq!(
            f.read("/etc/systemd/system/kubelet.service.d/20-qoslet.conf"),
            KUBELET_DROPIN
        );
        assert!(f
            .read("/etc/systemd/system/qoslet.service.d/10-qoslet-installer.conf")
            .contains("Environment=NODE_NAME=node-1"));
        let kube = f.host("/var/lib/qoslet/kube");
        assert_eq!(mode(&kube), 0o700);
        assert_eq!(
            (
                f.read("/var/lib/qoslet/kube/token").as_str(),
                mode(&kube.join("token"))
            ),
            ("token-1", 0o600)
        );
        let kc = f.read("/var/lib/qoslet/kube/kubeconfig");
        assert!(kc.contains("server: https://10.96.0.1:443"), "{kc}");
        assert!(
            kc.contains("certificate-authority: /var/lib/qoslet/kube/ca.crt"),
            "{kc}"
        );
        assert!(kc.contains("tokenFile: /var/lib/qoslet/kube/token"), "{kc}");
        assert_eq!(mode(&kube.join("kubeconfig")), 0o600);
        for want in [
            "daemon-reload",
            "enable --quiet qoslet.service",
            "start qoslet.service",
        ] {
            assert!(calls.iter().any(|c| c == want), "{want} in {calls:?}");
        }
        assert!(
            !calls.iter().any(|c| c.contains("kubelet")),
            "touched kubelet: {calls:?}"
        );
        assert!(f.ready(), "ready after the install");

        // an idle re-run: no reload, no restart
        let (r, calls) = f.run();
        r.unwrap();
        assert!(
            !calls
                .iter()
                .any(|c| c == "daemon-reload" || c.starts_with("restart")),
            "{calls:?}"
        );

        // a token refresh: copied, no restart
        std::fs::write(f.root.join("sa/token"), "token-2").unwrap();
        let (_, calls) = f.run();
        assert_eq!(f.read("/var/lib/qoslet/kube/token"), "token-2");
        assert!(!calls.iter().any(|c| c.starts_with("restart")), "{calls:?}");

        // an upgrade: the previous binary kept, a restart
        let old = f.read("/usr/local/bin/qoslet");
        f.image("0.2.0", true, false);
        let (r, calls) = f.run();
        r.unwrap();
        assert_eq!(f.read("/usr/local/bin/qoslet.previous"), old);
        assert!(f.read("/usr/local/bin/qoslet").contains("0.2.0"));
        assert!(
            calls.iter().any(|c| c == "restart qoslet.service"),
            "{calls:?}"
        );
    }

    #[test]
    fn a_local_edit_is_kept_and_an_unmanaged_file_left_alone() {
        let f = Fake::new("edit", "10.0.0.5", "10.96.0.1");
        f.run().0.unwrap();
        let file = f.host("/etc/qoslet/qoslet.yaml");
        std::fs::write(
            &file,
            format!("{}# a local edit\n", f.read("/etc/qoslet/qoslet.yaml")),
        )
        .unwrap();
        let (r, calls) = f.run();
        r.unwrap();
        let kept: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name().to_string_lossy().starts_with("qoslet.yaml.")
                    && e.file_name().to_string_lossy().ends_with('Z')
            })
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(std::fs::read_to_string(kept[0].path())
            .unwrap()
            .contains("# a local edit"));
        assert!(!f.read("/etc/qoslet/qoslet.yaml").contains("# a local edit"));
        assert!(
            calls.iter().any(|c| c == "restart qoslet.service"),
            "{calls:?}"
        );

        // a ConfigMap change: applied, no backup
        std::fs::write(
            f.root.join("config/qoslet.yaml"),
            CONFIG.replace("logLevel: info", "logLevel: debug"),
        )
        .unwrap();
        let (_, calls) = f.run();
        assert!(f
            .read("/etc/qoslet/qoslet.yaml")
            .contains("logLevel: debug"));
        assert!(
            calls.iter().any(|c| c == "restart qoslet.service"),
            "{calls:?}"
        );
        let backups = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with('Z'))
            .count();
        assert_eq!(backups, 1, "a ConfigMap change made a backup");

        // unmanaged: untouched
        std::fs::write(&file, "# qoslet-installer: unmanaged\nlogLevel: warn\n").unwrap();
        std::fs::write(f.root.join("config/qoslet.yaml"), CONFIG).unwrap();
        let (_, calls) = f.run();
        assert_eq!(
            f.read("/etc/qoslet/qoslet.yaml"),
            "# qoslet-installer: unmanaged\nlogLevel: warn\n"
        );
        assert!(!calls.iter().any(|c| c.starts_with("restart")), "{calls:?}");
    }

    #[test]
    fn what_qoslet_refuses_is_not_installed() {
        let f = Fake::new("refuse", "10.0.0.5", "10.96.0.1");
        f.run().0.unwrap();
        // a config the (new) binary refuses: the running one stays, no restart
        std::fs::write(f.host("/etc/qoslet/qoslet.yaml"), "logLevel: info\n").unwrap();
        std::fs::write(
            f.host("/etc/qoslet/.qoslet-installer.last"),
            "logLevel: info\n",
        )
        .unwrap();
        std::fs::write(
            f.root.join("config/qoslet.yaml"),
            CONFIG.replace("logLevel: info", "logLevel: warn"),
        )
        .unwrap();
        f.image("0.2.1", true, true);
        let (r, calls) = f.run();
        let e = format!("{:#}", r.unwrap_err());
        assert!(
            e.contains("refuses the config it would run with") && e.contains("kubernetes.qps"),
            "{e}"
        );
        assert!(
            !f.read("/usr/local/bin/qoslet").contains("0.2.1"),
            "a binary refusing the config was installed"
        );
        assert_eq!(f.read("/etc/qoslet/qoslet.yaml"), "logLevel: info\n");
        assert!(!calls.iter().any(|c| c.starts_with("restart")), "{calls:?}");
        assert!(!f.host("/etc/qoslet/qoslet.yaml.check").exists());

        // a binary that does not run on the host: the old one stays
        f.image("0.2.1", true, false);
        std::fs::write(f.root.join("config/qoslet.yaml"), CONFIG).unwrap();
        f.run().0.unwrap();
        let before = f.read("/usr/local/bin/qoslet");
        f.image("0.3.0", false, false);
        let e = format!("{:#}", f.run().0.unwrap_err());
        assert!(e.contains("does not run on this host"), "{e}");
        assert_eq!(f.read("/usr/local/bin/qoslet"), before);
        assert!(!f.host("/usr/local/bin/qoslet.new").exists());
    }

    /// An install cut short after it changed what qoslet reads at start
    /// (SIGTERM, an error) owes a restart: the next run does it.
    #[test]
    fn a_restart_owed_is_done_by_the_next_run() {
        let f = Fake::new("owed", "10.0.0.5", "10.96.0.1");
        f.run().0.unwrap();
        std::fs::write(f.host("/var/lib/qoslet/kube/.restart-pending"), "binary\n").unwrap();
        let (r, calls) = f.run();
        r.unwrap();
        assert!(
            calls.iter().any(|c| c == "restart qoslet.service"),
            "{calls:?}"
        );
        assert!(!f.host("/var/lib/qoslet/kube/.restart-pending").exists());
        let (_, calls) = f.run();
        assert!(!calls.iter().any(|c| c.starts_with("restart")), "{calls:?}");
    }

    /// Readiness needs the socket to take a connection: the socket file a
    /// dead qoslet left is not ready, whatever systemctl says.
    #[test]
    fn a_stale_socket_is_not_ready() {
        let f = Fake::new("stale", "10.0.0.5", "10.96.0.1");
        let sock = f.host("/run/qoslet/qoslet.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        std::fs::write(f.root.join("active"), "").unwrap();
        assert!(sock.exists() && !f.ready());
        let _l = std::os::unix::net::UnixListener::bind({
            std::fs::remove_file(&sock).unwrap();
            &sock
        })
        .unwrap();
        assert!(f.ready());
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let f = Fake::new("v6", "fd00::5", "fd00::1");
        f.run().0.unwrap();
        assert!(f.read("/etc/qoslet/qoslet.yaml").contains("[fd00::5]:9316"));
        assert!(f
            .read("/var/lib/qoslet/kube/kubeconfig")
            .contains("server: https://[fd00::1]:443"));
    }

    #[test]
    fn utc_stamps_are_civil_time() {
        assert_eq!(utc_stamp().len(), 16);
        assert!(utc_stamp().starts_with("20"));
    }
}
