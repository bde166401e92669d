//! A full pod lifecycle through a real `qoslet proxy` process in front of a
//! real containerd + runc: on this host the test bed's containerd 1.6
//! (cgroupfs, cgroup v1; `testbed.sh up`), in the VM test bed's guest its
//! containerd 1.7 (systemd driver, cgroup v2; `integration/vm/suite.sh`).
//! Every answer is compared with the same call made directly to containerd,
//! and the node's cgroup files are checked.

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::registry::Registry;
use qoslet_integration::testbed::{
    self, container_config, pod_config, Cri, Knob, Testbed, BUSYBOX, SLEEP_LOOP,
};
use qoslet_integration::{channel, scratch, unique};
use qoslet_proto::admin::admin_client::AdminClient;

fn sorted_containers(mut v: Vec<cri::Container>) -> Vec<cri::Container> {
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

#[tokio::test]
async fn real_containerd_full_pod_lifecycle_through_qoslet_equals_direct() {
    let tb = Testbed::main();
    let dir = scratch("lifecycle");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    let mut direct = Cri::connect(&tb.sock).await;

    // Version, Status
    let v = via
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        v,
        direct
            .rt
            .version(cri::VersionRequest::default())
            .await
            .unwrap()
            .into_inner()
    );
    assert_eq!(v.runtime_name, "containerd");
    let s1 = via
        .rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let s2 = direct
        .rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s1.status, s2.status);

    // images: list, status, pull (from a loopback registry)
    let spec = cri::ImageSpec {
        image: BUSYBOX.into(),
        ..Default::default()
    };
    let st1 = via
        .img
        .image_status(cri::ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    let st2 = direct
        .img
        .image_status(cri::ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st1, st2);
    assert!(st1.image.is_some(), "busybox image present");
    let mut l1 = via
        .img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    let mut l2 = direct
        .img
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    l1.sort_by(|a, b| a.id.cmp(&b.id));
    l2.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(l1, l2);
    let reg = Registry::start(&tb.images_tar(), &dir).await;
    let pull_ref = reg.reference(BUSYBOX);
    let pulled = via
        .img
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: pull_ref.clone(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("PullImage through qoslet")
        .into_inner();
    assert!(pulled.image_ref.starts_with("sha256:"), "{pulled:?}");
    let pulled_status = direct
        .img
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: pull_ref.clone(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(pulled_status.image.unwrap().repo_tags.contains(&pull_ref));
    // (no RemoveImage: the pulled image shares its id with the test bed's busybox, and CRI
    // RemoveImage deletes every tag of an image)
    let fs = via
        .img
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!fs.image_filesystems.is_empty());

    // the pod
    let name = unique("life");
    let cgp = tb.cgroup_parent(&name);
    let pod_cfg = pod_config(&name, &cgp);
    let pod = via
        .run_pod(&pod_cfg)
        .await
        .expect("RunPodSandbox through qoslet");
    let res = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let ctr = via
        .create(
            &pod,
            &pod_cfg,
            container_config("work", SLEEP_LOOP, Some(res)),
        )
        .await
        .expect("CreateContainer");
    via.start(&ctr).await.expect("StartContainer");
    let status = via.status(&ctr).await.unwrap();
    assert_eq!(status.state, cri::ContainerState::ContainerRunning as i32);
    assert_eq!(
        status,
        direct.status(&ctr).await.unwrap(),
        "ContainerStatus through qoslet == direct"
    );
    let cg = tb.container_cg(&cgp, &ctr);
    assert_eq!(tb.cg(&cg, Knob::CpuShares), tb.shares_read(512));
    assert_eq!(tb.cg(&cg, Knob::CpuQuota), "50000");
    assert_eq!(tb.cg(&cg, Knob::CpuPeriod), "100000");
    assert_eq!(tb.cg(&cg, Knob::MemoryLimit), (64u64 << 20).to_string());

    // pod status and listings with filters
    let ps1 = via
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    let ps2 = direct
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ps1, ps2);
    let f = cri::PodSandboxFilter {
        id: pod.clone(),
        ..Default::default()
    };
    let lp = via
        .rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(f.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(lp.len(), 1);
    assert_eq!(
        lp,
        direct
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(f) })
            .await
            .unwrap()
            .into_inner()
            .items
    );
    let filters = [
        cri::ContainerFilter {
            id: ctr.clone(),
            ..Default::default()
        },
        cri::ContainerFilter {
            pod_sandbox_id: pod.clone(),
            ..Default::default()
        },
        cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        },
        cri::ContainerFilter {
            label_selector: HashMap::from([("container".to_string(), "work".to_string())]),
            ..Default::default()
        },
    ];
    for f in filters {
        let a = via
            .rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(f.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        let b = direct
            .rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(f.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert!(
            a.iter().any(|c| c.id == ctr),
            "filter {f:?} finds our container"
        );
        assert_eq!(sorted_containers(a), sorted_containers(b), "filter {f:?}");
    }

    // exec, attach, port-forward, stats
    let ex = |c: &str| cri::ExecSyncRequest {
        container_id: ctr.clone(),
        cmd: vec!["cat".into(), c.into()],
        timeout: 10,
    };
    let shares_file = tb.file_in_container(Knob::CpuShares);
    let e1 = via
        .rt
        .exec_sync(ex(shares_file))
        .await
        .unwrap()
        .into_inner();
    let e2 = direct
        .rt
        .exec_sync(ex(shares_file))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        String::from_utf8_lossy(&e1.stdout).trim(),
        tb.shares_read(512)
    );
    assert_eq!(e1, e2);
    let url_prefix = |u: &str| {
        u.rsplit_once('/')
            .map(|(p, _)| p.to_string())
            .unwrap_or_default()
    };
    let x = via
        .rt
        .exec(cri::ExecRequest {
            container_id: ctr.clone(),
            cmd: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let y = direct
        .rt
        .exec(cri::ExecRequest {
            container_id: ctr.clone(),
            cmd: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        x.url.starts_with("http://127.0.0.1:") && x.url.contains("/exec/"),
        "{}",
        x.url
    );
    assert_eq!(url_prefix(&x.url), url_prefix(&y.url));
    let a = via
        .rt
        .attach(cri::AttachRequest {
            container_id: ctr.clone(),
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(a.url.contains("/attach/"), "{}", a.url);
    let pf = via
        .rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.clone(),
            port: vec![8080],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(pf.url.contains("/portforward/"), "{}", pf.url);
    let cs = via
        .rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: ctr.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert_eq!(cs.attributes.unwrap().id, ctr);
    assert!(
        cs.memory
            .and_then(|m| m.working_set_bytes)
            .map(|v| v.value)
            .unwrap_or(0)
            > 0
    );
    let lcs = via
        .rt
        .list_container_stats(cri::ListContainerStatsRequest {
            filter: Some(cri::ContainerStatsFilter {
                pod_sandbox_id: pod.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(lcs.len(), 1);

    // UpdateContainerResources reaches the cgroup and the store
    via.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: ctr.clone(),
            linux: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 20_000,
                cpu_shares: 256,
                memory_limit_in_bytes: 128 << 20,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(tb.cg(&cg, Knob::CpuShares), tb.shares_read(256));
    assert_eq!(tb.cg(&cg, Knob::CpuQuota), "20000");
    assert_eq!(tb.cg(&cg, Knob::MemoryLimit), (128u64 << 20).to_string());

    // the admin API knows the pod, its cgroup parent and what kubelet asked for
    let mut admin = AdminClient::new(channel(&q.admin).await);
    let pods = admin
        .list_pods(qoslet_proto::admin::ListPodsRequest {
            namespace: "qoslet-e2e".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pods;
    let p = pods.iter().find(|p| p.id == pod).expect("pod in ListPods");
    assert_eq!(
        (p.name.as_str(), p.cgroup_parent.as_str(), p.state.as_str()),
        (name.as_str(), cgp.as_str(), "ready")
    );
    assert_eq!(p.labels.get("app"), Some(&name));
    let c = p
        .containers
        .iter()
        .find(|c| c.id == ctr)
        .expect("container in ListPods");
    assert_eq!(c.state, "running");
    let r = c.requested.clone().unwrap();
    assert_eq!(
        (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
        (256, 20_000, 128 << 20)
    );
    let st = admin
        .get_status(qoslet_proto::admin::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(st.backend.unwrap().reachable);
    assert!(st.counters.unwrap().calls_intercepted >= 4);

    // stop and remove through qoslet
    via.rt
        .stop_container(cri::StopContainerRequest {
            container_id: ctr.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        direct.status(&ctr).await.unwrap().state,
        cri::ContainerState::ContainerExited as i32
    );
    via.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: ctr.clone(),
        })
        .await
        .unwrap();
    via.rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    via.rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    let left = direct
        .rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                id: pod.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(left.is_empty());
    let pods = admin
        .list_pods(qoslet_proto::admin::ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    assert!(pods.iter().all(|p| p.id != pod), "store entry removed");
    testbed::remove_cgroup_dirs(&cgp);
    tokio::time::sleep(Duration::from_millis(1)).await;
}
