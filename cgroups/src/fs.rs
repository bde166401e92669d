//! Reading and writing cgroup files.
//!
//! Writes are idempotent: the current value is read and compared first, and
//! the file is written only when it differs. Files are opened write-only and
//! never created (a missing file is a missing kernel feature, reported as
//! such), written in one `write(2)`, and retried a few times on transient
//! errors (EINTR, EAGAIN, EBUSY). Every error names the file and the value.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::CgroupError;

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The file already held the value.
    Unchanged,
    /// The value was written.
    Written,
}

/// Reads a cgroup file, trimmed.
pub fn read(path: &Path) -> Result<String, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(s.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(CgroupError::Missing { path: path.into() })
        }
        Err(source) => Err(CgroupError::Read {
            path: path.into(),
            source,
        }),
    }
}

/// Whether the file's current content means `value`. cgroup files echo values
/// in their own format: `max` for unlimited, `quota period` pairs, and
/// memory limits rounded to pages; compare as the kernel shows them.
fn same(current: &str, value: &str) -> bool {
    let cur = current.split_whitespace().collect::<Vec<_>>().join(" ");
    let want = value.split_whitespace().collect::<Vec<_>>().join(" ");
    cur == want || (want == "-1" && cur == "max") || (want == "max" && cur == "-1")
}

/// Writes `value` to `path` unless it already holds it.
pub fn write_if_changed(path: &Path, value: &str) -> Result<Outcome, CgroupError> {
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
pub fn write_keyed_if_changed(path: &Path, value: &str) -> Result<Outcome, CgroupError> {
    if crate::blkio::keyed_same(&read(path)?, value) {
        return Ok(Outcome::Unchanged);
    }
    write(path, value).map(|_| Outcome::Written)
}

/// Writes `value` to `path` (no comparison), retrying transient errors.
pub fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    let mut attempt = 0;
    loop {
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create(false)
            .truncate(true)
            .open(path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        match r {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CgroupError::Missing { path: path.into() })
            }
            Err(e) if attempt < 3 && e.raw_os_error().is_some_and(is_transient) => {
                attempt += 1;
                tracing::debug!(file = %path.display(), value, error = %e, attempt, "transient cgroup write error; retrying");
                std::thread::sleep(Duration::from_millis(2 << attempt));
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

/// EINTR, EAGAIN, EBUSY.
fn is_transient(errno: i32) -> bool {
    matches!(errno, 4 | 11 | 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-cgfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_only_on_change_and_never_creates() {
        let d = dir("w");
        let f = d.join("cpu.shares");
        std::fs::write(&f, "1024\n").unwrap();
        assert_eq!(write_if_changed(&f, "1024").unwrap(), Outcome::Unchanged);
        assert_eq!(write_if_changed(&f, "2").unwrap(), Outcome::Written);
        assert_eq!(read(&f).unwrap(), "2");
        let missing = d.join("cpu.bvt.warp_ns");
        let e = write_if_changed(&missing, "2").unwrap_err();
        assert!(matches!(e, CgroupError::Missing { .. }), "{e}");
        assert!(!missing.exists(), "never created");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn kernel_formats_compare_equal() {
        assert!(same("max 100000", "max  100000"));
        assert!(same("max", "-1"));
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
