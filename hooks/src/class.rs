//! A pod's QoS class.
//!
//! Koordinator's label `koordinator.sh/qosClass` wins; without it the class
//! follows the Kubernetes QoS, which CRI shows through the sandbox cgroup
//! parent (`/kubepods/burstable/...`, `/kubepods/besteffort/...`, or directly
//! under `/kubepods` for Guaranteed; systemd-style `kubepods-burstable-...slice`
//! too). The skip label means "do not touch this pod".

use std::collections::BTreeMap;

pub const LABEL_QOS_CLASS: &str = "koordinator.sh/qosClass";
pub const LABEL_SKIP: &str = "runtimeproxy.koordinator.sh/skip-hookserver";

/// Koordinator's QoS classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    Lse,
    Lsr,
    Ls,
    Be,
    System,
}

impl QosClass {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "LSE" => Self::Lse,
            "LSR" => Self::Lsr,
            "LS" => Self::Ls,
            "BE" => Self::Be,
            "SYSTEM" => Self::System,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lse => "LSE",
            Self::Lsr => "LSR",
            Self::Ls => "LS",
            Self::Be => "BE",
            Self::System => "SYSTEM",
        }
    }
}

/// The Kubernetes QoS class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeQos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl KubeQos {
    /// Koordinator's default mapping.
    pub fn class(self) -> QosClass {
        match self {
            Self::Guaranteed => QosClass::Lsr,
            Self::Burstable => QosClass::Ls,
            Self::BestEffort => QosClass::Be,
        }
    }

    /// From the sandbox cgroup parent (cgroupfs or systemd naming); `None` when
    /// the parent is not under kubepods.
    pub fn from_cgroup_parent(parent: &str) -> Option<Self> {
        let parts: Vec<&str> = parent.split('/').filter(|p| !p.is_empty()).collect();
        // systemd driver: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podX.slice
        if let Some(last) = parts.last().filter(|l| l.ends_with(".slice")) {
            let name = last.trim_end_matches(".slice");
            if !name.starts_with("kubepods") {
                return None;
            }
            return Some(if name.starts_with("kubepods-burstable") {
                Self::Burstable
            } else if name.starts_with("kubepods-besteffort") {
                Self::BestEffort
            } else {
                Self::Guaranteed
            });
        }
        // cgroupfs driver: /kubepods/burstable/podX, /kubepods/besteffort/podX, /kubepods/podX
        let i = parts.iter().position(|p| *p == "kubepods")?;
        Some(match parts.get(i + 1) {
            Some(&"burstable") => Self::Burstable,
            Some(&"besteffort") => Self::BestEffort,
            _ => Self::Guaranteed,
        })
    }
}

/// Where a class came from (for `qoslet explain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassSource {
    /// The `koordinator.sh/qosClass` label.
    Label,
    /// Inferred from the Kubernetes QoS in the cgroup parent.
    KubeQos(KubeQos),
    /// The pod carries the skip label.
    Skipped,
    /// Nothing to go on (not a kubepods cgroup, no label): qoslet leaves it alone.
    Unknown,
}

/// The class decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassDecision {
    /// `None`: qoslet does not touch this pod.
    pub class: Option<QosClass>,
    pub source: ClassSource,
    /// Problems with the input (an unknown class label...), for a logged warning.
    pub warnings: Vec<String>,
}

/// Classifies a pod from its labels and sandbox cgroup parent.
pub fn classify(labels: &BTreeMap<String, String>, cgroup_parent: &str) -> ClassDecision {
    let mut warnings = vec![];
    if labels.get(LABEL_SKIP).is_some_and(|v| v == "true") {
        return ClassDecision {
            class: None,
            source: ClassSource::Skipped,
            warnings,
        };
    }
    if let Some(v) = labels.get(LABEL_QOS_CLASS) {
        match QosClass::parse(v) {
            Some(c) => {
                return ClassDecision {
                    class: Some(c),
                    source: ClassSource::Label,
                    warnings,
                }
            }
            None if v.is_empty() || v == "NONE" => {}
            None => warnings.push(format!(
                "unknown {LABEL_QOS_CLASS} {v:?}; using the Kubernetes QoS"
            )),
        }
    }
    match KubeQos::from_cgroup_parent(cgroup_parent) {
        Some(q) => ClassDecision {
            class: Some(q.class()),
            source: ClassSource::KubeQos(q),
            warnings,
        },
        None => ClassDecision {
            class: None,
            source: ClassSource::Unknown,
            warnings,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// (labels, cgroup parent, expected class, expected source, number of warnings)
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        &'a str,
        Option<QosClass>,
        ClassSource,
        usize,
    );

    #[test]
    fn classes_from_labels_and_cgroup_parents() {
        let table: &[Case] = &[
            (
                &[(LABEL_QOS_CLASS, "BE")],
                "/kubepods/burstable/pod1",
                Some(QosClass::Be),
                ClassSource::Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSE")],
                "",
                Some(QosClass::Lse),
                ClassSource::Label,
                0,
            ),
            (
                &[],
                "/kubepods/burstable/pod1",
                Some(QosClass::Ls),
                ClassSource::KubeQos(KubeQos::Burstable),
                0,
            ),
            (
                &[],
                "/kubepods/besteffort/pod1",
                Some(QosClass::Be),
                ClassSource::KubeQos(KubeQos::BestEffort),
                0,
            ),
            (
                &[],
                "/kubepods/pod1",
                Some(QosClass::Lsr),
                ClassSource::KubeQos(KubeQos::Guaranteed),
                0,
            ),
            (
                &[],
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
                Some(QosClass::Be),
                ClassSource::KubeQos(KubeQos::BestEffort),
                0,
            ),
            (
                &[],
                "kubepods-burstable-pod1.slice",
                Some(QosClass::Ls),
                ClassSource::KubeQos(KubeQos::Burstable),
                0,
            ),
            (
                &[],
                "kubepods-pod1.slice",
                Some(QosClass::Lsr),
                ClassSource::KubeQos(KubeQos::Guaranteed),
                0,
            ),
            (&[], "/system.slice/foo", None, ClassSource::Unknown, 0),
            (&[], "", None, ClassSource::Unknown, 0),
            (
                &[(LABEL_QOS_CLASS, "be")],
                "/kubepods/besteffort/p",
                Some(QosClass::Be),
                ClassSource::KubeQos(KubeQos::BestEffort),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "GOLD")],
                "/kubepods/p",
                Some(QosClass::Lsr),
                ClassSource::KubeQos(KubeQos::Guaranteed),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "BE"), (LABEL_SKIP, "true")],
                "/kubepods/besteffort/p",
                None,
                ClassSource::Skipped,
                0,
            ),
            (
                &[(LABEL_SKIP, "false")],
                "/kubepods/besteffort/p",
                Some(QosClass::Be),
                ClassSource::KubeQos(KubeQos::BestEffort),
                0,
            ),
        ];
        for (l, parent, class, source, warnings) in table {
            let d = classify(&labels(l), parent);
            assert_eq!(
                (&d.class, &d.source, d.warnings.len()),
                (class, source, *warnings),
                "{l:?} {parent}"
            );
        }
    }

    #[test]
    fn names_round_trip() {
        for c in [
            QosClass::Lse,
            QosClass::Lsr,
            QosClass::Ls,
            QosClass::Be,
            QosClass::System,
        ] {
            assert_eq!(QosClass::parse(c.as_str()), Some(c));
        }
    }
}
