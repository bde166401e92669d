//! qoslet's private state on disk (`--state-dir`): the store checkpoint, the
//! metrics snapshot and the instance lock.
//!
//! qoslet runs as root and its state names every pod on the node, so the state
//! dir is 0700 and its files 0600 (wider modes left by an older version are
//! narrowed at start). Files are written atomically (a temp file created with
//! `O_EXCL|O_NOFOLLOW`, fsync, rename, fsync of the dir), so a symlink planted at
//! the temp path is never followed, and read with `O_NOFOLLOW` and a size cap, so
//! a planted or runaway file cannot make qoslet read without bound. Nothing here
//! decides what is stored; callers must not pass secrets (the store keeps no
//! container envs).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The state dir's mode.
pub const DIR_MODE: u32 = 0o700;
/// Every state file's mode.
pub const FILE_MODE: u32 = 0o600;
/// The instance lock's file name inside the state dir.
pub const LOCK_FILE: &str = "qoslet.lock";

/// Errors of the state dir.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state dir {path} is not a directory (a symlink or a file); refusing to use it")]
    NotADir { path: PathBuf },
    #[error("{path} is {size} bytes, over the {cap}-byte cap; not read")]
    TooBig { path: PathBuf, size: u64, cap: u64 },
    #[error("another qoslet ({holder}) holds {path} (same --state-dir); refusing to start")]
    Locked { path: PathBuf, holder: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir` (and missing parents) mode 0700, or narrows an existing one to
/// 0700 and takes it over from another owner; every regular file directly in
/// it is narrowed to 0600 and owned by qoslet. A symlink at `dir` is refused;
/// entries are changed through descriptors opened without following symlinks
/// (`fchmod`/`fchown`), so swapping one for a symlink changes nothing outside.
pub fn ensure_private_dir(dir: &Path) -> Result<(), StateError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(io(dir))?;
    let me = rustix::process::geteuid().as_raw();
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
                StateError::NotADir { path: dir.into() }
            } else {
                io(dir)(e)
            }
        })?;
    private(&d, dir, me, DIR_MODE)?;
    for e in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let p = e.path();
        // lstat first (never open a FIFO or device), then open without following
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !md.file_type().is_file() {
            continue;
        }
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&p)
        else {
            continue;
        };
        if f.metadata().is_ok_and(|m| m.file_type().is_file()) {
            private(&f, &p, me, FILE_MODE)?;
        }
    }
    Ok(())
}

/// Owner `me` and at most `mode`, through the open descriptor.
fn private(f: &File, path: &Path, me: u32, mode: u32) -> Result<(), StateError> {
    let md = f.metadata().map_err(io(path))?;
    if md.uid() != me {
        rustix::fs::fchown(f, Some(rustix::fs::Uid::from_raw(me)), None)
            .map_err(|e| io(path)(e.into()))?;
        tracing::warn!(path = %path.display(), owner = md.uid(), "state owned by another user taken over");
    }
    if md.mode() & 0o777 & !mode != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io(path))?;
        tracing::info!(path = %path.display(), mode = format!("{mode:o}"), "state narrowed");
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically and privately: the temp file next to it
/// (`.<name>.tmp`) is removed first (a planted symlink is unlinked, never
/// followed), created `O_EXCL|O_NOFOLLOW` mode 0600, fsynced and renamed over
/// `path`; then the directory is fsynced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// [`write_atomic`] of what `fill` writes (through a buffer), for state too
/// large to build in memory first.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Ok(()) => tracing::warn!(path = %tmp.display(), "stale temp file removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&tmp)(e)),
    }
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io(&tmp))?;
        let mut w = std::io::BufWriter::with_capacity(64 << 10, &mut f);
        let filled = fill(&mut w).and_then(|()| w.flush());
        drop(w);
        if let Err(e) = filled.and_then(|()| f.sync_all()) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&tmp)(e));
        }
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path)(e));
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads `path` without following a symlink at it, refusing files over `cap` bytes.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, std::io::Error> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let size = f.metadata()?.len();
    let too_big = |size| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            StateError::TooBig {
                path: path.into(),
                size,
                cap,
            },
        )
    };
    if size > cap {
        return Err(too_big(size));
    }
    let mut out = Vec::with_capacity(size as usize);
    f.take(cap + 1).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(too_big(out.len() as u64));
    }
    Ok(out)
}

/// The instance lock: held (an exclusive `flock`) for as long as this value lives.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    pub path: PathBuf,
}

/// Takes the state dir's instance lock, waiting up to `wait` for a qoslet that
/// is still shutting down (an overlapping restart) to let go of it.
pub async fn lock_within(
    dir: &Path,
    wait: std::time::Duration,
    who: &str,
) -> Result<InstanceLock, StateError> {
    let deadline = std::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match lock_as(dir, who) {
            Err(StateError::Locked { path, holder }) if std::time::Instant::now() < deadline => {
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(path = %path.display(), %holder, ?wait, "another qoslet holds the state dir; waiting for it to exit");
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            r => return r,
        }
    }
}

/// Takes the state dir's instance lock, failing at once when another qoslet
/// (another process, or another proxy in this one) holds it.
pub fn lock(dir: &Path) -> Result<InstanceLock, StateError> {
    lock_as(dir, "qoslet")
}

/// [`lock`], saying in the lock file who holds it (`qoslet proxy`, `qoslet
/// nri`: one front end per node), with the pid; a refused taker is told.
pub fn lock_as(dir: &Path, who: &str) -> Result<InstanceLock, StateError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(io(&path))?;
    match file.try_lock() {
        Ok(()) => {
            let mut file = file;
            let said = format!("{who} pid {}\n", std::process::id());
            // best effort: the flock is the lock, the text only names its holder
            let _ = file
                .set_len(0)
                .and_then(|()| file.write_all(said.as_bytes()));
            Ok(InstanceLock { _file: file, path })
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&file).take(200).read_to_string(&mut holder);
            let holder = holder.trim();
            let holder =
                if holder.is_empty() || !holder.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
                    "unknown".to_string()
                } else {
                    holder.to_string()
                };
            Err(StateError::Locked { path, holder })
        }
        Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn dir_and_files_are_narrowed_to_private_modes() {
        let d = tmpdir("modes");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.join("store.json");
        std::fs::write(&f, b"{}").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        // another user's file (a tenant who could edit the store) is taken over
        // (only root can give a file away)
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&f, Some(4242), Some(4242)).unwrap();
        }
        // a symlink in the dir is left alone (its target is not chmod-ed)
        let outside = tmpdir("modes-target");
        std::fs::write(&outside, b"x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        ensure_private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&f), 0o600);
        assert_eq!(
            std::fs::metadata(&f).unwrap().uid(),
            rustix::process::geteuid().as_raw()
        );
        assert_eq!(mode(&outside), 0o644, "a symlink's target is not touched");
        // a new dir (with a missing parent) is created 0700
        let n = d.join("a/b");
        ensure_private_dir(&n).unwrap();
        assert_eq!(mode(&n), 0o700);
        // a symlink as the state dir is refused
        let l = tmpdir("modes-link");
        std::os::unix::fs::symlink(&d, &l).unwrap();
        assert!(matches!(
            ensure_private_dir(&l),
            Err(StateError::NotADir { .. })
        ));
        std::fs::remove_file(&l).unwrap();
        std::fs::remove_file(&outside).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn atomic_write_is_private_and_never_follows_a_planted_symlink() {
        let d = tmpdir("atomic");
        ensure_private_dir(&d).unwrap();
        let victim = tmpdir("atomic-victim");
        std::fs::write(&victim, b"precious").unwrap();
        // an attacker plants the temp path as a symlink to a file of theirs choosing
        std::os::unix::fs::symlink(&victim, d.join(".store.json.tmp")).unwrap();
        let p = d.join("store.json");
        write_atomic(&p, b"new state").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&p).unwrap(), b"new state");
        assert_eq!(mode(&p), 0o600);
        assert!(!d.join(".store.json.tmp").exists());
        // a symlink at the final path is replaced, not written through
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_atomic(&p, b"v2").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file());
        std::fs::remove_file(&victim).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn reads_are_capped_and_do_not_follow_symlinks() {
        let d = tmpdir("read");
        ensure_private_dir(&d).unwrap();
        let p = d.join("f");
        std::fs::write(&p, vec![7u8; 100]).unwrap();
        assert_eq!(read_capped(&p, 100).unwrap().len(), 100);
        let e = read_capped(&p, 99).unwrap_err();
        assert!(e.to_string().contains("over the 99-byte cap"), "{e}");
        std::os::unix::fs::symlink(&p, d.join("l")).unwrap();
        assert!(read_capped(&d.join("l"), 1000).is_err(), "symlink followed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn one_instance_per_state_dir() {
        let d = tmpdir("lock");
        ensure_private_dir(&d).unwrap();
        let l = lock(&d).unwrap();
        assert!(matches!(lock(&d), Err(StateError::Locked { .. })));
        drop(l);
        let _again = lock(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn an_overlapping_restart_waits_for_the_lock() {
        let d = tmpdir("lock-wait");
        ensure_private_dir(&d).unwrap();
        let old = lock(&d).unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            drop(old);
        });
        let t = std::time::Instant::now();
        let _new = lock_within(&d, std::time::Duration::from_secs(10), "test")
            .await
            .unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(250));
        release.await.unwrap();
        assert!(matches!(
            lock_within(&d, std::time::Duration::from_millis(200), "test").await,
            Err(StateError::Locked { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
