//! `resourceUsedThresholdWithBE`, with Koordinator's NodeSLO field names and
//! defaults; every field optional in the config.

use qoslet_hooks::policy::PolicyError;
use serde::Deserialize;

/// How BE CPU is suppressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum CpuSuppressPolicy {
    /// The BE pods get a shrinking/growing set of cores.
    #[serde(rename = "cpuset")]
    Cpuset,
    /// The besteffort parent cgroup gets a CFS quota.
    #[serde(rename = "cfsQuota")]
    CfsQuota,
}

/// `resourceUsedThresholdWithBE`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ResourceThresholdStrategy {
    /// Off by default (Koordinator's NodeSLO default): BE is only suppressed when asked.
    pub enable: bool,
    /// Share of the node's CPUs LS and BE may use together before BE is suppressed.
    pub cpu_suppress_threshold_percent: i64,
    pub cpu_suppress_policy: CpuSuppressPolicy,
    /// The least BE gets, as a share of the node's CPUs, however busy LS is
    /// (unset: none; koordlet's `calculateBESuppressCPU`).
    pub cpu_suppress_min_percent: Option<i64>,
    pub memory_evict_threshold_percent: i64,
    /// Default: the threshold minus 2.
    pub memory_evict_lower_percent: Option<i64>,
    #[serde(rename = "cpuEvictBESatisfactionLowerPercent")]
    pub cpu_evict_be_satisfaction_lower_percent: Option<i64>,
    #[serde(rename = "cpuEvictBESatisfactionUpperPercent")]
    pub cpu_evict_be_satisfaction_upper_percent: Option<i64>,
    #[serde(rename = "cpuEvictBEUsageThresholdPercent")]
    pub cpu_evict_be_usage_threshold_percent: i64,
    pub cpu_evict_time_window_seconds: Option<i64>,
    /// The BE limit the satisfaction is taken against.
    pub cpu_evict_policy: CpuEvictPolicy,
}

/// `cpuEvictPolicy`: the BE limit of the CPU satisfaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum CpuEvictPolicy {
    /// The real BE limit (the BE cpuset, capped by the besteffort quota).
    #[default]
    #[serde(rename = "evictByRealLimit")]
    RealLimit,
    /// The node's `kubernetes.io/batch-cpu` allocatable (known in a cluster only).
    #[serde(rename = "evictByAllocatable")]
    Allocatable,
}

impl Default for ResourceThresholdStrategy {
    fn default() -> Self {
        Self {
            enable: false,
            cpu_suppress_threshold_percent: 65,
            cpu_suppress_policy: CpuSuppressPolicy::Cpuset,
            cpu_suppress_min_percent: None,
            memory_evict_threshold_percent: 70,
            memory_evict_lower_percent: None,
            cpu_evict_be_satisfaction_lower_percent: None,
            cpu_evict_be_satisfaction_upper_percent: None,
            cpu_evict_be_usage_threshold_percent: 90,
            cpu_evict_time_window_seconds: None,
            cpu_evict_policy: CpuEvictPolicy::RealLimit,
        }
    }
}

impl ResourceThresholdStrategy {
    /// The memory eviction lower bound (threshold - 2 unless set).
    pub fn memory_evict_lower(&self) -> i64 {
        self.memory_evict_lower_percent
            .unwrap_or(self.memory_evict_threshold_percent - 2)
    }

    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let pct = |name: &str, v: i64| {
            if (0..=100).contains(&v) {
                Ok(())
            } else {
                Err(PolicyError::new(
                    format!("resourceUsedThresholdWithBE.{name}"),
                    format!("{v} is not a percentage (0-100)"),
                ))
            }
        };
        pct(
            "cpuSuppressThresholdPercent",
            self.cpu_suppress_threshold_percent,
        )?;
        if let Some(m) = self.cpu_suppress_min_percent {
            pct("cpuSuppressMinPercent", m)?;
        }
        pct(
            "memoryEvictThresholdPercent",
            self.memory_evict_threshold_percent,
        )?;
        pct("memoryEvictLowerPercent", self.memory_evict_lower())?;
        pct(
            "cpuEvictBEUsageThresholdPercent",
            self.cpu_evict_be_usage_threshold_percent,
        )?;
        let (lo, up) = (
            self.cpu_evict_be_satisfaction_lower_percent,
            self.cpu_evict_be_satisfaction_upper_percent,
        );
        if let Some(v) = lo {
            pct("cpuEvictBESatisfactionLowerPercent", v)?;
        }
        if let Some(v) = up {
            pct("cpuEvictBESatisfactionUpperPercent", v)?;
        }
        if let (Some(lo), Some(up)) = (lo, up) {
            if lo > up {
                return Err(PolicyError::new(
                    "resourceUsedThresholdWithBE.cpuEvictBESatisfactionLowerPercent",
                    format!("{lo} is above cpuEvictBESatisfactionUpperPercent {up}"),
                ));
            }
        }
        if let Some(w) = self.cpu_evict_time_window_seconds {
            if w < 1 {
                return Err(PolicyError::new(
                    "resourceUsedThresholdWithBE.cpuEvictTimeWindowSeconds",
                    format!("{w} is not a window (1 second or more)"),
                ));
            }
        }
        if self.memory_evict_lower() > self.memory_evict_threshold_percent {
            return Err(PolicyError::new(
                "resourceUsedThresholdWithBE.memoryEvictLowerPercent",
                format!(
                    "{} is above memoryEvictThresholdPercent {}",
                    self.memory_evict_lower(),
                    self.memory_evict_threshold_percent
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_evict_fields_are_validated_with_their_path() {
        for (json, field) in [
            (
                r#"{"cpuEvictBESatisfactionUpperPercent":400}"#,
                "cpuEvictBESatisfactionUpperPercent",
            ),
            (
                r#"{"cpuEvictBESatisfactionLowerPercent":-1}"#,
                "cpuEvictBESatisfactionLowerPercent",
            ),
            (
                r#"{"cpuEvictBESatisfactionLowerPercent":90,"cpuEvictBESatisfactionUpperPercent":60}"#,
                "cpuEvictBESatisfactionLowerPercent",
            ),
            (
                r#"{"cpuEvictTimeWindowSeconds":-5}"#,
                "cpuEvictTimeWindowSeconds",
            ),
            (
                r#"{"cpuEvictTimeWindowSeconds":0}"#,
                "cpuEvictTimeWindowSeconds",
            ),
        ] {
            let s: ResourceThresholdStrategy = serde_json::from_str(json).unwrap();
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
        let ok: ResourceThresholdStrategy = serde_json::from_str(
            r#"{"cpuEvictBESatisfactionLowerPercent":60,"cpuEvictBESatisfactionUpperPercent":80,"cpuEvictTimeWindowSeconds":300}"#,
        )
        .unwrap();
        ok.validate().unwrap();
    }

    #[test]
    fn node_slo_names_and_defaults() {
        let d = ResourceThresholdStrategy::default();
        assert_eq!(d.cpu_suppress_threshold_percent, 65);
        assert_eq!(d.cpu_suppress_policy, CpuSuppressPolicy::Cpuset);
        assert_eq!(d.memory_evict_lower(), 68);
        d.validate().unwrap();
        let s: ResourceThresholdStrategy = serde_json::from_str(
            r#"{"cpuSuppressThresholdPercent":40,"cpuSuppressPolicy":"cfsQuota","memoryEvictThresholdPercent":80}"#,
        )
        .unwrap();
        assert_eq!(s.cpu_suppress_policy, CpuSuppressPolicy::CfsQuota);
        assert_eq!(s.memory_evict_lower(), 78);
        assert!(!s.enable, "off unless enabled, as in Koordinator");
        assert_eq!(
            s.cpu_evict_be_usage_threshold_percent, 90,
            "unset fields keep their defaults"
        );
        for (bad, field) in [
            (
                r#"{"cpuSuppressThresholdPercent":140}"#,
                "cpuSuppressThresholdPercent",
            ),
            (
                r#"{"memoryEvictThresholdPercent":50,"memoryEvictLowerPercent":60}"#,
                "memoryEvictLowerPercent",
            ),
        ] {
            let s: ResourceThresholdStrategy = serde_json::from_str(bad).unwrap();
            assert!(s.validate().unwrap_err().path.contains(field), "{bad}");
        }
        assert!(serde_json::from_str::<ResourceThresholdStrategy>(
            r#"{"cpuSuppressPolicy":"quota"}"#
        )
        .is_err());
        assert!(serde_json::from_str::<ResourceThresholdStrategy>(
            r#"{"cpuSupressThresholdPercent":1}"#
        )
        .is_err());
    }
}
