//! The `eviction:` section of the config file: kubelet's own keys
//! (`evictionHard`, `evictionSoft`, `evictionSoftGracePeriod`,
//! `evictionMinimumReclaim`, `evictionPressureTransitionPeriod`,
//! `evictionMaxPodGracePeriod`, as in `KubeletConfiguration`) and qoslet's
//! (`enable`, `dryRun`, `memoryCapacity`, `cgroupScope`), validated into the
//! model's settings; every error names its field.

use std::collections::BTreeMap;
use std::time::Duration;

use qoslet_hooks::quantity::Quantity;
use serde::Deserialize;

use crate::kubelet::Settings;
use crate::threshold::{self, duration_field, ThresholdError, ThresholdMaps};

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvictionConfig {
    /// On unless `false`: kubelet's model acts once thresholds are set,
    /// Koordinator's BE model when the policy enables it.
    pub enable: Option<bool>,
    /// Decide, log and show, but stop nothing and refuse nothing.
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, deserialize_with = "qoslet_hooks::serde_null::empty")]
    pub eviction_hard: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "qoslet_hooks::serde_null::empty")]
    pub eviction_soft: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "qoslet_hooks::serde_null::empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "qoslet_hooks::serde_null::empty")]
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// Go duration; kubelet's default 5m.
    pub eviction_pressure_transition_period: Option<String>,
    /// Seconds a soft eviction gives a pod (0: the pod's own).
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Whether pods' allocatable is enforced (kubelet's `enforceNodeAllocatable`
    /// holds `pods`, its default): hard `memory.available` thresholds then hold
    /// for the pods' root cgroup too.
    pub enforce_node_allocatable: Option<bool>,
    /// A quantity that replaces the node's memory size (tests, or nodes whose
    /// pods may only use part of the memory).
    pub memory_capacity: Option<String>,
    /// A cgroup path (below the cgroup root) whose pods make up the node.
    pub cgroup_scope: Option<String>,
    /// Whether images live on a filesystem of their own.
    pub dedicated_imagefs: Option<bool>,
    /// The directory whose filesystem is nodefs (kubelet's root dir,
    /// default `/var/lib/kubelet`).
    pub nodefs_path: Option<std::path::PathBuf>,
    /// The directory whose filesystem is imagefs (the runtime's root dir,
    /// default `/var/lib/containerd`).
    pub imagefs_path: Option<std::path::PathBuf>,
    /// kubelet's pod logs directory (default `/var/log/pods`): a pod's logs
    /// count in its disk use for disk ranking.
    pub pod_logs_path: Option<std::path::PathBuf>,
    /// kubelet's `imageMinimumGCAge` (Go duration, default 2m): an image
    /// first seen more lately is not removed by disk reclaim (kubelet may
    /// have just pulled it for a container it has not created yet).
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    /// Koordinator's BE memory eviction (koordlet's `BEMemoryEvict` feature
    /// gate, off by default): with it, `resourceUsedThresholdWithBE`'s
    /// memory fields evict BE pods.
    #[serde(default)]
    pub be_memory_evict: bool,
    /// Koordinator's BE CPU-satisfaction eviction (koordlet's `BECPUEvict`
    /// feature gate, off by default).
    #[serde(default)]
    pub be_cpu_evict: bool,
}

/// The section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    pub enabled: bool,
    pub dry_run: bool,
    pub kubelet: Settings,
    pub memory_capacity: Option<i64>,
    pub cgroup_scope: Option<String>,
    pub nodefs_path: std::path::PathBuf,
    pub imagefs_path: std::path::PathBuf,
    pub pod_logs_path: std::path::PathBuf,
    pub image_minimum_gc_age: Duration,
    pub be_memory_evict: bool,
    pub be_cpu_evict: bool,
}

/// Why an `eviction:` value is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvictionConfigError {
    #[error(transparent)]
    Threshold(#[from] ThresholdError),
    #[error("eviction.evictionPressureTransitionPeriod: {0:?} is under 1s (kubelet would then report no condition at all, and admit every pod under pressure)")]
    TransitionTooShort(Duration),
    #[error("eviction.evictionMaxPodGracePeriod: {0} is negative")]
    NegativeMaxGrace(i64),
    #[error("eviction.memoryCapacity: {0:?} is not a positive quantity of bytes")]
    MemoryCapacity(String),
    #[error(
        "eviction.cgroupScope: {0:?} is not a cgroup path (relative to the cgroup root, no '..')"
    )]
    CgroupScope(String),
}

impl EvictionConfig {
    pub fn validate(&self) -> Result<Eviction, EvictionConfigError> {
        let maps = ThresholdMaps {
            eviction_hard: self.eviction_hard.clone(),
            eviction_soft: self.eviction_soft.clone(),
            eviction_soft_grace_period: self.eviction_soft_grace_period.clone(),
            eviction_minimum_reclaim: self.eviction_minimum_reclaim.clone(),
        };
        let thresholds = threshold::parse(&maps, self.enforce_node_allocatable.unwrap_or(true))?;
        let transition = match &self.eviction_pressure_transition_period {
            Some(s) => duration_field("eviction.evictionPressureTransitionPeriod", s)?,
            None => Duration::from_secs(300),
        };
        if transition < Duration::from_secs(1) {
            return Err(EvictionConfigError::TransitionTooShort(transition));
        }
        let image_minimum_gc_age = match &self.image_minimum_gc_age {
            Some(s) => duration_field("eviction.imageMinimumGCAge", s)?,
            None => Duration::from_secs(120),
        };
        let max_pod_grace_seconds = self.eviction_max_pod_grace_period.unwrap_or(0);
        if max_pod_grace_seconds < 0 {
            return Err(EvictionConfigError::NegativeMaxGrace(max_pod_grace_seconds));
        }
        let memory_capacity = match &self.memory_capacity {
            None => None,
            Some(s) => {
                let bad = || EvictionConfigError::MemoryCapacity(s.chars().take(64).collect());
                let q = Quantity::parse(s).map_err(|_| bad())?;
                match q.value() {
                    Some(v) if v > 0 && !q.is_negative() => Some(v),
                    _ => return Err(bad()),
                }
            }
        };
        let cgroup_scope = match &self.cgroup_scope {
            None => None,
            Some(s) => {
                let ok = !s.is_empty()
                    && s.len() <= 4096
                    && !s.contains('\0')
                    && s.split('/').all(|c| c != ".." && c != ".");
                if !ok {
                    return Err(EvictionConfigError::CgroupScope(
                        s.chars().take(64).collect(),
                    ));
                }
                Some(s.trim_matches('/').to_string())
            }
        };
        Ok(Eviction {
            enabled: self.enable.unwrap_or(true),
            dry_run: self.dry_run,
            kubelet: Settings {
                thresholds,
                transition,
                max_pod_grace_seconds,
                dedicated_imagefs: self.dedicated_imagefs.unwrap_or(false),
            },
            memory_capacity,
            cgroup_scope,
            nodefs_path: self
                .nodefs_path
                .clone()
                .unwrap_or_else(|| "/var/lib/kubelet".into()),
            imagefs_path: self
                .imagefs_path
                .clone()
                .unwrap_or_else(|| "/var/lib/containerd".into()),
            pod_logs_path: self
                .pod_logs_path
                .clone()
                .unwrap_or_else(|| "/var/log/pods".into()),
            image_minimum_gc_age,
            be_memory_evict: self.be_memory_evict,
            be_cpu_evict: self.be_cpu_evict,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::Signal;

    fn cfg(json: &str) -> Result<Eviction, String> {
        let c: EvictionConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn a_kubelet_style_section() {
        let e = cfg(r#"{"evictionHard":{"memory.available":"200Mi"},
            "evictionSoft":{"memory.available":"500Mi"},
            "evictionSoftGracePeriod":{"memory.available":"1m30s"},
            "evictionPressureTransitionPeriod":"30s","evictionMaxPodGracePeriod":10,
            "memoryCapacity":"2Gi","cgroupScope":"/qoslet-test/"}"#)
        .unwrap();
        assert!(e.enabled && !e.dry_run);
        // hard, soft, and the allocatable copy of the hard one
        assert_eq!(e.kubelet.thresholds.len(), 3);
        assert!(e
            .kubelet
            .thresholds
            .iter()
            .any(|t| t.signal == Signal::AllocatableMemoryAvailable));
        assert_eq!(e.kubelet.transition, Duration::from_secs(30));
        assert_eq!(e.kubelet.max_pod_grace_seconds, 10);
        assert_eq!(e.memory_capacity, Some(2 << 30));
        assert_eq!(e.cgroup_scope.as_deref(), Some("qoslet-test"));
    }

    #[test]
    fn on_unless_told_and_without_thresholds_kubelets_model_idles() {
        let e = cfg("{}").unwrap();
        assert!(e.enabled && e.kubelet.thresholds.is_empty());
        // Koordinator's models are off unless their gates are on (koordlet's defaults)
        assert!(!e.be_memory_evict && !e.be_cpu_evict);
        assert_eq!(e.image_minimum_gc_age, Duration::from_secs(120));
        let g =
            cfg(r#"{"beMemoryEvict":true,"beCpuEvict":true,"imageMinimumGCAge":"0s"}"#).unwrap();
        assert!(g.be_memory_evict && g.be_cpu_evict && g.image_minimum_gc_age.is_zero());
        assert!(
            !cfg(r#"{"enable":false,"evictionHard":{"memory.available":"1Gi"}}"#)
                .unwrap()
                .enabled
        );
        assert!(cfg(r#"{"evictionHard":{"memory.available":"0%"}}"#)
            .unwrap()
            .kubelet
            .thresholds
            .is_empty());
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (
                r#"{"evictionHard":{"memory.available":"150%"}}"#,
                "eviction.evictionHard[\"memory.available\"]",
            ),
            (
                r#"{"evictionHard":{"memory.avail":"1Gi"}}"#,
                "unsupported eviction signal",
            ),
            (
                r#"{"evictionSoft":{"memory.available":"1Gi"}}"#,
                "eviction.evictionSoftGracePeriod",
            ),
            (
                r#"{"evictionSoftGracePeriod":{"memory.available":"-1m"}}"#,
                "must be a positive value",
            ),
            (
                r#"{"evictionPressureTransitionPeriod":"5 minutes"}"#,
                "eviction.evictionPressureTransitionPeriod",
            ),
            (
                r#"{"evictionMaxPodGracePeriod":-1}"#,
                "eviction.evictionMaxPodGracePeriod",
            ),
            (r#"{"memoryCapacity":"-2Gi"}"#, "eviction.memoryCapacity"),
            (r#"{"memoryCapacity":"lots"}"#, "eviction.memoryCapacity"),
            (
                r#"{"cgroupScope":"kubepods/../../etc"}"#,
                "eviction.cgroupScope",
            ),
            (r#"{"evictionHrad":{}}"#, "unknown field"),
            (
                r#"{"imageMinimumGCAge":"2 min"}"#,
                "eviction.imageMinimumGCAge",
            ),
        ];
        for (json, want) in cases {
            let e = cfg(json).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
