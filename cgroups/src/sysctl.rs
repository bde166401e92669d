//! Kernel sysctls qoslet owns, under an injected procfs root (`/proc` in
//! production): today `kernel.sched_group_identity_enabled`, which Anolis
//! kernels need before any `cpu.bvt_warp_ns` takes effect (koordlet enables
//! it whenever group identity is on). Writes are idempotent (read, compare,
//! write only on change) and never create a file.

use std::path::{Path, PathBuf};

use crate::fs::Outcome;
use crate::CgroupError;

/// Group identity's switch on Anolis / Alibaba Cloud Linux kernels.
pub const GROUP_IDENTITY: &str = "kernel.sched_group_identity_enabled";
/// Core scheduling's switch on those kernels: group identity needs it off.
pub const SCHED_CORE: &str = "kernel.sched_core";

/// The sysctls under one procfs root.
#[derive(Debug, Clone)]
pub struct Sysctl {
    proc_root: PathBuf,
}

impl Sysctl {
    pub fn new(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.into(),
        }
    }

    /// `kernel.x_y` -> `<proc>/sys/kernel/x_y`.
    fn path(&self, name: &str) -> PathBuf {
        self.proc_root.join("sys").join(name.replace('.', "/"))
    }

    /// Whether this kernel has the sysctl.
    pub fn offered(&self, name: &str) -> bool {
        self.path(name).is_file()
    }

    /// Sets the sysctl to `value` unless it holds it already.
    pub fn ensure(&self, name: &str, value: &str) -> Result<Outcome, CgroupError> {
        let path = self.path(name);
        crate::fs::write_if_changed(&path, value).map_err(|e| match e {
            // no such directory under /proc/sys: a kernel without the sysctl
            CgroupError::Gone { .. } => CgroupError::Missing { path },
            e => e,
        })
    }

    /// Turns group identity on where the kernel has the switch, core
    /// scheduling off first (koordlet's `initSysctl`: `tryDisableCoreSched`,
    /// then `SetSchedGroupIdentity(true)`). `Ok(None)`: no switch here.
    pub fn enable_group_identity(&self) -> Result<Option<Outcome>, CgroupError> {
        if !self.offered(GROUP_IDENTITY) {
            return Ok(None);
        }
        if self.offered(SCHED_CORE) {
            self.ensure(SCHED_CORE, "0")?;
        }
        self.ensure(GROUP_IDENTITY, "1").map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::tests::tree;

    #[test]
    fn group_identity_switch_on_a_kernel_shaped_tree() {
        let d = tree(
            "sysctl",
            &[("sys/kernel/sched_group_identity_enabled", "0\n")],
        );
        let s = Sysctl::new(&d);
        assert!(s.offered(GROUP_IDENTITY));
        assert_eq!(s.ensure(GROUP_IDENTITY, "1").unwrap(), Outcome::Written);
        assert_eq!(s.ensure(GROUP_IDENTITY, "1").unwrap(), Outcome::Unchanged);
        assert_eq!(
            std::fs::read_to_string(d.join("sys/kernel/sched_group_identity_enabled")).unwrap(),
            "1"
        );
        // with core scheduling on: turned off first, as koordlet does
        std::fs::write(d.join("sys/kernel/sched_group_identity_enabled"), "0\n").unwrap();
        std::fs::write(d.join("sys/kernel/sched_core"), "1\n").unwrap();
        assert_eq!(s.enable_group_identity().unwrap(), Some(Outcome::Written));
        assert_eq!(
            std::fs::read_to_string(d.join("sys/kernel/sched_core")).unwrap(),
            "0"
        );
        let none = Sysctl::new(&d.join("nope"));
        assert_eq!(none.enable_group_identity().unwrap(), None);
        assert!(!none.offered(GROUP_IDENTITY));
        assert!(matches!(
            none.ensure(GROUP_IDENTITY, "1"),
            Err(CgroupError::Missing { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
