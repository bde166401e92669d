//! Faults against the real containerd 1.6 + runc: qoslet killed and restarted,
//! a corrupt checkpoint, SIGTERM with calls in flight, a second qoslet, garbage
//! on the socket, and hooks that time out, fail or panic under both policies.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::{wait_timeout, QosletProcess};
use qoslet_integration::testbed::{
    self, container_config, pod_config, Cri, Knob, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{channel, scratch, start_proxy, unique};
use qoslet_proto::admin::{admin_client::AdminClient, ListPodsRequest, Pod};
use qoslet_proxy::cri::{CriRequest, CriResponse, HookPoint};
use qoslet_proxy::pipeline::{BoxError, BoxFuture, HookContext, Stage, Verdict};
use qoslet_proxy::{FailurePolicy, Hook, HookSettings, Pipeline, Refusal};

fn res(shares: i64) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: 100_000,
        cpu_quota: 30_000,
        memory_limit_in_bytes: 48 << 20,
        ..Default::default()
    }
}

async fn pods(admin: &std::path::Path) -> Vec<Pod> {
    AdminClient::new(channel(admin).await)
        .list_pods(ListPodsRequest {
            namespace: "qoslet-e2e".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_qoslet_kill9_restart_and_corrupt_checkpoint_rebuild_the_store() {
    let tb = Testbed::main();
    let dir = scratch("kill9");
    let mut q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    let mut direct = Cri::connect(&tb.sock).await;

    // pod A through qoslet
    let a = unique("kill9-a");
    let (cga, cfg_a) = (tb.cgroup_parent(&a), pod_config(&a, &tb.cgroup_parent(&a)));
    let pod_a = via.run_pod(&cfg_a).await.unwrap();
    let ctr_a = via
        .create(
            &pod_a,
            &cfg_a,
            container_config("app", SLEEP_LOOP, Some(res(333))),
        )
        .await
        .unwrap();
    via.start(&ctr_a).await.unwrap();
    let files_before = tb.cg(&tb.container_cg(&cga, &ctr_a), Knob::CpuShares);
    // let the checkpoint writer (100 ms coalescing) catch up, as it would on a live node
    qoslet_integration::eventually("checkpoint holds pod A", Duration::from_secs(5), || {
        let (p, id) = (q.state_dir.join("store.json"), ctr_a.clone());
        async move {
            std::fs::read_to_string(p)
                .ok()
                .filter(|s| s.contains(&id))
                .map(|_| ())
        }
    })
    .await;

    q.kill9();
    assert!(
        q.sock.exists(),
        "a SIGKILLed qoslet leaves its socket file behind"
    );

    // pod B created while qoslet is dead, directly at containerd
    let b = unique("kill9-b");
    let (cgb, cfg_b) = (tb.cgroup_parent(&b), pod_config(&b, &tb.cgroup_parent(&b)));
    let pod_b = direct.run_pod(&cfg_b).await.unwrap();
    let ctr_b = direct
        .create(
            &pod_b,
            &cfg_b,
            container_config("side", SLEEP_LOOP, Some(res(222))),
        )
        .await
        .unwrap();
    direct.start(&ctr_b).await.unwrap();

    q.restart(); // replaces the stale socket
    let listed = pods(&q.admin).await;
    let pa = listed
        .iter()
        .find(|p| p.id == pod_a)
        .expect("pod A back from the checkpoint");
    assert_eq!(pa.cgroup_parent, cga);
    let ca = pa
        .containers
        .iter()
        .find(|c| c.id == ctr_a)
        .expect("container A");
    assert_eq!(
        (ca.state.as_str(), ca.requested.as_ref().unwrap().cpu_shares),
        ("running", 333)
    );
    let pb = listed
        .iter()
        .find(|p| p.id == pod_b)
        .expect("pod B learned from the runtime");
    assert_eq!(
        pb.cgroup_parent, cgb,
        "cgroup parent recovered from containerd's verbose status"
    );
    let cb = pb
        .containers
        .iter()
        .find(|c| c.id == ctr_b)
        .expect("container B");
    assert_eq!(cb.requested.as_ref().unwrap().cpu_shares, 222);
    assert_eq!(
        tb.cg(&tb.container_cg(&cga, &ctr_a), Knob::CpuShares),
        files_before,
        "cgroup files untouched by the restart"
    );
    assert!(
        q.log_text().contains("checkpoint loaded"),
        "{}",
        q.log_text()
    );

    // a corrupt checkpoint: logged, ignored, rebuilt from the runtime
    q.kill9();
    std::fs::write(
        q.state_dir.join("store.json"),
        b"{\"format\":\"qoslet.store/v1\",\"pods\":[{\"id\":",
    )
    .unwrap();
    q.restart();
    let listed = pods(&q.admin).await;
    assert!(
        listed.iter().any(|p| p.id == pod_a) && listed.iter().any(|p| p.id == pod_b),
        "{listed:?}"
    );
    assert!(
        q.log_text().contains("checkpoint ignored"),
        "{}",
        q.log_text()
    );
    // what qoslet applied comes back from the runtime's record (issue 15 item 4)
    let ca = listed
        .iter()
        .find(|p| p.id == pod_a)
        .and_then(|p| p.containers.iter().find(|c| c.id == ctr_a))
        .expect("container A rebuilt from the runtime");
    assert!(ca.applied.contains_key("class"), "{:?}", ca.applied);
    assert_eq!(ca.requested.as_ref().unwrap().cpu_shares, 333);
    // a foreign one too
    q.kill9();
    std::fs::write(
        q.state_dir.join("store.json"),
        b"{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\"}",
    )
    .unwrap();
    q.restart();
    // (the line may reach the log file just after the sockets answer)
    for _ in 0..50 {
        if q.log_text().contains("foreign checkpoint") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        q.log_text().contains("foreign checkpoint"),
        "{}",
        q.log_text()
    );
    // (this test's pods: the other tests here run pods on the same containerd meanwhile)
    let again = pods(&q.admin).await;
    assert!(
        [&pod_a, &pod_b]
            .iter()
            .all(|id| again.iter().any(|p| &&p.id == id)),
        "{again:?}"
    );

    // removal through qoslet empties the store; the checkpoint follows
    let mut via = Cri::connect(&q.sock).await;
    via.remove_pod(&pod_a).await;
    via.remove_pod(&pod_b).await;
    let left = pods(&q.admin).await;
    assert!(left.iter().all(|p| p.id != pod_a && p.id != pod_b));
    testbed::remove_cgroup_dirs(&cga);
    testbed::remove_cgroup_dirs(&cgb);
    assert!(q.sigterm(Duration::from_secs(10)).success());
    let ck = std::fs::read_to_string(q.state_dir.join("store.json")).unwrap();
    assert!(
        !ck.contains(&pod_a) && !ck.contains(&pod_b),
        "final checkpoint written at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sigterm_drains_in_flight_calls_and_exits_0() {
    let tb = Testbed::main();
    let dir = scratch("drain");
    let mut q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    let name = unique("drain");
    let cgp = tb.cgroup_parent(&name);
    let cfg = pod_config(&name, &cgp);
    let pod = via.run_pod(&cfg).await.unwrap();
    let ctr = via
        .create(&pod, &cfg, container_config("app", SLEEP_LOOP, None))
        .await
        .unwrap();
    via.start(&ctr).await.unwrap();

    let mut rt = via.rt.clone();
    let c2 = ctr.clone();
    let slow = tokio::spawn(async move {
        rt.exec_sync(cri::ExecSyncRequest {
            container_id: c2,
            cmd: vec!["sh".into(), "-c".into(), "sleep 2; echo drained".into()],
            timeout: 10,
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = std::time::Instant::now();
    let status = tokio::task::block_in_place(|| q.sigterm(Duration::from_secs(15)));
    assert!(status.success(), "exit status {status:?}\n{}", q.log_text());
    let r = slow.await.unwrap().expect("the in-flight call completed");
    assert_eq!(
        String::from_utf8_lossy(&r.into_inner().stdout).trim(),
        "drained"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1000),
        "qoslet waited for the call"
    );
    assert!(
        tokio::net::UnixStream::connect(&q.sock).await.is_err(),
        "no longer accepting"
    );
    Cri::connect(&tb.sock).await.remove_pod(&pod).await;
    testbed::remove_cgroup_dirs(&cgp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_second_qoslet_refuses_and_socket_is_0660_root() {
    let tb = Testbed::main();
    let dir = scratch("second");
    let q = QosletProcess::start(&dir, &tb.sock);
    let md = std::fs::metadata(&q.sock).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o660);
    assert_eq!(
        (md.uid(), md.gid()),
        (0, 0),
        "owned by root (tests run as root)"
    );
    let mut second = q.spawn_again();
    let st = tokio::task::block_in_place(|| wait_timeout(&mut second, Duration::from_secs(10)))
        .expect("second qoslet exits");
    assert!(!st.success());
    let log = std::fs::read_to_string(dir.join("qoslet-2.log")).unwrap();
    assert!(log.contains("another qoslet"), "{log}");
    // the first one is unharmed
    Cri::connect(&q.sock)
        .await
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_garbage_on_the_socket_does_not_hurt_other_clients() {
    let tb = Testbed::main();
    let dir = scratch("garbage");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut good = Cri::connect(&q.sock).await;
    let junk: Vec<Vec<u8>> = vec![
        (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect(),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\x01\x05\x00\x00\x00\x01garbage".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x05\x01\x04\x00\x00\x00\x01\xff\xff\xff\xff\xff".to_vec(),
        b"PRI * HTTP/2".to_vec(),
    ];
    let sock = q.sock.clone();
    tokio::task::spawn_blocking(move || {
        for j in junk {
            let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(&j);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut buf = vec![];
            let _ = s.read_to_end(&mut buf); // qoslet closes the connection (or answers GOAWAY)
        }
    })
    .await
    .unwrap();
    for _ in 0..3 {
        good.rt
            .version(cri::VersionRequest::default())
            .await
            .expect("other clients still served");
    }
    let mut fresh = Cri::connect(&q.sock).await;
    fresh
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
    assert!(
        q.log_text().lines().all(|l| !l.contains("panicked")),
        "{}",
        q.log_text()
    );
}

/// A hook that fails the way it is told to.
struct Faulty {
    mode: &'static str,
}

impl Faulty {
    async fn act(mode: &'static str) -> Result<(), BoxError> {
        match mode {
            "timeout" => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            }
            "error" => Err("policy backend unreachable".into()),
            "panic" => panic!("hook bug"),
            _ => Ok(()),
        }
    }
}

impl Hook for Faulty {
    fn name(&self) -> &str {
        self.mode
    }
    fn handles(&self, p: HookPoint, s: Stage) -> bool {
        matches!(
            (p, s),
            (HookPoint::CreateContainer, Stage::Before) | (HookPoint::StartContainer, Stage::After)
        )
    }
    fn before(&self, _: HookContext, _: Arc<CriRequest>) -> BoxFuture<Result<Verdict, BoxError>> {
        let mode = self.mode;
        Box::pin(async move { Faulty::act(mode).await.map(|_| Verdict::Pass) })
    }
    fn after(
        &self,
        _: HookContext,
        _: Arc<CriRequest>,
        _: Arc<CriResponse>,
    ) -> BoxFuture<Result<(), BoxError>> {
        Box::pin(Faulty::act(self.mode))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_containerd_hook_timeouts_errors_and_panics_under_both_policies() {
    let tb = Testbed::main();
    for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
        for mode in ["timeout", "error", "panic"] {
            let dir = scratch("hooks");
            let pipeline = Pipeline::with_hooks(vec![(
                Arc::new(Faulty { mode }) as Arc<dyn Hook>,
                HookSettings {
                    timeout: Duration::from_millis(300),
                    policy,
                },
            )]);
            let (running, sock, _) = start_proxy(&dir, &tb.sock, pipeline).await;
            let mut via = Cri::connect(&sock).await;
            let name = unique(&format!("hook-{mode}"));
            let cgp = tb.cgroup_parent(&name);
            let cfg = pod_config(&name, &cgp);
            let pod = via.run_pod(&cfg).await.expect("RunPodSandbox has no hook");
            let created = via
                .create(
                    &pod,
                    &cfg,
                    container_config("app", SLEEP_LOOP, Some(res(128))),
                )
                .await;
            let in_runtime = Cri::connect(&tb.sock)
                .await
                .rt
                .list_containers(cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        pod_sandbox_id: pod.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .containers;
            match policy {
                FailurePolicy::FailOpen => {
                    let ctr = created.unwrap_or_else(|e| {
                        panic!("{mode}/fail-open: CreateContainer failed: {e:?}")
                    });
                    via.start(&ctr).await.unwrap_or_else(|e| {
                        panic!("{mode}/fail-open: StartContainer failed: {e:?}")
                    });
                    assert_eq!(
                        via.status(&ctr).await.unwrap().state,
                        cri::ContainerState::ContainerRunning as i32
                    );
                    assert_eq!(in_runtime.len(), 1);
                }
                FailurePolicy::FailClosed => {
                    let e = created.expect_err("fail-closed hook must fail the call");
                    let want = if mode == "timeout" {
                        tonic::Code::DeadlineExceeded
                    } else {
                        tonic::Code::Internal
                    };
                    assert_eq!(e.code(), want, "{mode}: {e:?}");
                    assert!(
                        e.message().contains(mode) && e.message().contains("CreateContainer"),
                        "{}",
                        e.message()
                    );
                    assert!(
                        in_runtime.is_empty(),
                        "{mode}: the refused call never reached containerd"
                    );
                }
            }
            let c = running
                .stats
                .calls_refused
                .load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(
                c,
                if policy == FailurePolicy::FailClosed {
                    1
                } else {
                    0
                }
            );
            via.remove_pod(&pod).await;
            testbed::remove_cgroup_dirs(&cgp);
            running.shutdown().await;
        }
    }
}

/// Admission: refuses RunPodSandbox for pods of one namespace with a status
/// of its own (what eviction's admission under pressure will do).
struct Admission;

/// What the refusing hook answers: non-ASCII and `%` on purpose (gRPC
/// percent-encodes `grpc-message`; it must arrive as sent).
const REFUSAL: &str = "qoslet: node under memory pressure — BE pod not admitted (92% used ≥ 90%)";

impl Hook for Admission {
    fn name(&self) -> &str {
        "admission"
    }
    fn handles(&self, p: HookPoint, s: Stage) -> bool {
        (p, s) == (HookPoint::RunPodSandbox, Stage::Before)
    }
    fn before(&self, _: HookContext, req: Arc<CriRequest>) -> BoxFuture<Result<Verdict, BoxError>> {
        let refuse = matches!(&*req, CriRequest::RunPodSandbox(r)
            if r.config.as_ref().and_then(|c| c.metadata.as_ref()).is_some_and(|m| m.namespace == "full"));
        Box::pin(async move {
            Ok(if refuse {
                Verdict::Refuse(Refusal::new(tonic::Code::ResourceExhausted, REFUSAL))
            } else {
                Verdict::Pass
            })
        })
    }
}

/// Issue 28 item 4: a hook's refusal is an outcome, not a failure. Under
/// either failure policy the refused RunPodSandbox never reaches containerd,
/// a gRPC C-core client (grpcio) gets the hook's code and message exactly as
/// sent, it is counted as a refusal (not as a hook failure or a refused
/// call), and a pod the hook admits runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_refusal_reaches_a_grpcio_client_as_sent() {
    use prost::Message;
    let tb = Testbed::main();
    for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
        let dir = scratch("refusal");
        let pipeline = Pipeline::with_hooks(vec![(
            Arc::new(Admission) as Arc<dyn Hook>,
            HookSettings {
                timeout: Duration::from_secs(2),
                policy,
            },
        )]);
        let (running, sock, admin) = start_proxy(&dir, &tb.sock, pipeline).await;
        let name = unique("refused");
        let cgp = tb.cgroup_parent(&name);
        let mut cfg = pod_config(&name, &cgp);
        cfg.metadata.as_mut().unwrap().namespace = "full".into();
        let body = cri::RunPodSandboxRequest {
            config: Some(cfg),
            ..Default::default()
        }
        .encode_to_vec();
        let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
        let o = testbed::python_peer("status_peer.py")
            .arg(&sock)
            .arg("/runtime.v1.RuntimeService/RunPodSandbox")
            .arg(hex)
            .output()
            .expect("python3");
        assert!(
            o.status.success(),
            "status_peer failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(got["code"], "RESOURCE_EXHAUSTED", "{policy:?}: {got}");
        assert_eq!(got["details"], REFUSAL, "{policy:?}: the message as sent");
        let mut direct = Cri::connect(&tb.sock).await;
        let sandboxes = direct
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
        assert!(
            sandboxes
                .iter()
                .all(|s| s.metadata.as_ref().is_none_or(|m| m.name != name)),
            "{policy:?}: the refused pod never reached containerd"
        );
        // a pod the hook admits runs through the same proxy
        let mut via = Cri::connect(&sock).await;
        let admitted = unique("admitted");
        let acgp = tb.cgroup_parent(&admitted);
        // (a namespace of its own: the other tests here count the pods of qoslet-e2e)
        let mut acfg = pod_config(&admitted, &acgp);
        acfg.metadata.as_mut().unwrap().namespace = "qoslet-admitted".into();
        let pod = via.run_pod(&acfg).await.expect("an admitted pod runs");
        let c = AdminClient::new(channel(&admin).await)
            .get_status(qoslet_proto::admin::GetStatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .counters
            .unwrap();
        assert_eq!(
            (c.hook_refusals, c.hook_errors, c.calls_refused),
            (1, 0, 0),
            "{policy:?}: a refusal, not a failure"
        );
        via.remove_pod(&pod).await;
        testbed::remove_cgroup_dirs(&acgp);
        testbed::remove_cgroup_dirs(&cgp);
        running.shutdown().await;
    }
}
