//! kubelet's ranking of pods for eviction (`rankMemoryPressure`,
//! `rankPIDPressure`, `rankDiskPressureFunc`), comparator by comparator. A pod
//! with no stats sorts first in every stats comparator; lower priority first;
//! the sort is stable (as Go's is for the sizes its tests use).

use std::cmp::Ordering;

use crate::pod::{FsUse, Pod};
use crate::signal::{Resource, Signal};

/// Which of a pod's filesystems a disk signal measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSet {
    pub root: bool,
    pub logs: bool,
    pub local_volumes: bool,
}

impl FsSet {
    pub const ALL: FsSet = FsSet {
        root: true,
        logs: true,
        local_volumes: true,
    };

    /// kubelet's choice per signal: with a dedicated image filesystem, nodefs
    /// holds logs and local volumes and imagefs the writable layers.
    pub fn for_signal(signal: Signal, dedicated_imagefs: bool) -> FsSet {
        if !dedicated_imagefs {
            return Self::ALL;
        }
        match signal {
            Signal::ImagefsAvailable | Signal::ImagefsInodesFree => FsSet {
                root: true,
                logs: false,
                local_volumes: false,
            },
            _ => FsSet {
                root: false,
                logs: true,
                local_volumes: true,
            },
        }
    }
}

fn disk_use(p: &Pod, fs: FsSet) -> Option<FsUse> {
    let s = p.stats.as_ref()?;
    let mut u = FsUse::default();
    for (on, f) in [
        (fs.root, s.rootfs),
        (fs.logs, s.logs),
        (fs.local_volumes, s.local_volumes),
    ] {
        if on {
            u.bytes += f.bytes;
            u.inodes += f.inodes;
        }
    }
    Some(u)
}

/// `cmpBool`: `true` sorts first.
fn first_if(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// Pods without stats first; `None` when both have them.
fn missing_first(a: &Pod, b: &Pod) -> Option<Ordering> {
    match (a.stats.is_some(), b.stats.is_some()) {
        (true, true) => None,
        (x, y) => Some(first_if(!x, !y)),
    }
}

/// Lower priority first.
pub fn by_priority(a: &Pod, b: &Pod) -> Ordering {
    a.priority_or_zero().cmp(&b.priority_or_zero())
}

fn working_set(p: &Pod) -> i64 {
    p.stats.as_ref().and_then(|s| s.working_set).unwrap_or(0)
}

/// Pods whose working set exceeds their memory request first.
pub fn by_exceeds_memory_request(a: &Pod, b: &Pod) -> Ordering {
    missing_first(a, b).unwrap_or_else(|| {
        first_if(
            working_set(a) > a.requests.memory,
            working_set(b) > b.requests.memory,
        )
    })
}

/// Larger working set above request first.
pub fn by_memory(a: &Pod, b: &Pod) -> Ordering {
    missing_first(a, b).unwrap_or_else(|| {
        let da = working_set(a) - a.requests.memory;
        let db = working_set(b) - b.requests.memory;
        db.cmp(&da)
    })
}

/// More processes first.
pub fn by_processes(a: &Pod, b: &Pod) -> Ordering {
    missing_first(a, b).unwrap_or_else(|| {
        let n = |p: &Pod| p.stats.as_ref().and_then(|s| s.processes).unwrap_or(0);
        n(b).cmp(&n(a))
    })
}

fn disk_amount(u: FsUse, r: Resource) -> i64 {
    if r == Resource::Inodes {
        u.inodes
    } else {
        u.bytes
    }
}

/// Pods using more of the resource than they request first (an inode request
/// is always zero, so any pod with inodes "exceeds", as in kubelet).
pub fn by_exceeds_disk_request(fs: FsSet, r: Resource) -> impl Fn(&Pod, &Pod) -> Ordering {
    move |a, b| {
        missing_first(a, b).unwrap_or_else(|| {
            let req = |p: &Pod| {
                if r == Resource::Inodes {
                    0
                } else {
                    p.requests.ephemeral_storage
                }
            };
            let ex = |p: &Pod| disk_use(p, fs).map(|u| disk_amount(u, r)).unwrap_or(0) > req(p);
            first_if(ex(a), ex(b))
        })
    }
}

/// Larger use above the ephemeral-storage request first (kubelet subtracts
/// the byte request from inode counts too).
pub fn by_disk(fs: FsSet, r: Resource) -> impl Fn(&Pod, &Pod) -> Ordering {
    move |a, b| {
        missing_first(a, b).unwrap_or_else(|| {
            let d = |p: &Pod| {
                disk_use(p, fs).map(|u| disk_amount(u, r)).unwrap_or(0)
                    - p.requests.ephemeral_storage
            };
            d(b).cmp(&d(a))
        })
    }
}

/// Ranks `pods` for a starved signal, most evictable first (a stable sort).
/// `None` for a signal kubelet has no rank function for (none in v1.28).
pub fn rank(signal: Signal, pods: &mut [&Pod], dedicated_imagefs: bool) {
    match signal.resource() {
        Resource::Memory => pods.sort_by(|a, b| {
            by_exceeds_memory_request(a, b)
                .then_with(|| by_priority(a, b))
                .then_with(|| by_memory(a, b))
        }),
        Resource::Pids => pods.sort_by(|a, b| by_priority(a, b).then_with(|| by_processes(a, b))),
        r @ (Resource::EphemeralStorage | Resource::Inodes) => {
            let fs = FsSet::for_signal(signal, dedicated_imagefs);
            let ex = by_exceeds_disk_request(fs, r);
            let disk = by_disk(fs, r);
            pods.sort_by(|a, b| {
                ex(a, b)
                    .then_with(|| by_priority(a, b))
                    .then_with(|| disk(a, b))
            })
        }
    }
}
