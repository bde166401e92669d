//! `qoslet restore`: before uninstalling qoslet (or after it was stopped with
//! the node suppressed), put every cgroup file qoslet changed back to the
//! runtime's value or the kernel's default: the besteffort parent's quota and
//! cpuset, scaled LS quotas, bursts, group identity, SCHED_IDLE, memory QoS.
//! The pods come from qoslet's checkpoint in its state dir; the config file
//! gives the same cgroup roots, trust and policy qoslet ran with. Refused while
//! a qoslet holds the state dir (it would put its settings back within a
//! tick): stop it first, or let it do this itself on SIGTERM with
//! `qosEngine.restoreOnExit: true`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use qoslet_state::checkpoint::{Checkpoint, LoadError};
use qoslet_state::statefile::{self, StateError};
use qoslet_state::store::Store;

use crate::{config, engine, isolation};

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The YAML config file qoslet ran with (cgroup roots, trust, policy, state dir).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// qoslet's state dir (its checkpoint lists the pods); default from the config, else /var/lib/qoslet.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// List what would be written; write nothing (allowed while qoslet runs).
    #[arg(long)]
    dry_run: bool,
    /// Go on without a state dir or checkpoint (only the besteffort subtree and
    /// the kube QoS dirs are then put back).
    #[arg(long)]
    force: bool,
}

pub async fn run(a: RestoreArgs) -> Result<()> {
    let (path, explicit) = match &a.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let file = config::load(&path, explicit)?;
    let defaults = qoslet_proxy::ProxyConfig::default();
    let state_dir = a
        .state_dir
        .clone()
        .or(file.state_dir.clone())
        .unwrap_or(defaults.state_dir);
    let endpoint = file
        .runtime_endpoint
        .clone()
        .unwrap_or(defaults.runtime_endpoint);
    // a running qoslet would put its settings back at its next tick: its admin
    // socket answering, or its state dir locked, refuses the restore
    let admin = file.admin_listen.clone().unwrap_or(defaults.admin_listen);
    if !a.dry_run {
        if let Ok(p) = qoslet_wire::endpoint::parse_unix(&admin) {
            if std::os::unix::net::UnixStream::connect(&p).is_ok() {
                bail!(
                    "a qoslet is running ({} answers): stop it first, or set \
                     qosEngine.restoreOnExit so it restores on SIGTERM",
                    p.display()
                );
            }
        }
    }
    let _lock = match (state_dir.is_dir(), a.dry_run) {
        (true, false) => match statefile::lock(&state_dir) {
            Ok(l) => Some(l),
            Err(StateError::Locked { path, holder }) => bail!(
                "a qoslet is running on this state dir ({} is locked by {holder}): stop it first, \
                 or set qosEngine.restoreOnExit so it restores on SIGTERM",
                path.display()
            ),
            Err(e) => return Err(e).context("state dir"),
        },
        (false, _) if !a.force => bail!(
            "no state dir at {} (pass the --state-dir qoslet ran with, or --force to put back \
             only the besteffort subtree and the kube QoS dirs)",
            state_dir.display()
        ),
        _ => None,
    };
    let store = Store::new();
    match Checkpoint::new(&state_dir, &endpoint).load() {
        Ok(snap) => store.replace(snap),
        Err(LoadError::Missing(p)) if a.force => eprintln!(
            "qoslet restore: no checkpoint at {}: only the besteffort subtree and the kube QoS dirs are put back",
            p.display()
        ),
        Err(LoadError::Missing(p)) => bail!(
            "no checkpoint at {}: the pods qoslet changed are unknown (--force puts back only \
             the besteffort subtree and the kube QoS dirs)",
            p.display()
        ),
        Err(e) => return Err(e).context("checkpoint"),
    }
    let cgroup_root = file
        .cgroup_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
    let cgroups = qoslet_cgroups::Cgroups::detect(&cgroup_root)
        .with_context(|| format!("cgroups under {}", cgroup_root.display()))?;
    let policy_cfg = file.policy.clone().unwrap_or_default();
    let proc_root = file.proc_root();
    let sys_root = file.sys_root();
    let env = qoslet_qos_engine::engine::Env {
        features: cgroups.host().features.clone(),
        v2: cgroups.host().is_v2(),
        devices: qoslet_qos_engine::source::resolve_devices(&policy_cfg.resource_qos_strategy),
        page_size: qoslet_cgroups::cgroup::page_size(),
        node: isolation::node_facts(&sys_root, &proc_root, file.reserved_cpuset.as_deref()),
    };
    let engine_cfg = file.qos_engine.clone().unwrap_or_default();
    let settings = engine::Settings {
        dry_run: a.dry_run,
        restore_on_exit: false,
        ..engine::settings(
            &engine_cfg,
            file.trust.clone().unwrap_or_default(),
            match file.kubelet_cgroup_root.as_deref() {
                Some(r) => qoslet_cgroups::PodRoot::new(r).context("kubeletCgroupRoot")?,
                None => qoslet_cgroups::PodRoot::default(),
            },
            proc_root.clone(),
            sys_root.clone(),
            false,
        )?
    };
    let policy = policy_cfg.engine();
    let inv = qoslet_state::inventory::build(
        &store,
        store.generation(),
        &settings.trust,
        &settings.pod_root,
    );
    if a.dry_run {
        for (w, p) in engine::restore_preview(&cgroups, &settings, &inv, &policy, &env) {
            let files: Vec<String> = p
                .files
                .iter()
                .map(|(f, v)| format!("{f} = {v:?}"))
                .collect();
            outln!(
                "{:<11} {} {}",
                p.state().as_str(),
                w.cgroup,
                files.join(", ")
            );
        }
        return Ok(());
    }
    let r = engine::restore(&cgroups, &settings, &inv, &policy, &env);
    outln!(
        "qoslet restore: {} files written, {} already right, {} in cgroups gone since, {} errors",
        r.written,
        r.unchanged,
        r.gone,
        r.errors.len()
    );
    for e in &r.errors {
        eprintln!("  {e}");
    }
    if !r.errors.is_empty() {
        bail!("{} files could not be put back", r.errors.len());
    }
    Ok(())
}
