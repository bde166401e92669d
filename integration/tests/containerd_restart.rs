//! containerd killed and restarted under a running qoslet: calls during the
//! outage fail with UNAVAILABLE, an open event stream ends, and everything
//! works again afterwards without restarting qoslet. Uses a private containerd
//! 1.7 instance ("restart") so other tests are not disturbed.

use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{Cri, Testbed};
use qoslet_integration::{eventually, scratch};
use tokio_stream::StreamExt;

// multi-threaded: the test blocks a thread while waiting for processes, and the
// client connections must keep answering HTTP/2 pings meanwhile
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_containerd_killed_and_restarted_under_qoslet() {
    let tb = Testbed::start_instance("restart", "1.7");
    let dir = scratch("restart");
    let mut q = QosletProcess::start(&dir, &tb.sock);
    let pid = q.pid();
    let mut via = Cri::lazy(&q.sock);
    via.rt
        .version(cri::VersionRequest::default())
        .await
        .expect("Version before the outage");

    let mut client = via.rt.clone();
    let stream = tokio::spawn(async move {
        let mut s = match client.get_container_events(cri::GetEventsRequest {}).await {
            Ok(s) => s.into_inner(),
            Err(e) => return e.code(),
        };
        loop {
            match s.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return e.code(),
                None => return tonic::Code::Ok,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // kill containerd hard
    let ctd = tb.containerd_pid().expect("containerd pid");
    qoslet_integration::process::signal(ctd, libc::SIGKILL);
    tb.stop_containerd(); // waits until it is gone and clears the pid file
    let err = via
        .rt
        .version(cri::VersionRequest::default())
        .await
        .expect_err("Version during the outage");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("unavailable"), "{}", err.message());
    let list = via
        .rt
        .list_containers(cri::ListContainersRequest::default())
        .await
        .expect_err("ListContainers during the outage");
    assert_eq!(list.code(), tonic::Code::Unavailable);
    let code = tokio::time::timeout(Duration::from_secs(10), stream)
        .await
        .expect("event stream ended with the runtime")
        .unwrap();
    assert_eq!(
        code,
        tonic::Code::Unavailable,
        "the stream ends with UNAVAILABLE, as direct from a dying containerd"
    );

    // containerd comes back: qoslet serves again, same process
    tb.start_containerd();
    let v = eventually(
        "Version through qoslet after restart",
        Duration::from_secs(10),
        || {
            let mut rt = via.rt.clone();
            async move { rt.version(cri::VersionRequest::default()).await.ok() }
        },
    )
    .await;
    assert_eq!(v.into_inner().runtime_name, "containerd");
    assert_eq!(q.pid(), pid);
    assert!(
        q.child.try_wait().unwrap().is_none(),
        "qoslet still running"
    );
    let status = q.sigterm(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{}", q.log_text());
    tb.down();
}
