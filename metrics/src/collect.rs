//! Collectors: every tick, the node (procfs) and each pod's and container's
//! cgroup (v1 or v2) are read, and counters become rates.
//!
//! Roots are injected (`/proc` and the cgroup host, kernel-shaped trees in
//! tests). A cgroup that vanished mid-read (a container gone) or a malformed
//! file skips that entity's sample for this tick; a counter that went
//! backwards (a cgroup recreated under the same name) restarts the rate, so
//! there is never a bogus spike.
//!
//! No movement is lost: each cgroup's rates use the monotonic instant of its
//! own read (a slow pass over a thousand cgroups skews none of them), and a
//! counter is left unread only while it is known to stand still (v1 throttling
//! and I/O while the cgroup's CPU usage does not move; on v2 I/O also needs no
//! dirty or writeback pages, as writeback goes on while the tasks sleep). A
//! rate divides by the time since the counter was last read or known still;
//! a counter that moved although it was believed still (seen on the slow
//! re-read every [`SLOW_EVERY`] ticks) is averaged over the whole time since
//! its last read: never a spike, never a dropped delta.
//!
//! System and BE figures come from the kube QoS cgroups ([`Groups`]): system
//! = node − the pods' root cgroup, BE = the besteffort cgroup, not a sum over
//! the pods that happened to have a rate this tick.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qoslet_cgroups::{CgroupError, CgroupPath, Host};

use crate::fasthash::FastMap;
use crate::metric::{sample as get, Metric};
use crate::parse::{self, CpuStat, Devices, Memory, Psi};

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
    /// Per device.
    pub io: Devices,
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
    /// Series time (see [`crate::clock`]): Unix seconds as of the anchor,
    /// monotonic since.
    pub ts: u32,
    /// The wall clock when the tick was read (Unix seconds).
    pub wall: u32,
    pub node: Vec<(Metric, f64)>,
    pub node_raw: Option<NodeRaw>,
    pub readings: Vec<Reading>,
    /// Node minus all pods (cpu cores, memory bytes).
    pub system: Vec<(Metric, f64)>,
    /// All BE pods together.
    pub be: Vec<(Metric, f64)>,
    /// The pods' root cgroup (every pod), when its QoS groups are known.
    pub pods_root: Vec<(Metric, f64)>,
    /// Entities skipped this tick (vanished or unreadable).
    pub skipped: usize,
}

/// Where a consumer of the collector's ticks (the QoS engine) reads them: the
/// latest tick, and a wake-up after each new one.
pub trait Ticks: Send + Sync + 'static {
    fn latest(&self) -> Option<Arc<Tick>>;
    /// Resolves after the next tick; a tick published after this call (even
    /// before the future is first polled) wakes it.
    fn ticked(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
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

/// What is read every tick, as last read.
#[derive(Debug, Clone, Copy)]
struct Prev {
    mono_ns: u64,
    cpu_ns: u64,
    psi: [Option<Psi>; 3],
}

/// A counter read only when it may have moved.
#[derive(Debug, Clone)]
struct Counter<T> {
    value: T,
    /// Until when the value is known to hold: its read, or a later tick at
    /// which it was proven to stand still.
    known_at: u64,
    /// Left unread at a tick where it may have moved: until it is read, a
    /// later proof of stillness says nothing about that stretch, so `known_at`
    /// stays where it was (else the stretch's movement, found later, would be
    /// charged to the ticks after the proof: a spike).
    pending: bool,
}

/// Advances a counter to instant `at`: with `read` (a fresh value) or without.
/// Returns the previous value and the nanoseconds the delta spans (`None` on
/// the first read). Unread, it is `proven` still (v1: the cgroup did not run)
/// or only believed still: a later read's delta spans the time since it was
/// last read or proven still, so movement that the belief missed is averaged
/// over that time, never charged to one tick (no spike).
fn step<T: PartialEq + Clone>(
    c: &mut Option<Counter<T>>,
    read: Option<T>,
    at: u64,
    proven: bool,
) -> Option<(T, u64)> {
    let Some(cur) = c.as_mut() else {
        *c = read.map(|value| Counter {
            value,
            known_at: at,
            pending: false,
        });
        return None;
    };
    let dt = at.saturating_sub(cur.known_at);
    match read {
        None => {
            if !proven {
                cur.pending = true;
            } else if !cur.pending {
                cur.known_at = at;
            }
            Some((cur.value.clone(), dt))
        }
        Some(v) => {
            let prev = std::mem::replace(&mut cur.value, v);
            cur.known_at = at;
            cur.pending = false;
            Some((prev, dt))
        }
    }
}

fn io_totals(io: &Devices) -> Option<[u64; 4]> {
    // no device yet (a fresh v2 cgroup's empty io.stat) is zero, not unknown
    Some({
        io.iter().fold([0u64; 4], |a, (_, i)| {
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
    /// v1 cpu.stat (periods, throttling): read when the CPU usage moved.
    stat: Option<Counter<CpuStat>>,
    /// I/O counters: read when the CPU usage moved (or, v2, pages are dirty).
    io_counters: Option<Counter<Devices>>,
    /// memory.stat as read the previous tick (its page-in signs).
    mem_prev: Option<Memory>,
    /// Whether the I/O counters moved at their last read (kept read every
    /// tick while the cgroup runs, until they stand still).
    io_moving: bool,
    /// What was read the previous tick (usage, pressure).
    prev: Option<Prev>,
}

/// Rarely-changing files (OOM kill counts), the counters believed still, and
/// the removed-cgroup check on file trees are read every this many ticks.
const SLOW_EVERY: u64 = 10;

/// A cgroup's first reads, during which cpu.stat is read whenever the CPU usage
/// moved even without periods counted yet (a container with a quota that has
/// not run a full period at its first read).
const QUOTA_UNKNOWN_READS: u64 = 3;

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
            stat: None,
            io_counters: None,
            mem_prev: None,
            io_moving: false,
            prev: None,
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

/// The kube QoS cgroups the node's aggregates come from (`None`: no pods known,
/// so nothing runs in them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    /// The pods' root (`kubepods`, `kubepods.slice`).
    pub pods: Option<CgroupPath>,
    /// The besteffort QoS cgroup.
    pub besteffort: Option<CgroupPath>,
}

/// A monotonic clock in nanoseconds (injected in tests).
pub type Clock = Box<dyn FnMut() -> u64 + Send>;

fn real_clock() -> Clock {
    let start = std::time::Instant::now();
    Box::new(move || start.elapsed().as_nanos() as u64)
}

/// One target's files, in the order of the last tick's targets.
struct Slot {
    target: Arc<Target>,
    files: Option<Files>,
}

/// Reads the node and cgroups and turns counters into rates.
pub struct Collector {
    host: Host,
    proc_root: PathBuf,
    /// The targets' files, in the order they were last asked for: a tick over
    /// the same targets (the store unchanged) finds each by position, without
    /// hashing and comparing its name (cold in cache after a second).
    slots: Vec<Slot>,
    /// The QoS groups' files, by name.
    groups_files: FastMap<&'static str, Files>,
    tick_no: u64,
    node_prev: Option<(u64, NodeRaw)>,
    fd_budget: usize,
    fds_open: usize,
    buf: Vec<u8>,
    buf2: Vec<u8>,
    clock: Clock,
    /// The tick's monotonic instant and the clock's reading when it began.
    tick_mono: u64,
    tick_clock: u64,
    groups: Groups,
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
            let fd = open_noatime(&dir.join(name)).map_err(err)?;
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

/// Opens read-only without updating the access time where the caller may
/// (root, the owner): a read is then no inode write (tmpfs trees, and any
/// filesystem that keeps atimes); elsewhere a plain open.
fn open_noatime(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(p)
    {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => std::fs::File::open(p),
        r => r,
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
            slots: Vec::new(),
            groups_files: FastMap::default(),
            tick_no: 0,
            node_prev: None,
            fd_budget: fd_budget(Path::new("/proc")),
            fds_open: 0,
            buf: Vec::with_capacity(READ_CHUNK),
            buf2: Vec::with_capacity(READ_CHUNK),
            clock: real_clock(),
            tick_mono: 0,
            tick_clock: 0,
            groups: Groups::default(),
        }
    }

    /// The same collector on another clock (tests: a read pass that takes time).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The kube QoS cgroups for system and BE figures (from the pods' paths).
    pub fn set_groups(&mut self, groups: Groups) {
        self.groups = groups;
    }

    /// The monotonic instant now, on the tick's time line.
    fn at(&mut self) -> u64 {
        let elapsed = (self.clock)().saturating_sub(self.tick_clock);
        self.tick_mono.saturating_add(elapsed)
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Files kept open across ticks (at most the fd budget).
    pub fn open_files(&self) -> usize {
        self.fds_open
    }

    /// One tick at Unix time `ts`, monotonic `mono_ns` (when it begins), over
    /// `targets`. Each cgroup's rates use the instant of its own read.
    pub fn tick(&mut self, ts: u32, mono_ns: u64, targets: &[Arc<Target>]) -> Tick {
        let mut t = Tick {
            ts,
            ..Default::default()
        };
        self.tick_mono = mono_ns;
        self.tick_clock = (self.clock)();
        let at = self.at();
        match self.read_node() {
            Ok(raw) => {
                t.node = self.node_samples(at, &raw);
                t.node_raw = Some(raw);
            }
            Err(e) => tracing::debug!(error = %e, "node metrics unreadable this tick"),
        }
        self.tick_no += 1;
        // the QoS groups right after the node, so their figures and the node's
        // span the same time; a group no longer asked for closes its files
        let groups = self.groups.clone();
        let mut old = std::mem::take(&mut self.groups_files);
        let mut group = |c: &mut Self, name: &'static str, cg: &Option<CgroupPath>| {
            let cg = cg.as_ref()?;
            let target = Target {
                entity: format!("group/{name}"),
                kind: Kind::Pod,
                cgroup: cg.clone(),
                namespace: String::new(),
                pod: String::new(),
                container: String::new(),
                qos_class: String::new(),
                pod_entity: String::new(),
            };
            let at = c.at();
            let mut slot = old.remove(name);
            let r = c.read_cgroup(&mut slot, &target, at);
            if let Some(f) = slot {
                c.groups_files.insert(name, f);
            }
            match r {
                Ok((_, samples)) => Some(samples),
                Err(e) => {
                    tracing::debug!(group = name, error = %e, "QoS group unreadable this tick");
                    None
                }
            }
        };
        let pods_group = group(self, "pods", &groups.pods);
        let be_group = group(self, "besteffort", &groups.besteffort);
        for (_, f) in old {
            self.fds_open -= f.open_fds();
        }
        let same = self.slots.len() == targets.len()
            && self
                .slots
                .iter()
                .zip(targets)
                .all(|(s, t)| Arc::ptr_eq(&s.target, t));
        if !same {
            self.reslot(targets);
        }
        let mut slots = std::mem::take(&mut self.slots);
        t.readings.reserve(slots.len());
        for slot in &mut slots {
            let at = self.at();
            match self.read_cgroup(&mut slot.files, &slot.target, at) {
                Ok((raw, samples)) => t.readings.push(Reading {
                    target: slot.target.clone(),
                    samples,
                    raw,
                }),
                Err(e) => {
                    if !matches!(e, ReadError::Vanished) {
                        tracing::debug!(entity = %slot.target.entity, error = %e, "sample skipped");
                    }
                    t.skipped += 1;
                }
            }
        }
        self.slots = slots;
        aggregate(&mut t, &groups, pods_group.as_deref(), be_group.as_deref());
        t
    }

    /// Lines the slots up with `targets`: each keeps its files by entity
    /// name; the files of a cgroup no longer asked for close.
    fn reslot(&mut self, targets: &[Arc<Target>]) {
        let mut by_name: FastMap<String, Files> = FastMap::default();
        for s in self.slots.drain(..) {
            if let Some(f) = s.files {
                // a name given twice (a bad inventory): one set of files
                // stays, the other closes
                if let Some(twice) = by_name.insert(s.target.entity.clone(), f) {
                    self.fds_open -= twice.open_fds();
                }
            }
        }
        self.slots = targets
            .iter()
            .map(|t| Slot {
                target: t.clone(),
                files: by_name.remove(&t.entity),
            })
            .collect();
        for (_, f) in by_name {
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
    /// A cgroup that could not be read leaves `slot` empty (its files closed):
    /// the next read finds its files again.
    #[allow(clippy::type_complexity)]
    fn read_cgroup(
        &mut self,
        slot: &mut Option<Files>,
        t: &Target,
        at: u64,
    ) -> Result<(CgroupRaw, Vec<(Metric, f64)>), ReadError> {
        let r = self.read_cgroup_files(slot, t, at);
        if r.is_err() {
            if let Some(f) = slot.take() {
                self.fds_open -= f.open_fds();
            }
        }
        r
    }

    #[allow(clippy::type_complexity)]
    fn read_cgroup_files(
        &mut self,
        slot: &mut Option<Files>,
        t: &Target,
        at: u64,
    ) -> Result<(CgroupRaw, Vec<(Metric, f64)>), ReadError> {
        let f = match slot {
            Some(f) => f,
            None => slot.insert(self.files_of(t)?),
        };
        let v2 = self.host.is_v2();
        let (budget, open) = (self.fd_budget, &mut self.fds_open);
        let (buf, buf2) = (&mut self.buf, &mut self.buf2);
        let slow = f.reads.is_multiple_of(SLOW_EVERY);
        f.reads += 1;
        // a removed cgroup: the kernel answers ENODEV on kept handles; on
        // plain file trees a kept file that was unlinked (its cgroup removed,
        // or removed and made again) is found now and then (an fstat, no walk
        // of the path)
        if slow {
            use std::os::unix::fs::MetadataExt;
            if let Some(fd) = &f.cpu_stat.fd {
                if fd.metadata().is_ok_and(|m| m.nlink() == 0) {
                    return Err(ReadError::Vanished);
                }
            }
        }
        // the path is built only when a parse fails (not on every read)
        let perr = |f: &CFile| {
            let (dir, name) = (f.dir.clone(), f.name);
            move |source| ReadError::Parse {
                path: dir.join(name),
                source,
            }
        };
        let mut raw = CgroupRaw::default();
        let prev_usage = f.prev.map(|p| p.cpu_ns);
        // the CPU usage first: whether it moved decides what else is read
        let (usage, stat) = match &mut f.cpu_usage {
            Some(u) => {
                let n = read_file(u, buf, budget, open)?;
                (parse::single(&buf[..n]).map_err(perr(u))?, None)
            }
            // v2: the usage is in cpu.stat, read every tick
            None => {
                let n = read_file(&mut f.cpu_stat, buf, budget, open)?;
                let c = parse::cpu_stat(&buf[..n], v2).map_err(perr(&f.cpu_stat))?;
                (c.usage_ns.unwrap_or(0), Some(c))
            }
        };
        let moved = prev_usage != Some(usage);
        // v1 cpu.stat: its periods and throttling move only while the cgroup
        // runs with a CFS quota (periods are counted only then: none so far, no
        // quota; one set later is found on the slow re-read)
        let quota = f.stat.as_ref().is_some_and(|c| c.value.nr_periods > 0)
            || f.reads <= QUOTA_UNKNOWN_READS;
        let stat = match stat {
            Some(c) => Some(c),
            None if (moved && quota) || slow || f.stat.is_none() => {
                let n = read_file(&mut f.cpu_stat, buf, budget, open)?;
                Some(parse::cpu_stat(&buf[..n], v2).map_err(perr(&f.cpu_stat))?)
            }
            None => None,
        };
        let throttle = step(&mut f.stat, stat, at, !moved);
        raw.cpu = f.stat.as_ref().map(|c| c.value).unwrap_or_default();
        raw.cpu_ns = usage;
        let n = read_file(&mut f.mem_usage, buf, budget, open)?;
        let n2 = read_file(&mut f.mem_stat, buf2, budget, open)?;
        let memory = parse::memory(&buf[..n], &buf2[..n2], v2).map_err(perr(&f.mem_stat))?;
        raw.memory = Some(memory);
        if let (Some(e), true) = (&mut f.events, slow) {
            if let Ok(n) = read_file(e, buf, budget, open) {
                f.oom_kills = parse::oom_kills(&buf[..n]);
            }
        }
        raw.oom_kills = f.oom_kills;
        // v1: I/O is issued by running tasks (writeback is charged to the root),
        // and a task that reads from disk leaves signs in memory.stat: pages
        // charged, major faults, a page cache that changed, dirty pages to sync.
        // Counters still moving at their last read are read while the tasks
        // run. Direct I/O into buffers already allocated leaves no sign: it is
        // found on the slow re-read, averaged over the time since the last read.
        let signs = match f.mem_prev.replace(memory) {
            Some(p) => {
                memory.pgpgin != p.pgpgin
                    || memory.pgmajfault != p.pgmajfault
                    || memory.cache != p.cache
                    || memory.dirty > 0
            }
            None => true,
        };
        // v2: read every tick (one file; writeback, swap-out and reclaim are
        // charged to the cgroup while its tasks sleep)
        let wanted = v2 || signs || (moved && f.io_moving);
        let io = if wanted || slow || f.io_counters.is_none() {
            match f.io.as_mut_slice() {
                [stat] => read_file(stat, buf, budget, open)
                    .ok()
                    .map(|n| parse::io_stat_v2(&buf[..n])),
                [bytes, ops] => match (
                    read_file(bytes, buf, budget, open),
                    read_file(ops, buf2, budget, open),
                ) {
                    (Ok(n), Ok(n2)) => Some(parse::blkio_v1(&buf[..n], &buf2[..n2])),
                    _ => None,
                },
                _ => None,
            }
        } else {
            None
        };
        // an unreadable I/O file is not "still": no I/O rate this tick
        let io_unreadable = io.is_none() && (wanted || slow);
        if let (Some(now), Some(c)) = (&io, &f.io_counters) {
            f.io_moving = *now != c.value;
        }
        let io_step = if io_unreadable {
            None
        } else {
            step(&mut f.io_counters, io, at, !moved)
        };
        raw.io = f
            .io_counters
            .as_ref()
            .map(|c| c.value.clone())
            .unwrap_or_default();
        for (i, p) in f.psi.iter_mut().enumerate() {
            if let Some(p) = p {
                if let Ok(n) = read_file(p, buf, budget, open) {
                    raw.psi[i] = parse::psi(text(&buf[..n])).ok();
                }
            }
        }
        let mut samples = samples(&mut f.prev, at, &raw);
        if let Some((p, dt)) = throttle {
            throttle_rates(&raw.cpu, &p, dt, &mut samples);
        }
        if let Some((p, dt)) = io_step {
            if let (Some(n), Some(b)) = (io_totals(&raw.io), io_totals(&p)) {
                if let Some(io) = io_rates(n, b, dt as f64) {
                    samples.extend(io);
                }
            }
        }
        Ok((raw, samples))
    }
}

/// Throttled share of periods and throttled time per second, over `dt_ns`
/// since `p`; nothing on a reset (the cgroup recreated).
fn throttle_rates(now: &CpuStat, p: &CpuStat, dt_ns: u64, out: &mut Vec<(Metric, f64)>) {
    let (Some(periods), Some(throttled), Some(time)) = (
        now.nr_periods.checked_sub(p.nr_periods),
        now.nr_throttled.checked_sub(p.nr_throttled),
        now.throttled_ns.checked_sub(p.throttled_ns),
    ) else {
        return;
    };
    out.push((
        Metric::CpuThrottledRatio,
        if periods == 0 {
            0.0
        } else {
            (throttled as f64 / periods as f64).min(1.0)
        },
    ));
    if dt_ns > 0 {
        out.push((Metric::CpuThrottledTime, time as f64 / dt_ns as f64));
    } else if time == 0 {
        out.push((Metric::CpuThrottledTime, 0.0));
    }
}

/// Samples of one cgroup: gauges, and the CPU usage and pressure rates against
/// `prev` (then replaced by now).
fn samples(prev: &mut Option<Prev>, mono_ns: u64, raw: &CgroupRaw) -> Vec<(Metric, f64)> {
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
        psi: raw.psi,
    };
    let Some(p) = prev.replace(now) else {
        return out;
    };
    let dt = mono_ns.saturating_sub(p.mono_ns) as f64;
    if dt <= 0.0 {
        return out;
    }
    // a counter that went backwards: the cgroup was recreated; rates restart next tick
    if let Some(d) = raw.cpu_ns.checked_sub(p.cpu_ns) {
        out.push((Metric::CpuUsage, d as f64 / dt));
    }
    psi_rates(&raw.psi, &p.psi, dt, &mut out);
    out
}

impl Collector {
    fn node_samples(&mut self, mono_ns: u64, raw: &NodeRaw) -> Vec<(Metric, f64)> {
        let mem = &raw.memory;
        let used = mem.total.saturating_sub(mem.available) as f64;
        // the cgroups' definition (usage minus inactive page cache), so that
        // node − pods is system memory, not pods' active cache counted twice
        // (the HugeTLB pool is in MemTotal and never in a memory cgroup)
        let working_set = match mem.inactive_file {
            Some(i) => mem
                .total
                .saturating_sub(mem.free)
                .saturating_sub(i)
                .saturating_sub(mem.hugetlb) as f64,
            None => used,
        };
        let mut out = vec![
            (Metric::CpuCapacity, raw.cpu.cpus as f64),
            (Metric::MemoryTotal, raw.memory.total as f64),
            (Metric::MemoryAvailable, raw.memory.available as f64),
            (Metric::MemoryUsage, used),
            (Metric::MemoryWorkingSet, working_set),
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
    if dt_ns <= 0.0 {
        return None;
    }
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

/// System (node minus the pods' root cgroup) and BE (the besteffort cgroup)
/// figures. A figure that cannot be known this tick (the root's first read, a
/// counter reset) is left out, never guessed as 0. Without QoS groups (no pods,
/// or pods outside the kubelet root qoslet knows) they are summed over the
/// pods, and only when every pod has its figure.
fn aggregate(
    t: &mut Tick,
    groups: &Groups,
    pods: Option<&[(Metric, f64)]>,
    be: Option<&[(Metric, f64)]>,
) {
    if let Some(p) = pods {
        t.pods_root = p.to_vec();
    }
    let pod_readings: Vec<&Reading> = t
        .readings
        .iter()
        .filter(|r| r.target.kind == Kind::Pod)
        .collect();
    let sum = |m: Metric, be_only: bool| -> Option<f64> {
        pod_readings
            .iter()
            .filter(|r| !be_only || r.target.qos_class == "BE")
            .map(|r| get(&r.samples, m))
            .sum()
    };
    let mut system = Vec::new();
    let mut best_effort = Vec::new();
    for m in [Metric::CpuUsage, Metric::MemoryWorkingSet] {
        let Some(node) = get(&t.node, m) else {
            continue;
        };
        let (in_pods, in_be) = match (&groups.pods, pods) {
            (Some(_), Some(s)) => (
                get(s, m),
                match (&groups.besteffort, be) {
                    (Some(_), Some(b)) => get(b, m),
                    (Some(_), None) => None,
                    (None, _) => Some(0.0),
                },
            ),
            (Some(_), None) => (None, None),
            // no groups: the pods' own figures (no pods at all: 0)
            (None, _) => (sum(m, false), sum(m, true)),
        };
        if let Some(p) = in_pods {
            system.push((m, (node - p).max(0.0)));
        }
        if let Some(b) = in_be {
            best_effort.push((m, b.max(0.0)));
        }
    }
    t.system = system;
    t.be = best_effort;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str, files: &[(&str, String)]) -> PathBuf {
        qoslet_cgroups::testing::tree(&format!("metrics-{tag}"), files)
    }

    /// A clock that stands still: each cgroup is read at the tick's instant.
    fn frozen() -> Clock {
        Box::new(|| 0)
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
                    "total_cache {}\ntotal_rss {}\ntotal_inactive_file {}\ntotal_pgpgin {}\n",
                    usage / 4,
                    usage / 2,
                    usage / 8,
                    // pages come in as the cgroup reads from disk
                    cpu_ns / 1000 / 4096
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
        // be1 has a CFS quota: the kernel has counted periods already
        files.extend(v1_cgroup("kubepods/be1", 0, 10, 0, 64 << 20));
        files.extend(v1_cgroup("kubepods/be1/c1", 0, 0, 0, 60 << 20));
        files.extend(v1_cgroup("kubepods/ls1", 0, 0, 0, 32 << 20));
        let refs: Vec<(&str, String)> =
            files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        let d = tree("v1", &refs);
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
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
        for (p, v) in v1_cgroup("kubepods/be1", 500_000_000, 110, 40, 64 << 20) {
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
        // no QoS groups known: system = node - the pods (every pod has a rate), BE = BE pods
        assert!((get(&t.system, Metric::CpuUsage).unwrap() - 0.4).abs() < 1e-9);
        assert!((get(&t.be, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9);

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

    fn v1_tree(tag: &str, cgroups: &[&str]) -> PathBuf {
        let mut files: Vec<(String, String)> = proc_files(100, 100)
            .into_iter()
            .map(|(a, b)| (a.to_string(), b))
            .collect();
        for cg in cgroups {
            files.extend(v1_cgroup(cg, 0, 0, 0, 1 << 20));
        }
        let refs: Vec<(&str, String)> =
            files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        tree(tag, &refs)
    }

    fn v1_counters(d: &Path, cg: &str, usage: u64, periods: u64, throttled: u64, read_bytes: u64) {
        put(d, &format!("cg/cpuacct/{cg}/cpuacct.usage"), usage);
        put(
            d,
            &format!("cg/cpu/{cg}/cpu.stat"),
            format!(
                "nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {}\n",
                throttled * 10_000_000
            ),
        );
        put(
            d,
            &format!("cg/blkio/{cg}/blkio.throttle.io_service_bytes_recursive"),
            format!("254:0 Read {read_bytes}\n254:0 Write 0\nTotal {read_bytes}\n"),
        );
        // what a buffered read leaves in memory.stat: pages charged
        put(
            d,
            &format!("cg/memory/{cg}/memory.stat"),
            format!(
                "total_cache 262144\ntotal_rss 524288\ntotal_inactive_file 131072\ntotal_pgpgin {}\n",
                read_bytes / 4096
            ),
        );
    }

    /// A 3 s burst (CPU, throttling, I/O) after idle ticks, at any phase of the
    /// slow re-read: every burst tick shows its exact rates, and the I/O rate
    /// summed over the ticks is every byte read.
    #[test]
    fn short_bursts_are_seen_whole() {
        let sec = 1_000_000_000u64;
        for phase in 0..SLOW_EVERY {
            let d = v1_tree(&format!("burst{phase}"), &["kubepods/b"]);
            let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
            let targets = vec![Arc::new(target("pod/b", Kind::Pod, "/kubepods/b", "LS"))];
            // it has a CFS quota and ran before: the kernel counted periods
            let (mut usage, mut periods, mut throttled, mut bytes) = (sec, 100u64, 0u64, 0u64);
            let mut seen_bytes = 0.0;
            let mut seen_ratio = Vec::new();
            for n in 0..(30 + phase) {
                let burst = (20 + phase..23 + phase).contains(&n);
                if burst {
                    usage += sec / 2;
                    periods += 10;
                    throttled += 5;
                    bytes += 4 << 20;
                }
                v1_counters(&d, "kubepods/b", usage, periods, throttled, bytes);
                let t = c.tick(1000 + n as u32, n * sec, &targets);
                let s = &t.readings[0].samples;
                if n == 0 {
                    continue;
                }
                let io = get(s, Metric::IoReadBytes).expect("an I/O rate every tick");
                seen_bytes += io; // each sample stands for one second
                let ratio = get(s, Metric::CpuThrottledRatio).expect("a ratio every tick");
                if burst {
                    assert!(
                        (io - (4 << 20) as f64).abs() < 1e-6,
                        "phase {phase} tick {n}: {s:?}"
                    );
                    assert!((get(s, Metric::CpuThrottledTime).unwrap() - 0.05).abs() < 1e-9);
                    seen_ratio.push(ratio);
                } else {
                    assert_eq!(io, 0.0, "phase {phase} tick {n}");
                    assert_eq!(ratio, 0.0);
                }
            }
            assert_eq!(seen_ratio, vec![0.5; 3], "phase {phase}");
            assert!(
                (seen_bytes - (12u64 << 20) as f64).abs() < 1e-3,
                "phase {phase}: {seen_bytes}"
            );
            std::fs::remove_dir_all(&d).unwrap();
        }
    }

    /// Direct I/O leaves no sign in memory.stat: while the CPU runs, the I/O
    /// counters are believed still until the slow re-read finds them moved; the
    /// bytes are then averaged over the whole time since their last read (no
    /// spike), and once moving they are read every tick (exact rates).
    #[test]
    fn io_without_signs_is_averaged_then_followed() {
        let sec = 1_000_000_000u64;
        let d = v1_tree("believed", &["kubepods/q"]);
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
        let targets = vec![Arc::new(target("pod/q", Kind::Pod, "/kubepods/q", "LS"))];
        let io = |d: &Path, bytes: u64| {
            put(
                d,
                "cg/blkio/kubepods/q/blkio.throttle.io_service_bytes_recursive",
                format!("254:0 Read {bytes}\n254:0 Write 0\nTotal {bytes}\n"),
            )
        };
        let mut bytes = 0u64;
        let mut samples = Vec::new();
        for n in 0..=2 * SLOW_EVERY {
            // the CPU runs every tick; from tick 3, 10 MB/s of direct reads
            put(&d, "cg/cpuacct/kubepods/q/cpuacct.usage", (n + 1) * sec / 2);
            if n >= 3 {
                bytes += 10_000_000;
            }
            io(&d, bytes);
            let t = c.tick(1000 + n as u32, n * sec, &targets);
            samples.push(get(&t.readings[0].samples, Metric::IoReadBytes));
        }
        let first = samples.iter().position(|v| v.is_some_and(|v| v > 0.0));
        let first = first.expect("found on the slow re-read");
        assert_eq!(first as u64, SLOW_EVERY, "the slow re-read: {samples:?}");
        // averaged over the SLOW_EVERY seconds since the last read, never above the true rate
        let avg = samples[first].unwrap();
        let want = (SLOW_EVERY - 2) as f64 * 10_000_000.0 / SLOW_EVERY as f64;
        assert!((avg - want).abs() < 1e-3, "{avg} vs {want}");
        // then read every tick while it moves: exact
        for v in &samples[first + 1..] {
            assert!((v.unwrap() - 10_000_000.0).abs() < 1e-3, "{samples:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Direct I/O while the CPU runs, then the CPU stops before the slow
    /// re-read: the ticks where the CPU stood still prove nothing about the
    /// unread stretch before them, so the bytes found later are averaged over
    /// the whole time since the last read; no sample is above the true rate.
    #[test]
    fn io_unread_while_moving_then_still_never_spikes() {
        let sec = 1_000_000_000u64;
        let d = v1_tree("unreadstill", &["kubepods/u"]);
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
        let targets = vec![Arc::new(target("pod/u", Kind::Pod, "/kubepods/u", "LS"))];
        let (mut usage, mut bytes) = (sec, 0u64);
        let mut samples = Vec::new();
        for n in 0..=SLOW_EVERY {
            // ticks 2-4: the CPU runs and reads 10 MB/s directly (no sign in
            // memory.stat); then it stands still
            if (2..5).contains(&n) {
                usage += sec / 2;
                bytes += 10_000_000;
            }
            put(&d, "cg/cpuacct/kubepods/u/cpuacct.usage", usage);
            put(
                &d,
                "cg/blkio/kubepods/u/blkio.throttle.io_service_bytes_recursive",
                format!("254:0 Read {bytes}\n254:0 Write 0\nTotal {bytes}\n"),
            );
            let t = c.tick(1000 + n as u32, n * sec, &targets);
            samples.push(get(&t.readings[0].samples, Metric::IoReadBytes).unwrap_or(0.0));
        }
        assert!(
            samples.iter().all(|v| *v <= 10_000_000.0 + 1e-6),
            "a spike: {samples:?}"
        );
        // found on the slow re-read, over the time since tick 1 (the last
        // instant it was proven still before the unread stretch)
        let last = samples[SLOW_EVERY as usize];
        let want = 30_000_000.0 / (SLOW_EVERY - 1) as f64;
        assert!((last - want).abs() < 1e-3, "{samples:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A counter that the belief "still" missed (here v1 cpu.stat moving while
    /// the usage stands still, which a file tree allows) never makes a spike:
    /// its delta spans the time since it was last read.
    #[test]
    fn a_moved_counter_never_spikes() {
        let mut c: Option<Counter<u64>> = None;
        assert_eq!(step(&mut c, Some(5), 0, false), None);
        // believed still for 9 ticks, then read: 90 over 10 s
        for t in 1..10 {
            assert_eq!(step(&mut c, None, t, false), Some((5, t)));
        }
        assert_eq!(step(&mut c, Some(95), 10, false), Some((5, 10)));
        // proven still, then read: the delta spans one tick
        assert_eq!(step(&mut c, None, 11, true), Some((95, 1)));
        assert_eq!(step(&mut c, Some(96), 12, true), Some((95, 1)));
        // believed still while it may move (ticks 13-15), then proven still
        // (16-19): the proof does not cover the believed stretch, so the read
        // at 20 spans the 8 s since the last read, not the 1 s since a proof
        for t in 13..16 {
            assert_eq!(step(&mut c, None, t, false), Some((96, t - 12)));
        }
        for t in 16..20 {
            assert_eq!(step(&mut c, None, t, true), Some((96, t - 12)));
        }
        assert_eq!(step(&mut c, Some(176), 20, true), Some((96, 8)));
        assert_eq!(step(&mut c, None, 21, true), Some((176, 1)));
    }

    /// Each cgroup's rate uses the instant of its own read: a read pass that
    /// takes 150 ms per cgroup one tick and 10 ms the next skews none of them
    /// (one tick timestamp for all made the later ones read far off).
    #[test]
    fn rates_use_each_cgroups_own_read_instant() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let names: Vec<String> = (0..8).map(|i| format!("kubepods/s{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let d = v1_tree("slowpass", &refs);
        let now = Arc::new(AtomicU64::new(0));
        let step = Arc::new(AtomicU64::new(0));
        let (clock_now, clock_step, dir, cgs) =
            (now.clone(), step.clone(), d.clone(), names.clone());
        // each look at the clock is `step` later (150 ms, then 10 ms: a pass
        // whose pace changes), and every cgroup has used exactly one core up to
        // that instant (its file shows it)
        let clock: Clock = Box::new(move || {
            let s = clock_step.load(Ordering::SeqCst);
            let t = clock_now.fetch_add(s, Ordering::SeqCst) + s;
            for cg in &cgs {
                put(&dir, &format!("cg/cpuacct/{cg}/cpuacct.usage"), t);
            }
            t
        });
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(clock);
        let targets: Vec<Arc<Target>> = names
            .iter()
            .map(|cg| {
                Arc::new(target(
                    &format!("pod/{cg}"),
                    Kind::Pod,
                    &format!("/{cg}"),
                    "LS",
                ))
            })
            .collect();
        for n in 0..4u64 {
            step.store(
                if n % 2 == 0 { 150_000_000 } else { 10_000_000 },
                Ordering::SeqCst,
            );
            // the tick begins at the clock's next reading
            let mono = now.load(Ordering::SeqCst) + step.load(Ordering::SeqCst);
            let t = c.tick(1000 + n as u32, mono, &targets);
            if n == 0 {
                continue;
            }
            for r in &t.readings {
                let u = get(&r.samples, Metric::CpuUsage).unwrap();
                assert!((u - 1.0).abs() < 1e-9, "{}: {u}", r.target.entity);
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Each target's files and counters follow its entity whatever the list's
    /// order or Arcs; a target no longer asked for closes its files; a cgroup
    /// removed and made again on a file tree is read from its new files.
    #[test]
    fn state_follows_the_entity_not_the_list() {
        let sec = 1_000_000_000u64;
        let d = v1_tree("slots", &["kubepods/a", "kubepods/b"]);
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
        let list = |names: &[&str]| -> Vec<Arc<Target>> {
            names
                .iter()
                .map(|n| {
                    Arc::new(target(
                        &format!("pod/{n}"),
                        Kind::Pod,
                        &format!("/kubepods/{n}"),
                        "LS",
                    ))
                })
                .collect()
        };
        let t = c.tick(1000, 0, &list(&["a", "b"]));
        assert_eq!(t.readings.len(), 2);
        let open = c.open_files();
        put(&d, "cg/cpuacct/kubepods/a/cpuacct.usage", sec / 2);
        put(&d, "cg/cpuacct/kubepods/b/cpuacct.usage", sec / 4);
        // the same entities, new Arcs, the other order: rates at once
        let t = c.tick(1001, sec, &list(&["b", "a"]));
        let rate = |t: &Tick, e: &str| {
            let r = t.readings.iter().find(|r| r.target.entity == e).unwrap();
            get(&r.samples, Metric::CpuUsage)
        };
        assert_eq!(t.readings[0].target.entity, "pod/b");
        assert!((rate(&t, "pod/a").unwrap() - 0.5).abs() < 1e-9);
        assert!((rate(&t, "pod/b").unwrap() - 0.25).abs() < 1e-9);
        assert_eq!(c.open_files(), open, "no file opened again");
        // b no longer asked for: its files close; a keeps its counters
        put(&d, "cg/cpuacct/kubepods/a/cpuacct.usage", sec);
        let t = c.tick(1002, 2 * sec, &list(&["a"]));
        assert!((rate(&t, "pod/a").unwrap() - 0.5).abs() < 1e-9);
        assert!(c.open_files() < open, "b's files closed");
        // a removed and made again (new files, a counter restarted)
        std::fs::remove_dir_all(d.join("cg/memory/kubepods/a")).unwrap();
        std::fs::remove_dir_all(d.join("cg/cpu/kubepods/a")).unwrap();
        std::fs::remove_dir_all(d.join("cg/cpuacct/kubepods/a")).unwrap();
        for (p, v) in v1_cgroup("kubepods/a", 1000, 0, 0, 3 << 20) {
            std::fs::create_dir_all(d.join(&p).parent().unwrap()).unwrap();
            put(&d, &p, v);
        }
        let seen = (3..3 + SLOW_EVERY as u32 + 1).any(|i| {
            let t = c.tick(1000 + i, u64::from(i) * sec, &list(&["a"]));
            t.readings
                .iter()
                .any(|r| get(&r.samples, Metric::MemoryUsage) == Some((3u64 << 20) as f64))
        });
        assert!(seen, "the new cgroup's files are read");
        // a name given twice (a bad inventory): every file is counted closed
        c.tick(2000, 100 * sec, &list(&["a", "a"]));
        c.tick(2001, 101 * sec, &list(&["a"]));
        assert!(c.open_files() > 0);
        c.tick(2002, 102 * sec, &[]);
        assert_eq!(c.open_files(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// System and BE figures come from the QoS cgroups: a pod without a rate
    /// this tick (its first, or a reset) does not remove them.
    #[test]
    fn aggregates_survive_pod_churn() {
        let sec = 1_000_000_000u64;
        let d = v1_tree(
            "churn",
            &[
                "kubepods",
                "kubepods/besteffort",
                "kubepods/besteffort/p1",
                "kubepods/p2",
            ],
        );
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
        c.set_groups(Groups {
            pods: Some(CgroupPath::parse("/kubepods").unwrap()),
            besteffort: Some(CgroupPath::parse("/kubepods/besteffort").unwrap()),
        });
        let mut targets = vec![Arc::new(target(
            "pod/p1",
            Kind::Pod,
            "/kubepods/besteffort/p1",
            "BE",
        ))];
        let t = c.tick(1000, 0, &targets);
        assert_eq!(
            get(&t.system, Metric::CpuUsage),
            None,
            "no rate for the pods' root yet: not guessed"
        );
        // a second later: node 1.5 cores busy, pods 1.0, BE 0.25; a new pod arrives
        put(
            &d,
            "proc/stat",
            "cpu  103 0 0 101 0 0 0 0 0 0\ncpu0 0\ncpu1 0\n",
        );
        put(&d, "cg/cpuacct/kubepods/cpuacct.usage", sec);
        put(&d, "cg/cpuacct/kubepods/besteffort/cpuacct.usage", sec / 4);
        targets.push(Arc::new(target("pod/p2", Kind::Pod, "/kubepods/p2", "LS")));
        let t = c.tick(1001, sec, &targets);
        assert_eq!(
            get(&t.readings[1].samples, Metric::CpuUsage),
            None,
            "the new pod's first tick"
        );
        assert!(
            (get(&t.system, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9,
            "{:?}",
            t.system
        );
        assert!(
            (get(&t.be, Metric::CpuUsage).unwrap() - 0.25).abs() < 1e-9,
            "{:?}",
            t.be
        );
        // memory: node working set (total − free − inactive file) minus the pods' root
        put(
            &d,
            "proc/meminfo",
            "MemTotal: 4000000 kB\nMemFree: 1000000 kB\nMemAvailable: 2500000 kB\nCached: 1500000 kB\nInactive(file): 1000000 kB\n",
        );
        let t = c.tick(1002, 2 * sec, &targets);
        let node_ws = get(&t.node, Metric::MemoryWorkingSet).unwrap();
        assert_eq!(node_ws, 2_000_000.0 * 1024.0);
        let pods_ws = (1u64 << 20) - (1u64 << 20) / 8;
        assert_eq!(
            get(&t.system, Metric::MemoryWorkingSet),
            Some(node_ws - pods_ws as f64)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn steal_is_not_busy() {
        let c = parse::proc_stat("cpu  100 0 0 300 0 0 0 100 0 0\ncpu0 0\n").unwrap();
        assert_eq!((c.busy, c.total), (100, 500));
    }

    #[test]
    fn v2_cgroups_with_psi_and_io() {
        let cg = "kubepods.slice/kubepods-pod1.slice";
        let files = |usage_usec: u64, some: u64, rbytes: u64| -> Vec<(String, String)> {
            vec![
                ("cg/cgroup.controllers".into(), "cpu io memory pids\n".into()),
                (format!("cg/{cg}/cpu.stat"), format!("usage_usec {usage_usec}\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")),
                (format!("cg/{cg}/memory.current"), "1048576\n".into()),
                // the page cache grows by what is read
                (format!("cg/{cg}/memory.stat"), format!("anon 524288\nfile {}\ninactive_file 131072\n", 262144 + rbytes)),
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
        let mut c = Collector::new(Host::detect(&d.join("cg")).unwrap(), &d.join("proc"))
            .with_clock(frozen());
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
