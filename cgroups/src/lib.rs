//! The only code in qoslet that touches cgroupfs and resctrl.
//!
//! * [`path`]: cgroup paths from untrusted input (a pod's cgroup parent),
//!   refused when they could escape the cgroup root (`..`, symlinks).
//! * [`fs`]: idempotent writes (read, compare, write only on change; open
//!   write-only and never create; retry transient errors) whose errors name the
//!   file and the value.
//! * [`detect`]: what this host has: cgroup v1 or v2 (the root is injected:
//!   `/sys/fs/cgroup` in production, a kernel-shaped file tree in tests) and
//!   which QoS files exist (`cpu.bvt_warp_ns`, `cpu.idle`, burst, memory.min/low/high...).
//! * [`resctrl`]: the resctrl mount and its `info/` (L3 CBM mask, closids, MB).
//! * [`cgroup`]: QoS settings ([`Knob`]) planned per layout and applied
//!   idempotently, ordered parent/child the way the kernel needs.
//! * [`blkio`]: block device numbers and per-device I/O limits.
//! * [`sysctl`]: kernel switches a QoS feature needs (group identity's).
//! * [`convert`]: cpu.shares (v1) <-> cpu.weight (v2).
//! * [`watch`]: which cgroups someone wrote a file in (inotify), so what
//!   systemd or another writer undoes is put back on the next tick.
//!
//! Nothing here decides policy; callers say what to write.

#![forbid(unsafe_code)]

pub mod blkio;
pub mod cgroup;
pub mod convert;
pub mod cpulist;
pub mod detect;
pub mod fs;
pub mod knob;
pub mod memfs;
pub mod path;
pub mod resctrl;
pub mod sysctl;
pub mod topology;
pub mod watch;

use std::path::PathBuf;

/// Errors of this crate. Every I/O error names the file (and the value written).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup path {path:?} refused: {reason}")]
    UnsafePath { path: String, reason: &'static str },
    #[error("{path} escapes the cgroup root through a symlink")]
    SymlinkEscape { path: PathBuf },
    #[error("failed to write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("failed to read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} does not exist (the kernel does not offer it here)")]
    Missing { path: PathBuf },
    /// The cgroup itself is gone: removed since it was listed (its pod or
    /// container ended). Not a failure of the write: nothing is left to set.
    #[error("cgroup {cgroup} is gone")]
    Gone { cgroup: PathBuf },
    #[error("no cgroup filesystem found under {root}")]
    NoCgroupFs { root: PathBuf },
    #[error("{knob} is not supported here: {reason}")]
    Unsupported {
        knob: &'static str,
        reason: &'static str,
    },
    #[error("{path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
}

impl CgroupError {
    /// The file or cgroup the error is about, when it names one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            CgroupError::SymlinkEscape { path }
            | CgroupError::Write { path, .. }
            | CgroupError::Read { path, .. }
            | CgroupError::Missing { path }
            | CgroupError::Parse { path, .. } => Some(path),
            CgroupError::Gone { cgroup } => Some(cgroup),
            CgroupError::NoCgroupFs { root } => Some(root),
            CgroupError::UnsafePath { .. } | CgroupError::Unsupported { .. } => None,
        }
    }
}

pub use blkio::{Device, IoLimits};
pub use cgroup::{files, Cgroups, FileWrite, Knob, KnobKind, MemTune, MemTunes};
pub use detect::{Features, Host, Layout};
pub use path::{CgroupPath, PodRoot};

/// A test that cannot run on this host, and why. Under the test script (CI:
/// root, real cgroup v1, the test bed installed; `QOSLET_STRICT_TESTS=1`) it
/// fails loudly: everything it needs is there, so a skip would be a pass that
/// tested nothing. Elsewhere (a developer's `cargo test` on another host) it
/// says why on stderr and returns.
#[doc(hidden)]
/// The real cgroup v1 of this host for a test that needs it (root, v1):
/// `None` (skipped, see [`skip_test`]) elsewhere.
pub fn real_v1_host(test: &str) -> Option<Cgroups> {
    if !rustix::process::geteuid().is_root() {
        skip_test(test, "needs root");
        return None;
    }
    match Cgroups::detect(std::path::Path::new("/sys/fs/cgroup")) {
        Ok(c) if !c.host().is_v2() => Some(c),
        Ok(_) => {
            skip_test(
                test,
                "the host is cgroup v2 (this test checks v1's kernel rules)",
            );
            None
        }
        Err(e) => {
            skip_test(test, &format!("no cgroups here: {e}"));
            None
        }
    }
}

#[doc(hidden)]
pub fn skip_test(test: &str, reason: &str) {
    assert!(
        std::env::var_os("QOSLET_STRICT_TESTS").is_none(),
        "{test} cannot run here ({reason}), and the test script requires every test to run"
    );
    eprintln!("not run here: {test}: {reason}");
}

/// Test support for every crate: the one helper that writes a kernel-shaped
/// file tree where real files are needed (detection, the host backend's
/// `openat2` path, resctrl, the collector's `pread`s); tests that only need
/// cgroup files use [`memfs::MemFs`].
#[doc(hidden)]
pub mod testing {
    use std::path::{Path, PathBuf};

    /// A fresh directory under the temp dir, named by `tag` and the process id,
    /// holding `files` as (relative path, content).
    pub fn tree<P: AsRef<Path>, C: AsRef<[u8]>>(tag: &str, files: &[(P, C)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp tree");
        for (p, c) in files {
            let f = d.join(p);
            std::fs::create_dir_all(f.parent().expect("a file in the tree")).expect("temp tree");
            std::fs::write(f, c).expect("temp tree");
        }
        d
    }
}
