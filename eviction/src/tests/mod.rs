//! Table tests. The kubelet cases are kubelet's own (v1.28
//! `pkg/kubelet/eviction/helpers_test.go` and `eviction_manager_test.go`),
//! the Koordinator cases koordlet's (`memoryevict`, `cpuevict` tests): their
//! inputs and expected results transcribed as data.

mod koord;
mod kubelet_rank;
mod kubelet_scenarios;
mod kubelet_thresholds;

use crate::pod::{FsUse, Pod, PodStats, Requests};

pub(crate) const MI: i64 = 1 << 20;
pub(crate) const GI: i64 = 1 << 30;

/// A pod as kubelet's tests' `newPod`: uid = name, the given priority.
pub(crate) fn pod(name: &str, priority: i32) -> Pod {
    Pod {
        uid: name.into(),
        namespace: "ns".into(),
        name: name.into(),
        priority: Some(priority),
        ..Default::default()
    }
}

/// With a memory request and a pod working set (`newPodMemoryStats`).
pub(crate) fn mem_pod(name: &str, priority: i32, request: i64, working_set: i64) -> Pod {
    Pod {
        requests: Requests {
            memory: request,
            ..Default::default()
        },
        stats: Some(PodStats {
            working_set: Some(working_set),
            ..Default::default()
        }),
        ..pod(name, priority)
    }
}

/// With an ephemeral-storage request and disk use (`newPodDiskStats`): bytes
/// of the root, logs and local volumes.
pub(crate) fn disk_pod(name: &str, priority: i32, request: i64, fs: [i64; 3]) -> Pod {
    Pod {
        requests: Requests {
            ephemeral_storage: request,
            ..Default::default()
        },
        stats: Some(PodStats {
            rootfs: FsUse {
                bytes: fs[0],
                inodes: 0,
            },
            logs: FsUse {
                bytes: fs[1],
                inodes: 0,
            },
            local_volumes: FsUse {
                bytes: fs[2],
                inodes: 0,
            },
            ..Default::default()
        }),
        ..pod(name, priority)
    }
}

/// With inode use (`newPodInodeStats`).
pub(crate) fn inode_pod(name: &str, priority: i32, fs: [i64; 3]) -> Pod {
    let f = |n| FsUse {
        bytes: 0,
        inodes: n,
    };
    Pod {
        stats: Some(PodStats {
            rootfs: f(fs[0]),
            logs: f(fs[1]),
            local_volumes: f(fs[2]),
            ..Default::default()
        }),
        ..pod(name, priority)
    }
}

pub(crate) fn names(pods: &[&Pod]) -> Vec<String> {
    pods.iter().map(|p| p.name.clone()).collect()
}
