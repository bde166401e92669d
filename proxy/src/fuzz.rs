//! Randomized tests of everything that parses untrusted bytes on the data
//! plane (issue 11): the `:authority` filter, gRPC message framing, CRI
//! decoding of the intercepted calls and their patches, and the container
//! event tap. Each runs thousands of seeded cases in the normal test run
//! (deterministic, so a failure names its seed): random bytes, and valid
//! inputs mutated (bit flips, truncations, inflated length fields). The
//! properties: no panic, and memory bounded by the input (nothing allocates
//! what a length field claims before the bytes are there).

use bytes::BytesMut;
use prost::Message;

use crate::cri::HookPoint;

pub(crate) use qoslet_wire::rng::Rng;

const POINTS: [HookPoint; 8] = [
    HookPoint::RunPodSandbox,
    HookPoint::CreateContainer,
    HookPoint::StartContainer,
    HookPoint::UpdateContainerResources,
    HookPoint::StopContainer,
    HookPoint::RemoveContainer,
    HookPoint::StopPodSandbox,
    HookPoint::RemovePodSandbox,
];

/// A realistic CreateContainer request to mutate.
fn create_request() -> Vec<u8> {
    use qoslet_proto::cri;
    cri::CreateContainerRequest {
        pod_sandbox_id: "p".repeat(64),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 1,
            }),
            annotations: [("a".to_string(), "b".repeat(300))].into(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_quota: 100_000,
                    cpu_period: 100_000,
                    memory_limit_in_bytes: 1 << 26,
                    cpuset_cpus: "0-3".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            labels: [("koordinator.sh/qosClass".to_string(), "BE".to_string())].into(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

#[test]
fn cri_decoding_and_patch_merging_never_panic() {
    let valid = create_request();
    let mut rng = Rng::new(11);
    for case in 0..20_000 {
        let input = if case % 2 == 0 {
            rng.mutate(&valid)
        } else {
            let n = rng.below(512);
            rng.bytes(n)
        };
        for p in POINTS {
            if let Ok(mut req) = p.decode_request(&input) {
                // a patch is merged over the decoded request: random patches too
                let patch = rng.mutate(&input);
                let _ = req.merge(&patch);
                let _ = req.encode();
            }
            let _ = p.decode_response(&input);
        }
    }
}

#[test]
fn grpc_framing_never_panics_and_reads_only_what_is_there() {
    let mut rng = Rng::new(12);
    for _ in 0..50_000 {
        let n = rng.below(64);
        let mut b = rng.bytes(n);
        if rng.below(2) == 0 && b.len() >= 5 {
            // a length field that claims far more than the buffer holds
            b[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        }
        if let Some(h) = crate::grpc::parse_header(&b) {
            assert!(b.len() >= 5);
            let _ = h.len;
        }
        match crate::grpc::split_unary(&b) {
            crate::grpc::Unary::Message(m) => assert_eq!(m.len() + 5, b.len()),
            crate::grpc::Unary::Opaque => {}
        }
    }
}

#[test]
fn the_event_tap_never_panics_and_stays_within_its_cap() {
    let store = qoslet_state::store::Store::new();
    let mut rng = Rng::new(13);
    let valid = qoslet_proto::cri::ContainerEventResponse {
        container_id: "c".repeat(64),
        container_event_type: 2,
        ..Default::default()
    }
    .encode_to_vec();
    for _ in 0..2_000 {
        let mut tap = crate::events::Tap::new((), store.clone(), 4096);
        let mut stream = BytesMut::new();
        for _ in 0..rng.below(20) {
            let msg = if rng.below(2) == 0 {
                rng.mutate(&valid)
            } else {
                let n = rng.below(64);
                rng.bytes(n)
            };
            stream.extend_from_slice(&[rng.below(2) as u8]);
            let claimed = if rng.below(8) == 0 {
                rng.next_u64() as u32
            } else {
                msg.len() as u32
            };
            stream.extend_from_slice(&claimed.to_be_bytes());
            stream.extend_from_slice(&msg);
        }
        let mut at = 0;
        while at < stream.len() {
            let n = 1 + rng.below(100);
            let end = (at + n).min(stream.len());
            tap.feed(&stream[at..end]);
            assert!(
                tap.buffered() <= 4096 + 5 + 100,
                "the tap's buffer stays bounded"
            );
            at = end;
        }
    }
}

/// The property the patch scheme rests on (original bytes + encoded patch are
/// sent, never a re-encoded request): the runtime's decoding of the two back
/// to back equals the patch merged into the decoded original.
#[test]
fn original_plus_patch_decodes_as_the_merge() {
    let valid = create_request();
    let mut rng = Rng::new(14);
    let mut checked = 0;
    for _ in 0..20_000 {
        let original = if rng.below(2) == 0 {
            valid.clone()
        } else {
            rng.mutate(&valid)
        };
        let patch = rng.mutate(&valid);
        let p = HookPoint::CreateContainer;
        let (Ok(mut merged), Ok(_)) = (p.decode_request(&original), p.decode_request(&patch))
        else {
            continue;
        };
        if merged.merge(&patch).is_err() {
            continue;
        }
        let mut both = original.clone();
        both.extend_from_slice(&patch);
        let decoded = p
            .decode_request(&both)
            .expect("two valid messages back to back decode");
        assert_eq!(decoded, merged);
        checked += 1;
    }
    assert!(checked > 500, "enough cases were valid: {checked}");
}
