//! CPU burst for LS pods with CPU limits (not LSR/LSE, whose CPUs are bound,
//! nor BE): the kernel's CFS burst (`cpu.cfs_burst_us` / `cpu.max.burst`)
//! lets a container bank unused quota, and the quota itself is scaled while
//! the node's share pool has room:
//!
//! * burst = limit × cpuBurstPercent / 100 (in µs per period);
//! * the share pool is *overloaded* at or above sharePoolThresholdPercent of
//!   its capacity, *cooling* between 90 % of that and the threshold, *idle*
//!   below; idle and throttled: quota × 1.2 up to limit × cfsQuotaBurstPercent;
//!   overloaded: quota × 0.8 back down to the limit; cooling: unchanged.

use qoslet_hooks::policy::PolicyError;
use serde::Deserialize;

/// `cpuBurstStrategy.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum BurstPolicy {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "cpuBurstOnly")]
    CpuBurstOnly,
    #[serde(rename = "cfsQuotaBurstOnly")]
    CfsQuotaBurstOnly,
    #[serde(rename = "auto")]
    Auto,
}

/// `cpuBurstStrategy`, NodeSLO names and defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CpuBurstStrategy {
    pub policy: BurstPolicy,
    pub cpu_burst_percent: i64,
    pub cfs_quota_burst_percent: i64,
    pub share_pool_threshold_percent: i64,
}

impl Default for CpuBurstStrategy {
    fn default() -> Self {
        Self {
            policy: BurstPolicy::None,
            cpu_burst_percent: 1000,
            cfs_quota_burst_percent: 300,
            share_pool_threshold_percent: 50,
        }
    }
}

impl CpuBurstStrategy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.cpu_burst_percent < 0 {
            return Err(PolicyError::new(
                "cpuBurstStrategy.cpuBurstPercent",
                format!("{} is negative", self.cpu_burst_percent),
            ));
        }
        if self.cfs_quota_burst_percent < 100 {
            return Err(PolicyError::new(
                "cpuBurstStrategy.cfsQuotaBurstPercent",
                format!(
                    "{} is below 100 (the limit itself)",
                    self.cfs_quota_burst_percent
                ),
            ));
        }
        if !(0..=100).contains(&self.share_pool_threshold_percent) {
            return Err(PolicyError::new(
                "cpuBurstStrategy.sharePoolThresholdPercent",
                format!("{} is not 0-100", self.share_pool_threshold_percent),
            ));
        }
        Ok(())
    }
}

/// The share pool's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Idle,
    Cooling,
    Overloaded,
}

/// The share pool's state from its usage and capacity (cores).
pub fn pool(usage_cores: f64, capacity_cores: f64, s: &CpuBurstStrategy) -> Pool {
    if capacity_cores.is_nan() || capacity_cores <= 0.0 {
        return Pool::Overloaded;
    }
    let thr = s.share_pool_threshold_percent as f64 / 100.0;
    let r = usage_cores / capacity_cores;
    if r >= thr {
        Pool::Overloaded
    } else if r >= thr * 0.9 {
        Pool::Cooling
    } else {
        Pool::Idle
    }
}

/// One container's inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Container {
    /// kubelet's quota and period (the limit), µs.
    pub limit_quota_us: u64,
    pub period_us: u64,
    /// The quota in the cgroup now.
    pub current_quota_us: u64,
    /// Share of periods throttled over the last interval.
    pub throttled_ratio: f64,
}

/// What to write (`None`: leave as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Burst {
    pub burst_us: Option<u64>,
    pub quota_us: Option<u64>,
    pub rule: String,
}

pub fn decide(c: &Container, pool_state: Pool, s: &CpuBurstStrategy) -> Burst {
    let burst_on = matches!(s.policy, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto);
    let quota_on = matches!(s.policy, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto);
    let wanted_burst =
        burst_on.then(|| c.limit_quota_us.saturating_mul(s.cpu_burst_percent as u64) / 100);
    let max = c
        .limit_quota_us
        .saturating_mul(s.cfs_quota_burst_percent as u64)
        / 100;
    let cur = c.current_quota_us;
    let (target, why) = match (quota_on, pool_state) {
        (false, _) => (cur, "cfsQuotaBurst off"),
        (true, Pool::Overloaded) if cur > c.limit_quota_us => (
            ((cur as f64 * 0.8) as u64).max(c.limit_quota_us),
            "share pool overloaded: quota x0.8 toward the limit",
        ),
        (true, Pool::Idle) if c.throttled_ratio > 0.0 && cur < max => (
            ((cur as f64 * 1.2) as u64).min(max),
            "share pool idle and the container throttled: quota x1.2",
        ),
        (true, Pool::Cooling) => (cur, "share pool cooling: quota held"),
        _ => (cur, "quota unchanged"),
    };
    // the kernel refuses a burst above the quota in force (EINVAL, checked on v1
    // and v2): at most the smaller of this tick's quota before and after
    let burst_us = wanted_burst.map(|b| b.min(target).min(cur));
    Burst {
        burst_us,
        quota_us: (target != cur).then_some(target),
        rule: format!(
            "{why} (limit {} us, max {} us = {}%){}",
            c.limit_quota_us,
            max,
            s.cfs_quota_burst_percent,
            match (burst_us, wanted_burst) {
                (Some(b), Some(w)) if b < w => format!(
                    "; burst {b} us ({}% of the limit is {w} us; the kernel allows at most the quota)",
                    s.cpu_burst_percent
                ),
                (Some(b), _) => format!("; burst {b} us = {}% of the limit", s.cpu_burst_percent),
                _ => String::new(),
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(policy: BurstPolicy) -> CpuBurstStrategy {
        CpuBurstStrategy {
            policy,
            ..Default::default()
        }
    }

    fn c(cur: u64, throttled: f64) -> Container {
        Container {
            limit_quota_us: 200_000,
            period_us: 100_000,
            current_quota_us: cur,
            throttled_ratio: throttled,
        }
    }

    #[test]
    fn pool_states() {
        let d = CpuBurstStrategy::default();
        assert_eq!(pool(10.0, 100.0, &d), Pool::Idle);
        assert_eq!(pool(46.0, 100.0, &d), Pool::Cooling);
        assert_eq!(pool(50.0, 100.0, &d), Pool::Overloaded);
        assert_eq!(
            pool(1.0, 0.0, &d),
            Pool::Overloaded,
            "no capacity: no bursting"
        );
    }

    #[test]
    fn burst_and_quota_table() {
        // (policy, current quota, throttled, pool) -> (burst, quota write); a
        // burst is at most the quota before and after (the kernel refuses more)
        let cases = [
            (BurstPolicy::None, 200_000, 0.5, Pool::Idle, None, None),
            (
                BurstPolicy::CpuBurstOnly,
                200_000,
                0.5,
                Pool::Idle,
                Some(200_000),
                None,
            ),
            (
                BurstPolicy::Auto,
                200_000,
                0.5,
                Pool::Idle,
                Some(200_000),
                Some(240_000),
            ),
            (
                BurstPolicy::Auto,
                400_000,
                0.5,
                Pool::Overloaded,
                Some(320_000),
                Some(320_000),
            ),
            // not throttled: no reason to grow
            (
                BurstPolicy::CfsQuotaBurstOnly,
                200_000,
                0.0,
                Pool::Idle,
                None,
                None,
            ),
            // capped at 300% of the limit
            (
                BurstPolicy::CfsQuotaBurstOnly,
                550_000,
                0.5,
                Pool::Idle,
                None,
                Some(600_000),
            ),
            (
                BurstPolicy::CfsQuotaBurstOnly,
                600_000,
                0.5,
                Pool::Idle,
                None,
                None,
            ),
            // cooling: held
            (
                BurstPolicy::CfsQuotaBurstOnly,
                400_000,
                0.5,
                Pool::Cooling,
                None,
                None,
            ),
            // overloaded: back toward the limit, never below it
            (
                BurstPolicy::CfsQuotaBurstOnly,
                400_000,
                0.5,
                Pool::Overloaded,
                None,
                Some(320_000),
            ),
            (
                BurstPolicy::CfsQuotaBurstOnly,
                220_000,
                0.5,
                Pool::Overloaded,
                None,
                Some(200_000),
            ),
            (
                BurstPolicy::CfsQuotaBurstOnly,
                200_000,
                0.5,
                Pool::Overloaded,
                None,
                None,
            ),
        ];
        for (policy, cur, thr, p, burst, quota) in cases {
            let b = decide(&c(cur, thr), p, &s(policy));
            assert_eq!(
                (b.burst_us, b.quota_us),
                (burst, quota),
                "{policy:?} {cur} {thr} {p:?}: {}",
                b.rule
            );
        }
    }

    #[test]
    fn node_slo_names_and_validation() {
        let s: CpuBurstStrategy = serde_json::from_str(
            r#"{"policy":"auto","cpuBurstPercent":500,"sharePoolThresholdPercent":60}"#,
        )
        .unwrap();
        assert_eq!(s.policy, BurstPolicy::Auto);
        assert_eq!(s.cfs_quota_burst_percent, 300, "default kept");
        s.validate().unwrap();
        assert!(CpuBurstStrategy {
            cfs_quota_burst_percent: 50,
            ..s.clone()
        }
        .validate()
        .unwrap_err()
        .path
        .ends_with("cfsQuotaBurstPercent"));
        assert!(serde_json::from_str::<CpuBurstStrategy>(r#"{"policy":"sometimes"}"#).is_err());
    }
}
