//! The judge: what h2 makes of each field of a client's header block
//! ([`H2Judge`], the notes the HPACK decoder takes as it decodes), the
//! verdict on a whole block ([`Judge`], [`Verdict`]: a socket-path
//! `:authority` to repair, a field h2 refuses, a malformed block), and the
//! connection's credit for copying blocks out ([`Credit`]).

use super::*;

/// Whether h2's HPACK decoder refuses this field outright (a connection error,
/// GOAWAY PROTOCOL_ERROR): an empty, upper-case or otherwise invalid name, a
/// value with control characters, an unknown pseudo-header, a method or status
/// that does not parse, a pseudo-header value that is not UTF-8. containerd
/// (Go's HTTP/2) resets just that stream for each of them.
pub fn h2_refuses_field(name: &[u8], value: &[u8]) -> bool {
    H2Judge.field(H2Judge.name(name), value).refused
}

/// What h2 makes of a field name.
#[derive(Debug, Clone, Copy)]
pub enum NameKind {
    /// Refused with any value: empty, not a valid lower-case name, an
    /// unknown pseudo-header.
    Refused,
    /// A pseudo-header (one bit each).
    Pseudo(u8),
    /// Connection-specific (RFC 9113 §8.2.2): a request with it is malformed.
    ConnectionSpecific,
    /// `te`: only `trailers` is allowed.
    Te,
    Regular,
}

const AUTHORITY: u8 = 1;
const METHOD: u8 = 2;
const SCHEME: u8 = 4;
const PATH: u8 = 8;
const PROTOCOL: u8 = 16;
const STATUS: u8 = 32;

/// What h2 makes of a whole field.
#[derive(Debug, Clone, Copy, Default)]
pub struct FieldNote {
    /// h2's decoder refuses it ([`h2_refuses_field`]).
    refused: bool,
    /// An `:authority` h2 refuses as a URI authority (a socket path).
    bad_authority: bool,
    /// The pseudo-header's bit, or 0.
    pseudo: u8,
    /// A regular field.
    regular: bool,
    /// Malformed in itself (connection-specific, `te` other than `trailers`).
    malformed: bool,
}

/// Judges fields as h2's `Header::new` and `HeaderBlock::load` do; the
/// decoder keeps the notes of table entries, so a reference is not judged
/// again.
pub struct H2Judge;

impl Notes for H2Judge {
    type Name = NameKind;
    type Field = FieldNote;

    fn name(&self, name: &[u8]) -> NameKind {
        if let Some(p) = name.strip_prefix(b":") {
            return match p {
                b"authority" => NameKind::Pseudo(AUTHORITY),
                b"method" => NameKind::Pseudo(METHOD),
                b"scheme" => NameKind::Pseudo(SCHEME),
                b"path" => NameKind::Pseudo(PATH),
                b"protocol" => NameKind::Pseudo(PROTOCOL),
                b"status" => NameKind::Pseudo(STATUS),
                _ => NameKind::Refused,
            };
        }
        if name.is_empty() || http::HeaderName::from_lowercase(name).is_err() {
            return NameKind::Refused;
        }
        match name {
            b"connection" | b"transfer-encoding" | b"upgrade" | b"keep-alive"
            | b"proxy-connection" => NameKind::ConnectionSpecific,
            b"te" => NameKind::Te,
            _ => NameKind::Regular,
        }
    }

    fn field(&self, name: NameKind, value: &[u8]) -> FieldNote {
        let regular = |malformed: bool| FieldNote {
            refused: http::HeaderValue::from_bytes(value).is_err(),
            regular: true,
            malformed,
            ..FieldNote::default()
        };
        match name {
            NameKind::Refused => FieldNote {
                refused: true,
                ..FieldNote::default()
            },
            NameKind::Pseudo(bit) => {
                let refused = match bit {
                    METHOD => http::Method::from_bytes(value).is_err(),
                    STATUS => http::StatusCode::from_bytes(value).is_err(),
                    _ => std::str::from_utf8(value).is_err(),
                };
                FieldNote {
                    refused,
                    bad_authority: bit == AUTHORITY && !refused && !valid_authority(value),
                    pseudo: bit,
                    ..FieldNote::default()
                }
            }
            NameKind::ConnectionSpecific => regular(true),
            NameKind::Te => regular(value != b"trailers"),
            NameKind::Regular => regular(false),
        }
    }
}

/// What h2 would make of a decoded block.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verdict {
    /// An `:authority` h2 refuses (a socket path): repaired.
    pub(super) bad_authority: bool,
    /// A field h2's HPACK decoder refuses outright ([`h2_refuses_field`]): a
    /// connection error in h2, a stream error by RFC 9113 §8.1.1.
    pub(super) refused: bool,
    /// A block h2 decodes and calls malformed (a connection-specific field,
    /// `te` other than `trailers`, a pseudo-header after a regular field or
    /// twice): a clean stream reset only when it comes in one frame (h2 judges
    /// each frame's fields on their own and, mid-block, loses the verdict or
    /// the block).
    pub(super) malformed: bool,
}

/// The judgement of the block being read, field by field.
#[derive(Debug, Default)]
pub(super) struct Judge {
    pub(super) verdict: Verdict,
    /// The pseudo-headers seen (a bit each), and whether a regular field was.
    pub(super) pseudo: u8,
    pub(super) regular: bool,
    /// What the fields decode to, as h2 counts it.
    pub(super) size: usize,
    /// [`MAX_DECODED`] reached: h2 refuses the stream.
    pub(super) over: bool,
    /// HPACK bytes the client sent of the block so far.
    pub(super) sent: usize,
    /// What h2 would decode again of the block's pending Huffman names.
    pub(super) redecoded: usize,
    /// What copying the block out may take: the connection's credit at its
    /// start (plus [`REWRITE_PER_BYTE`] per byte of it).
    pub(super) allowance: usize,
    /// The copy stopped there.
    pub(super) short: bool,
    /// Copy every field into the rewrite buffer (the connection is being
    /// rewritten); otherwise only while one could still need it: up to the
    /// first regular field, and after a socket-path `:authority`.
    pub(super) copy_all: bool,
    /// The verdict said malformed before the block's last frame was decoded.
    pub(super) malformed_early: bool,
    /// h2 would do quadratic work on this block as it came.
    pub(super) h2_quadratic: bool,
    /// A field was not copied (not wanted then).
    pub(super) skipped: bool,
}

impl Judge {
    pub(super) fn new(copy_all: bool, allowance: usize) -> Self {
        Self {
            copy_all,
            allowance,
            ..Self::default()
        }
    }

    pub(super) fn field(
        &mut self,
        name: &[u8],
        value: &[u8],
        note: FieldNote,
        never_indexed: bool,
        rewrite: &mut BytesMut,
    ) {
        let len = name.len() + value.len() + 32;
        self.size = self.size.saturating_add(len);
        if self.size >= MAX_DECODED {
            self.over = true;
        }
        let v = &mut self.verdict;
        if note.refused {
            v.refused = true;
        } else {
            v.bad_authority |= note.bad_authority;
            v.malformed |= note.malformed;
            if note.pseudo != 0 {
                v.malformed |= self.pseudo & note.pseudo != 0 || self.regular;
                self.pseudo |= note.pseudo;
            }
            self.regular |= note.regular;
        }
        let wanted = self.copy_all || self.verdict.bad_authority || !self.regular;
        if !wanted {
            self.skipped = true;
        }
        if self.over || self.short || !wanted {
            return;
        }
        let allowance = self
            .allowance
            .saturating_add(self.sent.saturating_mul(REWRITE_PER_BYTE as usize));
        if rewrite.len() + name.len() + value.len() + 16 > allowance {
            self.short = true;
            return;
        }
        let value: &[u8] = if note.bad_authority {
            b"localhost"
        } else {
            value
        };
        put_field(rewrite, name, value, never_indexed);
    }
}

/// A connection's copying credit, in bytes.
#[derive(Debug)]
pub(super) struct Credit {
    left: i64,
    at: tokio::time::Instant,
}

impl Credit {
    pub(super) fn new() -> Self {
        Self {
            left: CREDIT_START,
            at: tokio::time::Instant::now(),
        }
    }

    /// What a block may take now (time's refill added; the clock is read
    /// only below the cap).
    pub(super) fn available(&mut self) -> usize {
        if self.left < CREDIT_CAP {
            let now = tokio::time::Instant::now();
            let nanos = now.saturating_duration_since(self.at).as_nanos();
            let add = nanos.saturating_mul(CREDIT_PER_SECOND as u128) / 1_000_000_000;
            if add > 0 {
                let add = i64::try_from(add).unwrap_or(i64::MAX);
                self.left = self.left.saturating_add(add).min(CREDIT_CAP);
                self.at = now;
            }
        } else {
            self.at = tokio::time::Instant::now();
        }
        usize::try_from(self.left.max(0)).unwrap_or(0)
    }

    /// A block of `sent` HPACK bytes whose copy took `spent`.
    pub(super) fn settle(&mut self, sent: usize, spent: usize) {
        let earned = i64::try_from(sent)
            .unwrap_or(i64::MAX)
            .saturating_mul(REWRITE_PER_BYTE);
        let spent = i64::try_from(spent).unwrap_or(i64::MAX);
        self.left = self
            .left
            .saturating_add(earned)
            .saturating_sub(spent)
            .min(CREDIT_CAP);
    }
}
