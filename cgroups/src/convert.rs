//! cpu.shares (v1, 2..=262144) <-> cpu.weight (v2, 1..=10000), the same
//! mapping the OCI runtimes use, so a value round-trips the way runc writes it.

/// v1 shares to v2 weight.
pub fn shares_to_weight(shares: u64) -> u64 {
    let s = shares.clamp(2, 262_144);
    1 + ((s - 2) * 9999) / 262_142
}

/// v2 weight to v1 shares (inverse of [`shares_to_weight`], rounded up).
pub fn weight_to_shares(weight: u64) -> u64 {
    let w = weight.clamp(1, 10_000);
    2 + ((w - 1) * 262_142).div_ceil(9999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_kubernetes_values() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1024), 39); // a 1-core request
        assert_eq!(shares_to_weight(0), 1); // clamped
        assert_eq!(weight_to_shares(1), 2);
        assert_eq!(weight_to_shares(10_000), 262_144);
    }

    #[test]
    fn round_trip_is_stable() {
        for w in 1..=10_000 {
            assert_eq!(shares_to_weight(weight_to_shares(w)), w, "weight {w}");
        }
    }
}
