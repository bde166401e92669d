//! The cache's feed: list and watch of Nodes, NodeMetrics and assigned Pods
//! (kube's watcher: a 410 or a broken watch relists; the relist replaces
//! what the cache held of that kind). Each event becomes the cache's small
//! extract of the object, applied under the write lock in O(1) of the
//! cluster's size; the objects themselves are not kept.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use qoslet_kube_api::view::NodeMetricView;
use qoslet_kube_api::view::{NodeView, PodView};
use tokio::sync::watch as signal;
use tracing::{info, warn};

use crate::cache::Cache;
use crate::extender::Extender;
use crate::facts::{assigned, metric_facts, node_facts, pod_facts};
use crate::load::{Assigned, MetricFacts};
use crate::rank::NodeFacts;

/// The assigned pods kube-scheduler's own cache holds: bound, not finished.
pub const POD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// While a watch is stale, how often the API server is asked whether it is
/// back (a watch resumed says nothing until an object changes).
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The three watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nodes,
    NodeMetrics,
    Pods,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Nodes, Kind::NodeMetrics, Kind::Pods];
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::NodeMetrics => "nodemetrics",
            Kind::Pods => "pods",
        }
    }
}

// 0: starting (not listed yet)
const OK: u8 = 1;
const STALE: u8 = 2;

/// One watch's state and counts.
#[derive(Debug, Default)]
pub struct WatchStatus {
    state: AtomicU8,
    /// Events applied to the cache (a relist's objects included).
    pub events: AtomicU64,
    pub relists: AtomicU64,
    pub errors: AtomicU64,
}

impl WatchStatus {
    /// `starting` (not listed yet), `ok`, or `stale` (the API server cannot
    /// be reached: the cache keeps what it last knew).
    pub fn state(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            OK => "ok",
            STALE => "stale",
            _ => "starting",
        }
    }
}

/// The watches' states.
#[derive(Debug, Default)]
pub struct Status {
    pub watches: [WatchStatus; 3],
}

impl Status {
    pub fn of(&self, k: Kind) -> &WatchStatus {
        &self.watches[k as usize]
    }

    /// Every watch listed and none stale.
    pub fn ready(&self) -> bool {
        self.watches
            .iter()
            .all(|w| w.state.load(Ordering::Relaxed) == OK)
    }
}

/// How one kind's extract goes into the cache.
struct Feed<K, I> {
    kind: Kind,
    /// The cache's extract of an object (`None`: not one the cache can key).
    extract: fn(&Extender, &K, i64) -> Option<I>,
    apply: fn(&mut Cache, I),
    /// An object deleted, as its last state says.
    delete: fn(&mut Cache, &K),
    relist: fn(&mut Cache, Vec<I>),
}

fn name_of<K: kube::Resource>(o: &K) -> Option<String> {
    o.meta().name.clone().filter(|n| !n.is_empty())
}

fn uid_of<K: kube::Resource>(o: &K) -> Option<String> {
    o.meta().uid.clone().filter(|n| !n.is_empty())
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A pod's extract: its UID, its node, and its assignment unless it is
/// finished.
type PodItem = (String, Option<String>, Option<Assigned>);

fn node_of(p: &PodView) -> Option<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

fn pod_item(ext: &Extender, p: &PodView, now: i64) -> Option<PodItem> {
    let uid = uid_of(p)?;
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    let done = matches!(phase, Some("Succeeded" | "Failed"));
    let a = (!done).then(|| assigned(p, &pod_facts(p), &ext.args, now));
    Some((uid, node_of(p), a))
}

/// Follows the three kinds into `ext`'s cache until `shutdown`.
pub async fn follow_all(
    client: kube::Client,
    ext: Arc<Extender>,
    status: Arc<Status>,
    shutdown: signal::Receiver<bool>,
) {
    let nodes = Feed::<NodeView, (String, NodeFacts)> {
        kind: Kind::Nodes,
        extract: |_, n, _| Some((name_of(n)?, node_facts(n))),
        apply: |c, (n, f)| c.set_node(n, f),
        delete: |c, n| {
            if let Some(n) = name_of(n) {
                c.remove_node(&n)
            }
        },
        relist: |c, v| c.replace_nodes(v),
    };
    let metrics = Feed::<NodeMetricView, (String, MetricFacts)> {
        kind: Kind::NodeMetrics,
        extract: |_, m, _| Some((name_of(m)?, metric_facts(m))),
        apply: |c, (n, m)| c.set_metric(&n, m),
        delete: |c, m| {
            if let Some(n) = name_of(m) {
                c.remove_metric(&n)
            }
        },
        relist: |c, v| c.replace_metrics(v),
    };
    let pods = Feed::<PodView, PodItem> {
        kind: Kind::Pods,
        extract: pod_item,
        apply: |c, (uid, node, a)| match (node, a) {
            (Some(node), Some(a)) => c.set_pod(&uid, &node, a),
            (node, _) => c.remove_pod(&uid, node.as_deref()),
        },
        delete: |c, p| {
            if let Some(uid) = uid_of(p) {
                c.remove_pod(&uid, node_of(p).as_deref())
            }
        },
        relist: |c, v| {
            c.replace_pods(
                v.into_iter()
                    .filter_map(|(u, n, a)| Some((u, n?, a?)))
                    .collect(),
            )
        },
    };
    // (consistent lists, paged: kube sends no resourceVersion=0 with a page size)
    let pods_cfg = watcher::Config::default().fields(POD_SELECTOR);
    tokio::join!(
        follow(
            Api::all(client.clone()),
            watcher::Config::default(),
            nodes,
            ext.clone(),
            status.clone(),
            shutdown.clone(),
        ),
        follow(
            Api::all(client.clone()),
            watcher::Config::default(),
            metrics,
            ext.clone(),
            status.clone(),
            shutdown.clone(),
        ),
        follow(Api::all(client), pods_cfg, pods, ext, status, shutdown),
    );
}

async fn follow<K, I>(
    api: Api<K>,
    cfg: watcher::Config,
    feed: Feed<K, I>,
    ext: Arc<Extender>,
    status: Arc<Status>,
    mut shutdown: signal::Receiver<bool>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let kind = feed.kind.as_str();
    let st = status.of(feed.kind);
    let probe_params = ListParams {
        field_selector: cfg.field_selector.clone(),
        limit: Some(1),
        ..Default::default()
    };
    let stream = watcher::watcher(api.clone(), cfg).default_backoff();
    futures_util::pin_mut!(stream);
    let mut listing: Vec<I> = Vec::new();
    let mut probe = tokio::time::interval(PROBE_EVERY);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = shutdown.changed() => return,
            _ = probe.tick(), if st.state.load(Ordering::Relaxed) == STALE => {
                let answered = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    api.list_metadata(&probe_params),
                ).await;
                if matches!(answered, Ok(Ok(_))) {
                    info!(watch = kind, "the API server answers again: the watch resumes");
                    st.state.store(OK, Ordering::Relaxed);
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        let now = now_ms();
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(o)) => listing.extend((feed.extract)(&ext, &o, now)),
            Ok(Event::InitDone) => {
                let items = std::mem::take(&mut listing);
                let n = items.len() as u64;
                if let Ok(mut c) = ext.cache.write() {
                    (feed.relist)(&mut c, items);
                }
                st.events.fetch_add(n, Ordering::Relaxed);
                st.relists.fetch_add(1, Ordering::Relaxed);
                st.state.store(OK, Ordering::Relaxed);
                info!(watch = kind, objects = n, "listed");
            }
            Ok(Event::Apply(o)) => {
                if let Some(i) = (feed.extract)(&ext, &o, now) {
                    if let Ok(mut c) = ext.cache.write() {
                        (feed.apply)(&mut c, i);
                    }
                }
                st.events.fetch_add(1, Ordering::Relaxed);
                st.state.store(OK, Ordering::Relaxed);
            }
            Ok(Event::Delete(o)) => {
                if let Ok(mut c) = ext.cache.write() {
                    (feed.delete)(&mut c, &o);
                }
                st.events.fetch_add(1, Ordering::Relaxed);
                st.state.store(OK, Ordering::Relaxed);
            }
            Err(e) => {
                warn!(watch = kind, error = %e, "watch failed (retried with backoff); the cache keeps what it knew");
                st.errors.fetch_add(1, Ordering::Relaxed);
                if st.state.load(Ordering::Relaxed) != STALE {
                    probe.reset();
                }
                st.state.store(STALE, Ordering::Relaxed);
            }
        }
    }
}
