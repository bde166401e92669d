//! An in-memory cgroup tree, the [`Backend`] tests use instead of files on
//! disk: a file exists only if the test put it there (a write never creates
//! one, as the kernel's cgroupfs), per-device tables (`blkio.throttle.*_device`,
//! `io.max`) keep one line per device, and every write is recorded in order.
//! The kernel's own refusals (v1's parent/child rules, EBUSY) are not modelled:
//! the tests of those run on the real cgroups of the machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::detect::{Features, Host, Layout};
use crate::fs::{Backend, CgFile};
use crate::{CgroupError, Cgroups};

/// The v1 hierarchies a [`MemFs`] host has.
const V1: [&str; 5] = ["cpu", "cpuacct", "cpuset", "memory", "blkio"];

#[derive(Debug, Default)]
pub struct MemFs {
    files: Mutex<BTreeMap<PathBuf, String>>,
    writes: Mutex<Vec<(PathBuf, String)>>,
    /// Watched directories (as the host backend's inotify watches), and the
    /// cgroups written in since the last look: every put and write counts.
    watched: Mutex<BTreeMap<PathBuf, crate::CgroupPath>>,
    dirty: Mutex<Vec<(crate::CgroupPath, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemFs {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Creates (or replaces) a file (someone else's write, to a watcher).
    pub fn put(&self, path: impl AsRef<Path>, content: &str) {
        self.touched(path.as_ref());
        lock(&self.files).insert(path.as_ref().to_path_buf(), content.to_string());
    }

    fn touched(&self, path: &Path) {
        if let Some(cg) = path
            .parent()
            .and_then(|d| lock(&self.watched).get(d).cloned())
        {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut d = lock(&self.dirty);
            if !d.iter().any(|(c, n)| *c == cg && *n == name) {
                d.push((cg, name));
            }
        }
    }

    /// How many directories are watched.
    pub fn watched(&self) -> usize {
        lock(&self.watched).len()
    }

    /// A file's content as the kernel would show it (untrimmed).
    pub fn get(&self, path: impl AsRef<Path>) -> Option<String> {
        lock(&self.files).get(path.as_ref()).cloned()
    }

    /// Every write so far, in order (path, value).
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        lock(&self.writes).clone()
    }

    /// A tree of v1 files (`cpu/kubepods/cpu.shares`, relative to the
    /// hierarchies' parent, as the kernel-shaped temp trees were written) and
    /// its host, the kernel features read off the files as detection reads
    /// them: a file in a hierarchy's root or one level below.
    pub fn v1_tree<P: AsRef<str>>(files: &[(P, &str)]) -> (Arc<Self>, Cgroups) {
        let m = Self::new();
        for (f, c) in files {
            m.set(f.as_ref(), c);
        }
        let c = m.detect_v1();
        (m, c)
    }

    /// A v1 host over this tree as it is now, the kernel features read off
    /// the files as detection reads them (a file in a hierarchy's root or one
    /// level below).
    pub fn detect_v1(self: &Arc<Self>) -> Cgroups {
        let has = |ctrl: &str, file: &str| {
            lock(&self.files).keys().any(|p| {
                p.strip_prefix(Path::new("/mem").join(ctrl))
                    .is_ok_and(|r| r.ends_with(file) && r.components().count() <= 2)
            })
        };
        let features = Features {
            bvt: has("cpu", crate::cgroup::BVT_FILE),
            cpu_idle: has("cpu", "cpu.idle"),
            cpu_burst: has("cpu", "cpu.cfs_burst_us"),
            memory_qos: has("memory", "memory.min")
                && has("memory", "memory.low")
                && has("memory", "memory.high"),
            blkio_throttle: has("blkio", "blkio.throttle.read_bps_device"),
            memory_tunes: crate::cgroup::MemTune::ALL
                .into_iter()
                .filter(|t| has("memory", t.file()))
                .fold(Default::default(), |s, t| s.with(t)),
        };
        self.v1(features)
    }

    /// Sets a file of a [`MemFs::v1_tree`] (another writer), by its relative path.
    pub fn set(&self, rel: &str, content: &str) {
        self.put(Path::new("/mem").join(rel), content);
    }

    /// Removes a directory of a [`MemFs::v1_tree`] and everything below it
    /// (a cgroup that went away).
    pub fn remove(&self, rel: &str) {
        let dir = Path::new("/mem").join(rel);
        lock(&self.files).retain(|p, _| !p.starts_with(&dir));
    }

    /// A file of a [`MemFs::v1_tree`], by the same relative path, trimmed.
    pub fn at(&self, rel: &str) -> Option<String> {
        self.get(Path::new("/mem").join(rel))
            .map(|s| s.trim().to_string())
    }

    /// A cgroup v1 host over this tree, its hierarchies at `/mem/<controller>`
    /// (nothing on disk), with these kernel features.
    pub fn v1(self: &Arc<Self>, features: Features) -> Cgroups {
        let controllers = V1
            .iter()
            .map(|c| (c.to_string(), PathBuf::from("/mem").join(c)))
            .collect();
        self.host(Layout::V1 { controllers }, features)
    }

    /// A cgroup v2 host over this tree, rooted at `/mem`.
    pub fn v2(self: &Arc<Self>, features: Features) -> Cgroups {
        let controllers = ["cpuset", "cpu", "io", "memory"].map(String::from).to_vec();
        self.host(
            Layout::V2 {
                root: PathBuf::from("/mem"),
                controllers,
            },
            features,
        )
    }

    fn host(self: &Arc<Self>, layout: Layout, features: Features) -> Cgroups {
        Cgroups::with_backend(
            Host {
                root: PathBuf::from("/mem"),
                layout,
                features,
                cgroupfs: true,
            },
            self.clone(),
        )
    }
}

/// A file the tree lacks: its cgroup is gone when no file of the tree is in
/// its directory but some is in the one above (a directory exists here only
/// through its files), else the kernel does not offer it (or the path is wrong).
fn missing(files: &std::collections::BTreeMap<PathBuf, String>, path: &Path) -> CgroupError {
    let there = |d: &Path| files.keys().any(|k| k.starts_with(d));
    match path.parent() {
        Some(dir) if !there(dir) && dir.parent().is_some_and(there) => {
            CgroupError::Gone { cgroup: dir.into() }
        }
        _ => CgroupError::Missing { path: path.into() },
    }
}

/// Whether a file is a per-device table (one `major:minor ...` line per device).
fn keyed(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    name.ends_with("_device") || name == "io.max"
}

impl Backend for MemFs {
    fn read(&self, f: &CgFile) -> Result<String, CgroupError> {
        let files = lock(&self.files);
        match files.get(f.path()) {
            Some(s) => Ok(s.trim().to_string()),
            None => Err(missing(&files, f.path())),
        }
    }

    fn write(&self, f: &CgFile, value: &str) -> Result<(), CgroupError> {
        let mut files = lock(&self.files);
        if !files.contains_key(f.path()) {
            return Err(missing(&files, f.path()));
        }
        let Some(cur) = files.get_mut(f.path()) else {
            return Err(CgroupError::Missing {
                path: f.path().into(),
            });
        };
        if keyed(f.path()) {
            // the kernel keeps one line per device: a write replaces that device's
            let dev = value.split_whitespace().next().unwrap_or("").to_string();
            let mut lines: Vec<String> = cur
                .lines()
                .filter(|l| l.split_whitespace().next() != Some(dev.as_str()))
                .map(str::to_string)
                .collect();
            lines.push(value.trim().to_string());
            *cur = lines.join("\n") + "\n";
        } else {
            *cur = format!("{}\n", value.trim_end_matches('\n'));
        }
        drop(files);
        self.touched(f.path());
        lock(&self.writes).push((f.path().to_path_buf(), value.to_string()));
        Ok(())
    }

    fn watch(&self, dir: &Path, cg: &crate::CgroupPath) -> std::io::Result<()> {
        let there = lock(&self.files).keys().any(|k| k.starts_with(dir));
        if !there {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        lock(&self.watched).insert(dir.to_path_buf(), cg.clone());
        Ok(())
    }

    fn retain_watches(&self, keep: &dyn Fn(&crate::CgroupPath) -> bool) {
        lock(&self.watched).retain(|_, cg| keep(cg));
    }

    fn written(&self) -> crate::watch::Written {
        crate::watch::Written::Some(std::mem::take(&mut *lock(&self.dirty)))
    }

    fn siblings_dirs(&self, f: &CgFile) -> Vec<String> {
        let Some(dir) = f.parent() else {
            return Vec::new();
        };
        let mut out: Vec<String> = lock(&self.files)
            .keys()
            .filter_map(|p| p.strip_prefix(dir).ok())
            .filter_map(|rest| {
                let mut c = rest.components();
                let first = c.next()?;
                // a directory: something lies below it
                c.next()?;
                Some(first.as_os_str().to_string_lossy().into_owned())
            })
            .collect();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Outcome;
    use crate::{CgroupPath, Knob};

    #[test]
    fn the_fake_keeps_the_kernels_file_rules() {
        let m = MemFs::new();
        let c = m.v1(Features {
            cpu_idle: true,
            blkio_throttle: true,
            ..Default::default()
        });
        let be = CgroupPath::parse("/kubepods/besteffort").unwrap();
        m.put("/mem/cpu/kubepods/besteffort/cpu.idle", "0\n");
        m.put("/mem/cpu/kubepods/besteffort/pod1/cpu.idle", "0\n");
        m.put("/mem/cpu/kubepods/besteffort/pod2/cpu.idle", "0\n");
        assert_eq!(
            c.apply(&be, &Knob::CpuIdle(true)).unwrap(),
            Outcome::Written
        );
        assert_eq!(
            c.apply(&be, &Knob::CpuIdle(true)).unwrap(),
            Outcome::Unchanged
        );
        assert_eq!(
            m.get("/mem/cpu/kubepods/besteffort/cpu.idle").as_deref(),
            Some("1\n")
        );
        // a file the tree lacks is missing, never created
        let e = c.apply(&be, &Knob::CpuShares(2)).unwrap_err();
        assert!(matches!(e, CgroupError::Missing { .. }), "{e}");
        assert_eq!(m.get("/mem/cpu/kubepods/besteffort/cpu.shares"), None);
        assert_eq!(
            m.writes().len(),
            1,
            "one write: the unchanged value was not rewritten"
        );
        // children are the directories below
        let kids: Vec<String> = c
            .children(&be, "cpu")
            .iter()
            .map(|p| p.as_str().to_string())
            .collect();
        assert_eq!(
            kids,
            ["kubepods/besteffort/pod1", "kubepods/besteffort/pod2"]
        );
        // a per-device table keeps one line per device
        let f = "/mem/blkio/kubepods/besteffort/blkio.throttle.read_bps_device";
        m.put(f, "8:0 100\n");
        let table = CgFile::new(
            Path::new("/mem/blkio"),
            "kubepods/besteffort/blkio.throttle.read_bps_device",
        )
        .unwrap();
        for d in ["8:16 200", "8:0 300"] {
            m.write(&table, d).unwrap();
        }
        assert_eq!(c.read_file(&table).unwrap(), "8:16 200\n8:0 300");
        assert_eq!(m.get(f).as_deref(), Some("8:16 200\n8:0 300\n"));
    }
}
