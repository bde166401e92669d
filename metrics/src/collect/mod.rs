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
//! re-read every `SLOW_EVERY` (10) ticks) is averaged over the whole time since
//! its last read: never a spike, never a dropped delta.
//!
//! System and BE figures come from the kube QoS cgroups ([`Groups`]): system
//! = node − the pods' root cgroup, BE = the besteffort cgroup, not a sum over
//! the pods that happened to have a rate this tick.
//!
//! * here: the readings ([`Tick`], [`CgroupRaw`], [`NodeRaw`]) and the [`Collector`].
//! * `files`: the files a tick reads, kept open within an fd budget.
//! * `rates`: counters into rates, and the aggregates.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qoslet_cgroups::{CgroupError, CgroupPath, Host};

use crate::fasthash::FastMap;
use crate::metric::{sample as get, Metric};
use crate::parse::{self, CpuStat, Devices, Memory, Psi};

mod files;
mod rates;
#[cfg(test)]
mod tests;

pub use files::*;
use rates::*;

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
