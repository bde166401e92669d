//! CPU suppress: how much CPU BE pods may use while LS pods run.
//!
//! BE allowance = node capacity x cpuSuppressThresholdPercent - non-BE pod
//! usage - host application usage - max(system usage, node reserved), as
//! Koordinator computes it. With the `cfsQuota` policy it becomes the CFS
//! quota of the besteffort parent cgroup: at least 2000 µs, unchanged when
//! the difference is under 1 % of the node's CPUs (no flapping writes), and
//! grown by at most 10 % of the node's CPUs per tick (stepwise restore after
//! an LS burst); shrinking is immediate (LS first).

use crate::policy::ResourceThresholdStrategy;

/// The quota floor Koordinator uses, in µs per period.
pub const MIN_QUOTA_US: u64 = 2000;

/// What the plugin reads (cores are CPUs' worth of time per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Input {
    pub capacity_cores: f64,
    /// LSE, LSR, LS and SYSTEM pods together.
    pub non_be_pod_usage_cores: f64,
    /// Host applications qoslet is told about (none yet: 0).
    pub host_app_usage_cores: f64,
    /// Node usage minus all pods.
    pub system_usage_cores: f64,
    /// kubelet's system + kube reserved CPU.
    pub reserved_cores: f64,
    pub be_usage_cores: f64,
    /// The besteffort cgroup's quota now (`None`: unlimited).
    pub current_quota_us: Option<u64>,
    pub period_us: u64,
}

/// How hard BE is being held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The allowance covers what BE uses.
    None,
    /// BE wants more than the allowance: it is being throttled.
    Mid,
    /// The allowance is at the floor: BE is all but stopped.
    High,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Mid => "mid",
            Level::High => "high",
        }
    }

    /// 0, 1, 2 (for a gauge).
    pub fn value(self) -> u8 {
        self as u8
    }
}

/// The plugin's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Suppress {
    pub allowance_cores: f64,
    pub level: Level,
    /// The quota to write (`None`: leave the file as it is).
    pub quota_us: Option<u64>,
    pub rule: String,
}

/// The BE allowance in cores (never negative, never below
/// `cpuSuppressMinPercent` of the node when that is set).
pub fn allowance(i: &Input, p: &ResourceThresholdStrategy) -> f64 {
    let a = i.capacity_cores * p.cpu_suppress_threshold_percent as f64 / 100.0
        - i.non_be_pod_usage_cores
        - i.host_app_usage_cores
        - i.system_usage_cores.max(i.reserved_cores);
    let a = if a.is_finite() { a.max(0.0) } else { 0.0 };
    match p.cpu_suppress_min_percent {
        Some(m) => a.max(i.capacity_cores.max(0.0) * m as f64 / 100.0),
        None => a,
    }
}

/// The `cfsQuota` policy.
pub fn cfs_quota(i: &Input, p: &ResourceThresholdStrategy) -> Suppress {
    let period = i.period_us.max(1) as f64;
    let node = (i.capacity_cores * period).max(MIN_QUOTA_US as f64);
    let a = allowance(i, p);
    let want = (a * period).clamp(MIN_QUOTA_US as f64, node);
    let level = if a * period <= MIN_QUOTA_US as f64 {
        Level::High
    } else if i.be_usage_cores > a {
        Level::Mid
    } else {
        Level::None
    };
    let cur = i.current_quota_us.map(|q| q as f64);
    let mut target = want;
    if let Some(c) = cur {
        if target > c {
            target = target.min(c + node * 0.10);
        }
    }
    let target = target.round() as u64;
    let quota_us = match cur {
        Some(c) if (target as f64 - c).abs() < node * 0.01 => None,
        _ => Some(target),
    };
    let rule = format!(
        "BE allowance {a:.2} cores = {:.2} x {}% - LS {:.2} - host apps {:.2} - max(system {:.2}, reserved {:.2}); quota {} us{}",
        i.capacity_cores,
        p.cpu_suppress_threshold_percent,
        i.non_be_pod_usage_cores,
        i.host_app_usage_cores,
        i.system_usage_cores,
        i.reserved_cores,
        target,
        match (quota_us, cur) {
            (None, _) => " (within 1% of the current quota: unchanged)".to_string(),
            (Some(t), Some(c)) if (t as f64) < want && (t as f64) > c => " (grown by at most 10% of the node per tick)".to_string(),
            _ => String::new(),
        }
    );
    Suppress {
        allowance_cores: a,
        level,
        quota_us,
        rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(non_be: f64, system: f64, be: f64, cur: Option<u64>) -> Input {
        Input {
            capacity_cores: 100.0,
            non_be_pod_usage_cores: non_be,
            host_app_usage_cores: 0.0,
            system_usage_cores: system,
            reserved_cores: 2.0,
            be_usage_cores: be,
            current_quota_us: cur,
            period_us: 100_000,
        }
    }

    fn p(threshold: i64) -> ResourceThresholdStrategy {
        ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_threshold_percent: threshold,
            ..Default::default()
        }
    }

    #[test]
    fn allowance_is_koordinators_formula() {
        // 100 x 65% - 30 - max(5, 2) = 30
        assert_eq!(allowance(&input(30.0, 5.0, 0.0, None), &p(65)), 30.0);
        // reserved wins over a smaller system usage: 65 - 30 - 2
        assert_eq!(allowance(&input(30.0, 1.0, 0.0, None), &p(65)), 33.0);
        // LS over the threshold: nothing for BE, never negative
        assert_eq!(allowance(&input(80.0, 5.0, 0.0, None), &p(65)), 0.0);
        assert_eq!(allowance(&input(f64::NAN, 5.0, 0.0, None), &p(65)), 0.0);
        // cpuSuppressMinPercent: the floor koordlet's calculateBESuppressCPU keeps
        // (100 cores x 10% = 10, above 65 - 80 - 5)
        let min = |m| ResourceThresholdStrategy {
            cpu_suppress_min_percent: Some(m),
            ..p(65)
        };
        assert_eq!(allowance(&input(80.0, 5.0, 0.0, None), &min(10)), 10.0);
        assert_eq!(
            allowance(&input(30.0, 5.0, 0.0, None), &min(10)),
            30.0,
            "above the floor: as computed"
        );
        assert_eq!(
            cfs_quota(&input(80.0, 5.0, 0.0, None), &min(10)).quota_us,
            Some(1_000_000)
        );
        assert!(min(101)
            .validate()
            .unwrap_err()
            .path
            .contains("cpuSuppressMinPercent"));
    }

    #[test]
    fn cfs_quota_table() {
        // (non-BE, system, BE usage, current quota) -> (quota to write, level)
        let t = p(65);
        type Case = (f64, f64, f64, Option<u64>, Option<u64>, Level);
        let cases: [Case; 7] = [
            // first tick: unlimited -> the allowance, written
            (30.0, 5.0, 10.0, None, Some(3_000_000), Level::None),
            // steady: the same allowance, nothing written
            (30.0, 5.0, 10.0, Some(3_000_000), None, Level::None),
            // within the 1% dead band (0.5 cores of 100): nothing written
            (30.5, 5.0, 10.0, Some(3_000_000), None, Level::None),
            // LS rises: shrink at once, BE now throttled
            (
                50.0,
                5.0,
                20.0,
                Some(3_000_000),
                Some(1_000_000),
                Level::Mid,
            ),
            // LS at the threshold: the floor
            (
                70.0,
                5.0,
                20.0,
                Some(1_000_000),
                Some(MIN_QUOTA_US),
                Level::High,
            ),
            // LS load gone: grow at most 10% of the node (10 cores) per tick
            (
                0.0,
                5.0,
                20.0,
                Some(MIN_QUOTA_US),
                Some(MIN_QUOTA_US + 1_000_000),
                Level::None,
            ),
            (
                0.0,
                5.0,
                20.0,
                Some(5_002_000),
                Some(6_000_000),
                Level::None,
            ),
        ];
        for (non_be, sys, be, cur, want, level) in cases {
            let s = cfs_quota(&input(non_be, sys, be, cur), &t);
            assert_eq!(
                (s.quota_us, s.level),
                (want, level),
                "non-BE {non_be} system {sys} BE {be} current {cur:?}: {}",
                s.rule
            );
        }
    }

    #[test]
    fn never_above_the_node_and_rules_say_why() {
        let s = cfs_quota(&input(0.0, 0.0, 0.0, None), &p(100));
        assert_eq!(s.quota_us, Some(9_800_000), "100 cores - reserved 2");
        assert!(s.rule.contains("BE allowance 98.00 cores"), "{}", s.rule);
        let s = cfs_quota(&input(0.0, 0.0, 0.0, Some(1_000_000)), &p(100));
        assert!(s.rule.contains("at most 10%"), "{}", s.rule);
        // a tiny node: the floor still holds
        let tiny = Input {
            capacity_cores: 0.01,
            ..input(0.0, 0.0, 0.0, None)
        };
        assert_eq!(cfs_quota(&tiny, &p(65)).quota_us, Some(MIN_QUOTA_US));
    }
}
