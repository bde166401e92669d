//! The QoS engine's settings from the config file's `qosEngine:` section. The
//! loop itself is `qoslet_qos_engine::runner`.

use std::path::PathBuf;

use qoslet_cgroups::CgroupPath;
pub use qoslet_qos_engine::runner::{restore, restore_preview, CpuManager, Settings};

/// The settings the config's `qosEngine:` section gives (with the trust,
/// pod root and procfs the rest of the config names); one place for both
/// the agent and `qoslet restore`.
pub fn settings(
    c: &crate::config::EngineConfig,
    trust: qoslet_hooks::Trust,
    pod_root: qoslet_cgroups::PodRoot,
    proc_root: PathBuf,
    sys_root: PathBuf,
    dry_run_flag: bool,
) -> anyhow::Result<Settings> {
    use crate::config::defaults;
    use anyhow::Context;
    let interval = c.interval.map_or(defaults::ENGINE_INTERVAL, |i| i.0);
    let drift_every = c
        .drift_check_interval
        .map_or(defaults::DRIFT_CHECK_INTERVAL, |i| i.0);
    Ok(Settings {
        interval,
        dry_run: dry_run_flag || c.dry_run.unwrap_or(false),
        be_parent: c
            .be_parent
            .as_deref()
            .map(CgroupPath::parse)
            .transpose()
            .context("qosEngine.beParent")?,
        reserved: qoslet_qos_engine::runner::Reserved::from_file(c.reserved_cpus),
        verify_every: (drift_every.as_secs() / interval.as_secs()).max(1),
        sys_root,
        trust,
        pod_root,
        proc_root,
        restore_on_exit: c.restore_on_exit.unwrap_or(false),
        cpu_manager: cpu_manager(c)?,
    })
}

/// `qosEngine.cpuManagerPolicy` and `kubeletRootDir` as a [`CpuManager`].
pub fn cpu_manager(c: &crate::config::EngineConfig) -> anyhow::Result<CpuManager> {
    let file = c
        .kubelet_root_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet"))
        .join("cpu_manager_state");
    Ok(match c.cpu_manager_policy.as_deref().unwrap_or("auto") {
        "static" => CpuManager::Static(file),
        "none" => CpuManager::None,
        "auto" => CpuManager::Auto(file),
        other => anyhow::bail!("qosEngine.cpuManagerPolicy: {other:?} is not auto, none or static"),
    })
}
