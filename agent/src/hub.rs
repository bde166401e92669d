//! The policy hub: every source of the node's policy (the config file's
//! `policy:` now, the cluster's NodeSLO next) offers its policy here, and the
//! hub publishes the one in force, whole, on the channel the runtime hooks
//! and the engine follow ([`PolicyRx`]).
//!
//! * **Validated inside parsing.** A source offers a [`PolicyConfig`] or the
//!   reason it has none: `PolicyConfig` cannot be built from a spec that fails
//!   validation (`TryFrom<serde_json::Value>`), whatever the source.
//! * **One precedence rule.** The policy in force is, whole, that of the
//!   highest-precedence source holding a good one: a valid cluster NodeSLO
//!   over Koordinator's `slo-controller-config` ConfigMap (what koord-manager
//!   would have made the NodeSLO from), that over the file's `policy:`, the
//!   file's over the built-in defaults. Only
//!   the policy is sourced: the file's local settings (sockets, intervals,
//!   the engine's and the hooks' settings) always stay as the file says.
//! * **Bad or stale keeps the last good.** A source whose new policy is
//!   invalid, or which cannot be reached, keeps its last good policy in force
//!   (and its precedence); its state says so (`qoslet plan`, `/metrics`). A
//!   source that has no policy any more (the NodeSLO deleted) is withdrawn:
//!   the next source's policy is in force.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use qoslet_qos_engine::source::{PolicyConfig, PolicyRx, Published, SourceStatus};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// A source of the policy, in precedence order (a later one wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The config file's `policy:` section.
    File,
    /// Koordinator's `slo-controller-config` ConfigMap, merged for this node
    /// as koord-manager would merge it into its NodeSLO.
    ConfigMap,
    /// This node's NodeSLO from the API server.
    Cluster,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::ConfigMap => "configmap",
            Source::Cluster => "cluster",
        }
    }
}

/// Where a source stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Its last offer was valid.
    Ok,
    /// Its last offer was refused (why): its last good policy stays.
    Invalid(String),
    /// It cannot be reached (why): its last good policy stays.
    Stale(String),
    /// It has no policy (never offered one, or withdrew it).
    Absent,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Invalid(_) => "invalid",
            State::Stale(_) => "stale",
            State::Absent => "absent",
        }
    }

    fn why(&self) -> &str {
        match self {
            State::Invalid(w) | State::Stale(w) => w,
            State::Ok | State::Absent => "",
        }
    }
}

/// What a source tells the hub. (Not boxed: one per change of a source.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Offer {
    /// A new policy (valid: [`PolicyConfig`] is validated while parsed).
    Policy(PolicyConfig),
    /// Its new policy is refused, and why: its last good one stays.
    Invalid(String),
    /// It cannot be read or reached, and why: its last good one stays.
    Stale(String),
    /// It has no policy now: the next source's is in force.
    Withdrawn,
}

struct Entry {
    good: Option<PolicyConfig>,
    state: State,
}

/// The hub (shared: every source and the agent hold it).
pub struct PolicyHub {
    tx: watch::Sender<Arc<Published>>,
    /// Held through an offer, its publish included, so offers publish in
    /// order. Only sources take it (subscribers read the channel): a publish
    /// that blocks resolving a device path holds up other offers, never a
    /// call from the runtime's caller.
    sources: Mutex<BTreeMap<Source, Entry>>,
}

impl PolicyHub {
    /// A hub whose file source holds `file` (the config file's policy as
    /// read at start, `None`: the file has no `policy:`).
    pub fn new(file: Option<PolicyConfig>) -> Arc<Self> {
        let mut sources = BTreeMap::new();
        for s in [Source::File, Source::ConfigMap, Source::Cluster] {
            sources.insert(
                s,
                Entry {
                    good: None,
                    state: State::Absent,
                },
            );
        }
        if let Some(p) = file {
            sources.insert(
                Source::File,
                Entry {
                    good: Some(p),
                    state: State::Ok,
                },
            );
        }
        let (policy, from) = in_force(&sources);
        let mut first = Published::new(policy);
        first.source = from;
        first.sources = statuses(&sources, from);
        let (tx, _) = watch::channel(Arc::new(first));
        Arc::new(Self {
            tx,
            sources: Mutex::new(sources),
        })
    }

    /// The channel of the policy in force.
    pub fn subscribe(&self) -> PolicyRx {
        self.tx.subscribe()
    }

    /// The policy in force now, as published.
    pub fn current(&self) -> Arc<Published> {
        self.tx.borrow().clone()
    }

    /// `source` offers a new policy, or says why its new one is refused
    /// (its last good one then stays in force). May block when the policy in
    /// force changes (its block devices are resolved): call it off the
    /// thread that serves the runtime (a source's own thread, or
    /// `spawn_blocking`).
    pub fn offer(&self, source: Source, offered: Result<PolicyConfig, String>) {
        self.apply(
            source,
            match offered {
                Ok(p) => Offer::Policy(p),
                Err(why) => Offer::Invalid(why),
            },
        );
    }

    /// `source` cannot be reached: its last good policy stays in force.
    pub fn stale(&self, source: Source, why: &str) {
        self.apply(source, Offer::Stale(why.to_string()));
    }

    /// `source` has no policy now: the next source's is in force.
    pub fn withdraw(&self, source: Source) {
        self.apply(source, Offer::Withdrawn);
    }

    /// What `source` says (see [`PolicyHub::offer`] on blocking).
    pub fn apply(&self, source: Source, offer: Offer) {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let (policy, from, statuses) = {
            let Some(e) = sources.get_mut(&source) else {
                return;
            };
            let was = e.state.name();
            let was_reason = match &e.state {
                State::Invalid(w) => Some(w.clone()),
                _ => None,
            };
            match offer {
                Offer::Policy(p) => {
                    e.good = Some(p);
                    e.state = State::Ok;
                }
                Offer::Invalid(why) => e.state = State::Invalid(why),
                // without a good policy there is nothing to keep; an invalid
                // source stays invalid (its reason is the one to fix), and a
                // stale one keeps its first reason (no churn while it retries)
                Offer::Stale(why) => {
                    if e.good.is_some() && matches!(e.state, State::Ok) {
                        e.state = State::Stale(why);
                    }
                }
                Offer::Withdrawn => {
                    e.good = None;
                    e.state = State::Absent;
                }
            }
            // logged once per change of state (or of why a source is invalid:
            // fixing one error and making another is news)
            let reason_changed =
                matches!(&e.state, State::Invalid(w) if Some(w) != was_reason.as_ref());
            if e.state.name() != was || reason_changed {
                match &e.state {
                    State::Invalid(why) => {
                        error!(source = source.as_str(), error = %why, "policy refused; the last good policy stays in force")
                    }
                    State::Stale(why) => {
                        warn!(source = source.as_str(), reason = %why, "policy source stale; its last good policy stays in force")
                    }
                    State::Ok | State::Absent => {
                        info!(
                            source = source.as_str(),
                            state = e.state.name(),
                            "policy source"
                        )
                    }
                }
            }
            let (policy, from) = in_force(&sources);
            (policy, from, statuses(&sources, from))
        };
        let before = self.tx.borrow().clone();
        if policy == before.policy && from == before.source && statuses == before.sources {
            return;
        }
        let mut next = if policy == before.policy {
            // the same policy (a status changed): its devices as resolved
            Published::clone(&before)
        } else {
            for w in policy.resource_qos_strategy.warnings() {
                warn!("{w}");
            }
            info!(source = from, "policy in force changed");
            // may block (stats the policy's device paths)
            Published::new(policy)
        };
        next.source = from;
        next.error = error_of(&statuses);
        next.sources = statuses;
        self.tx.send_replace(Arc::new(next));
        drop(sources);
    }

    /// Polls `poll` every `every` on a thread of its own (its file reads and
    /// parsing never run on the thread that serves the runtime) and applies
    /// what it returns for `source` (`None`: nothing changed). The thread
    /// ends with the hub.
    pub fn poll_source<F>(self: &Arc<Self>, source: Source, every: Duration, mut poll: F)
    where
        F: FnMut() -> Option<Offer> + Send + 'static,
    {
        let hub: Weak<Self> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(format!("qoslet-policy-{}", source.as_str()))
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(hub) = hub.upgrade() else { return };
                if let Some(offer) = poll() {
                    if matches!(offer, Offer::Policy(_)) {
                        info!(source = source.as_str(), "policy reloaded");
                    }
                    hub.apply(source, offer);
                }
            });
        if let Err(e) = spawned {
            error!(source = source.as_str(), error = %e, "policy watcher not started; policy changes need a restart");
        }
    }

    /// The sources as `/metrics` shows them: each one's state, the one in
    /// force, and whether any last change was refused.
    pub fn render(&self, out: &mut String) {
        let p = self.current();
        let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
        o.family(
            "qoslet_policy_source_state",
            "gauge",
            "1 for each policy source's state: ok, invalid (its last change refused), stale (unreachable), absent; a bad or stale source keeps its last good policy.",
        );
        for s in &p.sources {
            o.sample(
                "qoslet_policy_source_state",
                &[("source", &s.source), ("state", &s.state)],
                1.0,
            );
        }
        o.family(
            "qoslet_policy_in_force",
            "gauge",
            "1 for the source whose policy is in force (default: none has one).",
        );
        o.sample("qoslet_policy_in_force", &[("source", p.source)], 1.0);
        o.single(
            "qoslet_policy_reload_failed",
            "gauge",
            "1 when a policy source's last change was invalid (the last good policy is in force).",
            f64::from(u8::from(p.sources.iter().any(|s| s.state == "invalid"))),
        );
        *out = o.into_text();
    }
}

/// The policy in force and its source's name.
fn in_force(sources: &BTreeMap<Source, Entry>) -> (PolicyConfig, &'static str) {
    sources
        .iter()
        .rev()
        .find_map(|(s, e)| e.good.clone().map(|p| (p, s.as_str())))
        .unwrap_or_else(|| (PolicyConfig::default(), "default"))
}

fn statuses(sources: &BTreeMap<Source, Entry>, from: &str) -> Vec<SourceStatus> {
    sources
        .iter()
        .rev()
        .map(|(s, e)| SourceStatus {
            source: s.as_str().to_string(),
            state: e.state.name().to_string(),
            error: e.state.why().to_string(),
            in_force: s.as_str() == from,
        })
        .collect()
}

/// What `qoslet plan` shows as the policy error: each refused source's reason.
fn error_of(statuses: &[SourceStatus]) -> Option<String> {
    let refused: Vec<String> = statuses
        .iter()
        .filter(|s| s.state == "invalid")
        .map(|s| format!("{}: {}", s.source, s.error))
        .collect();
    (!refused.is_empty()).then(|| refused.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(suppress: i64) -> PolicyConfig {
        serde_json::from_value(serde_json::json!({
            "resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": suppress}
        }))
        .unwrap()
    }

    fn suppress(p: &Published) -> i64 {
        p.policy
            .resource_used_threshold_with_be
            .cpu_suppress_threshold_percent
    }

    fn state(p: &Published, source: &str) -> (String, bool) {
        let s = p.sources.iter().find(|s| s.source == source).unwrap();
        (s.state.clone(), s.in_force)
    }

    /// The precedence rule, and what a bad, stale or withdrawn source does.
    #[test]
    fn the_cluster_over_the_file_and_the_last_good_on_failure() {
        let hub = PolicyHub::new(Some(policy(40)));
        let rx = hub.subscribe();
        assert_eq!((suppress(&rx.borrow()), rx.borrow().source), (40, "file"));
        assert_eq!(state(&rx.borrow(), "cluster"), ("absent".into(), false));

        // a valid NodeSLO wins over the file
        hub.offer(Source::Cluster, Ok(policy(30)));
        assert_eq!(
            (suppress(&rx.borrow()), rx.borrow().source),
            (30, "cluster")
        );
        // the file changes underneath: recorded, not in force
        hub.offer(Source::File, Ok(policy(50)));
        assert_eq!(suppress(&rx.borrow()), 30);
        assert_eq!(state(&rx.borrow(), "file"), ("ok".into(), false));

        // an invalid NodeSLO: the cluster's last good stays, and says so
        hub.offer(
            Source::Cluster,
            Err("cpuSuppressThresholdPercent: 400 is not 0-100".into()),
        );
        let p = rx.borrow().clone();
        assert_eq!((suppress(&p), p.source), (30, "cluster"));
        assert_eq!(state(&p, "cluster"), ("invalid".into(), true));
        assert!(
            p.error
                .as_deref()
                .is_some_and(|e| e.starts_with("cluster: ")),
            "{:?}",
            p.error
        );

        // unreachable while invalid: still invalid (that reason is the one to fix)
        hub.stale(Source::Cluster, "connection refused");
        assert_eq!(state(&rx.borrow(), "cluster"), ("invalid".into(), true));
        // fixed, then the API server unreachable: still the last good, marked stale
        hub.offer(Source::Cluster, Ok(policy(30)));
        hub.stale(Source::Cluster, "connection refused");
        // retries with other errors change nothing (no republish)
        let mut sub = hub.subscribe();
        sub.borrow_and_update();
        hub.stale(Source::Cluster, "timed out");
        assert!(!sub.has_changed().unwrap());
        let p = rx.borrow().clone();
        assert!(p.sources[0].error.contains("refused"), "{:?}", p.sources);
        assert_eq!(
            (suppress(&p), state(&p, "cluster")),
            (30, ("stale".into(), true))
        );
        assert!(p.error.is_none(), "stale is not refused");

        // the NodeSLO deleted: the file's policy (its latest) is in force
        hub.withdraw(Source::Cluster);
        let p = rx.borrow().clone();
        assert_eq!((suppress(&p), p.source), (50, "file"));
        assert_eq!(state(&p, "cluster"), ("absent".into(), false));

        // no source has one: the defaults
        hub.withdraw(Source::File);
        let p = rx.borrow().clone();
        assert_eq!((suppress(&p), p.source), (65, "default"));
    }

    /// A status-only change publishes the same policy (devices as resolved);
    /// an offer that changes nothing wakes no subscriber.
    #[test]
    fn subscribers_wake_only_on_a_change() {
        let hub = PolicyHub::new(None);
        let mut rx = hub.subscribe();
        assert_eq!(rx.borrow_and_update().source, "default");
        hub.offer(Source::File, Ok(PolicyConfig::default()));
        assert!(rx.has_changed().unwrap(), "the file's state is ok now");
        rx.borrow_and_update();
        hub.offer(Source::File, Ok(PolicyConfig::default()));
        assert!(!rx.has_changed().unwrap(), "the same offer again");
        hub.stale(Source::Cluster, "never had one");
        assert!(
            !rx.has_changed().unwrap(),
            "a source without a policy is not stale"
        );
    }

    /// The sources on `/metrics`.
    #[test]
    fn the_sources_are_rendered() {
        let hub = PolicyHub::new(Some(policy(40)));
        hub.offer(Source::File, Err("bad".into()));
        let mut out = String::new();
        hub.render(&mut out);
        assert!(
            out.contains("qoslet_policy_source_state{source=\"file\",state=\"invalid\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("qoslet_policy_source_state{source=\"cluster\",state=\"absent\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("qoslet_policy_in_force{source=\"file\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("qoslet_policy_reload_failed 1\n"), "{out}");
    }
}
