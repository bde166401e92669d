//! The agent core with no front end (no CRI listener): its admin API serves
//! the checkpointed store, says it runs alone, and the state dir is one
//! agent's at a time. No root, no runtime: a temp dir and unix sockets.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use qoslet_agent::{Agent, AgentConfig, AgentError};
use qoslet_proto::admin::{self, admin_client::AdminClient};
use qoslet_state::checkpoint::Checkpoint;
use qoslet_state::store::{ContainerRecord, PodRecord, PodState, Snapshot};
use tonic::transport::{Endpoint, Uri};

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("qoslet-agent-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn client(sock: std::path::PathBuf) -> AdminClient<tonic::transport::Channel> {
    let ch = Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = sock.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .unwrap();
    AdminClient::new(ch)
}

#[tokio::test]
async fn the_agent_serves_its_admin_api_with_no_cri_listener() {
    let dir = tmp("alone");
    let state = dir.join("state");
    let sock = dir.join("admin.sock");
    let runtime = "unix:///run/containerd/containerd.sock";
    // a checkpoint from an earlier run: the agent alone serves it
    Checkpoint::new(&state, runtime)
        .save(Snapshot {
            pods: vec![PodRecord {
                id: "p1".into(),
                name: "web".into(),
                namespace: "prod".into(),
                uid: "u-1".into(),
                state: PodState::Ready,
                ..Default::default()
            }],
            containers: vec![ContainerRecord {
                id: "c1".into(),
                pod_id: "p1".into(),
                name: "app".into(),
                ..Default::default()
            }],
        })
        .unwrap();
    let cfg = AgentConfig {
        admin_listen: format!("unix://{}", sock.display()),
        state_dir: state.clone(),
        runtime_endpoint: runtime.into(),
        lock_wait: Duration::from_millis(200),
        metrics_on: false,
        ..Default::default()
    };
    let agent = Agent::start(cfg.clone()).await.unwrap();
    assert_eq!(agent.store().counts(), (1, 1));
    // no front end will attach: the agent serves its admin API itself
    agent.serve_admin();

    let mut c = client(sock.clone()).await;
    let st = c
        .get_status(admin::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.mode, "none", "no front end attached");
    assert!(
        st.backend.is_none(),
        "no runtime is reached without a front end"
    );
    assert_eq!(st.listen, "");
    let n = st.counters.unwrap();
    assert_eq!((n.pods, n.containers, n.calls_total), (1, 1, 0));
    let pods = c
        .list_pods(admin::ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    assert_eq!(pods.len(), 1);
    assert_eq!((pods[0].uid.as_str(), pods[0].containers.len()), ("u-1", 1));
    let off = c
        .query_metrics(admin::QueryMetricsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(off.code(), tonic::Code::Unavailable);
    assert!(
        off.message().contains("metrics collection is off"),
        "{off:?}"
    );

    // one agent per state dir: a second one (on another admin socket) waits, then gives up
    let second = Agent::start(AgentConfig {
        admin_listen: format!("unix://{}", dir.join("admin2.sock").display()),
        ..cfg.clone()
    })
    .await;
    assert!(
        matches!(second, Err(AgentError::State(_))),
        "the lock is held"
    );
    // the same admin socket while this one lives: refused at once
    let same = Agent::start(cfg.clone()).await;
    assert!(
        matches!(same, Err(AgentError::Admin(_))),
        "the socket is live"
    );

    // a change while running is in the final checkpoint
    agent.store().remove_container("c1");
    let lock = agent.finish().await;
    assert!(lock.is_some());
    drop(lock);
    let saved = Checkpoint::new(&state, runtime).load().unwrap();
    assert_eq!((saved.pods.len(), saved.containers.len()), (1, 0));
    // and the next agent takes the dir
    let next = Agent::start(cfg).await.unwrap();
    assert_eq!(next.store().counts(), (1, 0));
    drop(next.finish().await);
    std::fs::remove_dir_all(&dir).unwrap();
}
