//! The NRI plugin as the agent's front end: its mode, its counters and the
//! runtime as the plugin sees it, for the admin API's `GetStatus`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use qoslet_agent::{BoxFuture, FrontEnd};
use qoslet_nri::Plugin;
use qoslet_proto::admin;

use crate::handler::NriHandler;

/// What the NRI front end shows the admin API.
pub struct NriFront {
    pub plugin: Arc<Plugin<NriHandler>>,
    pub handler: Arc<NriHandler>,
    /// The NRI socket, or "fd 3" for a pre-installed plugin.
    pub socket: String,
}

impl FrontEnd for NriFront {
    fn mode(&self) -> &'static str {
        "nri"
    }

    fn listen(&self) -> String {
        self.socket.clone()
    }

    fn counters(&self, c: &mut admin::Counters) {
        let s = self.plugin.counters();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        c.nri_registrations = n(&s.registrations);
        c.nri_reconnects = n(&s.reconnects);
        c.nri_events = s
            .events()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        if n(&s.configures) > 0 {
            c.nri_events.insert("configure".into(), n(&s.configures));
        }
        if n(&s.sync_messages) > 0 {
            c.nri_events
                .insert("synchronize".into(), n(&s.sync_messages));
        }
        c.nri_adjustments = n(&s.adjustments);
        c.nri_updates = n(&s.updates);
        c.nri_timeouts = n(&s.timeouts);
        c.nri_errors = n(&s.errors) + n(&self.handler.errors);
        // the refusals a handler answered, as in proxy mode
        c.hook_refusals = n(&s.refusals);
        c.hook_timeouts = n(&s.timeouts);
    }

    fn ready(&self) -> Result<(), String> {
        if self.plugin.client().borrow().is_some() {
            return Ok(());
        }
        Err(self
            .plugin
            .last_error()
            .unwrap_or_else(|| "not registered with the runtime yet".into()))
    }

    fn runtime(&self) -> BoxFuture<'_, admin::Backend> {
        Box::pin(async move {
            let registered = self.plugin.client().borrow().is_some();
            let info = self.plugin.runtime_info();
            admin::Backend {
                endpoint: self.socket.clone(),
                reachable: registered,
                runtime_name: info.as_ref().map(|i| i.name.clone()).unwrap_or_default(),
                runtime_version: info.as_ref().map(|i| i.version.clone()).unwrap_or_default(),
                runtime_api_version: info
                    .as_ref()
                    .map(|i| {
                        if i.nri_version.is_empty() {
                            "NRI".to_string()
                        } else {
                            format!("NRI {}", i.nri_version)
                        }
                    })
                    .unwrap_or_default(),
                error: if registered {
                    String::new()
                } else {
                    self.plugin
                        .last_error()
                        .unwrap_or_else(|| "not registered with the runtime yet".into())
                },
            }
        })
    }
}
