//! The limits qoslet enforces on the wire, in one place, each named after what
//! it protects and each the direct path's own: a call that containerd and
//! kubelet's gRPC accept between themselves passes through qoslet, and one they
//! refuse is refused the same way (the differential test in
//! `integration/tests/differential.rs` sends the same requests both ways).
//! `docs/limits.md` lists them with the direct-path limits they mirror.

/// A header block (request headers, response headers, trailers), decoded, as
/// RFC 7541 counts it (names + values + 32 per field). grpc-go's default on both
/// sides (containerd's server and kubelet's client: 16 MiB, enforced and not
/// advertised) and h2's default, so qoslet's server enforces it without
/// advertising it, as containerd does.
pub const MAX_HEADER_LIST: usize = 16 << 20;

/// The largest frame qoslet accepts (`SETTINGS_MAX_FRAME_SIZE`): the RFC 9113
/// default, which grpc-go advertises and sends. It also sets h2's
/// CONTINUATION-flood limit ([`max_continuations`]): raised to 1 MiB it let a
/// 16 MiB block take only 20 CONTINUATION frames, and gRPC peers, who send
/// 16 KiB frames, were cut off above ~320 KiB of headers.
pub const MAX_FRAME: usize = 16 << 10;

/// CONTINUATION frames one header block may take before the connection is
/// closed (ENHANCE_YOUR_CALM): h2's own rule, the frames a full
/// [`MAX_HEADER_LIST`] block needs plus a quarter (1,280 at these settings).
/// A peer that sends a block in frames much smaller than [`MAX_FRAME`] (no
/// gRPC implementation does) may meet it before the header-list limit.
pub const fn max_continuations(header_list: usize, frame: usize) -> usize {
    let frames = if header_list / frame > 1 {
        header_list / frame
    } else {
        1
    };
    let n = frames + (frames >> 2);
    if n > 5 {
        n
    } else {
        5
    }
}

/// [`max_continuations`] at qoslet's settings.
pub const MAX_CONTINUATIONS: usize = max_continuations(MAX_HEADER_LIST, MAX_FRAME);

/// A gRPC message, each way: containerd's `MaxRecvMsgSize`/`MaxSendMsgSize`
/// (16 MiB), the default of `maxMessageBytes`.
pub const MAX_MESSAGE: usize = 16 << 20;

/// The response header-list limit qoslet advertises to the runtime on a
/// client's behalf: what that client advertised to qoslet
/// (`SETTINGS_MAX_HEADER_LIST_SIZE`, e.g. gRPC C-core's 16 KiB), or
/// [`MAX_HEADER_LIST`] when it advertised none (grpc-go, kubelet), plus one.
/// containerd then resets a stream whose trailers the client would not take,
/// as it does direct, instead of sending qoslet trailers its client must
/// refuse. The one: h2 refuses a block that reaches its limit (`>=`), gRPC
/// one that exceeds it (`>`), so a block of exactly the client's limit, which
/// the client takes direct, must pass h2 too.
pub fn runtime_header_list(client_advertised: Option<u32>) -> u32 {
    client_advertised
        .unwrap_or(MAX_HEADER_LIST as u32)
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continuation_limit_is_h2s_at_qoslets_settings() {
        // 16 MiB / 16 KiB = 1,024 frames, plus a quarter
        assert_eq!(MAX_CONTINUATIONS, 1280);
        // the old 1 MiB frame size: 20 CONTINUATIONs, ~320 KiB of 16 KiB frames
        assert_eq!(max_continuations(16 << 20, 1 << 20), 20);
        assert_eq!(max_continuations(100, 16 << 10), 5);
        // a full 15 MiB block in gRPC's 16 KiB frames fits
        const { assert!((15 << 20) / MAX_FRAME < MAX_CONTINUATIONS) };
    }

    #[test]
    fn the_runtime_gets_the_clients_own_limit() {
        assert_eq!(runtime_header_list(Some(16384)), 16385);
        assert_eq!(runtime_header_list(None), (16 << 20) + 1);
        assert_eq!(runtime_header_list(Some(u32::MAX)), u32::MAX);
    }
}
