//! An HPACK decoder (RFC 7541) for the relay: it mirrors one peer's encoder
//! and hands each header to a visitor as borrowed bytes.
//!
//! The relay decodes every header block it sees, both ways, so this runs
//! several times per call. Indexed headers (most of a steady gRPC connection's
//! headers) cost a table lookup and no allocation; literals are borrowed from
//! the block, or Huffman-decoded into a buffer the decoder keeps; only entries
//! added to the dynamic table are copied. Malformed input is an error, never a
//! panic.

use std::collections::VecDeque;

/// A header block that could not be decoded; the connection's HPACK state is
/// unknown from then on.
#[derive(Debug, thiserror::Error)]
#[error("malformed HPACK header block")]
pub struct BadBlock;

/// A decoded header list.
pub type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// RFC 7541 Appendix A.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A dynamic table entry: name, value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// Per-entry overhead in the table size (RFC 7541 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Where a decoded string lives.
enum Str {
    /// `block[start..end]`, as sent.
    Raw(usize, usize),
    /// In the caller's Huffman buffer.
    Decoded,
}

/// Decodes one peer's header blocks, in the order that peer encoded them.
pub struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// The largest size update accepted.
    limit: usize,
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

/// The protocol's initial table size, with size updates accepted up to 1 MiB
/// (qoslet relays the peers' SETTINGS, so it cannot know the size they agreed).
impl Default for Decoder {
    fn default() -> Self {
        Self::new(4096, 1 << 20)
    }
}

impl Decoder {
    pub fn new(max: usize, limit: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max,
            limit,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
        }
    }

    /// Decodes one complete header block into an owned list.
    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, BadBlock> {
        let mut out = Vec::with_capacity(8);
        self.decode_each(block, |n, v| out.push((n.to_vec(), v.to_vec())))?;
        Ok(out)
    }

    /// Decodes one complete header block, calling `f` with each header in
    /// order. On error, `f` may have seen some headers, and the table is in an
    /// unknown state (as it is for the peer that sent the block).
    pub fn decode_each(
        &mut self,
        block: &[u8],
        mut f: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), BadBlock> {
        let mut nb = std::mem::take(&mut self.name_buf);
        let mut vb = std::mem::take(&mut self.value_buf);
        let r = self.walk(block, &mut nb, &mut vb, &mut f);
        self.name_buf = nb;
        self.value_buf = vb;
        r
    }

    fn walk(
        &mut self,
        block: &[u8],
        nb: &mut Vec<u8>,
        vb: &mut Vec<u8>,
        f: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<(), BadBlock> {
        let mut p = 0;
        while p < block.len() {
            let b = block[p];
            if b & 0x80 != 0 {
                // indexed header field (6.1)
                let idx = integer(block, &mut p, 7)?;
                let (n, v) = self.get(idx)?;
                f(n, v);
            } else if b & 0xe0 == 0x20 {
                // dynamic table size update (6.3)
                let size = integer(block, &mut p, 5)?;
                if size > self.limit {
                    return Err(BadBlock);
                }
                self.max = size;
                self.evict_to(size);
            } else {
                // literal: with incremental indexing (6.2.1), without (6.2.2), never (6.2.3)
                let indexing = b & 0x40 != 0;
                let idx = integer(block, &mut p, if indexing { 6 } else { 4 })?;
                let name = if idx == 0 {
                    Some(string(block, &mut p, nb)?)
                } else {
                    None
                };
                let value = match string(block, &mut p, vb)? {
                    Str::Raw(s, e) => &block[s..e],
                    Str::Decoded => &vb[..],
                };
                let name: &[u8] = match name {
                    Some(Str::Raw(s, e)) => &block[s..e],
                    Some(Str::Decoded) => &nb[..],
                    None => self.get(idx)?.0,
                };
                f(name, value);
                if indexing {
                    self.insert((Box::from(name), Box::from(value)));
                }
            }
        }
        Ok(())
    }

    fn get(&self, idx: usize) -> Result<(&[u8], &[u8]), BadBlock> {
        match idx {
            0 => Err(BadBlock),
            1..=61 => Ok(STATIC[idx - 1]),
            _ => self
                .table
                .get(idx - 62)
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or(BadBlock),
        }
    }

    fn insert(&mut self, entry: Entry) {
        let size = entry.0.len() + entry.1.len() + ENTRY_OVERHEAD;
        if size > self.max {
            // not an error: the table is emptied (4.4)
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.size += size;
        self.table.push_front(entry);
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => break,
            }
        }
    }

    /// Entries in the dynamic table (for tests).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.table.len()
    }
}

/// An integer with an `n`-bit prefix (5.1), at `block[*p]`; values that do not
/// fit 32 bits are refused.
fn integer(block: &[u8], p: &mut usize, n: u32) -> Result<usize, BadBlock> {
    let max = (1usize << n) - 1;
    let mut v = (*block.get(*p).ok_or(BadBlock)? as usize) & max;
    *p += 1;
    if v < max {
        return Ok(v);
    }
    let mut shift = 0;
    loop {
        let b = *block.get(*p).ok_or(BadBlock)?;
        *p += 1;
        v += ((b & 0x7f) as usize) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(BadBlock);
        }
    }
    if v > u32::MAX as usize {
        return Err(BadBlock);
    }
    Ok(v)
}

/// A string literal (5.2) at `block[*p]`: borrowed when plain, Huffman-decoded
/// into `buf` otherwise.
fn string(block: &[u8], p: &mut usize, buf: &mut Vec<u8>) -> Result<Str, BadBlock> {
    let huffman = *block.get(*p).ok_or(BadBlock)? & 0x80 != 0;
    let len = integer(block, p, 7)?;
    let start = *p;
    let end = start.checked_add(len).ok_or(BadBlock)?;
    let src = block.get(start..end).ok_or(BadBlock)?;
    *p = end;
    if !huffman {
        return Ok(Str::Raw(start, end));
    }
    buf.clear();
    huffman_decode(src, buf)?;
    Ok(Str::Decoded)
}

/// Lookup tables for the HPACK Huffman code, built once from the code table
/// (RFC 7541 Appendix B, as the `httlib-huffman` crate publishes it).
struct Huffman {
    /// By the next 9 bits: (symbol, code length) for codes of up to 9 bits
    /// (letters, digits and most punctuation), length 0 for longer codes.
    short: [(u16, u8); 1 << SHORT_BITS],
    /// Longer codes, canonical: per length, the first code, how many, and
    /// where their symbols start in `symbols`.
    first: [u32; 31],
    count: [u32; 31],
    offset: [usize; 31],
    symbols: Vec<u16>,
}

const SHORT_BITS: u32 = 9;
const MAX_CODE: u32 = 30;
const EOS: u16 = 256;

fn huffman() -> &'static Huffman {
    static TABLES: std::sync::OnceLock<Huffman> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let codes = &httlib_huffman::encoder::table::ENCODE_TABLE;
        let mut h = Huffman {
            short: [(0, 0); 1 << SHORT_BITS],
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols: Vec::with_capacity(codes.len()),
        };
        let mut long: Vec<(u8, u32, u16)> = vec![];
        for (sym, &(len, code)) in codes.iter().enumerate() {
            let sym = sym as u16;
            if u32::from(len) <= SHORT_BITS {
                let shift = SHORT_BITS - u32::from(len);
                let start = (code << shift) as usize;
                for e in &mut h.short[start..start + (1 << shift)] {
                    *e = (sym, len);
                }
            } else {
                long.push((len, code, sym));
            }
        }
        long.sort_unstable();
        for (len, code, sym) in long {
            let l = len as usize;
            if h.count[l] == 0 {
                h.first[l] = code;
                h.offset[l] = h.symbols.len();
            }
            // the code is canonical: codes of one length are consecutive (tested)
            debug_assert_eq!(code, h.first[l] + h.count[l]);
            h.count[l] += 1;
            h.symbols.push(sym);
        }
        h
    })
}

impl Huffman {
    /// The symbol whose code starts `w` (30 bits, most significant first).
    fn lookup(&self, w: u32) -> Option<(u16, u32)> {
        let (sym, len) = self.short[(w >> (MAX_CODE - SHORT_BITS)) as usize];
        if len != 0 {
            return Some((sym, u32::from(len)));
        }
        for len in SHORT_BITS + 1..=MAX_CODE {
            let l = len as usize;
            let c = w >> (MAX_CODE - len);
            if self.count[l] != 0 && c >= self.first[l] && c - self.first[l] < self.count[l] {
                return Some((
                    self.symbols[self.offset[l] + (c - self.first[l]) as usize],
                    len,
                ));
            }
        }
        None
    }
}

/// Decodes a Huffman-coded string literal (5.2): EOS inside the string, or
/// padding that is longer than 7 bits or not EOS's leading 1s, is an error.
fn huffman_decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), BadBlock> {
    let h = huffman();
    // the shortest code is 5 bits
    dst.reserve(src.len() * 8 / 5 + 1);
    let mut acc: u64 = 0; // the low `n` bits are pending
    let mut n: u32 = 0;
    for &b in src {
        acc = (acc << 8) | u64::from(b);
        n += 8;
        while n >= MAX_CODE {
            let w = ((acc >> (n - MAX_CODE)) as u32) & ((1 << MAX_CODE) - 1);
            let (sym, len) = h.lookup(w).ok_or(BadBlock)?;
            if sym == EOS {
                return Err(BadBlock);
            }
            dst.push(sym as u8);
            n -= len;
        }
    }
    while n > 0 {
        let rest = (acc & ((1u64 << n) - 1)) as u32;
        if n <= 7 && rest == (1 << n) - 1 {
            return Ok(()); // padding
        }
        // the rest, padded with 1s as the sender's padding would be
        let w = (rest << (MAX_CODE - n)) | ((1 << (MAX_CODE - n)) - 1);
        let (sym, len) = h.lookup(w).ok_or(BadBlock)?;
        if len > n || sym == EOS {
            return Err(BadBlock);
        }
        dst.push(sym as u8);
        n -= len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(h: &Headers) -> Vec<(&str, &str)> {
        h.iter()
            .map(|(n, v)| {
                (
                    std::str::from_utf8(n).unwrap(),
                    std::str::from_utf8(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn rfc_7541_c4_requests_with_huffman_share_one_table() {
        let mut d = Decoder::default();
        let h = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            pairs(&h),
            [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ]
        );
        assert_eq!((d.entries(), d.size), (1, 57));
        let h = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            pairs(&h),
            [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ]
        );
        let h = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(
            pairs(&h),
            [
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ]
        );
        assert_eq!((d.entries(), d.size), (3, 164));
    }

    #[test]
    fn huffman_round_trips_every_byte_and_random_strings() {
        let h = huffman();
        for l in SHORT_BITS as usize + 1..=MAX_CODE as usize {
            // canonical: one run of consecutive codes per length
            let codes: Vec<u32> = httlib_huffman::encoder::table::ENCODE_TABLE
                .iter()
                .filter(|(len, _)| *len as usize == l)
                .map(|(_, c)| *c)
                .collect();
            assert_eq!(codes.len() as u32, h.count[l], "length {l}");
        }
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut inputs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b, b'a', b]).collect();
        inputs.push(b"/runtime.v1.RuntimeService/Version".to_vec());
        inputs.push(vec![]);
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 64) as usize;
            inputs.push(
                (0..len)
                    .map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8)
                    .collect(),
            );
        }
        for input in inputs {
            let mut enc = Vec::new();
            httlib_huffman::encode(&input, &mut enc).unwrap();
            let mut out = Vec::new();
            huffman_decode(&enc, &mut out).unwrap();
            assert_eq!(out, input);
        }
    }

    #[test]
    fn huffman_refuses_bad_padding_and_eos() {
        let mut out = Vec::new();
        // 'a' is 00011 (5 bits): 3 bits of 1s pad it to a byte
        assert!(huffman_decode(&[0b0001_1111], &mut out).is_ok());
        assert_eq!(out, b"a");
        // padding of 0s
        assert!(huffman_decode(&[0b0001_1000], &mut Vec::new()).is_err());
        // 8 bits of padding
        assert!(huffman_decode(&[0b0001_1111, 0xff], &mut Vec::new()).is_err());
        // EOS (30 1s) inside the string
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xfc], &mut Vec::new()).is_err());
    }

    #[test]
    fn static_table_matches_an_independent_decoder() {
        for i in 1..=61u8 {
            let block = [0x80 | i];
            let ours = Decoder::default().decode(&block).unwrap();
            let theirs = fluke_hpack::Decoder::new().decode(&block).unwrap();
            assert_eq!(ours, theirs, "static index {i}");
        }
    }

    #[test]
    fn follows_an_indexing_encoder_across_blocks_and_evictions() {
        // values up to 1.8 KB overflow the 4 KiB table every few blocks, forcing evictions
        let mut enc = fluke_hpack::Encoder::new();
        let mut dec = Decoder::default();
        let mut reference = fluke_hpack::Decoder::new();
        for round in 0..200u32 {
            let path = format!("/runtime.v1.RuntimeService/Call{}", round % 17);
            let ua = format!("kubelet/{}", round % 5);
            let big = "x".repeat((round % 7) as usize * 300);
            let headers: Vec<(&[u8], &[u8])> = vec![
                (b":method", b"POST"),
                (b":path", path.as_bytes()),
                (b"user-agent", ua.as_bytes()),
                (b"x-big", big.as_bytes()),
                (b"grpc-timeout", b"2m"),
            ];
            let block = enc.encode(headers.iter().copied());
            let ours = dec.decode(&block).unwrap();
            let theirs = reference.decode(&block).unwrap();
            assert_eq!(ours, theirs, "round {round}");
        }
    }

    #[test]
    fn size_updates_shrink_the_table_and_are_bounded() {
        let mut d = Decoder::default();
        // custom-key: custom-value, with indexing (plain strings)
        let lit = hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572");
        d.decode(&lit).unwrap();
        assert_eq!(d.entries(), 1);
        assert_eq!(
            pairs(&d.decode(&[0xbe]).unwrap()),
            [("custom-key", "custom-header")]
        );
        d.decode(&[0x20]).unwrap(); // size 0: evicts all
        assert_eq!(d.entries(), 0);
        assert!(d.decode(&[0xbe]).is_err());
        // above the limit
        let mut big = vec![0x3f];
        let mut v = (1usize << 21) - 31;
        while v >= 128 {
            big.push((v % 128) as u8 | 0x80);
            v /= 128;
        }
        big.push(v as u8);
        assert!(d.decode(&big).is_err());
    }

    #[test]
    fn hostile_blocks_are_errors_never_panics() {
        for bad in [
            &[0x80][..],                           // index 0
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], // integer overflow
            &[0x00, 0x05, b'a'],                   // string past the end
            &[0x00, 0x81, 0xff],                   // Huffman: EOS padding too long
            &[0xc0],                               // empty dynamic table
            &[0x40],                               // name string missing
        ] {
            assert!(Decoder::default().decode(bad).is_err(), "{bad:?}");
        }
        // random bytes: errors or headers, never a panic
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let mut block = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                block.push(x as u8);
            }
            let _ = Decoder::default().decode(&block);
        }
    }
}
