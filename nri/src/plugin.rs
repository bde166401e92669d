//! The plugin: sessions one after another, with backoff, over the NRI socket
//! (an external plugin) or once over the socket the runtime handed over (a
//! pre-installed plugin, fd 3).
//!
//! Owns reconnection and what outlives a session (counters, the runtime's
//! self-description, the live client). A session is over, its socket closed,
//! before the next connects: the runtime never sees two registrations.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::NriError;
use crate::handler::{Handler, RuntimeInfo};
use crate::session::{self, Counters, Ended, Options, RuntimeClient};

/// Delays between sessions: doubling from `initial` to `max`, back to
/// `initial` after a session that lasted `reset_after`.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(10),
            reset_after: Duration::from_secs(30),
        }
    }
}

/// An NRI plugin around a handler.
pub struct Plugin<H> {
    opts: Arc<Options>,
    handler: Arc<H>,
    counters: Arc<Counters>,
    info: Arc<Mutex<Option<RuntimeInfo>>>,
    client: watch::Sender<Option<RuntimeClient>>,
    last_error: Mutex<Option<String>>,
}

impl<H: Handler> Plugin<H> {
    pub fn new(opts: Options, handler: Arc<H>) -> Plugin<H> {
        Plugin {
            opts: Arc::new(opts),
            handler,
            counters: Arc::default(),
            info: Arc::default(),
            client: watch::channel(None).0,
            last_error: Mutex::new(None),
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The runtime as it described itself in the last Configure.
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.info.lock().unwrap().clone()
    }

    /// Why the last session ended, if it failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap().clone()
    }

    /// The registered session's client (None between sessions).
    pub fn client(&self) -> watch::Receiver<Option<RuntimeClient>> {
        self.client.subscribe()
    }

    /// Lets go of the registered session's client, so a session whose task
    /// was aborted (shutdown) closes its socket at once: the runtime then
    /// drops the plugin instead of waiting out its request timeout on events
    /// nobody reads.
    pub fn close(&self) {
        self.client.send_replace(None);
    }

    /// Serves one session on `io`.
    pub async fn serve<S>(&self, io: S) -> Result<Ended, NriError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    {
        let r = session::serve(
            io,
            self.opts.clone(),
            self.handler.clone(),
            self.counters.clone(),
            self.info.clone(),
            &self.client,
        )
        .await;
        *self.last_error.lock().unwrap() = r.as_ref().err().map(|e| e.to_string());
        r
    }

    /// Connects to the runtime's NRI socket at `path` and serves sessions
    /// until the future is dropped.
    pub async fn run_socket(&self, path: &Path, backoff: Backoff) {
        let path = PathBuf::from(path);
        let mut delay = backoff.initial;
        let mut first = true;
        loop {
            if !first {
                self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            first = false;
            let started = Instant::now();
            match UnixStream::connect(&path).await {
                Ok(s) => match self.serve(s).await {
                    Ok(Ended::Closed) => {
                        info!(socket = %path.display(), "the runtime closed the NRI connection")
                    }
                    Ok(Ended::SyncFailed) => {
                        warn!(socket = %path.display(), "Synchronize failed: connecting again to synchronize anew")
                    }
                    Err(e) => warn!(socket = %path.display(), error = %e, "the NRI session failed"),
                },
                Err(e) => {
                    let e = NriError::Connect {
                        path: path.display().to_string(),
                        source: e,
                    };
                    warn!(error = %e, "NRI connect failed");
                    *self.last_error.lock().unwrap() = Some(e.to_string());
                }
            }
            if started.elapsed() >= backoff.reset_after {
                delay = backoff.initial;
            }
            info!(delay = ?delay, "reconnecting to the runtime");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(backoff.max);
        }
    }
}
