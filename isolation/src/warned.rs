//! Each warning about a pod is logged once while the pod lives: a pod is
//! classified and decided again at each of its lifecycle events (its
//! containers' creates, starts and updates), and a bad label or annotation
//! would otherwise be logged at every one. A host's warnings (a controller
//! this kernel lacks) are logged once for the node.
//!
//! Bounded: the warnings of at most [`MAX_PODS`] pods are remembered (the
//! oldest pod's are forgotten first: it logs again if it is still there), at
//! most [`MAX_PER_POD`] each (beyond that, each is logged).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use qoslet_hooks::Warning;

/// More pods than a node runs (kubelet's default is 110).
pub const MAX_PODS: usize = 4096;
/// More distinct problems than one pod's input has in practice.
pub const MAX_PER_POD: usize = 64;

/// Where the node's own warnings are remembered (no sandbox id has a NUL).
const NODE: &str = "\0node";

#[derive(Debug, Default)]
pub(crate) struct Warned {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    seen: HashMap<String, HashSet<Warning>>,
    /// The pods of `seen`, oldest first.
    order: VecDeque<String>,
}

impl Warned {
    /// Whether `w` about pod `pod_id` is to be logged (not logged yet while
    /// the pod's warnings are remembered). A pod without an id (one the
    /// store does not have yet) is not remembered.
    pub fn first(&self, pod_id: &str, w: &Warning) -> bool {
        let key = if w.is_host() { NODE } else { pod_id };
        if key.is_empty() {
            return true;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { seen, order } = &mut *g;
        if !seen.contains_key(key) {
            if order.len() >= MAX_PODS {
                if let Some(old) = order.pop_front() {
                    seen.remove(&old);
                }
            }
            order.push_back(key.to_string());
            seen.insert(key.to_string(), HashSet::new());
        }
        let set = seen.get_mut(key).expect("inserted above");
        if set.contains(w) {
            return false;
        }
        if set.len() < MAX_PER_POD {
            set.insert(w.clone());
        }
        true
    }

    /// Forgets a pod's warnings (it is gone).
    pub fn forget(&self, pod_id: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.seen.remove(pod_id).is_some() {
            g.order.retain(|p| p != pod_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(v: &str) -> Warning {
        Warning::UnknownClass { value: v.into() }
    }

    #[test]
    fn once_per_pod_and_warning_the_host_once_per_node() {
        let w = Warned::default();
        assert!(w.first("p1", &unknown("GOLD")));
        assert!(!w.first("p1", &unknown("GOLD")));
        assert!(
            w.first("p1", &unknown("SILVER")),
            "another value is another warning"
        );
        assert!(w.first("p2", &unknown("GOLD")), "another pod");
        assert!(w.first("p1", &Warning::NoBlkio));
        assert!(!w.first("p2", &Warning::NoBlkio), "the host's, once");
        assert!(
            w.first("", &unknown("GOLD")) && w.first("", &unknown("GOLD")),
            "no id: not remembered"
        );
        w.forget("p1");
        assert!(
            w.first("p1", &unknown("GOLD")),
            "a pod forgotten logs again"
        );
    }

    #[test]
    fn bounded_in_pods_and_per_pod() {
        let w = Warned::default();
        for i in 0..MAX_PODS + 10 {
            w.first(&format!("p{i}"), &unknown("X"));
        }
        {
            let g = w.inner.lock().unwrap();
            assert_eq!((g.seen.len(), g.order.len()), (MAX_PODS, MAX_PODS));
        }
        assert!(w.first("p0", &unknown("X")), "the oldest was forgotten");
        assert!(!w.first(&format!("p{}", MAX_PODS + 9), &unknown("X")));
        for i in 0..MAX_PER_POD + 5 {
            w.first("many", &unknown(&i.to_string()));
        }
        let g = w.inner.lock().unwrap();
        assert_eq!(g.seen["many"].len(), MAX_PER_POD);
    }
}
