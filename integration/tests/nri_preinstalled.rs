//! `qoslet nri` started the way a runtime starts a pre-installed plugin: a
//! connected socket on fd 3, `NRI_PLUGIN_SOCKET=3`, `NRI_PLUGIN_NAME`,
//! `NRI_PLUGIN_IDX`. The runtime's end is played here (never by a real
//! containerd: one whose pre-installed plugin fails to register dies). Needs
//! no root and no containerd, only the built binary (under the testbed feature).

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use prost::Message;
use qoslet_integration::process::{qoslet_bin, wait_timeout};
use qoslet_integration::{lazy_channel, scratch};
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest};
use qoslet_proto::{nri, ttrpc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

async fn send(io: &mut UnixStream, conn: u32, stream: u32, kind: u8, body: &[u8]) {
    let mut msg = (body.len() as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&stream.to_be_bytes());
    msg.extend_from_slice(&[kind, 0]);
    msg.extend_from_slice(body);
    let mut frame = conn.to_be_bytes().to_vec();
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    io.write_all(&frame).await.unwrap();
}

/// The next whole ttrpc message (these are small: one frame each).
async fn recv(io: &mut UnixStream) -> (u32, u32, u8, Vec<u8>) {
    let mut head = [0u8; 8];
    io.read_exact(&mut head).await.unwrap();
    let conn = u32::from_be_bytes(head[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(head[4..8].try_into().unwrap()) as usize;
    assert!(len + 8 <= 4096);
    let mut body = vec![0u8; len];
    io.read_exact(&mut body).await.unwrap();
    let mlen = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
    assert_eq!(mlen + 10, len, "one message per frame here");
    let stream = u32::from_be_bytes(body[4..8].try_into().unwrap());
    (conn, stream, body[8], body[10..].to_vec())
}

async fn call(io: &mut UnixStream, stream: u32, method: &str, payload: Vec<u8>) -> Vec<u8> {
    let req = ttrpc::Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: method.into(),
        payload,
        timeout_nano: 2_000_000_000,
        metadata: vec![],
    };
    send(io, 1, stream, 1, &req.encode_to_vec()).await;
    let (conn, s, kind, body) = recv(io).await;
    assert_eq!((conn, s, kind), (1, stream, 2));
    let r = ttrpc::Response::decode(&body[..]).unwrap();
    assert!(
        r.status.as_ref().is_none_or(|s| s.code == 0),
        "{:?}",
        r.status
    );
    r.payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_started_plugin_serves_fd_3_and_exits_with_it() {
    let dir = scratch("nri-fd3");
    std::fs::create_dir_all(&dir).unwrap();
    let admin = dir.join("admin.sock");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let log = std::fs::File::create(dir.join("qoslet.log")).unwrap();
    // the socket arrives as stdin and becomes fd 3 (no unsafe in a test)
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" nri --admin-listen \"unix://$1\" --state-dir \"$2\" --metrics-listen= --config /dev/null 3<&0 </dev/null")
        .arg(qoslet_bin())
        .arg(&admin)
        .arg(dir.join("state"))
        .env("NRI_PLUGIN_SOCKET", "3")
        .env("NRI_PLUGIN_NAME", "qoslet-pre")
        .env("NRI_PLUGIN_IDX", "07")
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    ours.set_nonblocking(true).unwrap();
    let mut io = UnixStream::from_std(ours).unwrap();

    // the plugin registers with the runtime-given name and index
    let (conn, stream, kind, body) = tokio::time::timeout(Duration::from_secs(20), recv(&mut io))
        .await
        .expect("RegisterPlugin on fd 3");
    assert_eq!((conn, kind, stream % 2), (2, 1, 1));
    let req = ttrpc::Request::decode(&body[..]).unwrap();
    assert_eq!(req.method, "RegisterPlugin");
    let reg = nri::RegisterPluginRequest::decode(&req.payload[..]).unwrap();
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("qoslet-pre", "07")
    );
    let events = call(
        &mut io,
        1,
        "Configure",
        nri::ConfigureRequest {
            runtime_name: "mock".into(),
            runtime_version: "v0".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
    .await;
    let events = nri::ConfigureResponse::decode(&events[..]).unwrap().events;
    assert!(
        events > 0 && events < 1 << 11,
        "v0.6.1's events only: {events:b}"
    );
    let ok = ttrpc::Response {
        status: None,
        payload: vec![],
    };
    send(&mut io, 2, stream, 2, &ok.encode_to_vec()).await;
    call(
        &mut io,
        3,
        "Synchronize",
        nri::SynchronizeRequest::default().encode_to_vec(),
    )
    .await;

    let s = AdminClient::new(lazy_channel(&admin))
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.mode, "nri");
    assert_eq!(s.listen, "fd 3 (started by the runtime)");
    assert_eq!(s.counters.unwrap().nri_registrations, 1);

    // the runtime closes the socket: the plugin it started stops, cleanly
    drop(io);
    let status = wait_timeout(&mut child, Duration::from_secs(15)).expect("qoslet exits");
    assert!(
        status.success(),
        "{status:?}\n{}",
        std::fs::read_to_string(dir.join("qoslet.log")).unwrap_or_default()
    );
}
