//! qoslet: a node agent that keeps latency-sensitive pods safe from best-effort
//! pods on shared Kubernetes nodes. This binary holds the CLI, config loading,
//! wiring and signal handling; the work happens in the library crates.

/// `println!` for the CLI's output: a reader that went away (`qoslet plan |
/// head`) ends qoslet quietly instead of a panic.
macro_rules! outln {
    ($($t:tt)*) => { $crate::out_fmt(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!`, likewise.
macro_rules! out {
    ($($t:tt)*) => { $crate::out_fmt(format_args!($($t)*)) };
}

fn out_fmt(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("qoslet: writing to stdout: {e}");
        std::process::exit(1);
    }
}

mod batch;
mod cli;
mod config;
mod engine;
mod extender;
mod install;
mod nri;
use qoslet_isolation as isolation;
use qoslet_metrics::service as metrics;
mod policy;
mod restore;
mod top;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "qoslet",
    version,
    about = "QoS node agent for co-located latency-sensitive and best-effort pods"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the CRI proxy between kubelet and containerd.
    Proxy(ProxyArgs),
    /// Run as an NRI plugin of containerd (>= 1.7) or CRI-O: no proxy in kubelet's path.
    Nri(nri::NriArgs),
    /// Show the status of a running qoslet (over the admin socket).
    Status(cli::AdminArgs),
    /// List the pods and containers a running qoslet knows.
    Pods(cli::PodsArgs),
    /// Explain what qoslet applied to a pod and why (class, its source, each setting and its rule).
    Explain(cli::ExplainArgs),
    /// A live view of the node and its pods (usage, class, throttling, what qoslet applied).
    Top(top::TopArgs),
    /// The QoS engine's latest plan, file by file, with the rule behind each line.
    Plan(cli::PlanArgs),
    /// Node conditions, thresholds met, and recent evictions and admission refusals.
    Evictions(cli::EvictionsArgs),
    /// What this node can lend to batch pods (kubernetes.io/batch-cpu,
    /// batch-memory), each term and whether a write is due: from the running
    /// qoslet, or offline from a Node, its NodeMetric, its pods and the
    /// colocation-config.
    BatchResources(batch::BatchArgs),
    /// Put every cgroup file qoslet changed back to the runtime's values (before
    /// uninstalling; refused while qoslet runs).
    Restore(restore::RestoreArgs),
    /// Check a config file as `qoslet proxy` and `qoslet nri` would read it
    /// (every key, every value, the eviction and kubernetes sections); exit 1
    /// with the key and the reason when it is refused.
    CheckConfig {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Install qoslet on this node as a systemd service in front of containerd
    /// (proxy mode), from the image it runs in: what the qoslet-installer
    /// DaemonSet runs (deploy/kubernetes/proxy).
    Install(install::InstallArgs),
    /// Serve kube-scheduler's extender API with Koordinator LoadAware's
    /// filter and score, from its own cache of Nodes, NodeMetrics and Pods:
    /// load-aware placement on a vanilla kube-scheduler.
    SchedulerExtender(extender::ExtenderArgs),
    /// Print the CustomResourceDefinitions qoslet uses (Koordinator's NodeSLO and
    /// NodeMetric), as YAML for `kubectl apply -f -`.
    Crd,
}

#[derive(clap::Args)]
struct ProxyArgs {
    /// Socket kubelet talks to (kubelet's --container-runtime-endpoint).
    #[arg(long, value_name = "ENDPOINT")]
    listen: Option<String>,
    /// The real runtime qoslet forwards to.
    #[arg(long, value_name = "ENDPOINT")]
    runtime_endpoint: Option<String>,
    #[command(flatten)]
    agent: AgentArgs,
}

/// What every front end's agent takes (`qoslet proxy`, `qoslet nri`).
#[derive(clap::Args)]
struct AgentArgs {
    /// Socket of the admin API.
    #[arg(long, value_name = "ENDPOINT")]
    admin_listen: Option<String>,
    /// Directory for qoslet's state (store checkpoint).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// YAML config file; every flag above can be set there.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter (error, warn, info, debug, trace, or a tracing filter); env QOSLET_LOG also works.
    #[arg(long)]
    log_level: Option<String>,
    /// Prometheus endpoint host:port ("" for none; default 127.0.0.1:9316).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Metrics collection interval, 1s to 600s (default 1s).
    #[arg(long, value_name = "DURATION")]
    metrics_interval: Option<config::Interval>,
    /// kubelet's --cgroup-root (pods live in <root>/kubepods; default /).
    #[arg(long, value_name = "PATH", env = "QOSLET_KUBELET_CGROUP_ROOT")]
    kubelet_cgroup_root: Option<String>,
    /// The QoS engine plans and shows (`qoslet plan`, the log) but never writes;
    /// the runtime hooks still apply.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("qoslet: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async {
        match cli.cmd {
            Cmd::Proxy(a) => run_proxy(a).await,
            Cmd::Nri(a) => nri::run(a).await,
            Cmd::Status(a) => cli::status(a).await,
            Cmd::Pods(a) => cli::pods(a).await,
            Cmd::Explain(a) => cli::explain(a).await,
            Cmd::Evictions(a) => cli::evictions(a).await,
            Cmd::Top(a) => top::run(a).await,
            Cmd::Plan(a) => cli::plan(a).await,
            Cmd::Restore(a) => restore::run(a).await,
            Cmd::CheckConfig { config } => check_config(&config),
            Cmd::Install(a) => install::run(a).await,
            Cmd::BatchResources(a) => batch::run(a).await,
            Cmd::SchedulerExtender(a) => extender::run(a).await,
            Cmd::Crd => {
                out!("{}", qoslet_kube::crd::crds_yaml());
                Ok(())
            }
        }
    });
    // a hook stuck in the kernel (a write in D state) must not keep qoslet from exiting
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qoslet: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str) {
    let filter = std::env::var("QOSLET_LOG").unwrap_or_else(|_| level.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("qoslet: bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// What every front end's agent is built from: the config file, the host's
/// capabilities, the loops' settings. Read once at start.
struct Prepared {
    /// The config file's path and whether the user named it.
    path: PathBuf,
    /// The file as read now: what the policy hub starts from and the watch compares with.
    file: config::FileConfig,
    admin_listen: Option<String>,
    state_dir: Option<PathBuf>,
    trust: qoslet_hooks::Trust,
    pod_root: qoslet_cgroups::PodRoot,
    proc_root: PathBuf,
    sys_root: PathBuf,
    node: qoslet_hooks::decide::NodeFacts,
    host: HostCaps,
    metrics: Option<metrics::Settings>,
    engine_cfg: config::EngineConfig,
    engine: qoslet_qos_engine::runner::Settings,
    /// The `eviction:` section, validated (`None`: absent).
    eviction: Option<qoslet_eviction::Eviction>,
    /// The section as the config file's reloads publish it (validated; a
    /// section refused on reload leaves the last good one).
    eviction_reload: tokio::sync::watch::Sender<qoslet_eviction::Eviction>,
}

/// Loads the config file, starts logging and reads the host: everything the
/// agent core, isolation and the loops take, whichever the front end.
/// `state_dir`: where the metrics snapshot goes.
fn prepare(a: AgentArgs, default_state_dir: &std::path::Path) -> Result<Prepared> {
    let (path, explicit) = match &a.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let file = config::load(&path, explicit)?;
    init_logging(
        a.log_level
            .as_deref()
            .or(file.log_level.as_deref())
            .unwrap_or("info"),
    );
    for w in policy_cfg_warnings(file.policy.as_ref()) {
        tracing::warn!("{w}");
    }
    for f in file
        .policy
        .as_ref()
        .map(|p| p.not_implemented.as_slice())
        .unwrap_or_default()
    {
        tracing::info!(field = %f, "NodeSLO field not implemented by qoslet (kept aside; see qoslet plan)");
    }
    let trust = file.trust.clone().unwrap_or_default();
    let pod_root = match a
        .kubelet_cgroup_root
        .as_deref()
        .or(file.kubelet_cgroup_root.as_deref())
    {
        Some(r) => qoslet_cgroups::PodRoot::new(r).context("--kubelet-cgroup-root")?,
        None => qoslet_cgroups::PodRoot::default(),
    };
    if trust != qoslet_hooks::Trust::default() {
        tracing::info!(namespaces = ?trust.namespaces, control_plane = trust.control_plane, "trusted sources of class labels and scheduler annotations");
    }
    let proc_root = file.proc_root();
    let sys_root = file.sys_root();
    let node = isolation::node_facts(&sys_root, &proc_root, file.reserved_cpuset.as_deref());
    let cgroup_root = file
        .cgroup_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
    let resctrl_root = file
        .resctrl_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/sys/fs/resctrl"));
    let host = HostCaps::detect(&cgroup_root, &resctrl_root);
    let state_dir = a.state_dir.or(file.state_dir.clone());
    let metrics_settings = if file.metrics.unwrap_or(true) {
        let interval = a
            .metrics_interval
            .or(file.metrics_interval)
            .map_or(config::defaults::METRICS_INTERVAL, |i| i.0);
        let listen = match a
            .metrics_listen
            .as_deref()
            .or(file.metrics_listen.as_deref())
            .unwrap_or("127.0.0.1:9316")
        {
            "" => None,
            l => Some(
                l.parse()
                    .with_context(|| format!("--metrics-listen {l:?} is not host:port"))?,
            ),
        };
        Some(metrics::Settings {
            interval,
            listen,
            snapshot: file.metrics_snapshot.unwrap_or(true).then(|| {
                state_dir
                    .as_deref()
                    .unwrap_or(default_state_dir)
                    .join("metrics.snapshot")
            }),
            proc_root: proc_root.clone(),
            sys_root: sys_root.clone(),
            pod_root: pod_root.clone(),
            max_series: file
                .metrics_max_series
                .unwrap_or(qoslet_metrics::tsdb::DEFAULT_MAX_SERIES),
        })
    } else {
        None
    };
    let engine_cfg = file.qos_engine.clone().unwrap_or_default();
    let engine = engine::settings(
        &engine_cfg,
        trust.clone(),
        pod_root.clone(),
        proc_root.clone(),
        sys_root.clone(),
        a.dry_run,
    )?;
    let eviction = match &file.eviction {
        Some(e) => Some(e.validate().context("eviction: in the config file")?),
        None => None,
    };
    let first = match &eviction {
        Some(e) => e.clone(),
        None => qoslet_eviction::EvictionConfig::default()
            .validate()
            .context("eviction: the defaults")?,
    };
    Ok(Prepared {
        eviction_reload: tokio::sync::watch::channel(first).0,
        eviction,
        path,
        admin_listen: a.admin_listen.or(file.admin_listen.clone()),
        state_dir,
        file,
        trust,
        pod_root,
        proc_root,
        sys_root,
        node,
        host,
        metrics: metrics_settings,
        engine_cfg,
        engine,
    })
}

impl Prepared {
    /// The agent core's settings over `base` (the front end's defaults).
    fn agent_config(&self, base: qoslet_agent::AgentConfig) -> qoslet_agent::AgentConfig {
        qoslet_agent::AgentConfig {
            trust: self.trust.clone(),
            pod_root: self.pod_root.clone(),
            policy: self.file.policy.clone(),
            metrics_on: self.metrics.is_some(),
            ..base
        }
    }

    /// Watches the config file: the policy hub's first source, off the serving thread.
    /// The cluster side when `kubernetes.enable`: this node's NodeSLO
    /// followed into the policy hub. A section that cannot start (no node
    /// name, no credentials) is an error at start, not a silent local mode.
    async fn start_cluster(
        &self,
        agent: &qoslet_agent::Agent,
    ) -> Result<Option<qoslet_kube::Cluster>> {
        let Some(k) = self.file.kubernetes.as_ref().filter(|k| k.enable) else {
            return Ok(None);
        };
        let node = k.node().context("kubernetes:")?;
        qoslet_kube::set_limiter(std::sync::Arc::new(k.limiter().context("kubernetes:")?));
        let client = k.client().await.context("kubernetes:")?;
        tracing::info!(node = %node, "cluster side on: following this node's NodeSLO and pods, reporting its NodeMetric");
        let status = std::sync::Arc::new(qoslet_kube::status::ClusterStatus::default());
        agent.add_task(tokio::spawn(qoslet_kube::nodeslo::follow(
            client.clone(),
            node.clone(),
            agent.policy().clone(),
            agent.shutdown_signal(),
        )));
        let (node_cache, node_view) = tokio::sync::watch::channel(None);
        agent.add_task(tokio::spawn(qoslet_kube::node::follow(
            client.clone(),
            node.clone(),
            self.engine.reserved.clone(),
            node_cache,
            status.clone(),
            agent.shutdown_signal(),
        )));
        agent.add_task(tokio::spawn(qoslet_kube::pods::follow(
            client.clone(),
            node.clone(),
            agent.store().clone(),
            status.clone(),
            agent.shutdown_signal(),
        )));
        let batch_mode = k.batch_mode().context("kubernetes:")?;
        let batch = batch_mode != qoslet_kube::advertise::BatchMode::Off;
        let (figures, figures_rx) = tokio::sync::watch::channel(None);
        let (colocation, colocation_rx) = tokio::sync::watch::channel(Default::default());
        if k.report_node_metric || batch {
            let source = std::sync::Arc::new(qoslet_kube::nodemetric::AgentMetrics {
                views: agent.views().clone(),
                inventory: agent.inventory().clone(),
            });
            agent.add_task(tokio::spawn(qoslet_kube::nodemetric::report(
                client.clone(),
                node.clone(),
                source,
                qoslet_kube::nodemetric::ReportSettings {
                    create: k.create_node_metric,
                    interval: k.report_interval,
                    write: k.report_node_metric,
                    figures: batch.then_some(figures),
                    colocation: batch.then(|| (colocation_rx.clone(), node_view.clone())),
                },
                status.clone(),
                agent.shutdown_signal(),
            )));
        }
        // Koordinator's ConfigMap, where asked: a policy source, and the colocation-config
        if let Some(at) = k.slo_config(batch_mode) {
            agent.add_task(tokio::spawn(qoslet_kube::sloconfig::follow(
                client.clone(),
                node.clone(),
                at,
                colocation,
                agent.policy().clone(),
                node_view.clone(),
                agent.shutdown_signal(),
            )));
        }
        if batch {
            // batch resources from this node's own figures (docs/colocation.md)
            let adv = std::sync::Arc::new(qoslet_kube::advertise::AdvertiseStatus::default());
            let _ = status.batch.set(adv.clone());
            agent.add_task(tokio::spawn(qoslet_kube::advertise::advertise(
                qoslet_kube::advertise::Advertiser::new(
                    client.clone(),
                    node.clone(),
                    batch_mode,
                    adv,
                ),
                qoslet_kube::advertise::Inputs {
                    colocation: colocation_rx,
                    figures: figures_rx,
                    node: node_view,
                    store: agent.store().clone(),
                },
                agent.shutdown_signal(),
            )));
        }
        agent.views().set_cluster(status.clone());
        Ok(Some(qoslet_kube::Cluster {
            client,
            node,
            status,
            eviction_api: k.eviction_api,
        }))
    }

    fn watch_policy(&self, agent: &qoslet_agent::Agent) {
        policy::watch_file(
            agent.policy(),
            self.path.clone(),
            std::time::Duration::from_secs(1),
            self.file.clone(),
            self.eviction_reload.clone(),
        );
    }

    /// The isolation room following the agent's policy and inventory (`None`:
    /// `isolation: false`).
    fn isolation(&self, agent: &qoslet_agent::Agent) -> Option<isolation::Isolation> {
        if !self.file.isolation.unwrap_or(true) {
            return None;
        }
        if self.host.cgroups.is_none() {
            tracing::warn!(
                "no cgroup writes at the runtime hooks: only settings the runtime carries will be applied"
            );
        }
        // subscribed first: a policy published while the room is built is not missed
        let mut policy_rx = agent.policy().subscribe();
        let first = policy_rx.borrow_and_update().clone();
        let iso = isolation::Isolation::new(
            self.host.cgroups.clone(),
            self.host.resctrl.clone(),
            first.policy.resource_qos_strategy.clone(),
            self.node.clone(),
            self.trust.clone(),
            self.pod_root.clone(),
        )
        .with_sysctl(&self.proc_root)
        .with_sys_root(&self.sys_root);
        iso.policy_handle().follow(policy_rx);
        let _ = iso.inventory_slot().set(agent.inventory().clone());
        Some(iso)
    }

    /// Starts the eviction loop when the `eviction:` section turns it on and
    /// the host has cgroups; stops pods through the runtime at `runtime_socket`.
    fn start_eviction(
        &self,
        agent: &qoslet_agent::Agent,
        runtime_socket: Option<PathBuf>,
        cluster: Option<&qoslet_kube::Cluster>,
    ) -> Option<std::sync::Arc<qoslet_agent::eviction::EvictionView>> {
        // on unless `eviction.enable: false`: kubelet's model acts once
        // thresholds are set, Koordinator's BE model when the policy enables it
        let e = match &self.eviction {
            Some(e) => e.clone(),
            None => match qoslet_eviction::EvictionConfig::default().validate() {
                Ok(e) => e,
                Err(err) => {
                    tracing::error!(error = %err, "eviction: the default section is refused; eviction off");
                    return None;
                }
            },
        };
        if !e.enabled {
            return None;
        }
        let Some(host) = self.host.tree.clone() else {
            tracing::warn!("eviction: no cgroups found on this host; eviction off");
            return None;
        };
        let Some(socket) = runtime_socket else {
            tracing::warn!("eviction: the runtime's endpoint is not a unix socket; eviction off");
            return None;
        };
        let scope = match e
            .cgroup_scope
            .as_deref()
            .map(qoslet_cgroups::CgroupPath::parse)
        {
            None => None,
            Some(Ok(s)) => Some(s),
            Some(Err(err)) => {
                tracing::error!(error = %err, "eviction.cgroupScope refused; eviction off");
                return None;
            }
        };
        let systemd = host
            .hierarchy("memory")
            .is_some_and(|m| m.join(self.pod_root.qos_dirs(true)[0].as_str()).is_dir());
        let sources = qoslet_agent::eviction::observe::Sources {
            host,
            proc_root: self.proc_root.clone(),
            scope,
            pods_root: self.pod_root.qos_dirs(systemd)[0].clone(),
            memory_capacity: e.memory_capacity,
            nodefs: Some(e.nodefs_path.clone()),
            imagefs: Some(e.imagefs_path.clone()),
            pod_logs: Some(e.pod_logs_path.clone()),
        };
        let evictor = qoslet_agent::eviction::cri::CriEvictor::new(socket)
            .with_image_minimum_gc_age(e.image_minimum_gc_age);
        if !e.image_minimum_gc_age.is_zero() {
            // kubelet's image manager notes images every 5 min
            agent.add_task(
                evictor.watch_images(std::time::Duration::from_secs(300), agent.shutdown_signal()),
            );
        }
        let evictor: std::sync::Arc<dyn qoslet_eviction::evictor::Evictor> =
            std::sync::Arc::new(evictor);
        // in a cluster: the Eviction API (PodDisruptionBudgets, Events); the
        // runtime keeps node-level disk reclaim
        let evictor = match cluster.filter(|c| c.eviction_api) {
            Some(c) => std::sync::Arc::new(qoslet_kube::evict::ApiEvictor::new(
                c.client.clone(),
                c.node.clone(),
                evictor,
                c.status.clone(),
                agent.store().clone(),
            )),
            None => evictor,
        };
        Some(agent.start_eviction(
            qoslet_agent::eviction::EvictionLoop {
                config: e,
                sources,
                evictor,
                interval: std::time::Duration::from_secs(1),
                reload: Some(self.eviction_reload.subscribe()),
                persist:
                    agent.state_dir().map(|d| {
                        std::sync::Arc::new(qoslet_agent::eviction::persist::Persist::new(d))
                    }),
            },
        ))
    }

    /// The agent's loops: metrics and the QoS engine.
    fn loops(self) -> qoslet_agent::Loops {
        let (tree, cgroups, resctrl) = (self.host.tree, self.host.cgroups, self.host.resctrl);
        let node = self.node;
        let settings = self.engine;
        qoslet_agent::Loops {
            metrics: self.metrics,
            tree,
            engine: self
                .engine_cfg
                .enable
                .unwrap_or(true)
                .then(|| qoslet_agent::EngineLoop {
                    settings,
                    cgroups,
                    resctrl,
                    node,
                }),
        }
    }
}

/// `qoslet check-config`: what a start would refuse, without starting.
fn check_config(path: &std::path::Path) -> Result<()> {
    let file = config::load(path, true)?;
    if let Some(e) = &file.eviction {
        e.clone().validate().context("eviction:")?;
    }
    if let Some(k) = file.kubernetes.as_ref().filter(|k| k.enable) {
        k.limiter()?;
        if let Some(n) = &k.node_name {
            qoslet_kube::KubernetesConfig {
                node_name: Some(n.clone()),
                ..Default::default()
            }
            .node()
            .context("kubernetes:")?;
        }
    }
    outln!("{}: ok", path.display());
    Ok(())
}

async fn run_proxy(a: ProxyArgs) -> Result<()> {
    let mut cfg = qoslet_proxy::ProxyConfig::default();
    let p = prepare(a.agent, &cfg.state_dir)?;
    let file = &p.file;
    if let Some(v) = a.listen.or(file.listen.clone()) {
        cfg.listen = v;
    }
    if let Some(v) = a.runtime_endpoint.or(file.runtime_endpoint.clone()) {
        cfg.runtime_endpoint = v;
    }
    if let Some(v) = p.admin_listen.clone() {
        cfg.admin_listen = v;
    }
    if let Some(v) = p.state_dir.clone() {
        cfg.state_dir = v;
    }
    if let Some(v) = file.relay {
        tracing::warn!(
            relay = v,
            "config key relay is deprecated and ignored: HTTP/2 is always terminated (one data plane, hooks at every size)"
        );
    }
    if let Some(v) = file.max_message_bytes {
        cfg.max_message_bytes = v as usize;
    }
    if let Some(v) = file.drain_timeout {
        cfg.drain_timeout = v.0;
    }
    if let Some(v) = file.resync_interval {
        cfg.resync_interval = v.0;
    }
    let settings = hook_settings(file.hooks.as_ref())?;
    // the CRI socket first (a live qoslet: refused at once), then the agent core
    // (admin socket, state dir, checkpoint), then the proxy as its front end,
    // then the loops over the rebuilt store
    let bound = qoslet_proxy::bind(&cfg).await?;
    let agent_cfg = p.agent_config(cfg.agent(p.metrics.is_some()));
    let agent = qoslet_agent::Agent::start(agent_cfg).await?;
    p.watch_policy(&agent);
    let cluster = p.start_cluster(&agent).await?;
    let eviction = p.start_eviction(
        &agent,
        qoslet_state::endpoint::unix_path(&cfg.runtime_endpoint),
        cluster.as_ref(),
    );
    let mut hooks: Vec<(
        std::sync::Arc<dyn qoslet_proxy::Hook>,
        qoslet_proxy::HookSettings,
    )> = vec![];
    // admission first: a pod refused is not isolated
    if let Some(view) = &eviction {
        hooks.push((
            std::sync::Arc::new(qoslet_proxy::admission::AdmissionHook::new(
                view.clone(),
                p.trust.clone(),
            )),
            settings,
        ));
    }
    if let Some(iso) = p.isolation(&agent) {
        hooks.push((
            std::sync::Arc::new(qoslet_proxy::isolation::IsolationHook::new(iso)),
            settings,
        ));
    }
    let pipeline = qoslet_proxy::Pipeline::with_hooks(hooks);
    let running = qoslet_proxy::serve(agent, bound, cfg, pipeline).await;
    if let Err(e) = running.agent().start_loops(p.loops()).await {
        running.shutdown().await;
        return Err(e.into());
    }
    wait_for_signal().await?;
    tracing::info!("signal received; draining");
    // the front end drains, then the agent stops: final checkpoint, loops
    // (metrics snapshot), restoreOnExit; the state dir stays locked until then
    drop(running.shutdown().await);
    tracing::info!("stopped");
    Ok(())
}

fn policy_cfg_warnings(p: Option<&config::PolicyConfig>) -> Vec<String> {
    p.map(|p| p.resource_qos_strategy.warnings())
        .unwrap_or_default()
}

fn hook_settings(h: Option<&config::HooksConfig>) -> Result<qoslet_proxy::HookSettings> {
    let mut s = qoslet_proxy::HookSettings::default();
    if let Some(h) = h {
        if let Some(t) = h.timeout {
            s.timeout = t.0;
        }
        if let Some(p) = h.failure_policy {
            s.policy = p;
        }
    }
    Ok(s)
}

/// What the host offers, detected once at start for every room.
struct HostCaps {
    /// The cgroup tree as found (metrics read it, cgroupfs or not: `None` when
    /// there is none).
    tree: Option<qoslet_cgroups::Host>,
    /// Where qoslet may write: the same tree, only when it is cgroupfs.
    cgroups: Option<qoslet_cgroups::Cgroups>,
    resctrl: Option<qoslet_cgroups::resctrl::Resctrl>,
}

impl HostCaps {
    fn detect(cgroup_root: &std::path::Path, resctrl_root: &std::path::Path) -> Self {
        let tree = match qoslet_cgroups::Host::detect(cgroup_root) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(root = %cgroup_root.display(), error = %e, "no cgroups found: no cgroup writes, no metrics, no QoS engine");
                None
            }
        };
        let cgroups = match &tree {
            Some(h) if !h.cgroupfs => {
                tracing::error!(root = %cgroup_root.display(), "cgroupRoot is not a cgroup filesystem; qoslet writes no cgroup file there (metrics read it; no QoS engine, no cgroup writes at the runtime hooks)");
                None
            }
            Some(h) => Some(qoslet_cgroups::Cgroups::new(h.clone())),
            None => None,
        };
        let resctrl = match qoslet_cgroups::resctrl::Resctrl::detect(resctrl_root) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "resctrl unreadable; LLC/MBA isolation off");
                None
            }
        };
        Self {
            tree,
            cgroups,
            resctrl,
        }
    }
}

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
