//! A fast, non-cryptographic hasher (not DoS-resistant) for the per-tick maps keyed by entity
//! names (`container/<64 hex>`): the keys come from the store, not from an
//! attacker choosing collisions, and SipHash over 74-byte keys thousands of
//! times a second shows in the agent's CPU profile.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-xorshift over 8-byte words, with murmur3's finalizer.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl FastHasher {
    fn add(&mut self, w: u64) {
        let h = (self.0 ^ w).wrapping_mul(K);
        self.0 = h ^ (h >> 29);
    }
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        fmix64(self.0)
    }
}

pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn distinct_keys_spread() {
        let b = BuildHasherDefault::<FastHasher>::default();
        let h = |s: &str| b.hash_one(s);
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            assert!(seen.insert(h(&format!("container/{i:064x}"))));
        }
        assert_ne!(h("a"), h("b"));
        let mut m: FastMap<String, u32> = FastMap::default();
        m.insert("x".into(), 1);
        assert_eq!(m.get("x"), Some(&1));
    }
}
