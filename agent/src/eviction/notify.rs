//! The kernel wakes the eviction loop: cgroup v1's memory threshold
//! notification (`cgroup.event_control` with an eventfd on the cgroup's
//! `memory.usage_in_bytes`), armed as kubelet arms it: for each memory
//! threshold, usage crossing capacity − threshold + inactive file, on the
//! scope's cgroup (`memory.available`) and the pods' root
//! (`allocatableMemory.available`); armed again as the inactive file moves.
//! Each armed notification is a task that waits on its eventfd and wakes the
//! loop. A level is armed again at most every [`REARM_EVERY`] (each v1
//! register and unregister takes the memcg's thresholds lock and waits for
//! an RCU grace period; kubelet re-arms every 10 s): between, a moved level
//! only makes a wake-up early or leaves it to the tick.
//!
//! cgroup v2 has no usage thresholds: the scope's (or the root's)
//! `memory.pressure` gets a PSI trigger (`some 150000 1000000`: 150 ms of
//! stall within 1 s; a kernel refuses windows that are not multiples of 2 s
//! to an opener without CAP_SYS_RESOURCE, and then `some 300000 2000000` is
//! armed), and `memory.events.local` of the scope and of the pods' root
//! (their own events: `memory.events` would count every container at its
//! own limit) wake the loop when one of their counters moves (`high`,
//! `max`, `oom`, `oom_kill`; kernfs marks the file: poll's POLLPRI). A file
//! that cannot be armed or watched is tried again after 5 min.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qoslet_eviction::{Signal, Threshold};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::observe::Sources;

/// A notification is armed again only when its level moved by this much.
const REARM_SLACK: i64 = 1 << 20;
/// ... and at most this often.
const REARM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// The PSI trigger: 150 ms of memory stall within a 1 s window.
pub const PSI_TRIGGER: &str = "some 150000 1000000";
/// The one an opener without CAP_SYS_RESOURCE may arm (a 2 s window).
pub const PSI_TRIGGER_UNPRIVILEGED: &str = "some 300000 2000000";

/// An armed notification: its eventfd and the usage file it watches.
pub struct Armed {
    efd: OwnedFd,
    _usage: File,
}

/// Arms a memory threshold notification on the v1 memory cgroup `dir` for
/// usage crossing `level` bytes.
pub fn arm(dir: &Path, level: i64) -> std::io::Result<Armed> {
    use rustix::event::{eventfd, EventfdFlags};
    let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
    let usage = File::open(dir.join("memory.usage_in_bytes"))?;
    let mut ctl = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?;
    ctl.write_all(
        format!(
            "{} {} {}",
            efd.as_fd().as_raw_fd(),
            usage.as_raw_fd(),
            level.max(0)
        )
        .as_bytes(),
    )?;
    Ok(Armed { efd, _usage: usage })
}

/// Waits for the eventfd, then wakes `notify`; again and again.
async fn watch(armed: Armed, notify: Arc<Notify>) {
    let Armed { efd, _usage } = armed;
    // `AsyncFd::new` is deprecated for types whose fd could change or close
    // while registered; an `OwnedFd` owned by the AsyncFd cannot (and
    // `register`, its replacement, is `unsafe`, which this crate forbids)
    #[allow(deprecated)]
    let fd = match AsyncFd::new(efd) {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "memory threshold notification not watched");
            return;
        }
    };
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return;
        };
        let mut buf = [0u8; 8];
        match guard.try_io(|f| rustix::io::read(f.get_ref(), &mut buf).map_err(Into::into)) {
            Ok(Ok(_)) => notify.notify_one(),
            Ok(Err(e)) => {
                warn!(error = %e, "memory threshold notification failed");
                return;
            }
            Err(_would_block) => continue,
        }
    }
}

/// The notifications armed now.
#[derive(Default)]
pub struct Notifiers {
    notify: Arc<Notify>,
    armed: Vec<(PathBuf, i64, std::time::Instant, JoinHandle<()>)>,
    /// v2: the files watched (PSI triggers, memory.events).
    watched: Vec<(PathBuf, JoinHandle<()>)>,
    /// v2: files that could not be armed or watched, and when (tried again
    /// after [`RETRY_FAILED`]).
    failed: Vec<(PathBuf, std::time::Instant)>,
}

/// A v2 file that could not be armed is tried again after this.
const RETRY_FAILED: std::time::Duration = std::time::Duration::from_secs(300);

impl Drop for Notifiers {
    fn drop(&mut self) {
        for (_, _, _, t) in &self.armed {
            t.abort();
        }
        for (_, t) in &self.watched {
            t.abort();
        }
    }
}

/// The cgroup's own memory events (`memory.events` counts its whole
/// subtree: every container at its own limit would wake the loop).
const EVENTS: &str = "memory.events.local";

/// What cgroup v2 watches: the PSI file of the scope (the root's when
/// none), and `memory.events.local` of the scope and of the pods' root.
pub fn wanted_v2(s: &Sources) -> Vec<PathBuf> {
    let Some(base) = s.host.hierarchy("memory").filter(|_| s.host.is_v2()) else {
        return vec![];
    };
    let scope = s
        .scope
        .clone()
        .unwrap_or_else(qoslet_cgroups::CgroupPath::root);
    let mut out = vec![];
    if let Ok(d) = scope.under(base) {
        out.push(d.join("memory.pressure"));
        if scope != qoslet_cgroups::CgroupPath::root() {
            out.push(d.join(EVENTS));
        }
    }
    if let Ok(d) = s.pods_root.under(base) {
        let f = d.join(EVENTS);
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// Arms a PSI trigger on `path` (a `*.pressure` file): [`PSI_TRIGGER`], or
/// where the kernel refuses it to this opener, [`PSI_TRIGGER_UNPRIVILEGED`].
/// The file stays open while the trigger lives; returns it and the trigger.
pub fn arm_psi(path: &Path) -> std::io::Result<(File, &'static str)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    for t in [PSI_TRIGGER, PSI_TRIGGER_UNPRIVILEGED] {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc_o_nonblock())
            .open(path)?;
        // the kernel replaces the write's last byte with NUL: send one
        match f.write_all(format!("{t}\0").as_bytes()) {
            Ok(()) => return Ok((f, t)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no trigger armed")))
}

fn libc_o_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// Waits for the kernel to mark `file` (POLLPRI: a PSI trigger's window, a
/// kernfs file's change), then wakes `notify`; again and again. A
/// `memory.events` file is read after each mark (kernfs marks it again only
/// after a read).
async fn watch_priority(file: File, notify: Arc<Notify>, reread: bool) {
    use std::io::{Read, Seek};
    use tokio::io::Interest;
    #[allow(deprecated)]
    let fd = match AsyncFd::with_interest(file, Interest::PRIORITY) {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "kernel notification not watched (not a kernel file?)");
            return;
        }
    };
    let mut last: Option<Vec<u8>> = None;
    loop {
        let Ok(mut guard) = fd.ready(Interest::PRIORITY).await else {
            return;
        };
        // memory.events.local: read again (kernfs marks it again only after
        // a read), and a wake-up only when a counter moved
        let moved = if reread {
            let mut f = fd.get_ref();
            let mut buf = vec![0u8; 512];
            let n = f
                .seek(std::io::SeekFrom::Start(0))
                .and_then(|_| f.read(&mut buf))
                .unwrap_or(0);
            buf.truncate(n);
            let moved = last.as_ref() != Some(&buf);
            last = Some(buf);
            moved
        } else {
            true
        };
        guard.clear_ready();
        if moved {
            notify.notify_one();
        }
    }
}

/// Where and at what level each memory threshold wants a notification
/// (kubelet's `UpdateThreshold`): capacity − threshold + inactive file.
/// `be_percent`: Koordinator's `memoryEvictThresholdPercent` when its BE
/// model is on (its working set crossing that share of the capacity).
pub fn wanted(
    s: &Sources,
    thresholds: &[Threshold],
    be_percent: Option<i64>,
) -> Vec<(PathBuf, i64)> {
    let mut out = vec![];
    if s.host.is_v2() {
        return out;
    }
    let Some(base) = s.host.hierarchy("memory") else {
        return out;
    };
    for t in thresholds {
        let (cg, capacity, inactive) = match t.signal {
            Signal::MemoryAvailable => {
                let cg = s
                    .scope
                    .clone()
                    .unwrap_or_else(qoslet_cgroups::CgroupPath::root);
                let Ok((o, m)) = s.node_memory() else {
                    continue;
                };
                (cg, o.capacity, m.inactive_file)
            }
            Signal::AllocatableMemoryAvailable => {
                let Ok(m) = s.cgroup_memory(&s.pods_root) else {
                    continue;
                };
                let Ok(cap) = s.capacity() else { continue };
                (
                    s.pods_root.clone(),
                    m.limit.unwrap_or(cap).min(cap),
                    m.inactive_file,
                )
            }
            _ => continue,
        };
        let Ok(dir) = cg.under(base) else { continue };
        out.push((dir, capacity - t.value.of(capacity) + inactive));
    }
    if let Some(pct) = be_percent {
        let cg = s
            .scope
            .clone()
            .unwrap_or_else(qoslet_cgroups::CgroupPath::root);
        if let (Ok((o, m)), Ok(dir)) = (s.node_memory(), cg.under(base)) {
            out.push((dir, o.capacity / 100 * pct + m.inactive_file));
        }
    }
    out
}

impl Notifiers {
    /// Arms what `wanted` asks for and is not armed within [`REARM_SLACK`];
    /// drops the rest. Blocking (cgroup files): call it off the async workers.
    pub fn rearm_blocking(&mut self, wanted: Vec<(PathBuf, i64)>, rt: &tokio::runtime::Handle) {
        let mut keep = vec![];
        for (dir, level) in wanted {
            if let Some(i) = self.armed.iter().position(|(d, l, at, t)| {
                // a notification whose task ended (a read failed, the
                // cgroup went away) is armed again
                *d == dir
                    && ((l - level).abs() < REARM_SLACK || at.elapsed() < REARM_EVERY)
                    && !t.is_finished()
            }) {
                keep.push(self.armed.swap_remove(i));
                continue;
            }
            match arm(&dir, level) {
                Ok(a) => {
                    debug!(cgroup = %dir.display(), level, "memory threshold notification armed");
                    let _g = rt.enter();
                    let task = rt.spawn(watch(a, self.notify.clone()));
                    keep.push((dir, level, std::time::Instant::now(), task));
                }
                Err(e) => {
                    warn!(cgroup = %dir.display(), error = %e, "memory threshold notification not armed")
                }
            }
        }
        for (_, _, _, t) in self.armed.drain(..) {
            t.abort();
        }
        self.armed = keep;
    }

    /// cgroup v2: watches what [`wanted_v2`] lists (PSI triggers armed,
    /// `memory.events` marks); a file already watched is kept. Blocking
    /// (cgroup files): call it off the async workers.
    pub fn watch_v2_blocking(&mut self, wanted: Vec<PathBuf>, rt: &tokio::runtime::Handle) {
        let mut keep = vec![];
        // a watch whose task ended (not pollable, a read failed) waits too
        for (p, t) in &self.watched {
            if t.is_finished() && !self.failed.iter().any(|(f, _)| f == p) {
                self.failed.push((p.clone(), std::time::Instant::now()));
            }
        }
        self.failed.retain(|(_, at)| at.elapsed() < RETRY_FAILED);
        for path in wanted {
            if let Some(i) = self
                .watched
                .iter()
                .position(|(p, t)| *p == path && !t.is_finished())
            {
                keep.push(self.watched.swap_remove(i));
                continue;
            }
            if self.failed.iter().any(|(p, _)| *p == path) {
                continue;
            }
            let psi = path.extension().is_some_and(|e| e == "pressure");
            let opened = if psi {
                arm_psi(&path).map(|(f, t)| {
                    debug!(path = %path.display(), trigger = t, "PSI trigger armed");
                    f
                })
            } else {
                File::open(&path)
            };
            match opened {
                Ok(f) => {
                    let _g = rt.enter();
                    let task = rt.spawn(watch_priority(f, self.notify.clone(), !psi));
                    keep.push((path, task));
                }
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "memory notification not armed (the one-second tick remains; tried again in 5 min)");
                    self.failed.push((path, std::time::Instant::now()));
                }
            }
        }
        for (_, t) in self.watched.drain(..) {
            t.abort();
        }
        self.watched = keep;
    }

    /// The v2 files watched now.
    pub fn watched(&self) -> Vec<PathBuf> {
        self.watched
            .iter()
            .filter(|(_, t)| !t.is_finished())
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Resolves when the kernel reports a crossing (never, when none is armed).
    pub async fn crossed(&self) {
        self.notify.notified().await
    }

    pub fn armed(&self) -> usize {
        self.armed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel (cgroup v1, PSI on, no CAP_SYS_RESOURCE in the
    /// test's container: its 1 s window is refused) takes the 2 s trigger on
    /// the system's `/proc/pressure/memory`, and tokio watches it for POLLPRI.
    #[tokio::test]
    async fn a_psi_trigger_is_armed_on_the_real_kernel() {
        let p = Path::new("/proc/pressure/memory");
        if !p.exists() {
            // fails under run-tests.sh (QOSLET_STRICT_TESTS): CI's kernel has PSI
            qoslet_cgroups::skip_test(
                "a_psi_trigger_is_armed_on_the_real_kernel",
                "no PSI on this kernel",
            );
            return;
        }
        let (f, trigger) = arm_psi(p).expect("a PSI trigger");
        assert!([PSI_TRIGGER, PSI_TRIGGER_UNPRIVILEGED].contains(&trigger));
        eprintln!("armed {trigger:?}");
        let task = tokio::spawn(watch_priority(f, Arc::new(Notify::new()), false));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !task.is_finished(),
            "the trigger's file could not be watched"
        );
        task.abort();
    }

    /// On a file tree (no kernel behind the files) the trigger is written as
    /// the kernel expects, and watching fails safe: logged, the task ends,
    /// the tick remains; `wanted_v2` lists the scope's PSI and memory.events
    /// files and the pods' root's memory.events.
    #[tokio::test]
    async fn v2_files_on_a_tree_are_armed_and_fail_safe() {
        let root = qoslet_cgroups::testing::tree(
            "notify-v2",
            &[
                ("cgroup.controllers", "cpu memory\n"),
                ("scope/memory.pressure", ""),
                (
                    "scope/memory.events.local",
                    "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
                ),
                (
                    "scope/kubepods/memory.events.local",
                    "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
                ),
            ],
        );
        let host = qoslet_cgroups::Host::detect(&root).unwrap();
        assert!(host.is_v2());
        let s = Sources {
            host,
            proc_root: root.clone(),
            scope: Some(qoslet_cgroups::CgroupPath::parse("/scope").unwrap()),
            pods_root: qoslet_cgroups::CgroupPath::parse("/scope/kubepods").unwrap(),
            memory_capacity: None,
            nodefs: None,
            imagefs: None,
            pod_logs: None,
        };
        let w = wanted_v2(&s);
        assert_eq!(
            w,
            [
                root.join("scope/memory.pressure"),
                root.join("scope/memory.events.local"),
                root.join("scope/kubepods/memory.events.local")
            ]
        );
        let (_f, t) = arm_psi(&w[0]).unwrap();
        assert_eq!(t, PSI_TRIGGER);
        assert_eq!(
            std::fs::read_to_string(&w[0]).unwrap(),
            format!("{PSI_TRIGGER}\0")
        );
        let mut n = Notifiers::default();
        let rt = tokio::runtime::Handle::current();
        let mut n = tokio::task::spawn_blocking(move || {
            n.watch_v2_blocking(w, &rt);
            n
        })
        .await
        .unwrap();
        // regular files cannot be polled for POLLPRI: the watches end
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(n.watched().is_empty());
        // and a v1 host wants none of it
        let v1_root = qoslet_cgroups::testing::tree(
            "notify-v1",
            &[("memory/cgroup.procs", ""), ("cpu/cgroup.procs", "")],
        );
        let v1 = Sources {
            host: qoslet_cgroups::Host::detect(&v1_root).unwrap(),
            ..s
        };
        assert!(!v1.host.is_v2());
        assert!(wanted_v2(&v1).is_empty());
        n.watched.clear();
    }
}
