//! Front ends: what serves the runtime's calls (the CRI proxy now, the NRI
//! plugin next) as the agent's admin API sees it. A front end plugs into a
//! running agent ([`crate::Agent::attach`]); the agent runs without one
//! (admin API, metrics and engine over the checkpointed store).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use qoslet_proto::admin;

/// A boxed future (the trait stays object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A front end of the agent.
pub trait FrontEnd: Send + Sync + 'static {
    /// What `qoslet status` shows as the mode (`"proxy"`, `"nri"`).
    fn mode(&self) -> &'static str;
    /// Where it serves (the CRI socket, the NRI socket).
    fn listen(&self) -> String;
    /// Adds its counters (calls, hook failures, resets, ...) to the status.
    fn counters(&self, into: &mut admin::Counters);
    /// The runtime as this front end reaches it, probed now (bounded in time).
    fn runtime(&self) -> BoxFuture<'_, admin::Backend>;
    /// Whether it serves the runtime now, without waiting (`/readyz`): the
    /// NRI plugin is registered; a proxy serves once it listens.
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The front end attached to an agent, if any (one per agent: a second is refused).
#[derive(Clone, Default)]
pub struct FrontEnds(Arc<OnceLock<Arc<dyn FrontEnd>>>);

impl FrontEnds {
    /// Attaches `f`; false if one is attached already.
    #[must_use]
    pub fn attach(&self, f: Arc<dyn FrontEnd>) -> bool {
        self.0.set(f).is_ok()
    }

    pub fn get(&self) -> Option<Arc<dyn FrontEnd>> {
        self.0.get().cloned()
    }
}
