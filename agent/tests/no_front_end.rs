//! The agent core runs with no CRI listener and no front end: its admin API
//! answers, metrics collect and the QoS engine ticks over the store, and
//! `finish` stops them all and leaves the metrics snapshot and the checkpoint
//! in the state dir. What NRI mode and a cluster-only agent start from.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use qoslet_agent::{Agent, AgentConfig, EngineLoop, Loops};
use qoslet_proto::admin::admin_client::AdminClient;
use qoslet_proto::admin::{GetPlanRequest, GetStatusRequest, NodeSummaryRequest};
use qoslet_qos_engine::policy::{CpuSuppressPolicy, ResourceThresholdStrategy};
use qoslet_qos_engine::runner::{CpuManager, Settings};
use qoslet_qos_engine::source::PolicyConfig;
use qoslet_qos_engine::synth;
use tonic::transport::{Channel, Endpoint, Uri};

async fn admin(sock: std::path::PathBuf) -> AdminClient<Channel> {
    let ch = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = sock.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .expect("the admin socket");
    AdminClient::new(ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_metrics_and_the_engine_with_no_front_end() {
    let d = qoslet_cgroups::testing::tree::<&str, &str>("agent-alone", &[]);
    let cg_root = d.join("cg");
    let shape = synth::Shape {
        ls_pods: 1,
        be_pods: 1,
        containers_per_pod: 1,
        ls_limit_cores: 1.0,
        cpus: 2,
    };
    synth::build(&cg_root, &shape).unwrap();
    let host = qoslet_cgroups::Host::detect(&cg_root).unwrap();
    let cgroups = qoslet_cgroups::Cgroups::new(host.clone());
    let state = d.join("state");
    let sock = d.join("admin.sock");
    let policy = PolicyConfig {
        resource_used_threshold_with_be: ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
            ..Default::default()
        },
        ..Default::default()
    };
    let agent = Agent::start(AgentConfig {
        admin_listen: format!("unix://{}", sock.display()),
        state_dir: state.clone(),
        lock_wait: Duration::from_secs(1),
        policy: Some(policy),
        ..AgentConfig::default()
    })
    .await
    .unwrap();
    agent.serve_admin();
    let snapshot = state.join("metrics.snapshot");
    agent
        .start_loops(Loops {
            metrics: Some(qoslet_metrics::service::Settings {
                interval: Duration::from_secs(1),
                listen: None,
                snapshot: Some(snapshot.clone()),
                proc_root: "/proc".into(),
                sys_root: "/sys".into(),
                pod_root: Default::default(),
                max_series: 1000,
            }),
            tree: Some(host),
            engine: Some(EngineLoop {
                settings: Settings {
                    interval: Duration::from_secs(1),
                    dry_run: true,
                    be_parent: Some(synth::be_parent()),
                    reserved: Default::default(),
                    verify_every: 10,
                    sys_root: "/sys".into(),
                    trust: Default::default(),
                    pod_root: Default::default(),
                    proc_root: "/proc".into(),
                    restore_on_exit: false,
                    cpu_manager: CpuManager::None,
                },
                cgroups: Some(cgroups),
                resctrl: None,
                node: Default::default(),
            }),
        })
        .await
        .unwrap();

    let mut c = admin(sock.clone()).await;
    let status = c
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.mode, "none", "no front end attached");
    assert!(
        status.listen.is_empty() && status.backend.is_none(),
        "{status:?}"
    );
    // the first metrics tick, then the engine's first plan from it
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let (summary, plan) = loop {
        let s = c
            .node_summary(NodeSummaryRequest {})
            .await
            .map(|r| r.into_inner());
        let p = c
            .get_plan(GetPlanRequest::default())
            .await
            .map(|r| r.into_inner());
        match (s, p) {
            (Ok(s), Ok(p)) if s.timestamp > 0 && p.tick > 0 => break (s, p),
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "no tick in 15 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(summary.cpu_capacity_cores > 0.0, "{summary:?}");
    assert!(
        plan.dry_run && plan.suppress_policy == "cfsQuota",
        "{plan:?}"
    );

    let lock = agent.finish().await;
    assert!(lock.is_some(), "the state dir was the agent's");
    assert!(
        snapshot.exists(),
        "the metrics loop stopped and wrote its snapshot"
    );
    assert!(
        tokio::net::UnixStream::connect(&sock).await.is_err(),
        "the admin API stopped"
    );
    drop(lock);
    let _ = std::fs::remove_dir_all(&d);
}
