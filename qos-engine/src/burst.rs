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
    /// How long a container may run above its limit, as koordlet's token
    /// bucket counts it (`burstLimiter`); negative: as long as the pool allows.
    pub cfs_quota_burst_period_seconds: i64,
    pub share_pool_threshold_percent: i64,
}

impl Default for CpuBurstStrategy {
    fn default() -> Self {
        Self {
            policy: BurstPolicy::None,
            cpu_burst_percent: 1000,
            cfs_quota_burst_percent: 300,
            cfs_quota_burst_period_seconds: -1,
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
        if self.cfs_quota_burst_period_seconds < -1 {
            return Err(PolicyError::new(
                "cpuBurstStrategy.cfsQuotaBurstPeriodSeconds",
                format!(
                    "{} is below -1 (unlimited)",
                    self.cfs_quota_burst_period_seconds
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

/// A pod's own CPU burst config (`{"policy": "none"}`, or fields over the node's).
pub const ANNOTATION_CPU_BURST: &str = "koordinator.sh/cpuBurst";

impl CpuBurstStrategy {
    /// The config for a pod: the node's with what the pod's
    /// [`ANNOTATION_CPU_BURST`] asks over it (koordlet's `genPodBurstConfig`:
    /// the pod's fields replace the node's). An untrusted pod may only ask
    /// for less: a policy without what the node's leaves off, smaller
    /// percentages, a shorter cfsQuotaBurstPeriodSeconds; a raise is ignored
    /// with the warning returned.
    pub fn for_pod(
        &self,
        annotations: &std::collections::BTreeMap<String, String>,
        trusted: bool,
    ) -> (CpuBurstStrategy, Option<String>) {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Pod {
            policy: Option<BurstPolicy>,
            cpu_burst_percent: Option<i64>,
            cfs_quota_burst_percent: Option<i64>,
            cfs_quota_burst_period_seconds: Option<i64>,
        }
        let key = ANNOTATION_CPU_BURST;
        let Some(a) = annotations.get(key) else {
            return (self.clone(), None);
        };
        if a.len() > 4096 {
            return (
                self.clone(),
                Some(format!("{key}: over 4096 bytes; ignored")),
            );
        }
        let p: Pod = match serde_json::from_str(a) {
            Ok(p) => p,
            Err(e) => return (self.clone(), Some(format!("{key}: {e}; ignored"))),
        };
        let mut out = self.clone();
        let mut raised = Vec::new();
        let parts = |b: BurstPolicy| {
            (
                matches!(b, BurstPolicy::CpuBurstOnly | BurstPolicy::Auto),
                matches!(b, BurstPolicy::CfsQuotaBurstOnly | BurstPolicy::Auto),
            )
        };
        if let Some(pol) = p.policy {
            let ((nb, ns), (pb, ps)) = (parts(self.policy), parts(pol));
            if trusted || ((!pb || nb) && (!ps || ns)) {
                out.policy = pol;
            } else {
                raised.push("policy");
            }
        }
        let mut take = |dst: &mut i64, v: Option<i64>, name: &'static str, less: bool| {
            if let Some(v) = v {
                if trusted || less {
                    *dst = v;
                } else {
                    raised.push(name);
                }
            }
        };
        let (cb, cq, cp) = (
            self.cpu_burst_percent,
            self.cfs_quota_burst_percent,
            self.cfs_quota_burst_period_seconds,
        );
        take(
            &mut out.cpu_burst_percent,
            p.cpu_burst_percent,
            "cpuBurstPercent",
            p.cpu_burst_percent.is_some_and(|v| v <= cb),
        );
        take(
            &mut out.cfs_quota_burst_percent,
            p.cfs_quota_burst_percent,
            "cfsQuotaBurstPercent",
            p.cfs_quota_burst_percent.is_some_and(|v| v <= cq),
        );
        take(
            &mut out.cfs_quota_burst_period_seconds,
            p.cfs_quota_burst_period_seconds,
            "cfsQuotaBurstPeriodSeconds",
            p.cfs_quota_burst_period_seconds
                .is_some_and(|v| v >= 0 && (cp < 0 || v <= cp)),
        );
        if let Err(e) = out.validate() {
            return (self.clone(), Some(format!("{key}: {}; ignored", e.message)));
        }
        let warning = (!raised.is_empty()).then(|| {
            format!(
                "{key}: {} would raise the pod's CPU burst above the node's (an untrusted pod only lowers it); ignored",
                raised.join(", ")
            )
        });
        (out, warning)
    }
}

/// koordlet's `burstLimiter`: a token bucket per container holding
/// `cfsQuotaBurstPeriodSeconds x (cfsQuotaBurstPercent - 100)` percent-seconds;
/// running at or above the limit spends `(usage% - 100)` a second, running
/// below 60 % of it saves `(100 - usage%)` a second, and while the bucket is
/// empty the quota is scaled down. It starts between empty and half full
/// (koordlet: at random; here from the container's id, so a restart of many
/// containers does not scale them all in step).
#[derive(Debug, Clone, PartialEq)]
pub struct Limiter {
    capacity: f64,
    tokens: f64,
    last_s: f64,
    period_s: i64,
}

impl Limiter {
    pub fn new(id: &str, period_s: i64, max_percent: i64, now_s: f64) -> Self {
        let capacity = period_s.max(0) as f64 * (max_percent - 100).max(0) as f64;
        let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let start = (h >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        Self {
            capacity,
            tokens: capacity * start,
            last_s: now_s,
            period_s,
        }
    }

    /// Whether the bucket was made for this configuration.
    pub fn is_for(&self, period_s: i64, max_percent: i64) -> bool {
        self.period_s == period_s
            && self.capacity == period_s.max(0) as f64 * (max_percent - 100).max(0) as f64
    }

    /// Spends or saves for the time since the last call at `usage_percent` of
    /// the limit; whether the container may stay scaled up.
    pub fn allow(&mut self, now_s: f64, usage_percent: f64) -> bool {
        let dt = (now_s - self.last_s).max(0.0);
        if usage_percent >= 100.0 {
            self.tokens -= (usage_percent - 100.0) * dt;
        } else if usage_percent < 60.0 {
            self.tokens += (100.0 - usage_percent) * dt;
        }
        self.tokens = self.tokens.clamp(-self.capacity, self.capacity);
        self.last_s = now_s;
        self.tokens > 0.0
    }

    /// Not asked for two periods: forgotten (koordlet's `Expire`).
    pub fn expired(&self, now_s: f64) -> bool {
        now_s - self.last_s > 2.0 * self.period_s.max(0) as f64
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
    /// The container's [`Limiter`] has run dry: scale down, whatever the pool.
    pub limited: bool,
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
        (true, _) if c.limited && cur > c.limit_quota_us => (
            ((cur as f64 * 0.8) as u64).max(c.limit_quota_us),
            "above the limit for longer than cfsQuotaBurstPeriodSeconds allows: quota x0.8 toward the limit",
        ),
        (true, _) if c.limited => (cur, "cfsQuotaBurstPeriodSeconds spent: quota held at the limit"),
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
            limited: false,
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

    /// koordlet's `burstLimiter`: capacity period x (max% - 100); spent
    /// (usage% - 100) a second at or above the limit, saved (100 - usage%) a
    /// second below 60 %, clamped to +-capacity; dry at 0 or below.
    #[test]
    fn the_burst_limiter_is_koordlets_token_bucket() {
        // 10 s at up to 300 %: 2000 percent-seconds
        let mut l = Limiter::new("c1", 10, 300, 0.0);
        assert!(
            l.tokens >= 0.0 && l.tokens < 1000.0,
            "starts below half: {}",
            l.tokens
        );
        assert_eq!(
            l.tokens,
            Limiter::new("c1", 10, 300, 5.0).tokens,
            "deterministic"
        );
        l.tokens = 500.0;
        // at 300 % of the limit: 200 a second; dry after 2.5 s
        assert!(l.allow(1.0, 300.0));
        assert!(l.allow(2.0, 300.0));
        assert!(!l.allow(3.0, 300.0), "{}", l.tokens);
        // between 60 % and 100 %: neither spent nor saved
        assert!(!l.allow(10.0, 80.0));
        // below 60 %: saved (100 - 20) a second, up to the capacity
        assert!(l.allow(12.0, 20.0), "{}", l.tokens);
        assert!(l.allow(1000.0, 0.0));
        assert_eq!(l.tokens, 2000.0);
        // at most as far into debt as the capacity
        assert!(!l.allow(2000.0, 300.0));
        assert_eq!(l.tokens, -2000.0);
        assert!(
            !l.expired(2020.0) && l.expired(2020.5),
            "two periods unasked"
        );
        assert!(l.is_for(10, 300) && !l.is_for(20, 300) && !l.is_for(10, 200));
        // a policy's extreme values neither overflow nor panic
        let mut huge = Limiter::new("c2", i64::MAX, i64::MAX, 0.0);
        huge.allow(1.0, 300.0);
        assert!(huge.tokens.is_finite());
        let mut none = Limiter::new("c3", 0, 300, 0.0);
        assert!(!none.allow(1.0, 300.0), "no period: no burst");
        // a dry bucket scales the quota down whatever the pool, never below the limit
        let mut dry = c(400_000, 0.5);
        dry.limited = true;
        let b = decide(&dry, Pool::Idle, &s(BurstPolicy::Auto));
        assert_eq!(b.quota_us, Some(320_000), "{}", b.rule);
        dry.current_quota_us = 220_000;
        assert_eq!(
            decide(&dry, Pool::Idle, &s(BurstPolicy::Auto)).quota_us,
            Some(200_000)
        );
        dry.current_quota_us = 200_000;
        assert_eq!(
            decide(&dry, Pool::Idle, &s(BurstPolicy::Auto)).quota_us,
            None,
            "held at the limit"
        );
    }

    /// Issue 14 item 9: the pod-level `koordinator.sh/cpuBurst` annotation as
    /// koordlet's `genPodBurstConfig` merges it, bounded for untrusted pods.
    #[test]
    fn a_pods_cpu_burst_annotation_over_the_nodes() {
        let node = CpuBurstStrategy {
            policy: BurstPolicy::Auto,
            cfs_quota_burst_period_seconds: 60,
            ..Default::default()
        };
        let run = |a: &str, trusted: bool| {
            let ann = [(ANNOTATION_CPU_BURST.to_string(), a.to_string())].into();
            let (b, w) = node.for_pod(&ann, trusted);
            (
                b.policy,
                b.cpu_burst_percent,
                b.cfs_quota_burst_percent,
                b.cfs_quota_burst_period_seconds,
                w.is_some(),
            )
        };
        use BurstPolicy::*;
        // (policy, cpuBurst%, cfsQuotaBurst%, period s, warned)
        type Got = (BurstPolicy, i64, i64, i64, bool);
        let table: &[(&str, bool, Got)] = &[
            (r#"{"policy":"none"}"#, false, (None, 1000, 300, 60, false)),
            (
                r#"{"policy":"cpuBurstOnly","cpuBurstPercent":200}"#,
                false,
                (CpuBurstOnly, 200, 300, 60, false),
            ),
            // raises from an untrusted pod: ignored, with a warning
            (
                r#"{"cpuBurstPercent":5000,"cfsQuotaBurstPeriodSeconds":-1}"#,
                false,
                (Auto, 1000, 300, 60, true),
            ),
            (
                r#"{"cfsQuotaBurstPercent":200,"cfsQuotaBurstPeriodSeconds":10}"#,
                false,
                (Auto, 1000, 200, 10, false),
            ),
            (
                r#"{"cpuBurstPercent":5000,"cfsQuotaBurstPeriodSeconds":-1}"#,
                true,
                (Auto, 5000, 300, -1, false),
            ),
            // bad input: the node's, with a warning
            (
                r#"{"policy":"sometimes"}"#,
                true,
                (Auto, 1000, 300, 60, true),
            ),
            (
                r#"{"cfsQuotaBurstPercent":50}"#,
                true,
                (Auto, 1000, 300, 60, true),
            ),
        ];
        for (a, trusted, want) in table {
            assert_eq!(run(a, *trusted), *want, "{a} trusted {trusted}");
        }
        // a node with burst off: an untrusted pod cannot turn it on for itself
        let off = CpuBurstStrategy::default();
        let ann = [(
            ANNOTATION_CPU_BURST.to_string(),
            r#"{"policy":"auto"}"#.to_string(),
        )]
        .into();
        assert_eq!(off.for_pod(&ann, false).0.policy, None);
        assert_eq!(off.for_pod(&ann, true).0.policy, Auto);
        assert_eq!(
            off.for_pod(&Default::default(), false),
            (off.clone(), Option::None)
        );
    }
}
