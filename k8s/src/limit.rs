//! Client-side rate limit of qoslet's requests to the API server (client-go's
//! token bucket: `kubernetes.qps` tokens a second, at most `burst` saved):
//! evictions, Events, NodeMetric reads and writes, and the stale probes.
//! The watches themselves are long-lived requests that kube's watcher opens
//! again with its own backoff.

use std::time::Duration;
use tokio::time::Instant;

/// A token bucket.
#[derive(Debug)]
pub struct Limiter {
    qps: f64,
    burst: f64,
    state: tokio::sync::Mutex<(f64, Instant)>,
}

impl Limiter {
    /// `qps` > 0 tokens a second, `burst` ≥ 1 at most (the bucket starts full).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: if qps > 0.0 { qps } else { 1.0 },
            burst,
            state: tokio::sync::Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        loop {
            let wait = {
                let mut s = self.state.lock().await;
                let now = Instant::now();
                let refill = now.duration_since(s.1).as_secs_f64() * self.qps;
                s.0 = (s.0 + refill).min(self.burst);
                s.1 = now;
                if s.0 >= 1.0 {
                    s.0 -= 1.0;
                    return;
                }
                Duration::from_secs_f64((1.0 - s.0) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

impl Default for Limiter {
    /// koordlet's own client: QPS 20, burst 30.
    fn default() -> Self {
        Self::new(20.0, 30)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let l = Limiter::new(10.0, 3);
        let t = tokio::time::Instant::now();
        for _ in 0..3 {
            l.acquire().await;
        }
        assert!(t.elapsed() < Duration::from_millis(5), "the burst is free");
        for _ in 0..10 {
            l.acquire().await;
        }
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(950) && took <= Duration::from_millis(1100),
            "10 more at 10/s: {took:?}"
        );
    }
}
