//! The QoS policy, with Koordinator's NodeSLO field names and defaults
//! (`resourceQOSStrategy`), read from the `policy:` section of qoslet's YAML
//! config. Every field is optional; a missing one takes Koordinator's default.

use serde::Deserialize;

use crate::class::QosClass;

/// `resourceQOSStrategy`: per-class settings. Any field left out of the
/// config keeps its class's default (Koordinator's NodeSLO defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "raw::Strategy")]
pub struct ResourceQosStrategy {
    /// `policies.cpuPolicy`: how `cpuQOS` is carried out.
    pub cpu_policy: CpuPolicy,
    pub lsr_class: ResourceQos,
    pub ls_class: ResourceQos,
    pub be_class: ResourceQos,
    pub system_class: ResourceQos,
}

/// `policies.cpuPolicy` (Koordinator's `CPUQOSPolicy`; empty means groupIdentity there too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum CpuPolicy {
    /// Group identity (`cpu.bvt_warp_ns`) per class; the default.
    #[default]
    #[serde(rename = "groupIdentity", alias = "")]
    GroupIdentity,
    /// Core scheduling: group identity off (0), `cpu.idle` on the kube QoS dirs
    /// of classes with `schedIdle: 1` (core-sched cookies are not implemented).
    #[serde(rename = "coreSched")]
    CoreSched,
}

impl Default for ResourceQosStrategy {
    /// Koordinator's NodeSLO defaults (`sloconfig.DefaultResourceQOSStrategy`):
    /// every feature off until a policy turns it on.
    fn default() -> Self {
        Self {
            cpu_policy: CpuPolicy::GroupIdentity,
            lsr_class: ResourceQos::with(2, 100, -25),
            ls_class: ResourceQos::with(2, 100, -25),
            be_class: ResourceQos::with(-1, 30, 50),
            system_class: ResourceQos {
                memory_qos: MemoryQos {
                    wmark_ratio: 0,
                    wmark_scale_permill: 50,
                    wmark_min_adj: 0,
                    ..MemoryQos::default()
                },
                ..ResourceQos::with(0, 100, 0)
            },
        }
    }
}

impl ResourceQosStrategy {
    /// The settings of a class (LSE uses LSR's, as in Koordinator).
    pub fn of(&self, class: QosClass) -> &ResourceQos {
        match class {
            QosClass::Lse | QosClass::Lsr => &self.lsr_class,
            QosClass::Ls => &self.ls_class,
            QosClass::Be => &self.be_class,
            QosClass::System => &self.system_class,
        }
    }

    /// Settings that are valid but worth a warning when they come into force.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.cpu_policy == CpuPolicy::CoreSched {
            for (name, c) in [
                ("lsrClass", &self.lsr_class),
                ("lsClass", &self.ls_class),
                ("beClass", &self.be_class),
            ] {
                if c.cpu_qos.sched_idle == 1 {
                    w.push(format!("resourceQOSStrategy.{name}.cpuQOS.schedIdle 1 under cpuPolicy coreSched makes its kube QoS dir SCHED_IDLE: the kernel then refuses kubelet's cpu.shares writes on that dir (as with koordlet)"));
                }
            }
        }
        w
    }

    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (name, c) in [
            ("lsrClass", &self.lsr_class),
            ("lsClass", &self.ls_class),
            ("beClass", &self.be_class),
            ("systemClass", &self.system_class),
        ] {
            let m = &c.memory_qos;
            for (f, v) in [
                ("minLimitPercent", m.min_limit_percent),
                ("lowLimitPercent", m.low_limit_percent),
                ("throttlingPercent", m.throttling_percent),
            ] {
                if !(0..=100).contains(&v) {
                    return Err(PolicyError::new(
                        format!("resourceQOSStrategy.{name}.memoryQOS.{f}"),
                        format!("{v} is not a percentage (0-100)"),
                    ));
                }
            }
            for (t, v, f) in m.tunes() {
                if !t.range().contains(&v) {
                    return Err(PolicyError::new(
                        format!("resourceQOSStrategy.{name}.memoryQOS.{f}"),
                        format!("{v} is outside {:?} ({})", t.range(), t.file()),
                    ));
                }
            }
            if !(0..=1).contains(&c.cpu_qos.sched_idle) {
                return Err(PolicyError::new(
                    format!("resourceQOSStrategy.{name}.cpuQOS.schedIdle"),
                    format!("{} is not 0 or 1", c.cpu_qos.sched_idle),
                ));
            }
            if !(-1..=2).contains(&c.cpu_qos.group_identity) {
                return Err(PolicyError::new(
                    format!("resourceQOSStrategy.{name}.cpuQOS.groupIdentity"),
                    format!("{} is not -1..=2", c.cpu_qos.group_identity),
                ));
            }
            let r = &c.resctrl_qos;
            // an empty range gives an empty cache mask, which the kernel refuses
            // (Koordinator refuses end <= start too); checked where it is used
            if (r.enable && r.cat_range_start_percent >= r.cat_range_end_percent)
                || r.cat_range_start_percent > r.cat_range_end_percent
                || r.cat_range_end_percent > 100
                || r.mba_percent > 100
            {
                return Err(PolicyError::new(
                    format!("resourceQOSStrategy.{name}.resctrlQOS"),
                    format!(
                        "start {} / end {} / mba {} out of range",
                        r.cat_range_start_percent, r.cat_range_end_percent, r.mba_percent
                    ),
                ));
            }
            for (i, b) in c.blkio_qos.blocks.iter().enumerate() {
                let at = format!("resourceQOSStrategy.{name}.blkioQOS.blocks[{i}]");
                if b.name.trim().is_empty() {
                    return Err(PolicyError::new(format!("{at}.name"), "empty"));
                }
                if !["device", "volumegroup", "podvolume"].contains(&b.block_type.as_str()) {
                    return Err(PolicyError::new(
                        format!("{at}.type"),
                        format!(
                            "{:?} is not a block type (device, volumegroup, podvolume)",
                            b.block_type
                        ),
                    ));
                }
                for (f, v) in [
                    ("readBPS", b.read_bps),
                    ("writeBPS", b.write_bps),
                    ("readIOPS", b.read_iops),
                    ("writeIOPS", b.write_iops),
                ] {
                    if v < 0 {
                        return Err(PolicyError::new(
                            format!("{at}.ioCfg.{f}"),
                            format!("{v} is negative (0 = no limit)"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One class's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceQos {
    pub cpu_qos: CpuQos,
    pub memory_qos: MemoryQos,
    pub resctrl_qos: ResctrlQos,
    pub blkio_qos: BlkIoQos,
}

impl ResourceQos {
    fn with(group_identity: i64, cat_end: u32, wmark_min_adj: i64) -> Self {
        Self {
            cpu_qos: CpuQos {
                enable: false,
                group_identity,
                sched_idle: 0,
                core_expeller: false,
            },
            memory_qos: MemoryQos {
                wmark_min_adj,
                ..MemoryQos::default()
            },
            resctrl_qos: ResctrlQos {
                enable: false,
                cat_range_start_percent: 0,
                cat_range_end_percent: cat_end,
                mba_percent: 100,
            },
            blkio_qos: BlkIoQos::default(),
        }
    }
}

/// `cpuQOS`: group identity (bvt) on Anolis kernels, SCHED_IDLE for BE elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuQos {
    pub enable: bool,
    pub group_identity: i64,
    /// `schedIdle` (0/1): under `cpuPolicy: coreSched`, `cpu.idle` on the class's kube QoS dir.
    pub sched_idle: i64,
    /// `coreExpeller`: parsed, not implemented (core-sched cookies).
    pub core_expeller: bool,
}

/// `memoryQOS` (off unless enabled; all percentages 0 by default, as Koordinator).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryQos {
    pub enable: bool,
    pub min_limit_percent: i64,
    pub low_limit_percent: i64,
    pub throttling_percent: i64,
    pub wmark_ratio: i64,
    pub wmark_scale_permill: i64,
    pub wmark_min_adj: i64,
    /// `priorityEnable` (0/1: `memory.use_priority_oom`), `priority` (0-12:
    /// `memory.priority`), `oomKillGroup` (0/1: `memory.oom.group`).
    pub priority_enable: i64,
    pub priority: i64,
    pub oom_kill_group: i64,
}

impl MemoryQos {
    /// The memory files memory QoS sets to this class's values, as koordlet's
    /// `cgroupResourceSummary` (each written where the kernel has it).
    pub fn tunes(&self) -> [(qoslet_cgroups::MemTune, i64, &'static str); 6] {
        use qoslet_cgroups::MemTune::*;
        [
            (WmarkRatio, self.wmark_ratio, "wmarkRatio"),
            (
                WmarkScaleFactor,
                self.wmark_scale_permill,
                "wmarkScalePermill",
            ),
            (WmarkMinAdj, self.wmark_min_adj, "wmarkMinAdj"),
            (UsePriorityOom, self.priority_enable, "priorityEnable"),
            (Priority, self.priority, "priority"),
            (OomGroup, self.oom_kill_group, "oomKillGroup"),
        ]
    }
}

impl Default for MemoryQos {
    fn default() -> Self {
        Self {
            enable: false,
            min_limit_percent: 0,
            low_limit_percent: 0,
            throttling_percent: 0,
            wmark_ratio: 95,
            wmark_scale_permill: 20,
            wmark_min_adj: 0,
            priority_enable: 0,
            priority: 0,
            oom_kill_group: 0,
        }
    }
}

/// A policy refused: the field's path (NodeSLO names, e.g.
/// `resourceQOSStrategy.beClass.memoryQOS.minLimitPercent`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PolicyError {
    pub path: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// `resctrlQOS`: LLC ways (as a percentage range of the cache) and memory bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct ResctrlQos {
    pub enable: bool,
    pub cat_range_start_percent: u32,
    pub cat_range_end_percent: u32,
    pub mba_percent: u32,
}

/// `blkioQOS`: per-device read/write limits for the class's pods (off by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlkIoQos {
    pub enable: bool,
    pub blocks: Vec<BlockCfg>,
}

/// One `blocks[]` entry: a device (`/dev/vda` or `254:0`) and its limits
/// (bytes or operations per second; 0 = no limit, as in Koordinator).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockCfg {
    pub name: String,
    /// Koordinator's `type`: qoslet supports `device` (`podvolume` and
    /// `volumegroup` need the pod's volume spec, which CRI does not carry).
    pub block_type: String,
    pub read_bps: i64,
    pub write_bps: i64,
    pub read_iops: i64,
    pub write_iops: i64,
}

impl BlockCfg {
    /// The limits as cgroup values (`None` = no limit).
    pub fn limits(&self) -> qoslet_cgroups::IoLimits {
        let l = |v: i64| (v > 0).then_some(v as u64);
        qoslet_cgroups::IoLimits {
            read_bps: l(self.read_bps),
            write_bps: l(self.write_bps),
            read_iops: l(self.read_iops),
            write_iops: l(self.write_iops),
        }
    }
}

/// The config file's shape: every field optional, merged over the class defaults.
mod raw {
    use serde::Deserialize;

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Strategy {
        policies: Option<Policies>,
        lsr_class: Option<Class>,
        ls_class: Option<Class>,
        be_class: Option<Class>,
        system_class: Option<Class>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Class {
        #[serde(rename = "cpuQOS")]
        cpu: Option<Cpu>,
        #[serde(rename = "memoryQOS")]
        memory: Option<Memory>,
        #[serde(rename = "resctrlQOS")]
        resctrl: Option<Resctrl>,
        #[serde(rename = "blkioQOS")]
        blkio: Option<BlkIo>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct BlkIo {
        enable: Option<bool>,
        blocks: Option<Vec<Block>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Block {
        name: String,
        /// Koordinator's block types; qoslet supports `device`.
        #[serde(rename = "type", default = "device")]
        block_type: String,
        #[serde(rename = "ioCfg", default)]
        io: IoCfg,
    }

    fn device() -> String {
        "device".into()
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct IoCfg {
        #[serde(rename = "readIOPS")]
        read_iops: Option<i64>,
        #[serde(rename = "writeIOPS")]
        write_iops: Option<i64>,
        #[serde(rename = "readBPS")]
        read_bps: Option<i64>,
        #[serde(rename = "writeBPS")]
        write_bps: Option<i64>,
    }

    impl Block {
        fn into_cfg(self) -> super::BlockCfg {
            super::BlockCfg {
                name: self.name,
                block_type: self.block_type,
                read_bps: self.io.read_bps.unwrap_or(0),
                write_bps: self.io.write_bps.unwrap_or(0),
                read_iops: self.io.read_iops.unwrap_or(0),
                write_iops: self.io.write_iops.unwrap_or(0),
            }
        }
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Policies {
        cpu_policy: Option<super::CpuPolicy>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Cpu {
        enable: Option<bool>,
        group_identity: Option<i64>,
        sched_idle: Option<i64>,
        core_expeller: Option<bool>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Memory {
        enable: Option<bool>,
        min_limit_percent: Option<i64>,
        low_limit_percent: Option<i64>,
        throttling_percent: Option<i64>,
        wmark_ratio: Option<i64>,
        wmark_scale_permill: Option<i64>,
        wmark_min_adj: Option<i64>,
        priority_enable: Option<i64>,
        priority: Option<i64>,
        oom_kill_group: Option<i64>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Resctrl {
        enable: Option<bool>,
        cat_range_start_percent: Option<u32>,
        cat_range_end_percent: Option<u32>,
        mba_percent: Option<u32>,
    }

    fn set<T>(dst: &mut T, v: Option<T>) {
        if let Some(v) = v {
            *dst = v;
        }
    }

    impl Class {
        fn over(self, mut d: super::ResourceQos) -> super::ResourceQos {
            if let Some(c) = self.cpu {
                set(&mut d.cpu_qos.enable, c.enable);
                set(&mut d.cpu_qos.group_identity, c.group_identity);
                set(&mut d.cpu_qos.sched_idle, c.sched_idle);
                set(&mut d.cpu_qos.core_expeller, c.core_expeller);
            }
            if let Some(m) = self.memory {
                let q = &mut d.memory_qos;
                set(&mut q.enable, m.enable);
                set(&mut q.min_limit_percent, m.min_limit_percent);
                set(&mut q.low_limit_percent, m.low_limit_percent);
                set(&mut q.throttling_percent, m.throttling_percent);
                set(&mut q.wmark_ratio, m.wmark_ratio);
                set(&mut q.wmark_scale_permill, m.wmark_scale_permill);
                set(&mut q.wmark_min_adj, m.wmark_min_adj);
                set(&mut q.priority_enable, m.priority_enable);
                set(&mut q.priority, m.priority);
                set(&mut q.oom_kill_group, m.oom_kill_group);
            }
            if let Some(r) = self.resctrl {
                let q = &mut d.resctrl_qos;
                set(&mut q.enable, r.enable);
                set(&mut q.cat_range_start_percent, r.cat_range_start_percent);
                set(&mut q.cat_range_end_percent, r.cat_range_end_percent);
                set(&mut q.mba_percent, r.mba_percent);
            }
            if let Some(b) = self.blkio {
                set(&mut d.blkio_qos.enable, b.enable);
                if let Some(blocks) = b.blocks {
                    d.blkio_qos.blocks = blocks.into_iter().map(Block::into_cfg).collect();
                }
            }
            d
        }
    }

    impl From<Strategy> for super::ResourceQosStrategy {
        fn from(r: Strategy) -> Self {
            let d = super::ResourceQosStrategy::default();
            Self {
                cpu_policy: r
                    .policies
                    .and_then(|p| p.cpu_policy)
                    .unwrap_or(d.cpu_policy),
                lsr_class: r.lsr_class.unwrap_or_default().over(d.lsr_class),
                ls_class: r.ls_class.unwrap_or_default().over(d.ls_class),
                be_class: r.be_class.unwrap_or_default().over(d.be_class),
                system_class: r.system_class.unwrap_or_default().over(d.system_class),
            }
        }
    }
}

/// A memory request known within bounds: exactly (a Guaranteed pod's limit,
/// a batch request) or from kubelet's `oom_score_adj` (to node memory / 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRequest {
    pub lo: u64,
    pub hi: u64,
}

impl MemRequest {
    pub fn exact(v: u64) -> Self {
        Self { lo: v, hi: v }
    }
}

/// memory.min / memory.low / memory.high for a container, as koordlet's
/// `calculateContainerResources`: min = request x min%, low = request x low%
/// (no less than min when set), high = floor((request + (limit - request) x
/// throttling%) / page) x page with node memory for a missing limit (no less
/// than min; none when throttling is 0: `max`). Protections take the request's
/// lower bound, throttling its upper one: never more of either than koordlet's.
pub fn memory_qos(
    q: &MemoryQos,
    request: MemRequest,
    limit: Option<u64>,
    node_memory: u64,
    page: u64,
) -> (u64, u64, Option<u64>) {
    let pct = |v: u64, p: i64| v.saturating_mul(p.clamp(0, 100) as u64) / 100;
    let min = pct(request.lo, q.min_limit_percent);
    let mut low = pct(request.lo, q.low_limit_percent);
    if low > 0 && low < min {
        low = min;
    }
    let limit = limit.or((node_memory > 0).then_some(node_memory));
    let high = match limit {
        Some(l) if q.throttling_percent > 0 => {
            let r = request.hi.min(l);
            let h = (r + pct(l - r, q.throttling_percent)) / page.max(1) * page.max(1);
            Some(h.max(min))
        }
        _ => None,
    };
    (min, low, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_koordinators() {
        let s = ResourceQosStrategy::default();
        assert_eq!(s.of(QosClass::Lsr).cpu_qos.group_identity, 2);
        assert_eq!(
            s.of(QosClass::Lse).cpu_qos.group_identity,
            2,
            "LSE uses LSR's"
        );
        assert_eq!(s.of(QosClass::Ls).cpu_qos.group_identity, 2);
        assert_eq!(s.of(QosClass::Be).cpu_qos.group_identity, -1);
        assert_eq!(s.of(QosClass::Be).resctrl_qos.cat_range_end_percent, 30);
        assert!(!s.of(QosClass::Be).memory_qos.enable);
        assert_eq!(s.of(QosClass::Ls).memory_qos.wmark_ratio, 95);
        s.validate().unwrap();
    }

    #[test]
    fn node_slo_field_names_and_validation() {
        let s: ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"cpuQOS":{"enable":false},"memoryQOS":{"enable":true,"minLimitPercent":50,"lowLimitPercent":80,"throttlingPercent":80}}}"#,
        )
        .unwrap();
        assert!(!s.be_class.cpu_qos.enable);
        assert_eq!(s.be_class.memory_qos.low_limit_percent, 80);
        assert_eq!(
            s.ls_class,
            ResourceQosStrategy::default().ls_class,
            "unset classes keep their defaults"
        );
        assert_eq!(
            s.be_class.cpu_qos.group_identity, -1,
            "unset fields keep their class's default"
        );
        let bad: ResourceQosStrategy =
            serde_json::from_str(r#"{"lsClass":{"memoryQOS":{"minLimitPercent":150}}}"#).unwrap();
        assert!(bad
            .validate()
            .unwrap_err()
            .path
            .ends_with("lsClass.memoryQOS.minLimitPercent"));
        assert!(
            serde_json::from_str::<ResourceQosStrategy>(r#"{"lsClass":{"memoryQoS":{}}}"#).is_err(),
            "unknown field"
        );
    }

    #[test]
    fn blkio_blocks_with_koordinators_names() {
        let s: ResourceQosStrategy = serde_json::from_str(
            r#"{"beClass":{"blkioQOS":{"enable":true,"blocks":[{"name":"/dev/vda","type":"device","ioCfg":{"readBPS":1048576,"writeIOPS":100}}]}}}"#,
        )
        .unwrap();
        s.validate().unwrap();
        let b = &s.be_class.blkio_qos;
        assert!(b.enable && !s.ls_class.blkio_qos.enable);
        assert_eq!(b.blocks[0].name, "/dev/vda");
        let l = b.blocks[0].limits();
        assert_eq!(
            (l.read_bps, l.write_bps, l.read_iops, l.write_iops),
            (Some(1 << 20), None, None, Some(100))
        );
        for (bad, key) in [
            (r#"{"name":"vg","type":"lvm"}"#, "blocks[0].type"),
            (
                r#"{"name":"/dev/vda","ioCfg":{"readBPS":-5}}"#,
                "ioCfg.readBPS",
            ),
            (r#"{"name":" "}"#, "blocks[0].name"),
        ] {
            let s: ResourceQosStrategy = serde_json::from_str(&format!(
                r#"{{"beClass":{{"blkioQOS":{{"enable":true,"blocks":[{bad}]}}}}}}"#
            ))
            .unwrap();
            let e = s.validate().unwrap_err();
            assert!(
                e.path.contains("beClass.blkioQOS") && e.path.contains(key),
                "{e}"
            );
        }
        assert!(
            serde_json::from_str::<ResourceQosStrategy>(
                r#"{"beClass":{"blkioQOS":{"blocks":[{"name":"x","ioCfg":{"readBps":1}}]}}}"#
            )
            .is_err(),
            "misspelt key"
        );
    }

    #[test]
    fn memory_formulas() {
        let q = MemoryQos {
            enable: true,
            min_limit_percent: 50,
            low_limit_percent: 100,
            throttling_percent: 80,
            ..Default::default()
        };
        let g = |r: u64| MemRequest::exact(r);
        let (min, low, high) = memory_qos(&q, g(1 << 30), Some(2 << 30), 0, 4096);
        assert_eq!((min, low), (512 << 20, 1 << 30));
        let want = ((1u64 << 30) + (1u64 << 30) * 80 / 100) / 4096 * 4096;
        assert_eq!(high, Some(want));
        // koordlet's calculateContainerResources: no limit, the node's memory
        let node = 8u64 << 30;
        assert_eq!(
            memory_qos(&q, g(1 << 30), None, node, 4096).2,
            Some(((1u64 << 30) + (7u64 << 30) * 80 / 100) / 4096 * 4096)
        );
        assert_eq!(
            memory_qos(&q, g(1 << 30), None, 0, 4096).2,
            None,
            "nothing known"
        );
        // request = limit (Guaranteed): high at the limit
        assert_eq!(
            memory_qos(&q, g(1 << 30), Some(1 << 30), 0, 4096).2,
            Some(1 << 30)
        );
        // low no less than min, high no less than min
        let q2 = MemoryQos {
            min_limit_percent: 100,
            low_limit_percent: 20,
            throttling_percent: 1,
            ..q.clone()
        };
        let (min, low, high) = memory_qos(&q2, g(1 << 30), Some(1 << 30), 0, 4096);
        assert_eq!((min, low, high), (1 << 30, 1 << 30, Some(1 << 30)));
        // throttling 0: no high (max)
        let q3 = MemoryQos {
            throttling_percent: 0,
            ..q.clone()
        };
        assert_eq!(memory_qos(&q3, g(1 << 30), Some(2 << 30), 0, 4096).2, None);
        // a request known within bounds: protections from its low end, throttling its high end
        let r = MemRequest {
            lo: 1 << 30,
            hi: (1 << 30) + (8 << 20),
        };
        let (min, _, high) = memory_qos(&q, r, Some(2 << 30), 0, 4096);
        assert_eq!(min, 512 << 20);
        let hi = (1u64 << 30) + (8 << 20);
        assert_eq!(
            high,
            Some((hi + ((2u64 << 30) - hi) * 80 / 100) / 4096 * 4096)
        );
        assert_eq!(
            memory_qos(&MemoryQos::default(), g(1 << 30), Some(2 << 30), 0, 4096),
            (0, 0, None),
            "off by default"
        );
    }
}
