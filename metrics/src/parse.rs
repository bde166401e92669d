//! Parsers of the kernel's metric files (procfs and cgroup v1/v2), pure: text
//! in, numbers out. A malformed file is an error, never a panic or a zero.

use std::collections::BTreeMap;

/// Why a file could not be parsed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseError(pub String);

fn bad(what: &str, content: &str) -> ParseError {
    let head: String = content.chars().take(80).collect();
    ParseError(format!("{what}: unexpected content {head:?}"))
}

/// `key value` lines (cpu.stat, memory.stat, memory.events, oom_control).
pub fn flat_keyed(content: &str) -> BTreeMap<&str, u64> {
    content
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            Some((k, v))
        })
        .collect()
}

/// The values of `keys` in `key value` lines, in one pass without allocating.
pub fn keyed<const N: usize>(content: &str, keys: [&str; N]) -> [Option<u64>; N] {
    // a byte loop: the lines are short, so per-line searchers cost more
    // than the scan (this runs for every cgroup every tick)
    let mut out = [None; N];
    for l in content.as_bytes().split(|b| *b == b'\n') {
        let Some(sp) = l.iter().position(|b| *b == b' ') else {
            continue;
        };
        let k = &l[..sp];
        if let Some(i) = keys.iter().position(|x| x.as_bytes() == k) {
            out[i] = std::str::from_utf8(l[sp + 1..].trim_ascii())
                .ok()
                .and_then(|v| v.parse().ok());
        }
    }
    out
}

/// A single number (cpuacct.usage, memory.usage_in_bytes, memory.current).
pub fn single(content: &str) -> Result<u64, ParseError> {
    content
        .trim()
        .parse()
        .map_err(|_| bad("a single number", content))
}

/// CFS bandwidth counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// Total CPU time in ns (v2 `usage_usec`; v1 reads cpuacct.usage instead).
    pub usage_ns: Option<u64>,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

/// v1 `cpu.stat` (throttled_time in ns) or v2 `cpu.stat` (µs fields).
pub fn cpu_stat(content: &str, v2: bool) -> Result<CpuStat, ParseError> {
    if v2 {
        let [usage, periods, throttled, time] = keyed(
            content,
            ["usage_usec", "nr_periods", "nr_throttled", "throttled_usec"],
        );
        let usage = usage.ok_or_else(|| bad("cpu.stat", content))?;
        Ok(CpuStat {
            usage_ns: Some(usage.saturating_mul(1000)),
            nr_periods: periods.unwrap_or(0),
            nr_throttled: throttled.unwrap_or(0),
            throttled_ns: time.unwrap_or(0).saturating_mul(1000),
        })
    } else {
        let [periods, throttled, time] =
            keyed(content, ["nr_periods", "nr_throttled", "throttled_time"]);
        Ok(CpuStat {
            usage_ns: None,
            nr_periods: periods.ok_or_else(|| bad("cpu.stat", content))?,
            nr_throttled: throttled.unwrap_or(0),
            throttled_ns: time.unwrap_or(0),
        })
    }
}

/// Memory of a cgroup, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub usage: u64,
    pub working_set: u64,
    pub rss: u64,
    pub cache: u64,
    /// Page cache dirty or under writeback (0 when memory.stat lacks the fields):
    /// on v2 the cgroup's own I/O may go on while its tasks sleep.
    pub dirty: u64,
    /// Pages charged (v1 `total_pgpgin`; 0 on v2) and major faults: with the
    /// page cache size, the signs that the cgroup's tasks read from disk.
    pub pgpgin: u64,
    pub pgmajfault: u64,
}

/// From the usage file and memory.stat. v1 uses the hierarchical `total_*`
/// fields (a pod's children count); v2's memory.stat is hierarchical already.
/// Working set = usage - inactive file, as kubelet computes it.
pub fn memory(usage: &str, stat: &str, v2: bool) -> Result<Memory, ParseError> {
    let usage = single(usage)?;
    // one pass over the file for every field
    let keys = if v2 {
        [
            "inactive_file",
            "anon",
            "file",
            "file_dirty",
            "file_writeback",
            "pgpgin",
            "pgmajfault",
        ]
    } else {
        [
            "total_inactive_file",
            "total_rss",
            "total_cache",
            "total_dirty",
            "total_writeback",
            "total_pgpgin",
            "total_pgmajfault",
        ]
    };
    let [inactive_file, rss, cache, d, w, pgpgin, pgmajfault] = keyed(stat, keys);
    let (Some(inactive_file), Some(rss), Some(cache)) = (inactive_file, rss, cache) else {
        return Err(bad("memory.stat", stat));
    };
    Ok(Memory {
        usage,
        working_set: usage.saturating_sub(inactive_file),
        rss,
        cache,
        dirty: d.unwrap_or(0).saturating_add(w.unwrap_or(0)),
        pgpgin: pgpgin.unwrap_or(0),
        pgmajfault: pgmajfault.unwrap_or(0),
    })
}

/// OOM kills from v1 `memory.oom_control` or v2 `memory.events` (`None`: an
/// older kernel without the field).
pub fn oom_kills(content: &str) -> Option<u64> {
    keyed(content, ["oom_kill"])[0]
}

/// I/O counters of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Io {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
}

/// v1 `blkio.throttle.io_service_bytes_recursive` + `io_serviced_recursive`
/// (`8:0 Read 123` lines) into per-device counters.
pub fn blkio_v1(bytes: &str, ops: &str) -> BTreeMap<String, Io> {
    let mut out: BTreeMap<String, Io> = BTreeMap::new();
    for (content, is_bytes) in [(bytes, true), (ops, false)] {
        for l in content.lines() {
            let mut f = l.split_ascii_whitespace();
            let (Some(dev), Some(op), Some(v), None) = (f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            if !dev.contains(':') {
                continue;
            }
            // a device seen before (its other lines) is found without a new key
            let e = match out.get_mut(dev) {
                Some(e) => e,
                None => out.entry(dev.to_string()).or_default(),
            };
            match (op, is_bytes) {
                ("Read", true) => e.read_bytes = v,
                ("Write", true) => e.write_bytes = v,
                ("Read", false) => e.read_ops = v,
                ("Write", false) => e.write_ops = v,
                _ => {}
            }
        }
    }
    out
}

/// v2 `io.stat`: `8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0`.
pub fn io_stat_v2(content: &str) -> BTreeMap<String, Io> {
    let mut out = BTreeMap::new();
    for l in content.lines() {
        let mut it = l.split_whitespace();
        let Some(dev) = it.next().filter(|d| d.contains(':')) else {
            continue;
        };
        let mut io = Io::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            match k {
                "rbytes" => io.read_bytes = v,
                "wbytes" => io.write_bytes = v,
                "rios" => io.read_ops = v,
                "wios" => io.write_ops = v,
                _ => {}
            }
        }
        out.insert(dev.to_string(), io);
    }
    out
}

/// Pressure stall totals (µs) of one resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Psi {
    pub some_us: u64,
    /// `None` for node CPU on kernels that do not report it.
    pub full_us: Option<u64>,
}

/// `/proc/pressure/*` or a v2 cgroup's `*.pressure`.
pub fn psi(content: &str) -> Result<Psi, ParseError> {
    let mut out = Psi::default();
    let mut some = false;
    for l in content.lines() {
        let mut it = l.split_whitespace();
        let kind = it.next();
        let total = it
            .find_map(|f| f.strip_prefix("total="))
            .and_then(|v| v.parse::<u64>().ok());
        match (kind, total) {
            (Some("some"), Some(t)) => {
                out.some_us = t;
                some = true;
            }
            (Some("full"), Some(t)) => out.full_us = Some(t),
            _ => {}
        }
    }
    if !some {
        return Err(bad("pressure", content));
    }
    Ok(out)
}

/// Node CPU time from `/proc/stat`'s `cpu` line, in USER_HZ ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Everything but idle, iowait and steal.
    pub busy: u64,
    pub total: u64,
    /// `cpuN` lines: online CPUs.
    pub cpus: u32,
}

pub fn proc_stat(content: &str) -> Result<CpuTimes, ParseError> {
    let mut out = CpuTimes::default();
    let mut found = false;
    for l in content.lines() {
        let mut it = l.split_whitespace();
        match it.next() {
            Some("cpu") => {
                // user nice system idle iowait irq softirq steal guest guest_nice;
                // guest time is already in user, so it is not added again. Steal
                // (time the hypervisor gave another guest) is in the total, not
                // in busy: this node did not run anything then.
                let v: Vec<u64> = it.take(8).filter_map(|x| x.parse().ok()).collect();
                if v.len() < 4 {
                    return Err(bad("/proc/stat", content));
                }
                let idle = v[3] + v.get(4).copied().unwrap_or(0);
                let steal = v.get(7).copied().unwrap_or(0);
                out.total = v.iter().sum();
                out.busy = out.total.saturating_sub(idle).saturating_sub(steal);
                found = true;
            }
            Some(c) if c.starts_with("cpu") => out.cpus += 1,
            _ => {}
        }
    }
    if !found {
        return Err(bad("/proc/stat", content));
    }
    Ok(out)
}

/// `/proc/meminfo` fields in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
    pub free: u64,
    pub cached: u64,
    /// `Inactive(file)`: page cache the kernel reclaims first (`None`: absent).
    pub inactive_file: Option<u64>,
    /// `Hugetlb`: the huge page pool, free or used (0: absent).
    pub hugetlb: u64,
}

pub fn meminfo(content: &str) -> Result<MemInfo, ParseError> {
    let mut kv = BTreeMap::new();
    for l in content.lines() {
        let Some((k, rest)) = l.split_once(':') else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let Some(Ok(v)) = it.next().map(str::parse::<u64>) else {
            continue;
        };
        let mul = if it.next() == Some("kB") { 1024 } else { 1 };
        kv.insert(k.trim(), v.saturating_mul(mul));
    }
    let get = |k: &str| {
        kv.get(k)
            .copied()
            .ok_or_else(|| bad("/proc/meminfo", content))
    };
    Ok(MemInfo {
        total: get("MemTotal")?,
        available: get("MemAvailable")?,
        free: get("MemFree")?,
        cached: get("Cached").unwrap_or(0),
        inactive_file: get("Inactive(file)").ok(),
        hugetlb: get("Hugetlb").unwrap_or(0),
    })
}

/// `/proc/loadavg`: 1, 5 and 15 minute load.
pub fn loadavg(content: &str) -> Result<[f64; 3], ParseError> {
    let v: Vec<f64> = content
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    match v[..] {
        [a, b, c] if [a, b, c].iter().all(|x| x.is_finite() && *x >= 0.0) => Ok([a, b, c]),
        _ => Err(bad("/proc/loadavg", content)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real file contents, copied from a Linux 6.18 host with cgroup v1 (this
    // machine) and from a cgroup v2 host (kernel 6.x, systemd driver).
    const V1_CPU_STAT: &str =
        "nr_periods 1520\nnr_throttled 312\nthrottled_time 41562118890\nnr_bursts 0\nburst_time 0\n";
    const V2_CPU_STAT: &str = "usage_usec 73919640\nuser_usec 52211937\nsystem_usec 21707703\ncore_sched.force_idle_usec 0\nnr_periods 4121\nnr_throttled 1077\nthrottled_usec 58911231\nnr_bursts 0\nburst_usec 0\n";
    const V1_MEMORY_STAT: &str = "cache 10407936\nrss 3010560\nrss_huge 0\nshmem 9068544\nmapped_file 7553024\ndirty 8192\nwriteback 0\nworkingset_refault_anon 0\nworkingset_refault_file 3438\nswap 0\nswapcached 0\npgpgin 57582\npgpgout 54306\npgfault 65896\npgmajfault 0\ninactive_anon 0\nactive_anon 1531904\ninactive_file 36864\nactive_file 1302528\nunevictable 10547200\nhierarchical_memory_limit 9223372036854771712\nhierarchical_memsw_limit 9223372036854771712\ntotal_cache 5438271488\ntotal_rss 18395136\ntotal_rss_huge 0\ntotal_shmem 9068544\ntotal_mapped_file 43855872\ntotal_dirty 77824\ntotal_writeback 0\ntotal_workingset_refault_anon 0\ntotal_workingset_refault_file 6552293\ntotal_swap 0\ntotal_swapcached 0\ntotal_pgpgin 164399645\ntotal_pgpgout 163439402\ntotal_pgfault 194821411\ntotal_pgmajfault 62077\ntotal_inactive_anon 15286272\ntotal_active_anon 1548288\ntotal_inactive_file 2943741952\ntotal_active_file 2494283776\ntotal_unevictable 10547200\n";
    const V2_MEMORY_STAT: &str = "anon 70828032\nfile 4096000\nkernel 1703936\nkernel_stack 81920\npagetables 217088\nsec_pagetables 0\npercpu 1440\nsock 0\nvmalloc 0\nshmem 0\nzswap 0\nzswapped 0\nfile_mapped 1122304\nfile_dirty 0\nfile_writeback 0\nswapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 70782976\nactive_anon 45056\ninactive_file 2998272\nactive_file 1097728\nunevictable 0\nslab_reclaimable 499448\nslab_unreclaimable 485816\nslab 985264\n";
    const V1_OOM: &str = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
    const V2_EVENTS: &str = "low 0\nhigh 0\nmax 41\noom 3\noom_kill 3\noom_group_kill 0\n";
    const V1_BLKIO_BYTES: &str = "254:0 Read 1332183040\n254:0 Write 1712283648\n254:0 Sync 2492563456\n254:0 Async 1706590208\n254:0 Discard 1154686976\n254:0 Total 4199153664\nTotal 4199153664\n";
    const V1_BLKIO_OPS: &str = "254:0 Read 79290\n254:0 Write 7950\n254:0 Sync 82589\n254:0 Async 6791\n254:0 Discard 2140\n254:0 Total 89380\nTotal 89380\n";
    const V2_IO_STAT: &str = "259:0 rbytes=4407296 wbytes=1441792 rios=183 wios=49 dbytes=0 dios=0\n8:16 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n";
    const PSI_CPU: &str = "some avg10=0.00 avg60=1.52 avg300=4.27 total=573842302\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const PSI_CPU_OLD: &str = "some avg10=0.12 avg60=0.05 avg300=0.01 total=12345\n";
    const PROC_STAT: &str = "cpu  354813 335 89503 890468 6862 0 1625 64 0 0\ncpu0 169331 103 43138 456969 1967 0 77 29 0 0\ncpu1 185482 231 46364 433498 4894 0 1547 35 0 0\nintr 1 2 3\nctxt 123\nbtime 1764400000\n";
    const MEMINFO: &str = "MemTotal:       24684092 kB\nMemFree:        18731816 kB\nMemAvailable:   24168064 kB\nBuffers:           15928 kB\nCached:          5294864 kB\nSwapCached:            0 kB\nHugePages_Total:       0\n";

    #[test]
    fn cpu_stat_v1_and_v2() {
        assert_eq!(
            cpu_stat(V1_CPU_STAT, false).unwrap(),
            CpuStat {
                usage_ns: None,
                nr_periods: 1520,
                nr_throttled: 312,
                throttled_ns: 41_562_118_890
            }
        );
        assert_eq!(
            cpu_stat(V2_CPU_STAT, true).unwrap(),
            CpuStat {
                usage_ns: Some(73_919_640_000),
                nr_periods: 4121,
                nr_throttled: 1077,
                throttled_ns: 58_911_231_000
            }
        );
        assert!(cpu_stat("garbage", false).is_err());
        assert!(cpu_stat(V1_CPU_STAT, true).is_err(), "v1 file is not v2");
        assert_eq!(single("4589995470054\n").unwrap(), 4_589_995_470_054);
        assert!(single("12x").is_err());
    }

    #[test]
    fn memory_v1_and_v2() {
        let m = memory("5500000000\n", V1_MEMORY_STAT, false).unwrap();
        assert_eq!(m.usage, 5_500_000_000);
        assert_eq!(m.working_set, 5_500_000_000 - 2_943_741_952);
        assert_eq!((m.rss, m.cache), (18_395_136, 5_438_271_488));
        let m = memory("76963840\n", V2_MEMORY_STAT, true).unwrap();
        assert_eq!(m.working_set, 76_963_840 - 2_998_272);
        assert_eq!((m.rss, m.cache), (70_828_032, 4_096_000));
        // usage below inactive file (read at different instants): no underflow
        assert_eq!(
            memory("100\n", V2_MEMORY_STAT, true).unwrap().working_set,
            0
        );
        assert!(
            memory("1\n", "total_rss 1\n", false).is_err(),
            "truncated stat"
        );
        assert!(memory("", V2_MEMORY_STAT, true).is_err());
        assert_eq!(oom_kills(V1_OOM), Some(2));
        assert_eq!(oom_kills(V2_EVENTS), Some(3));
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
    }

    #[test]
    fn io_v1_and_v2() {
        let io = blkio_v1(V1_BLKIO_BYTES, V1_BLKIO_OPS);
        assert_eq!(
            io["254:0"],
            Io {
                read_bytes: 1_332_183_040,
                write_bytes: 1_712_283_648,
                read_ops: 79_290,
                write_ops: 7_950
            }
        );
        assert_eq!(io.len(), 1, "the Total line is not a device");
        let io = io_stat_v2(V2_IO_STAT);
        assert_eq!(io["259:0"].read_bytes, 4_407_296);
        assert_eq!(io["8:16"].read_ops, 1);
        assert!(blkio_v1("nonsense\n", "").is_empty());
    }

    #[test]
    fn pressure() {
        assert_eq!(
            psi(PSI_CPU).unwrap(),
            Psi {
                some_us: 573_842_302,
                full_us: Some(0)
            }
        );
        assert_eq!(psi(PSI_CPU_OLD).unwrap().full_us, None);
        assert!(psi("").is_err());
    }

    #[test]
    fn procfs() {
        let c = proc_stat(PROC_STAT).unwrap();
        assert_eq!(c.cpus, 2);
        assert_eq!(c.total, 354813 + 335 + 89503 + 890468 + 6862 + 1625 + 64);
        assert_eq!(
            c.busy,
            c.total - 890468 - 6862 - 64,
            "idle, iowait and steal are not busy"
        );
        assert!(proc_stat("intr 1\n").is_err());
        let m = meminfo(MEMINFO).unwrap();
        assert_eq!(m.total, 24_684_092 * 1024);
        assert_eq!(m.available, 24_168_064 * 1024);
        assert!(meminfo("MemTotal: 1 kB\n").is_err());
        assert_eq!(
            loadavg("0.17 0.64 0.91 1/93 32682\n").unwrap(),
            [0.17, 0.64, 0.91]
        );
        assert!(loadavg("0.17 x").is_err());
    }
}
