//! Koordinator's BE CPU-satisfaction eviction in the loop: every QoS engine
//! tick gives one sample of the real BE limit, the BE pods' batch-cpu
//! requests and the besteffort cgroup's use (the engine reads them for CPU
//! suppress already: one reading, not two); the window's mean and the last
//! sample decide (the `qoslet-eviction` room's `cpu_task`), at most once per
//! 20 s cool-down, from 20 s after start (koordlet's).

use std::time::Duration;

use qoslet_eviction::evictor::{EvictRequest, Model};
use qoslet_eviction::koord::{self, BeCpu, CpuEvictPolicy, CpuPolicy, CpuPolicyError};
use qoslet_eviction::Pod;
use qoslet_qos_engine::policy::{self as engine_policy, ResourceThresholdStrategy};
use qoslet_state::inventory::Inventories;
use qoslet_state::store::Store;

use super::Cycle;

/// The BE CPU policy in force: `None` while `enable` is off or the
/// satisfaction bounds are unset (koordlet skips the feature); an error when
/// they fail koordlet's check (logged, the feature skipped). `interval` is
/// the sampling interval (the engine's tick).
pub fn be_cpu_policy(
    p: &ResourceThresholdStrategy,
    interval: Duration,
) -> Option<Result<CpuPolicy, CpuPolicyError>> {
    if !p.enable {
        return None;
    }
    let (Some(lower), Some(upper)) = (
        p.cpu_evict_be_satisfaction_lower_percent,
        p.cpu_evict_be_satisfaction_upper_percent,
    ) else {
        return None;
    };
    // koordlet: the collect interval, or the configured window when longer
    let window = match p.cpu_evict_time_window_seconds {
        Some(w) if w > 0 && Duration::from_secs(w as u64) > interval => {
            Duration::from_secs(w as u64)
        }
        _ => interval,
    };
    let c = CpuPolicy {
        lower_percent: lower,
        upper_percent: upper,
        usage_threshold_percent: p.cpu_evict_be_usage_threshold_percent,
        window,
        policy: match p.cpu_evict_policy {
            engine_policy::CpuEvictPolicy::RealLimit => CpuEvictPolicy::ByRealLimit,
            engine_policy::CpuEvictPolicy::Allocatable => CpuEvictPolicy::ByAllocatable,
        },
    };
    Some(c.check().map(|_| c))
}

/// koordlet's sample-count rule: a window holds too few samples when
/// `count × interval < window / 3` (whole seconds).
pub fn samples_needed(window: Duration, interval: Duration) -> usize {
    let (w, i) = (window.as_secs(), interval.as_secs().max(1));
    (w / 3).div_ceil(i) as usize
}

impl Cycle {
    /// Takes the engine's newest sample (once per engine tick).
    pub(super) fn sample_be_cpu(&mut self, now: Duration, keep: Duration) {
        let Some(engine) = self.views.engine() else {
            return;
        };
        let Some((seq, b)) = engine.be_cpu() else {
            return;
        };
        if self.be_cpu_seq == Some(seq) {
            return;
        }
        self.be_cpu_seq = Some(seq);
        if b.untrusted > 0 {
            self.warn_once(
                "be-cpu untrusted".into(),
                &format!(
                    "BE CPU satisfaction: {} BE pods' batch-cpu requests are not counted (their annotations are not trusted; see trust: in the configuration)",
                    b.untrusted
                ),
            );
        }
        // koordlet's first sample after start is 0; an unmeasured tick is none
        let Some(usage) = b.usage_milli else {
            return;
        };
        self.be_cpu_pods = b.pods;
        self.cpu_history.push(
            now,
            BeCpu {
                real_limit: b.real_limit_milli,
                request: b.request_milli,
                usage,
            },
            keep,
        );
    }

    /// One round of the BE CPU feature: samples, and when the satisfaction
    /// is low enough (and not cooling down), BE pods evicted until their
    /// batch-cpu requests cover the release.
    pub(super) async fn be_cpu_round(
        &mut self,
        now: Duration,
        policy: Option<Result<CpuPolicy, CpuPolicyError>>,
        store: &Store,
        inventories: &Inventories,
    ) {
        let policy = match policy {
            None => return,
            Some(Err(e)) => {
                self.warn_once(
                    "be-cpu policy".into(),
                    &format!("BE CPU eviction skipped: {e}"),
                );
                return;
            }
            Some(Ok(p)) => p,
        };
        if self.views.engine().is_none() {
            self.warn_once(
                "be-cpu engine".into(),
                "BE CPU eviction needs the QoS engine (qosEngine.enable): it samples the BE limit, requests and use",
            );
            return;
        }
        self.sample_be_cpu(now, policy.window + Duration::from_secs(2));
        if self.koord.cpu_cooling(now) {
            return;
        }
        let Some(w) = self.cpu_history.window(now, policy.window) else {
            return;
        };
        // the samples come at the metrics' interval (an engine tick each):
        // the rule counts them at that interval, not the loop's
        let needed = samples_needed(
            policy.window,
            self.cpu_history.interval().max(self.cfg.interval),
        );
        // the node's batch-cpu allocatable is the cluster's (not known here)
        let due = koord::cpu_task(&policy, &w, needed, None, &[]);
        if !matches!(due, Ok(Some(_))) {
            return;
        }
        let Some(mut candidates) = self.candidates(inventories, store).await else {
            return;
        };
        for c in &mut candidates {
            let (used, request) = self
                .be_cpu_pods
                .get(&c.sandbox_id)
                .copied()
                .unwrap_or((0, 0));
            c.pod.requests.batch_cpu_milli = request;
            if let Some(s) = c.pod.stats.as_mut() {
                s.cpu_milli = Some(used);
            } else {
                c.pod.stats = Some(qoslet_eviction::PodStats {
                    cpu_milli: Some(used),
                    ..Default::default()
                });
            }
        }
        let plain: Vec<Pod> = candidates.iter().map(|c| c.pod.clone()).collect();
        let Ok(Some(task)) = koord::cpu_task(&policy, &w, needed, None, &plain) else {
            return;
        };
        let round = koord::execute(
            std::slice::from_ref(&task),
            &plain,
            |p| {
                self.koord.was_evicted(&p.uid, now)
                    || self.terminating.contains_key(&p.uid)
                    || self.refused.contains_key(&p.uid)
            },
            |_, _| true,
        );
        let satisfaction = if w.avg.request > 0.0 {
            (w.avg.real_limit * 100.0 / w.avg.request) as i64
        } else {
            0
        };
        for (i, _) in &round.evicted {
            let c = &candidates[*i];
            let req = EvictRequest {
                sandbox_id: c.sandbox_id.clone(),
                uid: c.pod.uid.clone(),
                namespace: c.pod.namespace.clone(),
                name: c.pod.name.clone(),
                grace_seconds: 0,
                model: Model::BeCpu,
                signal: None,
                observed: Some(satisfaction),
                threshold: Some(policy.lower_percent),
                message: format!("qoslet BE CPU eviction: {}", task.reason),
            };
            self.spawn_koord(store, req, None);
        }
        self.koord.record(now, &round, &plain);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_from_the_nodeslo_fields() {
        let s = |lower, upper, window| ResourceThresholdStrategy {
            enable: true,
            cpu_evict_be_satisfaction_lower_percent: lower,
            cpu_evict_be_satisfaction_upper_percent: upper,
            cpu_evict_time_window_seconds: window,
            ..Default::default()
        };
        let sec = Duration::from_secs(1);
        assert!(be_cpu_policy(&s(None, Some(80), None), sec).is_none());
        assert!(be_cpu_policy(&s(Some(60), None, None), sec).is_none());
        let off = ResourceThresholdStrategy {
            enable: false,
            ..s(Some(60), Some(80), None)
        };
        assert!(be_cpu_policy(&off, sec).is_none());
        assert_eq!(
            be_cpu_policy(&s(Some(70), Some(80), None), sec),
            Some(Err(CpuPolicyError::Lower(70)))
        );
        let p = be_cpu_policy(&s(Some(60), Some(80), Some(60)), sec)
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.lower_percent, p.upper_percent, p.usage_threshold_percent),
            (60, 80, 90)
        );
        assert_eq!(p.window, Duration::from_secs(60));
        assert_eq!(p.policy, CpuEvictPolicy::ByRealLimit);
        // a window no longer than the interval is the interval
        let p = be_cpu_policy(&s(Some(60), Some(80), Some(1)), sec)
            .unwrap()
            .unwrap();
        assert_eq!(p.window, sec);
    }

    #[test]
    fn sample_count_rule_is_koordlets() {
        let s = Duration::from_secs;
        // (window, interval, needed)
        for (w, i, n) in [(60, 1, 20), (1, 1, 0), (10, 1, 3), (61, 2, 10), (5, 1, 1)] {
            assert_eq!(samples_needed(s(w), s(i)), n, "window {w} interval {i}");
        }
    }
}
