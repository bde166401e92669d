//! Writing QoS settings to a host's cgroups.
//!
//! A [`Knob`] is what a caller wants ("BE cgroup gets cpu.idle=1"); [`Cgroups::plan`]
//! turns it into the kernel files and values of *this* host's layout (v1 or
//! v2), or says it is unsupported here; [`Cgroups::apply`] writes them
//! idempotently under a validated [`CgroupPath`]. [`Cgroups::apply_ordered`]
//! orders writes over a parent and its children the way the kernel needs:
//! parents first when a limit grows, children first when it shrinks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::convert::shares_to_weight;
use crate::detect::{Host, Layout};
use crate::fs::{CgFile, Outcome};
use crate::{CgroupError, CgroupPath};

pub use crate::cpulist::{
    canonical_cpu_list, cpu_count, format_cpu_list, parse_cpu_list, MAX_CPUS, MAX_CPU_LIST_LEN,
};
pub use crate::knob::{files, Knob, KnobKind, MemTune, MemTunes, BVT_FILE};

/// One kernel file and the value for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    /// The v1 controller hierarchy the file lives in (ignored on v2).
    pub controller: &'static str,
    pub file: &'static str,
    pub value: String,
    /// A per-device table (`major:minor value`): compared by the line of that
    /// device only, as the kernel lists every limited device in one file.
    pub keyed: bool,
}

fn fw(controller: &'static str, file: &'static str, value: impl ToString) -> FileWrite {
    FileWrite {
        controller,
        file,
        value: value.to_string(),
        keyed: false,
    }
}

fn keyed(controller: &'static str, file: &'static str, value: String) -> FileWrite {
    FileWrite {
        controller,
        file,
        value,
        keyed: true,
    }
}

/// The v1 controllers whose files [`Cgroups::plan`] writes (the hierarchies
/// [`Cgroups::watch`] watches).
pub const WRITTEN_V1: [&str; 4] = ["cpu", "cpuset", "memory", "blkio"];

/// A host's cgroups: every QoS write in qoslet goes through here.
#[derive(Debug, Clone)]
pub struct Cgroups {
    host: Host,
    page_size: u64,
    /// Where the files are: the kernel's, or a test's in-memory tree.
    backend: std::sync::Arc<dyn crate::fs::Backend>,
}

/// This machine's page size (what the kernel rounds memory limits to).
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

impl Cgroups {
    pub fn new(host: Host) -> Self {
        Self::with_backend(host, std::sync::Arc::new(crate::fs::HostFs::default()))
    }

    /// The host's cgroups with their files in `backend` (tests: a
    /// [`crate::memfs::MemFs`]).
    pub fn with_backend(host: Host, backend: std::sync::Arc<dyn crate::fs::Backend>) -> Self {
        Self {
            host,
            page_size: page_size(),
            backend,
        }
    }

    /// Reads a file [`Cgroups::path_of`] gave, through this host's backend.
    pub fn read_file(&self, f: &CgFile) -> Result<String, CgroupError> {
        self.backend.read(f)
    }

    /// The page size memory values are rounded down to, as the kernel stores them.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Rounds a memory value down to a whole page, as the kernel will show it.
    fn pages(&self, bytes: u64) -> u64 {
        bytes / self.page_size * self.page_size
    }

    /// Detects the host under `root` (`/sys/fs/cgroup` in production).
    pub fn detect(root: &std::path::Path) -> Result<Self, CgroupError> {
        Host::detect(root).map(Self::new)
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The files and values `knob` means on this host. Pure: no I/O.
    pub fn plan(&self, knob: &Knob) -> Result<Vec<FileWrite>, CgroupError> {
        let v2 = self.host.is_v2();
        let f = &self.host.features;
        let unsupported = |reason: &'static str| {
            Err(CgroupError::Unsupported {
                knob: knob.name(),
                reason,
            })
        };
        Ok(match knob {
            Knob::CpuShares(s) if v2 => vec![fw("cpu", files::CPU_WEIGHT, shares_to_weight(*s))],
            Knob::CpuShares(s) => vec![fw("cpu", files::CPU_SHARES, (*s).clamp(2, 262_144))],
            Knob::CpuQuota { period, .. } if !(1_000..=1_000_000).contains(period) => {
                return unsupported("period must be 1000..=1000000 µs")
            }
            Knob::CpuQuota { quota: Some(q), .. } if *q < 1_000 => {
                return unsupported("quota below 1000 µs")
            }
            Knob::CpuQuota { quota: Some(q), .. } if i64::try_from(*q).is_err() => {
                return unsupported("quota beyond the kernel's range")
            }
            Knob::MemoryLimit(Some(b))
            | Knob::MemoryHigh(Some(b))
            | Knob::MemoryMin(b)
            | Knob::MemoryLow(b)
                if i64::try_from(*b).is_err() =>
            {
                return unsupported("memory value beyond the kernel's range")
            }
            Knob::CpuQuota { quota, period } if v2 => {
                vec![fw(
                    "cpu",
                    files::CPU_MAX,
                    format!(
                        "{} {period}",
                        quota.map(|q| q.to_string()).unwrap_or_else(|| "max".into())
                    ),
                )]
            }
            Knob::CpuQuota { quota, period } => vec![
                fw("cpu", files::CPU_CFS_PERIOD, period),
                fw(
                    "cpu",
                    files::CPU_CFS_QUOTA,
                    quota.map(|q| q as i64).unwrap_or(-1), // checked above: fits
                ),
            ],
            Knob::CpuIdle(_) if !f.cpu_idle => return unsupported("this kernel has no cpu.idle"),
            Knob::CpuIdle(on) => vec![fw("cpu", files::CPU_IDLE, u8::from(*on))],
            Knob::GroupIdentity(_) if !f.bvt => {
                return unsupported("this kernel has no cpu.bvt_warp_ns")
            }
            Knob::GroupIdentity(v) if !(-1..=2).contains(v) => {
                return unsupported("bvt must be -1..=2")
            }
            Knob::GroupIdentity(v) => vec![fw("cpu", BVT_FILE, v)],
            Knob::CpuBurst(_) if !f.cpu_burst => {
                return unsupported("this kernel has no CFS burst")
            }
            Knob::CpuBurst(b) if v2 => vec![fw("cpu", files::CPU_MAX_BURST, b)],
            Knob::CpuBurst(b) => vec![fw("cpu", files::CPU_CFS_BURST, b)],
            // memory values as the kernel stores them: whole pages, rounded down
            Knob::MemoryLimit(v) if v2 => vec![fw(
                "memory",
                files::MEMORY_MAX,
                v.map(|b| self.pages(b).to_string())
                    .unwrap_or_else(|| "max".into()),
            )],
            Knob::MemoryLimit(v) => vec![fw(
                "memory",
                files::MEMORY_LIMIT,
                v.map(|b| self.pages(b) as i64).unwrap_or(-1),
            )],
            Knob::MemoryMin(_) | Knob::MemoryLow(_) | Knob::MemoryHigh(_) if !f.memory_qos => {
                return unsupported("this kernel has no memory.min/low/high")
            }
            Knob::MemoryMin(b) => vec![fw("memory", files::MEMORY_MIN, self.pages(*b))],
            Knob::MemoryLow(b) => vec![fw("memory", files::MEMORY_LOW, self.pages(*b))],
            Knob::MemoryHigh(v) => vec![fw(
                "memory",
                files::MEMORY_HIGH,
                v.map(|b| self.pages(b).to_string())
                    .unwrap_or_else(|| "max".into()),
            )],
            // v2: the empty value (inherit the parent's CPUs), which is what the
            // runtime leaves; a newline, since a zero-byte write reaches no kernel
            // handler (the kernel strips it)
            Knob::CpusetCpus(s) if v2 && s.trim().is_empty() => {
                vec![fw("cpuset", files::CPUSET_CPUS, "\n")]
            }
            Knob::CpusetCpus(s) => match canonical_cpu_list(s).filter(|c| !c.is_empty()) {
                // as the kernel will show it, so a steady value compares equal
                Some(c) => vec![fw("cpuset", files::CPUSET_CPUS, c)],
                None => {
                    return unsupported("empty or malformed cpu list (v1 has no inherited value)")
                }
            },
            Knob::MemoryTune(t, _) if !f.memory_tunes.has(*t) => {
                return unsupported(
                    "this kernel has no such memory file (Anolis / Alibaba Cloud Linux)",
                )
            }
            Knob::MemoryTune(t, v) if !t.range().contains(v) => {
                return unsupported("value outside the file's range")
            }
            Knob::MemoryTune(t, v) => vec![fw("memory", t.file(), v)],
            Knob::IoLimit { .. } if !f.blkio_throttle => {
                return unsupported("this kernel has no blkio throttling (v1) / io controller (v2)")
            }
            Knob::IoLimit { limits: l, .. }
                if [l.read_bps, l.write_bps, l.read_iops, l.write_iops].contains(&Some(0)) =>
            {
                return unsupported(
                    "an I/O limit of 0 would stop all I/O; leave it unset for no limit",
                )
            }
            Knob::IoLimit { device, limits: l } if v2 => {
                let m = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "max".into());
                vec![keyed(
                    "io",
                    files::IO_MAX,
                    format!(
                        "{device} rbps={} wbps={} riops={} wiops={}",
                        m(l.read_bps),
                        m(l.write_bps),
                        m(l.read_iops),
                        m(l.write_iops)
                    ),
                )]
            }
            Knob::IoLimit { device, limits: l } => [
                (files::BLKIO_READ_BPS, l.read_bps),
                (files::BLKIO_WRITE_BPS, l.write_bps),
                (files::BLKIO_READ_IOPS, l.read_iops),
                (files::BLKIO_WRITE_IOPS, l.write_iops),
            ]
            .into_iter()
            .map(|(file, v)| keyed("blkio", file, format!("{device} {}", v.unwrap_or(0))))
            .collect(),
        })
    }

    /// The file of `w` for cgroup `cg`, opened beneath its hierarchy (no symlinks on the way).
    pub fn path_of(&self, cg: &CgroupPath, w: &FileWrite) -> Result<CgFile, CgroupError> {
        let hierarchy = match &self.host.layout {
            Layout::V1 { controllers } => {
                controllers
                    .get(w.controller)
                    .ok_or(CgroupError::Unsupported {
                        knob: w.file,
                        reason: "controller not mounted",
                    })?
            }
            Layout::V2 { root, .. } => root,
        };
        CgFile::new(hierarchy, Path::new(cg.as_str()).join(w.file))
    }

    /// Watches `cg`'s directories (on v1 each hierarchy's that qoslet writes
    /// in: [`WRITTEN_V1`]) for anyone's
    /// writes, reported by [`Cgroups::written`] ([`crate::watch`]); false when
    /// none could be watched (no inotify, its limit reached, the cgroup gone).
    /// Asks the kernel each time: call it again now and then (a cgroup made
    /// anew at the same path, a watch the limit refused).
    pub fn watch(&self, cg: &CgroupPath) -> bool {
        let dirs: Vec<PathBuf> = match &self.host.layout {
            Layout::V1 { controllers } => {
                // only the hierarchies qoslet writes in: each watch counts against
                // the user's inotify limit, which kubelet and containerd share
                let mut d: Vec<PathBuf> = controllers
                    .iter()
                    .filter(|(c, _)| WRITTEN_V1.contains(&c.as_str()))
                    .map(|(_, h)| h.join(cg.as_str()))
                    .collect();
                // cpu and cpuacct are often one hierarchy under two names
                d.sort();
                d.dedup();
                d
            }
            Layout::V2 { root, .. } => vec![root.join(cg.as_str())],
        };
        let mut any = false;
        for d in dirs {
            match self.backend.watch(&d, cg) {
                Ok(()) => any = true,
                Err(e) => tracing::debug!(dir = %d.display(), error = %e, "not watched"),
            }
        }
        any
    }

    /// The files written in watched cgroups since the last call.
    pub fn written(&self) -> crate::watch::Written {
        self.backend.written()
    }

    /// Drops the watches of the cgroups `keep` says no to (their directories
    /// may be gone: the kernel does not tell of a removed cgroup directory).
    pub fn retain_watches(&self, keep: &dyn Fn(&CgroupPath) -> bool) {
        self.backend.retain_watches(keep)
    }

    /// The child cgroups of `cg` in `controller`'s hierarchy (directories only,
    /// never followed through a symlink; names a [`CgroupPath`] refuses are left
    /// out). Empty when `cg` is missing.
    pub fn children(&self, cg: &CgroupPath, controller: &'static str) -> Vec<CgroupPath> {
        let Ok(f) = self.path_of(cg, &fw(controller, "cgroup.procs", "")) else {
            return Vec::new();
        };
        let mut out: Vec<CgroupPath> = self
            .backend
            .siblings_dirs(&f)
            .iter()
            .filter_map(|name| cg.child(name).ok())
            .collect();
        out.sort();
        out
    }

    /// Applies `knob` to `cg`: Written if any file changed.
    pub fn apply(&self, cg: &CgroupPath, knob: &Knob) -> Result<Outcome, CgroupError> {
        let mut out = Outcome::Unchanged;
        let mut writes = self.plan(knob)?;
        // cgroup v2: the kernel holds a SCHED_IDLE group (cpu.idle 1) at the
        // minimum weight and refuses a cpu.weight write to it (EINVAL). The
        // weight does not apply while the group is idle: nothing to write.
        if matches!(knob, Knob::CpuShares(_))
            && self.host.is_v2()
            && self
                .read(cg, "cpu", files::CPU_IDLE)
                .is_ok_and(|v| v.trim() == "1")
        {
            tracing::debug!(cgroup = %cg, "cpu.weight not written: the group is idle (cpu.idle 1)");
            return Ok(out);
        }
        // v1 checks each of the two files against the parent's quota/period ratio
        // as it is written: a shorter period goes in after the quota (a longer one
        // before it), so no step raises the ratio above both the old and the new.
        // Both files read as wanted (the steady state) is no write and no order.
        if let (Knob::CpuQuota { period, .. }, false) = (knob, self.host.is_v2()) {
            let mut cur_period = None;
            let mut unchanged = true;
            for w in &writes {
                let p = self.path_of(cg, w)?;
                match self.backend.read(&p) {
                    Ok(cur) => {
                        if w.file == files::CPU_CFS_PERIOD {
                            cur_period = cur.trim().parse::<u64>().ok();
                        }
                        unchanged &= crate::fs::same(&cur, &w.value);
                    }
                    Err(_) => unchanged = false,
                }
            }
            if unchanged {
                return Ok(out);
            }
            if cur_period.is_some_and(|c| *period < c) {
                writes.reverse();
            }
        }
        for w in writes {
            let p = self.path_of(cg, &w)?;
            let written = if w.keyed {
                crate::fs::write_keyed_if_changed_in(&*self.backend, &p, &w.value)?
            } else {
                crate::fs::write_if_changed_in(&*self.backend, &p, &w.value)?
            };
            if written == Outcome::Written {
                tracing::debug!(cgroup = %cg, file = %p.display(), value = %w.value, "cgroup written");
                out = Outcome::Written;
            }
        }
        Ok(out)
    }

    /// Reads a file of `cg` (`controller` picks the v1 hierarchy).
    pub fn read(
        &self,
        cg: &CgroupPath,
        controller: &'static str,
        file: &'static str,
    ) -> Result<String, CgroupError> {
        self.backend
            .read(&self.path_of(cg, &fw(controller, file, ""))?)
    }

    /// A cgroup's CFS bandwidth, parsed once here: `(quota, period)` in µs,
    /// quota `None` = unlimited (v1 `cpu.cfs_quota_us` -1, v2 `cpu.max` `max`);
    /// a period the file does not give reads as the kernel's default 100 ms.
    /// `None`: the cgroup or its file cannot be read or holds no number.
    pub fn read_cpu_quota(&self, cg: &CgroupPath) -> Option<(Option<u64>, u64)> {
        if self.host.is_v2() {
            let s = self.read(cg, "cpu", files::CPU_MAX).ok()?;
            let mut it = s.split_whitespace();
            let q = match it.next()? {
                "max" => None,
                q => Some(q.parse().ok()?),
            };
            let period = it.next().and_then(|p| p.parse().ok()).unwrap_or(100_000);
            return Some((q, period));
        }
        let q: i64 = self
            .read(cg, "cpu", files::CPU_CFS_QUOTA)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let period = self
            .read(cg, "cpu", files::CPU_CFS_PERIOD)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(100_000);
        Some(((q > 0).then_some(q as u64), period))
    }

    /// A cgroup's `cpuset.cpus` as a set (`None`: unreadable, malformed or empty).
    pub fn read_cpuset(&self, cg: &CgroupPath) -> Option<BTreeSet<u32>> {
        let s = self.read(cg, "cpuset", files::CPUSET_CPUS).ok()?;
        parse_cpu_list(s.trim()).filter(|c| !c.is_empty())
    }

    /// A memory protection file (`memory.min` / `memory.low`) in bytes, `max`
    /// as `u64::MAX` (`None`: unreadable or not a number).
    pub fn read_memory_protection(&self, cg: &CgroupPath, file: &'static str) -> Option<u64> {
        match self.read(cg, "memory", file).ok()?.trim() {
            "max" => Some(u64::MAX),
            n => n.parse().ok(),
        }
    }

    /// The first half of moving cpusets over a parent and its children (v1
    /// wants every child's CPUs inside its parent's at every step): each
    /// cgroup, parents first, gets the union of its current and its new CPUs;
    /// [`Cgroups::order`] then writes the new sets children first. A move to
    /// other CPUs of the same count (`14-15` -> `10-11`) thus never meets
    /// EBUSY on the parent or EACCES on a child (koordlet's order too). Returns
    /// the writes that failed.
    pub fn widen_cpusets(&self, writes: &[(CgroupPath, Knob)]) -> Vec<CgroupError> {
        if self.host.is_v2() {
            return Vec::new(); // v2 has no containment rule on writes (effective sets intersect)
        }
        let mut sets: Vec<(&CgroupPath, &str)> = writes
            .iter()
            .filter_map(|(cg, k)| match k {
                Knob::CpusetCpus(s) => Some((cg, s.as_str())),
                _ => None,
            })
            .collect();
        sets.sort_by_key(|(cg, _)| cg.as_str().split('/').filter(|s| !s.is_empty()).count());
        let mut errors = Vec::new();
        for (cg, new) in sets {
            let cur = self.read(cg, "cpuset", "cpuset.cpus").ok();
            let (Some(cur), Some(new)) =
                (cur.as_deref().and_then(parse_cpu_list), parse_cpu_list(new))
            else {
                continue;
            };
            if new.is_subset(&cur) {
                continue; // already wide enough
            }
            let union: BTreeSet<u32> = cur.union(&new).copied().collect();
            if let Err(e) = self.apply(cg, &Knob::CpusetCpus(format_cpu_list(&union))) {
                errors.push(e);
            }
        }
        errors
    }

    /// The order in which the kernel accepts several writes of limits over a
    /// parent and its children: for each knob kind, when the new value grows
    /// the limit, parents before children; when it shrinks, children first (a
    /// child may not exceed its parent). Cpusets always go children first,
    /// after [`Cgroups::widen_cpusets`]. Reads the current values it compares.
    pub fn order(&self, writes: &[(CgroupPath, Knob)]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..writes.len()).collect();
        let depth = |cg: &CgroupPath| cg.as_str().split('/').filter(|s| !s.is_empty()).count();
        let grows = |i: usize| -> bool {
            let (cg, k) = &writes[i];
            if matches!(k, Knob::CpusetCpus(_)) {
                return false; // widened first: now only shrinking, children first
            }
            if let Knob::CpuQuota { quota, period } = k {
                // v1's rule is on the quota/period ratio, and a period may change too
                let ratio = |q: Option<u64>, p: u64| match q {
                    None => u128::MAX,
                    Some(q) => (q as u128) * 1_000_000 / (p.max(1) as u128),
                };
                let cur = self.read_cpu_quota(cg).map(|(q, p)| ratio(q, p));
                return ratio(*quota, *period) >= cur.unwrap_or(u128::MAX);
            }
            let Some(new) = k.magnitude() else {
                return true;
            };
            let cur = self
                .plan(k)
                .ok()
                .and_then(|ws| ws.last().cloned())
                .and_then(|w| self.path_of(cg, &w).ok())
                .and_then(|p| self.backend.read(&p).ok());
            let cur = cur.map(|c| current_magnitude(k, &c)).unwrap_or(u64::MAX);
            new >= cur
        };
        let growing: Vec<bool> = (0..writes.len()).map(grows).collect();
        idx.sort_by_key(|&i| {
            let d = depth(&writes[i].0) as i64;
            (writes[i].1.name(), if growing[i] { d } else { -d })
        });
        idx
    }

    /// Applies several writes in [`Cgroups::order`]. Stops at the first
    /// error. Returns the cgroups in the order they were written, with what
    /// each write did.
    pub fn apply_ordered(
        &self,
        writes: &[(CgroupPath, Knob)],
    ) -> Result<Vec<(CgroupPath, Outcome)>, CgroupError> {
        if let Some(e) = self.widen_cpusets(writes).into_iter().next() {
            return Err(e);
        }
        self.order(writes)
            .into_iter()
            .map(|i| {
                self.apply(&writes[i].0, &writes[i].1)
                    .map(|o| (writes[i].0.clone(), o))
            })
            .collect()
    }
}

/// The magnitude of a file's current content, comparable with [`Knob::magnitude`].
fn current_magnitude(k: &Knob, content: &str) -> u64 {
    match k {
        Knob::CpusetCpus(_) => cpu_count(content),
        _ => {
            let first = content.split_whitespace().next().unwrap_or("");
            match first {
                "max" | "-1" => u64::MAX,
                n => n.parse::<u64>().unwrap_or(u64::MAX),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blkio::{Device, IoLimits};
    use crate::detect::tests::tree;
    use crate::detect::Features;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn v1(features: Features) -> Cgroups {
        let controllers: BTreeMap<String, PathBuf> = ["cpu", "memory", "cpuset", "blkio"]
            .iter()
            .map(|c| (c.to_string(), PathBuf::from(format!("/x/{c}"))))
            .collect();
        Cgroups::new(Host {
            root: "/x".into(),
            layout: Layout::V1 { controllers },
            features,
            cgroupfs: false,
        })
    }

    fn v2(features: Features) -> Cgroups {
        Cgroups::new(Host {
            root: "/x".into(),
            layout: Layout::V2 {
                root: "/x".into(),
                controllers: vec!["cpu".into(), "memory".into()],
            },
            features,
            cgroupfs: false,
        })
    }

    fn files(c: &Cgroups, k: Knob) -> Vec<(&'static str, String)> {
        c.plan(&k)
            .unwrap()
            .into_iter()
            .map(|w| (w.file, w.value))
            .collect()
    }

    /// Issue 14 item 8: the Anolis memory files, planned only where the
    /// kernel has each, within koordlet's validator ranges, and put back to
    /// koordlet's `NoneMemoryQOS` values when memory QoS is off.
    #[test]
    fn memory_tunes_where_the_kernel_has_them() {
        let some = MemTunes::default()
            .with(MemTune::WmarkRatio)
            .with(MemTune::OomGroup);
        let c = v1(Features {
            memory_tunes: some,
            ..Default::default()
        });
        let w = c.plan(&Knob::MemoryTune(MemTune::WmarkRatio, 95)).unwrap();
        assert_eq!(
            (w[0].file, w[0].value.as_str()),
            ("memory.wmark_ratio", "95")
        );
        assert!(
            c.plan(&Knob::MemoryTune(MemTune::Priority, 3)).is_err(),
            "no such file here"
        );
        assert!(
            c.plan(&Knob::MemoryTune(MemTune::WmarkRatio, 101)).is_err(),
            "out of range"
        );
        assert!(c.plan(&Knob::MemoryTune(MemTune::OomGroup, 1)).is_ok());
        assert_eq!(
            Knob::MemoryTune(MemTune::WmarkScaleFactor, 20).kernel_default(),
            Some(Knob::MemoryTune(MemTune::WmarkScaleFactor, 50))
        );
        assert_eq!(
            Knob::MemoryTune(MemTune::WmarkRatio, 0).kernel_default(),
            None
        );
        assert_eq!(
            Knob::MemoryTune(MemTune::OomGroup, 1).kernel_default(),
            Some(Knob::MemoryTune(MemTune::OomGroup, 0))
        );
        assert_eq!(
            Knob::MemoryTune(MemTune::Priority, 8).describe(true),
            ("memory.priority".into(), "8".into())
        );
    }

    /// Second review of issue 44: the watch covers only the v1 hierarchies
    /// qoslet writes in, so every file a plan writes must be in one of them.
    #[test]
    fn every_v1_write_is_in_a_watched_hierarchy() {
        let c = v1(Features {
            bvt: true,
            cpu_idle: true,
            cpu_burst: true,
            memory_qos: true,
            blkio_throttle: true,
            memory_tunes: crate::knob::MemTune::ALL
                .iter()
                .fold(Default::default(), |m: crate::knob::MemTunes, t| m.with(*t)),
        });
        let dev = Device { major: 8, minor: 0 };
        let mut knobs = vec![
            Knob::CpuShares(512),
            Knob::CpuQuota {
                quota: Some(50_000),
                period: 100_000,
            },
            Knob::CpuIdle(true),
            Knob::GroupIdentity(-1),
            Knob::CpuBurst(10_000),
            Knob::MemoryLimit(Some(1 << 30)),
            Knob::MemoryMin(1 << 20),
            Knob::MemoryLow(1 << 20),
            Knob::MemoryHigh(Some(1 << 30)),
            Knob::CpusetCpus("0".into()),
            Knob::IoLimit {
                device: dev,
                limits: IoLimits {
                    read_bps: Some(1 << 20),
                    ..Default::default()
                },
            },
        ];
        knobs.extend(
            crate::knob::MemTune::ALL
                .iter()
                .map(|t| Knob::MemoryTune(*t, 1)),
        );
        for k in knobs {
            for w in c.plan(&k).unwrap_or_default() {
                assert!(
                    WRITTEN_V1.contains(&w.controller),
                    "{k:?}: {}",
                    w.controller
                );
            }
        }
    }

    #[test]
    fn plans_per_layout() {
        let all = Features {
            bvt: true,
            cpu_idle: true,
            cpu_burst: true,
            memory_qos: true,
            blkio_throttle: true,
            memory_tunes: Default::default(),
        };
        let (a, b) = (v1(all.clone()), v2(all));
        let s = |v: &str| v.to_string();
        assert_eq!(
            files(&a, Knob::CpuShares(1024)),
            vec![("cpu.shares", s("1024"))]
        );
        assert_eq!(
            files(&b, Knob::CpuShares(1024)),
            vec![("cpu.weight", s("39"))]
        );
        assert_eq!(
            files(&a, Knob::CpuShares(0)),
            vec![("cpu.shares", s("2"))],
            "clamped to the kernel's minimum"
        );
        assert_eq!(
            files(
                &a,
                Knob::CpuQuota {
                    quota: Some(50_000),
                    period: 100_000
                }
            ),
            vec![
                ("cpu.cfs_period_us", s("100000")),
                ("cpu.cfs_quota_us", s("50000"))
            ]
        );
        assert_eq!(
            files(
                &a,
                Knob::CpuQuota {
                    quota: None,
                    period: 100_000
                }
            )[1],
            ("cpu.cfs_quota_us", s("-1"))
        );
        assert_eq!(
            files(
                &b,
                Knob::CpuQuota {
                    quota: Some(50_000),
                    period: 100_000
                }
            ),
            vec![("cpu.max", s("50000 100000"))]
        );
        assert_eq!(
            files(
                &b,
                Knob::CpuQuota {
                    quota: None,
                    period: 100_000
                }
            ),
            vec![("cpu.max", s("max 100000"))]
        );
        assert_eq!(files(&a, Knob::CpuIdle(true)), vec![("cpu.idle", s("1"))]);
        assert_eq!(
            files(&a, Knob::GroupIdentity(-1)),
            vec![("cpu.bvt_warp_ns", s("-1"))]
        );
        assert_eq!(
            files(&a, Knob::CpuBurst(100_000)),
            vec![("cpu.cfs_burst_us", s("100000"))]
        );
        assert_eq!(
            files(&b, Knob::CpuBurst(100_000)),
            vec![("cpu.max.burst", s("100000"))]
        );
        assert_eq!(
            files(&a, Knob::MemoryLimit(None)),
            vec![("memory.limit_in_bytes", s("-1"))]
        );
        assert_eq!(
            files(&b, Knob::MemoryLimit(Some(1 << 20))),
            vec![("memory.max", s("1048576"))]
        );
        assert_eq!(
            files(&b, Knob::MemoryHigh(None)),
            vec![("memory.high", s("max"))]
        );
        assert_eq!(
            files(&a, Knob::CpusetCpus("0-1".into())),
            vec![("cpuset.cpus", s("0-1"))]
        );
    }

    /// Values planned as the kernel will show them (so a steady node reports no
    /// drift): memory in whole pages of this machine, cpusets in canonical form;
    /// values the kernel cannot hold are refused, never wrapped.
    #[test]
    fn planned_as_the_kernel_shows_them() {
        let (a, b) = (
            v1(Features::default()),
            v2(Features {
                memory_qos: true,
                ..Default::default()
            }),
        );
        let pg = page_size();
        let g = 1_000_000_000u64; // "1G"
        assert_eq!(
            files(&a, Knob::MemoryLimit(Some(g))),
            vec![("memory.limit_in_bytes", (g / pg * pg).to_string())]
        );
        assert_eq!(
            files(&b, Knob::MemoryMin(g)),
            vec![("memory.min", (g / pg * pg).to_string())]
        );
        assert_eq!(
            files(&a, Knob::CpusetCpus("3,2,1,0".into())),
            vec![("cpuset.cpus", "0-3".to_string())]
        );
        for k in [
            Knob::MemoryLimit(Some(u64::MAX)),
            Knob::CpuQuota {
                quota: Some(u64::MAX),
                period: 100_000,
            },
            Knob::CpusetCpus("0-9999".into()),
        ] {
            assert!(a.plan(&k).is_err(), "{k:?}");
        }
    }

    fn io(read_bps: Option<u64>, write_iops: Option<u64>) -> Knob {
        Knob::IoLimit {
            device: Device {
                major: 254,
                minor: 0,
            },
            limits: IoLimits {
                read_bps,
                write_iops,
                ..Default::default()
            },
        }
    }

    #[test]
    fn io_limits_per_layout() {
        let f = Features {
            blkio_throttle: true,
            ..Default::default()
        };
        let s = |v: &str| v.to_string();
        assert_eq!(
            files(&v1(f.clone()), io(Some(1 << 20), Some(100))),
            vec![
                ("blkio.throttle.read_bps_device", s("254:0 1048576")),
                ("blkio.throttle.write_bps_device", s("254:0 0")),
                ("blkio.throttle.read_iops_device", s("254:0 0")),
                ("blkio.throttle.write_iops_device", s("254:0 100")),
            ]
        );
        assert_eq!(
            files(&v2(f.clone()), io(Some(1 << 20), None)),
            vec![(
                "io.max",
                s("254:0 rbps=1048576 wbps=max riops=max wiops=max")
            )]
        );
        assert!(
            v1(f).plan(&io(Some(0), None)).is_err(),
            "0 would stop all I/O"
        );
        assert!(v1(Features::default()).plan(&io(Some(1), None)).is_err());
    }

    #[test]
    fn missing_kernel_features_and_absurd_values_are_refused() {
        let up = v1(Features {
            cpu_idle: true,
            ..Default::default()
        });
        for k in [
            Knob::GroupIdentity(2),
            Knob::CpuBurst(1),
            Knob::MemoryMin(1),
            Knob::MemoryHigh(None),
            Knob::CpuQuota {
                quota: Some(10),
                period: 100_000,
            },
            Knob::CpuQuota {
                quota: Some(50_000),
                period: 0,
            },
            Knob::CpusetCpus("x".into()),
            Knob::CpusetCpus(String::new()),
        ] {
            let e = up.plan(&k).unwrap_err();
            assert!(matches!(e, CgroupError::Unsupported { .. }), "{k:?}: {e}");
        }
        assert!(v1(Features {
            bvt: true,
            ..Default::default()
        })
        .plan(&Knob::GroupIdentity(7))
        .is_err());
    }

    #[test]
    fn cpu_lists_parse_and_format() {
        assert_eq!(parse_cpu_list("0-3,8\n"), Some([0, 1, 2, 3, 8].into()));
        assert_eq!(parse_cpu_list(""), Some(BTreeSet::new()));
        assert_eq!(format_cpu_list(&parse_cpu_list("5,1-2").unwrap()), "1-2,5");
        for bad in ["x", "3-1", "1-", "0-999999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_count("0-3,8"), 5);
        assert_eq!(cpu_count("2"), 1);
        assert_eq!(cpu_count("3-1"), 0);
        assert_eq!(cpu_count(""), 0);
        assert_eq!(canonical_cpu_list("3,2,1,0").as_deref(), Some("0-3"));
        assert_eq!(canonical_cpu_list("8, 0-1 ,1").as_deref(), Some("0-1,8"));
        assert_eq!(
            canonical_cpu_list("63-64,127-129").as_deref(),
            Some("63-64,127-129")
        );
        assert_eq!(cpu_count("0-8191"), 8192);
        for bad in ["8192", "0-8192", "+1", "1-+2", "-1", "99999999999", "0x1"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
    }

    /// The shape that stalled CreateContainer for seconds (issue 12): a long
    /// list of overlapping full ranges. Refused past the length cap; below it,
    /// what it builds is capped at MAX_CPUS ids (the end-to-end test checks the
    /// CRI path stays responsive).
    #[test]
    fn hostile_cpu_lists_are_capped() {
        let huge = "0-65536,".repeat(32 << 10);
        assert_eq!(parse_cpu_list(&huge), None);
        assert_eq!(
            parse_cpu_list(&"0-1,".repeat(5000)),
            None,
            "over the length cap"
        );
        let under_cap = "0-8191,".repeat(MAX_CPU_LIST_LEN / 7);
        assert!(under_cap.len() <= MAX_CPU_LIST_LEN);
        assert_eq!(cpu_count(&under_cap), 8192);
    }

    fn v1_tree(tag: &str) -> (PathBuf, Cgroups) {
        let d = tree(
            tag,
            &[
                ("cpu/cgroup.procs", ""),
                ("cpu/cpu.idle", "0\n"),
                ("cpu/kubepods/cpu.cfs_quota_us", "-1\n"),
                ("cpu/kubepods/cpu.cfs_period_us", "100000\n"),
                ("cpu/kubepods/cpu.shares", "1024\n"),
                ("cpu/kubepods/cpu.idle", "0\n"),
                ("cpu/kubepods/be/cpu.cfs_quota_us", "-1\n"),
                ("cpu/kubepods/be/cpu.cfs_period_us", "100000\n"),
                ("memory/cgroup.procs", ""),
            ],
        );
        let c = Cgroups::detect(&d).unwrap();
        (d, c)
    }

    #[test]
    fn typed_reads_parse_each_layout_once() {
        let (d, c) = v1_tree("typed-v1");
        let kp = CgroupPath::parse("/kubepods").unwrap();
        assert_eq!(c.read_cpu_quota(&kp), Some((None, 100_000)));
        std::fs::write(d.join("cpu/kubepods/cpu.cfs_quota_us"), "250000\n").unwrap();
        assert_eq!(c.read_cpu_quota(&kp), Some((Some(250_000), 100_000)));
        assert_eq!(c.read_cpu_quota(&kp.child("gone").unwrap()), None);
        std::fs::remove_dir_all(&d).unwrap();
        let d = tree(
            "typed-v2",
            &[
                ("cgroup.controllers", "cpuset cpu io memory\n"),
                ("cgroup.subtree_control", "cpuset cpu io memory\n"),
                ("kubepods/cpu.max", "max 100000\n"),
                ("kubepods/be/cpu.max", "20000 50000\n"),
                ("kubepods/bad/cpu.max", "lots 100000\n"),
                ("kubepods/cpuset.cpus", "0-3,8\n"),
                ("kubepods/be/cpuset.cpus", "\n"),
                ("kubepods/memory.min", "max\n"),
                ("kubepods/be/memory.min", "4096\n"),
            ],
        );
        let c = Cgroups::detect(&d).unwrap();
        assert!(c.host().is_v2());
        let be = kp.child("be").unwrap();
        assert_eq!(c.read_cpu_quota(&kp), Some((None, 100_000)));
        assert_eq!(c.read_cpu_quota(&be), Some((Some(20_000), 50_000)));
        assert_eq!(
            c.read_cpu_quota(&kp.child("bad").unwrap()),
            None,
            "not unlimited"
        );
        assert_eq!(c.read_cpuset(&kp), Some([0, 1, 2, 3, 8].into()));
        assert_eq!(c.read_cpuset(&be), None, "empty: inherited");
        assert_eq!(
            c.read_memory_protection(&kp, files::MEMORY_MIN),
            Some(u64::MAX)
        );
        assert_eq!(c.read_memory_protection(&be, files::MEMORY_MIN), Some(4096));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn settings_are_named_as_each_layout_names_them() {
        let quota = Knob::CpuQuota {
            quota: Some(50_000),
            period: 100_000,
        };
        assert_eq!(
            quota.describe(false),
            ("cpu.cfs_quota_us".into(), "50000".into())
        );
        assert_eq!(
            quota.describe(true),
            ("cpu.max".into(), "50000 100000".into())
        );
        assert_eq!(Knob::CpuShares(1024).describe(true).0, "cpu.weight");
        assert_eq!(Knob::MemoryLimit(None).describe(false).1, "-1");
        assert_eq!(
            Knob::MemoryLimit(None).describe(true),
            ("memory.max".into(), "max".into())
        );
        assert_eq!(
            Knob::GroupIdentity(-1).describe(true),
            (BVT_FILE.into(), "-1".into())
        );
        // every knob's name is a file its plan writes (or, for I/O, the device's table)
        let c = v1(Features {
            bvt: true,
            cpu_idle: true,
            cpu_burst: true,
            memory_qos: true,
            blkio_throttle: true,
            memory_tunes: Default::default(),
        });
        for k in [
            Knob::CpuShares(2),
            quota.clone(),
            Knob::CpuIdle(true),
            Knob::GroupIdentity(2),
            Knob::CpuBurst(1),
            Knob::MemoryLimit(Some(4096)),
            Knob::MemoryMin(4096),
            Knob::MemoryLow(4096),
            Knob::MemoryHigh(None),
            Knob::CpusetCpus("0-1".into()),
        ] {
            let name = k.describe(false).0;
            assert!(
                c.plan(&k).unwrap().iter().any(|w| w.file == name),
                "{k:?}: {name}"
            );
        }
    }

    #[test]
    fn applies_idempotently_on_a_v1_tree() {
        let (d, c) = v1_tree("apply");
        let be = CgroupPath::parse("/kubepods").unwrap();
        assert_eq!(
            c.apply(&be, &Knob::CpuIdle(true)).unwrap(),
            Outcome::Written
        );
        assert_eq!(
            c.apply(&be, &Knob::CpuIdle(true)).unwrap(),
            Outcome::Unchanged
        );
        assert_eq!(c.read(&be, "cpu", "cpu.idle").unwrap(), "1");
        // a cgroup that is not there (removed since it was listed) is gone,
        // a file the kernel does not offer is missing; neither is created
        let e = c
            .apply(&be.child("nope").unwrap(), &Knob::CpuShares(2))
            .unwrap_err();
        assert!(matches!(e, CgroupError::Gone { .. }), "{e}");
        let e = c.apply(&be, &Knob::GroupIdentity(2)).unwrap_err();
        assert!(
            matches!(
                e,
                CgroupError::Missing { .. } | CgroupError::Unsupported { .. }
            ),
            "{e}"
        );
        assert!(!d.join("cpu/kubepods/nope").exists());
        // a hostile parent never reaches the filesystem
        assert!(CgroupPath::parse("/kubepods/../../../etc").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn quota(q: u64) -> Knob {
        Knob::CpuQuota {
            quota: Some(q),
            period: 100_000,
        }
    }

    #[test]
    fn growing_goes_parent_first_and_shrinking_child_first() {
        let (d, c) = v1_tree("order");
        let parent = CgroupPath::parse("/kubepods").unwrap();
        let child = parent.child("be").unwrap();
        // from unlimited (-1) to a quota is shrinking: children first
        let done = c
            .apply_ordered(&[
                (parent.clone(), quota(200_000)),
                (child.clone(), quota(100_000)),
            ])
            .unwrap();
        assert_eq!(done[0].0, child);
        let done = c
            .apply_ordered(&[
                (child.clone(), quota(200_000)),
                (parent.clone(), quota(400_000)),
            ])
            .unwrap();
        assert_eq!(
            done.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            vec![parent.clone(), child.clone()],
            "growing: parent first"
        );
        let done = c
            .apply_ordered(&[
                (parent.clone(), quota(100_000)),
                (child.clone(), quota(50_000)),
            ])
            .unwrap();
        assert_eq!(
            done.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            vec![child.clone(), parent.clone()],
            "shrinking: child first"
        );
        assert_eq!(
            c.read(&parent, "cpu", "cpu.cfs_quota_us").unwrap(),
            "100000"
        );
        assert_eq!(c.read(&child, "cpu", "cpu.cfs_quota_us").unwrap(), "50000");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// On the real cgroup v1 of this machine (root): the kernel refuses a parent
    /// quota below a child's, so only the right order succeeds.
    #[test]
    fn real_cgroup_v1_quota_order_and_values() {
        let Some(c) = crate::real_v1_host("real_cgroup_v1_quota_order_and_values") else {
            return;
        };
        if c.host().is_v2() {
            // the kernel-rule check below is v1's; v2 is covered by the tree tests
            return crate::skip_test(
                "real_cgroup_v1_quota_order_and_values",
                "the host is cgroup v2",
            );
        }
        let name = format!("qoslet-cgtest-{}", std::process::id());
        let parent = CgroupPath::parse(&format!("/qoslet-test/{name}")).unwrap();
        let child = parent.child("child").unwrap();
        let cpu = c.host().hierarchy("cpu").unwrap().to_path_buf();
        std::fs::create_dir_all(child.under(&cpu).unwrap())
            .expect("mkdir a real cgroup (needs root)");
        let cleanup = || {
            let _ = std::fs::remove_dir(child.under(&cpu).unwrap());
            let _ = std::fs::remove_dir(parent.under(&cpu).unwrap());
        };
        let r = (|| -> Result<(), CgroupError> {
            c.apply_ordered(&[
                (parent.clone(), quota(200_000)),
                (child.clone(), quota(100_000)),
            ])?;
            // grow both, child listed first: must still succeed (parent written first)
            c.apply_ordered(&[
                (child.clone(), quota(300_000)),
                (parent.clone(), quota(400_000)),
            ])?;
            // shrink both, parent listed first: must still succeed (child written first)
            c.apply_ordered(&[
                (parent.clone(), quota(100_000)),
                (child.clone(), quota(50_000)),
            ])?;
            assert_eq!(c.read(&parent, "cpu", "cpu.cfs_quota_us")?, "100000");
            assert_eq!(c.read(&child, "cpu", "cpu.cfs_quota_us")?, "50000");
            // the kernel really enforces the rule this ordering exists for
            let e = c.apply(&parent, &quota(20_000)).unwrap_err();
            assert!(
                e.to_string().contains("cpu.cfs_quota_us") && e.to_string().contains("20000"),
                "{e}"
            );
            // a period change (review of issue 15 item 12): the parent allows 20 %; the
            // child goes from 19000/100000 to 2000/10000 (both within 20 %). Period
            // first would pass through 19000/10000 = 190 % (EINVAL): the quota goes first
            let qp = |q: u64, p: u64| Knob::CpuQuota {
                quota: Some(q),
                period: p,
            };
            c.apply(&child, &qp(19_000, 100_000))?;
            c.apply(&parent, &quota(20_000))?;
            c.apply(&child, &qp(2_000, 10_000))?;
            assert_eq!(c.read(&child, "cpu", "cpu.cfs_period_us")?, "10000");
            // and back to the longer period (period first: 2000/100000 on the way)
            c.apply(&child, &qp(19_000, 100_000))?;
            assert_eq!(c.read(&child, "cpu", "cpu.cfs_quota_us")?, "19000");
            // the order compares quota/period ratios: the child's 1500/10000 (15 %) is
            // more than the parent's 2 % now, so the parent is lifted first, though
            // 1500 < 2000 in absolute terms
            c.apply(&child, &qp(2_000, 100_000))?;
            c.apply(&parent, &quota(2_000))?;
            c.apply_ordered(&[
                (child.clone(), qp(1_500, 10_000)),
                (
                    parent.clone(),
                    Knob::CpuQuota {
                        quota: None,
                        period: 100_000,
                    },
                ),
            ])?;
            assert_eq!(c.read(&child, "cpu", "cpu.cfs_quota_us")?, "1500");
            c.apply(&child, &Knob::CpuShares(2))?;
            assert_eq!(c.read(&child, "cpu", "cpu.shares")?, "2");
            if c.host().features.cpu_idle {
                c.apply(&child, &Knob::CpuIdle(true))?;
                assert_eq!(c.read(&child, "cpu", "cpu.idle")?, "1");
            }
            Ok(())
        })();
        cleanup();
        r.unwrap();
    }

    /// Issue 15 on this machine's real cgroup v1: a parent and child on CPU 1
    /// move to CPU 0 (the same count, other CPUs): without the union step the
    /// parent's write meets EBUSY and the child's EACCES; and the kernel
    /// refuses a CFS burst above the quota (the engine clamps to it).
    #[test]
    fn real_cgroup_v1_same_size_cpuset_move_and_burst_rule() {
        let Some(c) = crate::real_v1_host("real_cgroup_v1_same_size_cpuset_move_and_burst_rule")
        else {
            return;
        };
        assert!(
            !c.host().is_v2(),
            "this test checks v1's rules; this host is v2"
        );
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let cpus = parse_cpu_list(&online).unwrap();
        assert!(cpus.len() >= 2, "needs two CPUs");
        let (a, b): (u32, u32) = (*cpus.iter().next().unwrap(), *cpus.iter().nth(1).unwrap());
        let name = format!("qoslet-cpusettest-{}", std::process::id());
        let parent = CgroupPath::parse(&format!("/qoslet-test/{name}")).unwrap();
        let child = parent.child("child").unwrap();
        let cs = c.host().hierarchy("cpuset").unwrap().to_path_buf();
        let cpu = c.host().hierarchy("cpu").unwrap().to_path_buf();
        for h in [&cs, &cpu] {
            std::fs::create_dir_all(child.under(h).unwrap()).expect("mkdir (needs root)");
        }
        // a fresh v1 cpuset cgroup starts empty: the shared /qoslet-test dir (made
        // here when no runc made it first) gets the root's CPUs and memory nodes
        let mems = std::fs::read_to_string(cs.join("cpuset.mems")).unwrap();
        let all = std::fs::read_to_string(cs.join("cpuset.cpus")).unwrap();
        let top = cs.join("qoslet-test");
        for (f, v) in [("cpuset.cpus", &all), ("cpuset.mems", &mems)] {
            if std::fs::read_to_string(top.join(f))
                .unwrap()
                .trim()
                .is_empty()
            {
                std::fs::write(top.join(f), v.trim()).unwrap();
            }
        }
        for cg in [&parent, &child] {
            let _ = std::fs::write(cg.under(&cs).unwrap().join("cpuset.mems"), mems.trim());
        }
        let cleanup = || {
            for h in [&cs, &cpu] {
                let _ = std::fs::remove_dir(child.under(h).unwrap());
                let _ = std::fs::remove_dir(parent.under(h).unwrap());
            }
        };
        let r = (|| -> Result<(), CgroupError> {
            let set = |cg: &CgroupPath, v: u32| (cg.clone(), Knob::CpusetCpus(v.to_string()));
            c.apply_ordered(&[set(&parent, b), set(&child, b)])?;
            // the kernel's rule: the parent cannot leave CPU b while its child is on it
            assert!(c.apply(&parent, &Knob::CpusetCpus(a.to_string())).is_err());
            c.apply_ordered(&[set(&parent, a), set(&child, a)])?;
            assert_eq!(c.read(&parent, "cpuset", "cpuset.cpus")?, a.to_string());
            assert_eq!(c.read(&child, "cpuset", "cpuset.cpus")?, a.to_string());
            if c.host().features.cpu_burst {
                c.apply(&child, &quota(100_000))?;
                let e = c.apply(&child, &Knob::CpuBurst(200_000)).unwrap_err();
                assert!(e.to_string().contains("cfs_burst_us"), "{e}");
                c.apply(&child, &Knob::CpuBurst(100_000))?;
            }
            Ok(())
        })();
        cleanup();
        r.unwrap();
    }

    /// The real blkio throttle files of this machine: one device's lines are
    /// written, compared by line (idempotent) and removed again.
    #[test]
    fn real_cgroup_v1_io_limits() {
        let Some(c) = crate::real_v1_host("real_cgroup_v1_io_limits") else {
            return;
        };
        let skip = |why| crate::skip_test("real_cgroup_v1_io_limits", why);
        let Some(blkio) = c.host().hierarchy("blkio").map(PathBuf::from) else {
            return skip("no blkio hierarchy");
        };
        if c.host().is_v2() || !c.host().features.blkio_throttle {
            return skip("no v1 blkio throttling on this host");
        }
        let parts = std::fs::read_to_string("/proc/partitions").unwrap();
        let Some(device) = parts.lines().skip(2).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Device::parse_numbers(&format!("{}:{}", f.first()?, f.get(1)?))
        }) else {
            return skip("no block device in /proc/partitions");
        };
        let cg = CgroupPath::parse(&format!("/qoslet-test/io-{}", std::process::id())).unwrap();
        std::fs::create_dir_all(cg.under(&blkio).unwrap()).unwrap();
        let r = (|| -> Result<(), CgroupError> {
            let lim = |r| Knob::IoLimit {
                device,
                limits: IoLimits {
                    read_bps: r,
                    write_iops: Some(500),
                    ..Default::default()
                },
            };
            assert_eq!(c.apply(&cg, &lim(Some(10 << 20)))?, Outcome::Written);
            assert_eq!(c.apply(&cg, &lim(Some(10 << 20)))?, Outcome::Unchanged);
            assert_eq!(
                c.read(&cg, "blkio", "blkio.throttle.read_bps_device")?,
                format!("{device} {}", 10 << 20)
            );
            assert_eq!(
                c.read(&cg, "blkio", "blkio.throttle.write_iops_device")?,
                format!("{device} 500")
            );
            assert_eq!(c.apply(&cg, &lim(None))?, Outcome::Written);
            assert_eq!(c.read(&cg, "blkio", "blkio.throttle.read_bps_device")?, "");
            assert_eq!(c.apply(&cg, &lim(None))?, Outcome::Unchanged);
            Ok(())
        })();
        let _ = std::fs::remove_dir(cg.under(&blkio).unwrap());
        r.unwrap();
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;
    use crate::detect::Features;
    use crate::memfs::MemFs;

    /// The kernel refuses a cpu.weight write to an idle group (EINVAL from
    /// sched_group_set_shares) and holds it at the minimum weight: a weight
    /// for a group that is idle is not written; once it is not idle, it is.
    #[test]
    fn a_weight_is_not_written_to_an_idle_group() {
        let m = MemFs::new();
        let c = m.v2(Features {
            cpu_idle: true,
            ..Default::default()
        });
        let cg = CgroupPath::parse(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice",
        )
        .unwrap();
        let dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice";
        m.set(&format!("{dir}/cpu.idle"), "1\n");
        m.set(&format!("{dir}/cpu.weight"), "0\n");
        let before = m.writes().len();
        assert_eq!(
            c.apply(&cg, &Knob::CpuShares(512)).unwrap(),
            Outcome::Unchanged
        );
        assert_eq!(
            m.writes().len(),
            before,
            "no write to an idle group's weight"
        );
        m.set(&format!("{dir}/cpu.idle"), "0\n");
        assert_eq!(
            c.apply(&cg, &Knob::CpuShares(512)).unwrap(),
            Outcome::Written
        );
        assert_eq!(m.at(&format!("{dir}/cpu.weight")).as_deref(), Some("20"));
    }
}
