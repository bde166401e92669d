//! Property: any sequence of messages on the two connections, framed by this
//! side (frames <= 4096 bytes) or by a runtime (frames of any size), and read
//! in any chunking, decodes to itself, message by message and in order.

use bytes::Bytes;
use qoslet_nri::mux::{self, Conn, Demux, MAX_FRAME};
use qoslet_nri::ttrpc::{self, Deframer, Frame, Inbound};

fn random_messages(rng: &mut fastrand::Rng) -> Vec<(Conn, Frame)> {
    (0..rng.usize(1..12))
        .map(|i| {
            let conn = if rng.bool() {
                Conn::Plugin
            } else {
                Conn::Runtime
            };
            // mostly small, sometimes several frames long, sometimes empty
            let len = match rng.u8(0..10) {
                0 => 0,
                1..=6 => rng.usize(1..300),
                _ => rng.usize(300..40_000),
            };
            let payload: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let frame = Frame {
                stream: 2 * i as u32 + 1,
                kind: if rng.bool() {
                    ttrpc::REQUEST
                } else {
                    ttrpc::RESPONSE
                },
                flags: 0,
                payload: Bytes::from(payload),
            };
            (conn, frame)
        })
        .collect()
}

/// The bytes of `msgs` on the trunk; `ours` frames as this side does, else
/// as a runtime may (any frame size, connections interleaved between frames).
fn trunk(rng: &mut fastrand::Rng, msgs: &[(Conn, Frame)], ours: bool) -> Vec<u8> {
    let mut out = vec![];
    for (conn, f) in msgs {
        let m = ttrpc::encode(f.stream, f.kind, f.flags, &f.payload).unwrap();
        if ours {
            mux::encode(*conn, &m, &mut out);
        } else {
            let mut rest = &m[..];
            while !rest.is_empty() {
                let n = rng.usize(1..=rest.len().min(70_000));
                out.extend_from_slice(&conn.id().to_be_bytes());
                out.extend_from_slice(&(n as u32).to_be_bytes());
                out.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
                // an empty frame now and then
                if rng.u8(0..20) == 0 {
                    out.extend_from_slice(&conn.id().to_be_bytes());
                    out.extend_from_slice(&0u32.to_be_bytes());
                }
            }
        }
    }
    out
}

fn read_back(rng: &mut fastrand::Rng, wire: &[u8]) -> Vec<(Conn, Frame)> {
    let mut demux = Demux::new();
    let mut d = [Deframer::new(), Deframer::new()];
    let mut got = vec![];
    let mut rest = wire;
    while !rest.is_empty() {
        let n = rng.usize(1..=rest.len().min(9000));
        demux.push(&rest[..n]);
        rest = &rest[n..];
        while let Some((conn, piece)) = demux.next_piece().unwrap() {
            let i = (conn.id() - 1) as usize;
            d[i].push(&piece);
            while let Some(m) = d[i].next_message() {
                match m {
                    Inbound::Message(f) => got.push((conn, f)),
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    assert_eq!(demux.buffered(), 0);
    assert_eq!(d[0].buffered() + d[1].buffered(), 0);
    got
}

/// The frames of `wire` are all at most 4096 bytes.
fn frames_fit(wire: &[u8]) -> bool {
    let mut at = 0;
    while at < wire.len() {
        let len = u32::from_be_bytes(wire[at + 4..at + 8].try_into().unwrap()) as usize;
        if 8 + len > MAX_FRAME {
            return false;
        }
        at += 8 + len;
    }
    true
}

#[test]
fn any_message_in_any_frames_and_chunks_decodes_to_itself() {
    for seed in 0..400u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let msgs = random_messages(&mut rng);
        for ours in [true, false] {
            let wire = trunk(&mut rng, &msgs, ours);
            if ours {
                assert!(frames_fit(&wire), "seed {seed}: a frame over 4096 bytes");
            }
            let got = read_back(&mut rng, &wire);
            // per connection, in order
            for conn in [Conn::Plugin, Conn::Runtime] {
                let want: Vec<&Frame> = msgs
                    .iter()
                    .filter(|(c, _)| *c == conn)
                    .map(|(_, f)| f)
                    .collect();
                let have: Vec<&Frame> = got
                    .iter()
                    .filter(|(c, _)| *c == conn)
                    .map(|(_, f)| f)
                    .collect();
                assert_eq!(want, have, "seed {seed}, ours {ours}, {conn:?}");
            }
        }
    }
}
