//! GetContainerEvents streams through qoslet (real containerd 1.7, which
//! implements it; needs `CONTAINERD=1.7 INSTANCE=ctd17 testbed.sh up`).

use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{self, container_config, pod_config, Cri, Testbed, SLEEP_LOOP};
use qoslet_integration::{scratch, unique};
use tokio_stream::StreamExt;

/// containerd 1.7 hands each event to one subscriber only: tests that each
/// open a stream on the same instance run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Events =
    tokio::sync::mpsc::UnboundedReceiver<Result<cri::ContainerEventResponse, tonic::Status>>;

/// Returns once containerd has registered the stream's subscriber: it sends
/// no headers before the first event, so the stream cannot say so itself.
/// A throwaway pod (a sandbox and a container created in it) until one of
/// their events arrives; other containers' events are the tests' to filter.
async fn until_subscribed(via: &mut Cri, tb: &Testbed, events: &mut Events) {
    for _ in 0..10 {
        let name = unique("sentinel");
        let cgp = tb.cgroup_parent(&name);
        let cfg = pod_config(&name, &cgp);
        let pod = via.run_pod(&cfg).await.unwrap();
        let ctr = via
            .create(&pod, &cfg, container_config("sentinel", SLEEP_LOOP, None))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let mut arrived = false;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.recv()).await {
            if ev.is_ok_and(|e| e.container_id == ctr || e.container_id == pod) {
                arrived = true;
                break;
            }
        }
        via.remove_pod(&pod).await;
        testbed::remove_cgroup_dirs(&cgp);
        if arrived {
            return;
        }
    }
    panic!("no event for ten sandboxes: the stream is not subscribed");
}

#[tokio::test]
async fn real_containerd17_container_events_stream_through_qoslet() {
    let _serial = SERIAL.lock().await;
    let tb = Testbed::ctd17();
    let dir = scratch("events");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    // containerd sends the response headers with the first event, so the call runs in its own task
    // (as in kubelet, whose client does not wait for headers)
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut client = via.rt.clone();
    let stream_task = tokio::spawn(async move {
        let mut s = client
            .get_container_events(cri::GetEventsRequest {})
            .await
            .expect("GetContainerEvents through qoslet")
            .into_inner();
        while let Some(ev) = s.next().await {
            if tx.send(ev).is_err() {
                return; // the test dropped the receiver: end the stream from the client side
            }
        }
    });
    until_subscribed(&mut via, &tb, &mut events).await;

    let name = unique("events");
    let cgp = tb.cgroup_parent(&name);
    let pod_cfg = pod_config(&name, &cgp);
    let pod = via.run_pod(&pod_cfg).await.unwrap();
    let ctr = via
        .create(&pod, &pod_cfg, container_config("work", SLEEP_LOOP, None))
        .await
        .unwrap();
    via.start(&ctr).await.unwrap();
    via.rt
        .stop_container(cri::StopContainerRequest {
            container_id: ctr.clone(),
            timeout: 5,
        })
        .await
        .unwrap();
    via.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: ctr.clone(),
        })
        .await
        .unwrap();

    let mut seen = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !seen.contains(&cri::ContainerEventType::ContainerDeletedEvent) {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("events for {ctr} so far: {seen:?}"))
            .expect("stream open")
            .expect("event");
        if ev.container_id == ctr {
            seen.push(cri::ContainerEventType::try_from(ev.container_event_type).unwrap());
        }
    }
    use cri::ContainerEventType::*;
    for want in [
        ContainerCreatedEvent,
        ContainerStartedEvent,
        ContainerStoppedEvent,
        ContainerDeletedEvent,
    ] {
        assert!(seen.contains(&want), "missing {want:?} in {seen:?}");
    }
    let pos = |e| seen.iter().position(|x| *x == e).unwrap();
    assert!(
        pos(ContainerCreatedEvent) < pos(ContainerStartedEvent)
            && pos(ContainerStartedEvent) < pos(ContainerStoppedEvent)
    );
    drop(events);
    // the client ends the stream; qoslet must not hold anything for it
    stream_task.abort();
    let _ = stream_task.await;
    via.remove_pod(&pod).await;
    testbed::remove_cgroup_dirs(&cgp);
    // qoslet still serves after the client went away
    via.rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
}

/// Issue 15 item 5: the events kubelet's evented PLEG streams through qoslet
/// are observed, so a container that exits behind kubelet's back (here:
/// stopped directly on containerd) is `exited` in qoslet's store at once, not
/// at the next resync a minute later. (qoslet opens no stream of its own:
/// containerd 1.7 gives each event to one subscriber only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_containerd17_container_exit_reaches_the_store_at_once() {
    use qoslet_proto::admin::{admin_client::AdminClient, ListPodsRequest};
    let _serial = SERIAL.lock().await;
    let tb = Testbed::ctd17();
    let dir = scratch("events-store");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    let mut direct = Cri::connect(&tb.sock).await;
    let name = unique("exit");
    let cgp = tb.cgroup_parent(&name);
    let pod_cfg = pod_config(&name, &cgp);
    let pod = via.run_pod(&pod_cfg).await.unwrap();
    let ctr = via
        .create(&pod, &pod_cfg, container_config("work", SLEEP_LOOP, None))
        .await
        .unwrap();
    via.start(&ctr).await.unwrap();
    // kubelet's evented PLEG: a stream through qoslet, drained
    let mut client = via.rt.clone();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let pleg = tokio::spawn(async move {
        let mut s = client
            .get_container_events(cri::GetEventsRequest {})
            .await
            .expect("GetContainerEvents through qoslet")
            .into_inner();
        while let Some(ev) = s.next().await {
            // (kept draining once the test stops reading)
            let _ = tx.send(ev);
        }
    });
    until_subscribed(&mut via, &tb, &mut events).await;
    let state = |admin: std::path::PathBuf, ctr: String| async move {
        AdminClient::new(qoslet_integration::channel(&admin).await)
            .list_pods(ListPodsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .pods
            .into_iter()
            .flat_map(|p| p.containers)
            .find(|c| c.id == ctr)
            .map(|c| c.state)
    };
    assert_eq!(
        state(q.admin.clone(), ctr.clone()).await.as_deref(),
        Some("running")
    );
    direct
        .rt
        .stop_container(cri::StopContainerRequest {
            container_id: ctr.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    qoslet_integration::eventually(
        "the exit in qoslet's store (resync is a minute away)",
        Duration::from_secs(5),
        || {
            let (a, c) = (q.admin.clone(), ctr.clone());
            async move { (state(a, c).await.as_deref() == Some("exited")).then_some(()) }
        },
    )
    .await;
    // and a sandbox stopped behind kubelet's back
    direct
        .rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    qoslet_integration::eventually(
        "the pod not ready in the store",
        Duration::from_secs(5),
        || {
            let admin = q.admin.clone();
            let pod = pod.clone();
            async move {
                let pods = AdminClient::new(qoslet_integration::channel(&admin).await)
                    .list_pods(ListPodsRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .pods;
                pods.iter()
                    .any(|p| p.id == pod && p.state != "ready")
                    .then_some(())
            }
        },
    )
    .await;
    pleg.abort();
    via.remove_pod(&pod).await;
    testbed::remove_cgroup_dirs(&cgp);
}
