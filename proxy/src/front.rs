//! The CRI proxy as the agent's front end: its mode, its counters and the
//! runtime it forwards to, for the admin API's `GetStatus`.

use std::sync::Arc;
use std::time::Duration;

use qoslet_agent::admin::load;
use qoslet_agent::{BoxFuture, FrontEnd};
use qoslet_proto::{admin, cri};

use crate::backend::Backend;
use crate::forward::ProxyStats;
use crate::pipeline::Pipeline;

/// What the proxy shows the admin API.
pub struct CriFront {
    pub stats: Arc<ProxyStats>,
    pub pipeline: Pipeline,
    pub backend: Backend,
    pub listen: String,
}

impl FrontEnd for CriFront {
    fn mode(&self) -> &'static str {
        "proxy"
    }

    fn listen(&self) -> String {
        self.listen.clone()
    }

    fn counters(&self, c: &mut admin::Counters) {
        let s = &self.stats;
        let h = self.pipeline.counters();
        c.calls_total = load(&s.calls_total);
        c.calls_passthrough = load(&s.calls_passthrough);
        c.calls_intercepted = load(&s.calls_intercepted);
        c.backend_unavailable = load(&s.backend_unavailable);
        c.backend_resets = load(&s.backend_resets);
        c.calls_in_flight = load(&s.calls_in_flight);
        c.hook_errors = load(&h.errors);
        c.hook_timeouts = load(&h.timeouts);
        c.hook_panics = load(&h.panics);
        c.hook_refusals = load(&h.refusals);
        c.calls_refused = load(&s.calls_refused);
        c.oversized_messages = load(&s.oversized_messages);
        c.undecodable_messages = load(&s.undecodable_messages);
        c.connections_terminated = load(&s.connections_terminated);
    }

    fn runtime(&self) -> BoxFuture<'_, admin::Backend> {
        Box::pin(async move {
            let mut backend = admin::Backend {
                endpoint: self.backend.endpoint().to_string(),
                ..Default::default()
            };
            let mut client = self.backend.runtime();
            match tokio::time::timeout(
                Duration::from_secs(2),
                client.version(cri::VersionRequest {
                    version: String::new(),
                }),
            )
            .await
            {
                Ok(Ok(v)) => {
                    let v = v.into_inner();
                    backend.reachable = true;
                    backend.runtime_name = v.runtime_name;
                    backend.runtime_version = v.runtime_version;
                    backend.runtime_api_version = v.runtime_api_version;
                }
                Ok(Err(s)) => backend.error = format!("{}: {}", s.code(), s.message()),
                Err(_) => backend.error = "Version timed out after 2s".into(),
            }
            backend
        })
    }
}
