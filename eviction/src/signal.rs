//! Eviction signals, the node conditions they raise and the resource each one
//! starves, as kubelet (v1.28) names them.

use std::fmt;

/// A signal kubelet's eviction manager observes. Every threshold on it is
/// "available < value" (kubelet's only operator, `LessThan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Node memory: capacity − working set.
    MemoryAvailable,
    /// The pods' root cgroup: allocatable − its working set.
    AllocatableMemoryAvailable,
    /// Process ids: pid_max − running processes.
    PidAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::PidAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
    ];

    /// kubelet's spelling (`memory.available`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::PidAvailable => "pid.available",
            Self::NodefsAvailable => "nodefs.available",
            Self::NodefsInodesFree => "nodefs.inodesFree",
            Self::ImagefsAvailable => "imagefs.available",
            Self::ImagefsInodesFree => "imagefs.inodesFree",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// The node condition a met threshold on this signal raises.
    pub fn condition(self) -> Condition {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Condition::MemoryPressure,
            Self::PidAvailable => Condition::PidPressure,
            _ => Condition::DiskPressure,
        }
    }

    /// The resource a met threshold on this signal starves (messages, ranking).
    pub fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Resource::Memory,
            Self::PidAvailable => Resource::Pids,
            Self::NodefsAvailable | Self::ImagefsAvailable => Resource::EphemeralStorage,
            Self::NodefsInodesFree | Self::ImagefsInodesFree => Resource::Inodes,
        }
    }

    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }

    /// Whether the signal's amounts are bytes (printed with binary suffixes).
    pub fn in_bytes(self) -> bool {
        matches!(
            self.resource(),
            Resource::Memory | Resource::EphemeralStorage
        )
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node condition kubelet reports while a threshold is met (and for the
/// pressure transition period after).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a signal starves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An amount as Go's `resource.Quantity.String()` prints it: in BinarySI
/// (`bytes`) the largest binary suffix that keeps the number whole (`1536Mi`,
/// `2Gi`), in DecimalSI the largest decimal one (`500k`, `1M`, `1200`), as
/// kubelet prints bytes and counts.
pub fn format_amount(v: i64, bytes: bool) -> String {
    if v == 0 {
        return "0".into();
    }
    let (base, suffix): (i64, [&str; 6]) = if bytes {
        (1024, ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    } else {
        (1000, ["k", "M", "G", "T", "P", "E"])
    };
    let mut n = v;
    let mut unit = None;
    for s in suffix {
        if n % base != 0 {
            break;
        }
        n /= base;
        unit = Some(s);
    }
    match unit {
        Some(s) => format!("{n}{s}"),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_none() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.as_str()), Some(s));
        }
        assert_eq!(Signal::parse("mem.available"), None);
        assert_eq!(Signal::parse("containerfs.available"), None);
    }

    #[test]
    fn amounts_print_as_go_quantities() {
        assert_eq!(format_amount(2 << 30, true), "2Gi");
        assert_eq!(format_amount(1536 << 20, true), "1536Mi");
        assert_eq!(format_amount(1000, true), "1000");
        assert_eq!(format_amount(1024, true), "1Ki");
        assert_eq!(format_amount(-(100 << 20), true), "-100Mi");
        assert_eq!(format_amount(0, true), "0");
        assert_eq!(format_amount(50000, false), "50k");
        assert_eq!(format_amount(500_000, false), "500k");
        assert_eq!(format_amount(1_000_000, false), "1M");
        assert_eq!(format_amount(1200, false), "1200");
        assert_eq!(format_amount(1_048_576, false), "1048576");
    }
}
