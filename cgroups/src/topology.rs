//! The CPU topology as sysfs shows it, under an injected root (`/sys` in
//! production, a kernel-shaped tree in tests): online CPUs, NUMA nodes, and
//! each CPU's core and socket. The one place these files are read (the hooks'
//! node facts, the share pool and the engine's cpuset plugin all use it).
//! What cannot be read is `None` / empty: callers fall back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cgroup::parse_cpu_list;

fn cpus(path: &Path) -> Option<BTreeSet<u32>> {
    parse_cpu_list(std::fs::read_to_string(path).ok()?.trim())
}

/// `devices/system/cpu/online` as read, verbatim (to tell a CPU hotplug).
pub fn online_text(sys_root: &Path) -> Option<String> {
    std::fs::read_to_string(sys_root.join("devices/system/cpu/online")).ok()
}

/// The online CPUs (`None`: unreadable; never an empty set).
pub fn online_cpus(sys_root: &Path) -> Option<BTreeSet<u32>> {
    cpus(&sys_root.join("devices/system/cpu/online")).filter(|c| !c.is_empty())
}

/// Each NUMA node's CPUs (`devices/system/node/node<N>/cpulist`), nodes
/// without CPUs left out; empty: no NUMA information.
pub fn numa_nodes(sys_root: &Path) -> BTreeMap<u32, BTreeSet<u32>> {
    std::fs::read_dir(sys_root.join("devices/system/node"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
            Some((n, cpus(&e.path().join("cpulist"))?))
        })
        .filter(|(_, c)| !c.is_empty())
        .collect()
}

/// The core a CPU is on, named by the lowest CPU of its
/// `thread_siblings_list` (core ids do not name cores across clusters on
/// arm64); `None`: unreadable.
pub fn core_of(sys_root: &Path, cpu: u32) -> Option<u32> {
    cpus(&sys_root.join(format!(
        "devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    )))?
    .into_iter()
    .next()
}

/// The socket a CPU is on (`physical_package_id`); `None`: unreadable.
pub fn socket_of(sys_root: &Path, cpu: u32) -> Option<u32> {
    std::fs::read_to_string(sys_root.join(format!(
        "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
    )))
    .ok()?
    .trim()
    .parse()
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_shaped_tree_reads_as_the_kernel_shows_it() {
        let d = crate::testing::tree(
            "topology",
            &[
                ("devices/system/cpu/online", "0-3\n"),
                ("devices/system/node/node1/cpulist", "2-3\n"),
                ("devices/system/node/node0/cpulist", "0-1\n"),
                ("devices/system/node/node2/cpulist", "\n"),
                (
                    "devices/system/cpu/cpu3/topology/thread_siblings_list",
                    "1,3\n",
                ),
                (
                    "devices/system/cpu/cpu3/topology/physical_package_id",
                    "1\n",
                ),
            ],
        );
        assert_eq!(online_cpus(&d), Some((0..4).collect()));
        let numa = numa_nodes(&d);
        assert_eq!(
            numa.keys().copied().collect::<Vec<_>>(),
            [0, 1],
            "a node without CPUs is left out"
        );
        assert_eq!(numa[&1], [2, 3].into());
        assert_eq!((core_of(&d, 3), socket_of(&d, 3)), (Some(1), Some(1)));
        assert_eq!((core_of(&d, 2), socket_of(&d, 2)), (None, None));
        let none = d.join("none");
        assert_eq!((online_cpus(&none), numa_nodes(&none).len()), (None, 0));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
