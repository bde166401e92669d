//! The plugin against a mock runtime written here: its own frame packing and
//! reading (not the crate's), a Go-like writer that sends frames of any size,
//! and a reader that fails, as Go's does, on any frame over 4096 bytes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use qoslet_nri::api;
use qoslet_nri::{Event, EventMask, Handler, Options, Plugin, Refusal, StateChange};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const REQ: u8 = 1;
const RESP: u8 = 2;

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
}

impl Handler for Recorder {
    fn configure(&self, rt: &qoslet_nri::RuntimeInfo) -> Result<(), Refusal> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("configure {} {}", rt.name, rt.version));
        Ok(())
    }
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, Refusal> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("sync {} {}", pods.len(), containers.len()));
        // one update, for the last container
        Ok(containers
            .last()
            .map(|c| api::ContainerUpdate {
                container_id: c.id.clone(),
                ..Default::default()
            })
            .into_iter()
            .collect())
    }
    fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Refusal> {
        let name = req.container.unwrap_or_default().name;
        self.seen.lock().unwrap().push(format!("create {name}"));
        match name.as_str() {
            "refused" => Err(Refusal::with_code(8, "node under memory pressure")),
            "slow" => {
                std::thread::sleep(Duration::from_millis(1500));
                self.seen.lock().unwrap().push("created slow".into());
                Ok(shares(7))
            }
            "panics" => panic!("handler bug"),
            _ => Ok(shares(2)),
        }
    }
    fn create_abandoned(&self, id: &str) {
        self.seen.lock().unwrap().push(format!("abandoned {id}"));
    }
    fn state_change(&self, c: StateChange) -> Result<(), Refusal> {
        self.seen.lock().unwrap().push(format!(
            "event {:?} {}",
            c.event,
            c.container.map(|c| c.name).unwrap_or_default()
        ));
        Ok(())
    }
}

fn shares(n: u64) -> api::CreateContainerResponse {
    api::CreateContainerResponse {
        adjust: Some(api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: n }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The runtime's end: frames written in random sizes, frames read checked.
struct Mock {
    io: UnixStream,
    rng: fastrand::Rng,
    bufs: [Vec<u8>; 2],
    next: u32,
    /// the largest frame the plugin sent
    largest: usize,
}

impl Mock {
    fn new(io: UnixStream, seed: u64) -> Mock {
        Mock {
            io,
            rng: fastrand::Rng::with_seed(seed),
            bufs: [vec![], vec![]],
            next: 1,
            largest: 0,
        }
    }

    async fn send(&mut self, conn: u32, stream: u32, kind: u8, payload: &[u8]) {
        let mut msg = (payload.len() as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&stream.to_be_bytes());
        msg.extend_from_slice(&[kind, 0]);
        msg.extend_from_slice(payload);
        // the runtime's writer: frames of any size, written in any pieces
        let mut wire = vec![];
        let mut rest = &msg[..];
        while !rest.is_empty() {
            let n = self.rng.usize(1..=rest.len().min(20_000));
            wire.extend_from_slice(&conn.to_be_bytes());
            wire.extend_from_slice(&(n as u32).to_be_bytes());
            wire.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let n = self.rng.usize(1..=rest.len());
            self.io.write_all(&rest[..n]).await.unwrap();
            rest = &rest[n..];
        }
    }

    /// The next whole message from the plugin: (conn, stream, kind, payload).
    async fn recv(&mut self) -> (u32, u32, u8, Vec<u8>) {
        loop {
            for c in 0..2 {
                let b = &mut self.bufs[c];
                if b.len() >= 10 {
                    let len = u32::from_be_bytes(b[0..4].try_into().unwrap()) as usize;
                    if b.len() >= 10 + len {
                        let stream = u32::from_be_bytes(b[4..8].try_into().unwrap());
                        let kind = b[8];
                        let payload = b[10..10 + len].to_vec();
                        b.drain(..10 + len);
                        return (c as u32 + 1, stream, kind, payload);
                    }
                }
            }
            let mut head = [0u8; 8];
            self.io.read_exact(&mut head).await.unwrap();
            let conn = u32::from_be_bytes(head[0..4].try_into().unwrap());
            let len = u32::from_be_bytes(head[4..8].try_into().unwrap()) as usize;
            assert!(
                len + 8 <= 4096,
                "a frame of {} bytes: Go's reader fails on it",
                len + 8
            );
            assert!(conn == 1 || conn == 2, "frame for connection {conn}");
            self.largest = self.largest.max(len + 8);
            let mut body = vec![0u8; len];
            self.io.read_exact(&mut body).await.unwrap();
            self.bufs[conn as usize - 1].extend_from_slice(&body);
        }
    }

    /// Calls the plugin's `method` and reads its answer.
    async fn call(&mut self, method: &str, payload: Vec<u8>) -> Result<Vec<u8>, (i32, String)> {
        let stream = self.next;
        self.next += 2;
        let req = qoslet_proto::ttrpc::Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: method.into(),
            payload,
            timeout_nano: 2_000_000_000,
            metadata: vec![],
        };
        self.send(1, stream, REQ, &req.encode_to_vec()).await;
        let (conn, s, kind, body) = self.recv().await;
        assert_eq!((conn, s, kind), (1, stream, RESP), "unexpected message");
        let r = qoslet_proto::ttrpc::Response::decode(&body[..]).unwrap();
        match r.status {
            Some(st) if st.code != 0 => Err((st.code, st.message)),
            _ => Ok(r.payload),
        }
    }

    /// Reads the plugin's next request on connection 2.
    async fn expect_request(&mut self, method: &str) -> (u32, Vec<u8>) {
        let (conn, s, kind, body) = self.recv().await;
        assert_eq!((conn, kind), (2, REQ));
        assert_eq!(s % 2, 1, "client streams are odd");
        let r = qoslet_proto::ttrpc::Request::decode(&body[..]).unwrap();
        assert_eq!(r.service, "nri.pkg.api.v1alpha1.Runtime");
        assert_eq!(r.method, method);
        (s, r.payload)
    }

    async fn reply(&mut self, stream: u32, payload: Vec<u8>) {
        let r = qoslet_proto::ttrpc::Response {
            status: None,
            payload,
        };
        self.send(2, stream, RESP, &r.encode_to_vec()).await;
    }
}

fn options() -> Options {
    let events = EventMask::of(&[
        Event::RunPodSandbox,
        Event::CreateContainer,
        Event::StartContainer,
        Event::RemoveContainer,
    ])
    .unwrap();
    let mut o = Options::new("qoslet", "10", events).unwrap();
    o.hook_timeout = Duration::from_millis(400);
    o
}

fn container(i: usize) -> api::Container {
    api::Container {
        id: format!("{i:064x}"),
        pod_sandbox_id: format!("pod-{}", i / 2),
        name: format!("c{i}"),
        state: api::ContainerState::ContainerRunning as i32,
        labels: [("io.kubernetes.container.name".to_string(), format!("c{i}"))].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_session_with_a_mock_runtime() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let handler = Arc::new(Recorder::default());
    let plugin = Arc::new(Plugin::new(options(), handler.clone()));
    let p = plugin.clone();
    let served = tokio::spawn(async move { p.serve(ours).await });
    let mut rt = Mock::new(theirs, 7);

    // RegisterPlugin comes first; Configure is served before its answer
    let (reg_stream, reg) = rt.expect_request("RegisterPlugin").await;
    let reg = api::RegisterPluginRequest::decode(&reg[..]).unwrap();
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("qoslet", "10")
    );
    let conf = api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: "v1.7.24".into(),
        request_timeout: 2000,
        ..Default::default()
    };
    let answer = rt.call("Configure", conf.encode_to_vec()).await.unwrap();
    let events = api::ConfigureResponse::decode(&answer[..]).unwrap().events;
    assert_eq!(events, 1 | 1 << 3 | 1 << 5 | 1 << 10);
    rt.reply(reg_stream, vec![]).await;

    // a split Synchronize of 1,000 containers in four parts (each over 4 KiB)
    let all: Vec<api::Container> = (0..1000).map(container).collect();
    for (i, part) in all.chunks(250).enumerate() {
        let more = i < 3;
        let req = api::SynchronizeRequest {
            pods: vec![],
            containers: part.to_vec(),
            more,
        };
        assert!(req.encoded_len() > 4096);
        let answer = rt.call("Synchronize", req.encode_to_vec()).await.unwrap();
        let answer = api::SynchronizeResponse::decode(&answer[..]).unwrap();
        if more {
            assert!(
                answer.update.is_empty() && answer.more,
                "partial: no updates, more echoed"
            );
        } else {
            assert!(!answer.more);
            assert_eq!(answer.update.len(), 1);
            assert_eq!(answer.update[0].container_id, all[999].id);
        }
    }

    // CreateContainer: the handler's adjustment arrives as it made it
    let create = |name: &str| {
        api::CreateContainerRequest {
            pod: Some(api::PodSandbox {
                id: "pod-x".into(),
                ..Default::default()
            }),
            container: Some(api::Container {
                id: format!("id-{name}"),
                name: name.into(),
                ..Default::default()
            }),
        }
        .encode_to_vec()
    };
    let answer = rt.call("CreateContainer", create("web")).await.unwrap();
    assert_eq!(
        api::CreateContainerResponse::decode(&answer[..]).unwrap(),
        shares(2)
    );
    // a refusal reaches the runtime with its code and message
    assert_eq!(
        rt.call("CreateContainer", create("refused")).await,
        Err((8, "node under memory pressure".into()))
    );
    // a slow or panicking handler is answered for with "no change"
    let answer = rt.call("CreateContainer", create("slow")).await.unwrap();
    assert_eq!(
        api::CreateContainerResponse::decode(&answer[..]).unwrap(),
        Default::default()
    );
    // handler calls run one at a time, in order: a create that could not
    // start before its deadline (the slow one still runs) is answered
    // "no change" and never runs; an event waits for the slow call
    let answer = rt.call("CreateContainer", create("queued")).await.unwrap();
    assert!(answer.is_empty());
    let ev = api::StateChangeEvent {
        event: Event::StartContainer as i32,
        pod: None,
        container: Some(api::Container {
            name: "slow".into(),
            ..Default::default()
        }),
    };
    rt.call("StateChange", ev.encode_to_vec()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    {
        let seen = handler.seen.lock().unwrap();
        let at = |x: &str| {
            seen.iter()
                .position(|s| s == x)
                .unwrap_or_else(|| panic!("{x}: {seen:?}"))
        };
        assert!(at("create slow") < at("created slow"));
        assert!(
            at("created slow") < at("abandoned id-slow"),
            "a late create is undone"
        );
        assert!(
            at("abandoned id-slow") < at("event Some(StartContainer) slow"),
            "in order"
        );
        assert!(!seen.contains(&"create queued".to_string()), "not run late");
    }
    let answer = rt.call("CreateContainer", create("panics")).await.unwrap();
    assert!(answer.is_empty());

    // StateChange (v0.6) and a per-event method (v0.12) reach the handler
    let ev = api::StateChangeEvent {
        event: Event::StartContainer as i32,
        pod: None,
        container: Some(container(3)),
    };
    assert_eq!(
        rt.call("StateChange", ev.encode_to_vec()).await.unwrap(),
        Vec::<u8>::new()
    );
    let ev = api::EventRequest {
        pod: None,
        container: Some(container(4)),
    };
    assert_eq!(
        rt.call("RemoveContainer", ev.encode_to_vec())
            .await
            .unwrap(),
        Vec::<u8>::new()
    );
    // every method is answered; an unknown one is UNIMPLEMENTED, not NOT_FOUND
    assert_eq!(rt.call("NoSuchMethod", vec![]).await.unwrap_err().0, 12);
    // an undecodable request is refused, the session lives on
    assert_eq!(
        rt.call("CreateContainer", vec![0xff]).await.unwrap_err().0,
        3
    );

    // the plugin calls UpdateContainers on connection 2
    let client = plugin.client().borrow().clone().expect("registered");
    let call = tokio::spawn(async move {
        client
            .update_containers(
                api::UpdateContainersRequest {
                    update: vec![api::ContainerUpdate {
                        container_id: "abc".into(),
                        ..Default::default()
                    }],
                    evict: vec![],
                },
                Duration::from_secs(2),
            )
            .await
    });
    let (s, body) = rt.expect_request("UpdateContainers").await;
    assert_eq!(
        api::UpdateContainersRequest::decode(&body[..])
            .unwrap()
            .update[0]
            .container_id,
        "abc"
    );
    rt.reply(
        s,
        api::UpdateContainersResponse { failed: vec![] }.encode_to_vec(),
    )
    .await;
    assert_eq!(call.await.unwrap().unwrap(), Default::default());

    let c = plugin.counters();
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(n(&c.registrations), 1);
    assert_eq!(n(&c.configures), 1);
    assert_eq!(n(&c.sync_messages), 4);
    assert_eq!(
        c.event(Event::CreateContainer),
        5,
        "the undecodable one is not an event"
    );
    assert_eq!(c.event(Event::StartContainer), 2);
    assert_eq!(c.event(Event::RemoveContainer), 1);
    assert_eq!(n(&c.adjustments), 1);
    assert_eq!(n(&c.refusals), 1);
    assert_eq!(n(&c.timeouts), 3, "slow, queued, the event behind them");
    assert_eq!(
        n(&c.errors),
        4,
        "late create undone, panic, unknown method, undecodable request"
    );
    assert_eq!(plugin.runtime_info().unwrap().version, "v1.7.24");

    // the runtime closes: the session ends, the client is gone
    drop(rt);
    assert!(served.await.unwrap().is_ok());
    assert!(plugin.client().borrow().is_none());
    let seen = handler.seen.lock().unwrap().clone();
    assert_eq!(seen[0], "configure containerd v1.7.24");
    assert_eq!(seen[1], "sync 0 1000");
    assert!(seen.contains(&"event Some(StartContainer) c3".to_string()));
    assert!(seen.contains(&"event Some(RemoveContainer) c4".to_string()));
}

#[tokio::test]
async fn garbage_from_the_runtime_ends_the_session_without_a_crash() {
    for garbage in [
        // a frame for connection 7
        b"\x00\x00\x00\x07\x00\x00\x00\x01x".to_vec(),
        // a length over the mux's limit
        b"\x00\x00\x00\x01\x7f\x00\x00\x00".to_vec(),
        // a response on the plugin's own connection
        {
            let mut m = b"\x00\x00\x00\x01\x00\x00\x00\x0a".to_vec();
            m.extend_from_slice(b"\x00\x00\x00\x00\x00\x00\x00\x01\x02\x00");
            m
        },
    ] {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let plugin = Plugin::new(options(), Arc::new(Recorder::default()));
        let run = tokio::spawn(async move {
            let r = plugin.serve(ours).await;
            (r.is_err(), plugin.last_error())
        });
        theirs.write_all(&garbage).await.unwrap();
        let (failed, why) = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .unwrap()
            .unwrap();
        assert!(failed, "{garbage:?}");
        assert!(why.is_some());
        // the plugin closed its end
        let mut rest = vec![];
        let _ = theirs.read_to_end(&mut rest).await;
    }
}

#[tokio::test]
async fn a_refused_registration_ends_the_session() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let plugin = Plugin::new(options(), Arc::new(Recorder::default()));
    let run = tokio::spawn(async move { plugin.serve(ours).await.map_err(|e| e.to_string()) });
    let mut rt = Mock::new(theirs, 3);
    let (s, _) = rt.expect_request("RegisterPlugin").await;
    let r = qoslet_proto::ttrpc::Response {
        status: Some(qoslet_proto::ttrpc::Status {
            code: 9,
            message: "plugin qoslet already registered".into(),
        }),
        payload: vec![],
    };
    rt.send(2, s, RESP, &r.encode_to_vec()).await;
    let err = run.await.unwrap().unwrap_err();
    assert!(err.contains("already registered"), "{err}");
}

#[tokio::test]
async fn the_plugin_reconnects_after_the_runtime_goes_away() {
    let dir = std::env::temp_dir().join(format!("qoslet-nri-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nri.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let plugin = Arc::new(Plugin::new(options(), Arc::new(Recorder::default())));
    let p = plugin.clone();
    let s = sock.clone();
    let backoff = qoslet_nri::Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(100),
        reset_after: Duration::from_secs(30),
    };
    let run = tokio::spawn(async move { p.run_socket(&s, backoff).await });
    for round in 0..3u64 {
        let (conn, _) = listener.accept().await.unwrap();
        let mut rt = Mock::new(conn, round);
        let (s, _) = rt.expect_request("RegisterPlugin").await;
        rt.reply(s, vec![]).await;
        let conf = api::ConfigureRequest::default();
        rt.call("Configure", conf.encode_to_vec()).await.unwrap();
        // the runtime goes away; the plugin's old connection must be closed
        // before it dials again
        let Mock { mut io, .. } = rt;
        io.shutdown().await.unwrap();
        let mut rest = vec![];
        io.read_to_end(&mut rest).await.unwrap();
    }
    let c = plugin.counters();
    assert_eq!(
        c.registrations.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert!(c.reconnects.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    run.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Synchronize the plugin cannot take (over its object or byte budget) is
/// refused and the session ends: NRI v0.6 runtimes keep a plugin whose sync
/// failed but send it no events, so only a new session synchronizes again.
#[tokio::test]
async fn a_failed_synchronize_ends_the_session() {
    for (objects, bytes) in [(10, 64 << 20), (100_000, 2 << 10)] {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut o = options();
        o.max_sync_objects = objects;
        o.max_sync_bytes = bytes;
        let plugin = Plugin::new(o, Arc::new(Recorder::default()));
        let run = tokio::spawn(async move { plugin.serve(ours).await.map_err(|e| e.to_string()) });
        let mut rt = Mock::new(theirs, 5);
        let (s, _) = rt.expect_request("RegisterPlugin").await;
        rt.reply(s, vec![]).await;
        let mut refused = None;
        for part in 0..4 {
            let req = api::SynchronizeRequest {
                pods: vec![],
                containers: (part * 8..part * 8 + 8).map(container).collect(),
                more: true,
            };
            if let Err(e) = rt.call("Synchronize", req.encode_to_vec()).await {
                refused = Some(e);
                break;
            }
        }
        let (code, msg) = refused.expect("refused once over the budget");
        assert_eq!(code, 8, "{msg}");
        let ended = tokio::time::timeout(Duration::from_secs(2), run)
            .await
            .unwrap();
        assert_eq!(ended.unwrap(), Ok(qoslet_nri::Ended::SyncFailed));
    }
}
