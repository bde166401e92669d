//! The agent's loops: metrics collection (with `/metrics`) and the QoS engine,
//! which plans from the metrics' ticks on a thread of its own. They run over
//! the agent's store and its one inventory, whatever front end feeds the store
//! (or none), and stop with the agent ([`crate::Agent::finish`]).

use std::sync::Arc;

use qoslet_cgroups::resctrl::Resctrl;
use qoslet_cgroups::{Cgroups, Host};
use qoslet_hooks::decide::NodeFacts;
use qoslet_metrics::service::{Metrics, Settings as MetricsSettings};
use qoslet_qos_engine::engine::Env;
use qoslet_qos_engine::runner::{Settings as EngineSettings, Shared, Ticks};
use tokio::task::JoinHandle;
use tracing::warn;

/// What the agent's loops need (the binary fills it from the config file and
/// what the host offers).
pub struct Loops {
    /// `None`: metrics off (and with them the engine, which plans from their ticks).
    pub metrics: Option<MetricsSettings>,
    /// The cgroup tree as found (metrics read it; `None`: no cgroups here).
    pub tree: Option<Host>,
    /// `None`: the engine is off.
    pub engine: Option<EngineLoop>,
}

/// The QoS engine's part of [`Loops`].
pub struct EngineLoop {
    pub settings: EngineSettings,
    /// Where the engine may write (`None`: no writable cgroups, the engine stays off).
    pub cgroups: Option<Cgroups>,
    pub resctrl: Option<Resctrl>,
    /// Online and reserved CPUs, capacity.
    pub node: NodeFacts,
}

/// The loops as started: their tasks, and the engine to restore at exit.
#[derive(Default)]
pub(crate) struct Running {
    pub tasks: Vec<JoinHandle<()>>,
    pub engine: Option<Arc<Shared>>,
}

impl crate::Agent {
    /// Starts the loops over the agent's store (call it once the front end
    /// has rebuilt the store, so the engine's first plan sees the node as it
    /// is). Metrics that cannot start (their endpoint's address taken) are an
    /// error; a host without cgroups is logged and runs no loop.
    pub async fn start_loops(&self, l: Loops) -> Result<(), crate::AgentError> {
        let Some(settings) = l.metrics else {
            return Ok(());
        };
        let started = Metrics::start(
            settings,
            l.tree,
            self.store().clone(),
            self.inventory().clone(),
            self.shutdown_signal(),
        )
        .await?;
        let Some((m, tasks)) = started else {
            return Ok(());
        };
        self.views().set_metrics(m.clone());
        let mut running = Running {
            tasks,
            engine: None,
        };
        let front = self.front.clone();
        let hub = self.policy().clone();
        if let Some(e) = l.engine {
            match e.cgroups {
                None => warn!("no writable cgroups (see above); QoS engine off"),
                Some(cg) => {
                    let env = Env {
                        features: cg.host().features.clone(),
                        v2: cg.host().is_v2(),
                        devices: hub.current().devices.clone(),
                        page_size: qoslet_cgroups::cgroup::page_size(),
                        node: e.node,
                    };
                    let shared = Shared::new(cg, e.settings.dry_run);
                    self.views().set_engine(shared.clone());
                    running.tasks.push(shared.start(
                        e.settings,
                        hub.subscribe(),
                        env,
                        e.resctrl,
                        m.clone() as Arc<dyn Ticks>,
                        self.inventory().clone(),
                        self.shutdown_signal(),
                    ));
                    running.engine = Some(shared);
                }
            }
        }
        // every scrape: the engine's lines, the policy's sources and the front end's counters
        let engine = running.engine.clone();
        let views = self.views().clone();
        m.set_extra(Arc::new(move |out: &mut String| {
            if let Some(e) = &engine {
                e.render(out);
            }
            if let Some(e) = views.eviction() {
                e.render(out);
            }
            if let Some(c) = views.cluster() {
                c.render(out);
            }
            hub.render(out);
            render_front(&front, out);
        }));
        // /readyz: the front end serves the runtime now (the NRI plugin registered)
        let attached = self.front.clone();
        m.set_ready(Arc::new(move || {
            attached.get().map_or(Ok(()), |f| f.ready())
        }));
        let mut slot = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        slot.tasks.append(&mut running.tasks);
        if running.engine.is_some() {
            slot.engine = running.engine;
        }
        Ok(())
    }
}

/// The front end's counters (`qoslet status` shows the same), as Prometheus
/// lines labelled with its mode; nothing with no front end attached.
fn render_front(front: &crate::front::FrontEnds, out: &mut String) {
    let Some(f) = front.get() else { return };
    let mut c = qoslet_proto::admin::Counters::default();
    f.counters(&mut c);
    let mode = [("mode", f.mode())];
    let mut o = qoslet_metrics::prom::Out::new(std::mem::take(out));
    let counters: [(&str, &str, u64); 9] = [
        ("qoslet_front_calls_total", "Runtime calls the front end served.", c.calls_total),
        ("qoslet_front_calls_intercepted_total", "Calls decoded and run through the hooks.", c.calls_intercepted),
        ("qoslet_front_calls_passthrough_total", "Calls forwarded as bytes, without decoding.", c.calls_passthrough),
        ("qoslet_front_backend_unavailable_total", "Calls that could not reach the runtime (answered UNAVAILABLE).", c.backend_unavailable),
        ("qoslet_front_backend_resets_total", "Calls whose stream the runtime reset (passed on as it came).", c.backend_resets),
        ("qoslet_front_calls_refused_total", "Calls refused by qoslet itself: a fail-closed hook failed, or the runtime could not survive the request.", c.calls_refused),
        ("qoslet_hook_refusals_total", "Calls a hook refused (admission): the hook's status reached the caller as given.", c.hook_refusals),
        ("qoslet_front_oversized_messages_total", "Messages refused for exceeding the size limit.", c.oversized_messages),
        ("qoslet_front_undecodable_messages_total", "Intercepted calls whose body could not be decoded (forwarded unchanged, hooks skipped).", c.undecodable_messages),
    ];
    for (name, help, v) in counters {
        o.family(name, "counter", help);
        o.sample(name, &mode, v as f64);
    }
    o.family(
        "qoslet_hook_failures_total",
        "counter",
        "Hook runs that failed, by kind (the failure policy decided what the call saw).",
    );
    for (kind, v) in [
        ("error", c.hook_errors),
        ("timeout", c.hook_timeouts),
        ("panic", c.hook_panics),
    ] {
        o.sample(
            "qoslet_hook_failures_total",
            &[("mode", f.mode()), ("kind", kind)],
            v as f64,
        );
    }
    o.family(
        "qoslet_front_calls_in_flight",
        "gauge",
        "Calls being served now.",
    );
    o.sample(
        "qoslet_front_calls_in_flight",
        &mode,
        c.calls_in_flight as f64,
    );
    if f.mode() == "nri" {
        let nri: [(&str, &str, u64); 6] = [
            ("qoslet_nri_registrations_total", "Successful registrations with the runtime.", c.nri_registrations),
            ("qoslet_nri_reconnects_total", "NRI sessions started after the first (runtime restarts, dropped connections).", c.nri_reconnects),
            ("qoslet_nri_adjustments_total", "CreateContainer answers that adjusted the container.", c.nri_adjustments),
            ("qoslet_nri_updates_total", "Container updates sent to the runtime.", c.nri_updates),
            ("qoslet_nri_timeouts_total", "Events answered with no change because qoslet overran its deadline.", c.nri_timeouts),
            ("qoslet_nri_errors_total", "Handler panics, undecodable or unknown requests, protocol errors, failed isolation events.", c.nri_errors),
        ];
        for (name, help, v) in nri {
            o.family(name, "counter", help);
            o.sample(name, &[], v as f64);
        }
        o.family(
            "qoslet_nri_events_total",
            "counter",
            "Requests from the runtime, by event.",
        );
        let mut events: Vec<_> = c.nri_events.iter().collect();
        events.sort();
        for (event, v) in events {
            o.sample(
                "qoslet_nri_events_total",
                &[("event", event.as_str())],
                *v as f64,
            );
        }
    }
    *out = o.into_text();
}
