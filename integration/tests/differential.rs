//! The differential test of the data plane (issue 27): the same hostile
//! requests, from clients that are not Rust's (gRPC C-core and the Python `h2`
//! library, `integration/peers/diff_peer.py`), sent to the real containerd 1.6
//! directly and through a real qoslet process, case by case: header blocks
//! from 100 KiB to 15 MiB both ways, trailers that large from the runtime,
//! streams the runtime resets, malformed and missing metadata. Each case must
//! end the same way both ways, and a 2 s ExecSync in flight on the same
//! connection must survive it both ways.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{
    self, container_config, pod_config, Cleanup, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest};
use serde_json::Value;

/// Runs the differential peer against `sock`: its outcome per case.
fn outcomes(sock: &Path, container: &str, pod: &str) -> BTreeMap<String, Value> {
    let o = testbed::python_peer("diff_peer.py")
        .arg(sock)
        .arg(container)
        .arg(pod)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "diff_peer failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["case"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// A pod with a running container, for the ExecSync in flight.
async fn running_container(
    tb: &Testbed,
    cleanup: &mut Cleanup,
) -> (String, String, cri::PodSandboxConfig) {
    let mut direct = Cri::connect(&tb.sock).await;
    let name = unique("diff");
    let cgp = tb.cgroup_parent(&name);
    let cfg = pod_config(&name, &cgp);
    let pod = direct.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp);
    let c = direct
        .create(&pod, &cfg, container_config("app", SLEEP_LOOP, None))
        .await
        .unwrap();
    direct.start(&c).await.unwrap();
    (pod, c, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_hostile_requests_end_the_same_way_direct_and_through_qoslet() {
    let tb = Testbed::main();
    let dir = scratch("differential");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut cleanup = Cleanup::new(&tb.sock);
    let (pod, container, _) = running_container(&tb, &mut cleanup).await;
    // both ways at once: each case mostly waits (on its ExecSync, a deadline)
    let (direct, via) = std::thread::scope(|s| {
        let direct = s.spawn(|| outcomes(&tb.sock, &container, &pod));
        let via = outcomes(&q.sock, &container, &pod);
        (direct.join().expect("direct peer"), via)
    });
    assert_eq!(
        direct.keys().collect::<Vec<_>>(),
        via.keys().collect::<Vec<_>>()
    );
    assert!(direct.len() >= 30, "{direct:?}");
    let mut differ = Vec::new();
    for (case, d) in &direct {
        let v = &via[case];
        assert_eq!(
            v["exec"], true,
            "{case}: the ExecSync in flight through qoslet died: {v}"
        );
        if case.starts_with("strict-") {
            // containerd answers these; h2 resets them as RFC 9113 wants (a
            // stream error): the connection and its other calls live on
            assert_eq!(v["outcome"], "reset:1", "{case}: {v}");
            continue;
        }
        assert_eq!(d["exec"], true, "{case}: direct, the ExecSync died: {d}");
        if d["outcome"] != v["outcome"] {
            differ.push(format!("{case}: direct {d} / through qoslet {v}"));
        }
    }
    assert!(differ.is_empty(), "outcomes differ:\n{}", differ.join("\n"));
    // the facts the cases stand for, so the comparison cannot pass vacuously
    let o = |case: &str| via[case]["outcome"].as_str().unwrap().to_string();
    assert_eq!(o("trailers-status-id-15728640"), "grpc:NOT_FOUND");
    assert_eq!(o("trailers-status-id-1048576-small-limit"), "grpc:INTERNAL");
    assert_eq!(o("request-block-16k-frames-15728640"), "grpc:0");
    assert_eq!(o("reset-no-content-type"), "reset:1");
    assert_eq!(o("malformed-uppercase-name"), "reset:1");
    // issue 48: an empty body ended by an empty DATA frame is answered at once
    // (UNKNOWN), passed through, intercepted or streamed; one that ends on its
    // HEADERS waits for its deadline (grpc-go); client trailers are a stream error
    for tag in ["version", "create", "unknown"] {
        // UNKNOWN, or UNIMPLEMENTED for a service the runtime does not serve
        let want = if tag == "unknown" {
            "grpc:12"
        } else {
            "grpc:2"
        };
        assert_eq!(o(&format!("end-{tag}-empty-data")), want, "{tag}");
    }
    for tag in ["version", "create"] {
        assert_eq!(o(&format!("end-{tag}-trailers-only")), "reset:1", "{tag}");
        assert_eq!(
            o(&format!("end-{tag}-message-then-trailers")),
            "reset:1",
            "{tag}"
        );
    }
    assert_eq!(o("end-version-headers-deadline"), "grpc:4");
    assert_eq!(o("end-create-headers-deadline"), "grpc:4");
    assert_eq!(o("end-version-message-then-empty-data"), "grpc:0");
    assert_eq!(o("end-version-padded-empty-data"), "grpc:2");
    assert_eq!(o("end-version-headers-no-deadline"), "none");
    // a stream left open: a whole message is answered, part of one meets its deadline
    assert_eq!(o("open-version-message"), "grpc:0");
    for tag in ["version", "create"] {
        assert_eq!(o(&format!("open-{tag}-part-deadline")), "grpc:4", "{tag}");
        assert_eq!(
            o(&format!("open-{tag}-nothing-deadline")),
            "grpc:4",
            "{tag}"
        );
    }
    // the message kubelet's own error carries, repeated whole (1 MiB of id)
    assert_eq!(
        via["trailers-status-id-1048576"]["details_len"],
        direct["trailers-status-id-1048576"]["details_len"]
    );
    // resets are counted apart from a dead runtime
    let c = AdminClient::new(qoslet_integration::channel(&q.admin).await)
        .get_status(GetStatusRequest::default())
        .await
        .unwrap()
        .into_inner()
        .counters
        .unwrap();
    assert!(c.backend_resets >= 2, "{c:?}");
    assert_eq!(c.backend_unavailable, 0, "{c:?}");
}

/// Item 5: containerd 1.6 dies of a CreateContainer with a real sandbox and
/// `config.metadata` but no `sandbox_config.metadata`. Through qoslet it is
/// refused with INVALID_ARGUMENT and a message, and the runtime stays up for
/// every other call (an ExecSync in flight on the same connection included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_the_runtime_cannot_survive_is_refused_and_the_runtime_lives() {
    let tb = Testbed::main();
    let dir = scratch("differential-crash");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut cleanup = Cleanup::new(&tb.sock);
    let (pod, container, _) = running_container(&tb, &mut cleanup).await;
    let pid = tb.containerd_pid().expect("containerd runs");
    let mut via = Cri::connect(&q.sock).await;
    let exec = {
        let mut via = via.clone();
        let container = container.clone();
        tokio::spawn(async move {
            via.rt
                .exec_sync(cri::ExecSyncRequest {
                    container_id: container,
                    cmd: vec!["sleep".into(), "2".into()],
                    timeout: 10,
                })
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for sandbox_config in [None, Some(cri::PodSandboxConfig::default())] {
        let err = via
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(container_config("crash", SLEEP_LOOP, None)),
                sandbox_config,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("sandbox_config.metadata"),
            "{}",
            err.message()
        );
    }
    let e = exec.await.unwrap().unwrap().into_inner();
    assert_eq!(e.exit_code, 0);
    assert_eq!(tb.containerd_pid(), Some(pid), "containerd restarted");
    Cri::connect(&tb.sock)
        .await
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
}

/// Issue 48: a call the runtime never answers (no body, END_STREAM on its
/// HEADERS, no deadline: grpc-go waits for ever) is held through qoslet as it
/// is direct, and released when its client gives up (RST_STREAM): nothing of
/// it stays in flight, and the connection serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_client_gives_up_on_is_not_left_in_flight() {
    use bytes::Bytes;
    use qoslet_integration::raw::{frame, RawClient};
    use std::time::Duration;
    let tb = Testbed::main();
    let dir = scratch("differential-give-up");
    let q = QosletProcess::start(&dir, &tb.sock);
    let raw = RawClient::connect(&q.sock).await.unwrap();
    let mut admin = AdminClient::new(qoslet_integration::channel(&q.admin).await);
    let mut in_flight = async || {
        admin
            .get_status(GetStatusRequest::default())
            .await
            .unwrap()
            .into_inner()
            .counters
            .unwrap()
            .calls_in_flight
    };
    const VERSION: &str = "/runtime.v1.RuntimeService/Version";
    let held = {
        let mut raw = raw.clone();
        // an empty body: hyper ends the stream on the HEADERS
        tokio::spawn(async move { raw.call(VERSION, &[], Bytes::new()).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!held.is_finished(), "answered: {:?}", held.await);
    assert_eq!(in_flight().await, 1, "the held call is in flight");
    // the client gives up: its stream is reset (the call's future dropped)
    held.abort();
    let mut left = 1;
    for _ in 0..50 {
        left = in_flight().await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "the given-up call is still in flight after 5 s");
    let r = raw.clone().call(VERSION, &[], frame(&[])).await.unwrap();
    assert_eq!(r.grpc_status().map(|s| s.0), Some(0), "{r:?}");
}
