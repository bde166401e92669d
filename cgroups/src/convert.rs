//! cpu.shares (v1, 2..=262144) <-> cpu.weight (v2, 1..=10000), the linear
//! mapping of runc 1.1 (Debian trixie's, the VM suite's) and crun, so a value
//! round-trips the way those write it. Newer runc releases convert with a
//! curve instead (opencontainers/cgroups, 2025: 1024 shares is weight 100, not
//! 39). qoslet converts only for a `CpuShares` knob it writes itself, which no
//! plan of the engine makes today: the hooks hand kubelet's shares to the
//! runtime (CRI, NRI), and the runtime converts them its own way.

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
