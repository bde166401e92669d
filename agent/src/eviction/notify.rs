//! The kernel wakes the eviction loop: cgroup v1's memory threshold
//! notification (`cgroup.event_control` with an eventfd on the cgroup's
//! `memory.usage_in_bytes`), armed as kubelet arms it: for each memory
//! threshold, usage crossing capacity − threshold + inactive file, on the
//! scope's cgroup (`memory.available`) and the pods' root
//! (`allocatableMemory.available`); armed again as the inactive file moves.
//! Each armed notification is a task that waits on its eventfd and wakes the
//! loop. cgroup v2 (a PSI trigger on `memory.pressure`) is not here yet: on v2
//! the loop's one-second tick is the only wake-up.

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
    armed: Vec<(PathBuf, i64, JoinHandle<()>)>,
}

impl Drop for Notifiers {
    fn drop(&mut self) {
        for (_, _, t) in &self.armed {
            t.abort();
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
            if let Some(i) = self.armed.iter().position(|(d, l, t)| {
                // a notification whose task ended (a read failed, the
                // cgroup went away) is armed again
                *d == dir && (l - level).abs() < REARM_SLACK && !t.is_finished()
            }) {
                keep.push(self.armed.swap_remove(i));
                continue;
            }
            match arm(&dir, level) {
                Ok(a) => {
                    debug!(cgroup = %dir.display(), level, "memory threshold notification armed");
                    let _g = rt.enter();
                    let task = rt.spawn(watch(a, self.notify.clone()));
                    keep.push((dir, level, task));
                }
                Err(e) => {
                    warn!(cgroup = %dir.display(), error = %e, "memory threshold notification not armed")
                }
            }
        }
        for (_, _, t) in self.armed.drain(..) {
            t.abort();
        }
        self.armed = keep;
    }

    /// Resolves when the kernel reports a crossing (never, when none is armed).
    pub async fn crossed(&self) {
        self.notify.notified().await
    }

    pub fn armed(&self) -> usize {
        self.armed.len()
    }
}
