//! What a caller wants of a cgroup, whatever the host's layout: a [`Knob`]
//! (a setting and its value), its [`KnobKind`] (the setting alone: the key
//! of plans, protections and the store's applied settings), the v2
//! `memory.*` tunables ([`MemTune`]), and the kernel's file names ([`files`]).
//! [`crate::Cgroups::plan`] turns a knob into this host's files.

use crate::blkio::{Device, IoLimits};
use crate::convert::shares_to_weight;
use crate::cpulist::cpu_count;

/// The group identity file of Anolis / Alibaba Cloud Linux kernels (underscore
/// between `bvt` and `warp`, as koordlet's `CPUBVTWarpNsName`).
pub const BVT_FILE: &str = "cpu.bvt_warp_ns";

/// The kernel's cgroup file names qoslet writes or reads (v1 and v2).
pub mod files {
    pub const CPU_SHARES: &str = "cpu.shares";
    pub const CPU_WEIGHT: &str = "cpu.weight";
    pub const CPU_CFS_QUOTA: &str = "cpu.cfs_quota_us";
    pub const CPU_CFS_PERIOD: &str = "cpu.cfs_period_us";
    pub const CPU_CFS_BURST: &str = "cpu.cfs_burst_us";
    pub const CPU_MAX: &str = "cpu.max";
    pub const CPU_MAX_BURST: &str = "cpu.max.burst";
    pub const CPU_IDLE: &str = "cpu.idle";
    pub const MEMORY_LIMIT: &str = "memory.limit_in_bytes";
    pub const MEMORY_MAX: &str = "memory.max";
    pub const MEMORY_MIN: &str = "memory.min";
    pub const MEMORY_LOW: &str = "memory.low";
    pub const MEMORY_HIGH: &str = "memory.high";
    pub const CPUSET_CPUS: &str = "cpuset.cpus";
    pub const IO_MAX: &str = "io.max";
    pub const BLKIO_READ_BPS: &str = "blkio.throttle.read_bps_device";
    pub const BLKIO_WRITE_BPS: &str = "blkio.throttle.write_bps_device";
    pub const BLKIO_READ_IOPS: &str = "blkio.throttle.read_iops_device";
    pub const BLKIO_WRITE_IOPS: &str = "blkio.throttle.write_iops_device";
    pub const MEMORY_WMARK_RATIO: &str = "memory.wmark_ratio";
    pub const MEMORY_WMARK_SCALE_FACTOR: &str = "memory.wmark_scale_factor";
    pub const MEMORY_WMARK_MIN_ADJ: &str = "memory.wmark_min_adj";
    pub const MEMORY_USE_PRIORITY_OOM: &str = "memory.use_priority_oom";
    pub const MEMORY_PRIORITY: &str = "memory.priority";
    pub const MEMORY_OOM_GROUP: &str = "memory.oom.group";
}

/// The memory files of Anolis / Alibaba Cloud Linux kernels (and, for
/// `memory.oom.group`, of upstream cgroup v2) that memory QoS sets to a
/// class's value, as koordlet's `cgroupResourceSummary` writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemTune {
    /// `memory.wmark_ratio` (0-100; 0: async reclaim off).
    WmarkRatio,
    /// `memory.wmark_scale_factor` (1-1000, per mille).
    WmarkScaleFactor,
    /// `memory.wmark_min_adj` (-25-50).
    WmarkMinAdj,
    /// `memory.use_priority_oom` (0-1).
    UsePriorityOom,
    /// `memory.priority` (0-12).
    Priority,
    /// `memory.oom.group` (0-1: the whole cgroup is OOM-killed together).
    OomGroup,
}

impl MemTune {
    pub const ALL: [MemTune; 6] = [
        MemTune::WmarkRatio,
        MemTune::WmarkScaleFactor,
        MemTune::WmarkMinAdj,
        MemTune::UsePriorityOom,
        MemTune::Priority,
        MemTune::OomGroup,
    ];

    pub fn file(self) -> &'static str {
        match self {
            MemTune::WmarkRatio => files::MEMORY_WMARK_RATIO,
            MemTune::WmarkScaleFactor => files::MEMORY_WMARK_SCALE_FACTOR,
            MemTune::WmarkMinAdj => files::MEMORY_WMARK_MIN_ADJ,
            MemTune::UsePriorityOom => files::MEMORY_USE_PRIORITY_OOM,
            MemTune::Priority => files::MEMORY_PRIORITY,
            MemTune::OomGroup => files::MEMORY_OOM_GROUP,
        }
    }

    /// The kernel's range for the file (koordlet's validators).
    pub fn range(self) -> std::ops::RangeInclusive<i64> {
        match self {
            MemTune::WmarkRatio => 0..=100,
            MemTune::WmarkScaleFactor => 1..=1000,
            MemTune::WmarkMinAdj => -25..=50,
            MemTune::UsePriorityOom | MemTune::OomGroup => 0..=1,
            MemTune::Priority => 0..=12,
        }
    }

    /// What memory QoS turned off writes back (koordlet's `NoneMemoryQOS`).
    pub fn off(self) -> i64 {
        match self {
            MemTune::WmarkScaleFactor => 50,
            _ => 0,
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which [`MemTune`] files this kernel has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemTunes(u8);

impl MemTunes {
    pub fn with(self, t: MemTune) -> Self {
        Self(self.0 | t.bit())
    }

    pub fn has(self, t: MemTune) -> bool {
        self.0 & t.bit() != 0
    }

    pub fn any(self) -> bool {
        self.0 != 0
    }
}

/// A QoS setting, independent of the cgroup version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Knob {
    /// CPU weight as v1 shares (v2 gets the converted cpu.weight).
    CpuShares(u64),
    /// CFS bandwidth: `quota` µs per `period` µs; `None` = unlimited.
    CpuQuota {
        quota: Option<u64>,
        period: u64,
    },
    /// SCHED_IDLE for the whole cgroup (`cpu.idle`).
    CpuIdle(bool),
    /// Anolis group identity (`cpu.bvt_warp_ns`: 2 LS, -1 BE, 0 default).
    GroupIdentity(i64),
    /// CFS burst in µs (`cpu.cfs_burst_us` / `cpu.max.burst`).
    CpuBurst(u64),
    /// Memory limit in bytes; `None` = unlimited.
    MemoryLimit(Option<u64>),
    /// memory.min / memory.low in bytes.
    MemoryMin(u64),
    MemoryLow(u64),
    /// memory.high in bytes; `None` = max.
    MemoryHigh(Option<u64>),
    /// The CPUs a cgroup may run on (`0-3,8`).
    CpusetCpus(String),
    /// Read/write bps and iops limits of one block device (v1 blkio throttle
    /// files, v2 `io.max`); unset limits are removed.
    IoLimit {
        device: Device,
        limits: IoLimits,
    },
    /// One of the memory files memory QoS sets to a class's value.
    MemoryTune(MemTune, i64),
}

/// What a [`Knob`] sets, without its value: the key of a plan, of what the
/// engine forgets and of what isolation records (one cgroup file, or for
/// I/O limits one file per device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KnobKind {
    CpuShares,
    CpuQuota,
    CpuIdle,
    GroupIdentity,
    CpuBurst,
    MemoryLimit,
    MemoryMin,
    MemoryLow,
    MemoryHigh,
    CpusetCpus,
    IoLimit,
    MemoryTune(MemTune),
}

impl KnobKind {
    /// A short name for logs, errors and the plan (`cpu-quota`, `memory-min`).
    pub fn name(self) -> &'static str {
        match self {
            KnobKind::CpuShares => "cpu-shares",
            KnobKind::CpuQuota => "cpu-quota",
            KnobKind::CpuIdle => "cpu-idle",
            KnobKind::GroupIdentity => "group-identity",
            KnobKind::CpuBurst => "cpu-burst",
            KnobKind::MemoryLimit => "memory-limit",
            KnobKind::MemoryMin => "memory-min",
            KnobKind::MemoryLow => "memory-low",
            KnobKind::MemoryHigh => "memory-high",
            KnobKind::CpusetCpus => "cpuset-cpus",
            KnobKind::IoLimit => "io-limit",
            KnobKind::MemoryTune(t) => match t {
                MemTune::WmarkRatio => "memory-wmark-ratio",
                MemTune::WmarkScaleFactor => "memory-wmark-scale-factor",
                MemTune::WmarkMinAdj => "memory-wmark-min-adj",
                MemTune::UsePriorityOom => "memory-use-priority-oom",
                MemTune::Priority => "memory-priority",
                MemTune::OomGroup => "memory-oom-group",
            },
        }
    }
}

impl std::fmt::Display for KnobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Knob {
    /// What it sets.
    pub fn kind(&self) -> KnobKind {
        match self {
            Knob::CpuShares(_) => KnobKind::CpuShares,
            Knob::CpuQuota { .. } => KnobKind::CpuQuota,
            Knob::CpuIdle(_) => KnobKind::CpuIdle,
            Knob::GroupIdentity(_) => KnobKind::GroupIdentity,
            Knob::CpuBurst(_) => KnobKind::CpuBurst,
            Knob::MemoryLimit(_) => KnobKind::MemoryLimit,
            Knob::MemoryMin(_) => KnobKind::MemoryMin,
            Knob::MemoryLow(_) => KnobKind::MemoryLow,
            Knob::MemoryHigh(_) => KnobKind::MemoryHigh,
            Knob::CpusetCpus(_) => KnobKind::CpusetCpus,
            Knob::IoLimit { .. } => KnobKind::IoLimit,
            Knob::MemoryTune(t, _) => KnobKind::MemoryTune(*t),
        }
    }

    /// A short name for logs and errors (its kind's).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The setting as this layout's kernel names it, and its value there, for
    /// records and `explain`: `cpu.cfs_quota_us` = `50000` on v1, `cpu.max` =
    /// `50000 100000` on v2; a per-device I/O limit is named with its device.
    /// Pure: values as decided (the executor's plan rounds memory to pages).
    pub fn describe(&self, v2: bool) -> (String, String) {
        let bytes = |v: Option<u64>, unlimited: &str| {
            v.map(|b| b.to_string())
                .unwrap_or_else(|| unlimited.to_string())
        };
        let (name, value): (&str, String) = match self {
            Knob::CpuShares(s) if v2 => (files::CPU_WEIGHT, shares_to_weight(*s).to_string()),
            Knob::CpuShares(s) => (files::CPU_SHARES, s.to_string()),
            Knob::CpuQuota { quota, period } if v2 => {
                (files::CPU_MAX, format!("{} {period}", bytes(*quota, "max")))
            }
            Knob::CpuQuota { quota, .. } => (files::CPU_CFS_QUOTA, bytes(*quota, "-1")),
            Knob::CpuIdle(on) => (files::CPU_IDLE, u8::from(*on).to_string()),
            Knob::GroupIdentity(v) => (BVT_FILE, v.to_string()),
            Knob::CpuBurst(b) if v2 => (files::CPU_MAX_BURST, b.to_string()),
            Knob::CpuBurst(b) => (files::CPU_CFS_BURST, b.to_string()),
            Knob::MemoryLimit(v) if v2 => (files::MEMORY_MAX, bytes(*v, "max")),
            Knob::MemoryLimit(v) => (files::MEMORY_LIMIT, bytes(*v, "-1")),
            Knob::MemoryMin(b) => (files::MEMORY_MIN, b.to_string()),
            Knob::MemoryLow(b) => (files::MEMORY_LOW, b.to_string()),
            Knob::MemoryHigh(v) => (files::MEMORY_HIGH, bytes(*v, "max")),
            Knob::CpusetCpus(s) => (files::CPUSET_CPUS, s.clone()),
            Knob::MemoryTune(t, v) => (t.file(), v.to_string()),
            Knob::IoLimit { device, limits: l } => {
                let m = |v: Option<u64>| bytes(v, "max");
                let value = format!(
                    "rbps={} wbps={} riops={} wiops={}",
                    m(l.read_bps),
                    m(l.write_bps),
                    m(l.read_iops),
                    m(l.write_iops)
                );
                let file = if v2 { files::IO_MAX } else { "blkio.throttle" };
                return (format!("{file} {device}"), value);
            }
        };
        (name.to_string(), value)
    }

    /// The stricter of two values of the same knob kind, for merging what
    /// several rules want of one file (I/O limits: field by field; a CPU
    /// quota compared as cores; unlimited is the loosest). Knobs of different
    /// kinds are never merged: `self` is returned.
    pub fn strictest(&self, other: &Knob) -> Knob {
        use Knob::*;
        let lim = |v: &Option<u64>| v.unwrap_or(u64::MAX);
        let min_opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, None) => x,
            (None, y) => y,
        };
        let pick_self = match (self, other) {
            (CpuShares(x), CpuShares(y)) => x <= y,
            (
                CpuQuota {
                    quota: qa,
                    period: pa,
                },
                CpuQuota {
                    quota: qb,
                    period: pb,
                },
            ) => {
                let ca = qa.map_or(f64::INFINITY, |q| q as f64 / (*pa).max(1) as f64);
                let cb = qb.map_or(f64::INFINITY, |q| q as f64 / (*pb).max(1) as f64);
                ca <= cb
            }
            (CpuIdle(x), CpuIdle(y)) => *x || !*y,
            (GroupIdentity(x), GroupIdentity(y)) => x <= y,
            (CpuBurst(x), CpuBurst(y)) => x <= y,
            (MemoryLimit(x), MemoryLimit(y)) | (MemoryHigh(x), MemoryHigh(y)) => lim(x) <= lim(y),
            (MemoryMin(x), MemoryMin(y)) | (MemoryLow(x), MemoryLow(y)) => x >= y,
            (CpusetCpus(x), CpusetCpus(y)) => cpu_count(x) <= cpu_count(y),
            (IoLimit { device, limits: la }, IoLimit { limits: lb, .. }) => {
                return IoLimit {
                    device: *device,
                    limits: IoLimits {
                        read_bps: min_opt(la.read_bps, lb.read_bps),
                        write_bps: min_opt(la.write_bps, lb.write_bps),
                        read_iops: min_opt(la.read_iops, lb.read_iops),
                        write_iops: min_opt(la.write_iops, lb.write_iops),
                    },
                }
            }
            _ => true,
        };
        if pick_self {
            self.clone()
        } else {
            other.clone()
        }
    }

    /// The value this setting goes back to when nothing plans it any more,
    /// where the kernel has a default (what koordlet writes back when a feature
    /// is turned off); `None` for settings the runtime owns (shares, quota,
    /// limits, cpusets) and for a value already at its default.
    pub fn kernel_default(&self) -> Option<Knob> {
        Some(match self {
            Knob::GroupIdentity(v) if *v != 0 => Knob::GroupIdentity(0),
            Knob::CpuIdle(true) => Knob::CpuIdle(false),
            Knob::CpuBurst(b) if *b != 0 => Knob::CpuBurst(0),
            Knob::MemoryMin(v) if *v != 0 => Knob::MemoryMin(0),
            Knob::MemoryLow(v) if *v != 0 => Knob::MemoryLow(0),
            Knob::MemoryHigh(Some(_)) => Knob::MemoryHigh(None),
            Knob::IoLimit { device, limits } if *limits != IoLimits::default() => Knob::IoLimit {
                device: *device,
                limits: IoLimits::default(),
            },
            Knob::MemoryTune(t, v) if *v != t.off() => Knob::MemoryTune(*t, t.off()),
            _ => return None,
        })
    }

    /// A number to compare sizes of the same knob (for ordering); `u64::MAX` = unlimited.
    pub(crate) fn magnitude(&self) -> Option<u64> {
        match self {
            Knob::CpuQuota { quota, .. } => Some(quota.unwrap_or(u64::MAX)),
            Knob::MemoryLimit(v) | Knob::MemoryHigh(v) => Some(v.unwrap_or(u64::MAX)),
            Knob::CpusetCpus(s) => Some(cpu_count(s)),
            _ => None,
        }
    }
}
