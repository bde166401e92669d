//! NRI mode against a real NRI v0.8 runtime: Debian sid's containerd 2.1.9
//! (the test bed's ctd21 instance). The plugin's side of the protocol only:
//! registration, Configure (the runtime's name and version, v0.8's timeouts),
//! Synchronize, and registering again after the runtime restarts. Pods do not
//! start under containerd 2.1 on this machine (runc: "can't get final child's
//! PID from pipe: EOF"), so what the plugin does to pods is tested on 1.7
//! (nri.rs); here the runtime has no pods and Synchronize is empty.

use std::time::Duration;

use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::Testbed;
use qoslet_integration::{eventually, lazy_channel, scratch};
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest, GetStatusResponse};

/// The plugin's name and index here: containerd logs the plugin as
/// `<index>-<name>`, a name no other test's plugin has.
const PLUGIN_NAME: &str = "qoslet-v08";
const PLUGIN_INDEX: &str = "50";

/// The request timeout testbed.sh configures for containerd 2.1
/// (`plugin_request_timeout = "3s"`, not the default 2 s), in ms, as NRI
/// v0.8 sends it in Configure, with the registration timeout (6 s).
const REQUEST_TIMEOUT_MS: i64 = 3000;
const REGISTRATION_TIMEOUT_MS: i64 = 6000;

async fn status(q: &QosletProcess) -> GetStatusResponse {
    AdminClient::new(lazy_channel(&q.admin))
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// containerd's log of the instance (testbed.sh appends to it at each start).
fn containerd_log(tb: &Testbed) -> String {
    let p = tb
        .work
        .join("logs")
        .join(format!("containerd-{}.log", tb.instance));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// How many times containerd logged this plugin "connected and synchronized":
/// the runtime's side of a Synchronize that the plugin answered.
fn synchronized_by_runtime(tb: &Testbed) -> usize {
    let plugin = format!("{PLUGIN_INDEX}-{PLUGIN_NAME}");
    containerd_log(tb)
        .lines()
        .filter(|l| l.contains(&plugin) && l.contains("connected and synchronized"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_nri_v08_runtime_registers_configures_synchronizes_and_reconnects() {
    let tb = Testbed::ctd21();
    let synced_before = synchronized_by_runtime(&tb);
    let dir = scratch("nri-v08");
    let name = format!("--plugin-name={PLUGIN_NAME}");
    let index = format!("--plugin-index={PLUGIN_INDEX}");
    let mut q = QosletProcess::start_nri(
        &dir,
        &tb.sock,
        &["--config=/dev/null", name.as_str(), index.as_str()],
    );
    // one registration, then its Synchronize
    q.wait_registered(1).await;

    // Configure: the runtime as the admin API reports it
    let s = status(&q).await;
    assert_eq!(s.mode, "nri");
    let b = s.backend.expect("the backend in GetStatus");
    assert!(b.reachable, "registered: {b:?}\n{}", q.log_text());
    assert_eq!(b.runtime_name, "containerd", "{b:?}");
    assert!(
        b.runtime_version.starts_with("2.1."),
        "containerd 2.1.x in Configure: {b:?}"
    );
    // (NRI's own version is in Configure from v0.12 only)
    assert_eq!(b.runtime_api_version, "NRI", "{b:?}");
    // v0.8's request timeout in Configure: the configured one, not a default
    let log = q.log_text();
    let configured = log
        .lines()
        .find(|l| l.contains("configured by the runtime"))
        .unwrap_or_else(|| panic!("no Configure in the log:\n{log}"));
    assert!(
        configured.contains(&format!("request_timeout_ms=Some({REQUEST_TIMEOUT_MS})")),
        "{configured}"
    );
    assert!(
        configured.contains(&format!(
            "registration_timeout_ms=Some({REGISTRATION_TIMEOUT_MS})"
        )),
        "{configured}"
    );
    assert!(configured.contains("version=2.1."), "{configured}");

    // Synchronize: counted by qoslet, empty (no pods on this runtime), and
    // answered: containerd logs the plugin synchronized
    let c = s.counters.expect("counters");
    assert_eq!(c.nri_registrations, 1, "{c:?}");
    assert_eq!(c.nri_events.get("configure").copied(), Some(1), "{c:?}");
    assert!(
        c.nri_events.get("synchronize").copied().unwrap_or(0) >= 1,
        "{c:?}"
    );
    assert_eq!((c.pods, c.containers), (0, 0), "nothing to adopt: {c:?}");
    assert_eq!(c.nri_errors, 0, "{c:?}\n{log}");
    assert_eq!(c.nri_timeouts, 0, "{c:?}");
    eventually(
        "containerd to log the plugin synchronized",
        Duration::from_secs(10),
        || async { (synchronized_by_runtime(&tb) > synced_before).then_some(()) },
    )
    .await;

    // containerd restarted: the plugin reconnects, registers, is configured
    // and synchronized again
    let pid = tb.containerd_pid();
    tb.stop_containerd();
    tb.start_containerd();
    assert_ne!(tb.containerd_pid(), pid, "a new containerd");
    q.wait_registered(2).await;
    let s = status(&q).await;
    let c = s.counters.expect("counters");
    assert!(c.nri_registrations >= 2, "{c:?}");
    assert!(c.nri_reconnects >= 1, "{c:?}");
    assert!(
        c.nri_events.get("configure").copied().unwrap_or(0) >= 2,
        "{c:?}"
    );
    assert_eq!(c.nri_errors, 0, "{c:?}\n{}", q.log_text());
    let b = s.backend.expect("the backend in GetStatus");
    assert!(
        b.reachable && b.runtime_version.starts_with("2.1."),
        "{b:?}"
    );
    eventually(
        "containerd to log the plugin synchronized again",
        Duration::from_secs(10),
        || async { (synchronized_by_runtime(&tb) > synced_before + 1).then_some(()) },
    )
    .await;

    let exit = q.sigterm(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}\n{}", q.log_text());
}
