//! Reading and writing cgroup files.
//!
//! Writes are idempotent: the current value is read and compared first, and
//! the file is written only when it differs. Files are opened write-only and
//! never created (a missing file is a missing kernel feature, reported as
//! such), written in one `write(2)`, and retried at once on EINTR/EAGAIN
//! (never with a sleep; EBUSY is not transient here). Every error names the
//! file and the value.
//!
//! A pod's cgroup file ([`CgFile`]) is opened *beneath* its hierarchy's root:
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` on
//! kernels that have it (5.6+), else one `O_NOFOLLOW` component at a time, so
//! no symlink and no `..` can take a write outside the cgroup root, and the
//! check and the open are one step (no window between them).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::watch::Written;
use crate::{CgroupError, CgroupPath};

/// A cgroup file: a path relative to the root of its hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgFile {
    root: PathBuf,
    rel: PathBuf,
    full: PathBuf,
}

impl CgFile {
    /// `rel` must be relative and free of `..` (a [`crate::CgroupPath`] plus a file name).
    pub fn new(root: &Path, rel: impl Into<PathBuf>) -> Result<Self, CgroupError> {
        let rel = rel.into();
        if !rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(CgroupError::UnsafePath {
                path: rel.display().to_string(),
                reason: "not a plain relative path",
            });
        }
        Ok(Self {
            full: root.join(&rel),
            root: root.into(),
            rel,
        })
    }

    pub fn path(&self) -> &Path {
        &self.full
    }
}

impl std::ops::Deref for CgFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.full
    }
}

impl std::fmt::Display for CgFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.full.display().fmt(f)
    }
}

/// What the read and write functions accept: a trusted path (opened as it
/// is) or a [`CgFile`] (opened beneath its root).
pub trait Target {
    fn path(&self) -> &Path;
    fn open(&self, write: bool) -> std::io::Result<std::fs::File>;
}

impl Target for Path {
    fn path(&self) -> &Path {
        self
    }
    fn open(&self, write: bool) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .create(false)
            .truncate(write)
            .open(self)
    }
}

impl Target for PathBuf {
    fn path(&self) -> &Path {
        self
    }
    fn open(&self, write: bool) -> std::io::Result<std::fs::File> {
        self.as_path().open(write)
    }
}

impl Target for CgFile {
    fn path(&self) -> &Path {
        &self.full
    }
    fn open(&self, write: bool) -> std::io::Result<std::fs::File> {
        open_beneath(&self.root, &self.rel, write).map(std::fs::File::from)
    }
}

/// Opens `rel` beneath the directory `root`, following no symlink on the way
/// (`root` itself may be one, such as v1's `cpu -> cpu,cpuacct`).
pub fn open_beneath(root: &Path, rel: &Path, write: bool) -> std::io::Result<OwnedFd> {
    let access = if write {
        OFlags::WRONLY | OFlags::TRUNC
    } else {
        OFlags::RDONLY
    };
    let flags = access | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    use std::sync::atomic::{AtomicBool, Ordering};
    // cleared for good the first time the kernel (or a seccomp profile) refuses openat2
    static OPENAT2: AtomicBool = AtomicBool::new(true);
    if !OPENAT2.load(Ordering::Relaxed) {
        return open_by_components(dir, rel, flags);
    }
    match rustix::fs::openat2(
        &dir,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV,
    ) {
        Err(
            e @ (rustix::io::Errno::NOSYS | rustix::io::Errno::PERM | rustix::io::Errno::TOOBIG),
        ) => {
            tracing::warn!(error = %e, "openat2 unavailable (old kernel or seccomp); cgroup files are opened one O_NOFOLLOW component at a time");
            OPENAT2.store(false, Ordering::Relaxed);
        }
        // openat2 refused a symlink or an escape: say so plainly
        Err(rustix::io::Errno::XDEV) | Err(rustix::io::Errno::LOOP) => {
            return Err(std::io::Error::other(format!(
                "{} escapes {} (symlink or '..')",
                rel.display(),
                root.display()
            )))
        }
        r => return r.map_err(Into::into),
    }
    open_by_components(dir, rel, flags)
}

/// The pre-5.6 path: one component at a time, none of them a symlink.
fn open_by_components(dir: OwnedFd, rel: &Path, flags: OFlags) -> std::io::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    let mut cur = dir;
    for d in dirs {
        cur = rustix::fs::openat(
            &cur,
            *d,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok(rustix::fs::openat(&cur, *last, flags, Mode::empty())?)
}

/// Where a host's cgroup files are read and written. [`HostFs`] is the
/// kernel's cgroupfs (each file opened beneath its hierarchy, no symlinks);
/// [`crate::memfs::MemFs`] is the in-memory tree tests use. The rules that are
/// qoslet's (compare before writing, never create, retries) are the same for both.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The file's content, trimmed; a file that does not exist is `Missing`.
    fn read(&self, f: &CgFile) -> Result<String, CgroupError>;
    /// Writes `value` (never creates the file: a missing one is `Missing`).
    fn write(&self, f: &CgFile, value: &str) -> Result<(), CgroupError>;
    /// The names of the directories next to `f` (a cgroup's children, when
    /// `f` is one of its files).
    fn siblings_dirs(&self, f: &CgFile) -> Vec<String>;
    /// Starts telling of writes to the files of `dir`, cgroup `cg`'s directory
    /// in one hierarchy ([`crate::watch`]). Idempotent; the default watches nothing.
    fn watch(&self, _dir: &Path, _cg: &CgroupPath) -> std::io::Result<()> {
        Ok(())
    }
    /// Drops the watches of the cgroups `keep` says no to.
    fn retain_watches(&self, _keep: &dyn Fn(&CgroupPath) -> bool) {}
    /// The files written in watched cgroups since the last call.
    fn written(&self) -> Written {
        Written::Some(Vec::new())
    }
}

/// The kernel's cgroup filesystem.
#[derive(Debug, Default)]
pub struct HostFs {
    watch: crate::watch::Watch,
}

impl Backend for HostFs {
    fn read(&self, f: &CgFile) -> Result<String, CgroupError> {
        read(f)
    }
    fn watch(&self, dir: &Path, cg: &CgroupPath) -> std::io::Result<()> {
        self.watch.watch(dir, cg)
    }
    fn retain_watches(&self, keep: &dyn Fn(&CgroupPath) -> bool) {
        self.watch.retain(keep)
    }
    fn written(&self) -> Written {
        self.watch.written()
    }
    fn write(&self, f: &CgFile, value: &str) -> Result<(), CgroupError> {
        write(f, value)
    }
    fn siblings_dirs(&self, f: &CgFile) -> Vec<String> {
        let Some(dir) = f.parent() else {
            return Vec::new();
        };
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// [`write_if_changed`] through a backend.
pub fn write_if_changed_in(
    b: &dyn Backend,
    f: &CgFile,
    value: &str,
) -> Result<Outcome, CgroupError> {
    match b.read(f) {
        Ok(cur) if same(&cur, value) => return Ok(Outcome::Unchanged),
        Ok(_) => {}
        // write-only files (cgroup.procs on some kernels, resctrl tasks) cannot be compared
        Err(CgroupError::Read { .. }) => {}
        Err(e) => return Err(e),
    }
    b.write(f, value).map(|_| Outcome::Written)
}

/// [`write_keyed_if_changed`] through a backend.
pub fn write_keyed_if_changed_in(
    b: &dyn Backend,
    f: &CgFile,
    value: &str,
) -> Result<Outcome, CgroupError> {
    if crate::blkio::keyed_same(&b.read(f)?, value) {
        return Ok(Outcome::Unchanged);
    }
    b.write(f, value).map(|_| Outcome::Written)
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The file already held the value.
    Unchanged,
    /// The value was written.
    Written,
}

/// A file that is not there: its cgroup is gone (the directory was removed
/// since it was listed: its parent is still there), or the kernel does not
/// offer the file. A cgroup whose parent is missing too is not "gone" but a
/// wrong path (a wrong `cgroupRoot`, a runtime that keeps containers' cgroups
/// off the host): that stays an error.
fn missing(path: &Path) -> CgroupError {
    match path.parent() {
        Some(dir) if !dir.exists() && dir.parent().is_some_and(Path::exists) => {
            CgroupError::Gone { cgroup: dir.into() }
        }
        _ => CgroupError::Missing { path: path.into() },
    }
}

/// Reads a cgroup file, trimmed.
pub fn read<T: Target + ?Sized>(t: &T) -> Result<String, CgroupError> {
    let path = t.path();
    let mut s = String::new();
    match t.open(false).and_then(|mut f| f.read_to_string(&mut s)) {
        Ok(_) => Ok(s.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing(path)),
        Err(source) => Err(CgroupError::Read {
            path: path.into(),
            source,
        }),
    }
}

/// Whether the file's current content means `value`. cgroup files echo values
/// in their own format: `max` for unlimited, `quota period` pairs, and
/// memory limits rounded to pages; compare as the kernel shows them.
pub fn same(current: &str, value: &str) -> bool {
    let cur = current.split_whitespace().collect::<Vec<_>>().join(" ");
    let want = value.split_whitespace().collect::<Vec<_>>().join(" ");
    let unlimited = |v: &str| {
        v == "-1"
            || v == "max"
            // v1 shows an unlimited page counter as LONG_MAX rounded down to a page
            || v.parse::<u64>().is_ok_and(|n| n > i64::MAX as u64 - (1 << 20))
    };
    cur == want || (unlimited(&cur) && unlimited(&want))
}

/// Writes `value` to `path` unless it already holds it.
pub fn write_if_changed<T: Target + ?Sized>(path: &T, value: &str) -> Result<Outcome, CgroupError> {
    match read(path) {
        Ok(cur) if same(&cur, value) => return Ok(Outcome::Unchanged),
        Ok(_) => {}
        // write-only files (cgroup.procs on some kernels, resctrl tasks) cannot be compared
        Err(CgroupError::Read { .. }) => {}
        Err(e) => return Err(e),
    }
    write(path, value).map(|_| Outcome::Written)
}

/// Writes one device's line (`major:minor ...`) of a per-device table file
/// (`blkio.throttle.*_device`, `io.max`) unless the table already holds it.
pub fn write_keyed_if_changed<T: Target + ?Sized>(
    path: &T,
    value: &str,
) -> Result<Outcome, CgroupError> {
    if crate::blkio::keyed_same(&read(path)?, value) {
        return Ok(Outcome::Unchanged);
    }
    write(path, value).map(|_| Outcome::Written)
}

/// Writes `value` to `path` (no comparison), retrying transient errors.
pub fn write<T: Target + ?Sized>(t: &T, value: &str) -> Result<(), CgroupError> {
    let path = t.path();
    let mut attempt = 0;
    loop {
        let r = t.open(true).and_then(|mut f| f.write_all(value.as_bytes()));
        match r {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing(path)),
            Err(e) if attempt < 3 && e.raw_os_error().is_some_and(is_transient) => {
                attempt += 1;
                tracing::debug!(file = %path.display(), value, error = %e, attempt, "interrupted cgroup write; retrying");
            }
            Err(source) => {
                return Err(CgroupError::Write {
                    path: path.into(),
                    value: value.into(),
                    source,
                })
            }
        }
    }
}

/// EINTR and EAGAIN, retried at once. Not EBUSY: for a cgroup file it means
/// "not inside the parent" or "usage above the new limit", which no retry
/// fixes (the caller's ordering or next tick does).
fn is_transient(errno: i32) -> bool {
    matches!(errno, libc_errno::EINTR | libc_errno::EAGAIN)
}

mod libc_errno {
    pub const EINTR: i32 = 4;
    pub const EAGAIN: i32 = 11;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        crate::testing::tree::<&str, &str>(&format!("cgfs-{tag}"), &[])
    }

    #[test]
    fn writes_only_on_change_and_never_creates() {
        let d = dir("w");
        let f = d.join("cpu.shares");
        std::fs::write(&f, "1024\n").unwrap();
        assert_eq!(write_if_changed(&f, "1024").unwrap(), Outcome::Unchanged);
        assert_eq!(write_if_changed(&f, "2").unwrap(), Outcome::Written);
        assert_eq!(read(&f).unwrap(), "2");
        let missing = d.join("cpu.bvt_warp_ns");
        let e = write_if_changed(&missing, "2").unwrap_err();
        assert!(matches!(e, CgroupError::Missing { .. }), "{e}");
        assert!(!missing.exists(), "never created");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cgroup_files_open_beneath_their_root_and_never_through_a_symlink() {
        let d = dir("beneath");
        let root = d.join("root");
        std::fs::create_dir_all(root.join("kubepods/pod1")).unwrap();
        std::fs::write(root.join("kubepods/pod1/cpu.shares"), "2\n").unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::fs::write(d.join("outside/cpu.shares"), "1024\n").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), root.join("kubepods/evil")).unwrap();
        // the root itself may be a symlink (v1: cpu -> cpu,cpuacct)
        std::os::unix::fs::symlink(&root, d.join("cpu")).unwrap();
        let ok = CgFile::new(&d.join("cpu"), "kubepods/pod1/cpu.shares").unwrap();
        assert_eq!(write_if_changed(&ok, "7").unwrap(), Outcome::Written);
        assert_eq!(read(&ok).unwrap(), "7");
        let evil = CgFile::new(&root, "kubepods/evil/cpu.shares").unwrap();
        assert!(write(&evil, "9").is_err());
        assert!(read(&evil).is_err());
        assert_eq!(
            std::fs::read_to_string(d.join("outside/cpu.shares")).unwrap(),
            "1024\n",
            "nothing written outside the root"
        );
        // a symlink as the file itself
        std::os::unix::fs::symlink(
            d.join("outside/cpu.shares"),
            root.join("kubepods/pod1/cpu.idle"),
        )
        .unwrap();
        let f = CgFile::new(&root, "kubepods/pod1/cpu.idle").unwrap();
        assert!(write(&f, "1").is_err());
        // the per-component path (kernels without openat2) refuses them too
        let root_fd =
            || rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let w = OFlags::WRONLY | OFlags::NOFOLLOW;
        for rel in ["kubepods/evil/cpu.shares", "kubepods/pod1/cpu.idle"] {
            assert!(
                open_by_components(root_fd(), Path::new(rel), w).is_err(),
                "{rel}"
            );
        }
        assert!(open_by_components(root_fd(), Path::new("kubepods/pod1/cpu.shares"), w).is_ok());
        // '..' and absolute paths are refused before any open
        assert!(CgFile::new(&root, "../outside/cpu.shares").is_err());
        assert!(CgFile::new(&root, "/etc/passwd").is_err());
        // a missing file is reported as missing, never created
        let m = CgFile::new(&root, "kubepods/pod1/cpu.bvt_warp_ns").unwrap();
        assert!(matches!(write(&m, "2"), Err(CgroupError::Missing { .. })));
        assert!(!root.join("kubepods/pod1/cpu.bvt_warp_ns").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn kernel_formats_compare_equal() {
        assert!(same("max 100000", "max  100000"));
        assert!(same("max", "-1"));
        assert!(
            same("9223372036854771712", "-1"),
            "v1 memory.limit_in_bytes unlimited"
        );
        assert!(!same("9223372036854771712", "1024"));
        assert!(!same("50000 100000", "60000 100000"));
    }

    #[test]
    fn errors_name_the_file_and_the_value() {
        let d = dir("e");
        let f = d.join("ro");
        std::fs::create_dir(&f).unwrap(); // writing to a directory fails with EISDIR
        let e = write(&f, "7").unwrap_err().to_string();
        assert!(
            e.contains("\"7\"") && e.contains(&f.display().to_string()),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
