//! The YAML config file (`--config`, default `/etc/qoslet/qoslet.yaml`).
//!
//! Every proxy flag can be set here; flags win over the file, the file wins over
//! defaults. A missing *default* file means defaults; a missing file named
//! explicitly, or a bad file, is an error that names the key and the reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

pub const DEFAULT_CONFIG: &str = "/etc/qoslet/qoslet.yaml";

/// The file's shape. Keys are camelCase, like Kubernetes config.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub runtime_endpoint: Option<String>,
    pub admin_listen: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    /// Per-message size limit in bytes, each way (default 16 MiB).
    pub max_message_bytes: Option<u64>,
    /// How long SIGTERM waits for in-flight calls, e.g. `30s`.
    pub drain_timeout: Option<Dur>,
    /// How often the store is reconciled with the runtime, e.g. `60s`.
    pub resync_interval: Option<Dur>,
    pub hooks: Option<HooksConfig>,
    /// Deprecated and ignored (the opt-in frame relay is gone: HTTP/2 is always
    /// terminated); still accepted so an old config file keeps working, with a warning.
    pub relay: Option<bool>,
    /// Apply QoS isolation at the runtime hooks (default true); false: a pure proxy.
    pub isolation: Option<bool>,
    /// Root of the cgroup filesystem (default /sys/fs/cgroup).
    pub cgroup_root: Option<PathBuf>,
    /// Root of the resctrl filesystem (default /sys/fs/resctrl; absent = no LLC/MBA isolation).
    pub resctrl_root: Option<PathBuf>,
    /// The QoS policy, with Koordinator's NodeSLO names (its errors name
    /// their key under `policy.`).
    #[serde(default, deserialize_with = "policy_section")]
    pub policy: Option<PolicyConfig>,
    /// Collect metrics (default true).
    pub metrics: Option<bool>,
    /// Collection interval, 1s to 600s (default 1s).
    pub metrics_interval: Option<Interval>,
    /// Prometheus endpoint `host:port` (default 127.0.0.1:9316; empty: no HTTP endpoint).
    pub metrics_listen: Option<String>,
    /// Keep the metrics cache across restarts in the state dir (default true).
    pub metrics_snapshot: Option<bool>,
    /// Series the metrics cache holds at most (default 50,000; the entity seen
    /// longest ago is dropped first beyond it).
    pub metrics_max_series: Option<usize>,
    /// Root of procfs (default /proc).
    pub proc_root: Option<PathBuf>,
    /// Root of sysfs (default /sys): CPU topology, NUMA, block devices.
    pub sys_root: Option<PathBuf>,
    /// The QoS engine's loop.
    pub qos_engine: Option<EngineConfig>,
    /// Whom qoslet trusts with class labels, the skip label and the scheduler's
    /// cpuset annotation (default: nobody; pod authors are not trusted).
    pub trust: Option<qoslet_hooks::Trust>,
    /// kubelet's `--cgroup-root` (default `/`): pods live in `<root>/kubepods`
    /// (`<root>.slice/<root>-kubepods.slice` with the systemd driver).
    pub kubelet_cgroup_root: Option<String>,
    /// The CPUs kubelet reserves for the system (`--reserved-cpus`, a CPU list
    /// such as `0-1`): never given to a pod by qoslet.
    pub reserved_cpuset: Option<String>,
    /// `nri:` — the NRI plugin mode (`qoslet nri`).
    pub nri: Option<NriConfig>,
    /// `eviction:` — kubelet-style thresholds and qoslet's eviction settings
    /// (Koordinator's BE eviction reads `policy.resourceUsedThresholdWithBE`).
    pub eviction: Option<qoslet_eviction::EvictionConfig>,
    /// `kubernetes:` — the cluster side (off unless `enable`).
    pub kubernetes: Option<qoslet_kube::KubernetesConfig>,
}

/// `nri:` — how `qoslet nri` reaches the runtime and presents itself.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NriConfig {
    /// The runtime's NRI socket (default /var/run/nri/nri.sock).
    pub socket: Option<PathBuf>,
    /// The plugin's name (default qoslet; letters, digits, `._+-`).
    pub plugin_name: Option<String>,
    /// The plugin's index, two digits (default 50): plugins run in index order.
    pub plugin_index: Option<String>,
    /// The longest a runtime event may take in qoslet before it answers "no
    /// change" (default 1s; the runtime disconnects a plugin after its own
    /// request timeout, 2s by default, and qoslet stays under half of it).
    pub hook_timeout: Option<Dur>,
}

/// `qosEngine:` — the 1 s loop that keeps BE pods from hurting LS pods.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineConfig {
    /// Run the engine (default true; it needs metrics).
    pub enable: Option<bool>,
    /// Tick interval, 1s to 600s (default 1s).
    pub interval: Option<Interval>,
    /// Plan and show, never write (default false).
    pub dry_run: Option<bool>,
    /// The besteffort parent cgroup (default: `kubepods/besteffort`, or the
    /// systemd driver's `kubepods.slice/kubepods-besteffort.slice`, whichever exists).
    pub be_parent: Option<String>,
    /// CPU kubelet reserves for the system and kube daemons, in cores (default 0).
    pub reserved_cpus: Option<f64>,
    /// How often each file qoslet owns is re-read for drift (default 10s).
    pub drift_check_interval: Option<Interval>,
    /// On SIGTERM, put every cgroup file the engine changed back to the
    /// runtime's value or the kernel's default (`qoslet restore`), so nothing
    /// qoslet did outlives it (default false: a restart keeps the isolation).
    pub restore_on_exit: Option<bool>,
    /// kubelet's CPU manager policy: `auto` (default: read `policyName` from
    /// kubelet's `/var/lib/kubelet/cpu_manager_state`), `none` or `static`. With
    /// `static` the BE cpuset is written on BE containers only.
    pub cpu_manager_policy: Option<String>,
    /// kubelet's root dir, for `cpu_manager_state` (default /var/lib/kubelet).
    pub kubelet_root_dir: Option<PathBuf>,
}

impl FileConfig {
    /// procfs, as configured (`/proc` by default): the one place it is defaulted.
    pub fn proc_root(&self) -> PathBuf {
        self.proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc"))
    }

    /// sysfs, as configured (`/sys` by default): the one place it is defaulted.
    pub fn sys_root(&self) -> PathBuf {
        self.sys_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/sys"))
    }
}

pub use qoslet_qos_engine::source::PolicyConfig;

/// Defaults for every hook (the hooks themselves come with later features).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HooksConfig {
    /// e.g. `2s`, `500ms`.
    pub timeout: Option<Dur>,
    pub failure_policy: Option<qoslet_proxy::FailurePolicy>,
}

/// `policy:` parsed (and validated) as any source's NodeSLO spec is, its
/// error prefixed with the key it is under. Koordinator's
/// `slo-controller-config` ConfigMap pasted whole is read as the cluster's
/// is ([`qoslet_colocation::slo`]): its policy keys merged as koord-manager
/// merges them, for a node without labels (a file knows none: entries
/// with an empty `nodeSelector` match, others do not); a bad key is an
/// error, as a bad file is.
fn policy_section<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<PolicyConfig>, D::Error> {
    let v: Option<serde_json::Value> = Option::deserialize(d)?;
    v.map(|v| {
        let v = match v.get("kind").and_then(serde_json::Value::as_str) {
            Some("ConfigMap") => {
                let data: std::collections::BTreeMap<String, String> =
                    serde_json::from_value(v.get("data").cloned().unwrap_or_default())
                        .map_err(|e| {
                            serde::de::Error::custom(format!(
                                "key policy.data (a ConfigMap's: each value a string): {e}"
                            ))
                        })?;
                if !qoslet_colocation::slo::has_policy_keys(&data) {
                    return Err(serde::de::Error::custom(
                        "key policy: a ConfigMap without any policy key (resource-threshold-config, resource-qos-config, cpu-burst-config, system-config, host-application-config)",
                    ));
                }
                qoslet_colocation::slo::spec_of_data(&data, &Default::default()).map_err(|e| {
                    serde::de::Error::custom(format!("key policy.data.{e}"))
                })?
            }
            _ => v,
        };
        PolicyConfig::try_from(v).map_err(|e| serde::de::Error::custom(format!("key policy.{e}")))
    })
    .transpose()
}

/// Loads the config file. `explicit` says whether the user named it.
pub fn load(path: &Path, explicit: bool) -> Result<FileConfig> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            return Ok(FileConfig::default())
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read config file {}", path.display()))
        }
    };
    parse(&text).with_context(|| format!("bad config file {}", path.display()))
}

pub fn parse(text: &str) -> Result<FileConfig> {
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    // a file that is only `~` or `null` is empty too
    let cfg: FileConfig = match serde_saphyr::from_str::<Option<FileConfig>>(text) {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            // name the key the value belongs to: the YAML parser's own errors
            // do not, for values refused by their type (a duration names the
            // value it refused, quoted): the key whose scalar is that value
            let first = e.to_string();
            // (a policy: error names its key already)
            if let Some(key) =
                key_of_refused(text, &first).filter(|_| !first.contains("key policy."))
            {
                bail!("key {key}: {first}");
            }
            bail!("{first}");
        }
    };
    // durations and intervals are typed (and checked) as the file is read;
    // the other values are checked now, so the error names the key
    if let Some(n) = cfg.metrics_max_series {
        if !(100..=10_000_000).contains(&n) {
            anyhow::bail!("key metricsMaxSeries: {n} is not 100 to 10000000");
        }
    }
    if let Some(v) = cfg.metrics_listen.as_deref().filter(|v| !v.is_empty()) {
        v.parse::<std::net::SocketAddr>()
            .map_err(|e| anyhow::anyhow!("key metricsListen: {v:?} is not host:port ({e})"))?;
    }
    if let Some(e) = &cfg.qos_engine {
        if let Some(v) = e.reserved_cpus {
            if !(0.0..=4096.0).contains(&v) {
                bail!("key qosEngine.reservedCpus: {v} is not 0-4096 cores");
            }
        }
        if let Some(v) = &e.be_parent {
            qoslet_cgroups::CgroupPath::parse(v)
                .map_err(|err| anyhow::anyhow!("key qosEngine.beParent: {err}"))?;
        }
    }
    if let Some(v) = &cfg.kubelet_cgroup_root {
        qoslet_cgroups::PodRoot::new(v)
            .map_err(|e| anyhow::anyhow!("key kubeletCgroupRoot: {e}"))?;
    }
    if let Some(v) = &cfg.reserved_cpuset {
        if qoslet_cgroups::cgroup::parse_cpu_list(v).is_none() {
            bail!("key reservedCpuset: {v:?} is not a CPU list (e.g. 0-1,4)");
        }
    }
    if let Some(n) = cfg.max_message_bytes {
        if !(1024..=(1 << 30)).contains(&n) {
            bail!("key maxMessageBytes: {n} is out of range (1024..=1073741824)");
        }
    }
    Ok(cfg)
}

/// The one key of the YAML `text` whose scalar value is the value quoted
/// first in `error` (how a refused duration names itself), as a dotted path.
fn key_of_refused(text: &str, error: &str) -> Option<String> {
    let start = error.find('"')?;
    let quoted = serde_json::Deserializer::from_str(&error[start..])
        .into_iter::<String>()
        .next()?
        .ok()?;
    let tree: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    fn walk(v: &serde_json::Value, path: &mut Vec<String>, want: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    path.push(k.clone());
                    walk(v, path, want, out);
                    path.pop();
                }
            }
            serde_json::Value::String(s) if s == want => out.push(path.join(".")),
            serde_json::Value::Number(n) if n.to_string() == want => out.push(path.join(".")),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&tree, &mut Vec::new(), &quoted, &mut found);
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None, // none, or the same value under several keys: not guessed
    }
}

/// The defaults of the timed settings, in one place.
pub mod defaults {
    use std::time::Duration;
    /// `metricsInterval`: one collection a second.
    pub const METRICS_INTERVAL: Duration = Duration::from_secs(1);
    /// `qosEngine.interval`: one tick a second.
    pub const ENGINE_INTERVAL: Duration = Duration::from_secs(1);
    /// `qosEngine.driftCheckInterval`.
    pub const DRIFT_CHECK_INTERVAL: Duration = Duration::from_secs(10);
}

/// A duration, typed as the file is read: `500ms`, `2s`, `1m`, `1h` (a bare
/// number is seconds), from 1 ms to 24 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

/// A loop interval (metrics, engine, drift checks): whole seconds from 1 s to 600 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval(pub Duration);

impl std::str::FromStr for Dur {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        parse_duration(s).map(Dur)
    }
}

impl std::str::FromStr for Interval {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        metrics_interval(s).map(Interval)
    }
}

/// A duration's YAML value as written (a plain scalar's own text: `30`, `2s`),
/// so only [`parse_duration`]'s forms are accepted, never YAML's other number
/// spellings (`0x1e`, `1_000`).
fn duration_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    String::deserialize(d)
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = duration_text(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = duration_text(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

/// A metrics interval: whole seconds from 1 to 600.
pub fn metrics_interval(s: &str) -> Result<Duration> {
    let d = parse_duration(s)?;
    if d.subsec_nanos() != 0 || !(1..=600).contains(&d.as_secs()) {
        bail!("{s:?} must be whole seconds from 1s to 600s");
    }
    Ok(d)
}

/// Parses `500ms`, `2s`, `1m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => bail!("{s:?} has an unknown unit {unit:?} (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 86400.0 {
        bail!("{s:?} must be between 1ms and 24h");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = parse(
            "listen: unix:///tmp/q.sock\nruntimeEndpoint: unix:///tmp/c.sock\nadminListen: unix:///tmp/a.sock\n\
             stateDir: /tmp/state\nlogLevel: debug\nmaxMessageBytes: 4194304\ndrainTimeout: 5s\nresyncInterval: 1m\n\
             hooks:\n  timeout: 500ms\n  failurePolicy: fail-closed\n",
        )
        .unwrap();
        assert_eq!(c.listen.as_deref(), Some("unix:///tmp/q.sock"));
        assert_eq!(c.state_dir, Some(PathBuf::from("/tmp/state")));
        assert_eq!(
            c.hooks.unwrap().failure_policy,
            Some(qoslet_proxy::FailurePolicy::FailClosed)
        );
        assert_eq!(parse("").unwrap(), FileConfig::default());
    }

    /// A key written with no value reads as empty (as serde-saphyr 0.0 read
    /// it; 2.x asks for a real list or map), and so does a file of one null.
    #[test]
    fn keys_without_a_value_are_empty() {
        for doc in ["~\n", "null\n", "# only a comment\n"] {
            assert_eq!(parse(doc).unwrap(), FileConfig::default(), "{doc:?}");
        }
        let c = parse("trust:\n  namespaces:\n  controlPlane: true\n").unwrap();
        let t = c.trust.unwrap();
        assert!(t.namespaces.is_empty() && t.control_plane);
        let c = parse(
            "eviction:\n  evictionHard:\n  evictionSoft: ~\n  evictionSoftGracePeriod: {}\n  evictionMinimumReclaim:\n",
        )
        .unwrap();
        let e = c.eviction.unwrap();
        assert!(e.eviction_hard.is_empty() && e.eviction_soft.is_empty());
        // a value of the wrong kind is still refused
        assert!(parse("trust:\n  namespaces: 3\n").is_err());
        assert!(parse("eviction:\n  evictionHard: [a]\n").is_err());
    }

    #[test]
    fn errors_name_the_key() {
        let e = format!("{:#}", parse("listn: x\n").unwrap_err());
        assert!(e.contains("listn"), "{e}");
        let e = format!("{:#}", parse("drainTimeout: forever\n").unwrap_err());
        assert!(e.contains("drainTimeout"), "{e}");
        let e = format!(
            "{:#}",
            parse("hooks:\n  failurePolicy: maybe\n").unwrap_err()
        );
        assert!(e.contains("maybe") || e.contains("failurePolicy"), "{e}");
        let e = format!("{:#}", parse("maxMessageBytes: 12\n").unwrap_err());
        assert!(e.contains("maxMessageBytes"), "{e}");
        let e = format!("{:#}", parse("maxMessageBytes: lots\n").unwrap_err());
        assert!(e.contains("maxMessageBytes") || e.contains("lots"), "{e}");
    }

    #[test]
    fn missing_default_file_is_defaults_but_missing_named_file_is_an_error() {
        let p = Path::new("/nonexistent/qoslet.yaml");
        assert_eq!(load(p, false).unwrap(), FileConfig::default());
        assert!(load(p, true).is_err());
    }

    /// The config files the Kubernetes install mounts parse, with the
    /// cluster side on.
    #[test]
    fn the_daemonset_configs_parse() {
        for text in [
            include_str!("../deploy/kubernetes/base/qoslet.yaml"),
            include_str!("../deploy/kubernetes/proxy/qoslet.yaml"),
        ] {
            // the proxy installer fills in the node's address
            let c = parse(&text.replace("${HOST_IP}", "10.0.0.11")).unwrap();
            let k = c.kubernetes.as_ref().unwrap();
            assert!(k.enable && k.eviction_api);
            c.eviction.as_ref().unwrap().validate().unwrap();
        }
    }

    #[test]
    fn the_shipped_example_parses() {
        let c = parse(include_str!("../deploy/qoslet.yaml")).unwrap();
        assert_eq!(c.listen.as_deref(), Some("unix:///run/qoslet/qoslet.sock"));
        let e = c.eviction.as_ref().unwrap().validate().unwrap();
        assert!(
            e.enabled && e.kubelet.thresholds.is_empty(),
            "no thresholds in the example"
        );
        assert_eq!(
            c.hooks.unwrap().failure_policy,
            Some(qoslet_proxy::FailurePolicy::FailOpen)
        );
    }

    /// Issue 14: Koordinator's own default NodeSLO (pkg/util/sloconfig
    /// `DefaultNodeSLOSpecConfig`, written out as it marshals) loads as qoslet's
    /// policy without error, its built-in defaults equal qoslet's, and what
    /// qoslet does not implement is listed, not refused.
    #[test]
    fn koordinators_default_node_slo_loads_as_it_is() {
        let fixture = include_str!("../hooks/tests/fixtures/koordinator-default-nodeslo.json");
        let c = parse(&format!("policy: {fixture}")).unwrap();
        let p = c.policy.unwrap();
        assert_eq!(p.resource_qos_strategy, Default::default());
        assert_eq!(p.resource_used_threshold_with_be, Default::default());
        assert_eq!(p.cpu_burst_strategy, Default::default());
        let listed = p.not_implemented.join("\n");
        for f in [
            "resourceQOSStrategy.policies.netQOSPolicy",
            "resourceQOSStrategy.lsrClass.cpuQOS.coreExpeller",
            "resourceQOSStrategy.beClass.networkQOS",
            "resourceQOSStrategy.cgroupRoot",
            "systemStrategy",
        ] {
            assert!(listed.contains(f), "{f} not listed:\n{listed}");
        }
        // implemented (BE CPU eviction): Koordinator's default is qoslet's
        assert!(!listed.contains("cpuEvictPolicy"), "{listed}");
        // its spec alone, in YAML, works the same
        let spec: serde_json::Value = serde_json::from_str(fixture).unwrap();
        let c2 = parse(&format!("policy: {}", spec["spec"])).unwrap();
        assert_eq!(
            c2.policy.unwrap().resource_qos_strategy,
            p.resource_qos_strategy
        );
        // a typo in a field qoslet implements is an error with its path
        let e = format!(
            "{:#}",
            parse("policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppresThresholdPercent: 40\n")
                .unwrap_err()
        );
        assert!(
            e.contains("resourceUsedThresholdWithBE.cpuSuppresThresholdPercent")
                && e.contains(
                    "did you mean resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"
                ),
            "{e}"
        );
    }

    /// Issue 46: Koordinator's `slo-controller-config` pasted under
    /// `policy:` is read as the cluster's ConfigMap is, not refused for its
    /// `apiVersion`; an entry with an empty selector matches (a file knows
    /// no labels), others do not; a bad key is an error naming it.
    #[test]
    fn a_configmap_as_the_policy() {
        let sample = include_str!("../colocation/tests/fixtures/slo-controller-config.yaml");
        let indented: String = sample
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("  {l}\n"))
            .collect();
        let c = parse(&format!("policy:\n{indented}")).unwrap();
        let p = c.policy.unwrap();
        assert!(!p.resource_used_threshold_with_be.enable);
        assert_eq!(
            p.resource_used_threshold_with_be
                .cpu_suppress_threshold_percent,
            65
        );
        let cm = |threshold: &str| {
            format!(
                "policy:\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: slo-controller-config}}\n  data:\n    resource-threshold-config: '{threshold}'\n"
            )
        };
        let c = parse(&cm(r#"{"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 45}, "nodeStrategies": [{"nodeSelector": {"matchLabels": {"pool": "batch"}}, "cpuSuppressThresholdPercent": 30}, {"nodeSelector": {}, "cpuSuppressThresholdPercent": 35}]}"#)).unwrap();
        let t = c.policy.unwrap().resource_used_threshold_with_be;
        assert!(t.enable);
        assert_eq!(
            t.cpu_suppress_threshold_percent, 35,
            "the empty selector's entry"
        );
        let e = format!("{:#}", parse(&cm(r#"{"clusterStrategy": "#)).unwrap_err());
        assert!(e.contains("policy.data.resource-threshold-config"), "{e}");
        let e = format!(
            "{:#}",
            parse("policy:\n  kind: ConfigMap\n  data:\n    colocation-config: '{}'\n")
                .unwrap_err()
        );
        assert!(e.contains("without any policy key"), "{e}");
    }

    #[test]
    fn policy_section_uses_node_slo_names() {
        let c = parse("policy:\n  resourceQOSStrategy:\n    beClass:\n      memoryQOS:\n        enable: true\n        lowLimitPercent: 50\n").unwrap();
        let p = c.policy.unwrap().resource_qos_strategy;
        assert!(p.be_class.memory_qos.enable);
        assert_eq!(p.be_class.cpu_qos.group_identity, -1, "defaults kept");
        let e = format!("{:#}", parse("policy:\n  resourceQOSStrategy:\n    lsClass:\n      memoryQOS:\n        minLimitPercent: 300\n").unwrap_err());
        assert!(
            e.contains("policy.resourceQOSStrategy.lsClass.memoryQOS.minLimitPercent"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            parse("policy:\n  resourceQOSStrategy:\n    lsClass:\n      memQOS: {}\n").unwrap_err()
        );
        assert!(e.contains("memQOS"), "{e}");
    }

    #[test]
    fn engine_policy_and_settings() {
        let c = parse(
            "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 40\n    cpuSuppressPolicy: cfsQuota\n  cpuBurstStrategy:\n    policy: auto\n\
             qosEngine:\n  interval: 2s\n  dryRun: true\n  beParent: /kubepods/besteffort\n  reservedCpus: 1.5\n",
        )
        .unwrap();
        let p = c.policy.unwrap().engine();
        assert_eq!(p.threshold.cpu_suppress_threshold_percent, 40);
        assert_eq!(
            p.threshold.memory_evict_threshold_percent, 70,
            "defaults kept"
        );
        assert_eq!(p.burst.policy, qoslet_qos_engine::burst::BurstPolicy::Auto);
        assert_eq!(c.qos_engine.unwrap().reserved_cpus, Some(1.5));
        for (bad, key) in [
            (
                "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 140\n",
                "cpuSuppressThresholdPercent",
            ),
            (
                "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressPolicy: fast\n",
                "fast",
            ),
            (
                "policy:\n  cpuBurstStrategy:\n    cfsQuotaBurstPercent: 50\n",
                "cfsQuotaBurstPercent",
            ),
            ("qosEngine:\n  interval: 0s\n", "qosEngine.interval"),
            ("qosEngine:\n  beParent: ../../etc\n", "qosEngine.beParent"),
            ("qosEngine:\n  reservedCpus: -1\n", "reservedCpus"),
            ("qosEngine:\n  dryrun: true\n", "dryrun"),
        ] {
            let e = format!("{:#}", parse(bad).unwrap_err());
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn metrics_keys() {
        let c = parse("metricsInterval: 5s\nmetricsListen: 0.0.0.0:9316\nmetricsSnapshot: false\n")
            .unwrap();
        assert_eq!(c.metrics_interval.unwrap().0, Duration::from_secs(5));
        for bad in [
            "metricsInterval: 0.5s\n",
            "metricsInterval: 11m\n",
            "metricsListen: nowhere\n",
            "metricsMaxSeries: 10\n",
            "metricsMaxSeries: -1\n",
        ] {
            let e = format!("{:#}", parse(bad).unwrap_err());
            assert!(e.contains(bad.split(':').next().unwrap()), "{e}");
        }
        assert!(
            parse("metricsListen: \"\"\n").is_ok(),
            "empty: no HTTP endpoint"
        );
        assert_eq!(
            parse("metricsMaxSeries: 20000\n")
                .unwrap()
                .metrics_max_series,
            Some(20_000)
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        for bad in ["", "x", "5d", "-1s", "0s", "1e9s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_are_typed_as_the_file_is_read() {
        let c = parse("drainTimeout: 5\nresyncInterval: 90s\nhooks:\n  timeout: 250ms\nqosEngine:\n  driftCheckInterval: 1m\n")
            .unwrap();
        assert_eq!(
            c.drain_timeout,
            Some(Dur(Duration::from_secs(5))),
            "a bare number is seconds"
        );
        assert_eq!(c.resync_interval, Some(Dur(Duration::from_secs(90))));
        assert_eq!(
            c.hooks.unwrap().timeout,
            Some(Dur(Duration::from_millis(250)))
        );
        assert_eq!(
            c.qos_engine.unwrap().drift_check_interval,
            Some(Interval(Duration::from_secs(60)))
        );
        let e = format!("{:#}", parse("hooks:\n  timeout: soon\n").unwrap_err());
        assert!(e.contains("key hooks.timeout") && e.contains("soon"), "{e}");
        let e = format!(
            "{:#}",
            parse("qosEngine:\n  driftCheckInterval: 1h\n").unwrap_err()
        );
        assert!(e.contains("key qosEngine.driftCheckInterval"), "{e}");
        assert!("1500ms".parse::<Interval>().is_err(), "whole seconds only");
        // only parse_duration's forms, as before the durations were typed
        for bad in ["0x1e", "1_000", "+30"] {
            assert!(parse(&format!("drainTimeout: {bad}\n")).is_err(), "{bad}");
        }
        // the refused value's own key, whatever other scalars the file holds
        let e = format!(
            "{:#}",
            parse("reservedCpuset: 0\ndrainTimeout: soon\n").unwrap_err()
        );
        assert!(e.contains("key drainTimeout") && e.contains("soon"), "{e}");
        let e = format!(
            "{:#}",
            parse("drainTimeout: 5\nhooks:\n  timeout: soon\n").unwrap_err()
        );
        assert!(e.contains("key hooks.timeout"), "{e}");
    }
}
