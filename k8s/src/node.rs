//! This node's Node from the API server (`fieldSelector=metadata.name=<node>`):
//! kubelet's system and kube reserved CPU, read as capacity − allocatable,
//! is what the QoS engine keeps off BE pods when the config file sets no
//! `qosEngine.reservedCpus` (the file's value wins: an operator's override);
//! and the Node itself, published for the batch-resource advertiser.

use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_hooks::quantity::Quantity;
use qoslet_qos_engine::runner::Reserved;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::status::{ClusterStatus, WatchName};
use crate::view::{NodeView, ResourceList};

/// The CPU kubelet reserves on `n`, in cores (capacity − allocatable;
/// `None`: the Node does not say).
pub fn reserved_cores(n: &NodeView) -> Option<f64> {
    let st = n.status.as_ref()?;
    let milli =
        |l: Option<&ResourceList>| Quantity::parse(l?.get("cpu")?.trim()).ok()?.milli_value();
    let cap = milli(st.capacity.as_ref())?;
    let alloc = milli(st.allocatable.as_ref())?;
    (cap >= alloc && alloc >= 0).then(|| (cap - alloc) as f64 / 1000.0)
}

/// The latest Node as the watch has it (`None`: none yet, or deleted).
pub type NodeCache = watch::Sender<Option<Arc<NodeView>>>;

/// Follows this node's Node into `reserved` and `cache` until `shutdown`.
pub async fn follow(
    client: kube::Client,
    node: String,
    reserved: Reserved,
    cache: NodeCache,
    status: Arc<ClusterStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<NodeView> = Api::all(client);
    let fields = format!("metadata.name={node}");
    let stream =
        watcher::watcher(api.clone(), watcher::Config::default().fields(&fields)).default_backoff();
    futures_util::pin_mut!(stream);
    let mut last: Option<f64> = None;
    let mut probe = crate::probe_interval();
    let mut listed = false;
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.changed() => return,
            _ = probe.tick(), if status.state(WatchName::Node) == "stale" => {
                let lp = kube::api::ListParams::default().fields(&fields).limit(1);
                if crate::answers(api.list_metadata(&lp)).await {
                    status.ok(WatchName::Node, u64::from(last.is_some()));
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        match ev {
            Ok(Event::Init) => listed = false,
            Ok(Event::InitApply(n)) | Ok(Event::Apply(n)) => {
                listed = true;
                let r = reserved_cores(&n);
                if r != last {
                    info!(node = %node, reserved_cores = ?r, "kubelet's reserved CPU from the Node (capacity - allocatable)");
                    last = r;
                }
                reserved.set_cluster(r);
                cache.send_replace(Some(Arc::new(n)));
                status.ok(WatchName::Node, 1);
            }
            Ok(Event::InitDone) => {
                if !listed {
                    warn!(node = %node, "no Node of this name in the cluster (kubernetes.nodeName / NODE_NAME)");
                    reserved.set_cluster(None);
                    cache.send_replace(None);
                    last = None;
                }
                status.ok(WatchName::Node, u64::from(listed));
            }
            Ok(Event::Delete(_)) => {
                reserved.set_cluster(None);
                cache.send_replace(None);
                last = None;
                status.ok(WatchName::Node, 0);
            }
            Err(e) => {
                warn!(error = %e, "node watch failed (retried with backoff); the last reserved CPU stays");
                if status.state(WatchName::Node) != "stale" {
                    probe.reset();
                }
                status.stale(WatchName::Node);
            }
        }
    }
}
