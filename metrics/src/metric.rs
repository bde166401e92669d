//! What is measured: one [`Metric`] per kind of series, with its unit,
//! the resolution it is stored at and its help text.

/// A kind of series. Rates are per second over the collection interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Metric {
    /// CPU used, in cores.
    CpuUsage = 0,
    /// Share of CFS periods that were throttled (0-1).
    CpuThrottledRatio,
    /// Seconds throttled per second.
    CpuThrottledTime,
    /// Memory charged to the cgroup, bytes (page cache included).
    MemoryUsage,
    /// Usage minus inactive file cache, bytes (what kubelet evicts on).
    MemoryWorkingSet,
    /// Anonymous memory, bytes.
    MemoryRss,
    /// Page cache, bytes.
    MemoryCache,
    /// OOM kills since the cgroup was created.
    OomKills,
    /// Bytes read per second (all devices).
    IoReadBytes,
    IoWriteBytes,
    /// Read operations per second (all devices).
    IoReadOps,
    IoWriteOps,
    /// Share of time some/all tasks stalled (PSI), 0-1.
    PsiCpuSome,
    PsiMemorySome,
    PsiMemoryFull,
    PsiIoSome,
    PsiIoFull,
    /// Node: online CPUs.
    CpuCapacity,
    /// Node: MemTotal, bytes.
    MemoryTotal,
    /// Node: MemAvailable, bytes.
    MemoryAvailable,
    /// Node: load averages.
    Load1,
    Load5,
    Load15,
}

impl Metric {
    pub const ALL: [Metric; 23] = [
        Metric::CpuUsage,
        Metric::CpuThrottledRatio,
        Metric::CpuThrottledTime,
        Metric::MemoryUsage,
        Metric::MemoryWorkingSet,
        Metric::MemoryRss,
        Metric::MemoryCache,
        Metric::OomKills,
        Metric::IoReadBytes,
        Metric::IoWriteBytes,
        Metric::IoReadOps,
        Metric::IoWriteOps,
        Metric::PsiCpuSome,
        Metric::PsiMemorySome,
        Metric::PsiMemoryFull,
        Metric::PsiIoSome,
        Metric::PsiIoFull,
        Metric::CpuCapacity,
        Metric::MemoryTotal,
        Metric::MemoryAvailable,
        Metric::Load1,
        Metric::Load5,
        Metric::Load15,
    ];

    /// The series name used in queries (`cpu_usage`, `memory_working_set`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Metric::CpuUsage => "cpu_usage",
            Metric::CpuThrottledRatio => "cpu_throttled_ratio",
            Metric::CpuThrottledTime => "cpu_throttled_time",
            Metric::MemoryUsage => "memory_usage",
            Metric::MemoryWorkingSet => "memory_working_set",
            Metric::MemoryRss => "memory_rss",
            Metric::MemoryCache => "memory_cache",
            Metric::OomKills => "oom_kills",
            Metric::IoReadBytes => "io_read_bytes",
            Metric::IoWriteBytes => "io_write_bytes",
            Metric::IoReadOps => "io_read_ops",
            Metric::IoWriteOps => "io_write_ops",
            Metric::PsiCpuSome => "psi_cpu_some",
            Metric::PsiMemorySome => "psi_memory_some",
            Metric::PsiMemoryFull => "psi_memory_full",
            Metric::PsiIoSome => "psi_io_some",
            Metric::PsiIoFull => "psi_io_full",
            Metric::CpuCapacity => "cpu_capacity",
            Metric::MemoryTotal => "memory_total",
            Metric::MemoryAvailable => "memory_available",
            Metric::Load1 => "load1",
            Metric::Load5 => "load5",
            Metric::Load15 => "load15",
        }
    }

    pub fn from_name(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }

    pub fn from_id(id: u8) -> Option<Metric> {
        Metric::ALL.get(id as usize).copied()
    }

    /// The smallest step stored (see [`crate::codec`]): values below 200 steps
    /// are exact to a step, larger ones to 0.25 %.
    pub fn unit(self) -> f64 {
        match self {
            Metric::CpuUsage | Metric::CpuCapacity => 0.001, // a millicore
            Metric::CpuThrottledRatio
            | Metric::CpuThrottledTime
            | Metric::PsiCpuSome
            | Metric::PsiMemorySome
            | Metric::PsiMemoryFull
            | Metric::PsiIoSome
            | Metric::PsiIoFull => 0.0001,
            Metric::MemoryUsage
            | Metric::MemoryWorkingSet
            | Metric::MemoryRss
            | Metric::MemoryCache
            | Metric::MemoryTotal
            | Metric::MemoryAvailable
            | Metric::IoReadBytes
            | Metric::IoWriteBytes => 1.0,
            Metric::OomKills => 1.0,
            Metric::IoReadOps
            | Metric::IoWriteOps
            | Metric::Load1
            | Metric::Load5
            | Metric::Load15 => 0.01,
        }
    }

    /// Counts stored exactly at every size (the log scale of [`crate::codec`]
    /// would blur the 201st OOM kill into the 200th).
    pub fn exact(self) -> bool {
        matches!(self, Metric::OomKills | Metric::CpuCapacity)
    }

    /// Whether rollups keep a histogram (quantiles over any window) or only
    /// avg, min and max per minute. The per-container rates that are noisy
    /// and never asked for quantiles (throttling, I/O) keep the summary: a
    /// noisy minute's histogram costs a byte per occupied bucket, and those
    /// would double the cache's memory.
    pub fn rollup_quantiles(self) -> bool {
        !matches!(
            self,
            Metric::CpuThrottledRatio
                | Metric::CpuThrottledTime
                | Metric::IoReadBytes
                | Metric::IoWriteBytes
                | Metric::IoReadOps
                | Metric::IoWriteOps
        )
    }

    /// Unit of the values, for people.
    pub fn unit_name(self) -> &'static str {
        match self {
            Metric::CpuUsage | Metric::CpuCapacity => "cores",
            Metric::CpuThrottledRatio => "ratio",
            Metric::CpuThrottledTime => "seconds/second",
            Metric::PsiCpuSome
            | Metric::PsiMemorySome
            | Metric::PsiMemoryFull
            | Metric::PsiIoSome
            | Metric::PsiIoFull => "ratio",
            Metric::MemoryUsage
            | Metric::MemoryWorkingSet
            | Metric::MemoryRss
            | Metric::MemoryCache
            | Metric::MemoryTotal
            | Metric::MemoryAvailable => "bytes",
            Metric::IoReadBytes | Metric::IoWriteBytes => "bytes/second",
            Metric::IoReadOps | Metric::IoWriteOps => "operations/second",
            Metric::OomKills => "count",
            Metric::Load1 | Metric::Load5 | Metric::Load15 => "tasks",
        }
    }
}

/// The value of `m` among one entity's samples of a tick.
pub fn sample(samples: &[(Metric, f64)], m: Metric) -> Option<f64> {
    samples.iter().find(|(x, _)| *x == m).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for (i, m) in Metric::ALL.into_iter().enumerate() {
            assert_eq!(m as usize, i);
            assert_eq!(Metric::from_id(i as u8), Some(m));
            assert_eq!(Metric::from_name(m.name()), Some(m));
            assert!(m.unit() > 0.0);
        }
        assert_eq!(Metric::from_name("nope"), None);
        assert_eq!(Metric::from_id(200), None);
    }
}
