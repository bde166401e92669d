//! Block devices for I/O limits: a device is named in the policy by path
//! (`/dev/vda`) or by number (`254:0`); cgroup files want `major:minor`.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// A block device number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Device {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Why a device name could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("block device {0:?}: {1}")]
    Bad(String, String),
}

impl Device {
    /// Parses `major:minor`.
    pub fn parse_numbers(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once(':')?;
        Some(Self {
            major: a.parse().ok()?,
            minor: b.parse().ok()?,
        })
    }

    /// Resolves a policy's device name: `major:minor`, or the path of a block
    /// device node (followed through symlinks such as `/dev/disk/by-id/...`).
    pub fn resolve(name: &str) -> Result<Self, DeviceError> {
        if let Some(d) = Self::parse_numbers(name) {
            return Ok(d);
        }
        let bad = |why: String| DeviceError::Bad(name.into(), why);
        if !name.starts_with('/') {
            return Err(bad("neither major:minor nor an absolute device path".into()));
        }
        let m = std::fs::metadata(Path::new(name)).map_err(|e| bad(e.to_string()))?;
        if !m.file_type().is_block_device() {
            return Err(bad("not a block device".into()));
        }
        Ok(Self::from_rdev(m.rdev()))
    }

    /// Splits a Linux `dev_t` (glibc's encoding: 12-bit major and 20-bit minor, split).
    pub fn from_rdev(dev: u64) -> Self {
        Self {
            major: (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)) as u32,
            minor: ((dev & 0xff) | ((dev >> 12) & !0xff)) as u32,
        }
    }
}

/// Read/write limits of one device; `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoLimits {
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
}

/// Whether a per-device table file (`blkio.throttle.*_device`, `io.max`)
/// already holds `value` (`major:minor rest`). A device missing from the table
/// has no limit: `0` (v1) or all `max` (v2).
pub fn keyed_same(content: &str, value: &str) -> bool {
    let want: Vec<&str> = value.split_whitespace().collect();
    let Some((key, rest)) = want.split_first() else {
        return false;
    };
    let line = content
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|l| l.first() == Some(key));
    match line {
        Some(l) => {
            // io.max lists its keys in the kernel's order; compare as sets
            let mut have: Vec<&str> = l[1..].to_vec();
            let mut want: Vec<&str> = rest.to_vec();
            have.sort_unstable();
            want.sort_unstable();
            have == want
        }
        None => rest.iter().all(|v| *v == "0" || v.ends_with("=max")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers() {
        assert_eq!(
            Device::parse_numbers("254:0"),
            Some(Device {
                major: 254,
                minor: 0
            })
        );
        assert_eq!(Device::parse_numbers("254"), None);
        assert_eq!(Device::parse_numbers("a:b"), None);
        // makedev(4100, 65537): both numbers split across the encoding
        let dev: u64 = ((4100 & 0xfff) << 8)
            | ((4100u64 & !0xfff) << 32)
            | (65537 & 0xff)
            | ((65537u64 & !0xff) << 12);
        assert_eq!(
            Device::from_rdev(dev),
            Device {
                major: 4100,
                minor: 65537
            }
        );
        assert_eq!(
            Device::from_rdev(0xfe00),
            Device {
                major: 254,
                minor: 0
            }
        );
    }

    #[test]
    fn resolving_names() {
        assert!(Device::resolve("vda").is_err(), "relative name");
        assert!(
            Device::resolve("/etc/hostname").is_err(),
            "not a block device"
        );
        assert!(Device::resolve("/dev/definitely-not-here").is_err());
        // this machine's first disk (from /proc/partitions) resolves to its numbers
        let parts = std::fs::read_to_string("/proc/partitions").unwrap_or_default();
        for l in parts.lines().skip(2) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && Path::new(&format!("/dev/{}", f[3])).exists() {
                let d = Device::resolve(&format!("/dev/{}", f[3])).unwrap();
                assert_eq!(d.to_string(), format!("{}:{}", f[0], f[1]));
                break;
            }
        }
    }

    #[test]
    fn table_files_compare_by_device_line() {
        let v1 = "8:0 1048576\n254:0 2097152\n";
        assert!(keyed_same(v1, "254:0 2097152"));
        assert!(!keyed_same(v1, "254:0 1"));
        assert!(keyed_same(v1, "254:16 0"), "absent = unlimited");
        assert!(!keyed_same(v1, "254:16 5"));
        let v2 = "254:0 rbps=1048576 wbps=max riops=max wiops=100\n";
        assert!(keyed_same(
            v2,
            "254:0 rbps=1048576 wbps=max riops=max wiops=100"
        ));
        assert!(keyed_same(
            v2,
            "254:0 wiops=100 rbps=1048576 wbps=max riops=max"
        ));
        assert!(!keyed_same(
            v2,
            "254:0 rbps=max wbps=max riops=max wiops=100"
        ));
        assert!(keyed_same("", "8:0 rbps=max wbps=max riops=max wiops=max"));
    }
}
