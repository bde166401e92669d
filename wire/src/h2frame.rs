//! HTTP/2 frame-level helpers shared by the relay and the authority fix:
//! frame parsing and writing, header-block fragments, HPACK literal encoding.
//! Nothing here keeps connection state.

use bytes::{BufMut, Bytes, BytesMut};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const FRAME_HEADER: usize = 9;
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE any HTTP/2 peer accepts.
pub const MAX_OUT_FRAME: usize = 16_384;
pub const CANCEL: u32 = 0x8;

/// One parsed frame (the raw bytes are kept for forwarding unchanged).
#[derive(Debug, Clone)]
pub struct Frame {
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
    /// Header + payload, exactly as received.
    pub raw: Bytes,
}

impl Frame {
    pub fn payload(&self) -> &[u8] {
        &self.raw[FRAME_HEADER..]
    }
}

/// Splits one complete frame off the front of `buf`, if there is one.
pub fn take_frame(buf: &mut BytesMut) -> Option<Frame> {
    if buf.len() < FRAME_HEADER {
        return None;
    }
    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
    if buf.len() < FRAME_HEADER + len {
        return None;
    }
    let raw = buf.split_to(FRAME_HEADER + len).freeze();
    let stream = u32::from_be_bytes([raw[5], raw[6], raw[7], raw[8]]) & 0x7fff_ffff;
    Some(Frame {
        ty: raw[3],
        flags: raw[4],
        stream,
        raw,
    })
}

/// The header block fragment of a HEADERS frame payload (padding and priority removed).
pub fn headers_fragment(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        pad = *p.first()? as usize;
        p = &p[1..];
    }
    if flags & PRIORITY != 0 {
        p = p.get(5..)?;
    }
    p.get(..p.len().checked_sub(pad)?)
}

/// The data of a DATA frame payload (padding removed).
pub fn data_payload(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    if flags & PADDED == 0 {
        return Some(payload);
    }
    let pad = *payload.first()? as usize;
    payload.get(1..payload.len().checked_sub(pad)?)
}

pub fn write_frame(out: &mut BytesMut, ty: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.put_u8(ty);
    out.put_u8(flags);
    out.put_u32(stream_id);
    out.extend_from_slice(payload);
}

/// HPACK integer with an `n`-bit prefix (RFC 7541 5.1); `first` holds the high bits.
pub fn put_int(out: &mut BytesMut, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.put_u8(first | v as u8);
        return;
    }
    out.put_u8(first | max as u8);
    v -= max;
    while v >= 128 {
        out.put_u8((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.put_u8(v as u8);
}

/// HPACK string literal without Huffman coding.
pub fn put_string(out: &mut BytesMut, s: &[u8]) {
    put_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// A header block of literals without indexing: it never touches the
/// receiver's dynamic table, so it can be dropped or injected freely.
pub fn literal_block<'a>(headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> BytesMut {
    let mut block = BytesMut::new();
    for (name, value) in headers {
        put_literal(&mut block, name, value);
    }
    block
}

/// One header as a literal without indexing (new name).
pub fn put_literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    put_field(out, name, value, false);
}

/// One header as a literal that does not touch the receiver's table: never
/// indexed (RFC 7541 §6.2.3, which a re-encoder must keep: it tells every
/// hop not to index the value) or just not indexed.
pub fn put_field(out: &mut BytesMut, name: &[u8], value: &[u8], never_indexed: bool) {
    out.put_u8(if never_indexed { 0x10 } else { 0x00 });
    put_string(out, name);
    put_string(out, value);
}

/// HEADERS (+ CONTINUATION) frames carrying `block`.
pub fn write_header_frames(
    out: &mut BytesMut,
    stream_id: u32,
    end_stream: bool,
    block: &[u8],
    max_frame: usize,
) {
    let es = if end_stream { END_STREAM } else { 0 };
    if block.is_empty() {
        write_frame(out, HEADERS, END_HEADERS | es, stream_id, &[]);
        return;
    }
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let mut first = true;
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let flags = if last { END_HEADERS } else { 0 } | if first { es } else { 0 };
        write_frame(
            out,
            if first { HEADERS } else { CONTINUATION },
            flags,
            stream_id,
            c,
        );
        first = false;
    }
}

/// DATA frames carrying `data` (split at the minimum frame size).
pub fn write_data_frames(out: &mut BytesMut, stream_id: u32, end_stream: bool, data: &[u8]) {
    if data.is_empty() {
        write_frame(
            out,
            DATA,
            if end_stream { END_STREAM } else { 0 },
            stream_id,
            &[],
        );
        return;
    }
    let mut chunks = data.chunks(MAX_OUT_FRAME).peekable();
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        write_frame(
            out,
            DATA,
            if last && end_stream { END_STREAM } else { 0 },
            stream_id,
            c,
        );
    }
}

pub fn window_update(out: &mut BytesMut, stream_id: u32, increment: u32) {
    if increment > 0 {
        write_frame(
            out,
            WINDOW_UPDATE,
            0,
            stream_id,
            &(increment & 0x7fff_ffff).to_be_bytes(),
        );
    }
}

pub fn rst_stream(out: &mut BytesMut, stream_id: u32, code: u32) {
    write_frame(out, RST_STREAM, 0, stream_id, &code.to_be_bytes());
}

pub fn goaway(out: &mut BytesMut, last_stream: u32, code: u32) {
    let mut p = BytesMut::with_capacity(8);
    p.put_u32(last_stream & 0x7fff_ffff);
    p.put_u32(code);
    write_frame(out, GOAWAY, 0, 0, &p);
}

/// A trailers-only gRPC response (`:status 200`, content-type, grpc-status, grpc-message).
pub fn trailers_only(out: &mut BytesMut, stream_id: u32, status: &tonic::Status) {
    let code = (status.code() as i32).to_string();
    let msg = percent_encode(status.message());
    let block = literal_block([
        (&b":status"[..], &b"200"[..]),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", code.as_bytes()),
        (b"grpc-message", msg.as_bytes()),
    ]);
    write_header_frames(out, stream_id, true, &block, MAX_OUT_FRAME);
}

/// Trailers (no :status) carrying a gRPC status, ending the stream.
pub fn trailers(out: &mut BytesMut, stream_id: u32, status: &tonic::Status) {
    let code = (status.code() as i32).to_string();
    let msg = percent_encode(status.message());
    let block = literal_block([
        (&b"grpc-status"[..], code.as_bytes()),
        (b"grpc-message", msg.as_bytes()),
    ]);
    write_header_frames(out, stream_id, true, &block, MAX_OUT_FRAME);
}

/// gRPC's grpc-message encoding (percent-encode outside printable ASCII and '%').
fn percent_encode(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers() {
        let mut b = BytesMut::new();
        put_int(&mut b, 0, 5, 10);
        put_int(&mut b, 0, 5, 1337);
        assert_eq!(&b[..], &[10, 31, 154, 10]); // RFC 7541 C.1.1 and C.1.2
    }

    #[test]
    fn frames_round_trip_and_split() {
        let mut out = BytesMut::new();
        write_data_frames(&mut out, 3, true, &vec![1u8; 40_000]);
        let mut n = 0;
        let mut total = 0;
        while let Some(f) = take_frame(&mut out) {
            n += 1;
            total += f.payload().len();
            assert_eq!(f.stream, 3);
            assert_eq!(f.flags & END_STREAM != 0, total == 40_000);
        }
        assert_eq!((n, total), (3, 40_000));
        let mut out = BytesMut::new();
        trailers_only(
            &mut out,
            5,
            &tonic::Status::resource_exhausted("too big: 100%"),
        );
        let f = take_frame(&mut out).unwrap();
        let mut dec = fluke_hpack::Decoder::new();
        let h = dec
            .decode(headers_fragment(f.flags, f.payload()).unwrap())
            .unwrap();
        assert!(h.contains(&(b"grpc-status".to_vec(), b"8".to_vec())));
        assert!(h.contains(&(b"grpc-message".to_vec(), b"too big: 100%25".to_vec())));
        assert_eq!(
            f.flags & (END_STREAM | END_HEADERS),
            END_STREAM | END_HEADERS
        );
    }

    #[test]
    fn padded_payloads() {
        assert_eq!(
            data_payload(PADDED, &[2, b'a', b'b', 0, 0]),
            Some(&b"ab"[..])
        );
        assert_eq!(data_payload(PADDED, &[9, b'a']), None);
        assert_eq!(
            headers_fragment(PRIORITY, &[0, 0, 0, 1, 16, b'x']),
            Some(&b"x"[..])
        );
    }
}
