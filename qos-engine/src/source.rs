//! The policy as the policy hub publishes it: a Koordinator NodeSLO spec
//! parsed and validated ([`PolicyConfig`]), its block devices resolved on
//! this host, which source it comes from and where every source stands, sent
//! whole on a `tokio::sync::watch` channel ([`PolicyRx`]). The runtime hooks
//! and the engine subscribe; the hub (`qoslet_agent::hub`) takes the sources'
//! offers (the config file, a NodeSLO from the cluster) and publishes.

use std::collections::BTreeMap;
use std::sync::Arc;

use qoslet_hooks::policy::ResourceQosStrategy;
use serde::Deserialize;

/// `policy:` — a Koordinator NodeSLO spec (or a whole NodeSLO object), as it
/// is: the fields qoslet implements are parsed strictly, the ones only
/// Koordinator has are set aside and listed (`not_implemented`), a field
/// neither has is an error with its path (see `qoslet_hooks::nodeslo`), and
/// a value out of its range is an error with its path too: a `PolicyConfig`
/// is valid by construction, whichever source it was parsed for.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(try_from = "serde_json::Value")]
pub struct PolicyConfig {
    pub resource_qos_strategy: qoslet_hooks::policy::ResourceQosStrategy,
    pub resource_used_threshold_with_be: crate::policy::ResourceThresholdStrategy,
    pub cpu_burst_strategy: crate::burst::CpuBurstStrategy,
    /// NodeSLO fields qoslet does not act on (`path = value`), for the log and `qoslet plan`.
    pub not_implemented: Vec<String>,
}

impl TryFrom<serde_json::Value> for PolicyConfig {
    type Error = crate::error::InvalidPolicy;

    fn try_from(v: serde_json::Value) -> Result<Self, Self::Error> {
        let split = qoslet_hooks::nodeslo::split(&v)?;
        let part = |key: &str| {
            split
                .spec
                .get(key)
                .cloned()
                .unwrap_or(serde_json::Value::Object(Default::default()))
        };
        let field = |section: &'static str| {
            move |e: serde_json::Error| crate::error::InvalidPolicy::Parse {
                section,
                message: e.to_string(),
            }
        };
        let p = Self {
            resource_qos_strategy: serde_json::from_value(part("resourceQOSStrategy"))
                .map_err(field("resourceQOSStrategy"))?,
            resource_used_threshold_with_be: serde_json::from_value(part(
                "resourceUsedThresholdWithBE",
            ))
            .map_err(field("resourceUsedThresholdWithBE"))?,
            cpu_burst_strategy: serde_json::from_value(part("cpuBurstStrategy"))
                .map_err(field("cpuBurstStrategy"))?,
            not_implemented: split.not_implemented,
        };
        p.resource_qos_strategy
            .validate()
            .and_then(|_| p.resource_used_threshold_with_be.validate())
            .and_then(|_| p.cpu_burst_strategy.validate())?;
        Ok(p)
    }
}

impl PolicyConfig {
    /// The engine's view of the policy.
    pub fn engine(&self) -> crate::engine::Policy {
        crate::engine::Policy {
            threshold: self.resource_used_threshold_with_be.clone(),
            burst: self.cpu_burst_strategy.clone(),
            qos: self.resource_qos_strategy.clone(),
        }
    }
}

/// The policy in force, as published.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub policy: PolicyConfig,
    /// The policy's block devices resolved on this host.
    pub devices: BTreeMap<String, qoslet_cgroups::Device>,
    /// Why a source's last change was refused (the policy above is the last good one).
    pub error: Option<String>,
    /// The source the policy comes from (`file`, `cluster`; `default`: none has one).
    pub source: &'static str,
    /// Every source, highest precedence first.
    pub sources: Vec<SourceStatus>,
}

/// Where one policy source stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStatus {
    pub source: String,
    /// `ok`, `invalid` (its last change refused), `stale` (unreachable), `absent`.
    pub state: String,
    /// Why it is invalid or stale.
    pub error: String,
    /// Its policy is the one in force.
    pub in_force: bool,
}

impl Published {
    /// A policy with its devices resolved (blocking: reads `/dev` and sysfs).
    pub fn new(policy: PolicyConfig) -> Self {
        Self {
            devices: resolve_devices(&policy.resource_qos_strategy),
            policy,
            error: None,
            source: "default",
            sources: Vec::new(),
        }
    }
}

/// Subscribers' end of the channel.
pub type PolicyRx = tokio::sync::watch::Receiver<Arc<Published>>;

/// Resolves every `blkioQOS` device name of the policy; a name that is not a
/// block device here is logged once (its limits are skipped per pod, with a warning).
pub fn resolve_devices(policy: &ResourceQosStrategy) -> BTreeMap<String, qoslet_cgroups::Device> {
    let mut out = BTreeMap::new();
    for c in [
        &policy.lsr_class,
        &policy.ls_class,
        &policy.be_class,
        &policy.system_class,
    ] {
        if !c.blkio_qos.enable {
            continue;
        }
        for b in &c.blkio_qos.blocks {
            if out.contains_key(&b.name) {
                continue;
            }
            if b.block_type != "device" {
                tracing::warn!(name = %b.name, block_type = %b.block_type, "blkioQOS block type not implemented by qoslet (CRI carries no pod volumes); skipped");
                continue;
            }
            match qoslet_cgroups::Device::resolve(&b.name) {
                Ok(d) => {
                    out.insert(b.name.clone(), d);
                }
                Err(e) => tracing::warn!(error = %e, "blkioQOS device skipped"),
            }
        }
    }
    out
}
