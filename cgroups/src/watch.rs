//! Who else writes the cgroups qoslet owns files in: one inotify watch per
//! cgroup directory, reporting each directory a file was written in since the
//! last look.
//!
//! Why: qoslet writes some values straight into cgroupfs (a BE pod's quota on
//! its slice, memory QoS, I/O limits) where another writer has its own idea
//! of them. With kubelet's systemd driver, systemd owns the pod slices and the
//! containers' scopes: whenever it applies a unit's properties again (a
//! property of the unit changed, `systemctl set-property`, kubelet's
//! QoS-level updates) it writes every attribute it manages, `cpu.max` and
//! `memory.max` among them, and qoslet's values are gone (Koordinator's users
//! see a BE quota reset every minute). The kernel tells of every such write:
//! a write(2) to any file raises IN_MODIFY on its directory's watch, whoever
//! wrote. So the engine re-reads what it owns in a cgroup on the tick after
//! anyone wrote there, and puts its value back: within one tick, without
//! reading every file every tick, and without a fight (it writes only what
//! differs; a writer that keeps undoing it meets the executor's back-off).
//!
//! Each event names its file, so only the files qoslet owns there are re-read
//! (a file that is another's view of the same value is reported as that one:
//! a write to `cpu.weight.nice` is a write to `cpu.weight`).
//! The files the kernel itself updates and notifies (`cgroup.events`,
//! `memory.events`, `pids.events`, `cpuset.cpus.partition`...) are not
//! writes and are not reported. Watching reads nothing and writes nothing.
//!
//! Kernels before 7.1 send no IN_IGNORED when a cgroup directory is removed
//! (kernfs), so a watch is dropped by its owner ([`Watch::retain`]) when no
//! file of that cgroup is owned any more, and [`Watch::watch`] always asks the
//! kernel again: the same directory gives the same watch descriptor, a
//! directory made anew at the same path a new one (the old one is dropped).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::inotify;

use crate::CgroupPath;

/// The inotify instance of a host backend, made on the first watch.
#[derive(Debug, Default)]
pub struct Watch {
    inner: Mutex<Option<Inner>>,
}

#[derive(Debug)]
struct Inner {
    fd: OwnedFd,
    /// Each watch: its directory and the cgroup it is a directory of.
    by_wd: HashMap<i32, (PathBuf, CgroupPath)>,
    by_dir: HashMap<PathBuf, i32>,
    /// Events were lost (the kernel's queue overflowed) since the last look.
    lost: bool,
    /// A watch could not be added (the user's inotify limit): said once.
    warned: bool,
}

/// What [`Watch::written`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The files written in watched cgroups (cgroup, file name), each once.
    Some(Vec<(CgroupPath, String)>),
    /// Events were lost: any watched file may have been written.
    Unknown,
}

/// The file whose value a write to `name` changes: `cpu.weight.nice` sets
/// `cpu.weight` (the kernel keeps one weight behind both).
fn alias_of(name: &[u8]) -> &[u8] {
    match name {
        b"cpu.weight.nice" => b"cpu.weight",
        n => n,
    }
}

/// Whether a file name is one the kernel updates and notifies by itself.
fn kernel_notified(name: &[u8]) -> bool {
    name.ends_with(b".events")
        || name.ends_with(b".events.local")
        || name.ends_with(b".pressure")
        || name == b"cpuset.cpus.partition"
}

impl Watch {
    /// Watches `dir` (a directory of cgroup `cg`) for writes to its files,
    /// asking the kernel every time (a directory made anew at a watched path
    /// gets its own watch). An error (no inotify, the user's watch limit
    /// reached, the directory gone) is returned for the caller to fall back on
    /// re-reading files by schedule.
    pub fn watch(&self, dir: &Path, cg: &CgroupPath) -> std::io::Result<()> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
            *g = Some(Inner {
                fd,
                by_wd: HashMap::new(),
                by_dir: HashMap::new(),
                lost: false,
                warned: false,
            });
        }
        let inner = g.as_mut().expect("made above");
        let wd = match inotify::add_watch(
            &inner.fd,
            dir,
            inotify::WatchFlags::MODIFY
                | inotify::WatchFlags::ONLYDIR
                | inotify::WatchFlags::DONT_FOLLOW,
        ) {
            Ok(wd) => wd,
            Err(e) => {
                if e == rustix::io::Errno::NOSPC && !inner.warned {
                    inner.warned = true;
                    tracing::warn!(
                        dir = %dir.display(),
                        "inotify watch limit reached (fs.inotify.max_user_watches): cgroups past it are re-checked on the drift schedule only"
                    );
                }
                return Err(e.into());
            }
        };
        if let Some(old) = inner.by_dir.insert(dir.to_path_buf(), wd) {
            if old != wd {
                // the directory was made anew: the old one's watch pins a dead inode
                inner.by_wd.remove(&old);
                let _ = inotify::remove_watch(&inner.fd, old);
            }
        }
        inner.by_wd.insert(wd, (dir.to_path_buf(), cg.clone()));
        Ok(())
    }

    /// Drops the watches of the cgroups `keep` says no to.
    pub fn retain(&self, mut keep: impl FnMut(&CgroupPath) -> bool) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(inner) = g.as_mut() else { return };
        let drop: Vec<i32> = inner
            .by_wd
            .iter()
            .filter(|(_, (_, cg))| !keep(cg))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in drop {
            if let Some((dir, _)) = inner.by_wd.remove(&wd) {
                inner.by_dir.remove(&dir);
            }
            let _ = inotify::remove_watch(&inner.fd, wd);
        }
    }

    /// The files written in watched cgroups since the last call (anyone's
    /// write, qoslet's own too). Never blocks.
    pub fn written(&self) -> Written {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(inner) = g.as_mut() else {
            return Written::Some(Vec::new());
        };
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut out: Vec<(CgroupPath, String)> = Vec::new();
        let mut seen: std::collections::HashSet<(i32, String)> = Default::default();
        let mut gone: Vec<i32> = Vec::new();
        {
            let mut r = inotify::Reader::new(&inner.fd, &mut buf);
            loop {
                let ev = match r.next() {
                    Ok(ev) => ev,
                    Err(rustix::io::Errno::INTR) => continue,
                    // WOULDBLOCK: all read; anything else: nothing more to read now
                    Err(_) => break,
                };
                let flags = ev.events();
                if flags.contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
                    inner.lost = true;
                    continue;
                }
                if flags.contains(inotify::ReadFlags::IGNORED) {
                    gone.push(ev.wd());
                    continue;
                }
                if !flags.contains(inotify::ReadFlags::MODIFY) {
                    continue;
                }
                let Some(name) = ev.file_name().map(|n| n.to_bytes()) else {
                    continue;
                };
                if kernel_notified(name) {
                    continue;
                }
                if let Some((_, cg)) = inner.by_wd.get(&ev.wd()) {
                    let name = String::from_utf8_lossy(alias_of(name)).into_owned();
                    if seen.insert((ev.wd(), name.clone())) {
                        out.push((cg.clone(), name));
                    }
                }
            }
        }
        for wd in gone {
            if let Some((dir, _)) = inner.by_wd.remove(&wd) {
                inner.by_dir.remove(&dir);
            }
        }
        if std::mem::take(&mut inner.lost) {
            return Written::Unknown;
        }
        Written::Some(out)
    }

    /// How many directories are watched.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |i| i.by_wd.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(cg: &CgroupPath, name: &str) -> (CgroupPath, String) {
        (cg.clone(), name.to_string())
    }

    #[test]
    fn a_write_in_a_watched_directory_is_told_once_by_file_and_kernel_events_are_not() {
        let d = crate::testing::tree(
            "watch",
            &[
                ("pod1/cpu.max", "max 100000\n"),
                ("pod1/memory.max", "max\n"),
                ("pod1/memory.events", "low 0\n"),
                ("pod2/cpu.max", "max 100000\n"),
                ("pod2/cpu.weight", "100\n"),
                ("pod2/cpu.weight.nice", "0\n"),
            ],
        );
        let w = Watch::default();
        assert_eq!(w.written(), Written::Some(vec![]), "nothing watched yet");
        let p1 = CgroupPath::parse("kubepods/pod1").unwrap();
        let p2 = CgroupPath::parse("kubepods/pod2").unwrap();
        w.watch(&d.join("pod1"), &p1).unwrap();
        w.watch(&d.join("pod1"), &p1).unwrap();
        w.watch(&d.join("pod2"), &p2).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w.written(), Written::Some(vec![]));
        std::fs::write(d.join("pod1/cpu.max"), "50000 100000\n").unwrap();
        std::fs::write(d.join("pod1/cpu.max"), "60000 100000\n").unwrap();
        std::fs::write(d.join("pod1/memory.max"), "1024\n").unwrap();
        std::fs::write(d.join("pod1/memory.events"), "low 1\n").unwrap();
        assert_eq!(
            w.written(),
            Written::Some(vec![file(&p1, "cpu.max"), file(&p1, "memory.max")])
        );
        assert_eq!(w.written(), Written::Some(vec![]), "told once");
        std::fs::write(d.join("pod2/memory.events"), "low 1\n").unwrap();
        assert_eq!(w.written(), Written::Some(vec![]), "a kernel-notified file");
        // the nice view of the weight is a write to the weight
        std::fs::write(d.join("pod2/cpu.weight.nice"), "5\n").unwrap();
        std::fs::write(d.join("pod2/cpu.weight"), "50\n").unwrap();
        assert_eq!(w.written(), Written::Some(vec![file(&p2, "cpu.weight")]));
        // what its owner no longer wants is dropped
        w.retain(|cg| *cg != p2);
        assert_eq!(w.len(), 1);
        std::fs::write(d.join("pod2/cpu.max"), "1 100000\n").unwrap();
        assert_eq!(w.written(), Written::Some(vec![]));
        // a directory made anew at a watched path gets a watch of its own
        std::fs::remove_dir_all(d.join("pod1")).unwrap();
        std::fs::create_dir_all(d.join("pod1")).unwrap();
        std::fs::write(d.join("pod1/cpu.max"), "max 100000\n").unwrap();
        let _ = w.written();
        w.watch(&d.join("pod1"), &p1).unwrap();
        std::fs::write(d.join("pod1/cpu.max"), "5 100000\n").unwrap();
        assert_eq!(w.written(), Written::Some(vec![file(&p1, "cpu.max")]));
        assert_eq!(w.len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_panic() {
        let w = Watch::default();
        let cg = CgroupPath::parse("kubepods/none").unwrap();
        assert!(w.watch(Path::new("/nonexistent/qoslet/dir"), &cg).is_err());
        assert_eq!(w.len(), 0);
    }
}
