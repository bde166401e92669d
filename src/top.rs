//! `qoslet top`: a live view of the node and its pods, like top(1), over the
//! admin socket: class, CPU and memory use against request and limit,
//! throttling, PSI, and how many settings qoslet applied.

use std::collections::HashMap;
use std::fmt::Write;

use anyhow::{Context, Result};
use qoslet_proto::admin::{ListPodsRequest, NodeSummaryRequest, NodeSummaryResponse, Pod, Usage};

#[derive(clap::Args)]
pub struct TopArgs {
    /// The admin socket of the running qoslet.
    #[arg(
        long,
        default_value = "unix:///run/qoslet/admin.sock",
        value_name = "ENDPOINT"
    )]
    pub admin: String,
    /// Print one frame and exit (no screen control).
    #[arg(long)]
    pub once: bool,
    /// Refresh period.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: String,
    /// Only this namespace.
    #[arg(long, short)]
    pub namespace: Option<String>,
}

pub async fn run(a: TopArgs) -> Result<()> {
    let every = crate::config::parse_duration(&a.interval).context("--interval")?;
    let mut client = crate::cli::connect(&a.admin).await?;
    loop {
        let sum = client
            .node_summary(NodeSummaryRequest {})
            .await
            .context("NodeSummary")?
            .into_inner();
        let pods = client
            .list_pods(ListPodsRequest {
                namespace: a.namespace.clone().unwrap_or_default(),
            })
            .await
            .context("ListPods")?
            .into_inner()
            .pods;
        let frame = render(&sum, &pods, a.namespace.as_deref());
        if a.once {
            out!("{frame}");
            return Ok(());
        }
        // home, clear, frame
        out!("\x1b[H\x1b[2J{frame}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1}Gi", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.0}Mi", b / (1024.0 * 1024.0))
    } else {
        format!("{:.0}Ki", b / 1024.0)
    }
}

fn cores(c: f64) -> String {
    if c < 0.0 {
        "-".into()
    } else {
        format!("{:.0}m", c * 1000.0)
    }
}

fn psi(v: f64) -> String {
    if v < 0.0 {
        "n/a".into()
    } else {
        format!("{:.1}%", v * 100.0)
    }
}

/// Request/limit of a container from what kubelet asked for: shares/1024 cores,
/// quota/period cores, memory limit.
fn asked(p: &Pod, container: &str) -> (String, String, String) {
    let Some(r) = p
        .containers
        .iter()
        .find(|c| c.id == container)
        .and_then(|c| c.requested.as_ref())
    else {
        return ("-".into(), "-".into(), "-".into());
    };
    let req = if r.cpu_shares > 2 {
        cores(r.cpu_shares as f64 / 1024.0)
    } else {
        "-".into()
    };
    let lim = if r.cpu_quota > 0 && r.cpu_period > 0 {
        cores(r.cpu_quota as f64 / r.cpu_period as f64)
    } else {
        "-".into()
    };
    let mem = if r.memory_limit_in_bytes > 0 {
        bytes(r.memory_limit_in_bytes as u64)
    } else {
        "-".into()
    };
    (req, lim, mem)
}

/// One frame.
pub fn render(s: &NodeSummaryResponse, pods: &[Pod], namespace: Option<&str>) -> String {
    let mut o = String::new();
    if s.timestamp == 0 {
        let _ = writeln!(o, "qoslet top: no metrics yet (first collection pending)");
        return o;
    }
    if !s.stale.is_empty() {
        let _ = writeln!(o, "qoslet top: metrics are stale ({})", s.stale);
        return o;
    }
    let _ = writeln!(
        o,
        "node  cpu {} / {:.0} cores ({:.0}%)   mem {} / {}   load {:.2} {:.2} {:.2}",
        cores(s.cpu_usage_cores),
        s.cpu_capacity_cores,
        if s.cpu_capacity_cores > 0.0 {
            s.cpu_usage_cores / s.cpu_capacity_cores * 100.0
        } else {
            0.0
        },
        bytes(s.memory_used_bytes),
        bytes(s.memory_total_bytes),
        s.load1,
        s.load5,
        s.load15
    );
    let _ = writeln!(
        o,
        "      system cpu {} mem {}   BE cpu {} mem {}   psi cpu {} mem {} io {}",
        cores(s.system_cpu_usage_cores),
        bytes(s.system_memory_bytes),
        cores(s.be_cpu_usage_cores),
        bytes(s.be_memory_working_set_bytes),
        psi(s.psi_cpu_some),
        psi(s.psi_memory_some),
        psi(s.psi_io_some)
    );
    let _ = writeln!(
        o,
        "      {} series, collected in {:.1} ms every {}s; CPI {}",
        s.series,
        s.collection_seconds * 1000.0,
        s.interval_seconds,
        s.cpi
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<44} {:<6} {:>7} {:>7} {:>7} {:>6} {:>8} {:>8} {:>7}",
        "NAMESPACE/POD  (container)",
        "CLASS",
        "CPU",
        "REQ",
        "LIMIT",
        "THROT",
        "MEM(WS)",
        "MEMLIM",
        "APPLIED"
    );
    let by_id: HashMap<String, &Pod> = pods.iter().map(|p| (format!("pod/{}", p.id), p)).collect();
    let mut rows: Vec<&Usage> = s
        .pods
        .iter()
        .filter(|u| namespace.is_none_or(|n| u.namespace == n))
        .collect();
    rows.sort_by(|a, b| b.cpu_usage_cores.total_cmp(&a.cpu_usage_cores));
    for u in rows {
        let p = by_id.get(&u.entity);
        let applied = p
            .map(|p| p.applied.keys().filter(|k| !k.starts_with("class")).count())
            .unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<44} {:<6} {:>7} {:>7} {:>7} {:>5.0}% {:>8} {:>8} {:>7}",
            trunc(&format!("{}/{}", u.namespace, u.pod), 44),
            if u.qos_class.is_empty() {
                "-"
            } else {
                &u.qos_class
            },
            cores(u.cpu_usage_cores),
            "",
            "",
            u.cpu_throttled_ratio * 100.0,
            bytes(u.memory_working_set_bytes),
            "",
            applied
        );
        for c in s.containers.iter().filter(|c| c.pod_entity == u.entity) {
            let cid = c.entity.trim_start_matches("container/");
            let (req, lim, mem) =
                p.map(|p| asked(p, cid))
                    .unwrap_or(("-".into(), "-".into(), "-".into()));
            let capplied = p
                .and_then(|p| p.containers.iter().find(|x| x.id == cid))
                .map(|x| x.applied.keys().filter(|k| !k.starts_with("class")).count())
                .unwrap_or(0);
            let _ = writeln!(
                o,
                "{:<44} {:<6} {:>7} {:>7} {:>7} {:>5.0}% {:>8} {:>8} {:>7}",
                trunc(&format!("  {}", c.container), 44),
                "",
                cores(c.cpu_usage_cores),
                req,
                lim,
                c.cpu_throttled_ratio * 100.0,
                bytes(c.memory_working_set_bytes),
                mem,
                capplied
            );
        }
    }
    o
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}~")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_proto::admin::{Container, Resources};

    /// A stopped collector's summary (the metrics service sends `stale`) is shown as such.
    #[test]
    fn a_stale_summary_says_so() {
        let s = NodeSummaryResponse {
            timestamp: 1_700_000_000,
            stale: "last collection 40 s ago".into(),
            ..Default::default()
        };
        assert!(render(&s, &[], None).contains("stale"));
    }

    #[test]
    fn a_frame_shows_node_pods_and_containers() {
        let s = NodeSummaryResponse {
            timestamp: 1,
            interval_seconds: 1,
            cpu_capacity_cores: 2.0,
            cpu_usage_cores: 1.0,
            memory_total_bytes: 8 << 30,
            memory_used_bytes: 2 << 30,
            psi_cpu_some: -1.0,
            pods: vec![Usage {
                entity: "pod/p1".into(),
                namespace: "ns".into(),
                pod: "web".into(),
                qos_class: "BE".into(),
                cpu_usage_cores: 0.5,
                memory_working_set_bytes: 64 << 20,
                ..Default::default()
            }],
            containers: vec![Usage {
                entity: "container/c1".into(),
                pod_entity: "pod/p1".into(),
                container: "app".into(),
                cpu_usage_cores: 0.5,
                cpu_throttled_ratio: 0.25,
                memory_working_set_bytes: 60 << 20,
                ..Default::default()
            }],
            ..Default::default()
        };
        let pods = vec![Pod {
            id: "p1".into(),
            applied: [
                ("class".to_string(), "BE".to_string()),
                ("cpu.idle".to_string(), "1".to_string()),
            ]
            .into(),
            containers: vec![Container {
                id: "c1".into(),
                requested: Some(Resources {
                    cpu_shares: 512,
                    cpu_quota: 100_000,
                    cpu_period: 100_000,
                    memory_limit_in_bytes: 128 << 20,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }];
        let f = render(&s, &pods, None);
        assert!(f.contains("cpu 1000m / 2 cores (50%)"), "{f}");
        assert!(f.contains("mem 2.0Gi / 8.0Gi"), "{f}");
        assert!(f.contains("psi cpu n/a"), "{f}");
        let pod_line = f.lines().find(|l| l.starts_with("ns/web")).unwrap();
        assert!(
            pod_line.contains("BE") && pod_line.contains("500m") && pod_line.contains("64Mi"),
            "{pod_line}"
        );
        let c = f.lines().find(|l| l.starts_with("  app")).unwrap();
        assert!(
            c.contains("500m") && c.contains("1000m") && c.contains("25%") && c.contains("128Mi"),
            "{c}"
        );
        assert!(render(&s, &pods, Some("other"))
            .lines()
            .all(|l| !l.starts_with("ns/web")));
        assert!(render(&NodeSummaryResponse::default(), &[], None).contains("no metrics yet"));
    }
}
