//! One session with the runtime over one socket: serve connection 1 (the
//! runtime's requests to the plugin) from the first byte, register on
//! connection 2, answer every request until the socket closes.
//!
//! Owns the session's I/O: one reader (this task), one writer task (whole
//! messages, so two messages of one connection never interleave), a task per
//! request that answers it within its deadline, one executor that runs the
//! handler calls off the async workers one at a time in the order the
//! requests came (the runtime sends its events in order; a late call never
//! overtakes a later event), and the calls this side makes (RegisterPlugin,
//! UpdateContainers). A call whose answer was already given as "no change"
//! is skipped if it has not started, unless it only records a state change. When the
//! session ends, both halves of the socket are closed before it returns, so a
//! new session never registers beside an old one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use qoslet_proto::nri as api;
use qoslet_proto::ttrpc as env;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::error::{CallError, NriError};
use crate::events::{self, Event, EventMask};
use crate::handler::{Handler, Refusal, RuntimeInfo, StateChange};
use crate::mux::{self, Conn, Demux};
use crate::ttrpc::{self, code, Deframer, Inbound, Status};

/// The service the plugin serves on connection 1.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The service the runtime serves on connection 2.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// How the plugin presents itself and how long it gives its handler.
#[derive(Clone, Debug)]
pub struct Options {
    pub name: String,
    pub index: String,
    pub events: EventMask,
    /// The longest a handler may take before the session answers "no change"
    /// for it (lowered to half the runtime's request timeout when it says).
    pub hook_timeout: Duration,
    /// How long to wait for RegisterPlugin's answer.
    pub register_timeout: Duration,
    /// The most pods + containers a split Synchronize may gather.
    pub max_sync_objects: usize,
    /// The most bytes of pods and containers a split Synchronize may gather.
    pub max_sync_bytes: usize,
}

/// Handler calls waiting for the executor, at most (the runtime sends one
/// request at a time; more means a runtime gone wrong).
const MAX_QUEUED_CALLS: usize = 256;

/// containerd's default request timeout is 2 s; a handler gets well under it.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_millis(1000);

impl Options {
    /// Options with checked name and index (as the runtime checks them).
    pub fn new(name: &str, index: &str, events: EventMask) -> Result<Options, NriError> {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
        if !name_ok {
            return Err(NriError::Name(name.into()));
        }
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NriError::Index(index.into()));
        }
        Ok(Options {
            name: name.into(),
            index: index.into(),
            events,
            hook_timeout: DEFAULT_HOOK_TIMEOUT,
            register_timeout: Duration::from_secs(5),
            max_sync_objects: 100_000,
            max_sync_bytes: 64 << 20,
        })
    }
}

/// What the sessions did, for `qoslet status` and `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Successful registrations.
    pub registrations: AtomicU64,
    /// Sessions started after the first (connection lost, runtime restarted).
    pub reconnects: AtomicU64,
    /// Requests by event number (0: Configure, Synchronize, Shutdown and
    /// methods without an event).
    events: [AtomicU64; 15],
    pub configures: AtomicU64,
    /// Synchronize messages, partial ones included.
    pub sync_messages: AtomicU64,
    /// CreateContainer answers that adjusted the container.
    pub adjustments: AtomicU64,
    /// Container updates sent (in answers and in UpdateContainers).
    pub updates: AtomicU64,
    /// Handler refusals returned to the runtime.
    pub refusals: AtomicU64,
    /// Handler calls answered with "no change" for lack of time.
    pub timeouts: AtomicU64,
    /// Handler panics, undecodable requests, unknown methods, protocol errors.
    pub errors: AtomicU64,
}

impl Counters {
    /// Requests counted for `e`.
    pub fn event(&self, e: Event) -> u64 {
        self.events[e as usize].load(Ordering::Relaxed)
    }

    fn count(&self, e: Event) {
        self.events[e as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Every event with a non-zero count, by name.
    pub fn events(&self) -> Vec<(&'static str, u64)> {
        (1..15)
            .filter_map(|i| {
                let e = Event::try_from(i).ok()?;
                let n = self.event(e);
                (n > 0).then(|| (events::name(e), n))
            })
            .collect()
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

type Pending = HashMap<u32, oneshot::Sender<Result<Bytes, Status>>>;

/// The sending side of a session, shared by its tasks and its runtime client.
struct Link {
    out: mpsc::Sender<Vec<u8>>,
    pending: Mutex<Pending>,
    next_stream: AtomicU32,
    /// Held from taking a stream id to queueing its request, so ids reach the
    /// runtime in increasing order (Go's ttrpc refuses a smaller one).
    ordered: tokio::sync::Mutex<()>,
    closed: AtomicBool,
}

impl Link {
    async fn send(&self, conn: Conn, stream: u32, kind: u8, body: &[u8]) -> Result<(), CallError> {
        let msg = ttrpc::encode(stream, kind, 0, body)?;
        let mut framed = Vec::new();
        mux::encode(conn, &msg, &mut framed);
        self.out.send(framed).await.map_err(|_| CallError::Closed)
    }

    fn complete(&self, stream: u32, result: Result<Bytes, Status>) {
        let waiter = self.pending.lock().unwrap().remove(&stream);
        match waiter {
            Some(w) => {
                let _ = w.send(result);
            }
            None => debug!(stream, "an answer for no pending call (given up on)"),
        }
    }

    fn close(&self) {
        let mut p = self.pending.lock().unwrap();
        self.closed.store(true, Ordering::SeqCst);
        p.clear();
    }
}

/// Calls to the runtime over the live session (connection 2).
#[derive(Clone)]
pub struct RuntimeClient {
    link: Arc<Link>,
}

impl std::fmt::Debug for RuntimeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeClient")
            .field("closed", &self.link.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl RuntimeClient {
    async fn call(
        &self,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let timeout_nano = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        let body = ttrpc::request(RUNTIME_SERVICE, method, payload, timeout_nano);
        let (tx, rx) = oneshot::channel();
        let stream = {
            let _order = self.link.ordered.lock().await;
            let stream = self.link.next_stream.fetch_add(2, Ordering::Relaxed);
            {
                let mut p = self.link.pending.lock().unwrap();
                if self.link.closed.load(Ordering::SeqCst) {
                    return Err(CallError::Closed);
                }
                p.insert(stream, tx);
            }
            if let Err(e) = self
                .link
                .send(Conn::Runtime, stream, ttrpc::REQUEST, &body)
                .await
            {
                self.link.pending.lock().unwrap().remove(&stream);
                return Err(e);
            }
            stream
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r.map_err(CallError::Status),
            Ok(Err(_)) => Err(CallError::Closed),
            Err(_) => {
                self.link.pending.lock().unwrap().remove(&stream);
                Err(CallError::Timeout(timeout))
            }
        }
    }

    async fn register(&self, opts: &Options) -> Result<(), CallError> {
        let req = api::RegisterPluginRequest {
            plugin_name: opts.name.clone(),
            plugin_idx: opts.index.clone(),
        };
        self.call("RegisterPlugin", req.encode_to_vec(), opts.register_timeout)
            .await
            .map(|_| ())
    }

    /// Asks the runtime to update (and evict) containers; returns the updates
    /// that failed.
    pub async fn update_containers(
        &self,
        req: api::UpdateContainersRequest,
        timeout: Duration,
    ) -> Result<api::UpdateContainersResponse, CallError> {
        let reply = self
            .call("UpdateContainers", req.encode_to_vec(), timeout)
            .await?;
        Ok(api::UpdateContainersResponse::decode(reply)?)
    }

    /// False once its session has ended.
    pub fn is_open(&self) -> bool {
        !self.link.closed.load(Ordering::SeqCst)
    }
}

/// How a session ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The runtime closed the socket.
    Closed,
    /// This side ended it: a Synchronize failed, after which a runtime
    /// (NRI v0.6) keeps the connection but sends no events; a new session
    /// synchronizes again.
    SyncFailed,
}

/// A handler call waiting for the executor.
type Job<H> = Box<dyn FnOnce(&H) + Send>;

/// What happens to a call whose answer was already given ("no change").
enum Late<H> {
    /// It runs anyway, in its turn (it records what happened: a state change,
    /// an update the runtime applied).
    Run,
    /// Skipped if it has not started; if it finished late, `undo` runs (its
    /// effects describe an answer the runtime never got).
    Undo(Box<dyn FnOnce(&H) + Send>),
}

/// The live state a session shares with its request tasks.
struct Session<H> {
    opts: Arc<Options>,
    counters: Arc<Counters>,
    info: Arc<Mutex<Option<RuntimeInfo>>>,
    link: Arc<Link>,
    /// A split Synchronize gathered so far.
    sync: Mutex<Option<(Vec<api::PodSandbox>, Vec<api::Container>)>>,
    /// Encoded bytes of what `sync` gathered.
    sync_bytes: std::sync::atomic::AtomicUsize,
    /// The handler's deadline in ms (the options', lowered by Configure).
    hook_ms: AtomicU64,
    /// The executor's queue: handler calls, run one at a time in order.
    jobs: mpsc::Sender<Job<H>>,
    /// Set when the session must end (a failed Synchronize, once answered).
    end: tokio::sync::Notify,
    sync_failed: AtomicBool,
}

/// Runs one session on `io` until the runtime closes it or breaks the
/// protocol. `registered` holds the session's client while it is registered.
pub async fn serve<S, H>(
    io: S,
    opts: Arc<Options>,
    handler: Arc<H>,
    counters: Arc<Counters>,
    info: Arc<Mutex<Option<RuntimeInfo>>>,
    registered: &watch::Sender<Option<RuntimeClient>>,
) -> Result<Ended, NriError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
    H: Handler,
{
    let (mut rd, wr) = tokio::io::split(io);
    let (tx, rx) = mpsc::channel(64);
    let mut writer = tokio::spawn(write_loop(wr, rx));
    let link = Arc::new(Link {
        out: tx,
        pending: Mutex::new(HashMap::new()),
        next_stream: AtomicU32::new(1),
        ordered: tokio::sync::Mutex::new(()),
        closed: AtomicBool::new(false),
    });
    let (jobs, mut queued) = mpsc::channel::<Job<H>>(MAX_QUEUED_CALLS);
    let executor = {
        let handler = handler.clone();
        tokio::spawn(async move {
            while let Some(job) = queued.recv().await {
                let h = handler.clone();
                // a panic ends only its own call (its answer: no change)
                let _ = tokio::task::spawn_blocking(move || job(&h)).await;
            }
        })
    };
    let session = Arc::new(Session {
        jobs,
        end: tokio::sync::Notify::new(),
        sync_failed: AtomicBool::new(false),
        hook_ms: AtomicU64::new(opts.hook_timeout.as_millis() as u64),
        opts: opts.clone(),
        counters: counters.clone(),
        info,
        link: link.clone(),
        sync: Mutex::new(None),
        sync_bytes: std::sync::atomic::AtomicUsize::new(0),
    });
    let client = RuntimeClient { link: link.clone() };
    let reg = {
        let client = client.clone();
        let opts = opts.clone();
        async move { client.register(&opts).await }
    };
    tokio::pin!(reg);
    let mut registering = true;
    let mut writer_done = false;
    let mut demux = Demux::new();
    let mut inbound = [Deframer::new(), Deframer::new()];
    let mut buf = vec![0u8; 16 * 1024];
    let result = loop {
        tokio::select! {
            r = &mut reg, if registering => {
                registering = false;
                match r {
                    Ok(()) => {
                        bump(&counters.registrations);
                        registered.send_replace(Some(client.clone()));
                        info!(plugin = %opts.name, index = %opts.index, "registered with the runtime");
                    }
                    Err(e) => break Err(NriError::Register(e)),
                }
            }
            w = &mut writer, if !writer_done => {
                writer_done = true;
                match w {
                    Ok(Err(e)) => break Err(NriError::Io(e)),
                    _ => break Ok(Ended::Closed),
                }
            }
            _ = session.end.notified() => break Ok(Ended::SyncFailed),
            n = rd.read(&mut buf) => {
                let n = match n {
                    Ok(0) => break Ok(Ended::Closed),
                    Ok(n) => n,
                    Err(e) => break Err(NriError::Io(e)),
                };
                demux.push(&buf[..n]);
                if let Err(e) = drain(&session, &mut demux, &mut inbound) {
                    break Err(e);
                }
            }
        }
    };
    registered.send_replace(None);
    link.close();
    executor.abort();
    if !writer_done && matches!(result, Ok(Ended::SyncFailed)) {
        // let the refusal reach the runtime: the writer ends once every
        // sender is gone (answers still due hold theirs up to their deadline)
        drop(session);
        drop(client);
        drop(link);
        if tokio::time::timeout(Duration::from_secs(1), &mut writer)
            .await
            .is_ok()
        {
            writer_done = true;
        }
    }
    if !writer_done {
        writer.abort();
        let _ = writer.await;
    }
    drop(rd);
    result
}

async fn write_loop<W: AsyncWrite>(w: W, mut rx: mpsc::Receiver<Vec<u8>>) -> std::io::Result<()> {
    tokio::pin!(w);
    while let Some(bytes) = rx.recv().await {
        w.write_all(&bytes).await?;
        w.flush().await?;
    }
    Ok(())
}

/// Hands every complete message read so far to its connection's side.
fn drain<H: Handler>(
    session: &Arc<Session<H>>,
    demux: &mut Demux,
    inbound: &mut [Deframer; 2],
) -> Result<(), NriError> {
    while let Some((conn, piece)) = demux.next_piece()? {
        let d = &mut inbound[(conn.id() - 1) as usize];
        d.push(&piece);
        while let Some(m) = d.next_message() {
            dispatch(session, conn, m)?;
        }
    }
    Ok(())
}

fn dispatch<H: Handler>(session: &Arc<Session<H>>, conn: Conn, m: Inbound) -> Result<(), NriError> {
    match (conn, m) {
        (Conn::Plugin, Inbound::Message(f)) if f.kind == ttrpc::REQUEST => {
            let s = session.clone();
            tokio::spawn(async move { s.answer(f.stream, f.payload).await });
            Ok(())
        }
        (Conn::Plugin, Inbound::TooLarge { stream, kind, len }) if kind == ttrpc::REQUEST => {
            bump(&session.counters.errors);
            warn!(stream, len, "a request over ttrpc's limit: refused");
            let s = session.clone();
            tokio::spawn(async move {
                let st = Status::new(
                    code::RESOURCE_EXHAUSTED,
                    format!("message of {len} bytes over the limit"),
                );
                let _ = s
                    .link
                    .send(
                        Conn::Plugin,
                        stream,
                        ttrpc::RESPONSE,
                        &ttrpc::response(Err(st)),
                    )
                    .await;
            });
            Ok(())
        }
        (Conn::Runtime, Inbound::Message(f)) if f.kind == ttrpc::RESPONSE => {
            session
                .link
                .complete(f.stream, ttrpc::read_response(&f.payload));
            Ok(())
        }
        (Conn::Runtime, Inbound::TooLarge { stream, kind, len }) if kind == ttrpc::RESPONSE => {
            let st = Status::new(
                code::RESOURCE_EXHAUSTED,
                format!("answer of {len} bytes over the limit"),
            );
            session.link.complete(stream, Err(st));
            Ok(())
        }
        (conn, m) => {
            bump(&session.counters.errors);
            let kind = match m {
                Inbound::Message(f) => f.kind,
                Inbound::TooLarge { kind, .. } => kind,
            };
            Err(NriError::Protocol(format!(
                "a message of type {kind} on connection {}",
                conn.id()
            )))
        }
    }
}

impl<H: Handler> Session<H> {
    fn deadline(&self, timeout_nano: i64) -> Duration {
        let cap = Duration::from_millis(self.hook_ms.load(Ordering::Relaxed));
        if timeout_nano > 0 {
            // leave the runtime a quarter of its own deadline for the answer
            cap.min(Duration::from_nanos(timeout_nano as u64 / 4 * 3))
        } else {
            cap
        }
    }

    async fn answer(self: Arc<Self>, stream: u32, payload: Bytes) {
        let result = match env::Request::decode(payload) {
            Ok(req) if req.service == PLUGIN_SERVICE => {
                let deadline = self.deadline(req.timeout_nano);
                self.call(&req.method, Bytes::from(req.payload), deadline)
                    .await
            }
            Ok(req) => {
                bump(&self.counters.errors);
                Err(Status::new(
                    code::UNIMPLEMENTED,
                    format!("service {} is not served here", req.service),
                ))
            }
            Err(e) => {
                bump(&self.counters.errors);
                Err(Status::new(
                    code::INVALID_ARGUMENT,
                    format!("malformed ttrpc request: {e}"),
                ))
            }
        };
        let body = ttrpc::response(result);
        let body = if body.len() > ttrpc::MAX_MESSAGE {
            bump(&self.counters.errors);
            ttrpc::response(Err(Status::new(
                code::RESOURCE_EXHAUSTED,
                "the answer is over ttrpc's limit",
            )))
        } else {
            body
        };
        if let Err(e) = self
            .link
            .send(Conn::Plugin, stream, ttrpc::RESPONSE, &body)
            .await
        {
            debug!(stream, error = %e, "answer not sent");
        }
        // the failed Synchronize's answer is queued: now the session may end
        if self.sync_failed.swap(false, Ordering::SeqCst) {
            self.end.notify_one();
        }
    }

    async fn call(
        &self,
        method: &str,
        payload: Bytes,
        deadline: Duration,
    ) -> Result<Vec<u8>, Status> {
        macro_rules! decode {
            ($t:ty) => {
                match <$t>::decode(payload) {
                    Ok(v) => v,
                    Err(e) => {
                        bump(&self.counters.errors);
                        return Err(Status::new(
                            code::INVALID_ARGUMENT,
                            format!("malformed {method} request: {e}"),
                        ));
                    }
                }
            };
        }
        match method {
            "Configure" => {
                let req = decode!(api::ConfigureRequest);
                bump(&self.counters.configures);
                let info = RuntimeInfo::from(&req);
                if let Some(ms) = info.request_timeout_ms {
                    let half = (ms as u64 / 2).max(1);
                    self.hook_ms.store(
                        half.min(self.opts.hook_timeout.as_millis() as u64),
                        Ordering::Relaxed,
                    );
                }
                info!(runtime = %info.name, version = %info.version, nri = %info.nri_version,
                    request_timeout_ms = ?info.request_timeout_ms,
                    registration_timeout_ms = ?info.registration_timeout_ms, "configured by the runtime");
                *self.info.lock().unwrap() = Some(info.clone());
                self.run(deadline, Late::Run, move |h| h.configure(&info))
                    .await?;
                Ok(api::ConfigureResponse {
                    events: self.opts.events.bits(),
                }
                .encode_to_vec())
            }
            "Synchronize" => {
                let req = decode!(api::SynchronizeRequest);
                bump(&self.counters.sync_messages);
                let (pods, containers) = {
                    let mut acc = self.sync.lock().unwrap();
                    let (pods, containers) = acc.get_or_insert_with(Default::default);
                    let bytes: usize = req.pods.iter().map(|p| p.encoded_len()).sum::<usize>()
                        + req
                            .containers
                            .iter()
                            .map(|c| c.encoded_len())
                            .sum::<usize>();
                    pods.extend(req.pods);
                    containers.extend(req.containers);
                    self.sync_bytes.fetch_add(bytes, Ordering::Relaxed);
                    let over = pods.len() + containers.len() > self.opts.max_sync_objects
                        || self.sync_bytes.load(Ordering::Relaxed) > self.opts.max_sync_bytes;
                    if over {
                        *acc = None;
                        self.sync_bytes.store(0, Ordering::Relaxed);
                        bump(&self.counters.errors);
                        // the runtime keeps a plugin whose sync failed but
                        // sends it nothing: end, and synchronize anew
                        self.sync_failed.store(true, Ordering::SeqCst);
                        return Err(Status::new(
                            code::RESOURCE_EXHAUSTED,
                            format!(
                                "more than {} pods and containers ({} bytes) to synchronize",
                                self.opts.max_sync_objects, self.opts.max_sync_bytes
                            ),
                        ));
                    }
                    if req.more {
                        // a part of a split sync: no updates until the last
                        return Ok(api::SynchronizeResponse {
                            update: vec![],
                            more: true,
                        }
                        .encode_to_vec());
                    }
                    self.sync_bytes.store(0, Ordering::Relaxed);
                    acc.take().unwrap_or_default()
                };
                debug!(
                    pods = pods.len(),
                    containers = containers.len(),
                    "synchronize"
                );
                let update = match self
                    .run(deadline, Late::Run, move |h| {
                        h.synchronize(pods, containers)
                    })
                    .await
                {
                    Ok(u) => u,
                    Err(st) => {
                        self.sync_failed.store(true, Ordering::SeqCst);
                        return Err(st);
                    }
                };
                self.counters
                    .updates
                    .fetch_add(update.len() as u64, Ordering::Relaxed);
                Ok(api::SynchronizeResponse {
                    update,
                    more: false,
                }
                .encode_to_vec())
            }
            "Shutdown" => {
                info!("the runtime shuts the plugin down");
                self.run(deadline, Late::Run, |h| {
                    h.shutdown();
                    Ok(())
                })
                .await?;
                Ok(api::Empty {}.encode_to_vec())
            }
            "CreateContainer" => {
                let req = decode!(api::CreateContainerRequest);
                self.counters.count(Event::CreateContainer);
                let id = req
                    .container
                    .as_ref()
                    .map(|c| c.id.clone())
                    .unwrap_or_default();
                let undo = Late::Undo(Box::new(move |h: &H| h.create_abandoned(&id)));
                let resp = self
                    .run(deadline, undo, move |h| h.create_container(req))
                    .await?;
                if resp
                    .adjust
                    .as_ref()
                    .is_some_and(|a| *a != api::ContainerAdjustment::default())
                {
                    bump(&self.counters.adjustments);
                }
                self.counters
                    .updates
                    .fetch_add(resp.update.len() as u64, Ordering::Relaxed);
                Ok(resp.encode_to_vec())
            }
            "UpdateContainer" => {
                let req = decode!(api::UpdateContainerRequest);
                self.counters.count(Event::UpdateContainer);
                let resp = self
                    .run(deadline, Late::Run, move |h| h.update_container(req))
                    .await?;
                self.counters
                    .updates
                    .fetch_add(resp.update.len() as u64, Ordering::Relaxed);
                Ok(resp.encode_to_vec())
            }
            "StopContainer" => {
                let req = decode!(api::StopContainerRequest);
                self.counters.count(Event::StopContainer);
                let resp = self
                    .run(deadline, Late::Run, move |h| h.stop_container(req))
                    .await?;
                self.counters
                    .updates
                    .fetch_add(resp.update.len() as u64, Ordering::Relaxed);
                Ok(resp.encode_to_vec())
            }
            "StateChange" => {
                let req = decode!(api::StateChangeEvent);
                let event = Event::try_from(req.event).ok();
                self.counters.count(event.unwrap_or(Event::Unknown));
                let change = StateChange {
                    event,
                    pod: req.pod,
                    container: req.container,
                };
                self.run(deadline, Late::Run, move |h| h.state_change(change))
                    .await?;
                Ok(api::Empty {}.encode_to_vec())
            }
            "ValidateContainerAdjustment" => {
                // never subscribed; accept if asked (an empty answer: no rejection)
                Ok(vec![])
            }
            m => match events::of_method(m) {
                Some(event) => {
                    let req = decode!(api::EventRequest);
                    self.counters.count(event);
                    let change = StateChange {
                        event: Some(event),
                        pod: req.pod,
                        container: req.container,
                    };
                    self.run(deadline, Late::Run, move |h| h.state_change(change))
                        .await?;
                    // every per-event answer is an empty message
                    Ok(vec![])
                }
                None => {
                    bump(&self.counters.errors);
                    Err(Status::new(
                        code::UNIMPLEMENTED,
                        format!("method {m} is not implemented"),
                    ))
                }
            },
        }
    }

    /// Queues `f` for the executor and answers within `deadline`: a refusal
    /// is the answer, an overrun, a panic or a full queue answers "no change".
    /// What a call answered for in time does late is `late`'s to say.
    async fn run<T, F>(&self, deadline: Duration, late: Late<H>, f: F) -> Result<T, Status>
    where
        T: Default + Send + 'static,
        F: FnOnce(&H) -> Result<T, Refusal> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let counters = self.counters.clone();
        let job: Job<H> = Box::new(move |h: &H| {
            if tx.is_closed() && !matches!(late, Late::Run) {
                // answered "no change" before it could start: not done late
                debug!("a handler call given up on before it started: skipped");
                return;
            }
            let r = f(h);
            if tx.send(r).is_err() {
                if let Late::Undo(undo) = late {
                    bump(&counters.errors);
                    undo(h);
                }
            }
        });
        if self.jobs.try_send(job).is_err() {
            bump(&self.counters.timeouts);
            warn!("the NRI handler's queue is full: answered with no change");
            return Ok(T::default());
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(refusal))) => {
                bump(&self.counters.refusals);
                info!(code = refusal.code, message = %refusal.message, "refused");
                Err(refusal.into())
            }
            Ok(Err(_)) => {
                bump(&self.counters.errors);
                warn!("the NRI handler failed (panicked): answered with no change");
                Ok(T::default())
            }
            Err(_) => {
                bump(&self.counters.timeouts);
                warn!(
                    ?deadline,
                    "the NRI handler overran its deadline: answered with no change"
                );
                Ok(T::default())
            }
        }
    }
}
