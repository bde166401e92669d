//! The resctrl filesystem (Intel RDT / AMD PQoS): detection of the mount and
//! its `info/` (L3 cache-bit mask, number of closids, memory-bandwidth
//! allocation), one control group per QoS class with its schemata, and task
//! assignment. The root is injected (`/sys/fs/resctrl` in production).

use std::path::{Path, PathBuf};

use crate::CgroupError;

/// What resctrl offers on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resctrl {
    pub root: PathBuf,
    /// Full L3 cache-bit mask (e.g. `0x7ff` = 11 ways), if L3 CAT is offered.
    pub l3_cbm_mask: Option<u64>,
    /// Number of classes of service for L3.
    pub l3_closids: Option<u32>,
    /// The fewest cache bits a mask may have (`info/L3/min_cbm_bits`; 1 when absent).
    pub l3_min_bits: u32,
    /// MB (memory bandwidth) allocation: minimum bandwidth %, granularity %.
    pub mb: Option<(u32, u32)>,
    /// Cache/memory domain ids, from the root group's schemata (`L3:0=..;1=..`).
    pub domains: Vec<u32>,
    /// Mounted with `mba_MBps`: the MB line takes MBps, not percentages, so
    /// qoslet's percentages are not written (the kernel's values stand).
    pub mb_mbps: bool,
}

impl Resctrl {
    /// Detects resctrl at `root`; `Ok(None)` when it is not mounted (no RDT).
    /// Mount options come from `/proc/self/mountinfo`.
    pub fn detect(root: &Path) -> Result<Option<Self>, CgroupError> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::detect_with_mounts(root, &mounts)
    }

    /// [`Resctrl::detect`] with the mount table given (`mountinfo` format).
    pub fn detect_with_mounts(root: &Path, mountinfo: &str) -> Result<Option<Self>, CgroupError> {
        if !root.join("schemata").is_file() {
            return Ok(None);
        }
        let read_num = |p: PathBuf, hex: bool| -> Result<Option<u64>, CgroupError> {
            if !p.exists() {
                return Ok(None);
            }
            let s = crate::fs::read(&p)?;
            let v = if hex {
                u64::from_str_radix(s.trim_start_matches("0x"), 16)
            } else {
                s.parse()
            };
            v.map(Some).map_err(|_| CgroupError::Parse {
                path: p,
                content: s,
            })
        };
        let l3_cbm_mask = read_num(root.join("info/L3/cbm_mask"), true)?;
        let l3_closids = read_num(root.join("info/L3/num_closids"), false)?.map(|v| v as u32);
        let l3_min_bits = read_num(root.join("info/L3/min_cbm_bits"), false)?
            .map_or(1, |v| v.clamp(1, 64) as u32);
        let mb = match (
            read_num(root.join("info/MB/min_bandwidth"), false)?,
            read_num(root.join("info/MB/bandwidth_gran"), false)?,
        ) {
            (Some(min), Some(gran)) => Some((min as u32, gran as u32)),
            _ => None,
        };
        let schemata = crate::fs::read(&root.join("schemata"))?;
        let domains = schemata
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("L3:")
                    .or_else(|| l.trim().strip_prefix("MB:"))
            })
            .map(|rest| {
                rest.split(';')
                    .filter_map(|d| d.split_once('=')?.0.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let mb_mbps = mountinfo.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let Some(sep) = f.iter().position(|x| *x == "-") else {
                return false;
            };
            f.get(4).is_some_and(|m| Path::new(m) == root)
                && f.get(sep + 1) == Some(&"resctrl")
                && f.get(sep + 3)
                    .is_some_and(|o| o.split(',').any(|o| o == "mba_MBps"))
        });
        if mb_mbps && mb.is_some() {
            tracing::warn!(root = %root.display(), "resctrl is mounted with mba_MBps: memory bandwidth is in MBps there, so resctrlQOS.mbaPercent is not applied");
        }
        Ok(Some(Self {
            root: root.into(),
            l3_cbm_mask,
            l3_closids,
            l3_min_bits,
            mb,
            domains,
            mb_mbps,
        }))
    }

    /// The contiguous cache-bit mask covering `start..end` percent of the full mask
    /// (at least one bit), as resctrl requires contiguous masks.
    pub fn l3_mask_for(&self, start_percent: u32, end_percent: u32) -> Option<u64> {
        let full = self.l3_cbm_mask?;
        let ways = 64 - full.leading_zeros();
        if ways == 0 {
            return None;
        }
        let (s, e) = (
            start_percent.min(100),
            end_percent.clamp(start_percent.min(100), 100),
        );
        // never fewer bits than the kernel's minimum (never an empty mask), never
        // a shift past 63
        let min = self.l3_min_bits.clamp(1, ways);
        let lo = ((ways * s) / 100).min(ways - min);
        let hi = ((ways * e).div_ceil(100)).max(lo + min).min(ways);
        let low_bits = |n: u32| if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        Some(low_bits(hi) & !low_bits(lo))
    }
}

impl Resctrl {
    /// The schemata of a class group: L3 ways `start..end` percent and MB `mba` percent,
    /// on every domain (`L3:0=f;1=f` and `MB:0=100;1=100`), for what this host offers.
    pub fn schemata(&self, start_percent: u32, end_percent: u32, mba_percent: u32) -> String {
        let mut lines = vec![];
        if let Some(mask) = self.l3_mask_for(start_percent, end_percent) {
            let doms: Vec<String> = self
                .domains
                .iter()
                .map(|d| format!("{d}={mask:x}"))
                .collect();
            lines.push(format!("L3:{}", doms.join(";")));
        }
        if let (Some((min, gran)), false) = (self.mb, self.mb_mbps) {
            let gran = gran.max(1);
            // a kernel whose minimum is above 100 % cannot be written a percentage below it
            let v = (mba_percent.max(min).min(100.max(min)) / gran * gran).max(min);
            let doms: Vec<String> = self.domains.iter().map(|d| format!("{d}={v}")).collect();
            lines.push(format!("MB:{}", doms.join(";")));
        }
        lines.join("\n") + "\n"
    }

    /// Creates (if needed) the control group `name` and writes its schemata.
    /// A group is a directory the kernel fills in: creating it is how resctrl works.
    pub fn ensure_group(&self, name: &str, schemata: &str) -> Result<PathBuf, CgroupError> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') || name == "info" {
            return Err(CgroupError::UnsafePath {
                path: name.into(),
                reason: "not a resctrl group name",
            });
        }
        let dir = self.root.join(name);
        if !dir.is_dir() {
            std::fs::create_dir(&dir).map_err(|source| CgroupError::Write {
                path: dir.clone(),
                value: "mkdir".into(),
                source,
            })?;
        }
        // the kernel only accepts the lines it knows; write them one by one, idempotently
        let current = crate::fs::read(&dir.join("schemata"))?;
        for line in schemata.lines().filter(|l| !l.trim().is_empty()) {
            if !current.lines().any(|c| same_line(c, line)) {
                crate::fs::write(&dir.join("schemata"), &format!("{line}\n"))?;
            }
        }
        Ok(dir)
    }

    /// Moves tasks (thread or process ids) into group `dir`. Tasks that exited meanwhile are skipped.
    pub fn assign(&self, dir: &Path, tasks: &[u32]) -> Result<usize, CgroupError> {
        let mut moved = 0;
        for t in tasks {
            match crate::fs::write(&dir.join("tasks"), &t.to_string()) {
                Ok(()) => moved += 1,
                Err(CgroupError::Write { source, .. }) if source.raw_os_error() == Some(3) => {} // ESRCH: gone
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }
}

/// Whether two schemata lines mean the same (`L3:0=0f` vs `L3:0=f`).
fn same_line(a: &str, b: &str) -> bool {
    let norm = |l: &str| -> Option<(String, Vec<(String, String)>)> {
        let (res, doms) = l.trim().split_once(':')?;
        let mut v: Vec<(String, String)> = doms
            .split(';')
            .filter_map(|d| d.split_once('='))
            .map(|(k, val)| {
                (
                    k.trim().to_string(),
                    val.trim().trim_start_matches('0').to_lowercase(),
                )
            })
            .collect();
        v.sort();
        Some((res.trim().to_string(), v))
    };
    norm(a).is_some() && norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::tests::tree;

    #[test]
    fn detects_l3_and_mb_like_the_kernel_shows_them() {
        let d = tree(
            "resctrl",
            &[
                ("schemata", "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"),
                ("tasks", ""),
                ("info/L3/cbm_mask", "7ff\n"),
                ("info/L3/num_closids", "16\n"),
                ("info/MB/min_bandwidth", "10\n"),
                ("info/MB/bandwidth_gran", "10\n"),
            ],
        );
        let r = Resctrl::detect(&d).unwrap().unwrap();
        assert_eq!(
            (r.l3_cbm_mask, r.l3_closids, r.mb),
            (Some(0x7ff), Some(16), Some((10, 10)))
        );
        // Koordinator's BE default: LLC 0-30% of 11 ways -> the low 4 ways
        assert_eq!(r.l3_mask_for(0, 30), Some(0xf));
        assert_eq!(r.l3_mask_for(0, 100), Some(0x7ff));
        assert_eq!(r.l3_mask_for(0, 0), Some(0x1), "at least one way");
        assert_eq!(r.domains, vec![0, 1]);
        // Koordinator's BE group: LLC 0-30%, MBA 100%
        assert_eq!(r.schemata(0, 30, 100), "L3:0=f;1=f\nMB:0=100;1=100\n");
        // a group directory as the kernel makes it (the test tree stands in for mkdir's result)
        std::fs::create_dir(d.join("BE")).unwrap();
        std::fs::write(d.join("BE/schemata"), "L3:0=7ff;1=7ff\nMB:0=100;1=100\n").unwrap();
        std::fs::write(d.join("BE/tasks"), "").unwrap();
        let g = r.ensure_group("BE", &r.schemata(0, 30, 100)).unwrap();
        assert_eq!(
            std::fs::read_to_string(g.join("schemata")).unwrap(),
            "L3:0=f;1=f\n",
            "only the changed line was written"
        );
        assert_eq!(r.assign(&g, &[42]).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(g.join("tasks")).unwrap(), "42");
        for bad in ["", "../x", "info", ".hidden", "a/b"] {
            assert!(r.ensure_group(bad, "").is_err(), "{bad:?}");
        }
        assert!(same_line("L3:1=0f;0=f", "L3:0=f;1=f"));
        assert!(!same_line("L3:0=f", "MB:0=f"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The edge cases of issue 12: a range that would give an empty mask, a
    /// 64-way CBM, a kernel minimum above 100 %, an `mba_MBps` mount.
    #[test]
    fn edge_cases_of_masks_and_bandwidth() {
        let d = tree(
            "resctrl-edge",
            &[
                ("schemata", "L3:0=ffffffffffffffff\nMB:0=100\n"),
                ("info/L3/cbm_mask", "ffffffffffffffff\n"),
                ("info/MB/min_bandwidth", "150\n"),
                ("info/MB/bandwidth_gran", "10\n"),
            ],
        );
        let r = Resctrl::detect_with_mounts(&d, "").unwrap().unwrap();
        assert_eq!(
            r.l3_mask_for(0, 100),
            Some(u64::MAX),
            "64 ways, no overflow"
        );
        assert_eq!(r.l3_mask_for(50, 100), Some(u64::MAX << 32));
        assert_eq!(
            r.l3_mask_for(100, 100),
            Some(1u64 << 63),
            "never an empty mask"
        );
        assert_eq!(r.l3_mask_for(30, 30).map(u64::count_ones), Some(1));
        assert_eq!(
            r.schemata(0, 100, 50),
            "L3:0=ffffffffffffffff\nMB:0=150\n",
            "no panic on min > 100"
        );
        let one = Resctrl {
            l3_cbm_mask: Some(1),
            ..r.clone()
        };
        assert_eq!(one.l3_mask_for(100, 100), Some(1));
        // a kernel that wants at least 2 bits (info/L3/min_cbm_bits)
        let two = Resctrl {
            l3_cbm_mask: Some(0x7ff),
            l3_min_bits: 2,
            ..r.clone()
        };
        assert_eq!(two.l3_mask_for(30, 30), Some(0b11 << 3));
        assert_eq!(two.l3_mask_for(100, 100), Some(0b11 << 9));
        assert_eq!(two.l3_mask_for(0, 1), Some(0b11));
        let none = Resctrl {
            l3_cbm_mask: Some(0),
            ..r.clone()
        };
        assert_eq!(none.l3_mask_for(0, 100), None);
        // mba_MBps: the MB line is in MBps there; percentages are not written
        let mountinfo = format!(
            "36 25 0:31 / {} rw,relatime shared:15 - resctrl resctrl rw,mba_MBps\n",
            d.display()
        );
        let m = Resctrl::detect_with_mounts(&d, &mountinfo)
            .unwrap()
            .unwrap();
        assert!(m.mb_mbps);
        assert_eq!(m.schemata(0, 100, 50), "L3:0=ffffffffffffffff\n");
        let other = "36 25 0:31 / /elsewhere rw - resctrl resctrl rw,mba_MBps\n";
        assert!(
            !Resctrl::detect_with_mounts(&d, other)
                .unwrap()
                .unwrap()
                .mb_mbps
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn absent_or_malformed() {
        let d = tree("noresctrl", &[("x", "")]);
        assert_eq!(Resctrl::detect(&d).unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
        let d = tree(
            "badresctrl",
            &[("schemata", ""), ("info/L3/cbm_mask", "zz\n")],
        );
        assert!(matches!(
            Resctrl::detect(&d),
            Err(CgroupError::Parse { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
