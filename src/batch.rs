//! `qoslet batch-resources`: what this node can lend to batch pods and why,
//! from the running qoslet (the admin API's `GetBatchResources`) or offline
//! from files (a Node, its NodeMetric, its pods, the `colocation-config`),
//! through the cluster side's one explanation (`qoslet_kube::batch`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use qoslet_colocation::strategy::ColocationConfig;
use qoslet_kube::view::{NodeView, PodView};
use serde_json::Value;

#[derive(clap::Args)]
pub struct BatchArgs {
    /// Admin socket of the running qoslet, asked when no --node is given.
    #[arg(
        long,
        default_value = "unix:///run/qoslet/admin.sock",
        value_name = "ENDPOINT"
    )]
    admin: String,
    /// The Node (JSON or YAML, e.g. `kubectl get node N -o yaml`): explain
    /// offline from files (with --pods) instead of asking the running qoslet.
    #[arg(long, value_name = "FILE", requires = "pods")]
    node: Option<PathBuf>,
    /// Its NodeMetric (`kubectl get nodemetric N -o yaml`); without it the
    /// node advertises nothing (degraded).
    #[arg(long, value_name = "FILE")]
    node_metric: Option<PathBuf>,
    /// Its pods: a List or one Pod (`kubectl get pods -A
    /// --field-selector spec.nodeName=N -o yaml`).
    #[arg(long, value_name = "FILE", requires = "node")]
    pods: Option<PathBuf>,
    /// The colocation-config: its JSON value, or the whole
    /// slo-controller-config ConfigMap (default: Koordinator's defaults,
    /// co-location off).
    #[arg(long, value_name = "FILE")]
    colocation: Option<PathBuf>,
    /// Judge the NodeMetric's age at this time (RFC 3339, e.g. a saved
    /// snapshot's; default: now).
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// Output: text or json.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

/// At most 64 MiB a file: a cluster's pod list, never a device.
const MAX_FILE: u64 = 64 << 20;

fn read(path: &Path) -> Result<Value> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut text = String::new();
    f.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{}", path.display()))?;
    if text.len() as u64 > MAX_FILE {
        bail!("{}: larger than 64 MiB", path.display());
    }
    parse(&text).with_context(|| format!("{}", path.display()))
}

/// JSON, else YAML (one document).
fn parse(text: &str) -> Result<Value> {
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        Err(json) => serde_saphyr::from_str::<Value>(text)
            .map_err(|yaml| anyhow::anyhow!("neither JSON ({json}) nor YAML ({yaml})")),
    }
}

/// The objects of a file: a list's items, or the one object.
fn objects(v: Value) -> Vec<Value> {
    match v {
        Value::Object(mut o) if o.get("items").is_some_and(Value::is_array) => {
            match o.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            }
        }
        Value::Array(a) => a,
        other => vec![other],
    }
}

fn one<T: serde::de::DeserializeOwned>(v: Value, kind: &str, path: &Path) -> Result<T> {
    if let Some(k) = v.get("kind").and_then(Value::as_str) {
        if k != kind {
            bail!("{}: a {k}, not a {kind}", path.display());
        }
    }
    serde_json::from_value(v).with_context(|| format!("{}: not a {kind}", path.display()))
}

/// The colocation-config of a file: a ConfigMap's `colocation-config` key,
/// or the value itself.
fn colocation(path: &Path) -> Result<ColocationConfig> {
    let v = read(path)?;
    let text = if v.get("kind").and_then(Value::as_str) == Some("ConfigMap") {
        match v["data"]["colocation-config"].as_str() {
            Some(s) => s.to_string(),
            None => String::new(),
        }
    } else {
        v.to_string()
    };
    ColocationConfig::parse(&text).with_context(|| format!("{}", path.display()))
}

/// The running qoslet's advertiser, over the admin API.
async fn online(a: &BatchArgs) -> Result<()> {
    let b = crate::cli::connect(&a.admin)
        .await?
        .get_batch_resources(qoslet_proto::admin::GetBatchResourcesRequest {})
        .await
        .context("GetBatchResources")?
        .into_inner();
    let e: Value = if b.explanation_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&b.explanation_json).context("GetBatchResources: its explanation")?
    };
    if a.output == "json" {
        let mut out = if e.is_object() {
            e
        } else {
            serde_json::json!({})
        };
        out["state"] = b.state.clone().into();
        if b.last_write_unix > 0 {
            out["lastWrite"] =
                serde_json::json!({"unix": b.last_write_unix, "why": b.last_write_reason});
        }
        outln!("{out:#}");
        return Ok(());
    }
    outln!("state: {}", b.state);
    if b.last_write_unix > 0 {
        outln!(
            "last write: {} (Unix), {}",
            b.last_write_unix,
            b.last_write_reason
        );
    } else {
        outln!("last write: none since qoslet started");
    }
    match qoslet_kube::batch::text_of_json(&e) {
        Some(t) => out!("{t}"),
        None => outln!("no explanation yet (no Node, figures or colocation-config read)"),
    }
    Ok(())
}

pub async fn run(a: BatchArgs) -> Result<()> {
    let (Some(node_path), Some(pods_path)) = (&a.node, &a.pods) else {
        return online(&a).await;
    };
    let node: NodeView = one(read(node_path)?, "Node", node_path)?;
    let pods = objects(read(pods_path)?)
        .into_iter()
        .map(|p| one::<PodView>(p, "Pod", pods_path).map(|p| qoslet_kube::batch::pod_input(&p)))
        .collect::<Result<Vec<_>>>()?;
    let metric = match &a.node_metric {
        Some(p) => {
            let v = read(p)?;
            if let Some(k) = v.get("kind").and_then(Value::as_str) {
                if k != "NodeMetric" {
                    bail!("{}: a {k}, not a NodeMetric", p.display());
                }
            }
            Some(v.get("status").cloned().unwrap_or(Value::Null))
        }
        None => None,
    };
    let cfg = match &a.colocation {
        Some(p) => colocation(p)?,
        None => ColocationConfig::default(),
    };
    let now = match &a.at {
        Some(t) => qoslet_kube::batch::unix_seconds(t)
            .with_context(|| format!("--at {t:?}: not an RFC 3339 time"))?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    };
    // offline nothing is known of the last write: the Node's values are
    // taken as just written, so "due" is about the values alone
    let e = qoslet_kube::batch::explain(&cfg, &node, &pods, metric.as_ref(), now, Some(0));
    if a.output == "json" {
        outln!("{:#}", e.json());
    } else {
        out!("{}", e.text());
    }
    Ok(())
}
