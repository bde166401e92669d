//! Koordinator's priority class and QoS class of a pod
//! (`apis/extension/priority_utils.go`, `qos_utils.go`): the label first,
//! then `spec.priority`'s range, then the class derived from the QoS class
//! (the `koordinator.sh/qosClass` label, else the Kubernetes QoS class).

/// `koordinator.sh/priority-class`.
pub const PRIORITY_LABEL: &str = "koordinator.sh/priority-class";
/// `koordinator.sh/qosClass`.
pub const QOS_LABEL: &str = "koordinator.sh/qosClass";

/// Koordinator's priority class of a `spec.priority`.
pub fn priority_class(priority: i32) -> Option<&'static str> {
    match priority {
        9000..=9999 => Some("koord-prod"),
        7000..=7999 => Some("koord-mid"),
        5000..=5999 => Some("koord-batch"),
        3000..=3999 => Some("koord-free"),
        _ => None,
    }
}

/// Koordinator's priority class of a pod (`GetPodPriorityClassWithDefault`):
/// its label when it has one (a value naming no class is none), else its
/// `spec.priority`'s range, else by its QoS class (BE: `koord-batch`; LSE,
/// LSR, LS, SYSTEM: `koord-prod`).
pub fn priority_class_with_default(
    label: Option<&str>,
    priority: Option<i32>,
    qos: Option<&str>,
) -> Option<&'static str> {
    let named = |l: &str| match l {
        "koord-prod" => Some("koord-prod"),
        "koord-mid" => Some("koord-mid"),
        "koord-batch" => Some("koord-batch"),
        "koord-free" => Some("koord-free"),
        _ => None,
    };
    // a label, whatever its value, decides before spec.priority (a value
    // that names no class is none: the QoS class decides)
    match label {
        Some(l) => named(l),
        None => priority.and_then(priority_class),
    }
    .or(match qos {
        Some("BE") => Some("koord-batch"),
        Some(_) => Some("koord-prod"),
        None => None,
    })
}

/// Koordinator's QoS class of a pod (`GetPodQoSClassWithDefault`): its
/// `koordinator.sh/qosClass` label when that names a class, else from the
/// Kubernetes QoS class (Guaranteed: LSR, Burstable: LS, BestEffort: BE);
/// `None` when neither says.
pub fn qos_class_with_default(label: Option<&str>, kube_qos: Option<&str>) -> Option<&'static str> {
    let named = label.and_then(|l| match l {
        "LSE" => Some("LSE"),
        "LSR" => Some("LSR"),
        "LS" => Some("LS"),
        "BE" => Some("BE"),
        "SYSTEM" => Some("SYSTEM"),
        _ => None,
    });
    named.or(match kube_qos {
        Some("Guaranteed") => Some("LSR"),
        Some("Burstable") => Some("LS"),
        Some("BestEffort") => Some("BE"),
        _ => None,
    })
}

/// Whether a priority class is below batch's bar (batch and free work
/// borrows what the others leave; every other class, and none, counts as
/// high priority).
pub fn is_low_priority(class: Option<&str>) -> bool {
    matches!(class, Some("koord-batch" | "koord-free"))
}

/// Whether a host application's priority is above batch's
/// (`GetHostAppHPUsed`: prod and mid; batch, free, none and unknown are not).
pub fn is_above_batch(class: Option<&str>) -> bool {
    matches!(class, Some("koord-prod" | "koord-mid"))
}
