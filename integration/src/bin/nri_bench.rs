//! qoslet's NRI benchmarks.
//!
//! In process (anywhere): the plugin with the real NRI front end (store +
//! isolation decisions, no cgroup writes) behind a socket pair, driven by a
//! runtime side that frames as the runtime does: CreateContainer round trip
//! (p50/p99) and the Synchronize of 1,000 containers (target < 100 ms; the
//! runtime gives the whole Synchronize 2 s).
//!
//! With the test bed's containerd 1.7 up (`CONTAINERD=1.7 INSTANCE=ctd17
//! integration/testbed/testbed.sh up`): CRI Version and a pod lifecycle
//! straight to containerd, with `qoslet nri` registered vs not, in
//! alternating blocks of one run (target 1.00x: the plugin is on no CRI
//! call's path).
//!
//!   cargo build --release --workspace --bins && target/release/nri_bench [--quick]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{container_config, pod_config, Cri, Testbed, SLEEP_LOOP};
use qoslet_integration::{scratch, unique};
use qoslet_nri::mux::{Conn, Demux};
use qoslet_nri::ttrpc::{self as tt, Deframer, Inbound};
use qoslet_nri::{api, Options, Plugin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SPEC: &str = r#"{"containers":{"batch":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The runtime's side of a socket pair.
struct Runtime {
    io: UnixStream,
    demux: Demux,
    d: [Deframer; 2],
    next: u32,
}

impl Runtime {
    async fn send(&mut self, conn: Conn, stream: u32, kind: u8, body: &[u8]) {
        let m = tt::encode(stream, kind, 0, body).unwrap();
        // the runtime's writer sends a message as one frame
        let mut f = conn.id().to_be_bytes().to_vec();
        f.extend_from_slice(&(m.len() as u32).to_be_bytes());
        f.extend_from_slice(&m);
        self.io.write_all(&f).await.unwrap();
    }

    async fn recv(&mut self) -> (Conn, tt::Frame) {
        let mut buf = vec![0u8; 65536];
        loop {
            while let Some((c, piece)) = self.demux.next_piece().unwrap() {
                self.d[(c.id() - 1) as usize].push(&piece);
            }
            for c in [Conn::Plugin, Conn::Runtime] {
                if let Some(Inbound::Message(f)) = self.d[(c.id() - 1) as usize].next_message() {
                    return (c, f);
                }
            }
            let n = self.io.read(&mut buf).await.unwrap();
            assert!(n > 0, "plugin closed");
            self.demux.push(&buf[..n]);
        }
    }

    async fn call(&mut self, method: &str, payload: Vec<u8>) -> Bytes {
        let stream = self.next;
        self.next += 2;
        let req = tt::request(
            "nri.pkg.api.v1alpha1.Plugin",
            method,
            payload,
            2_000_000_000,
        );
        self.send(Conn::Plugin, stream, tt::REQUEST, &req).await;
        let (c, f) = self.recv().await;
        assert_eq!((c, f.stream), (Conn::Plugin, stream));
        tt::read_response(&f.payload).expect("answered")
    }

    /// Connects a fresh plugin (new store) and registers it.
    async fn start() -> Runtime {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let store = qoslet_state::store::Store::new();
        let iso = qoslet_isolation::Isolation::new(
            None,
            None,
            serde_json::from_str(r#"{"beClass":{"cpuQOS":{"enable":true}}}"#).unwrap(),
            Default::default(),
            Default::default(),
            Default::default(),
        );
        let handler = Arc::new(qoslet_nri_front::NriHandler::new(
            store,
            Some(Arc::new(iso)),
        ));
        let opts = Options::new("bench", "10", qoslet_nri_front::events()).unwrap();
        let plugin = Arc::new(Plugin::new(opts, handler));
        tokio::spawn(async move { plugin.serve(ours).await });
        let mut rt = Runtime {
            io: theirs,
            demux: Demux::new(),
            d: [Deframer::new(), Deframer::new()],
            next: 1,
        };
        let (c, f) = rt.recv().await;
        assert_eq!(c, Conn::Runtime);
        let ok = tt::response(Ok(vec![]));
        rt.send(Conn::Runtime, f.stream, tt::RESPONSE, &ok).await;
        rt.call(
            "Configure",
            api::ConfigureRequest::default().encode_to_vec(),
        )
        .await;
        rt
    }
}

fn be_pod(i: usize) -> api::PodSandbox {
    api::PodSandbox {
        id: format!("{i:064x}"),
        name: format!("batch-{i}"),
        uid: format!("uid-{i}"),
        namespace: "bench".into(),
        labels: [
            ("koordinator.sh/qosClass".to_string(), "BE".to_string()),
            ("app".to_string(), format!("batch-{i}")),
        ]
        .into(),
        annotations: [(
            "node.koordinator.sh/extended-resource-spec".to_string(),
            SPEC.to_string(),
        )]
        .into(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: format!("/kubepods/besteffort/poduid-{i}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn be_container(pod: usize, k: usize) -> api::Container {
    api::Container {
        id: format!("{:062x}{k:02}", pod),
        pod_sandbox_id: format!("{pod:064x}"),
        name: if k == 0 {
            "batch".into()
        } else {
            format!("side{k}")
        },
        state: api::ContainerState::ContainerRunning as i32,
        labels: [(
            "io.kubernetes.container.name".to_string(),
            "batch".to_string(),
        )]
        .into(),
        linux: Some(api::LinuxContainer {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    shares: Some(api::OptionalUInt64 { value: 2 }),
                    period: Some(api::OptionalUInt64 { value: 100_000 }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn in_process(quick: bool) {
    // CreateContainer round trip: a BE container's decision and adjustment
    let mut rt = Runtime::start().await;
    let n = if quick { 500 } else { 3000 };
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let req = api::CreateContainerRequest {
            pod: Some(be_pod(i % 50)),
            container: Some(be_container(i, 0)),
        }
        .encode_to_vec();
        let t = Instant::now();
        let a = rt.call("CreateContainer", req).await;
        v.push(t.elapsed());
        if i == 0 {
            let r = api::CreateContainerResponse::decode(a).unwrap();
            assert!(
                r.adjust.and_then(|a| a.linux).is_some(),
                "a BE container is adjusted"
            );
        }
    }
    println!(
        "nri CreateContainer round trip  n={n}  p50 {:.3} ms  p99 {:.3} ms  (adjustment of a BE container, in process)",
        ms(pct(&mut v, 0.5)),
        ms(pct(&mut v, 0.99))
    );

    // Synchronize of 1,000 containers (500 pods), each round a fresh plugin
    let rounds = if quick { 3 } else { 10 };
    let mut v = vec![];
    for _ in 0..rounds {
        let mut rt = Runtime::start().await;
        let req = api::SynchronizeRequest {
            pods: (0..500).map(be_pod).collect(),
            containers: (0..500)
                .flat_map(|p| (0..2).map(move |k| be_container(p, k)))
                .collect(),
            more: false,
        };
        let bytes = req.encode_to_vec();
        let t = Instant::now();
        let a = rt.call("Synchronize", bytes).await;
        v.push(t.elapsed());
        let r = api::SynchronizeResponse::decode(a).unwrap();
        // the batch container of each pod lacks its batch settings; the
        // sidecar has no batch resources and holds what its class wants
        assert_eq!(r.update.len(), 500, "each batch container drifted");
    }
    println!(
        "nri Synchronize 1,000 containers  rounds={rounds}  median {:.1} ms  max {:.1} ms  (target < 100 ms; 500 pods, each batch container drifted: 500 updates)",
        ms(pct(&mut v, 0.5)),
        ms(pct(&mut v, 1.0))
    );
}

/// Version and a pod lifecycle straight to containerd 1.7, qoslet registered or not.
async fn on_containerd(quick: bool) {
    let work = qoslet_integration::testbed::work_dir();
    if std::os::unix::net::UnixStream::connect(work.join("ctd17/containerd.sock")).is_err() {
        // a benchmark that cannot measure what it is asked for fails, loudly
        eprintln!(
            "containerd 1.7 test bed not up (CONTAINERD=1.7 INSTANCE=ctd17 integration/testbed/testbed.sh up): \
             Version and lifecycle with/without the plugin not measured"
        );
        std::process::exit(2);
    }
    let tb = Testbed::ctd17();
    let mut direct = Cri::connect(&tb.sock).await;
    let (blocks, calls, lifecycles) = if quick { (2, 300, 2) } else { (4, 1000, 4) };
    let (mut without, mut with) = (vec![], vec![]);
    let (mut life_without, mut life_with) = (vec![], vec![]);
    for b in 0..blocks * 2 {
        let plugin = b % 2 == 1;
        let q = plugin.then(|| {
            let dir = scratch("nri-bench");
            QosletProcess::start_nri(&dir, &tb.sock, &["--log-level=warn"])
        });
        if let Some(q) = &q {
            q.wait_registered(1).await;
        }
        let (ver, life) = if plugin {
            (&mut with, &mut life_with)
        } else {
            (&mut without, &mut life_without)
        };
        for _ in 0..calls {
            let t = Instant::now();
            direct
                .rt
                .version(cri::VersionRequest::default())
                .await
                .unwrap();
            ver.push(t.elapsed());
        }
        for _ in 0..lifecycles {
            let name = unique("nb");
            let cgp = tb.cgroup_parent_in("besteffort", &name);
            let cfg = pod_config(&name, &cgp);
            let t = Instant::now();
            let pod = direct.run_pod(&cfg).await.unwrap();
            let c = direct
                .create(&pod, &cfg, container_config("app", SLEEP_LOOP, None))
                .await
                .unwrap();
            direct.start(&c).await.unwrap();
            direct.remove_pod(&pod).await;
            life.push(t.elapsed());
            qoslet_integration::testbed::remove_cgroup_dirs(&cgp);
        }
        drop(q);
    }
    let (w50, p50) = (pct(&mut without, 0.5), pct(&mut with, 0.5));
    let (w99, p99) = (pct(&mut without, 0.99), pct(&mut with, 0.99));
    println!(
        "CRI Version on containerd 1.7  n={}  without plugin p50 {:.1} us p99 {:.1} us | with qoslet nri p50 {:.1} us p99 {:.1} us | ratio p50 {:.3}x p99 {:.3}x  (target 1.00x)",
        without.len(),
        ms(w50) * 1e3,
        ms(w99) * 1e3,
        ms(p50) * 1e3,
        ms(p99) * 1e3,
        ms(p50) / ms(w50),
        ms(p99) / ms(w99)
    );
    let (l0, l1) = (pct(&mut life_without, 0.5), pct(&mut life_with, 0.5));
    println!(
        "pod lifecycle on containerd 1.7  n={}  without plugin p50 {:.0} ms | with qoslet nri p50 {:.0} ms | ratio {:.3}x",
        life_without.len(),
        ms(l0),
        ms(l1),
        ms(l1) / ms(l0)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    in_process(quick).await;
    on_containerd(quick).await;
}
