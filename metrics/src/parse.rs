//! Parsers of the kernel's metric files (procfs and cgroup v1/v2), pure: text
//! in, numbers out. A malformed file is an error, never a panic or a zero.

use std::collections::BTreeMap;

/// Why a file could not be parsed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseError(pub String);

fn bad(what: &str, content: &(impl AsRef<[u8]> + ?Sized)) -> ParseError {
    let content = String::from_utf8_lossy(content.as_ref());
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
/// Bytes in (the files are ASCII; nothing to validate first).
pub fn keyed<const N: usize>(
    content: &(impl AsRef<[u8]> + ?Sized),
    keys: [&str; N],
) -> [Option<u64>; N] {
    // one byte loop over each line (the key, then its value): the lines are
    // short, so searchers cost more than the scan (this runs for every cgroup
    // every tick); a key's length and last byte are compared before its
    // bytes (most lines match neither)
    let mut out = [None; N];
    let b = content.as_ref();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i] != b' ' && b[i] != b'\n' {
            i += 1;
        }
        let (key, spaced) = (&b[start..i], i < b.len() && b[i] == b' ');
        let value = i + 1;
        while i < b.len() && b[i] != b'\n' {
            i += 1;
        }
        i += 1;
        // a line without a space has no value
        let Some(last) = key.last().filter(|_| spaced) else {
            continue;
        };
        for (k, x) in keys.iter().enumerate() {
            let x = x.as_bytes();
            if x.len() == key.len() && x.last() == Some(last) && x == key {
                out[k] = number(&b[value..i - 1]);
                break;
            }
        }
    }
    out
}

/// A decimal number of ASCII digits, surrounding whitespace allowed (`None`:
/// anything else, or past u64).
pub fn number(b: &[u8]) -> Option<u64> {
    let b = b.trim_ascii();
    if b.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

/// A single number (cpuacct.usage, memory.usage_in_bytes, memory.current).
pub fn single(content: &(impl AsRef<[u8]> + ?Sized)) -> Result<u64, ParseError> {
    number(content.as_ref()).ok_or_else(|| bad("a single number", content))
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
pub fn cpu_stat(content: &(impl AsRef<[u8]> + ?Sized), v2: bool) -> Result<CpuStat, ParseError> {
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
pub fn memory(
    usage: &(impl AsRef<[u8]> + ?Sized),
    stat: &(impl AsRef<[u8]> + ?Sized),
    v2: bool,
) -> Result<Memory, ParseError> {
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
pub fn oom_kills(content: &(impl AsRef<[u8]> + ?Sized)) -> Option<u64> {
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

/// A block device (`major:minor`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dev {
    pub major: u32,
    pub minor: u32,
}

impl Dev {
    /// `8:0` (`None`: anything else).
    pub fn parse(s: &[u8]) -> Option<Dev> {
        let colon = s.iter().position(|b| *b == b':')?;
        let (major, minor) = (number(&s[..colon])?, number(&s[colon + 1..])?);
        Some(Dev {
            major: u32::try_from(major).ok()?,
            minor: u32::try_from(minor).ok()?,
        })
    }
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Devices held inline (a cgroup's I/O nearly always goes to one or two).
const INLINE_DEVICES: usize = 2;

/// I/O counters per device, sorted by device. Up to [`INLINE_DEVICES`] are
/// held inline: a read allocates nothing, and a copy is a copy (nothing shared
/// whose count is touched, cold, every tick).
#[derive(Debug, Clone)]
pub struct Devices(Repr);

#[derive(Debug, Clone)]
enum Repr {
    /// The first `n` entries (`n` ≤ [`INLINE_DEVICES`]).
    Few(u8, [(Dev, Io); INLINE_DEVICES]),
    Many(std::sync::Arc<[(Dev, Io)]>),
}

impl Default for Devices {
    fn default() -> Self {
        Devices(Repr::Few(0, Default::default()))
    }
}

/// The same devices with the same counters, however held.
impl PartialEq for Devices {
    fn eq(&self, o: &Self) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Eq for Devices {}

impl Devices {
    pub fn as_slice(&self) -> &[(Dev, Io)] {
        match &self.0 {
            Repr::Few(n, d) => &d[..usize::from(*n).min(INLINE_DEVICES)],
            Repr::Many(d) => d,
        }
    }

    pub fn iter(&self) -> std::slice::Iter<'_, (Dev, Io)> {
        self.as_slice().iter()
    }

    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// The counters of `dev`.
    pub fn get(&self, dev: Dev) -> Option<&Io> {
        self.iter().find(|(d, _)| *d == dev).map(|(_, io)| io)
    }
}

impl FromIterator<(Dev, Io)> for Devices {
    /// Sorted by device; a device given twice keeps its last counters.
    fn from_iter<I: IntoIterator<Item = (Dev, Io)>>(it: I) -> Self {
        let mut b = DevicesBuilder::default();
        for (d, io) in it {
            *b.entry(d) = io;
        }
        b.build()
    }
}

/// Devices as a file is parsed: on the stack while they are few.
#[derive(Default)]
struct DevicesBuilder {
    n: usize,
    few: [(Dev, Io); 8],
    more: Vec<(Dev, Io)>,
}

impl DevicesBuilder {
    fn entry(&mut self, dev: Dev) -> &mut Io {
        if let Some(i) = self.few[..self.n].iter().position(|(d, _)| *d == dev) {
            return &mut self.few[i].1;
        }
        if self.n < self.few.len() {
            self.few[self.n] = (dev, Io::default());
            self.n += 1;
            return &mut self.few[self.n - 1].1;
        }
        let i = match self.more.iter().position(|(d, _)| *d == dev) {
            Some(i) => i,
            None => {
                self.more.push((dev, Io::default()));
                self.more.len() - 1
            }
        };
        &mut self.more[i].1
    }

    fn build(mut self) -> Devices {
        if self.more.is_empty() && self.n <= INLINE_DEVICES {
            let mut d: [(Dev, Io); INLINE_DEVICES] = Default::default();
            d[..self.n].copy_from_slice(&self.few[..self.n]);
            d[..self.n].sort_unstable_by_key(|(d, _)| *d);
            return Devices(Repr::Few(self.n as u8, d));
        }
        let mut all = self.few[..self.n].to_vec();
        all.append(&mut self.more);
        all.sort_unstable_by_key(|(d, _)| *d);
        Devices(Repr::Many(all.into()))
    }
}

/// The whitespace-separated fields of a line.
fn fields(l: &[u8]) -> impl Iterator<Item = &[u8]> {
    l.split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
}

/// v1 `blkio.throttle.io_service_bytes_recursive` + `io_serviced_recursive`
/// (`8:0 Read 123` lines) into per-device counters.
pub fn blkio_v1(bytes: &(impl AsRef<[u8]> + ?Sized), ops: &(impl AsRef<[u8]> + ?Sized)) -> Devices {
    let mut out = DevicesBuilder::default();
    for (content, is_bytes) in [(bytes.as_ref(), true), (ops.as_ref(), false)] {
        for l in content.split(|b| *b == b'\n') {
            let mut f = fields(l);
            let (Some(dev), Some(op), Some(v), None) = (f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let (Some(dev), Some(v)) = (Dev::parse(dev), number(v)) else {
                continue;
            };
            let e = out.entry(dev);
            match (op, is_bytes) {
                (b"Read", true) => e.read_bytes = v,
                (b"Write", true) => e.write_bytes = v,
                (b"Read", false) => e.read_ops = v,
                (b"Write", false) => e.write_ops = v,
                _ => {}
            }
        }
    }
    out.build()
}

/// v2 `io.stat`: `8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0`.
pub fn io_stat_v2(content: &(impl AsRef<[u8]> + ?Sized)) -> Devices {
    let mut out = DevicesBuilder::default();
    for l in content.as_ref().split(|b| *b == b'\n') {
        let mut it = fields(l);
        let Some(dev) = it.next().and_then(Dev::parse) else {
            continue;
        };
        let mut io = Io::default();
        for kv in it {
            let Some(eq) = kv.iter().position(|b| *b == b'=') else {
                continue;
            };
            let Some(v) = number(&kv[eq + 1..]) else {
                continue;
            };
            match &kv[..eq] {
                b"rbytes" => io.read_bytes = v,
                b"wbytes" => io.write_bytes = v,
                b"rios" => io.read_ops = v,
                b"wios" => io.write_ops = v,
                _ => {}
            }
        }
        *out.entry(dev) = io;
    }
    out.build()
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
    fn keyed_lines() {
        let f = "total_rss_huge 7\ntotal_rss 5\nnovalue\n total_cache 9\ntotal_dirty x1\ntotal_pgpgin  12 \ntotal_cache 3";
        assert_eq!(
            keyed(f, ["total_rss", "total_cache", "total_dirty", "total_pgpgin", "novalue"]),
            [Some(5), Some(3), None, Some(12), None],
            "a longer key is another key; no value, not a number: none; the last line counts without its newline"
        );
        assert_eq!(keyed("", ["a"]), [None]);
        assert_eq!(
            keyed("a 1\n\n\na 2\n", ["a"]),
            [Some(2)],
            "the last of a key wins"
        );
        assert_eq!(number(b" 18446744073709551615\n"), Some(u64::MAX));
        assert_eq!(number(b"18446744073709551616"), None, "past u64");
        assert_eq!(number(b"-1"), None);
        assert_eq!(number(b""), None);
        assert_eq!(single("12\n").unwrap(), 12);
        assert!(
            single(&b"\xff"[..]).is_err(),
            "not text: an error, no panic"
        );
    }

    #[test]
    fn io_v1_and_v2() {
        let dev = |s: &str| Dev::parse(s.as_bytes()).unwrap();
        let io = blkio_v1(V1_BLKIO_BYTES, V1_BLKIO_OPS);
        assert_eq!(
            *io.get(dev("254:0")).unwrap(),
            Io {
                read_bytes: 1_332_183_040,
                write_bytes: 1_712_283_648,
                read_ops: 79_290,
                write_ops: 7_950
            }
        );
        assert_eq!(io.len(), 1, "the Total line is not a device");
        let io = io_stat_v2(V2_IO_STAT);
        assert_eq!(io.get(dev("259:0")).unwrap().read_bytes, 4_407_296);
        assert_eq!(io.get(dev("8:16")).unwrap().read_ops, 1);
        assert!(blkio_v1("nonsense\n", "").is_empty());
        assert_eq!(dev("8:16").to_string(), "8:16");
        assert_eq!(Dev::parse(b"8"), None);
        assert_eq!(Dev::parse(b"8:x"), None);
        // sorted by device, held inline while few, shared past that
        let many: Devices = (0..5u32)
            .rev()
            .map(|m| {
                (
                    Dev {
                        major: 8,
                        minor: m * 16,
                    },
                    Io {
                        read_ops: u64::from(m),
                        ..Io::default()
                    },
                )
            })
            .collect();
        assert!(matches!(many.0, Repr::Many(_)));
        let minors: Vec<u32> = many.iter().map(|(d, _)| d.minor).collect();
        assert_eq!(minors, [0, 16, 32, 48, 64]);
        assert_eq!(many.get(dev("8:48")).unwrap().read_ops, 3);
        let few = io_stat_v2("8:16 rbytes=1 rios=1\n8:0 rbytes=2 rios=2\n");
        assert!(matches!(few.0, Repr::Few(2, _)));
        let one: Devices = few.iter().copied().take(1).collect();
        assert_ne!(one, few);
        assert_eq!(
            few.iter().copied().collect::<Devices>(),
            few,
            "the same devices, equal"
        );
        assert_eq!(
            few.iter().map(|(d, _)| d.to_string()).collect::<Vec<_>>(),
            ["8:0", "8:16"]
        );
        // ten devices in a v1 file (past the parser's stack)
        let bytes: String = (0..10)
            .map(|m| format!("8:{m} Read {m}\n8:{m} Write 1\n"))
            .collect();
        let ten = blkio_v1(&bytes, "");
        assert_eq!(ten.len(), 10);
        assert_eq!(ten.get(dev("8:9")).unwrap().read_bytes, 9);
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
