//! Collectors: every tick, the node (procfs) and each pod's and container's
//! cgroup (v1 or v2) are read, and counters become rates.
//!
//! Roots are injected (`/proc` and the cgroup host, kernel-shaped trees in
//! tests). A cgroup that vanished mid-read (a container gone) or a malformed
//! file skips that entity's sample for this tick; a counter that went
//! backwards (a cgroup recreated under the same name) restarts the rate, so
//! there is never a bogus spike.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qoslet_cgroups::{CgroupError, CgroupPath, Host};

use crate::fasthash::FastMap;
use crate::metric::{sample as get, Metric};
use crate::parse::{self, CpuStat, Io, Memory, Psi};

/// What a series belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Pod,
    Container,
}

/// A pod or container to collect, with its Prometheus labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `pod/<sandbox id>` or `container/<id>`.
    pub entity: String,
    pub kind: Kind,
    pub cgroup: CgroupPath,
    pub namespace: String,
    pub pod: String,
    /// Empty for a pod.
    pub container: String,
    /// LSE, LSR, LS, BE, SYSTEM, or empty when unknown.
    pub qos_class: String,
    /// The pod's entity (`pod/<sandbox id>`); a pod's own entity for a pod.
    pub pod_entity: String,
}

/// Raw counters of one cgroup, as last read (for the exporter's counters).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupRaw {
    pub cpu_ns: u64,
    pub cpu: CpuStat,
    pub memory: Option<Memory>,
    pub oom_kills: Option<u64>,
    /// Per device (`major:minor`); shared with the collector's last read.
    pub io: Arc<BTreeMap<String, Io>>,
    /// cpu, memory, io (v2 only).
    pub psi: [Option<Psi>; 3],
}

/// Raw node counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeRaw {
    pub cpu: parse::CpuTimes,
    pub memory: parse::MemInfo,
    pub load: [f64; 3],
    pub psi: [Option<Psi>; 3],
}

/// One entity's readings of a tick: derived samples (rates, gauges) and raw counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub target: Arc<Target>,
    pub samples: Vec<(Metric, f64)>,
    pub raw: CgroupRaw,
}

/// Everything one tick read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    /// Unix seconds.
    pub ts: u32,
    pub node: Vec<(Metric, f64)>,
    pub node_raw: Option<NodeRaw>,
    pub readings: Vec<Reading>,
    /// Node minus all pods (cpu cores, memory bytes).
    pub system: Vec<(Metric, f64)>,
    /// All BE pods together.
    pub be: Vec<(Metric, f64)>,
    /// Entities skipped this tick (vanished or unreadable).
    pub skipped: usize,
}

/// Whether CPI (cycles per instruction) is measured here, in words. It needs
/// hardware perf counters: a `cpu` PMU under `/sys/bus/event_source/devices`
/// (virtual machines often have none). qoslet reports CPI as unavailable,
/// never as zero.
pub fn cpi_status(sys_root: &Path) -> String {
    if !sys_root.join("bus/event_source/devices/cpu").exists() {
        return "unavailable: no hardware PMU (no cpu event source)".into();
    }
    "unavailable: hardware PMU present, but qoslet does not open perf events".into()
}

#[derive(Debug, Clone, Copy)]
struct Prev {
    mono_ns: u64,
    cpu_ns: u64,
    cpu: CpuStat,
    /// All devices together: read/write bytes and ops.
    io: Option<[u64; 4]>,
    psi: [Option<Psi>; 3],
}

fn io_totals(io: &BTreeMap<String, Io>) -> Option<[u64; 4]> {
    (!io.is_empty()).then(|| {
        io.values().fold([0u64; 4], |a, i| {
            [
                a[0].saturating_add(i.read_bytes),
                a[1].saturating_add(i.write_bytes),
                a[2].saturating_add(i.read_ops),
                a[3].saturating_add(i.write_ops),
            ]
        })
    })
}

/// One cgroup file, with its handle kept open across ticks while the fd
/// budget allows (a tick is then one `pread` per file instead of
/// open/stat/read/read/close).
#[derive(Debug)]
struct CFile {
    /// The cgroup's directory (shared by its files) and the file's name.
    dir: Arc<Path>,
    name: &'static str,
    fd: Option<std::fs::File>,
}

impl CFile {
    fn new(dir: &Arc<Path>, name: &'static str) -> Self {
        Self {
            dir: dir.clone(),
            name,
            fd: None,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(self.name)
    }
}

/// The files read for one cgroup (resolved once: the symlink check walks
/// every component). Optional files absent at first sight are not retried.
#[derive(Debug)]
struct Files {
    cpu_stat: CFile,
    /// v1 `cpuacct.usage` (v2 has usage in cpu.stat).
    cpu_usage: Option<CFile>,
    mem_usage: CFile,
    mem_stat: CFile,
    events: Option<CFile>,
    io: Vec<CFile>,
    psi: [Option<CFile>; 3],
    /// Ticks this cgroup was read.
    reads: u64,
    /// The OOM kill count as last read (it is read every [`SLOW_EVERY`] ticks).
    oom_kills: Option<u64>,
    /// v1 cpu.stat as last read, and whether it stood still then (no CFS
    /// quota, or not running): such a file is re-read every [`SLOW_EVERY`] ticks.
    cpu_last: Option<CpuStat>,
    cpu_idle: bool,
    /// I/O counters as last read, and whether they stood still (idle I/O is
    /// re-read every [`SLOW_EVERY`] ticks, like an unthrottled cpu.stat).
    io_last: Option<Arc<BTreeMap<String, Io>>>,
    io_idle: bool,
    /// The counters of the previous tick (rates are deltas against them).
    prev: Option<Prev>,
    /// The tick this cgroup was last asked for.
    seen: u64,
}

/// Counters read again after standing still: their first delta may span
/// several ticks, so no rate is computed from it (no bogus spike).
#[derive(Debug, Clone, Copy, Default)]
struct Rebase {
    cpu_stat: bool,
    io: bool,
}

/// Rarely-changing files (OOM kill counts) and the removed-cgroup check on
/// file trees are read every this many ticks.
const SLOW_EVERY: u64 = 10;

impl Files {
    /// A cgroup's files (`mem`: the usage file and memory.stat), nothing read yet.
    fn new(
        cpu_stat: CFile,
        cpu_usage: Option<CFile>,
        mem: [CFile; 2],
        events: Option<CFile>,
        io: Vec<CFile>,
        psi: [Option<CFile>; 3],
    ) -> Self {
        let [mem_usage, mem_stat] = mem;
        Self {
            cpu_stat,
            cpu_usage,
            mem_usage,
            mem_stat,
            events,
            io,
            psi,
            reads: 0,
            oom_kills: None,
            cpu_last: None,
            cpu_idle: false,
            io_last: None,
            io_idle: false,
            prev: None,
            seen: 0,
        }
    }

    fn open_fds(&self) -> usize {
        let mut all: Vec<&CFile> = vec![&self.cpu_stat, &self.mem_usage, &self.mem_stat];
        all.extend(self.cpu_usage.iter());
        all.extend(self.events.iter());
        all.extend(self.io.iter());
        all.extend(self.psi.iter().flatten());
        all.iter().filter(|f| f.fd.is_some()).count()
    }
}

/// How many files may stay open (the soft RLIMIT_NOFILE minus a reserve for
/// sockets and everything else; past it, files are opened per read).
fn fd_budget(proc_root: &Path) -> usize {
    let limits = std::fs::read_to_string(proc_root.join("self/limits")).unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    soft.saturating_sub(512)
}

/// Reads the node and cgroups and turns counters into rates.
pub struct Collector {
    host: Host,
    proc_root: PathBuf,
    files: FastMap<String, Files>,
    tick_no: u64,
    node_prev: Option<(u64, NodeRaw)>,
    fd_budget: usize,
    fds_open: usize,
    buf: Vec<u8>,
    buf2: Vec<u8>,
}

/// Why one cgroup was not read this tick.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cgroup gone")]
    Vanished,
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: parse::ParseError,
    },
}

fn io_err(path: &Path, e: std::io::Error) -> ReadError {
    match e.raw_os_error() {
        _ if e.kind() == std::io::ErrorKind::NotFound => ReadError::Vanished,
        // ENODEV: a cgroup removed while its file was open
        Some(19) => ReadError::Vanished,
        _ => ReadError::Io {
            path: path.into(),
            source: e,
        },
    }
}

const READ_CHUNK: usize = 16 * 1024;

/// Reads `f` into `buf` and returns the length read: a `pread` at offset 0 on
/// the kept handle, or an open and read when the fd budget is spent. `buf`
/// keeps its full length between reads (no zero-fill per read); only its
/// first `len` bytes are the file.
fn read_file(
    f: &mut CFile,
    buf: &mut Vec<u8>,
    budget: usize,
    open: &mut usize,
) -> Result<usize, ReadError> {
    use std::os::unix::fs::FileExt;
    if buf.len() < READ_CHUNK {
        buf.resize(READ_CHUNK, 0);
    }
    let once;
    let (dir, name) = (&f.dir, f.name);
    let err = |e| io_err(&dir.join(name), e);
    let fd = match &mut f.fd {
        Some(fd) => &*fd,
        slot => {
            let fd = std::fs::File::open(dir.join(name)).map_err(err)?;
            if *open < budget {
                *open += 1;
                &*slot.insert(fd)
            } else {
                once = fd;
                &once
            }
        }
    };
    let mut len = 0;
    loop {
        let n = fd.read_at(&mut buf[len..], len as u64).map_err(err)?;
        len += n;
        if n == 0 || len < buf.len() {
            return Ok(len);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or("")
}

impl Collector {
    /// `host`: the cgroup layout (`Host::detect`); `proc_root`: `/proc`.
    pub fn new(host: Host, proc_root: &Path) -> Self {
        Self {
            host,
            proc_root: proc_root.into(),
            files: FastMap::default(),
            tick_no: 0,
            node_prev: None,
            fd_budget: fd_budget(Path::new("/proc")),
            fds_open: 0,
            buf: Vec::with_capacity(READ_CHUNK),
            buf2: Vec::with_capacity(READ_CHUNK),
        }
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Files kept open across ticks (at most the fd budget).
    pub fn open_files(&self) -> usize {
        self.fds_open
    }

    /// One tick at Unix time `ts`, monotonic `mono_ns`, over `targets`.
    pub fn tick(&mut self, ts: u32, mono_ns: u64, targets: &[Arc<Target>]) -> Tick {
        let mut t = Tick {
            ts,
            ..Default::default()
        };
        match self.read_node() {
            Ok(raw) => {
                t.node = self.node_samples(mono_ns, &raw);
                t.node_raw = Some(raw);
            }
            Err(e) => tracing::debug!(error = %e, "node metrics unreadable this tick"),
        }
        self.tick_no += 1;
        for target in targets {
            match self.read_cgroup(target, mono_ns) {
                Ok((raw, samples)) => t.readings.push(Reading {
                    target: target.clone(),
                    samples,
                    raw,
                }),
                Err(e) => {
                    if !matches!(e, ReadError::Vanished) {
                        tracing::debug!(entity = %target.entity, error = %e, "sample skipped");
                    }
                    self.forget(&target.entity);
                    t.skipped += 1;
                }
            }
        }
        // cgroups no longer asked for: their handles close
        let (tick, open) = (self.tick_no, &mut self.fds_open);
        self.files.retain(|_, f| {
            let keep = f.seen == tick;
            if !keep {
                *open -= f.open_fds();
            }
            keep
        });
        aggregate(&mut t);
        t
    }

    fn forget(&mut self, entity: &str) {
        if let Some(f) = self.files.remove(entity) {
            self.fds_open -= f.open_fds();
        }
    }

    /// A procfs file into `self.buf` (opened per read: three files per tick).
    fn read_proc(&mut self, path: &Path) -> Result<(), ReadError> {
        self.buf.clear(); // read_to_end appends; cgroup reads resize it again
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut self.buf))
            .map(|_| ())
            .map_err(|e| io_err(path, e))
    }

    fn read_node(&mut self) -> Result<NodeRaw, ReadError> {
        let p = self.proc_root.clone();
        let perr = |path: PathBuf| move |source| ReadError::Parse { path, source };
        self.read_proc(&p.join("stat"))?;
        let cpu = parse::proc_stat(text(&self.buf)).map_err(perr(p.join("stat")))?;
        self.read_proc(&p.join("meminfo"))?;
        let memory = parse::meminfo(text(&self.buf)).map_err(perr(p.join("meminfo")))?;
        self.read_proc(&p.join("loadavg"))?;
        let load = parse::loadavg(text(&self.buf)).map_err(perr(p.join("loadavg")))?;
        let mut psi = [None; 3];
        for (i, r) in ["cpu", "memory", "io"].iter().enumerate() {
            if self.read_proc(&p.join("pressure").join(r)).is_ok() {
                psi[i] = parse::psi(text(&self.buf)).ok();
            }
        }
        Ok(NodeRaw {
            cpu,
            memory,
            load,
            psi,
        })
    }

    fn files_of(&self, t: &Target) -> Result<Files, ReadError> {
        let h = |c: &str| -> Result<PathBuf, ReadError> {
            let root = self.host.hierarchy(c).ok_or(CgroupError::Unsupported {
                knob: "metrics",
                reason: "controller not mounted",
            })?;
            Ok(t.cgroup.under(root)?)
        };
        let cpu: Arc<Path> = h("cpu")?.into();
        if !cpu.is_dir() {
            return Err(ReadError::Vanished);
        }
        let some = |d: &Arc<Path>, f: &'static str| d.join(f).exists().then(|| CFile::new(d, f));
        Ok(if self.host.is_v2() {
            Files::new(
                CFile::new(&cpu, "cpu.stat"),
                None,
                [
                    CFile::new(&cpu, "memory.current"),
                    CFile::new(&cpu, "memory.stat"),
                ],
                some(&cpu, "memory.events"),
                some(&cpu, "io.stat").into_iter().collect(),
                ["cpu.pressure", "memory.pressure", "io.pressure"].map(|f| some(&cpu, f)),
            )
        } else {
            let memory: Arc<Path> = h("memory")?.into();
            let cpuacct: Arc<Path> = match h("cpuacct") {
                Ok(d) if *d != *cpu => d.into(),
                _ => cpu.clone(),
            };
            let io = match h("blkio") {
                Ok(b) => {
                    let b: Arc<Path> = b.into();
                    match (
                        some(&b, "blkio.throttle.io_service_bytes_recursive"),
                        some(&b, "blkio.throttle.io_serviced_recursive"),
                    ) {
                        (Some(x), Some(y)) => vec![x, y],
                        _ => Vec::new(),
                    }
                }
                Err(_) => Vec::new(),
            };
            Files::new(
                CFile::new(&cpu, "cpu.stat"),
                Some(CFile::new(&cpuacct, "cpuacct.usage")),
                [
                    CFile::new(&memory, "memory.usage_in_bytes"),
                    CFile::new(&memory, "memory.stat"),
                ],
                some(&memory, "memory.oom_control"),
                io,
                [None, None, None],
            )
        })
    }

    /// Reads one cgroup: its raw counters and the samples derived from them.
    #[allow(clippy::type_complexity)]
    fn read_cgroup(
        &mut self,
        t: &Target,
        mono_ns: u64,
    ) -> Result<(CgroupRaw, Vec<(Metric, f64)>), ReadError> {
        if !self.files.contains_key(&t.entity) {
            let f = self.files_of(t)?;
            self.files.insert(t.entity.clone(), f);
        }
        let v2 = self.host.is_v2();
        let (budget, open) = (self.fd_budget, &mut self.fds_open);
        let (buf, buf2) = (&mut self.buf, &mut self.buf2);
        let f = self.files.get_mut(&t.entity).expect("inserted above");
        f.seen = self.tick_no;
        let slow = f.reads.is_multiple_of(SLOW_EVERY);
        f.reads += 1;
        // a removed cgroup: the kernel answers ENODEV on kept handles; a
        // directory check now and then also covers plain file trees
        if slow && f.cpu_stat.fd.is_some() && !f.cpu_stat.dir.exists() {
            return Err(ReadError::Vanished);
        }
        let perr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReadError::Parse { path, source }
        };
        let mut raw = CgroupRaw::default();
        let mut rebase = Rebase::default();
        // v2's cpu.stat carries the usage: read every tick
        if v2 || !f.cpu_idle || slow || f.cpu_last.is_none() {
            let n = read_file(&mut f.cpu_stat, buf, budget, open)?;
            let c = parse::cpu_stat(text(&buf[..n]), v2).map_err(perr(&f.cpu_stat.path()))?;
            let (was_idle, same) = (f.cpu_idle, f.cpu_last == Some(c));
            rebase.cpu_stat = was_idle && !same;
            f.cpu_idle = !v2 && same;
            f.cpu_last = Some(c);
        }
        raw.cpu = f.cpu_last.unwrap_or_default();
        match &mut f.cpu_usage {
            Some(u) => {
                let n = read_file(u, buf, budget, open)?;
                raw.cpu_ns = parse::single(text(&buf[..n])).map_err(perr(&u.path()))?;
            }
            None => raw.cpu_ns = raw.cpu.usage_ns.unwrap_or(0),
        }
        let n = read_file(&mut f.mem_usage, buf, budget, open)?;
        let n2 = read_file(&mut f.mem_stat, buf2, budget, open)?;
        raw.memory = Some(
            parse::memory(text(&buf[..n]), text(&buf2[..n2]), v2)
                .map_err(perr(&f.mem_stat.path()))?,
        );
        if let (Some(e), true) = (&mut f.events, slow) {
            if let Ok(n) = read_file(e, buf, budget, open) {
                f.oom_kills = parse::oom_kills(text(&buf[..n]));
            }
        }
        raw.oom_kills = f.oom_kills;
        if !f.io_idle || slow || f.io_last.is_none() {
            let io = match f.io.as_mut_slice() {
                [stat] => read_file(stat, buf, budget, open)
                    .ok()
                    .map(|n| parse::io_stat_v2(text(&buf[..n]))),
                [bytes, ops] => match (
                    read_file(bytes, buf, budget, open),
                    read_file(ops, buf2, budget, open),
                ) {
                    (Ok(n), Ok(n2)) => Some(parse::blkio_v1(text(&buf[..n]), text(&buf2[..n2]))),
                    _ => None,
                },
                _ => None,
            };
            if let Some(io) = io {
                let same = f.io_last.as_deref() == Some(&io);
                rebase.io = f.io_idle && !same;
                f.io_idle = same;
                if !same {
                    f.io_last = Some(Arc::new(io));
                }
            }
        }
        raw.io = f.io_last.clone().unwrap_or_default();
        for (i, p) in f.psi.iter_mut().enumerate() {
            if let Some(p) = p {
                if let Ok(n) = read_file(p, buf, budget, open) {
                    raw.psi[i] = parse::psi(text(&buf[..n])).ok();
                }
            }
        }
        let samples = samples(&mut f.prev, mono_ns, &raw, rebase);
        Ok((raw, samples))
    }
}

/// Samples of one cgroup: gauges, and rates against `prev` (then replaced by now).
fn samples(
    prev: &mut Option<Prev>,
    mono_ns: u64,
    raw: &CgroupRaw,
    rebase: Rebase,
) -> Vec<(Metric, f64)> {
    let mut out = Vec::with_capacity(16);
    if let Some(m) = raw.memory {
        out.push((Metric::MemoryUsage, m.usage as f64));
        out.push((Metric::MemoryWorkingSet, m.working_set as f64));
        out.push((Metric::MemoryRss, m.rss as f64));
        out.push((Metric::MemoryCache, m.cache as f64));
    }
    if let Some(o) = raw.oom_kills {
        out.push((Metric::OomKills, o as f64));
    }
    let now = Prev {
        mono_ns,
        cpu_ns: raw.cpu_ns,
        cpu: raw.cpu,
        io: io_totals(&raw.io),
        psi: raw.psi,
    };
    let Some(prev) = prev.replace(now) else {
        return out;
    };
    let dt = mono_ns.saturating_sub(prev.mono_ns) as f64;
    if dt <= 0.0 {
        return out;
    }
    let p = &prev;
    // a counter that went backwards: the cgroup was recreated; rates restart next tick
    let reset = raw.cpu_ns < p.cpu_ns
        || raw.cpu.nr_periods < p.cpu.nr_periods
        || raw.cpu.nr_throttled < p.cpu.nr_throttled
        || raw.cpu.throttled_ns < p.cpu.throttled_ns;
    if reset {
        return out;
    }
    out.push((Metric::CpuUsage, (raw.cpu_ns - p.cpu_ns) as f64 / dt));
    if !rebase.cpu_stat {
        let periods = raw.cpu.nr_periods - p.cpu.nr_periods;
        out.push((
            Metric::CpuThrottledRatio,
            if periods == 0 {
                0.0
            } else {
                (raw.cpu.nr_throttled - p.cpu.nr_throttled) as f64 / periods as f64
            },
        ));
        out.push((
            Metric::CpuThrottledTime,
            (raw.cpu.throttled_ns - p.cpu.throttled_ns) as f64 / dt,
        ));
    }
    if let (Some(n), Some(b), false) = (now.io, p.io, rebase.io) {
        if let Some(io) = io_rates(n, b, dt) {
            out.extend(io);
        }
    }
    psi_rates(&raw.psi, &p.psi, dt, &mut out);
    out
}

impl Collector {
    fn node_samples(&mut self, mono_ns: u64, raw: &NodeRaw) -> Vec<(Metric, f64)> {
        let used = raw.memory.total.saturating_sub(raw.memory.available) as f64;
        let mut out = vec![
            (Metric::CpuCapacity, raw.cpu.cpus as f64),
            (Metric::MemoryTotal, raw.memory.total as f64),
            (Metric::MemoryAvailable, raw.memory.available as f64),
            (Metric::MemoryUsage, used),
            (Metric::MemoryWorkingSet, used),
            (Metric::MemoryCache, raw.memory.cached as f64),
            (Metric::Load1, raw.load[0]),
            (Metric::Load5, raw.load[1]),
            (Metric::Load15, raw.load[2]),
        ];
        if let Some((pm, p)) = self.node_prev.replace((mono_ns, raw.clone())) {
            let dt = mono_ns.saturating_sub(pm) as f64;
            let (dbusy, dtotal) = (
                raw.cpu.busy.checked_sub(p.cpu.busy),
                raw.cpu.total.checked_sub(p.cpu.total),
            );
            if let (Some(b), Some(t)) = (dbusy, dtotal) {
                if t > 0 {
                    out.push((
                        Metric::CpuUsage,
                        b as f64 / t as f64 * f64::from(raw.cpu.cpus.max(1)),
                    ));
                }
            }
            if dt > 0.0 {
                psi_rates(&raw.psi, &p.psi, dt, &mut out);
            }
        }
        out
    }
}

/// Read/write bytes and ops per second over all devices; `None` after a reset
/// (a counter went backwards, or a device went away).
fn io_rates(now: [u64; 4], prev: [u64; 4], dt_ns: f64) -> Option<[(Metric, f64); 4]> {
    let mut d = [0u64; 4];
    for i in 0..4 {
        d[i] = now[i].checked_sub(prev[i])?;
    }
    let s = dt_ns / 1e9;
    Some([
        (Metric::IoReadBytes, d[0] as f64 / s),
        (Metric::IoWriteBytes, d[1] as f64 / s),
        (Metric::IoReadOps, d[2] as f64 / s),
        (Metric::IoWriteOps, d[3] as f64 / s),
    ])
}

/// Stall share of time (µs stalled per µs) per resource; skipped on reset.
fn psi_rates(
    now: &[Option<Psi>; 3],
    prev: &[Option<Psi>; 3],
    dt_ns: f64,
    out: &mut Vec<(Metric, f64)>,
) {
    let dt_us = dt_ns / 1000.0;
    let names = [
        (Metric::PsiCpuSome, None),
        (Metric::PsiMemorySome, Some(Metric::PsiMemoryFull)),
        (Metric::PsiIoSome, Some(Metric::PsiIoFull)),
    ];
    for (i, (some, full)) in names.into_iter().enumerate() {
        let (Some(n), Some(p)) = (now[i], prev[i]) else {
            continue;
        };
        if let Some(d) = n.some_us.checked_sub(p.some_us) {
            out.push((some, (d as f64 / dt_us).min(1.0)));
        }
        if let (Some(full), Some(nf), Some(pf)) = (full, n.full_us, p.full_us) {
            if let Some(d) = nf.checked_sub(pf) {
                out.push((full, (d as f64 / dt_us).min(1.0)));
            }
        }
    }
}

/// System (node minus pods) and BE aggregates from the pod readings.
fn aggregate(t: &mut Tick) {
    let pods = t.readings.iter().filter(|r| r.target.kind == Kind::Pod);
    let (mut cpu, mut mem, mut be_cpu, mut be_mem, mut be_pods) = (0.0, 0.0, 0.0, 0.0, 0usize);
    let mut cpu_known = true;
    for r in pods {
        let c = get(&r.samples, Metric::CpuUsage);
        cpu_known &= c.is_some();
        let m = get(&r.samples, Metric::MemoryWorkingSet).unwrap_or(0.0);
        cpu += c.unwrap_or(0.0);
        mem += m;
        if r.target.qos_class == "BE" {
            be_cpu += c.unwrap_or(0.0);
            be_mem += m;
            be_pods += 1;
        }
    }
    if let Some(n) = get(&t.node, Metric::MemoryWorkingSet) {
        t.system
            .push((Metric::MemoryWorkingSet, (n - mem).max(0.0)));
    }
    if let (Some(n), true) = (get(&t.node, Metric::CpuUsage), cpu_known) {
        t.system.push((Metric::CpuUsage, (n - cpu).max(0.0)));
        t.be.push((Metric::CpuUsage, be_cpu));
    }
    if be_pods > 0 || cpu_known {
        t.be.push((Metric::MemoryWorkingSet, be_mem));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str, files: &[(&str, String)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for (p, c) in files {
            let f = d.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, c).unwrap();
        }
        d
    }

    fn put(d: &Path, p: &str, c: impl ToString) {
        std::fs::write(d.join(p), c.to_string()).unwrap();
    }

    fn proc_files(busy: u64, idle: u64) -> Vec<(&'static str, String)> {
        vec![
            ("proc/stat", format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")),
            ("proc/meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\nCached: 200 kB\n".into()),
            ("proc/loadavg", "1.50 1.00 0.50 2/100 1234\n".into()),
            ("proc/pressure/cpu", "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".into()),
        ]
    }

    fn target(entity: &str, kind: Kind, cg: &str, class: &str) -> Target {
        Target {
            entity: entity.into(),
            kind,
            cgroup: CgroupPath::parse(cg).unwrap(),
            namespace: "ns".into(),
            pod: "p".into(),
            container: if kind == Kind::Container {
                "c".into()
            } else {
                String::new()
            },
            qos_class: class.into(),
            pod_entity: "pod/p".into(),
        }
    }

    fn v1_cgroup(
        cg: &str,
        cpu_ns: u64,
        periods: u64,
        throttled: u64,
        usage: u64,
    ) -> Vec<(String, String)> {
        vec![
            (
                format!("cg/cpu/{cg}/cpu.stat"),
                format!(
                    "nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {}\n",
                    throttled * 1_000_000
                ),
            ),
            (
                format!("cg/cpuacct/{cg}/cpuacct.usage"),
                format!("{cpu_ns}\n"),
            ),
            (
                format!("cg/memory/{cg}/memory.usage_in_bytes"),
                format!("{usage}\n"),
            ),
            (
                format!("cg/memory/{cg}/memory.stat"),
                format!(
                    "total_cache {}\ntotal_rss {}\ntotal_inactive_file {}\n",
                    usage / 4,
                    usage / 2,
                    usage / 8
                ),
            ),
            (
                format!("cg/memory/{cg}/memory.oom_control"),
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n".into(),
            ),
            (
                format!("cg/blkio/{cg}/blkio.throttle.io_service_bytes_recursive"),
                format!("254:0 Read {}\n254:0 Write 0\nTotal 0\n", cpu_ns / 1000),
            ),
            (
                format!("cg/blkio/{cg}/blkio.throttle.io_serviced_recursive"),
                "254:0 Read 10\n254:0 Write 0\nTotal 10\n".into(),
            ),
        ]
    }

    fn v1_host(d: &Path) -> Host {
        for c in ["cpu", "cpuacct", "memory", "blkio"] {
            std::fs::create_dir_all(d.join("cg").join(c)).unwrap();
            put(d, &format!("cg/{c}/cgroup.procs"), "");
        }
        Host::detect(&d.join("cg")).unwrap()
    }

    #[test]
    fn v1_rates_aggregates_and_bad_input() {
        let mut files: Vec<(String, String)> = proc_files(100, 100)
            .into_iter()
            .map(|(a, b)| (a.to_string(), b))
            .collect();
        files.extend(v1_cgroup("kubepods/be1", 0, 0, 0, 64 << 20));
        files.extend(v1_cgroup("kubepods/be1/c1", 0, 0, 0, 60 << 20));
        files.extend(v1_cgroup("kubepods/ls1", 0, 0, 0, 32 << 20));
        let refs: Vec<(&str, String)> =
            files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        let d = tree("v1", &refs);
        let mut c = Collector::new(v1_host(&d), &d.join("proc"));
        let targets = vec![
            target("pod/be1", Kind::Pod, "/kubepods/be1", "BE"),
            target("container/c1", Kind::Container, "/kubepods/be1/c1", "BE"),
            target("pod/ls1", Kind::Pod, "/kubepods/ls1", "LS"),
            // a container whose cgroup is gone (or never was)
            target(
                "container/ghost",
                Kind::Container,
                "/kubepods/be1/ghost",
                "BE",
            ),
        ]
        .into_iter()
        .map(Arc::new)
        .collect::<Vec<_>>();
        let t = c.tick(1000, 0, &targets);
        assert_eq!(t.readings.len(), 3);
        assert_eq!(t.skipped, 1, "the ghost");
        let be = &t.readings[0].samples;
        assert_eq!(get(be, Metric::MemoryUsage), Some((64u64 << 20) as f64));
        assert_eq!(
            get(be, Metric::MemoryWorkingSet),
            Some((56u64 << 20) as f64)
        );
        assert_eq!(get(be, Metric::OomKills), Some(1.0));
        assert_eq!(get(be, Metric::CpuUsage), None, "no rate on the first tick");

        // one second later: be1 used 0.5 s of CPU, 40 of 100 periods throttled
        for (p, v) in v1_cgroup("kubepods/be1", 500_000_000, 100, 40, 64 << 20) {
            put(&d, &p, v);
        }
        for (p, v) in v1_cgroup("kubepods/ls1", 600_000_000, 0, 0, 32 << 20) {
            put(&d, &p, v);
        }
        // node: 2 CPUs, busy 3 of 4 ticks -> 1.5 cores
        put(
            &d,
            "proc/stat",
            "cpu  103 0 0 101 0 0 0 0 0 0\ncpu0 0\ncpu1 0\n",
        );
        put(
            &d,
            "proc/pressure/cpu",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=251000\n",
        );
        let t = c.tick(1001, 1_000_000_000, &targets);
        assert_eq!(t.skipped, 1);
        assert_eq!(t.readings.len(), 3);
        let be = &t.readings[0].samples;
        assert!((get(be, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9);
        assert!((get(be, Metric::CpuThrottledRatio).unwrap() - 0.4).abs() < 1e-9);
        assert!((get(be, Metric::CpuThrottledTime).unwrap() - 0.04).abs() < 1e-9);
        assert!((get(be, Metric::IoReadBytes).unwrap() - 500_000.0).abs() < 1e-6);
        assert_eq!(get(be, Metric::IoReadOps), Some(0.0));
        assert!((get(&t.node, Metric::CpuUsage).unwrap() - 1.5).abs() < 1e-9);
        assert!((get(&t.node, Metric::PsiCpuSome).unwrap() - 0.25).abs() < 1e-9);
        assert_eq!(get(&t.node, Metric::CpuCapacity), Some(2.0));
        assert_eq!(get(&t.node, Metric::MemoryUsage), Some(600.0 * 1024.0));
        assert_eq!(get(&t.node, Metric::Load1), Some(1.5));
        // system = node - pods; BE = BE pods
        assert!((get(&t.system, Metric::CpuUsage).unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(
            get(&t.system, Metric::MemoryWorkingSet),
            Some(600.0 * 1024.0 - ((56u64 << 20) + (28u64 << 20)) as f64).map(|v| v.max(0.0))
        );
        assert!((get(&t.be, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(
            get(&t.be, Metric::MemoryWorkingSet),
            Some((56u64 << 20) as f64)
        );

        // a counter reset (cgroup recreated): no rate this tick, no spike
        for (p, v) in v1_cgroup("kubepods/be1", 1_000, 1, 0, 64 << 20) {
            put(&d, &p, v);
        }
        // a malformed file: that entity is skipped
        put(&d, "cg/memory/kubepods/ls1/memory.stat", "garbage");
        let t = c.tick(1002, 2_000_000_000, &targets);
        assert_eq!(t.readings.len(), 2, "ls1 skipped");
        assert!(t.readings.iter().all(|r| r.target.entity != "pod/ls1"));
        assert_eq!(get(&t.readings[0].samples, Metric::CpuUsage), None);
        assert_eq!(
            get(&t.readings[0].samples, Metric::MemoryUsage),
            Some((64u64 << 20) as f64)
        );
        // next tick rates resume from the new base
        for (p, v) in v1_cgroup("kubepods/be1", 250_001_000, 11, 0, 64 << 20) {
            put(&d, &p, v);
        }
        let t = c.tick(1003, 3_000_000_000, &targets);
        assert!((get(&t.readings[0].samples, Metric::CpuUsage).unwrap() - 0.25).abs() < 1e-9);
        assert!(c.open_files() > 0, "handles are kept across ticks");

        // a container removed while its files are open: the kernel answers ENODEV
        // at once; on a file tree the directory check finds it within SLOW_EVERY ticks
        std::fs::remove_dir_all(d.join("cg/cpu/kubepods/be1/c1")).unwrap();
        let open = c.open_files();
        let gone = (4..4 + SLOW_EVERY as u32 + 1).any(|i| {
            let t = c.tick(1000 + i, u64::from(i) * 1_000_000_000, &targets);
            t.readings.iter().all(|r| r.target.entity != "container/c1")
        });
        assert!(gone, "the removed container is skipped");
        assert!(c.open_files() < open, "and its handles closed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Counters that stand still (no quota, no I/O) are re-read every SLOW_EVERY
    /// ticks; when they move again, the first delta (spanning several ticks)
    /// yields no rate, so there is no spike; afterwards rates are exact.
    #[test]
    fn idle_counters_are_reread_slowly_without_spikes() {
        let mut files: Vec<(String, String)> = proc_files(100, 100)
            .into_iter()
            .map(|(a, b)| (a.to_string(), b))
            .collect();
        files.extend(v1_cgroup("kubepods/idle", 0, 0, 0, 1 << 20));
        let refs: Vec<(&str, String)> =
            files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        let d = tree("idle", &refs);
        let mut c = Collector::new(v1_host(&d), &d.join("proc"));
        let targets = vec![Arc::new(target("pod/i", Kind::Pod, "/kubepods/idle", "LS"))];
        let sec = 1_000_000_000u64;
        // cpuacct.usage moves every tick; cpu.stat and I/O stand still
        let mut n = 0u64;
        let mut tick = |c: &mut Collector, usage: u64| {
            n += 1;
            put(&d, "cg/cpuacct/kubepods/idle/cpuacct.usage", usage);
            c.tick(1000 + n as u32, n * sec, &targets)
        };
        for i in 0..3 {
            tick(&mut c, i * 1000);
        }
        // a quota is set and I/O starts: counters jump between slow re-reads
        let stat = |p: u64, t: u64| {
            format!(
                "nr_periods {p}\nnr_throttled {t}\nthrottled_time {}\n",
                t * 10_000_000
            )
        };
        put(&d, "cg/cpu/kubepods/idle/cpu.stat", stat(1000, 500));
        put(
            &d,
            "cg/blkio/kubepods/idle/blkio.throttle.io_service_bytes_recursive",
            "254:0 Read 1000000000\n254:0 Write 0\nTotal 0\n",
        );
        let mut reread = false;
        for i in 3..(3 + SLOW_EVERY + 1) {
            let t = tick(&mut c, i * 1000);
            let s = &t.readings[0].samples;
            for m in [Metric::CpuThrottledTime, Metric::IoReadBytes] {
                assert!(
                    get(s, m).unwrap_or(0.0) <= 0.0,
                    "no spike from {m:?}: {s:?}"
                );
            }
            if t.readings[0].raw.cpu.nr_periods == 1000 {
                reread = true;
                break;
            }
        }
        assert!(reread, "re-read within SLOW_EVERY ticks");
        // moving now: read every tick, exact rates
        put(&d, "cg/cpu/kubepods/idle/cpu.stat", stat(1010, 505));
        let t = tick(&mut c, 99_000);
        let s = &t.readings[0].samples;
        assert_eq!(get(s, Metric::CpuThrottledRatio), Some(0.5));
        assert!((get(s, Metric::CpuThrottledTime).unwrap() - 0.05).abs() < 1e-9);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn v2_cgroups_with_psi_and_io() {
        let cg = "kubepods.slice/kubepods-pod1.slice";
        let files = |usage_usec: u64, some: u64, rbytes: u64| -> Vec<(String, String)> {
            vec![
                ("cg/cgroup.controllers".into(), "cpu io memory pids\n".into()),
                (format!("cg/{cg}/cpu.stat"), format!("usage_usec {usage_usec}\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")),
                (format!("cg/{cg}/memory.current"), "1048576\n".into()),
                (format!("cg/{cg}/memory.stat"), "anon 524288\nfile 262144\ninactive_file 131072\n".into()),
                (format!("cg/{cg}/memory.events"), "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n".into()),
                (format!("cg/{cg}/io.stat"), format!("8:0 rbytes={rbytes} wbytes=0 rios=0 wios=0 dbytes=0 dios=0\n")),
                (format!("cg/{cg}/cpu.pressure"), format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")),
                (format!("cg/{cg}/memory.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".into()),
            ]
        };
        let mut all: Vec<(String, String)> = proc_files(0, 100)
            .into_iter()
            .map(|(a, b)| (a.to_string(), b))
            .collect();
        all.extend(files(1_000_000, 0, 0));
        let refs: Vec<(&str, String)> = all.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        let d = tree("v2", &refs);
        let mut c = Collector::new(Host::detect(&d.join("cg")).unwrap(), &d.join("proc"));
        let targets = vec![Arc::new(target(
            "pod/1",
            Kind::Pod,
            &format!("/{cg}"),
            "LS",
        ))];
        c.tick(10, 0, &targets);
        for (p, v) in files(3_000_000, 100_000, 4096) {
            put(&d, &p, v);
        }
        let t = c.tick(12, 2_000_000_000, &targets);
        let s = &t.readings[0].samples;
        assert!(
            (get(s, Metric::CpuUsage).unwrap() - 1.0).abs() < 1e-9,
            "2 s of CPU in 2 s"
        );
        assert_eq!(get(s, Metric::MemoryWorkingSet), Some(1048576.0 - 131072.0));
        assert_eq!(get(s, Metric::MemoryRss), Some(524288.0));
        assert!((get(s, Metric::PsiCpuSome).unwrap() - 0.05).abs() < 1e-9);
        assert_eq!(get(s, Metric::PsiMemoryFull), Some(0.0));
        assert_eq!(get(s, Metric::IoReadBytes), Some(2048.0));
        assert_eq!(get(s, Metric::OomKills), Some(0.0));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cpi_is_reported_unavailable_without_a_pmu() {
        let d = tree(
            "sys",
            &[("bus/event_source/devices/software/type", "1\n".into())],
        );
        assert!(cpi_status(&d).contains("no hardware PMU"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
