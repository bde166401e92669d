//! Cgroup paths from untrusted input. A pod's cgroup parent comes from kubelet
//! (and, through it, from users): it is validated before it is joined to any
//! root, and symlinks on the way are refused, so no write can land outside the
//! cgroup root.

use std::path::{Component, Path, PathBuf};

use crate::CgroupError;

/// A validated cgroup path, relative to a hierarchy root (`kubepods/burstable/pod1/ctr`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupPath(String);

impl CgroupPath {
    /// Validates `raw` as kubelet writes cgroup parents (`/kubepods/burstable/podX`;
    /// systemd slice names are taken literally). Refuses `..`, a leading `.`, NUL
    /// and overlong paths; empty components (`//`) and inner `.` are dropped.
    pub fn parse(raw: &str) -> Result<Self, CgroupError> {
        let refuse = |reason| {
            Err(CgroupError::UnsafePath {
                path: raw.to_string(),
                reason,
            })
        };
        if raw.contains('\0') {
            return refuse("contains NUL");
        }
        if raw.len() > 4096 {
            return refuse("longer than PATH_MAX");
        }
        let mut parts = Vec::new();
        for c in Path::new(raw).components() {
            match c {
                Component::RootDir => {}
                Component::Normal(s) => {
                    let s = s.to_str().ok_or(CgroupError::UnsafePath {
                        path: raw.to_string(),
                        reason: "not UTF-8",
                    })?;
                    parts.push(s);
                }
                Component::ParentDir => return refuse("contains '..'"),
                Component::CurDir => return refuse("contains '.'"),
                Component::Prefix(_) => return refuse("has a prefix"),
            }
        }
        Ok(Self(parts.join("/")))
    }

    /// A pod's cgroup from kubelet's cgroup parent: a path with the cgroupfs
    /// driver (`/kubepods/besteffort/pod1`), a slice name with the systemd driver
    /// (`kubepods-besteffort-pod1.slice`, which systemd nests as
    /// `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice`).
    ///
    /// It must be a pod's own cgroup under the kubepods root, as kubelet names
    /// them: directly below `kubepods` (or `kubepods.slice`) under kubelet's
    /// `--cgroup-root` (`/` by default; see [`PodRoot`]), its last component a
    /// pod's (`pod<uid>`, `kubepods-...-pod<uid>.slice`). The root,
    /// `/system.slice`, `kubepods` itself or a QoS dir (`kubepods/besteffort`)
    /// are refused, so no pod's settings can land on a shared cgroup.
    pub fn pod(cgroup_parent: &str) -> Result<Self, CgroupError> {
        Self::pod_under(cgroup_parent, &PodRoot::default())
    }

    /// [`CgroupPath::pod`] with kubelet's cgroup root given.
    pub fn pod_under(cgroup_parent: &str, root: &PodRoot) -> Result<Self, CgroupError> {
        let refuse = |reason| {
            Err(CgroupError::UnsafePath {
                path: cgroup_parent.to_string(),
                reason,
            })
        };
        let t = cgroup_parent.trim_start_matches('/');
        let slice = t.ends_with(".slice") && !t.contains('/');
        if slice && !t.starts_with(&format!("{}kubepods-", root.slice_prefix)) {
            return refuse("not under the kubepods root");
        }
        let p = Self::pod_unchecked(cgroup_parent)?;
        let parts: Vec<&str> = p.0.split('/').collect();
        let below = [&root.cgroupfs, &root.systemd]
            .into_iter()
            .find(|prefix| {
                parts.len() > prefix.len()
                    && parts.starts_with(&prefix.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .map(|prefix| prefix.len());
        let Some(k) = below else {
            return refuse("not under the kubepods root");
        };
        let last = parts[parts.len() - 1];
        let is_pod = last.starts_with("pod")
            || (last.ends_with(".slice")
                && last
                    .trim_end_matches(".slice")
                    .rsplit('-')
                    .next()
                    .is_some_and(|s| s.starts_with("pod")));
        if parts.len() <= k || !is_pod {
            return refuse("not a pod's own cgroup (kubelet names them pod<uid>)");
        }
        Ok(p)
    }

    fn pod_unchecked(cgroup_parent: &str) -> Result<Self, CgroupError> {
        let t = cgroup_parent.trim_start_matches('/');
        if t.ends_with(".slice") && !t.contains('/') {
            let name = t.trim_end_matches(".slice");
            let mut path = Self::root();
            let mut prefix = String::new();
            for part in name.split('-') {
                if part.is_empty() {
                    return Err(CgroupError::UnsafePath {
                        path: cgroup_parent.into(),
                        reason: "empty systemd slice component",
                    });
                }
                if !prefix.is_empty() {
                    prefix.push('-');
                }
                prefix.push_str(part);
                path = path.child(&format!("{prefix}.slice"))?;
            }
            return Ok(path);
        }
        Self::parse(cgroup_parent)
    }

    /// A container's cgroup under its pod's (as containerd names it: the
    /// container id with the cgroupfs driver, `cri-containerd-<id>.scope` under
    /// a systemd slice).
    pub fn container(&self, id: &str) -> Result<Self, CgroupError> {
        if self.0.ends_with(".slice") {
            self.child(&format!("cri-containerd-{id}.scope"))
        } else {
            self.child(id)
        }
    }

    /// The root cgroup.
    pub fn root() -> Self {
        Self(String::new())
    }

    /// A child (one component, validated).
    pub fn child(&self, name: &str) -> Result<Self, CgroupError> {
        if name.is_empty()
            || name.contains('/')
            || name == ".."
            || name == "."
            || name.contains('\0')
        {
            return Err(CgroupError::UnsafePath {
                path: name.to_string(),
                reason: "not a single path component",
            });
        }
        Ok(Self(if self.0.is_empty() {
            name.to_string()
        } else {
            format!("{}/{}", self.0, name)
        }))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent path, if any.
    pub fn parent(&self) -> Option<Self> {
        if self.0.is_empty() {
            return None;
        }
        Some(Self(
            self.0
                .rsplit_once('/')
                .map(|(p, _)| p.to_string())
                .unwrap_or_default(),
        ))
    }

    /// Joins under `root`, refusing symlinks on the way (existing components
    /// only; missing ones are reported by whoever opens the file).
    pub fn under(&self, root: &Path) -> Result<PathBuf, CgroupError> {
        let mut p = root.to_path_buf();
        for part in self.0.split('/').filter(|s| !s.is_empty()) {
            p.push(part);
            if let Ok(md) = std::fs::symlink_metadata(&p) {
                if md.file_type().is_symlink() {
                    return Err(CgroupError::SymlinkEscape { path: p });
                }
            }
        }
        Ok(p)
    }
}

/// Where kubelet puts pods: `<--cgroup-root>/kubepods` with the cgroupfs
/// driver, `<root>.slice/<root>-kubepods.slice` with the systemd driver
/// (`kubepods.slice` for the default root `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRoot {
    /// Components down to and including `kubepods` (cgroupfs driver).
    cgroupfs: Vec<String>,
    /// The same for the systemd driver (`kubelet.slice`, `kubelet-kubepods.slice`).
    systemd: Vec<String>,
    /// The systemd slice-name prefix of kubelet's root (`kubelet-`; empty for `/`).
    slice_prefix: String,
}

impl Default for PodRoot {
    fn default() -> Self {
        Self {
            cgroupfs: vec!["kubepods".into()],
            systemd: vec!["kubepods.slice".into()],
            slice_prefix: String::new(),
        }
    }
}

impl PodRoot {
    /// The kube QoS dirs, Guaranteed (kubepods itself), Burstable, BestEffort,
    /// as the cgroupfs driver (`kubepods/burstable`) or the systemd driver
    /// (`kubepods.slice/kubepods-burstable.slice`) names them.
    pub fn qos_dirs(&self, systemd: bool) -> [CgroupPath; 3] {
        let base = if systemd {
            &self.systemd
        } else {
            &self.cgroupfs
        };
        let root = CgroupPath(base.join("/"));
        let child = |name: String| CgroupPath(format!("{}/{name}", root.0));
        if systemd {
            let prefix = format!("{}kubepods", self.slice_prefix);
            [
                root.clone(),
                child(format!("{prefix}-burstable.slice")),
                child(format!("{prefix}-besteffort.slice")),
            ]
        } else {
            [
                root.clone(),
                child("burstable".into()),
                child("besteffort".into()),
            ]
        }
    }

    /// From kubelet's `--cgroup-root` (`/` by default; `/kubelet` in kind).
    pub fn new(kubelet_cgroup_root: &str) -> Result<Self, CgroupError> {
        let root = CgroupPath::parse(kubelet_cgroup_root)?;
        if root.as_str().is_empty() {
            return Ok(Self::default());
        }
        let parts: Vec<&str> = root.as_str().split('/').collect();
        let mut cgroupfs: Vec<String> = parts.iter().map(|s| s.to_string()).collect();
        cgroupfs.push("kubepods".into());
        // systemd: each level a slice whose name carries its ancestors' (a-b.slice)
        let names: Vec<&str> = parts.iter().map(|p| p.trim_end_matches(".slice")).collect();
        let mut systemd = Vec::new();
        let mut prefix = String::new();
        for n in &names {
            prefix.push_str(n);
            systemd.push(format!("{prefix}.slice"));
            prefix.push('-');
        }
        systemd.push(format!("{prefix}kubepods.slice"));
        Ok(Self {
            cgroupfs,
            systemd,
            slice_prefix: prefix,
        })
    }
}

impl std::fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_parents_and_refuses_escapes() {
        assert_eq!(
            CgroupPath::parse("/kubepods/burstable/pod1")
                .unwrap()
                .as_str(),
            "kubepods/burstable/pod1"
        );
        assert_eq!(
            CgroupPath::parse("kubepods//besteffort/").unwrap().as_str(),
            "kubepods/besteffort"
        );
        assert_eq!(CgroupPath::parse("/").unwrap(), CgroupPath::root());
        assert_eq!(
            CgroupPath::parse("/a/./b").unwrap().as_str(),
            "a/b",
            "an inner '.' is harmless"
        );
        for bad in [
            "/kubepods/../../etc",
            "..",
            "./a",
            "/a\0b",
            "/kubepods/burstable/../../../sys",
        ] {
            assert!(CgroupPath::parse(bad).is_err(), "{bad:?}");
        }
        assert!(CgroupPath::parse(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn systemd_slices_and_container_scopes() {
        let p = CgroupPath::pod("kubepods-besteffort-pod1a2b.slice").unwrap();
        assert_eq!(
            p.as_str(),
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice"
        );
        assert_eq!(
            p.container("abc").unwrap().as_str(),
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/cri-containerd-abc.scope"
        );
        let c = CgroupPath::pod("/kubepods/besteffort/pod1").unwrap();
        assert_eq!(c.as_str(), "kubepods/besteffort/pod1");
        assert_eq!(
            c.container("abc").unwrap().as_str(),
            "kubepods/besteffort/pod1/abc"
        );
        assert!(CgroupPath::pod("kubepods--x.slice").is_err());
        assert!(CgroupPath::pod("/kubepods/../x").is_err());
        assert!(c.container("../x").is_err());
        assert_eq!(
            CgroupPath::pod("kubepods-pod1.slice").unwrap().as_str(),
            "kubepods.slice/kubepods-pod1.slice"
        );
        let kind = PodRoot::new("/kubelet").unwrap();
        assert!(CgroupPath::pod_under("/kubelet/kubepods/burstable/podx", &kind).is_ok());
        assert_eq!(
            CgroupPath::pod_under("kubelet-kubepods-besteffort-pod1.slice", &kind)
                .unwrap()
                .as_str(),
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1.slice"
        );
        assert!(
            CgroupPath::pod("/kubelet/kubepods/burstable/podx").is_err(),
            "not the default root"
        );
        assert!(CgroupPath::pod_under("/kubepods/burstable/podx", &kind).is_err());
        assert_eq!(
            kind.qos_dirs(true).map(|c| c.to_string()),
            [
                "/kubelet.slice/kubelet-kubepods.slice",
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
            ]
        );
        assert_eq!(
            PodRoot::default().qos_dirs(false).map(|c| c.to_string()),
            ["/kubepods", "/kubepods/burstable", "/kubepods/besteffort"]
        );
        assert!(CgroupPath::pod_under("kubepods-pod1.slice", &kind).is_err());
    }

    /// Issue 12: a pod parent that is not a pod's own cgroup under kubepods
    /// would put one pod's settings on a shared cgroup.
    #[test]
    fn pod_parents_must_be_pod_cgroups_under_kubepods() {
        for bad in [
            "/",
            "",
            "/system.slice",
            "system.slice",
            "/system.slice/foo",
            "/kubepods",
            "/kubepods/besteffort",
            "/kubepods/burstable/",
            "kubepods.slice",
            "kubepods-besteffort.slice",
            "/user.slice/pod1",
            "/kubepods/besteffort/notapod",
            "/user.slice/x/kubepods/podA",
            "/system.slice/kubepods/podA",
        ] {
            assert!(CgroupPath::pod(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn children_and_parents() {
        let p = CgroupPath::parse("/kubepods")
            .unwrap()
            .child("pod1")
            .unwrap();
        assert_eq!(p.to_string(), "/kubepods/pod1");
        assert_eq!(p.parent().unwrap().to_string(), "/kubepods");
        assert_eq!(CgroupPath::root().child("x").unwrap().as_str(), "x");
        for bad in ["", "a/b", "..", "."] {
            assert!(p.child(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn symlinks_on_the_way_are_refused() {
        let d = std::env::temp_dir().join(format!("qoslet-cgpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("root/kubepods")).unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("root/kubepods/evil")).unwrap();
        let root = d.join("root");
        assert!(CgroupPath::parse("/kubepods/ok")
            .unwrap()
            .under(&root)
            .is_ok());
        let e = CgroupPath::parse("/kubepods/evil/pod")
            .unwrap()
            .under(&root)
            .unwrap_err();
        assert!(matches!(e, CgroupError::SymlinkEscape { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
