//! Transparency of the proxy, seen from a recording backend: the bytes,
//! headers, deadlines, statuses and timing that reach the backend (and come
//! back) are the client's and the backend's own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use qoslet_integration::fake::{Ended, FakeBackend, Reply};
use qoslet_integration::raw::{frame, unknown_field, RawClient};
use qoslet_integration::{eventually, scratch, start_proxy};
use qoslet_proxy::cri::{CriRequest, HookPoint};
use qoslet_proxy::pipeline::{BoxError, BoxFuture, HookContext, Stage, Verdict};
use qoslet_proxy::{FailurePolicy, Hook, HookSettings, Pipeline};

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";

fn create_request() -> cri::CreateContainerRequest {
    cri::CreateContainerRequest {
        pod_sandbox_id: "pod-1".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            command: vec!["sh".into(), "-c".into(), "true".into()],
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_shares: 2,
                    cpu_quota: 50_000,
                    cpu_period: 100_000,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        // kubelet always sends the pod's metadata (without it containerd 1.6
        // crashes, and qoslet refuses the call)
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "pod".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
    }
}

/// Raises cpu_shares to 512 at CreateContainer (a patch).
struct SharesHook;
impl Hook for SharesHook {
    fn name(&self) -> &str {
        "shares"
    }
    fn handles(&self, p: HookPoint, s: Stage) -> bool {
        p == HookPoint::CreateContainer && s == Stage::Before
    }
    fn before(&self, _: HookContext, _: Arc<CriRequest>) -> BoxFuture<Result<Verdict, BoxError>> {
        Box::pin(async {
            Ok(Verdict::Patch(CriRequest::CreateContainer(
                cri::CreateContainerRequest {
                    config: Some(cri::ContainerConfig {
                        linux: Some(cri::LinuxContainerConfig {
                            resources: Some(cri::LinuxContainerResources {
                                cpu_shares: 512,
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )))
        })
    }
}

fn created_reply() -> Reply {
    Reply::ok(
        &cri::CreateContainerResponse {
            container_id: "ctr-1".into(),
        }
        .encode_to_vec(),
    )
}

async fn unknown_fields_survive_interception_with_and_without_a_patch() {
    for patched in [false, true] {
        let dir = scratch("unknown-field");
        let fake = FakeBackend::start(&dir.join("backend.sock"), |_| created_reply()).await;
        let pipeline = if patched {
            Pipeline::with_hooks(vec![(
                Arc::new(SharesHook) as Arc<dyn Hook>,
                HookSettings::default(),
            )])
        } else {
            Pipeline::new()
        };
        let (running, sock, _) = start_proxy(&dir, &fake.sock, pipeline).await;
        // a newer kubelet's request: a field (number 99) qoslet's CRI proto does not have
        let mut msg = create_request().encode_to_vec();
        let unknown = unknown_field(99, b"from-a-newer-kubelet");
        msg.extend_from_slice(&unknown);
        let mut c = RawClient::connect(&sock).await.unwrap();
        let resp = c.call(CREATE, &[], frame(&msg)).await.unwrap();
        assert_eq!(resp.grpc_status(), Some((0, String::new())));
        assert_eq!(
            cri::CreateContainerResponse::decode(resp.message())
                .unwrap()
                .container_id,
            "ctr-1"
        );

        let seen = fake.seen_on(CREATE);
        assert_eq!(seen.len(), 1);
        let body = &seen[0].body;
        assert_eq!(
            u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize,
            body.len() - 5,
            "frame length matches"
        );
        let got = &body[5..];
        assert!(
            got.windows(unknown.len()).any(|w| w == unknown.as_slice()),
            "unknown field 99 reached the backend (patched={patched})"
        );
        assert!(
            got.starts_with(&msg),
            "the original bytes come first, unchanged"
        );
        let decoded = cri::CreateContainerRequest::decode(got).unwrap();
        let shares = decoded.config.unwrap().linux.unwrap().resources.unwrap();
        if patched {
            assert_eq!(
                (shares.cpu_shares, shares.cpu_quota),
                (512, 50_000),
                "patch merged, other fields kept"
            );
            assert!(got.len() > msg.len());
        } else {
            assert_eq!(got, &msg[..], "no hook: byte-identical");
        }
        // the store recorded what kubelet asked for (not the patched value)
        assert_eq!(
            running
                .store
                .container("ctr-1")
                .unwrap()
                .requested
                .unwrap()
                .cpu_shares,
            2
        );
        // the client sends content-length (hyper does): whatever reaches the runtime carries
        // none or the true one, for the intercepted call whose body grew and for a later
        // pass-through call on the same connection (after the interception
        // header blocks)
        let later = "/runtime.v1.RuntimeService/Version";
        let resp = c
            .call(later, &[("x-after", "kept")], frame(b"\x0a\x02v1"))
            .await
            .unwrap();
        assert_eq!(resp.grpc_status(), Some((0, String::new())));
        for s in [&seen[0], &fake.seen_on(later)[0]] {
            if let Some(cl) = s.headers.get("content-length") {
                assert_eq!(
                    cl.to_str().unwrap(),
                    s.body.len().to_string(),
                    "{} (patched={patched})",
                    s.path
                );
            }
        }
        let v = &fake.seen_on(later)[0];
        assert_eq!(v.headers.get("x-after").unwrap(), "kept");
        assert_eq!(
            v.headers.get("content-length").map(|c| c.to_str().unwrap()),
            Some("9"),
            "a pass-through call keeps its content-length"
        );
        running.shutdown().await;
    }
}

async fn unknown_methods_metadata_deadline_and_statuses_pass_through() {
    let dir = scratch("passthrough");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |s| match s.path.as_str() {
        "/runtime.v1.RuntimeService/UpdatePodSandboxResources" => {
            Reply::ok(b"\x0a\x03new-response-bytes")
        }
        "/runtime.v1.RuntimeService/ContainerStatus" => Reply::status(
            5,
            "container \"abc\" not found",
            &[
                ("grpc-status-details-bin", "CAUSAgMEBQ"),
                ("x-extra", "kept"),
            ],
        ),
        "/some.future.Service/Method" => Reply::ok(b"future"),
        _ => Reply::status(12, "unexpected", &[]),
    })
    .await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let mut c = RawClient::connect(&sock).await.unwrap();

    // a method qoslet's CRI proto does not have
    let body = frame(b"\x0a\x05pod-1\xfa\x06\x02zz");
    let r = c
        .call(
            "/runtime.v1.RuntimeService/UpdatePodSandboxResources",
            &[("x-trace-id", "t-123"), ("grpc-timeout", "4S")],
            body.clone(),
        )
        .await
        .unwrap();
    assert_eq!(r.grpc_status(), Some((0, String::new())));
    assert_eq!(&r.body[..], &frame(b"\x0a\x03new-response-bytes")[..]);
    assert_eq!(
        r.headers.get("x-backend").unwrap(),
        "fake",
        "response headers come back"
    );
    let seen = &fake.seen_on("/runtime.v1.RuntimeService/UpdatePodSandboxResources")[0];
    assert_eq!(seen.body, body, "request bytes unchanged");
    assert_eq!(
        seen.headers.get("x-trace-id").unwrap(),
        "t-123",
        "metadata forwarded"
    );
    assert_eq!(
        seen.headers.get("grpc-timeout").unwrap(),
        "4S",
        "deadline forwarded"
    );
    assert_eq!(
        seen.headers.get("content-type").unwrap(),
        "application/grpc"
    );

    // an unknown service entirely
    let r = c
        .call("/some.future.Service/Method", &[], frame(b"q"))
        .await
        .unwrap();
    assert_eq!(&r.body[..], &frame(b"future")[..]);

    // an error status comes back with code, message and details unchanged
    let r = c
        .call(
            "/runtime.v1.RuntimeService/ContainerStatus",
            &[],
            frame(
                &cri::ContainerStatusRequest {
                    container_id: "abc".into(),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        r.grpc_status(),
        Some((5, "container \"abc\" not found".into()))
    );
    let t = r.trailers.expect("trailers");
    assert_eq!(t.get("grpc-status-details-bin").unwrap(), "CAUSAgMEBQ");
    assert_eq!(t.get("x-extra").unwrap(), "kept");

    // the same through an intercepted method (decoded path): the status is the backend's
    let r = c
        .call(
            "/runtime.v1.RuntimeService/StartContainer",
            &[],
            frame(
                &cri::StartContainerRequest {
                    container_id: "x".into(),
                }
                .encode_to_vec(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.grpc_status(), Some((12, "unexpected".into())));
    running.shutdown().await;
}

async fn concurrent_calls_do_not_serialize() {
    let dir = scratch("concurrency");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| {
        Reply::ok(
            &cri::VersionResponse {
                version: "0.1.0".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .delayed(Duration::from_millis(400))
    })
    .await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let t0 = Instant::now();
    let mut tasks = vec![];
    for i in 0..32 {
        let sock = sock.clone();
        tasks.push(tokio::spawn(async move {
            // half on one shared connection pattern (tonic multiplexes), half on separate connections
            let mut c = RawClient::connect(&sock).await.unwrap();
            let path = if i % 2 == 0 {
                "/runtime.v1.RuntimeService/Version"
            } else {
                "/runtime.v1.RuntimeService/StartContainer"
            };
            c.call(path, &[], frame(&[])).await.unwrap().grpc_status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().map(|s| s.0), Some(0));
    }
    let took = t0.elapsed();
    // 32 calls x 400 ms would take 12.8 s if serialized
    assert!(
        took < Duration::from_millis(2500),
        "32 concurrent 400 ms calls took {took:?}"
    );
    running.shutdown().await;
}

async fn server_streams_flow_through_as_they_come() {
    let dir = scratch("stream");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| Reply {
        chunks: (0..3)
            .map(|i| {
                (
                    // (a second apart: a loaded machine's stalls are
                    // small against it)
                    Duration::from_millis(1000),
                    frame(format!("event-{i}").as_bytes()),
                )
            })
            .collect(),
        trailers: {
            let mut m = http::HeaderMap::new();
            m.insert("grpc-status", "0".parse().unwrap());
            m
        },
        ..Default::default()
    })
    .await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    // watch arrival times through a streaming client
    let io = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("http://localhost/runtime.v1.RuntimeService/GetContainerEvents")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(frame(&[])))
        .unwrap();
    let t0 = Instant::now();
    let resp = sender.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let mut arrivals = vec![];
    let mut trailers = None;
    while let Some(f) = body.frame().await {
        let f = f.unwrap();
        if f.is_data() {
            arrivals.push(t0.elapsed());
        } else {
            trailers = f.into_trailers().ok();
        }
    }
    assert_eq!(arrivals.len(), 3);
    // sent at 1, 2 and 3 s: the first before the second was sent, and the
    // three spread over time, not buffered to the end
    assert!(
        arrivals[0] < Duration::from_millis(1900),
        "first event arrived at {:?}, not buffered",
        arrivals[0]
    );
    assert!(
        arrivals[2] - arrivals[0] > Duration::from_millis(1200),
        "events spread over time: {arrivals:?}"
    );
    assert_eq!(trailers.unwrap().get("grpc-status").unwrap(), "0");
    running.shutdown().await;
}

async fn oversized_messages_are_refused_both_ways_and_the_proxy_keeps_serving() {
    let dir = scratch("oversized");
    let big = vec![b'x'; (16 << 20) + 1];
    let big_reply = frame(&big);
    let fake = FakeBackend::start(&dir.join("backend.sock"), move |s| match s.path.as_str() {
        "/runtime.v1.RuntimeService/ExecSync" => Reply {
            chunks: vec![(Duration::ZERO, big_reply.clone())],
            trailers: Default::default(),
            ..Default::default()
        },
        _ => Reply::ok(b""),
    })
    .await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let mut c = RawClient::connect(&sock).await.unwrap();
    for path in ["/runtime.v1.RuntimeService/Version", CREATE] {
        let r = c.call(path, &[], frame(&big)).await.unwrap();
        assert_eq!(
            r.grpc_status().map(|s| s.0),
            Some(8),
            "{path}: RESOURCE_EXHAUSTED"
        );
        assert!(
            fake.seen_on(path).iter().all(|s| s.body.len() < 1024),
            "{path}: the message never reached the backend"
        );
    }
    // an oversized response from the runtime
    let r = c
        .call("/runtime.v1.RuntimeService/ExecSync", &[], frame(b""))
        .await
        .unwrap();
    assert_eq!(r.grpc_status().map(|s| s.0), Some(8));
    assert!(r.body.len() < 1024);
    // 16 MiB exactly is fine
    let ok = vec![b'y'; 16 << 20];
    let r = c
        .call("/runtime.v1.RuntimeService/Version", &[], frame(&ok))
        .await
        .unwrap();
    assert_eq!(r.grpc_status().map(|s| s.0), Some(0));
    assert_eq!(
        fake.seen_on("/runtime.v1.RuntimeService/Version")
            .last()
            .unwrap()
            .body
            .len(),
        ok.len() + 5
    );
    assert_eq!(
        running
            .stats
            .oversized_messages
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    running.shutdown().await;
    let _ = Bytes::new();
}

async fn undecodable_intercepted_request_is_forwarded_unchanged() {
    let dir = scratch("undecodable");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| {
        Reply::status(3, "runtime says invalid", &[])
    })
    .await;
    let pipeline = Pipeline::with_hooks(vec![(
        Arc::new(SharesHook) as Arc<dyn Hook>,
        HookSettings {
            timeout: Duration::from_secs(1),
            policy: FailurePolicy::FailClosed,
        },
    )]);
    let (running, sock, _) = start_proxy(&dir, &fake.sock, pipeline).await;
    let mut c = RawClient::connect(&sock).await.unwrap();
    let garbage = frame(b"\xff\xff\xff\xff\x0f");
    let r = c.call(CREATE, &[], garbage.clone()).await.unwrap();
    assert_eq!(
        r.grpc_status(),
        Some((3, "runtime says invalid".into())),
        "the runtime's own answer"
    );
    assert_eq!(fake.seen_on(CREATE)[0].body, garbage);
    assert_eq!(
        running
            .stats
            .undecodable_messages
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    running.shutdown().await;
}

async fn large_intercepted_requests_still_reach_the_runtime_unchanged() {
    let dir = scratch("large");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| created_reply()).await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    // 2,000 environment variables (~60 KiB): more than the relay holds for interception
    let mut req = create_request();
    req.config.as_mut().unwrap().envs = (0..2000)
        .map(|i| cri::KeyValue {
            key: format!("VAR_{i:05}"),
            value: "x".repeat(20),
        })
        .collect();
    let msg = req.encode_to_vec();
    assert!(msg.len() > 50_000);
    let mut c = RawClient::connect(&sock).await.unwrap();
    let r = c.call(CREATE, &[], frame(&msg)).await.unwrap();
    assert_eq!(r.grpc_status(), Some((0, String::new())));
    assert_eq!(
        &fake.seen_on(CREATE)[0].body[5..],
        &msg[..],
        "byte for byte"
    );
    running.shutdown().await;
}

/// The tests above, on the one data plane.
mod one_plane {
    #[tokio::test]
    async fn large_intercepted_requests_still_reach_the_runtime_unchanged() {
        super::large_intercepted_requests_still_reach_the_runtime_unchanged().await
    }
    #[tokio::test]
    async fn unknown_fields_survive_interception_with_and_without_a_patch() {
        super::unknown_fields_survive_interception_with_and_without_a_patch().await
    }
    #[tokio::test]
    async fn unknown_methods_metadata_deadline_and_statuses_pass_through() {
        super::unknown_methods_metadata_deadline_and_statuses_pass_through().await
    }
    #[tokio::test]
    async fn concurrent_calls_do_not_serialize() {
        super::concurrent_calls_do_not_serialize().await
    }
    #[tokio::test]
    async fn server_streams_flow_through_as_they_come() {
        super::server_streams_flow_through_as_they_come().await
    }
    #[tokio::test]
    async fn oversized_messages_are_refused_both_ways_and_the_proxy_keeps_serving() {
        super::oversized_messages_are_refused_both_ways_and_the_proxy_keeps_serving().await
    }
    #[tokio::test]
    async fn undecodable_intercepted_request_is_forwarded_unchanged() {
        super::undecodable_intercepted_request_is_forwarded_unchanged().await
    }
}

/// Issue 15: the final checkpoint is written after the drain, so a call still
/// in flight at SIGTERM (a RunPodSandbox in CNI setup: here the backend takes
/// 800 ms to answer) is in it. It used to be written when shutdown began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_checkpoint_holds_calls_that_drained() {
    let dir = scratch("final-checkpoint");
    std::fs::create_dir_all(&dir).unwrap();
    let fake = FakeBackend::start(&dir.join("backend.sock"), |s| match s.path.as_str() {
        "/runtime.v1.RuntimeService/RunPodSandbox" => Reply::ok(
            &cri::RunPodSandboxResponse {
                pod_sandbox_id: "slow-sandbox".into(),
            }
            .encode_to_vec(),
        )
        .delayed(Duration::from_millis(800)),
        // the rebuild's listings: nothing yet
        _ => Reply::ok(b""),
    })
    .await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let req = cri::RunPodSandboxRequest {
        config: Some(qoslet_integration::testbed::pod_config(
            "slow",
            "/kubepods/podslow",
        )),
        runtime_handler: String::new(),
    };
    let call = tokio::spawn(async move {
        let mut c = RawClient::connect(&sock).await.unwrap();
        c.call(
            "/runtime.v1.RuntimeService/RunPodSandbox",
            &[],
            frame(&req.encode_to_vec()),
        )
        .await
        .unwrap()
        .grpc_status()
    });
    // the call has reached the runtime (which holds it 800 ms)
    qoslet_integration::eventually("the call at the runtime", Duration::from_secs(10), || {
        let at = !fake
            .seen_on("/runtime.v1.RuntimeService/RunPodSandbox")
            .is_empty();
        async move { at.then_some(()) }
    })
    .await;
    // SIGTERM's path: drain (the call completes), then the final checkpoint
    drop(running.shutdown().await);
    assert_eq!(
        call.await.unwrap(),
        Some((0, String::new())),
        "the call drained"
    );
    let ck = qoslet_state::checkpoint::Checkpoint::new(
        dir.join("state"),
        format!("unix://{}", fake.sock.display()),
    );
    let snap = ck.load().expect("a final checkpoint");
    assert!(
        snap.pods.iter().any(|p| p.id == "slow-sandbox"),
        "the drained RunPodSandbox is in the final checkpoint: {:?}",
        snap.pods.iter().map(|p| &p.id).collect::<Vec<_>>()
    );
}

/// Rebuilds `known` from a fake runtime listing the sandboxes `ids` (one named
/// "bad" fails its status, one named "slow…" answers after 4 s) and the
/// containers of `known`, within `budget`; returns what was rebuilt, the pod
/// ids and the time the pass took.
async fn rebuild_from(
    name: &str,
    ids: Vec<String>,
    known: qoslet_state::store::Snapshot,
    budget: Duration,
) -> (qoslet_proxy::rebuild::Rebuilt, Vec<String>, Duration) {
    let listed: Vec<cri::Container> = known
        .containers
        .iter()
        .map(|c| cri::Container {
            id: c.id.clone(),
            pod_sandbox_id: c.pod_id.clone(),
            state: cri::ContainerState::ContainerRunning as i32,
            ..Default::default()
        })
        .collect();
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let sandbox = |id: &str| cri::PodSandbox {
        id: id.into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: id.into(),
            uid: id.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: cri::PodSandboxState::SandboxReady as i32,
        ..Default::default()
    };
    let fake = FakeBackend::start(&dir.join("backend.sock"), move |s| {
        match s.path.as_str() {
            "/runtime.v1.RuntimeService/ListPodSandbox" => Reply::ok(
                &cri::ListPodSandboxResponse {
                    items: ids.iter().map(|id| sandbox(id)).collect(),
                }
                .encode_to_vec(),
            ),
            "/runtime.v1.RuntimeService/PodSandboxStatus" => {
                let req = cri::PodSandboxStatusRequest::decode(&s.body[5..]).unwrap();
                let info = r#"{"config":{"metadata":{"name":"x"},"linux":{"cgroup_parent":"/kubepods/podx"}}}"#;
                let ok = Reply::ok(
                    &cri::PodSandboxStatusResponse {
                        info: [("info".to_string(), info.to_string())].into(),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                );
                match req.pod_sandbox_id.as_str() {
                    "bad" => Reply::status(13, "boom", &[]),
                    id if id.starts_with("slow") => ok.delayed(Duration::from_secs(4)),
                    _ => ok,
                }
            }
            "/runtime.v1.RuntimeService/ListContainers" => Reply::ok(
                &cri::ListContainersResponse {
                    containers: listed.clone(),
                }
                .encode_to_vec(),
            ),
            _ => Reply::ok(b""),
        }
    })
    .await;
    let mut client = cri::runtime_service_client::RuntimeServiceClient::new(
        qoslet_integration::channel(&fake.sock).await,
    );
    let t = Instant::now();
    let r = qoslet_proxy::rebuild::reconcile(&mut client, known, budget)
        .await
        .expect("the listing worked: the pass succeeds");
    let pods = r.snapshot.pods.iter().map(|p| p.id.clone()).collect();
    (r, pods, t.elapsed())
}

/// Issue 15: one entry whose verbose status fails or hangs no longer stops
/// the rebuild: it is left for the next resync and the rest are rebuilt,
/// within the per-call deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_entry_does_not_stop_the_rebuild() {
    let ids = ["a", "bad", "slow", "c"].map(String::from).to_vec();
    let (r, rebuilt, took) = rebuild_from(
        "rebuild-partial",
        ids,
        Default::default(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.left_out, 2, "counted, for the short retry");
    assert_eq!(
        rebuilt,
        ["a", "c"],
        "the failing and the hanging entry left out"
    );
    assert!(
        took < Duration::from_secs(4),
        "the hanging status was cut at its deadline: {took:?}"
    );
}

/// Issue 15: when the statuses do not all fit in the pass's budget, the pass
/// still returns in time with what was answered (it used to be cut whole by an
/// outer timeout, keeping nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_over_budget_keeps_what_was_answered() {
    // 45 hanging statuses, 32 at a time for 2 s each, need 4 s; the budget is 3 s.
    // Slots are not handed out in listing order, but with 49 entries every quick
    // one has a slot by the second wave (2 s), inside the budget.
    let mut ids: Vec<String> = (0..4).map(|i| format!("fast{i}")).collect();
    ids.extend((0..45).map(|i| format!("slow{i}")));
    let (r, rebuilt, took) = rebuild_from(
        "rebuild-budget",
        ids,
        Default::default(),
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(
        rebuilt,
        ["fast0", "fast1", "fast2", "fast3"],
        "the answered entries kept"
    );
    assert_eq!(r.left_out, 45, "the cut ones counted, for the short retry");
    // without the budget the second wave would run its full 2 s, to 4 s
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_millis(3800),
        "the pass ended at its budget: {took:?}"
    );
}

/// A container the store knows stays known while the runtime lists its pod,
/// even when that pod's own status was cut (an earlier pass left the pod out,
/// kubelet's CreateContainer then recorded the container): a pass that runs out
/// of time must not remove what kubelet told qoslet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_pod_keeps_its_known_containers() {
    let known = qoslet_state::store::Snapshot {
        containers: vec![qoslet_state::store::ContainerRecord {
            id: "c1".into(),
            pod_id: "slow-pod".into(),
            applied: [("cpu.cfs_quota_us".to_string(), "50000".to_string())].into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let ids = vec!["slow-pod".to_string()];
    let (r, pods, _) = rebuild_from("rebuild-known", ids, known, Duration::from_secs(10)).await;
    assert!(pods.is_empty(), "the pod's status was cut");
    assert_eq!(r.left_out, 1);
    let c: Vec<_> = r
        .snapshot
        .containers
        .iter()
        .map(|c| (&c.id, &c.applied))
        .collect();
    assert_eq!(c.len(), 1, "the known container kept: {c:?}");
    assert_eq!(
        c[0].1["cpu.cfs_quota_us"], "50000",
        "with what qoslet applied"
    );
}

/// Issue 48: a request body reaches the runtime ended the way the client ended
/// it (grpc-go answers each ending differently: an empty body that ends on
/// its HEADERS waits for the deadline, one that ends on an empty DATA frame is
/// answered at once), on a passed-through call, an intercepted one and a
/// streamed one, and every one of them is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_reaches_the_runtime_ended_as_the_client_ended_it() {
    let dir = scratch("request-end");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| Reply::ok(b"")).await;
    let (_running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let io = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-client-trailer", "1".parse().unwrap());
    let message = frame(b"");
    let paths = [
        "/runtime.v1.RuntimeService/Version",
        CREATE,
        "/qoslet.test.Streamed/Call",
    ];
    // (ending, body): how the client ends it, and what reaches the runtime
    let endings: [(&str, Bytes, Ended); 5] = [
        ("headers", Bytes::new(), Ended::Headers),
        ("empty-data", Bytes::new(), Ended::Data),
        ("data", message.clone(), Ended::Data),
        ("trailers", Bytes::new(), Ended::Trailers(trailers.clone())),
        (
            "trailers",
            message.clone(),
            Ended::Trailers(trailers.clone()),
        ),
    ];
    for path in paths {
        for (ending, body, want) in &endings {
            let head = http::Request::post(format!("http://localhost{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header("x-case", format!("{ending}-{}", body.len()))
                .body(())
                .unwrap();
            let mut c = client.clone().ready().await.unwrap();
            let (answer, mut send) = c.send_request(head, *ending == "headers").unwrap();
            match *ending {
                "headers" => {}
                "trailers" => {
                    if !body.is_empty() {
                        send.send_data(body.clone(), false).unwrap();
                    }
                    send.send_trailers(trailers.clone()).unwrap();
                }
                _ => send.send_data(body.clone(), true).unwrap(),
            }
            // (the fake runtime answers once the body ended: the open case ends it later)
            let r = tokio::time::timeout(Duration::from_secs(5), answer)
                .await
                .unwrap_or_else(|_| panic!("{path} {ending}: no answer in 5 s"))
                .unwrap();
            assert_eq!(r.status(), 200, "{path} {ending}");
            let case = format!("{ending}-{}", body.len());
            let seen = fake
                .seen_on(path)
                .into_iter()
                .find(|s| s.headers["x-case"] == case.as_str())
                .unwrap_or_else(|| panic!("{path} {case}: not forwarded"));
            assert_eq!(&seen.ended, want, "{path} {case}");
            assert_eq!(&seen.body, body, "{path} {case}");
        }
    }
}

/// Issue 48: a client that sends its whole message and leaves its stream open
/// is not held until it ends it: the message reaches the runtime at once (grpc-go
/// answers a unary call once its message is in), and the client's END_STREAM
/// follows when it comes. One that has not sent a whole message by its
/// deadline is answered DEADLINE_EXCEEDED, as grpc-go answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_message_goes_on_before_its_stream_ends_and_a_late_one_meets_its_deadline() {
    let dir = scratch("request-open");
    let fake = FakeBackend::start(&dir.join("backend.sock"), |_| Reply::ok(b"")).await;
    let (running, sock, _) = start_proxy(&dir, &fake.sock, Pipeline::new()).await;
    let io = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let message = frame(b"\x0a\x02v1");
    for path in ["/runtime.v1.RuntimeService/Version", CREATE] {
        let head = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-case", format!("open {path}"))
            .body(())
            .unwrap();
        let mut c = client.clone().ready().await.unwrap();
        let (answer, mut send) = c.send_request(head, false).unwrap();
        send.send_data(message.clone(), false).unwrap();
        // the call reaches the runtime while the client's stream is open
        let case = format!("open {path}");
        eventually(
            "the call at the runtime",
            Duration::from_secs(5),
            || async {
                fake.arrived()
                    .iter()
                    .any(|h| h.get("x-case").is_some_and(|v| v == case.as_str()))
                    .then_some(())
            },
        )
        .await;
        // (the recording runtime answers once it read the body to its end)
        send.send_data(Bytes::new(), true).unwrap();
        let seen = eventually(
            "the body at the runtime",
            Duration::from_secs(5),
            || async { fake.seen_on(path).into_iter().next() },
        )
        .await;
        assert_eq!(seen.body, message, "{path}");
        assert_eq!(seen.ended, Ended::Data, "{path}");
        let r = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("answered")
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // part of a message, then nothing: DEADLINE_EXCEEDED at the client's deadline,
    // without waiting for the client (which never ends its stream)
    for path in ["/runtime.v1.RuntimeService/Version", CREATE] {
        let head = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "500m")
            .body(())
            .unwrap();
        let mut c = client.clone().ready().await.unwrap();
        let (answer, mut send) = c.send_request(head, false).unwrap();
        send.send_data(message.slice(..3), false).unwrap();
        let t0 = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("answered at the deadline")
            .unwrap();
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(450), "{path}: {waited:?}");
        assert_eq!(r.headers()["grpc-status"], "4", "{path}: {r:?}");
        drop(send);
    }
    assert_eq!(
        running
            .stats
            .calls_in_flight
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
