//! What the eviction loop reads from the kernel, directly (not from the
//! metrics tick: a wake-up from the kernel reads the scope's files at once).
//!
//! - `memory.available`: capacity (`eviction.memoryCapacity`, else MemTotal)
//!   − the working set (usage − inactive file) of the scope cgroup
//!   (`eviction.cgroupScope`, else the root: on v2, MemTotal − MemAvailable);
//! - `allocatableMemory.available`: the pods' root cgroup (`kubepods`): its
//!   memory limit (else the capacity) − its working set;
//! - `pid.available`: `kernel.pid_max` − the tasks `/proc/loadavg` counts;
//! - `nodefs.*` / `imagefs.*`: statvfs of kubelet's and the runtime's root dirs.
//!
//! Per pod: its cgroup's working set, anonymous memory and process count.
//! Nothing here writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use qoslet_cgroups::{CgroupPath, Host};
use qoslet_eviction::kubelet::{Observation, Observations};
use qoslet_eviction::Signal;
use qoslet_metrics::parse;

/// The memory of a cgroup, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgMemory {
    pub usage: i64,
    pub working_set: i64,
    pub inactive_file: i64,
    /// Anonymous memory as koordlet counts a pod's (the anon LRU lists, which
    /// hold shmem and tmpfs too, plus unevictable: v1 `total_active_anon +
    /// total_inactive_anon + total_unevictable`, v2 `active_anon +
    /// inactive_anon + unevictable`).
    pub anon: i64,
    /// The cgroup's memory limit (`None`: unlimited).
    pub limit: Option<i64>,
}

/// Where the observer reads.
#[derive(Debug, Clone)]
pub struct Sources {
    pub host: Host,
    pub proc_root: PathBuf,
    /// The cgroup whose pods make up the node (`None`: the root).
    pub scope: Option<CgroupPath>,
    /// The pods' root cgroup (kubepods).
    pub pods_root: CgroupPath,
    /// Replaces the node's memory size.
    pub memory_capacity: Option<i64>,
    pub nodefs: Option<PathBuf>,
    pub imagefs: Option<PathBuf>,
    /// kubelet's pod logs (`/var/log/pods`): a pod's logs for disk ranking.
    pub pod_logs: Option<PathBuf>,
}

/// Why a reading failed (logged once per kind by the loop).
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unexpected content")]
    Parse { path: PathBuf },
    #[error("cgroup {0}: not a safe path")]
    Path(String),
    #[error("no memory hierarchy on this host")]
    NoMemory,
}

fn read(path: &Path) -> Result<String, ObserveError> {
    std::fs::read_to_string(path).map_err(|source| ObserveError::Read {
        path: path.into(),
        source,
    })
}

const UNLIMITED: i64 = 1 << 60;

impl Sources {
    /// These sources with `e`'s scope, memory capacity and filesystems (an
    /// `eviction:` section reloaded).
    pub fn reconfigured(&self, e: &qoslet_eviction::Eviction) -> Result<Sources, String> {
        let scope = match e.cgroup_scope.as_deref() {
            None => None,
            Some(s) => {
                Some(CgroupPath::parse(s).map_err(|err| format!("eviction.cgroupScope: {err}"))?)
            }
        };
        Ok(Sources {
            scope,
            memory_capacity: e.memory_capacity,
            nodefs: Some(e.nodefs_path.clone()),
            imagefs: Some(e.imagefs_path.clone()),
            pod_logs: Some(e.pod_logs_path.clone()),
            ..self.clone()
        })
    }

    fn memory_dir(&self, cg: &CgroupPath) -> Result<PathBuf, ObserveError> {
        let base = self
            .host
            .hierarchy("memory")
            .ok_or(ObserveError::NoMemory)?;
        cg.under(base)
            .map_err(|_| ObserveError::Path(cg.as_str().chars().take(128).collect()))
    }

    /// A cgroup's memory (v1 hierarchical totals; v2's files are hierarchical).
    pub fn cgroup_memory(&self, cg: &CgroupPath) -> Result<CgMemory, ObserveError> {
        let dir = self.memory_dir(cg)?;
        let v2 = self.host.is_v2();
        let (usage_f, limit_f) = if v2 {
            ("memory.current", "memory.max")
        } else {
            ("memory.usage_in_bytes", "memory.limit_in_bytes")
        };
        let usage = read(&dir.join(usage_f))?;
        let stat_path = dir.join("memory.stat");
        let stat = read(&stat_path)?;
        let m = parse::memory(&usage, &stat, v2).map_err(|_| ObserveError::Parse {
            path: stat_path.clone(),
        })?;
        let limit = read(&dir.join(limit_f)).ok().and_then(|s| {
            let s = s.trim();
            if s == "max" {
                return None;
            }
            s.parse::<i64>().ok().filter(|v| *v < UNLIMITED)
        });
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let kv = parse::flat_keyed(&stat);
        let p = if v2 { "" } else { "total_" };
        let field = |k: &str| kv.get(format!("{p}{k}").as_str()).copied().unwrap_or(0);
        let anon = field("active_anon")
            .saturating_add(field("inactive_anon"))
            .saturating_add(field("unevictable"));
        Ok(CgMemory {
            usage: clamp(m.usage),
            working_set: clamp(m.working_set),
            inactive_file: clamp(m.usage.saturating_sub(m.working_set)),
            anon: clamp(anon),
            limit,
        })
    }

    /// The machine's memory (MemTotal), which kubelet's `oom_score_adj` of a
    /// Burstable container is relative to (not `memoryCapacity`).
    pub fn machine_memory(&self) -> Option<u64> {
        self.meminfo().ok().map(|m| m.total)
    }

    fn meminfo(&self) -> Result<parse::MemInfo, ObserveError> {
        let path = self.proc_root.join("meminfo");
        parse::meminfo(&read(&path)?).map_err(|_| ObserveError::Parse { path })
    }

    /// The node's memory capacity.
    pub fn capacity(&self) -> Result<i64, ObserveError> {
        match self.memory_capacity {
            Some(c) => Ok(c),
            None => Ok(i64::try_from(self.meminfo()?.total).unwrap_or(i64::MAX)),
        }
    }

    /// `memory.available` with the scope's working set and inactive file
    /// (the memcg notifier's threshold needs both).
    pub fn node_memory(&self) -> Result<(Observation, CgMemory), ObserveError> {
        let capacity = self.capacity()?;
        let m = match &self.scope {
            Some(s) => self.cgroup_memory(s)?,
            None if !self.host.is_v2() => self.cgroup_memory(&CgroupPath::root())?,
            None => {
                // the v2 root has no memory.current: the kernel's own figures
                let mi = self.meminfo()?;
                let used = i64::try_from(mi.total.saturating_sub(mi.available)).unwrap_or(0);
                CgMemory {
                    usage: used,
                    working_set: used,
                    ..Default::default()
                }
            }
        };
        Ok((
            Observation {
                available: capacity - m.working_set,
                capacity,
                at: None,
            },
            m,
        ))
    }

    /// Every signal that can be read here; what cannot is left out (and
    /// its thresholds are not met, as kubelet does without an observation).
    pub fn observe(&self, now: Duration) -> (Observations, Vec<(Signal, ObserveError)>) {
        let mut obs = Observations::new();
        let mut errors = vec![];
        let at = Some(now);
        match self.node_memory() {
            Ok((mut o, _)) => {
                o.at = at;
                obs.insert(Signal::MemoryAvailable, o);
                match self.cgroup_memory(&self.pods_root) {
                    Ok(p) => {
                        let cap = p.limit.unwrap_or(o.capacity).min(o.capacity);
                        obs.insert(
                            Signal::AllocatableMemoryAvailable,
                            Observation {
                                available: cap - p.working_set,
                                capacity: cap,
                                at,
                            },
                        );
                    }
                    Err(e) => errors.push((Signal::AllocatableMemoryAvailable, e)),
                }
            }
            Err(e) => errors.push((Signal::MemoryAvailable, e)),
        }
        match self.pids() {
            Ok(mut o) => {
                o.at = at;
                obs.insert(Signal::PidAvailable, o);
            }
            Err(e) => errors.push((Signal::PidAvailable, e)),
        }
        for (dir, bytes, inodes) in [
            (
                &self.nodefs,
                Signal::NodefsAvailable,
                Signal::NodefsInodesFree,
            ),
            (
                &self.imagefs,
                Signal::ImagefsAvailable,
                Signal::ImagefsInodesFree,
            ),
        ] {
            let Some(dir) = dir else { continue };
            match rustix::fs::statvfs(dir.as_path()) {
                Ok(s) => {
                    let c = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                    obs.insert(
                        bytes,
                        Observation {
                            available: c(s.f_bavail.saturating_mul(s.f_frsize)),
                            capacity: c(s.f_blocks.saturating_mul(s.f_frsize)),
                            at,
                        },
                    );
                    obs.insert(
                        inodes,
                        Observation {
                            available: c(s.f_favail),
                            capacity: c(s.f_files),
                            at,
                        },
                    );
                }
                Err(e) => errors.push((
                    bytes,
                    ObserveError::Read {
                        path: dir.clone(),
                        source: e.into(),
                    },
                )),
            }
        }
        (obs, errors)
    }

    /// `pid.available`: min(pid_max, threads-max) − the scheduling entities
    /// the kernel counts (kubelet's `pidlimit.Stats`).
    fn pids(&self) -> Result<Observation, ObserveError> {
        let number = |rel: &str| -> Result<i64, ObserveError> {
            let path = self.proc_root.join(rel);
            read(&path)?
                .trim()
                .parse()
                .map_err(|_| ObserveError::Parse { path })
        };
        let max = number("sys/kernel/pid_max")?;
        let max = match number("sys/kernel/threads-max") {
            Ok(t) => max.min(t),
            Err(_) => max,
        };
        let la_path = self.proc_root.join("loadavg");
        let la = read(&la_path)?;
        // "0.00 0.01 0.05 1/123 4567": the fourth field is running/total
        let total: i64 = la
            .split_whitespace()
            .nth(3)
            .and_then(|f| f.split_once('/'))
            .and_then(|(_, t)| t.parse().ok())
            .ok_or(ObserveError::Parse { path: la_path })?;
        Ok(Observation {
            available: max - total,
            capacity: max,
            at: None,
        })
    }

    /// Node memory as koordlet reads it: the scope's working set with a scope,
    /// else MemTotal − MemAvailable (`NodeMemoryUsage`), of the capacity.
    pub fn koord_node_memory(&self) -> Result<(i64, i64), ObserveError> {
        let capacity = self.capacity()?;
        let used = match &self.scope {
            Some(s) => self.cgroup_memory(s)?.working_set,
            None => {
                let mi = self.meminfo()?;
                i64::try_from(mi.total.saturating_sub(mi.available)).unwrap_or(0)
            }
        };
        Ok((used, capacity))
    }

    /// The processes (tasks) of a cgroup, from `pids.current` or the task list.
    pub fn cgroup_processes(&self, cg: &CgroupPath) -> Option<u64> {
        let base = self.host.hierarchy("pids")?;
        let dir = cg.under(base).ok()?;
        let s = std::fs::read_to_string(dir.join("pids.current")).ok()?;
        s.trim().parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str, files: &[(&str, &str)]) -> PathBuf {
        qoslet_cgroups::testing::tree(tag, files)
    }

    #[test]
    fn node_memory_from_the_scope_and_the_capacity_override() {
        let root = tree(
            "eviction-observe-1",
            &[
                ("memory/cgroup.procs", ""),
                ("memory/scope/memory.usage_in_bytes", "734003200\n"),
                (
                    "memory/scope/memory.stat",
                    "total_inactive_file 104857600\ntotal_rss 524288000\ntotal_cache 209715200\n",
                ),
                (
                    "memory/scope/memory.limit_in_bytes",
                    "9223372036854771712\n",
                ),
                ("memory/kubepods/memory.usage_in_bytes", "419430400\n"),
                (
                    "memory/kubepods/memory.stat",
                    "total_inactive_file 0\ntotal_rss 419430400\ntotal_cache 0\n",
                ),
                ("memory/kubepods/memory.limit_in_bytes", "1073741824\n"),
                ("cpu/cgroup.procs", ""),
                (
                    "proc/meminfo",
                    "MemTotal: 16384 kB\nMemFree: 1 kB\nMemAvailable: 8192 kB\n",
                ),
                ("proc/sys/kernel/pid_max", "4194304\n"),
                ("proc/sys/kernel/threads-max", "190000\n"),
                ("proc/loadavg", "0.10 0.20 0.30 2/1234 999\n"),
            ],
        );
        let host = Host::detect(&root).unwrap();
        let s = Sources {
            host,
            proc_root: root.join("proc"),
            scope: Some(CgroupPath::parse("scope").unwrap()),
            pods_root: CgroupPath::parse("kubepods").unwrap(),
            memory_capacity: Some(2 << 30),
            nodefs: Some(root.clone()),
            imagefs: None,
            pod_logs: None,
        };
        let (obs, errors) = s.observe(Duration::from_secs(5));
        assert!(errors.is_empty(), "{errors:?}");
        let m = obs[&Signal::MemoryAvailable];
        // 2 GiB − (700 MiB − 100 MiB)
        assert_eq!(
            (m.available, m.capacity),
            ((2 << 30) - (600 << 20), 2 << 30)
        );
        let a = obs[&Signal::AllocatableMemoryAvailable];
        assert_eq!(
            (a.available, a.capacity),
            ((1 << 30) - (400 << 20), 1 << 30)
        );
        let p = obs[&Signal::PidAvailable];
        // the smaller of pid_max and threads-max
        assert_eq!((p.available, p.capacity), (190000 - 1234, 190000));
        assert!(obs[&Signal::NodefsAvailable].capacity > 0);
        assert!(obs.contains_key(&Signal::NodefsInodesFree));
        assert!(!obs.contains_key(&Signal::ImagefsAvailable));
        // without the override: MemTotal
        let s = Sources {
            memory_capacity: None,
            ..s
        };
        assert_eq!(s.capacity().unwrap(), 16384 * 1024);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn what_cannot_be_read_is_left_out_and_said() {
        let root = tree(
            "eviction-observe-2",
            &[("memory/cgroup.procs", ""), ("cpu/cgroup.procs", "")],
        );
        let s = Sources {
            host: Host::detect(&root).unwrap(),
            proc_root: root.join("proc"),
            scope: Some(CgroupPath::parse("nowhere").unwrap()),
            pods_root: CgroupPath::parse("kubepods").unwrap(),
            memory_capacity: None,
            nodefs: Some(root.join("missing")),
            imagefs: None,
            pod_logs: None,
        };
        let (obs, errors) = s.observe(Duration::ZERO);
        assert!(obs.is_empty());
        let signals: Vec<Signal> = errors.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            signals,
            [
                Signal::MemoryAvailable,
                Signal::PidAvailable,
                Signal::NodefsAvailable
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
