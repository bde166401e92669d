//! The hasher of the per-tick maps keyed by entity names (`container/<64
//! hex>`): foldhash's fast hasher (seeded per process), not std's SipHash,
//! which over 74-byte keys thousands of times a second showed in the agent's
//! CPU profile. The keys come from the store (kubelet's and the runtime's
//! ids), not from pod authors choosing collisions.

pub type FastState = foldhash::fast::RandomState;

pub type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;
