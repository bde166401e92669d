//! Memory protection up the cgroup tree: an ancestor protects its children
//! only up to its own memory.min/low.

use super::*;

/// The ancestors whose memory.min/low qoslet sets: each pod's QoS dir and the
/// one above it.
pub fn protected_ancestors(state: &NodeState) -> BTreeSet<CgroupPath> {
    let mut out = BTreeSet::new();
    for p in &state.pods {
        let mut up = p.cgroup.parent();
        for _ in 0..2 {
            match up {
                Some(a) if !a.as_str().is_empty() => {
                    up = a.parent();
                    out.insert(a);
                }
                _ => break,
            }
        }
    }
    out
}

/// A cgroup's memory.min/low protects it only up to what its ancestors
/// protect: the QoS dir above each pod (`kubepods/burstable`) and the one
/// above that (`kubepods`) get the sum of their pods' protections, or what
/// something else asks there (`external`: kubelet's MemoryQoS writes its
/// own every minute) when that is more: the higher value wins, so the two
/// never take turns overwriting each other.
pub(super) fn memory_protection_up_the_tree(
    state: &NodeState,
    plan: &mut Plan,
    external: &Protection,
) {
    // the managed ancestors (each pod's QoS dir and the one above), deepest first
    let ancestors = protected_ancestors(state);
    let mut order: Vec<&CgroupPath> = ancestors.iter().collect();
    order.sort_by_key(|c| {
        std::cmp::Reverse(c.as_str().split('/').filter(|s| !s.is_empty()).count())
    });
    for name in [KnobKind::MemoryMin, KnobKind::MemoryLow] {
        // what each ancestor's direct children claim: its pods' planned values, and
        // (from the deeper level, below) its child QoS dirs' final values
        let mut claims: BTreeMap<&CgroupPath, u64> = BTreeMap::new();
        for p in &state.pods {
            let v = match plan.get(&(p.cgroup.clone(), name, None)).map(|w| &w.knob) {
                Some(Knob::MemoryMin(v)) | Some(Knob::MemoryLow(v)) => *v,
                _ => continue,
            };
            if let Some(a) = p.cgroup.parent().and_then(|a| ancestors.get(&a)) {
                let e = claims.entry(a).or_default();
                *e = e.saturating_add(v);
            }
        }
        for a in &order {
            let sum = claims.get(a).copied().unwrap_or(0);
            let theirs = external.get(&((*a).clone(), name)).copied().unwrap_or(0);
            if sum == 0 && theirs == 0 {
                continue;
            }
            if theirs == u64::MAX {
                // "max" set by another writer: full protection, left as it is
                if let Some(up) = a.parent().and_then(|u| ancestors.get(&u)) {
                    let e = claims.entry(up).or_default();
                    *e = e.saturating_add(sum);
                }
                continue;
            }
            let v = sum.max(theirs);
            // a parent protects its children only up to its own value: it claims
            // what its children finally got, another writer's value included (so
            // kubelet's value on a QoS dir is not shared out with BE's on kubepods)
            if let Some(up) = a.parent().and_then(|u| ancestors.get(&u)) {
                let e = claims.entry(up).or_default();
                *e = e.saturating_add(v);
            }
            let what = name.name().replace('-', ".");
            let rule = if theirs > sum {
                format!("{theirs} set there by another writer (kubelet's MemoryQoS) is above what its children claim ({sum}): kept")
            } else {
                format!("what its children claim: their {what} (a child is protected only up to its parent's)")
            };
            let knob = if name == KnobKind::MemoryMin {
                Knob::MemoryMin(v)
            } else {
                Knob::MemoryLow(v)
            };
            plan.add(w(a, knob, Plugin::MemoryQos, rule));
        }
    }
}
