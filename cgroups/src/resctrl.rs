//! The resctrl filesystem (Intel RDT / AMD PQoS): detection of the mount and
//! its `info/` (L3 cache-bit mask, number of closids, memory-bandwidth
//! allocation). The root is injected (`/sys/fs/resctrl` in production).

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
    /// MB (memory bandwidth) allocation: minimum bandwidth %, granularity %.
    pub mb: Option<(u32, u32)>,
}

impl Resctrl {
    /// Detects resctrl at `root`; `Ok(None)` when it is not mounted (no RDT).
    pub fn detect(root: &Path) -> Result<Option<Self>, CgroupError> {
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
        let mb = match (
            read_num(root.join("info/MB/min_bandwidth"), false)?,
            read_num(root.join("info/MB/bandwidth_gran"), false)?,
        ) {
            (Some(min), Some(gran)) => Some((min as u32, gran as u32)),
            _ => None,
        };
        Ok(Some(Self {
            root: root.into(),
            l3_cbm_mask,
            l3_closids,
            mb,
        }))
    }

    /// The contiguous cache-bit mask covering `start..end` percent of the full mask
    /// (at least one bit), as resctrl requires contiguous masks.
    pub fn l3_mask_for(&self, start_percent: u32, end_percent: u32) -> Option<u64> {
        let full = self.l3_cbm_mask?;
        let ways = 64 - full.leading_zeros();
        let (s, e) = (
            start_percent.min(100),
            end_percent.clamp(start_percent.min(100), 100),
        );
        let lo = (ways * s) / 100;
        let hi = ((ways * e).div_ceil(100)).max(lo + 1).min(ways);
        Some(((1u64 << hi) - 1) & !((1u64 << lo) - 1))
    }
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
