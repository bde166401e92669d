//! The kernel's CPU lists (`0-3,8`): parsed with bounds, counted,
//! canonicalised and formatted.

use std::collections::BTreeSet;

/// CPU ids qoslet accepts are below this (the kernel's largest `NR_CPUS`).
pub const MAX_CPUS: u32 = 8192;
/// The longest CPU list accepted, in bytes (a list of every CPU fits in far less).
pub const MAX_CPU_LIST_LEN: usize = 16 << 10;

/// Number of CPUs in a cpuset list (`0-3,8` -> 5); a malformed list counts 0.
pub fn cpu_count(list: &str) -> u64 {
    parse_cpu_list(list).map_or(0, |c| c.len() as u64)
}

/// Parses a kernel CPU list (`0-3,8`); `None` when malformed, longer than
/// [`MAX_CPU_LIST_LEN`] or naming a CPU id at or above [`MAX_CPUS`]. The
/// work is bounded whatever the input (the length is checked before anything
/// is parsed, ranges fill a fixed bitmap word by word, repeats cost nothing),
/// so a hostile annotation cannot stall the caller.
pub fn parse_cpu_list(list: &str) -> Option<BTreeSet<u32>> {
    if list.len() > MAX_CPU_LIST_LEN {
        return None;
    }
    let mut bits = [0u64; (MAX_CPUS / 64) as usize];
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let id = |s: &str| -> Option<u32> {
            let s = s.trim();
            // digits only (`u32::from_str` also takes a leading '+')
            if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse::<u32>().ok().filter(|&v| v < MAX_CPUS)
        };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (id(a)?, id(b)?),
            None => {
                let a = id(part)?;
                (a, a)
            }
        };
        if b < a {
            return None;
        }
        let (wa, wb) = ((a / 64) as usize, (b / 64) as usize);
        for (w, word) in bits.iter_mut().enumerate().take(wb + 1).skip(wa) {
            let lo = if w == wa { a % 64 } else { 0 };
            let hi = if w == wb { b % 64 } else { 63 };
            *word |= (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
        }
    }
    let mut out = BTreeSet::new();
    for (w, &word) in bits.iter().enumerate() {
        let mut x = word;
        while x != 0 {
            out.insert(w as u32 * 64 + x.trailing_zeros());
            x &= x - 1;
        }
    }
    Some(out)
}

/// A CPU list in the kernel's canonical form (`3,2,1,0` -> `0-3`), as
/// `cpuset.cpus` shows it after a write; `None` when malformed.
pub fn canonical_cpu_list(list: &str) -> Option<String> {
    parse_cpu_list(list).map(|c| format_cpu_list(&c))
}

/// Formats CPUs as the kernel writes them (`0-3,8`).
pub fn format_cpu_list(cpus: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b = it.next().unwrap_or(b);
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    out.join(",")
}
