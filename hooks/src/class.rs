//! A pod's QoS class.
//!
//! The class follows the Kubernetes QoS, which CRI shows through the sandbox
//! cgroup parent (`/kubepods/burstable/...`, `/kubepods/besteffort/...`, or
//! directly under `/kubepods` for Guaranteed; systemd-style
//! `kubepods-burstable-...slice` too), mapped as Koordinator maps it.
//!
//! Koordinator's label `koordinator.sh/qosClass` and the skip label are written
//! by whoever writes the pod spec, a tenant qoslet does not trust: from an
//! untrusted pod the class label may only *lower* the class the Kubernetes QoS
//! implies (a Guaranteed pod may be LSE, LSR, LS or BE; a BestEffort pod only
//! BE), and the skip label ("do not touch this pod") is ignored. The operator
//! lifts this per namespace or for the whole cluster ([`Trust`]), e.g. where
//! Koordinator's webhook validates these labels; then they are taken as
//! Koordinator takes them.

use std::collections::BTreeMap;

use crate::warning::Warning;
use serde::Deserialize;

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

impl QosClass {
    /// How much a class protects its pod (a label may not raise it): BE < LS <
    /// LSR = LSE (both are Guaranteed pods) < SYSTEM.
    pub fn rank(self) -> u8 {
        match self {
            Self::Be => 0,
            Self::Ls => 1,
            Self::Lsr | Self::Lse => 2,
            Self::System => 3,
        }
    }
}

/// Whom qoslet trusts with the class label, the skip label and the scheduler's
/// annotations (`trust:` in the config file). Off by default: pod authors are
/// not trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Trust {
    /// Pods in these namespaces may set any class and the skip label, and their
    /// `scheduling.koordinator.sh/resource-status` cpuset is taken as it is.
    #[serde(default, deserialize_with = "crate::serde_null::empty")]
    pub namespaces: Vec<String>,
    /// The cluster's control plane validates these labels and annotations (a
    /// Koordinator webhook and scheduler): trust every pod's, as koordlet does.
    #[serde(default)]
    pub control_plane: bool,
}

impl Trust {
    /// Whether labels and scheduler annotations of a pod in `namespace` are trusted.
    pub fn trusts(&self, namespace: &str) -> bool {
        self.control_plane || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// The Kubernetes QoS class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Whether the pod's labels and scheduler annotations are trusted ([`Trust`]).
    pub trusted: bool,
    /// The Kubernetes QoS its cgroup parent shows (`None`: not under kubepods).
    pub kube: Option<KubeQos>,
    /// Problems with the input (an unknown class label...), for a logged warning.
    pub warnings: Vec<Warning>,
}

impl ClassDecision {
    /// The class with what decisions need to know of its origin; `None`: leave the pod alone.
    pub fn pod_class(&self) -> Option<PodClass> {
        Some(PodClass {
            class: self.class?,
            by_label: self.source == ClassSource::Label,
            trusted: self.trusted,
            kube: self.kube,
        })
    }
}

/// A pod's class and where it came from, as the decisions need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodClass {
    pub class: QosClass,
    /// Set by the class label (not inferred from the Kubernetes QoS).
    pub by_label: bool,
    /// The pod's labels and scheduler annotations are trusted ([`Trust`]).
    pub trusted: bool,
    /// The Kubernetes QoS its cgroup parent shows (`None`: not under kubepods).
    pub kube: Option<KubeQos>,
}

/// A label value longer than Kubernetes allows (63) is not a class name; refused unread.
const MAX_LABEL_VALUE: usize = 63;

/// Classifies a pod from its labels, namespace and sandbox cgroup parent
/// (see the module docs for what an untrusted label may do).
pub fn classify(
    labels: &BTreeMap<String, String>,
    namespace: &str,
    cgroup_parent: &str,
    trust: &Trust,
) -> ClassDecision {
    let mut warnings = vec![];
    let trusted = trust.trusts(namespace);
    let implied = KubeQos::from_cgroup_parent(cgroup_parent);
    if labels.get(LABEL_SKIP).is_some_and(|v| v == "true") {
        if trusted {
            return ClassDecision {
                class: None,
                source: ClassSource::Skipped,
                trusted,
                kube: implied,
                warnings,
            };
        }
        warnings.push(Warning::SkipNotTrusted {
            namespace: namespace.to_string(),
        });
    }
    if let Some(v) = labels.get(LABEL_QOS_CLASS) {
        let parsed = (v.len() <= MAX_LABEL_VALUE)
            .then(|| QosClass::parse(v))
            .flatten();
        match (parsed, implied) {
            (Some(c), _) if trusted => {
                return ClassDecision {
                    class: Some(c),
                    source: ClassSource::Label,
                    trusted,
                    kube: implied,
                    warnings,
                }
            }
            (Some(c), Some(q)) if c.rank() <= q.class().rank() => {
                return ClassDecision {
                    class: Some(c),
                    source: ClassSource::Label,
                    trusted,
                    kube: implied,
                    warnings,
                }
            }
            (Some(c), Some(q)) => warnings.push(Warning::ClassAboveKubeQos {
                asked: c,
                kube: q,
                namespace: namespace.to_string(),
            }),
            (Some(c), None) => warnings.push(Warning::ClassOutsideKubepods {
                asked: c,
                namespace: namespace.to_string(),
            }),
            (None, _) if v.is_empty() || v == "NONE" => {}
            (None, _) => warnings.push(Warning::UnknownClass {
                value: v.chars().take(MAX_LABEL_VALUE).collect(),
            }),
        }
    }
    match implied {
        Some(q) => ClassDecision {
            class: Some(q.class()),
            source: ClassSource::KubeQos(q),
            trusted,
            kube: implied,
            warnings,
        },
        None => ClassDecision {
            class: None,
            source: ClassSource::Unknown,
            trusted,
            kube: implied,
            warnings,
        },
    }
}

/// Koordinator's priority class label (it overrides the class that
/// `spec.priority` falls in, which CRI does not carry).
pub const LABEL_PRIORITY_CLASS: &str = "koordinator.sh/priority-class";

/// A pod's Koordinator priority class from its label, as koordlet's
/// `GetPodPriorityClassByName` reads it: `koord-prod`, `koord-mid`,
/// `koord-batch` or `koord-free`; anything else is none (`None`: no label;
/// the pod's `spec.priority` needs the Kubernetes API).
pub fn priority_class(labels: &BTreeMap<String, String>) -> Option<&'static str> {
    let v = labels.get(LABEL_PRIORITY_CLASS)?;
    Some(
        ["koord-prod", "koord-mid", "koord-batch", "koord-free"]
            .into_iter()
            .find(|p| *p == v.as_str())
            .unwrap_or("none"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// (labels, cgroup parent, trusted, expected class, expected source, number of warnings)
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        &'a str,
        bool,
        Option<QosClass>,
        ClassSource,
        usize,
    );

    #[test]
    fn classes_from_labels_and_cgroup_parents() {
        use ClassSource::{KubeQos as K, Label};
        use KubeQos::{BestEffort, Burstable, Guaranteed};
        let table: &[Case] = &[
            // untrusted: a label may lower the class the Kubernetes QoS implies...
            (
                &[(LABEL_QOS_CLASS, "BE")],
                "/kubepods/burstable/pod1",
                false,
                Some(QosClass::Be),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "LS")],
                "/kubepods/pod1",
                false,
                Some(QosClass::Ls),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSE")],
                "/kubepods/pod1",
                false,
                Some(QosClass::Lse),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSR")],
                "/kubepods/pod1",
                false,
                Some(QosClass::Lsr),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "BE")],
                "/kubepods/besteffort/pod1",
                false,
                Some(QosClass::Be),
                Label,
                0,
            ),
            // ... never raise it
            (
                &[(LABEL_QOS_CLASS, "LS")],
                "/kubepods/besteffort/pod1",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSR")],
                "/kubepods/besteffort/pod1",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSE")],
                "/kubepods/burstable/pod1",
                false,
                Some(QosClass::Ls),
                K(Burstable),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "SYSTEM")],
                "/kubepods/pod1",
                false,
                Some(QosClass::Lsr),
                K(Guaranteed),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSE")],
                "",
                false,
                None,
                ClassSource::Unknown,
                1,
            ),
            // trusted: taken as Koordinator takes it
            (
                &[(LABEL_QOS_CLASS, "LSE")],
                "",
                true,
                Some(QosClass::Lse),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "LSR")],
                "/kubepods/besteffort/pod1",
                true,
                Some(QosClass::Lsr),
                Label,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "SYSTEM")],
                "/kubepods/pod1",
                true,
                Some(QosClass::System),
                Label,
                0,
            ),
            // the Kubernetes QoS, cgroupfs and systemd naming
            (
                &[],
                "/kubepods/burstable/pod1",
                false,
                Some(QosClass::Ls),
                K(Burstable),
                0,
            ),
            (
                &[],
                "/kubepods/besteffort/pod1",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                0,
            ),
            (
                &[],
                "/kubepods/pod1",
                false,
                Some(QosClass::Lsr),
                K(Guaranteed),
                0,
            ),
            (
                &[],
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                0,
            ),
            (
                &[],
                "kubepods-burstable-pod1.slice",
                false,
                Some(QosClass::Ls),
                K(Burstable),
                0,
            ),
            (
                &[],
                "kubepods-pod1.slice",
                false,
                Some(QosClass::Lsr),
                K(Guaranteed),
                0,
            ),
            (
                &[],
                "/system.slice/foo",
                false,
                None,
                ClassSource::Unknown,
                0,
            ),
            (&[], "", false, None, ClassSource::Unknown, 0),
            // bad labels: a warning and the Kubernetes QoS
            (
                &[(LABEL_QOS_CLASS, "be")],
                "/kubepods/besteffort/p",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "GOLD")],
                "/kubepods/p",
                false,
                Some(QosClass::Lsr),
                K(Guaranteed),
                1,
            ),
            (
                &[(LABEL_QOS_CLASS, "NONE")],
                "/kubepods/p",
                false,
                Some(QosClass::Lsr),
                K(Guaranteed),
                0,
            ),
            // the skip label: honoured from trusted pods only
            (
                &[(LABEL_QOS_CLASS, "BE"), (LABEL_SKIP, "true")],
                "/kubepods/besteffort/p",
                true,
                None,
                ClassSource::Skipped,
                0,
            ),
            (
                &[(LABEL_QOS_CLASS, "BE"), (LABEL_SKIP, "true")],
                "/kubepods/besteffort/p",
                false,
                Some(QosClass::Be),
                Label,
                1,
            ),
            (
                &[(LABEL_SKIP, "false")],
                "/kubepods/besteffort/p",
                false,
                Some(QosClass::Be),
                K(BestEffort),
                0,
            ),
        ];
        let trust = Trust {
            namespaces: vec!["trusted".into()],
            control_plane: false,
        };
        for (l, parent, trusted, class, source, warnings) in table {
            let ns = if *trusted { "trusted" } else { "tenant" };
            let d = classify(&labels(l), ns, parent, &trust);
            assert_eq!(
                (&d.class, &d.source, d.warnings.len(), d.trusted),
                (class, source, *warnings, *trusted),
                "{l:?} {parent} trusted={trusted}: {:?}",
                d.warnings
            );
        }
    }

    #[test]
    fn control_plane_trust_covers_every_namespace_and_long_labels_are_refused_unread() {
        let all = Trust {
            namespaces: vec![],
            control_plane: true,
        };
        let d = classify(
            &labels(&[(LABEL_QOS_CLASS, "LSR")]),
            "any",
            "/kubepods/besteffort/p",
            &all,
        );
        assert_eq!(d.class, Some(QosClass::Lsr));
        let long = "L".repeat(300_000);
        let d = classify(
            &labels(&[(LABEL_QOS_CLASS, &long)]),
            "x",
            "/kubepods/p",
            &Trust::default(),
        );
        assert_eq!(d.class, Some(QosClass::Lsr));
        assert!(
            d.warnings[0].to_string().len() < 200,
            "the warning does not echo the whole label"
        );
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

    /// Koordinator's `GetPodPriorityClassByName`: the four classes, anything else none.
    #[test]
    fn priority_class_label() {
        let l = |v: &str| -> BTreeMap<String, String> {
            [(LABEL_PRIORITY_CLASS.to_string(), v.to_string())].into()
        };
        assert_eq!(priority_class(&l("koord-batch")), Some("koord-batch"));
        assert_eq!(priority_class(&l("koord-prod")), Some("koord-prod"));
        assert_eq!(priority_class(&l("koord-PROD")), Some("none"));
        assert_eq!(priority_class(&BTreeMap::new()), None);
    }
}
