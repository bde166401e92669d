//! A seeded generator for the randomized tests of every crate that parses
//! untrusted bytes (the HPACK judge here, gRPC framing and CRI decoding in the
//! proxy): deterministic, so a failing case names its seed. Not for anything
//! that needs real randomness.

/// xorshift64*: small, seeded, good enough to drive a fuzzer.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `v` with a few random edits: flipped bits, a cut, a length byte blown up.
    pub fn mutate(&mut self, v: &[u8]) -> Vec<u8> {
        let mut v = v.to_vec();
        for _ in 0..1 + self.below(4) {
            if v.is_empty() {
                break;
            }
            match self.below(4) {
                0 => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 => {
                    let n = self.below(v.len());
                    v.truncate(n)
                }
                2 => {
                    let i = self.below(v.len());
                    v[i] = 0xff;
                }
                _ => {
                    let i = self.below(v.len() + 1);
                    let n = self.below(16);
                    let junk = self.bytes(n);
                    v.splice(i..i, junk);
                }
            }
        }
        v
    }
}
