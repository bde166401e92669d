//! The interception pipeline: hooks that run before and after the intercepted
//! CRI calls ([`HookPoint`]).
//!
//! A hook is async and may do I/O. Each registered hook has a timeout and a
//! failure policy. A hook that errors, times out or panics has *failed*:
//! fail-open logs it, counts it and lets the call go on unchanged; fail-closed
//! fails the call with a clear status. A panic never takes the proxy down.
//!
//! Every hook run is driven on the blocking pool, never on the thread that
//! serves kubelet: a hook that blocks (file I/O, a parse of hostile input, a
//! bug) delays neither the other calls nor its own timeout, which fires on
//! time; the overrunning hook finishes on its own thread and its result is
//! dropped.
//!
//! A "before" hook answers a [`Verdict`]: pass, patch, or *refuse*. A refusal
//! (admission: "not on this node now") is not a failure: it is the hook's
//! answer, so no failure policy turns it into a pass. The call is not
//! forwarded, the caller gets the hook's status code and message unchanged
//! (the message cut to [`MAX_REFUSAL_MESSAGE`] bytes), and it is counted
//! (`hook_refusals`) and logged with the call's subject. Only admission calls
//! may be refused (RunPodSandbox, CreateContainer, StartContainer,
//! UpdateContainerResources): kubelet reads a refused Stop or Remove as a
//! teardown that never ends (or, with NOT_FOUND, as done), so a refusal there,
//! or one with the OK code, is the hook's failure and its policy applies.
//!
//! A "before" hook may return a *patch*: a message of the request's type holding
//! only the fields it overrides. The patch is encoded and appended to the
//! original request bytes, so protobuf merge rules apply it (last scalar wins,
//! embedded messages merge, map entries replace by key) and fields qoslet's proto
//! does not know survive. Patches must not set repeated fields (they would be
//! appended) and cannot set a field to its zero value.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::Status;
use tracing::warn;

use crate::cri::{CriRequest, CriResponse, HookPoint};
use qoslet_state::store::Store;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
/// A hook's own error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Before or after the runtime handles the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Before,
    After,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Before => "before",
            Stage::After => "after",
        })
    }
}

/// What a failed hook does to the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Log and count the failure; the call goes on unchanged.
    #[default]
    FailOpen,
    /// Fail the call with the hook's failure as status.
    FailClosed,
}

/// A refusal's message is cut to this many bytes (on a character boundary):
/// it travels as the `grpc-message` header, percent-encoded (up to 3 bytes
/// per byte), and gRPC C-core clients refuse metadata past 8 KiB.
pub const MAX_REFUSAL_MESSAGE: usize = 1024;

/// A hook's "no": the gRPC status the caller gets, as given (its message cut
/// to [`MAX_REFUSAL_MESSAGE`]: built only through [`Refusal::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub(crate) code: tonic::Code,
    pub(crate) message: String,
}

impl Refusal {
    pub fn code(&self) -> tonic::Code {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_REFUSAL_MESSAGE {
            let mut end = MAX_REFUSAL_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        Self { code, message }
    }
}

/// The calls a hook may refuse: admission. (Teardown must always reach the runtime.)
pub fn refusable(point: HookPoint) -> bool {
    matches!(
        point,
        HookPoint::RunPodSandbox
            | HookPoint::CreateContainer
            | HookPoint::StartContainer
            | HookPoint::UpdateContainerResources
    )
}

/// What a "before" hook answers. (Not boxed: one per hook run, as [`CriRequest`].)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Verdict {
    /// Forward the request as it is (as far as this hook is concerned).
    Pass,
    /// Forward it with this patch (a message of the request's type) merged in.
    Patch(CriRequest),
    /// Do not forward it: answer the caller with this status.
    Refuse(Refusal),
}

impl From<Option<CriRequest>> for Verdict {
    fn from(p: Option<CriRequest>) -> Self {
        p.map_or(Verdict::Pass, Verdict::Patch)
    }
}

/// Why the "before" stage stopped a call.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    /// A fail-closed hook failed.
    #[error(transparent)]
    Failed(#[from] HookFailure),
    /// A hook refused the call.
    #[error("hook {hook} refused {point}: {}", refusal.message)]
    Refused {
        hook: String,
        point: HookPoint,
        refusal: Refusal,
    },
}

impl Stopped {
    /// The status the caller gets: a refusal's own, a failure's mapped.
    pub fn to_status(self) -> Status {
        match self {
            Stopped::Failed(f) => f.to_status(),
            Stopped::Refused { refusal, .. } => Status::new(refusal.code, refusal.message),
        }
    }
}

/// What a hook sees.
#[derive(Clone)]
pub struct HookContext {
    /// The pod/container store (already updated for "after" hooks).
    pub store: Store,
}

/// A policy hook. Implementations decide which calls they handle.
pub trait Hook: Send + Sync + 'static {
    /// A short name, used in logs, counters and config.
    fn name(&self) -> &str;

    /// Whether this hook runs at `point`/`stage`.
    fn handles(&self, point: HookPoint, stage: Stage) -> bool;

    /// Runs before the call is forwarded: pass, patch (see module docs) or refuse.
    fn before(
        &self,
        _ctx: HookContext,
        _req: Arc<CriRequest>,
    ) -> BoxFuture<Result<Verdict, BoxError>> {
        Box::pin(async { Ok(Verdict::Pass) })
    }

    /// Runs after the runtime answered the call successfully.
    fn after(
        &self,
        _ctx: HookContext,
        _req: Arc<CriRequest>,
        _resp: Arc<CriResponse>,
    ) -> BoxFuture<Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Per-hook settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookSettings {
    pub timeout: Duration,
    pub policy: FailurePolicy,
}

impl Default for HookSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            policy: FailurePolicy::FailOpen,
        }
    }
}

/// How a hook run failed.
#[derive(Debug, thiserror::Error)]
pub enum HookFailure {
    #[error("hook {hook} {stage} {point} failed: {source}")]
    Error {
        hook: String,
        point: HookPoint,
        stage: Stage,
        source: BoxError,
    },
    #[error("hook {hook} {stage} {point} timed out after {timeout:?}")]
    Timeout {
        hook: String,
        point: HookPoint,
        stage: Stage,
        timeout: Duration,
    },
    #[error("hook {hook} {stage} {point} panicked: {message}")]
    Panic {
        hook: String,
        point: HookPoint,
        stage: Stage,
        message: String,
    },
    #[error("hook {hook} {stage} {point} not run: {MAX_RUNNING_HOOKS} hook runs are still in progress (hooks stuck past their timeouts)")]
    Overloaded {
        hook: String,
        point: HookPoint,
        stage: Stage,
    },
    #[error("hook {hook} {stage} {point} refused the call with {code:?}, which it may not (only admission calls are refused, never with OK)")]
    WrongRefusal {
        hook: String,
        point: HookPoint,
        stage: Stage,
        code: tonic::Code,
    },
    #[error("hook {hook} {stage} {point} returned a patch for {got} (ignored)")]
    WrongPatch {
        hook: String,
        point: HookPoint,
        stage: Stage,
        got: HookPoint,
    },
}

impl HookFailure {
    /// The status a fail-closed failure answers with.
    pub fn to_status(self) -> Status {
        crate::QosletError::HookFailed {
            timed_out: matches!(self, HookFailure::Timeout { .. }),
            message: self.to_string(),
        }
        .into()
    }
}

/// Hook failure and refusal counters.
#[derive(Debug, Default)]
pub struct HookCounters {
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub panics: AtomicU64,
    /// Calls a hook refused (not failures: no policy applies to them).
    pub refusals: AtomicU64,
}

/// At most this many hook runs hold a blocking-pool thread at once. A hook
/// that overruns its timeout keeps its thread until it returns; past this many,
/// further runs fail at once (their failure policy applies) instead of piling
/// up threads and starving the pool the checkpoint and metrics also use.
pub const MAX_RUNNING_HOOKS: usize = 64;

struct Registered {
    hook: Arc<dyn Hook>,
    settings: HookSettings,
}

/// The ordered list of hooks.
#[derive(Clone)]
pub struct Pipeline {
    hooks: Arc<Vec<Registered>>,
    counters: Arc<HookCounters>,
    running: Arc<tokio::sync::Semaphore>,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self {
            hooks: Arc::default(),
            counters: Arc::default(),
            running: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_HOOKS)),
        }
    }
}

/// The result of the "before" stage.
pub struct Before {
    /// The request as the backend will see it (original merged with all patches).
    pub request: CriRequest,
    /// Encoded patches, to append to the original bytes in order.
    pub patches: Vec<Vec<u8>>,
}

impl Pipeline {
    /// An empty pipeline (pure pass-through, with the store still maintained).
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a pipeline from hooks in order, with their settings.
    pub fn with_hooks(hooks: Vec<(Arc<dyn Hook>, HookSettings)>) -> Self {
        Self {
            hooks: Arc::new(
                hooks
                    .into_iter()
                    .map(|(hook, settings)| Registered { hook, settings })
                    .collect(),
            ),
            ..Self::default()
        }
    }

    pub fn counters(&self) -> &HookCounters {
        &self.counters
    }

    /// Whether any hook handles `point` at `stage` (no decode is needed otherwise).
    pub fn wants(&self, point: HookPoint, stage: Stage) -> bool {
        self.hooks.iter().any(|r| r.hook.handles(point, stage))
    }

    /// Runs the "before" hooks in order. Each sees the request with earlier
    /// patches applied. Errs when a hook refused the call (the hooks after it
    /// do not run) or a fail-closed hook failed.
    pub async fn before(
        &self,
        ctx: &HookContext,
        mut request: CriRequest,
    ) -> Result<Before, Stopped> {
        let point = request.point();
        let mut patches = Vec::new();
        for r in self
            .hooks
            .iter()
            .filter(|r| r.hook.handles(point, Stage::Before))
        {
            let fut = r.hook.before(ctx.clone(), Arc::new(request.clone()));
            let outcome: Result<(), HookFailure> =
                match self.run(r, point, Stage::Before, fut).await {
                    Ok(Verdict::Pass) => continue,
                    Ok(Verdict::Refuse(refusal))
                        if !refusable(point) || refusal.code == tonic::Code::Ok =>
                    {
                        Err(HookFailure::WrongRefusal {
                            hook: r.hook.name().into(),
                            point,
                            stage: Stage::Before,
                            code: refusal.code,
                        })
                    }
                    Ok(Verdict::Refuse(refusal)) => {
                        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
                        // (Debug: the message may echo pod authors' input)
                        warn!(
                            hook = r.hook.name(),
                            method = %point,
                            subject = ?request.subject(),
                            code = ?refusal.code,
                            message = ?refusal.message,
                            "call refused by hook"
                        );
                        return Err(Stopped::Refused {
                            hook: r.hook.name().into(),
                            point,
                            refusal,
                        });
                    }
                    Ok(Verdict::Patch(patch)) if patch.point() == point => {
                        let bytes = patch.encode();
                        match request.merge(&bytes) {
                            Ok(()) => {
                                patches.push(bytes);
                                continue;
                            }
                            Err(e) => Err(HookFailure::Error {
                                hook: r.hook.name().into(),
                                point,
                                stage: Stage::Before,
                                source: Box::new(e),
                            }),
                        }
                    }
                    Ok(Verdict::Patch(patch)) => Err(HookFailure::WrongPatch {
                        hook: r.hook.name().into(),
                        point,
                        stage: Stage::Before,
                        got: patch.point(),
                    }),
                    Err(f) => Err(f),
                };
            if let Err(f) = outcome {
                self.fail(r, f)?;
            }
        }
        Ok(Before { request, patches })
    }

    /// Runs the "after" hooks in order. Errs only when a fail-closed hook failed.
    pub async fn after(
        &self,
        ctx: &HookContext,
        request: Arc<CriRequest>,
        response: Arc<CriResponse>,
    ) -> Result<(), HookFailure> {
        let point = request.point();
        for r in self
            .hooks
            .iter()
            .filter(|r| r.hook.handles(point, Stage::After))
        {
            let fut = r.hook.after(ctx.clone(), request.clone(), response.clone());
            if let Err(f) = self.run(r, point, Stage::After, fut).await {
                self.fail(r, f)?;
            }
        }
        Ok(())
    }

    /// Counts and logs a failure; returns it when the hook is fail-closed.
    fn fail(&self, r: &Registered, f: HookFailure) -> Result<(), HookFailure> {
        match &f {
            HookFailure::Timeout { .. } => self.counters.timeouts.fetch_add(1, Ordering::Relaxed),
            HookFailure::Panic { .. } => self.counters.panics.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.errors.fetch_add(1, Ordering::Relaxed),
        };
        warn!(hook = r.hook.name(), policy = ?r.settings.policy, error = %f, "hook failed");
        match r.settings.policy {
            FailurePolicy::FailOpen => Ok(()),
            FailurePolicy::FailClosed => Err(f),
        }
    }

    /// Runs one hook future in its own task, under its timeout.
    async fn run<T: Send + 'static>(
        &self,
        r: &Registered,
        point: HookPoint,
        stage: Stage,
        fut: BoxFuture<Result<T, BoxError>>,
    ) -> Result<T, HookFailure> {
        let hook = r.hook.name().to_string();
        // polled on a blocking-pool thread; the runtime's drivers keep running on
        // the serving thread, so the hook's own I/O and timers work as usual
        let Ok(permit) = self.running.clone().try_acquire_owned() else {
            return Err(HookFailure::Overloaded { hook, point, stage });
        };
        let handle = tokio::runtime::Handle::current();
        let mut task = tokio::task::spawn_blocking(move || {
            let _permit = permit; // held until the hook really returns
            handle.block_on(fut)
        });
        match tokio::time::timeout(r.settings.timeout, &mut task).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(source))) => Err(HookFailure::Error {
                hook,
                point,
                stage,
                source,
            }),
            Ok(Err(join)) => {
                let message = match join.try_into_panic() {
                    Ok(p) => p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string panic".into()),
                    Err(e) => e.to_string(),
                };
                Err(HookFailure::Panic {
                    hook,
                    point,
                    stage,
                    message,
                })
            }
            Err(_) => {
                task.abort();
                Err(HookFailure::Timeout {
                    hook,
                    point,
                    stage,
                    timeout: r.settings.timeout,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_proto::cri;

    /// A hook that behaves as told, for every point.
    struct Scripted {
        name: &'static str,
        mode: &'static str,
    }

    impl Hook for Scripted {
        fn name(&self) -> &str {
            self.name
        }
        fn handles(&self, point: HookPoint, _: Stage) -> bool {
            point == HookPoint::StartContainer
        }
        fn before(
            &self,
            _: HookContext,
            req: Arc<CriRequest>,
        ) -> BoxFuture<Result<Verdict, BoxError>> {
            let mode = self.mode;
            Box::pin(async move {
                match mode {
                    "error" => Err("boom".into()),
                    "panic" => panic!("hook exploded"),
                    // a hook that blocks its thread (sync I/O, a slow parse)
                    "block" => {
                        std::thread::sleep(Duration::from_millis(1500));
                        Ok(Verdict::Pass)
                    }
                    "refuse" => Ok(Verdict::Refuse(Refusal::new(
                        tonic::Code::ResourceExhausted,
                        "not admitted: node under pressure",
                    ))),
                    "wrong" => Ok(Verdict::Patch(CriRequest::StopContainer(
                        cri::StopContainerRequest::default(),
                    ))),
                    "patch" => {
                        let CriRequest::StartContainer(r) = &*req else {
                            unreachable!()
                        };
                        Ok(Verdict::Patch(CriRequest::StartContainer(
                            cri::StartContainerRequest {
                                container_id: format!("{}+", r.container_id),
                            },
                        )))
                    }
                    _ => Ok(Verdict::Pass),
                }
            })
        }
    }

    fn pipeline(modes: &[(&'static str, FailurePolicy)]) -> Pipeline {
        Pipeline::with_hooks(
            modes
                .iter()
                .map(|(m, p)| {
                    (
                        Arc::new(Scripted { name: m, mode: m }) as Arc<dyn Hook>,
                        HookSettings {
                            // room for a panic's backtrace to be captured in a debug build
                            timeout: Duration::from_millis(300),
                            policy: *p,
                        },
                    )
                })
                .collect(),
        )
    }

    fn start(id: &str) -> CriRequest {
        CriRequest::StartContainer(cri::StartContainerRequest {
            container_id: id.into(),
        })
    }

    fn ctx() -> HookContext {
        HookContext {
            store: Store::new(),
        }
    }

    /// A refusal is the hook's answer, not its failure: under either policy
    /// the call stops with the hook's status as given, the hooks after it do
    /// not run (a patch after it is not made), and it is counted as a refusal.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_stops_the_call_with_its_status_under_either_policy() {
        for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
            let p = pipeline(&[
                ("patch", FailurePolicy::FailOpen),
                ("refuse", policy),
                ("error", FailurePolicy::FailClosed),
            ]);
            let stopped = p.before(&ctx(), start("c")).await.err().expect("refused");
            assert!(
                matches!(&stopped, Stopped::Refused { hook, .. } if hook == "refuse"),
                "{stopped}"
            );
            let status = stopped.to_status();
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert_eq!(status.message(), "not admitted: node under pressure");
            let c = p.counters();
            assert_eq!(
                (
                    c.refusals.load(Ordering::Relaxed),
                    c.errors.load(Ordering::Relaxed)
                ),
                (1, 0),
                "{policy:?}: the fail-closed hook after it never ran"
            );
        }
    }

    /// A refusal where none may be (teardown) or with the OK code is the
    /// hook's failure: its policy applies. A long message is cut on a
    /// character boundary.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_out_of_place_is_a_failure_and_its_message_is_bounded() {
        struct Refuser(tonic::Code);
        impl Hook for Refuser {
            fn name(&self) -> &str {
                "refuser"
            }
            fn handles(&self, _: HookPoint, _: Stage) -> bool {
                true
            }
            fn before(
                &self,
                _: HookContext,
                _: Arc<CriRequest>,
            ) -> BoxFuture<Result<Verdict, BoxError>> {
                let code = self.0;
                Box::pin(async move { Ok(Verdict::Refuse(Refusal::new(code, "é".repeat(2000)))) })
            }
        }
        let p = |code, policy| {
            Pipeline::with_hooks(vec![(
                Arc::new(Refuser(code)) as Arc<dyn Hook>,
                HookSettings {
                    timeout: Duration::from_secs(1),
                    policy,
                },
            )])
        };
        let stop = CriRequest::StopContainer(cri::StopContainerRequest::default());
        let open = p(tonic::Code::NotFound, FailurePolicy::FailOpen);
        let b = open.before(&ctx(), stop.clone()).await.unwrap();
        assert_eq!(b.request, stop, "a teardown goes on (fail-open)");
        assert_eq!(open.counters().errors.load(Ordering::Relaxed), 1);
        let closed = p(tonic::Code::Ok, FailurePolicy::FailClosed);
        let e = closed.before(&ctx(), start("c")).await.err().unwrap();
        assert!(
            matches!(e, Stopped::Failed(HookFailure::WrongRefusal { .. })),
            "{e}"
        );
        assert_eq!(e.to_status().code(), tonic::Code::Internal);
        let r = Refusal::new(tonic::Code::ResourceExhausted, "é".repeat(2000));
        assert_eq!(
            r.message.len(),
            MAX_REFUSAL_MESSAGE,
            "two bytes a character"
        );
    }

    // paused time: a blocking-pool task holds the clock until it returns, so
    // these outcomes do not depend on how fast this machine unwinds a panic
    #[tokio::test(start_paused = true)]
    async fn failures_under_fail_open_leave_the_call_unchanged() {
        let p = pipeline(&[
            ("error", FailurePolicy::FailOpen),
            ("panic", FailurePolicy::FailOpen),
            ("wrong", FailurePolicy::FailOpen),
        ]);
        let b = p.before(&ctx(), start("c")).await.unwrap();
        assert_eq!(b.request, start("c"));
        assert!(b.patches.is_empty());
        let c = p.counters();
        assert_eq!(
            (
                c.errors.load(Ordering::Relaxed),
                c.panics.load(Ordering::Relaxed),
                c.timeouts.load(Ordering::Relaxed)
            ),
            (2, 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_under_fail_closed_fail_the_call() {
        for (mode, code) in [
            ("error", tonic::Code::Internal),
            ("panic", tonic::Code::Internal),
        ] {
            let p = pipeline(&[(mode, FailurePolicy::FailClosed)]);
            let err = p.before(&ctx(), start("c")).await.err().expect("must fail");
            let text = err.to_string();
            let status = err.to_status();
            assert_eq!(status.code(), code, "{mode}");
            assert!(status.message().contains(mode), "{text}");
        }
    }

    /// Issue 12: a hook that blocks its thread for 1.5 s (on the serving
    /// thread, as hooks once ran, it held every call and its own 300 ms timeout
    /// could not fire). On the single-threaded runtime qoslet serves CRI with,
    /// the call is released at its timeout and calls meanwhile pass at once.
    #[tokio::test]
    async fn an_overrunning_hook_delays_neither_its_timeout_nor_other_calls() {
        let slow = pipeline(&[("block", FailurePolicy::FailOpen)]);
        let fast = pipeline(&[("noop", FailurePolicy::FailOpen)]);
        let t0 = std::time::Instant::now();
        let held = tokio::spawn(async move { slow.before(&ctx(), start("c")).await.is_ok() });
        tokio::task::yield_now().await;
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let t = std::time::Instant::now();
            fast.before(&ctx(), start("d")).await.unwrap();
            worst = worst.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(held.await.unwrap(), "fail-open: the call goes on");
        let took = t0.elapsed();
        assert!(
            took < Duration::from_millis(1000),
            "released at its 300 ms timeout, not after the hook's 1.5 s: {took:?}"
        );
        assert!(
            worst < Duration::from_millis(500),
            "other calls were held: {worst:?}"
        );
        // fail-closed: the call fails at the timeout with DEADLINE_EXCEEDED
        let closed = pipeline(&[("block", FailurePolicy::FailClosed)]);
        let t0 = std::time::Instant::now();
        let err = closed
            .before(&ctx(), start("e"))
            .await
            .err()
            .expect("fails");
        assert_eq!(err.to_status().code(), tonic::Code::DeadlineExceeded);
        assert!(t0.elapsed() < Duration::from_millis(1000));
    }

    /// A hook that waits until the test opens its gate.
    struct Gated(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);
    impl Hook for Gated {
        fn name(&self) -> &str {
            "gated"
        }
        fn handles(&self, point: HookPoint, _: Stage) -> bool {
            point == HookPoint::StartContainer
        }
        fn before(
            &self,
            _: HookContext,
            _: Arc<CriRequest>,
        ) -> BoxFuture<Result<Verdict, BoxError>> {
            let gate = self.0.clone();
            Box::pin(async move {
                let (open, cv) = &*gate;
                let mut g = open.lock().unwrap();
                while !*g {
                    g = cv.wait(g).unwrap();
                }
                Ok(Verdict::Pass)
            })
        }
    }

    /// Hooks stuck past their timeouts hold at most MAX_RUNNING_HOOKS threads;
    /// beyond that a run fails at once (its policy applies) instead of piling up.
    #[tokio::test]
    async fn stuck_hooks_hold_a_bounded_number_of_threads() {
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let p = Pipeline::with_hooks(vec![(
            Arc::new(Gated(gate.clone())) as Arc<dyn Hook>,
            HookSettings {
                timeout: Duration::from_millis(20),
                policy: FailurePolicy::FailClosed,
            },
        )]);
        for _ in 0..MAX_RUNNING_HOOKS {
            let e = p.before(&ctx(), start("c")).await.err().expect("times out");
            assert!(
                matches!(e, Stopped::Failed(HookFailure::Timeout { .. })),
                "{e}"
            );
        }
        let e = p
            .before(&ctx(), start("c"))
            .await
            .err()
            .expect("overloaded");
        assert!(
            matches!(e, Stopped::Failed(HookFailure::Overloaded { .. })),
            "{e}"
        );
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        // the stuck runs return and give their threads back
        let mut ok = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if p.running.available_permits() == MAX_RUNNING_HOOKS {
                ok = true;
                break;
            }
        }
        assert!(ok, "threads not given back");
    }

    /// Fails after StartContainer.
    struct FailsAfter;
    impl Hook for FailsAfter {
        fn name(&self) -> &str {
            "fails-after"
        }
        fn handles(&self, point: HookPoint, stage: Stage) -> bool {
            point == HookPoint::StartContainer && stage == Stage::After
        }
        fn after(
            &self,
            _: HookContext,
            _: Arc<CriRequest>,
            _: Arc<CriResponse>,
        ) -> BoxFuture<Result<(), BoxError>> {
            Box::pin(async { Err("cannot apply".into()) })
        }
    }

    #[tokio::test]
    async fn after_stage_failures_follow_the_policy() {
        for (policy, fails) in [
            (FailurePolicy::FailOpen, false),
            (FailurePolicy::FailClosed, true),
        ] {
            let p = Pipeline::with_hooks(vec![(
                Arc::new(FailsAfter) as Arc<dyn Hook>,
                HookSettings {
                    timeout: Duration::from_secs(1),
                    policy,
                },
            )]);
            assert!(!p.wants(HookPoint::StartContainer, Stage::Before));
            let r = p
                .after(
                    &ctx(),
                    Arc::new(start("c")),
                    Arc::new(CriResponse::StartContainer(Default::default())),
                )
                .await;
            assert_eq!(r.is_err(), fails, "{policy:?}");
            if let Err(f) = r {
                assert!(f.to_string().contains("after StartContainer"), "{f}");
                assert_eq!(f.to_status().code(), tonic::Code::Internal);
            }
            assert_eq!(p.counters().errors.load(Ordering::Relaxed), 1);
        }
    }

    #[tokio::test]
    async fn patches_chain_and_are_kept_in_order() {
        let p = pipeline(&[
            ("patch", FailurePolicy::FailOpen),
            ("noop", FailurePolicy::FailClosed),
            ("patch", FailurePolicy::FailOpen),
        ]);
        let b = p.before(&ctx(), start("c")).await.unwrap();
        assert_eq!(b.request, start("c++"));
        assert_eq!(b.patches.len(), 2);
        assert!(p.wants(HookPoint::StartContainer, Stage::Before));
        assert!(!p.wants(HookPoint::StopContainer, Stage::Before));
    }
}
