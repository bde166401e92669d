//! What this host has: the cgroup layout (v1 or v2) under an injected root,
//! and which QoS files its kernel offers. Nothing is assumed from the kernel
//! version: files are probed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::CgroupError;

/// The cgroup filesystem layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1: one hierarchy per controller (`cpu`, `memory`, `blkio`, ...),
    /// each a directory under the root (possibly a symlink such as `cpu -> cpu,cpuacct`).
    V1 {
        controllers: BTreeMap<String, PathBuf>,
    },
    /// cgroup v2: one unified hierarchy at the root, with these controllers enabled.
    V2 {
        root: PathBuf,
        controllers: Vec<String>,
    },
}

/// QoS files this kernel offers (probed, not guessed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// `cpu.bvt_warp_ns` (Anolis/Alibaba Cloud Linux group identity).
    pub bvt: bool,
    /// `cpu.idle` (SCHED_IDLE for a whole cgroup, Linux >= 5.15).
    pub cpu_idle: bool,
    /// `cpu.cfs_burst_us` (v1) / `cpu.max.burst` (v2).
    pub cpu_burst: bool,
    /// `memory.min` / `memory.low` / `memory.high` (v2, or v1 on Alibaba kernels).
    pub memory_qos: bool,
    /// blkio throttle files (v1) / `io.max` (v2).
    pub blkio_throttle: bool,
    /// The memory files memory QoS tunes (wmark, priority, OOM group) this kernel has.
    pub memory_tunes: crate::cgroup::MemTunes,
}

/// The host's cgroup view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub root: PathBuf,
    pub layout: Layout,
    pub features: Features,
    /// Every hierarchy is a real cgroup filesystem (statfs magic, checked once at
    /// detection); false for the kernel-shaped file trees tests use.
    pub cgroupfs: bool,
}

/// `CGROUP_SUPER_MAGIC`, `CGROUP2_SUPER_MAGIC` (linux/magic.h).
const CGROUP_MAGICS: [u64; 2] = [0x0027_e0eb, 0x6367_7270];

/// Whether `dir` lies on a cgroup filesystem.
pub fn is_cgroupfs(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| CGROUP_MAGICS.contains(&(s.f_type as u64)))
}

const V1_CONTROLLERS: &[&str] = &[
    "cpu", "cpuacct", "cpuset", "memory", "blkio", "pids", "hugetlb", "freezer", "devices",
];

impl Host {
    /// Detects the layout and features under `root` (`/sys/fs/cgroup` in production).
    pub fn detect(root: &Path) -> Result<Self, CgroupError> {
        let layout = detect_layout(root)?;
        let features = probe_features(&layout);
        let dirs: Vec<&Path> = match &layout {
            Layout::V1 { controllers } => controllers.values().map(PathBuf::as_path).collect(),
            Layout::V2 { root, .. } => vec![root.as_path()],
        };
        let cgroupfs = dirs.iter().all(|d| is_cgroupfs(d));
        if cgroupfs {
            tracing::info!(root = %root.display(), ?layout, ?features, "cgroup host detected");
        } else {
            tracing::warn!(root = %root.display(), ?layout, ?features, "cgroup layout detected on a filesystem that is not cgroupfs (a test tree?)");
        }
        Ok(Self {
            root: root.into(),
            layout,
            features,
            cgroupfs,
        })
    }

    pub fn is_v2(&self) -> bool {
        matches!(self.layout, Layout::V2 { .. })
    }

    /// The directory of `controller`'s hierarchy (v1), or the unified root (v2).
    pub fn hierarchy(&self, controller: &str) -> Option<&Path> {
        match &self.layout {
            Layout::V1 { controllers } => controllers.get(controller).map(PathBuf::as_path),
            Layout::V2 { root, .. } => Some(root),
        }
    }
}

fn detect_layout(root: &Path) -> Result<Layout, CgroupError> {
    let controllers_file = root.join("cgroup.controllers");
    if controllers_file.is_file() {
        let controllers = crate::fs::read(&controllers_file)?
            .split_whitespace()
            .map(String::from)
            .collect();
        return Ok(Layout::V2 {
            root: root.into(),
            controllers,
        });
    }
    let mut controllers = BTreeMap::new();
    for c in V1_CONTROLLERS {
        let d = root.join(c);
        // the root is trusted: follow the kernel's own `cpu -> cpu,cpuacct` links here
        if d.join("cgroup.procs").exists() {
            controllers.insert(c.to_string(), d.canonicalize().unwrap_or(d));
        }
    }
    if controllers.is_empty() {
        return Err(CgroupError::NoCgroupFs { root: root.into() });
    }
    Ok(Layout::V1 { controllers })
}

/// Whether `file` exists in `dir` or in any direct child cgroup of it (some
/// files, such as v2's `cpu.idle`, exist only below the root).
fn offered(dir: &Path, file: &str) -> bool {
    if dir.join(file).exists() {
        return true;
    }
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .any(|e| e.path().join(file).exists())
        })
        .unwrap_or(false)
}

/// The memory-tune files `has` finds.
fn tunes(has: impl Fn(&str) -> bool) -> crate::cgroup::MemTunes {
    crate::cgroup::MemTune::ALL
        .into_iter()
        .filter(|t| has(t.file()))
        .fold(Default::default(), |s, t| s.with(t))
}

fn probe_features(layout: &Layout) -> Features {
    match layout {
        Layout::V1 { controllers } => {
            let cpu = controllers.get("cpu");
            let mem = controllers.get("memory");
            let has = |d: Option<&PathBuf>, f: &str| d.is_some_and(|d| offered(d, f));
            Features {
                bvt: has(cpu, crate::cgroup::BVT_FILE),
                cpu_idle: has(cpu, "cpu.idle"),
                cpu_burst: has(cpu, "cpu.cfs_burst_us"),
                memory_qos: has(mem, "memory.min")
                    && has(mem, "memory.low")
                    && has(mem, "memory.high"),
                blkio_throttle: has(controllers.get("blkio"), "blkio.throttle.read_bps_device"),
                memory_tunes: tunes(|f| has(mem, f)),
            }
        }
        Layout::V2 { root, controllers } => {
            let on = |c: &str| controllers.iter().any(|x| x == c);
            Features {
                bvt: offered(root, crate::cgroup::BVT_FILE),
                cpu_idle: on("cpu") && offered(root, "cpu.idle"),
                cpu_burst: on("cpu") && offered(root, "cpu.max.burst"),
                memory_qos: on("memory"),
                blkio_throttle: on("io"),
                memory_tunes: tunes(|f| on("memory") && offered(root, f)),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a kernel-shaped tree: `files` are (relative path, content).
    pub(crate) fn tree(tag: &str, files: &[(&str, &str)]) -> PathBuf {
        crate::testing::tree(&format!("tree-{tag}"), files)
    }

    #[test]
    fn v1_tree_as_on_upstream_kernels() {
        let d = tree(
            "v1",
            &[
                ("cpu/cgroup.procs", ""),
                ("cpu/cpu.shares", "1024\n"),
                ("cpu/cpu.idle", "0\n"),
                ("cpu/cpu.cfs_burst_us", "0\n"),
                ("memory/cgroup.procs", ""),
                ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
                ("blkio/cgroup.procs", ""),
                ("blkio/blkio.throttle.read_bps_device", ""),
            ],
        );
        let h = Host::detect(&d).unwrap();
        assert!(!h.is_v2());
        assert_eq!(
            h.features,
            Features {
                bvt: false,
                cpu_idle: true,
                cpu_burst: true,
                memory_qos: false,
                blkio_throttle: true,
                memory_tunes: Default::default(),
            }
        );
        assert!(h.hierarchy("cpu").unwrap().ends_with("cpu"));
        assert!(h.hierarchy("cpuset").is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn v1_tree_as_on_anolis_with_bvt_and_memory_qos() {
        let d = tree(
            "anolis",
            &[
                ("cpu,cpuacct/cgroup.procs", ""),
                ("cpu,cpuacct/cpu.bvt_warp_ns", "0\n"),
                ("memory/cgroup.procs", ""),
                ("memory/kubepods/memory.min", "0\n"),
                ("memory/kubepods/memory.low", "0\n"),
                ("memory/kubepods/memory.high", "max\n"),
                ("memory/kubepods/memory.wmark_ratio", "0\n"),
                ("memory/kubepods/memory.priority", "0\n"),
            ],
        );
        std::os::unix::fs::symlink(d.join("cpu,cpuacct"), d.join("cpu")).unwrap();
        let h = Host::detect(&d).unwrap();
        assert!(h.features.bvt && h.features.memory_qos && !h.features.cpu_idle);
        use crate::cgroup::MemTune;
        let t = h.features.memory_tunes;
        assert!(t.has(MemTune::WmarkRatio) && t.has(MemTune::Priority));
        assert!(!t.has(MemTune::OomGroup) && !t.has(MemTune::WmarkMinAdj));
        assert!(
            h.hierarchy("cpu").unwrap().ends_with("cpu,cpuacct"),
            "kernel's own link followed"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn v2_tree() {
        let d = tree(
            "v2",
            &[
                ("cgroup.controllers", "cpuset cpu io memory hugetlb pids\n"),
                ("cgroup.subtree_control", "cpu io memory pids\n"),
                ("kubepods.slice/cpu.idle", "0\n"),
                ("kubepods.slice/cpu.max.burst", "0\n"),
                ("kubepods.slice/memory.min", "0\n"),
            ],
        );
        let h = Host::detect(&d).unwrap();
        assert!(h.is_v2());
        assert_eq!(
            h.features,
            Features {
                bvt: false,
                cpu_idle: true,
                cpu_burst: true,
                memory_qos: true,
                blkio_throttle: true,
                memory_tunes: Default::default(),
            }
        );
        assert_eq!(h.hierarchy("memory").unwrap(), d.as_path());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn nothing_there() {
        let d = tree("none", &[("README", "")]);
        assert!(matches!(
            Host::detect(&d),
            Err(CgroupError::NoCgroupFs { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// This machine (root, CI): cgroup v1 with cpu.idle and cpu.cfs_burst_us, no bvt.
    #[test]
    fn real_host_is_detected() {
        let Some(c) = crate::real_v1_host("real_host_is_detected") else {
            return;
        };
        let h = c.host().clone();
        match &h.layout {
            Layout::V1 { controllers } => {
                assert!(controllers.contains_key("cpu") && controllers.contains_key("memory"));
                assert!(h.features.cpu_idle, "{:?}", h.features);
            }
            Layout::V2 { .. } => assert!(Path::new("/sys/fs/cgroup/cgroup.controllers").exists()),
        }
        assert!(h.cgroupfs, "the real hierarchies carry the cgroupfs magic");
        assert!(!is_cgroupfs(&std::env::temp_dir()));
    }
}
