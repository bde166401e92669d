//! Client commands that talk to a running qoslet over its admin socket.

use std::time::Duration;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest, ListPodsRequest};
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(clap::Args)]
pub struct AdminArgs {
    /// The admin socket of the running qoslet.
    #[arg(
        long,
        default_value = "unix:///run/qoslet/admin.sock",
        value_name = "ENDPOINT"
    )]
    pub admin: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PodsArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Only this namespace.
    #[arg(long, short)]
    pub namespace: Option<String>,
}

pub(crate) async fn connect(endpoint: &str) -> Result<AdminClient<Channel>> {
    let path = qoslet_wire::endpoint::parse_unix(endpoint)?;
    let ch = Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .with_context(|| format!("cannot reach qoslet at {endpoint}"))?;
    Ok(AdminClient::new(ch))
}

pub async fn status(a: AdminArgs) -> Result<()> {
    let s = connect(&a.admin)
        .await?
        .get_status(GetStatusRequest {})
        .await
        .context("GetStatus")?
        .into_inner();
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "version": s.version, "mode": s.mode, "policySource": s.policy_source,
                "cluster": s.cluster.iter().map(|w| serde_json::json!({"watch": w.watch, "state": w.state, "objects": w.objects})).collect::<Vec<_>>(),
                "batchResources": s.batch_resources,
                "policySources": s.policy_sources.iter().map(|p| serde_json::json!({"source": p.source, "state": p.state,
                    "error": p.error, "inForce": p.in_force})).collect::<Vec<_>>(), "uptimeSeconds": s.uptime_seconds, "listen": s.listen, "stateDir": s.state_dir,
                "backend": s.backend.as_ref().map(|b| serde_json::json!({"endpoint": b.endpoint, "reachable": b.reachable,
                    "runtimeName": b.runtime_name, "runtimeVersion": b.runtime_version, "error": b.error})),
                "counters": s.counters.as_ref().map(|c| serde_json::json!({"pods": c.pods, "containers": c.containers,
                    "callsTotal": c.calls_total, "callsPassthrough": c.calls_passthrough, "callsIntercepted": c.calls_intercepted,
                    "backendUnavailable": c.backend_unavailable, "backendResets": c.backend_resets, "hookErrors": c.hook_errors, "hookTimeouts": c.hook_timeouts,
                    "hookPanics": c.hook_panics, "hookRefusals": c.hook_refusals, "callsRefused": c.calls_refused, "oversizedMessages": c.oversized_messages,
                    "connections": c.connections_terminated})),
            }))?
        );
        return Ok(());
    }
    let b = s.backend.unwrap_or_default();
    let c = s.counters.unwrap_or_default();
    outln!(
        "qoslet {} ({}), up {}s, listening on {}",
        s.version,
        s.mode,
        s.uptime_seconds,
        s.listen
    );
    if b.reachable {
        outln!(
            "runtime: {} {} {} at {} (reachable)",
            b.runtime_name,
            b.runtime_version,
            b.runtime_api_version,
            b.endpoint
        );
    } else {
        outln!("runtime: {} UNREACHABLE: {}", b.endpoint, b.error);
    }
    outln!(
        "store: {} pods, {} containers (checkpoint in {})",
        c.pods,
        c.containers,
        s.state_dir
    );
    if s.mode == "nri" {
        let mut events: Vec<String> = c
            .nri_events
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        events.sort();
        outln!(
            "nri: {} registrations, {} reconnects, {} adjustments, {} updates, {} timeouts, {} errors, {} refused",
            c.nri_registrations, c.nri_reconnects, c.nri_adjustments, c.nri_updates, c.nri_timeouts, c.nri_errors, c.hook_refusals
        );
        outln!(
            "events: {}",
            if events.is_empty() {
                "none yet".to_string()
            } else {
                events.join(", ")
            }
        );
    } else {
        outln!(
            "calls: {} total, {} passed through, {} intercepted, {} in flight, {} backend unavailable, {} reset by the runtime, {} refused, {} oversized",
            c.calls_total, c.calls_passthrough, c.calls_intercepted, c.calls_in_flight, c.backend_unavailable, c.backend_resets, c.calls_refused, c.oversized_messages
        );
        outln!(
            "hooks: {} errors, {} timeouts, {} panics, {} calls refused by a hook (admission)",
            c.hook_errors,
            c.hook_timeouts,
            c.hook_panics,
            c.hook_refusals
        );
        outln!("connections: {}", c.connections_terminated);
    }
    outln!("{}", policy_line(&s.policy_source, &s.policy_sources));
    if !s.cluster.is_empty() {
        let w: Vec<String> = s
            .cluster
            .iter()
            .map(|w| format!("{} {} ({})", w.watch, w.state, w.objects))
            .collect();
        outln!("cluster: {}", w.join(", "));
    }
    if !s.batch_resources.is_empty() {
        outln!("batch resources: {}", s.batch_resources);
    }
    Ok(())
}

pub async fn pods(a: PodsArgs) -> Result<()> {
    let r = connect(&a.admin.admin)
        .await?
        .list_pods(ListPodsRequest {
            namespace: a.namespace.unwrap_or_default(),
        })
        .await
        .context("ListPods")?
        .into_inner();
    if a.admin.json {
        let v: Vec<_> = r.pods.iter().map(|p| serde_json::json!({
            "id": p.id, "name": p.name, "namespace": p.namespace, "state": p.state, "cgroupParent": p.cgroup_parent,
            "labels": p.labels, "applied": p.applied,
            "containers": p.containers.iter().map(|c| serde_json::json!({"id": c.id, "name": c.name, "state": c.state, "image": c.image,
                "requested": c.requested.as_ref().map(|r| serde_json::json!({"cpuShares": r.cpu_shares, "cpuQuota": r.cpu_quota,
                    "cpuPeriod": r.cpu_period, "memoryLimitInBytes": r.memory_limit_in_bytes, "cpusetCpus": r.cpuset_cpus})),
                "applied": c.applied})).collect::<Vec<_>>(),
        })).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!(
        "{:<14} {:<28} {:<9} {:<36}",
        "POD",
        "NAMESPACE/NAME",
        "STATE",
        "CGROUP PARENT"
    );
    for p in &r.pods {
        outln!(
            "{:<14} {:<28} {:<9} {:<36}",
            short(&p.id),
            format!("{}/{}", p.namespace, p.name),
            p.state,
            p.cgroup_parent
        );
        for (k, v) in &p.applied {
            outln!("    applied {k} = {v}");
        }
        for c in &p.containers {
            let req = c.requested.clone().unwrap_or_default();
            outln!(
                "  └ {:<12} {:<16} {:<8} shares={} quota={}/{} mem={} cpus={:?}",
                short(&c.id),
                c.name,
                c.state,
                req.cpu_shares,
                req.cpu_quota,
                req.cpu_period,
                req.memory_limit_in_bytes,
                req.cpuset_cpus
            );
            for (k, v) in &c.applied {
                outln!("      applied {k} = {v}");
            }
        }
    }
    Ok(())
}

fn short(id: &str) -> &str {
    &id[..id.len().min(13)]
}

#[derive(clap::Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// The pod: `namespace/name`, `name`, or a pod sandbox id (prefix).
    pub pod: String,
}

/// Splits a stored "value (rule)" into its parts.
fn value_and_rule(v: &str) -> (&str, &str) {
    match v.split_once(" (") {
        Some((val, rule)) => (val, rule.strip_suffix(')').unwrap_or(rule)),
        None => (v, ""),
    }
}

pub async fn explain(a: ExplainArgs) -> Result<()> {
    let pods = connect(&a.admin.admin)
        .await?
        .list_pods(ListPodsRequest::default())
        .await
        .context("ListPods")?
        .into_inner()
        .pods;
    let (ns, name) = a
        .pod
        .split_once('/')
        .map(|(n, p)| (Some(n), p))
        .unwrap_or((None, a.pod.as_str()));
    let matches: Vec<_> = pods
        .iter()
        .filter(|p| {
            (p.name == name && ns.is_none_or(|n| n == p.namespace))
                || (a.pod.len() >= 6 && p.id.starts_with(&a.pod))
        })
        .collect();
    let (ens, ename) = match matches.as_slice() {
        [p] => (p.namespace.clone(), p.name.clone()),
        _ => (ns.unwrap_or_default().to_string(), name.to_string()),
    };
    let evictions = connect(&a.admin.admin)
        .await?
        .list_evictions(qoslet_proto::admin::ListEvictionsRequest {
            namespace: ens,
            name: ename,
        })
        .await
        .map(|r| r.into_inner().records)
        .unwrap_or_default();
    let p = match matches.as_slice() {
        [p] => *p,
        [] if !evictions.is_empty() => {
            outln!(
                "pod {} is not in qoslet's store (not running here); what qoslet did to it:",
                a.pod
            );
            print_evictions(&evictions, "  ");
            return Ok(());
        }
        [] => anyhow::bail!("no pod {:?} in qoslet's store (see `qoslet pods`)", a.pod),
        _ => anyhow::bail!(
            "{:?} matches {} pods; use namespace/name or the sandbox id",
            a.pod,
            matches.len()
        ),
    };
    if a.admin.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "pod": format!("{}/{}", p.namespace, p.name), "id": p.id, "cgroupParent": p.cgroup_parent, "applied": p.applied,
                "containers": p.containers.iter().map(|c| serde_json::json!({"name": c.name, "id": c.id, "applied": c.applied})).collect::<Vec<_>>(),
            }))?
        );
        return Ok(());
    }
    outln!(
        "pod {}/{} ({}), cgroup parent {}",
        p.namespace,
        p.name,
        short(&p.id),
        p.cgroup_parent
    );
    match p.applied.get("class") {
        Some(class) => outln!("  class {class}, from {}", p.applied.get("class-source").map(String::as_str).unwrap_or("?")),
        None => outln!("  no class: qoslet leaves this pod as kubelet asked (no class label, not a kubepods cgroup, or labelled to be left alone)"),
    }
    let show = |applied: &std::collections::HashMap<String, String>, indent: &str| {
        let mut keys: Vec<_> = applied
            .keys()
            .filter(|k| *k != "class" && *k != "class-source")
            .collect();
        keys.sort();
        for k in keys {
            let (v, rule) = value_and_rule(&applied[k]);
            outln!("{indent}{k} = {v}    <- {rule}");
        }
    };
    show(&p.applied, "    pod cgroup: ");
    for c in &p.containers {
        outln!("  container {} ({}):", c.name, short(&c.id));
        if c.applied.len() <= 1 {
            outln!("    nothing changed: runs as kubelet asked");
        }
        show(&c.applied, "    ");
    }
    if !evictions.is_empty() {
        outln!("  eviction:");
        print_evictions(&evictions, "    ");
    }
    Ok(())
}

/// Eviction and admission records, one line each, with the signal and values.
fn print_evictions(records: &[qoslet_proto::admin::EvictionRecord], indent: &str) {
    for r in records {
        let what = if r.reason == "admission" {
            "refused admission".to_string()
        } else {
            format!("evicted ({}), grace {} s", r.reason, r.grace_seconds)
        };
        let figures = if r.signal.is_empty() {
            String::new()
        } else {
            format!(": {} {} < threshold {}", r.signal, r.observed, r.threshold)
        };
        outln!(
            "{indent}{} {what}{figures}{} -> {}\n{indent}  {}",
            r.timestamp,
            if r.dry_run { " [dry run]" } else { "" },
            r.outcome,
            r.message
        );
    }
}

#[derive(clap::Args)]
pub struct EvictionsArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Only this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// The eviction loop's view: node conditions, thresholds met, recent evictions and refusals.
pub async fn evictions(a: EvictionsArgs) -> Result<()> {
    let r = connect(&a.admin.admin)
        .await?
        .list_evictions(qoslet_proto::admin::ListEvictionsRequest {
            namespace: a.namespace.unwrap_or_default(),
            name: String::new(),
        })
        .await
        .context("ListEvictions")?
        .into_inner();
    if a.admin.json {
        let records: Vec<_> = r.records.iter().map(|e| serde_json::json!({
            "timestamp": e.timestamp, "pod": format!("{}/{}", e.namespace, e.name), "uid": e.uid,
            "reason": e.reason, "signal": e.signal, "observed": e.observed, "threshold": e.threshold,
            "graceSeconds": e.grace_seconds, "message": e.message, "dryRun": e.dry_run, "outcome": e.outcome,
        })).collect();
        let met: Vec<_> = r.met.iter().map(|m| serde_json::json!({
            "signal": m.signal, "observed": m.observed, "threshold": m.threshold, "hard": m.hard,
        })).collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "enabled": r.enabled, "dryRun": r.dry_run, "conditions": r.conditions, "met": met, "records": records,
            }))?
        );
        return Ok(());
    }
    if !r.enabled {
        outln!("eviction is off in this qoslet (no eviction: thresholds in its config)");
        return Ok(());
    }
    outln!(
        "conditions: {}{}",
        if r.conditions.is_empty() {
            "none".to_string()
        } else {
            r.conditions.join(", ")
        },
        if r.dry_run { " (dry run)" } else { "" }
    );
    for m in &r.met {
        outln!(
            "  {} {} < {} ({})",
            m.signal,
            m.observed,
            m.threshold,
            if m.hard { "hard" } else { "soft" }
        );
    }
    for e in &r.records {
        outln!("{}/{}:", e.namespace, e.name);
        print_evictions(std::slice::from_ref(e), "  ");
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Only this plugin's writes (cpu-suppress, cpu-burst, cpu-qos, memory-qos, batch-resources, cpuset, blkio).
    #[arg(long)]
    pub plugin: Option<String>,
    /// Only writes that changed (or, in dry run, would change) a file.
    #[arg(long)]
    pub changes: bool,
    /// Only cgroups whose path contains this text (a pod uid, `besteffort`).
    #[arg(long)]
    pub cgroup: Option<String>,
}

pub async fn plan(a: PlanArgs) -> Result<()> {
    let p = connect(&a.admin.admin)
        .await?
        .get_plan(qoslet_proto::admin::GetPlanRequest {
            plugin: a.plugin.unwrap_or_default(),
            changes_only: a.changes,
            cgroup: a.cgroup.unwrap_or_default(),
        })
        .await
        .context("GetPlan")?
        .into_inner();
    if a.admin.json {
        let writes: Vec<_> = p
            .writes
            .iter()
            .map(|w| {
                serde_json::json!({"cgroup": w.cgroup, "setting": w.setting, "plugin": w.plugin, "rule": w.rule, "state": w.state,
                "files": w.files.iter().map(|f| serde_json::json!({"path": f.path, "value": f.value})).collect::<Vec<_>>()})
            })
            .collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "tick": p.tick, "timestamp": p.timestamp, "dryRun": p.dry_run, "suppressPolicy": p.suppress_policy,
                "capacityCores": p.capacity_cores, "nonBeUsageCores": p.non_be_usage_cores, "beUsageCores": p.be_usage_cores,
                "systemUsageCores": p.system_usage_cores, "reservedCores": p.reserved_cores, "allowanceCores": p.allowance_cores,
                "level": p.level, "sharePool": p.share_pool, "beParent": p.be_parent, "beQuotaUs": p.be_quota_us,
                "written": p.written, "unchanged": p.unchanged, "skipped": p.skipped, "drift": p.drift, "errors": p.errors,
                "warnings": p.warnings, "tickSeconds": p.tick_seconds, "policyError": p.policy_error, "notImplemented": p.not_implemented,
                "resctrlMoved": p.resctrl_moved, "writes": writes, "policySource": p.policy_source,
                "policySources": p.policy_sources.iter().map(|s| serde_json::json!({"source": s.source, "state": s.state,
                    "error": s.error, "inForce": s.in_force})).collect::<Vec<_>>(),
            }))?
        );
        return Ok(());
    }
    if p.tick == 0 {
        outln!("the QoS engine has not ticked yet (it waits for the first metrics)");
    } else {
        outln!(
            "tick {} ({}), {:.2} ms{}",
            p.tick,
            p.timestamp,
            p.tick_seconds * 1e3,
            if p.dry_run {
                ", DRY RUN: nothing is written"
            } else {
                ""
            }
        );
        outln!(
            "CPU: {:.2} cores; LS and others use {:.2}, BE {:.2}, system {:.2} (reserved {:.2})",
            p.capacity_cores,
            p.non_be_usage_cores,
            p.be_usage_cores,
            p.system_usage_cores,
            p.reserved_cores
        );
        outln!(
            "BE suppress ({}): allowance {:.2} cores, level {}; {} quota {}{}",
            p.suppress_policy,
            p.allowance_cores,
            p.level,
            p.be_parent,
            if p.be_quota_us < 0 {
                "unlimited".to_string()
            } else {
                format!("{} us", p.be_quota_us)
            },
            if p.share_pool.is_empty() {
                String::new()
            } else {
                format!("; share pool {}", p.share_pool)
            }
        );
        outln!(
            "files: {} written, {} unchanged, {} not re-read (applied before)",
            p.written,
            p.unchanged,
            p.skipped
        );
    }
    outln!("{}", policy_line(&p.policy_source, &p.policy_sources));
    if !p.policy_error.is_empty() {
        outln!(
            "POLICY INVALID (the last good policy is in force): {}",
            p.policy_error
        );
    }
    if !p.not_implemented.is_empty() {
        outln!("NodeSLO fields not implemented by qoslet (kept aside, no effect):");
        for f in &p.not_implemented {
            outln!("  {f}");
        }
    }
    for d in &p.drift {
        outln!("drift put back: {d}");
    }
    for e in &p.errors {
        outln!("error: {e}");
    }
    for w in &p.warnings {
        outln!("warning: {w}");
    }
    for w in &p.writes {
        let files: Vec<String> = w
            .files
            .iter()
            .map(|f| format!("{} = {}", f.path, f.value))
            .collect();
        outln!("[{}] {} {}: {}", w.state, w.plugin, w.cgroup, w.setting);
        for f in files {
            outln!("    {f}");
        }
        outln!("    because: {}", w.rule);
    }
    Ok(())
}

/// `policy: in force from file; sources: cluster absent, file ok` (status and plan).
fn policy_line(in_force: &str, sources: &[qoslet_proto::admin::PolicySource]) -> String {
    let sources: Vec<String> = sources
        .iter()
        .map(|s| match s.error.as_str() {
            "" => format!("{} {}", s.source, s.state),
            why => format!("{} {} ({why})", s.source, s.state),
        })
        .collect();
    format!(
        "policy: in force from {in_force}; sources: {}",
        sources.join(", ")
    )
}
