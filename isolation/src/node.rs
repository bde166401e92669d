//! The node's facts read once at start: online CPUs, memory, NUMA layout and
//! the CPUs reserved for the system.

use qoslet_hooks::decide::NodeFacts;
use tracing::warn;

/// The node's online CPUs, memory and reserved CPUs, read once at start
/// (`sys_root`/`proc_root`: `/sys` and `/proc` in production). What cannot be
/// read is left unknown, with a warning: then no annotation's cpuset is
/// honoured and batch resources are not capped by capacity.
pub fn node_facts(
    sys_root: &std::path::Path,
    proc_root: &std::path::Path,
    reserved: Option<&str>,
) -> NodeFacts {
    use qoslet_cgroups::cgroup::parse_cpu_list;
    use qoslet_cgroups::topology;
    let online = topology::online_cpus(sys_root).unwrap_or_else(|| {
        warn!(sys = %sys_root.display(), "online CPUs unknown; cpuset annotations will not be honoured");
        Default::default()
    });
    let memory = std::fs::read_to_string(proc_root.join("meminfo"))
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024))
        .unwrap_or(0);
    // the NUMA layout, for pods the scheduler allocated on NUMA nodes
    let numa = topology::numa_nodes(sys_root);
    NodeFacts {
        milli_cpus: online.len() as u64 * 1000,
        online_cpus: online,
        reserved_cpus: reserved.and_then(parse_cpu_list).unwrap_or_default(),
        memory_bytes: memory,
        numa,
    }
}
