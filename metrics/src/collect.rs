//! Collectors: every tick, the node (procfs) and each pod's and container's
//! cgroup (v1 or v2) are read, and counters become rates.
//!
//! Roots are injected (`/proc` and the cgroup host, kernel-shaped trees in
//! tests). A cgroup that vanished mid-read (a container gone) or a malformed
//! file skips that entity's sample for this tick; a counter that went
//! backwards (a cgroup recreated under the same name) restarts the rate, so
//! there is never a bogus spike.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use qoslet_cgroups::{CgroupError, CgroupPath, Host, Layout};

use crate::metric::Metric;
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
    pub io: BTreeMap<String, Io>,
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
    pub target: Target,
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

#[derive(Debug, Clone)]
struct Prev {
    mono_ns: u64,
    raw: CgroupRaw,
}

/// Directories of a target's cgroup, per hierarchy (resolved once: the
/// symlink check walks every component).
#[derive(Debug, Clone)]
struct Dirs {
    cpu: PathBuf,
    cpuacct: PathBuf,
    memory: PathBuf,
    blkio: Option<PathBuf>,
}

/// Reads the node and cgroups and turns counters into rates.
pub struct Collector {
    host: Host,
    proc_root: PathBuf,
    prev: HashMap<String, Prev>,
    dirs: HashMap<String, Dirs>,
    node_prev: Option<(u64, NodeRaw)>,
    buf: String,
    buf2: String,
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

impl Collector {
    /// `host`: the cgroup layout (`Host::detect`); `proc_root`: `/proc`.
    pub fn new(host: Host, proc_root: &Path) -> Self {
        Self {
            host,
            proc_root: proc_root.into(),
            prev: HashMap::new(),
            dirs: HashMap::new(),
            node_prev: None,
            buf: String::new(),
            buf2: String::new(),
        }
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// One tick at Unix time `ts`, monotonic `mono_ns`, over `targets`.
    pub fn tick(&mut self, ts: u32, mono_ns: u64, targets: &[Target]) -> Tick {
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
        let mut seen = std::collections::HashSet::with_capacity(targets.len());
        for target in targets {
            seen.insert(target.entity.as_str());
            match self.read_cgroup(target) {
                Ok(raw) => {
                    let samples = self.samples(&target.entity, mono_ns, &raw);
                    t.readings.push(Reading {
                        target: target.clone(),
                        samples,
                        raw,
                    });
                }
                Err(e) => {
                    if !matches!(e, ReadError::Vanished) {
                        tracing::debug!(entity = %target.entity, error = %e, "sample skipped");
                    }
                    self.prev.remove(&target.entity);
                    self.dirs.remove(&target.entity);
                    t.skipped += 1;
                }
            }
        }
        self.prev.retain(|k, _| seen.contains(k.as_str()));
        self.dirs.retain(|k, _| seen.contains(k.as_str()));
        aggregate(&mut t);
        t
    }

    fn read_into(&mut self, path: &Path, second: bool) -> Result<(), ReadError> {
        let buf = if second {
            &mut self.buf2
        } else {
            &mut self.buf
        };
        buf.clear();
        match std::fs::File::open(path).and_then(|mut f| f.read_to_string(buf)) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ReadError::Vanished),
            // ENODEV: a cgroup removed between open and read
            Err(e) if e.raw_os_error() == Some(19) => Err(ReadError::Vanished),
            Err(source) => Err(ReadError::Io {
                path: path.into(),
                source,
            }),
        }
    }

    fn read_node(&mut self) -> Result<NodeRaw, ReadError> {
        let p = self.proc_root.clone();
        let perr = |path: PathBuf| move |source| ReadError::Parse { path, source };
        self.read_into(&p.join("stat"), false)?;
        let cpu = parse::proc_stat(&self.buf).map_err(perr(p.join("stat")))?;
        self.read_into(&p.join("meminfo"), false)?;
        let memory = parse::meminfo(&self.buf).map_err(perr(p.join("meminfo")))?;
        self.read_into(&p.join("loadavg"), false)?;
        let load = parse::loadavg(&self.buf).map_err(perr(p.join("loadavg")))?;
        let mut psi = [None; 3];
        for (i, r) in ["cpu", "memory", "io"].iter().enumerate() {
            if self.read_into(&p.join("pressure").join(r), false).is_ok() {
                psi[i] = parse::psi(&self.buf).ok();
            }
        }
        Ok(NodeRaw {
            cpu,
            memory,
            load,
            psi,
        })
    }

    fn dirs_of(&mut self, t: &Target) -> Result<Dirs, ReadError> {
        if let Some(d) = self.dirs.get(&t.entity) {
            return Ok(d.clone());
        }
        let h = |c: &str| -> Result<PathBuf, ReadError> {
            let root = self.host.hierarchy(c).ok_or(CgroupError::Unsupported {
                knob: "metrics",
                reason: "controller not mounted",
            })?;
            Ok(t.cgroup.under(root)?)
        };
        let d = Dirs {
            cpu: h("cpu")?,
            cpuacct: h("cpuacct").or_else(|_| h("cpu"))?,
            memory: h("memory")?,
            blkio: h("blkio").ok(),
        };
        if !d.cpu.is_dir() {
            return Err(ReadError::Vanished);
        }
        self.dirs.insert(t.entity.clone(), d.clone());
        Ok(d)
    }

    fn read_cgroup(&mut self, t: &Target) -> Result<CgroupRaw, ReadError> {
        let d = self.dirs_of(t)?;
        let v2 = matches!(self.host.layout, Layout::V2 { .. });
        let perr = |path: PathBuf| move |source| ReadError::Parse { path, source };
        let mut raw = CgroupRaw::default();
        let f = d.cpu.join("cpu.stat");
        self.read_into(&f, false)?;
        raw.cpu = parse::cpu_stat(&self.buf, v2).map_err(perr(f))?;
        if v2 {
            raw.cpu_ns = raw.cpu.usage_ns.unwrap_or(0);
        } else {
            let f = d.cpuacct.join("cpuacct.usage");
            self.read_into(&f, false)?;
            raw.cpu_ns = parse::single(&self.buf).map_err(perr(f))?;
        }
        let (usage, events) = if v2 {
            ("memory.current", "memory.events")
        } else {
            ("memory.usage_in_bytes", "memory.oom_control")
        };
        let f = d.memory.join(usage);
        self.read_into(&f, false)?;
        self.read_into(&d.memory.join("memory.stat"), true)?;
        raw.memory = Some(parse::memory(&self.buf, &self.buf2, v2).map_err(perr(f))?);
        if self.read_into(&d.memory.join(events), false).is_ok() {
            raw.oom_kills = parse::oom_kills(&self.buf);
        }
        if v2 {
            if self.read_into(&d.cpu.join("io.stat"), false).is_ok() {
                raw.io = parse::io_stat_v2(&self.buf);
            }
            for (i, r) in ["cpu.pressure", "memory.pressure", "io.pressure"]
                .iter()
                .enumerate()
            {
                if self.read_into(&d.cpu.join(r), false).is_ok() {
                    raw.psi[i] = parse::psi(&self.buf).ok();
                }
            }
        } else if let Some(b) = &d.blkio {
            if self
                .read_into(&b.join("blkio.throttle.io_service_bytes_recursive"), false)
                .is_ok()
                && self
                    .read_into(&b.join("blkio.throttle.io_serviced_recursive"), true)
                    .is_ok()
            {
                raw.io = parse::blkio_v1(&self.buf, &self.buf2);
            }
        }
        Ok(raw)
    }

    fn samples(&mut self, entity: &str, mono_ns: u64, raw: &CgroupRaw) -> Vec<(Metric, f64)> {
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
        let prev = self.prev.insert(
            entity.to_string(),
            Prev {
                mono_ns,
                raw: raw.clone(),
            },
        );
        let Some(prev) = prev else { return out };
        let dt = mono_ns.saturating_sub(prev.mono_ns) as f64;
        if dt <= 0.0 {
            return out;
        }
        let p = &prev.raw;
        // a counter that went backwards: the cgroup was recreated; rates restart next tick
        let reset = raw.cpu_ns < p.cpu_ns
            || raw.cpu.nr_periods < p.cpu.nr_periods
            || raw.cpu.nr_throttled < p.cpu.nr_throttled
            || raw.cpu.throttled_ns < p.cpu.throttled_ns;
        if reset {
            return out;
        }
        out.push((Metric::CpuUsage, (raw.cpu_ns - p.cpu_ns) as f64 / dt));
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
        if let Some(io) = io_rates(&raw.io, &p.io, dt) {
            out.extend(io);
        }
        psi_rates(&raw.psi, &p.psi, dt, &mut out);
        out
    }

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

/// Read/write bytes and ops per second over all devices; `None` after a reset.
fn io_rates(
    now: &BTreeMap<String, Io>,
    prev: &BTreeMap<String, Io>,
    dt_ns: f64,
) -> Option<[(Metric, f64); 4]> {
    if now.is_empty() {
        return None;
    }
    let mut d = [0u64; 4];
    for (dev, n) in now {
        let Some(p) = prev.get(dev) else { continue };
        let pairs = [
            (n.read_bytes, p.read_bytes),
            (n.write_bytes, p.write_bytes),
            (n.read_ops, p.read_ops),
            (n.write_ops, p.write_ops),
        ];
        for (i, (a, b)) in pairs.into_iter().enumerate() {
            d[i] += a.checked_sub(b)?;
        }
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

fn get(s: &[(Metric, f64)], m: Metric) -> Option<f64> {
    s.iter().find(|(x, _)| *x == m).map(|(_, v)| *v)
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

    fn get(s: &[(Metric, f64)], m: Metric) -> Option<f64> {
        super::get(s, m)
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
        ];
        let t = c.tick(1000, 0, &targets);
        assert_eq!(t.readings.len(), 3);
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
        // the container vanished
        std::fs::remove_dir_all(d.join("cg/cpu/kubepods/be1/c1")).unwrap();
        let t = c.tick(1001, 1_000_000_000, &targets);
        assert_eq!(t.skipped, 1);
        assert_eq!(t.readings.len(), 2);
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
        assert_eq!(t.readings.len(), 1);
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
        let targets = vec![target("pod/1", Kind::Pod, &format!("/{cg}"), "LS")];
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
