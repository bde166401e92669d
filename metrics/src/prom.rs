//! The Prometheus text exposition (format 0.0.4) of the latest tick.
//!
//! Names follow Prometheus conventions: the `qoslet_` namespace, base units
//! (seconds, bytes), `_total` for counters; pods and containers carry
//! `namespace`, `pod`, `container` (containers only) and `qos_class` labels.
//! Counters are the kernel's own (CPU seconds, throttled periods, I/O, PSI);
//! gauges are the collector's rates over the last interval.

use std::fmt::Write;

use crate::collect::{CgroupRaw, Kind, Reading, Tick};
use crate::metric::{sample as get, Metric};

/// Escapes a label value (backslash, double quote, newline).
fn esc(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A sample value as Prometheus writes floats.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// Prometheus text being written: a family's HELP and TYPE lines, then its
/// samples (label values escaped, numbers as the format spells them).
pub struct Out {
    text: String,
}

impl Out {
    /// Appends to `text`.
    pub fn new(text: String) -> Self {
        Self { text }
    }

    pub fn into_text(self) -> String {
        self.text
    }

    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", esc(val));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", num(v));
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, v: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }
}

type RawFn = fn(&CgroupRaw) -> Option<f64>;
type RateFn = fn(&Reading) -> Option<f64>;

/// A per-cgroup family: name suffix, type, help, value.
enum Val {
    Raw(RawFn),
    Rate(RateFn),
}

fn cgroup_families() -> Vec<(&'static str, &'static str, &'static str, Val)> {
    use Val::*;
    vec![
        (
            "cpu_usage_seconds_total",
            "counter",
            "CPU time consumed.",
            Raw(|r| Some(r.cpu_ns as f64 / 1e9)),
        ),
        (
            "cpu_usage_cores",
            "gauge",
            "CPU used over the last collection interval, in cores.",
            Rate(|r| get(&r.samples, Metric::CpuUsage)),
        ),
        (
            "cpu_cfs_periods_total",
            "counter",
            "CFS enforcement periods elapsed.",
            Raw(|r| Some(r.cpu.nr_periods as f64)),
        ),
        (
            "cpu_cfs_throttled_periods_total",
            "counter",
            "CFS periods in which the cgroup was throttled.",
            Raw(|r| Some(r.cpu.nr_throttled as f64)),
        ),
        (
            "cpu_cfs_throttled_seconds_total",
            "counter",
            "Time the cgroup was throttled.",
            Raw(|r| Some(r.cpu.throttled_ns as f64 / 1e9)),
        ),
        (
            "memory_usage_bytes",
            "gauge",
            "Memory charged to the cgroup, page cache included.",
            Raw(|r| r.memory.map(|m| m.usage as f64)),
        ),
        (
            "memory_working_set_bytes",
            "gauge",
            "Memory usage minus inactive file cache (what kubelet evicts on).",
            Raw(|r| r.memory.map(|m| m.working_set as f64)),
        ),
        (
            "memory_rss_bytes",
            "gauge",
            "Anonymous memory.",
            Raw(|r| r.memory.map(|m| m.rss as f64)),
        ),
        (
            "memory_cache_bytes",
            "gauge",
            "Page cache.",
            Raw(|r| r.memory.map(|m| m.cache as f64)),
        ),
        (
            "oom_kills_total",
            "counter",
            "Processes killed by the OOM killer in the cgroup.",
            Raw(|r| r.oom_kills.map(|v| v as f64)),
        ),
    ]
}

/// Renders the latest tick; `series` and `collect_seconds` describe the agent itself.
pub fn render(t: &Tick, series: usize, collect_seconds: f64, skipped_total: u64) -> String {
    let mut o = Out::new(String::with_capacity(256 + t.readings.len() * 2048));
    node(&mut o, t);
    for (kind, prefix, what) in [
        (Kind::Pod, "qoslet_pod_", "pod"),
        (Kind::Container, "qoslet_container_", "container"),
    ] {
        let rs: Vec<&Reading> = t
            .readings
            .iter()
            .filter(|r| r.target.kind == kind)
            .collect();
        let labels = |r: &Reading| -> Vec<(&'static str, String)> {
            let mut l = vec![
                ("namespace", r.target.namespace.clone()),
                ("pod", r.target.pod.clone()),
            ];
            if kind == Kind::Container {
                l.push(("container", r.target.container.clone()));
            }
            l.push(("qos_class", r.target.qos_class.clone()));
            l
        };
        for (suffix, ty, help, val) in cgroup_families() {
            let name = format!("{prefix}{suffix}");
            let vals: Vec<(&Reading, f64)> = rs
                .iter()
                .filter_map(|r| {
                    let v = match &val {
                        Val::Raw(f) => f(&r.raw),
                        Val::Rate(f) => f(r),
                    };
                    v.map(|v| (*r, v))
                })
                .collect();
            if vals.is_empty() {
                continue;
            }
            o.family(&name, ty, &format!("{help} Per {what}."));
            for (r, v) in vals {
                let l = labels(r);
                let refs: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
                o.sample(&name, &refs, v);
            }
        }
        // per device I/O counters
        for (suffix, help, f) in [
            (
                "io_read_bytes_total",
                "Bytes read",
                (|i: &crate::parse::Io| i.read_bytes) as fn(&crate::parse::Io) -> u64,
            ),
            ("io_written_bytes_total", "Bytes written", |i| i.write_bytes),
            ("io_reads_total", "Read operations", |i| i.read_ops),
            ("io_writes_total", "Write operations", |i| i.write_ops),
        ] {
            let name = format!("{prefix}{suffix}");
            if !rs.iter().any(|r| !r.raw.io.is_empty()) {
                continue;
            }
            o.family(
                &name,
                "counter",
                &format!("{help} per block device, per {what}."),
            );
            for r in &rs {
                for (dev, io) in r.raw.io.iter() {
                    let mut l = labels(r);
                    l.push(("device", dev.to_string()));
                    let refs: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    o.sample(&name, &refs, f(io) as f64);
                }
            }
        }
        let name = format!("{prefix}pressure_stalled_seconds_total");
        if rs.iter().any(|r| r.raw.psi.iter().any(Option::is_some)) {
            o.family(
                &name,
                "counter",
                &format!("Time some or all tasks stalled on a resource (PSI), per {what}."),
            );
            for r in &rs {
                psi_samples(&mut o, &name, &labels(r), &r.raw.psi);
            }
        }
    }
    o.family(
        "qoslet_metrics_series",
        "gauge",
        "Series held in qoslet's time-series cache.",
    );
    o.sample("qoslet_metrics_series", &[], series as f64);
    o.family(
        "qoslet_metrics_collection_seconds",
        "gauge",
        "Duration of the last collection tick.",
    );
    o.sample("qoslet_metrics_collection_seconds", &[], collect_seconds);
    o.family(
        "qoslet_metrics_skipped_total",
        "counter",
        "Samples skipped (cgroup vanished or unreadable).",
    );
    o.sample("qoslet_metrics_skipped_total", &[], skipped_total as f64);
    o.into_text()
}

fn psi_samples(
    o: &mut Out,
    name: &str,
    base: &[(&'static str, String)],
    psi: &[Option<crate::parse::Psi>; 3],
) {
    for (i, res) in ["cpu", "memory", "io"].iter().enumerate() {
        let Some(p) = psi[i] else { continue };
        let mut kinds = vec![("some", p.some_us)];
        if let Some(f) = p.full_us {
            kinds.push(("full", f));
        }
        for (kind, us) in kinds {
            let mut l: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
            l.push(("resource", res));
            l.push(("kind", kind));
            o.sample(name, &l, us as f64 / 1e6);
        }
    }
}

fn node(o: &mut Out, t: &Tick) {
    let gauges: [(&str, &str, Option<f64>); 9] = [
        (
            "qoslet_node_cpu_usage_cores",
            "CPU used by the node over the last interval, in cores.",
            get(&t.node, Metric::CpuUsage),
        ),
        (
            "qoslet_node_cpu_capacity_cores",
            "Online CPUs.",
            get(&t.node, Metric::CpuCapacity),
        ),
        (
            "qoslet_node_memory_total_bytes",
            "MemTotal.",
            get(&t.node, Metric::MemoryTotal),
        ),
        (
            "qoslet_node_memory_available_bytes",
            "MemAvailable.",
            get(&t.node, Metric::MemoryAvailable),
        ),
        (
            "qoslet_node_memory_used_bytes",
            "MemTotal minus MemAvailable.",
            get(&t.node, Metric::MemoryUsage),
        ),
        (
            "qoslet_system_cpu_usage_cores",
            "Node CPU not used by pods (system daemons, kernel), in cores.",
            get(&t.system, Metric::CpuUsage),
        ),
        (
            "qoslet_system_memory_used_bytes",
            "Node memory not used by pods' working sets.",
            get(&t.system, Metric::MemoryWorkingSet),
        ),
        (
            "qoslet_be_cpu_usage_cores",
            "CPU used by all BE pods, in cores.",
            get(&t.be, Metric::CpuUsage),
        ),
        (
            "qoslet_be_memory_working_set_bytes",
            "Working set of all BE pods.",
            get(&t.be, Metric::MemoryWorkingSet),
        ),
    ];
    for (name, help, v) in gauges {
        if let Some(v) = v {
            o.single(name, "gauge", help, v);
        }
    }
    if let Some(raw) = &t.node_raw {
        o.family("qoslet_node_load", "gauge", "Load average.");
        for (i, w) in ["1m", "5m", "15m"].iter().enumerate() {
            o.sample("qoslet_node_load", &[("window", w)], raw.load[i]);
        }
        if raw.psi.iter().any(Option::is_some) {
            let name = "qoslet_node_pressure_stalled_seconds_total";
            o.family(
                name,
                "counter",
                "Time some or all tasks stalled on a resource (PSI), node-wide.",
            );
            psi_samples(o, name, &[], &raw.psi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::{NodeRaw, Target};
    use crate::parse::{CpuStat, Io, Memory, Psi};

    pub(crate) fn sample_tick() -> Tick {
        let target = |kind, container: &str| Target {
            entity: format!("x/{container}"),
            kind,
            cgroup: qoslet_cgroups::CgroupPath::parse("/kubepods/p").unwrap(),
            namespace: "default".into(),
            pod: "web \"1\"".into(),
            container: container.into(),
            qos_class: "LS".into(),
            pod_entity: "pod/p".into(),
        };
        let raw = CgroupRaw {
            cpu_ns: 1_500_000_000,
            cpu: CpuStat {
                usage_ns: None,
                nr_periods: 10,
                nr_throttled: 2,
                throttled_ns: 30_000_000,
            },
            memory: Some(Memory {
                usage: 100,
                working_set: 80,
                rss: 50,
                cache: 50,
                dirty: 0,
                pgpgin: 0,
                pgmajfault: 0,
            }),
            oom_kills: Some(0),
            io: [(
                crate::parse::Dev {
                    major: 254,
                    minor: 0,
                },
                Io {
                    read_bytes: 4096,
                    write_bytes: 0,
                    read_ops: 1,
                    write_ops: 0,
                },
            )]
            .into_iter()
            .collect(),
            psi: [
                Some(Psi {
                    some_us: 2_000_000,
                    full_us: Some(0),
                }),
                None,
                None,
            ],
        };
        Tick {
            ts: 1,
            wall: 1,
            pods_root: Vec::new(),
            node: vec![(Metric::CpuUsage, 1.25), (Metric::CpuCapacity, 2.0)],
            node_raw: Some(NodeRaw {
                load: [0.5, 0.25, 0.125],
                psi: [
                    Some(Psi {
                        some_us: 1_000_000,
                        full_us: None,
                    }),
                    None,
                    None,
                ],
                ..Default::default()
            }),
            readings: vec![
                Reading {
                    target: std::sync::Arc::new(target(Kind::Pod, "")),
                    samples: vec![(Metric::CpuUsage, 0.5)],
                    raw: raw.clone(),
                },
                Reading {
                    target: std::sync::Arc::new(target(Kind::Container, "app\\x")),
                    samples: vec![],
                    raw,
                },
            ],
            system: vec![(Metric::CpuUsage, 0.75)],
            be: vec![],
            skipped: 0,
        }
    }

    #[test]
    fn renders_families_with_escaped_labels() {
        let text = render(&sample_tick(), 42, 0.003, 7);
        assert!(
            text.contains(
                "# TYPE qoslet_node_cpu_usage_cores gauge\nqoslet_node_cpu_usage_cores 1.25\n"
            ),
            "{text}"
        );
        assert!(text.contains(r#"qoslet_pod_cpu_usage_seconds_total{namespace="default",pod="web \"1\"",qos_class="LS"} 1.5"#), "{text}");
        assert!(text.contains(r#"qoslet_container_cpu_usage_seconds_total{namespace="default",pod="web \"1\"",container="app\\x",qos_class="LS"} 1.5"#), "{text}");
        assert!(text.contains(
            r#"qoslet_pod_cpu_usage_cores{namespace="default",pod="web \"1\"",qos_class="LS"} 0.5"#
        ));
        assert!(
            !text.contains("qoslet_container_cpu_usage_cores"),
            "no rate yet: no sample"
        );
        assert!(text.contains(r#"qoslet_pod_io_read_bytes_total{namespace="default",pod="web \"1\"",qos_class="LS",device="254:0"} 4096"#));
        assert!(text.contains(r#"qoslet_pod_pressure_stalled_seconds_total{namespace="default",pod="web \"1\"",qos_class="LS",resource="cpu",kind="some"} 2"#));
        assert!(text.contains(
            "qoslet_node_pressure_stalled_seconds_total{resource=\"cpu\",kind=\"some\"} 1\n"
        ));
        assert!(text.contains("qoslet_node_load{window=\"15m\"} 0.125\n"));
        assert!(text.contains("qoslet_metrics_skipped_total 7\n"));
        // each family declared once
        let mut seen = std::collections::HashSet::new();
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(seen.insert(l.to_string()), "duplicate {l}");
        }
    }

    /// promtool (from Debian's prometheus package) accepts the output.
    #[test]
    fn promtool_accepts_it() {
        let promtool = std::env::var("QOSLET_PROMTOOL")
            .ok()
            .filter(|p| std::path::Path::new(p).exists())
            .or_else(|| {
                ["/usr/bin/promtool", "/tmp/qoslet-testbed/bin/promtool"]
                    .into_iter()
                    .find(|p| std::path::Path::new(p).exists())
                    .map(String::from)
            });
        let Some(promtool) = promtool else {
            assert!(
                std::env::var("QOSLET_PROMTOOL").is_err(),
                "QOSLET_PROMTOOL is set but missing"
            );
            return qoslet_cgroups::skip_test(
                "prom::promtool_accepts_it",
                "promtool not installed (run integration/testbed/testbed.sh install)",
            );
        };
        let mut child = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(render(&sample_tick(), 1, 0.001, 0).as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
