//! The cache on disk: the snapshot format (written streamed, 64 entities
//! per lock), its node identity, and loading it back.

use super::*;

/// Which node and boot a snapshot was written on (`/etc/machine-id`,
/// `/proc/sys/kernel/random/boot_id`; empty when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    pub machine_id: String,
    pub boot_id: String,
    /// Seconds since boot (suspend included, `/proc/uptime`) when the
    /// snapshot is written: on the same boot, the reader knows how much real
    /// time passed since, whatever the wall clock did.
    pub uptime_secs: Option<u64>,
}

impl NodeIdentity {
    /// This host's: `/etc/machine-id` (or `/var/lib/dbus/machine-id`) and
    /// `<proc_root>/sys/kernel/random/boot_id`.
    pub fn of_host(proc_root: &std::path::Path) -> NodeIdentity {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().chars().take(64).collect::<String>())
                .filter(|s| !s.is_empty())
        };
        NodeIdentity {
            machine_id: read(std::path::Path::new("/etc/machine-id"))
                .or_else(|| read(std::path::Path::new("/var/lib/dbus/machine-id")))
                .unwrap_or_default(),
            boot_id: read(&proc_root.join("sys/kernel/random/boot_id")).unwrap_or_default(),
            uptime_secs: uptime_secs(proc_root),
        }
    }
}

/// Whole seconds since boot, suspend included (`<proc_root>/uptime`).
pub fn uptime_secs(proc_root: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(proc_root.join("uptime")).ok()?;
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

/// Why a snapshot was not loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a qoslet metrics snapshot (or one of an older format)")]
    Foreign,
    #[error("snapshot is truncated or corrupt")]
    Corrupt,
    #[error(
        "snapshot was written on another machine (machine id {snapshot:?}, this one {here:?})"
    )]
    OtherNode { snapshot: String, here: String },
    #[error("snapshot was written with another metric table")]
    MetricTable,
    #[error("snapshot was written at a {old} s interval, collection is every {new} s")]
    Interval { old: u32, new: u32 },
}

/// A loaded snapshot.
#[derive(Debug)]
pub struct Loaded {
    pub tsdb: Tsdb,
    /// The boot id differs: the node restarted since it was written.
    pub other_boot: bool,
    /// Series time now, as the snapshot's clock would give it: its newest
    /// sample plus the real time since it was written (same boot, both
    /// uptimes known). A wall clock that stepped forward while the writer
    /// ran then does not age the whole cache at the restart.
    pub series_now: Option<u32>,
}

pub(super) const MAGIC: &[u8; 8] = b"QSLTSDB3";

/// FNV-1a, continued from `h`.
pub(super) fn fnv(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
pub(super) const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The metric table a snapshot records: ids and names, in id order.
pub(super) fn metric_table() -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, Metric::ALL.len() as u64);
    for m in Metric::ALL {
        out.push(m as u8);
        put_bytes(&mut out, m.name().as_bytes());
        // how its values are coded: a change of unit or scale is another table
        let sc = Scale::of(m);
        for x in [sc.unit, sc.raw, sc.avg, sc.hist.unwrap_or(-1.0)] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

pub(super) fn put_block<const N: usize>(out: &mut Vec<u8>, b: &Block<N>) {
    for v in [b.start, b.rows, b.prev_ts] {
        put_varint(out, v.into());
    }
    for v in b.prev {
        put_varint(out, v.into());
    }
    put_varint(out, b.run.into());
    put_bytes(out, &b.buf);
}

pub(super) fn put_raw_block(out: &mut Vec<u8>, b: &Option<Block<1>>) {
    match b {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_block(out, b);
        }
    }
}

pub(super) fn put_roll(out: &mut Vec<u8>, b: &Option<Roll>) {
    match b {
        None => out.push(0),
        Some(Roll::Hist(b)) => {
            out.push(1);
            for v in [
                b.start,
                b.rows,
                b.prev_ts,
                b.prev_avg,
                b.prev_first,
                b.prev_buckets.0,
                b.prev_buckets.1,
                b.prev_shape,
                b.run,
            ] {
                put_varint(out, v.into());
            }
            put_bytes(out, &b.buf);
        }
        Some(Roll::Summary(b)) => {
            out.push(2);
            put_block(out, b);
        }
    }
}

pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn varint(&mut self) -> Result<u64, SnapshotError> {
        get_varint(self.b, &mut self.pos).ok_or(SnapshotError::Corrupt)
    }
    pub(super) fn u32(&mut self) -> Result<u32, SnapshotError> {
        u32::try_from(self.varint()?).map_err(|_| SnapshotError::Corrupt)
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let s = self
            .b
            .get(self.pos..self.pos.checked_add(n).ok_or(SnapshotError::Corrupt)?)
            .ok_or(SnapshotError::Corrupt)?;
        self.pos += n;
        Ok(s)
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let n = usize::try_from(self.varint()?).map_err(|_| SnapshotError::Corrupt)?;
        self.take(n)
    }
    pub(super) fn string(&mut self) -> Result<String, SnapshotError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| SnapshotError::Corrupt)
    }
    /// An entity record follows (1) or the list ends (0).
    pub(super) fn present(&mut self) -> Result<bool, SnapshotError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotError::Corrupt),
        }
    }
    pub(super) fn block<const N: usize>(&mut self) -> Result<Block<N>, SnapshotError> {
        let (start, rows, prev_ts) = (self.u32()?, self.u32()?, self.u32()?);
        let mut prev = [0u32; N];
        for p in prev.iter_mut() {
            *p = self.u32()?;
        }
        let (run, buf) = (self.u32()?, self.bytes()?);
        open_block_sane(start, rows, prev_ts, run, buf)?;
        Ok(Block {
            start,
            rows,
            prev_ts,
            prev,
            run,
            buf: buf.to_vec(),
        })
    }
    /// A stream of sealed blocks that walks to its end, each block's header
    /// within what this cache writes.
    pub(super) fn sealed(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let stream = self.bytes()?;
        let mut pos = 0;
        while pos < stream.len() {
            let (start, rows, end, payload) =
                next_block(stream, &mut pos).ok_or(SnapshotError::Corrupt)?;
            if end < start || end - start > ROLLUP_SECS || rows > ROLLUP_SECS || payload.is_empty()
            {
                return Err(SnapshotError::Corrupt);
            }
        }
        Ok(stream.to_vec())
    }
    pub(super) fn raw_block(&mut self) -> Result<Option<Block<1>>, SnapshotError> {
        match self.take(1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(self.block()?)),
            _ => Err(SnapshotError::Corrupt),
        }
    }
    /// The open rollup block, of the kind `hist` says the metric keeps.
    pub(super) fn roll(&mut self, hist: bool) -> Result<Option<Roll>, SnapshotError> {
        match (self.take(1)?[0], hist) {
            (0, _) => Ok(None),
            (1, true) => {
                let mut v = [0u32; 9];
                for x in v.iter_mut() {
                    *x = self.u32()?;
                }
                let buf = self.bytes()?;
                let [start, rows, prev_ts, prev_avg, prev_first, at, len, prev_shape, run] = v;
                open_block_sane(start, rows, prev_ts, run, buf)?;
                if u64::from(at) + u64::from(len) > buf.len() as u64
                    || u64::from(prev_shape >> 1) > MAX_BUCKETS
                {
                    return Err(SnapshotError::Corrupt);
                }
                let buf = buf.to_vec();
                Ok(Some(Roll::Hist(RollBlock {
                    start,
                    rows,
                    prev_ts,
                    prev_avg,
                    prev_first,
                    prev_buckets: (at, len),
                    prev_shape,
                    run,
                    buf,
                })))
            }
            (2, false) => Ok(Some(Roll::Summary(self.block()?))),
            _ => Err(SnapshotError::Corrupt),
        }
    }
}

/// An open block's header as this cache writes it: time runs forward within
/// a day, repeats are rows, and rows have bytes (or there are none).
pub(super) fn open_block_sane(
    start: u32,
    rows: u32,
    prev_ts: u32,
    run: u32,
    buf: &[u8],
) -> Result<(), SnapshotError> {
    let sane = prev_ts >= start
        && prev_ts - start <= ROLLUP_SECS
        && rows <= ROLLUP_SECS
        && run <= rows
        && (rows == 0) == buf.is_empty();
    if sane {
        Ok(())
    } else {
        Err(SnapshotError::Corrupt)
    }
}

/// Writes through `w`, keeping the checksum of what passed.
pub(super) struct Summed<'a> {
    pub(super) w: &'a mut dyn std::io::Write,
    pub(super) sum: u64,
}

impl Summed<'_> {
    pub(super) fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.sum = fnv(self.sum, b);
        self.w.write_all(b)
    }
}

/// Entities encoded per lock in [`write_snapshot_locked`].
pub(super) const SNAPSHOT_BATCH: usize = 64;

pub(super) fn put_entity(out: &mut Vec<u8>, name: &str, e: &Entity) {
    out.push(1);
    put_bytes(out, name.as_bytes());
    put_varint(out, e.last_seen.into());
    put_varint(out, e.series.len() as u64);
    for (m, s) in &e.series {
        out.push(*m as u8);
        out.extend_from_slice(&s.last.to_le_bytes());
        put_varint(out, s.last_ts.into());
        put_bytes(out, &s.raw);
        put_raw_block(out, &s.raw_open);
        put_bytes(out, &s.roll);
        put_roll(out, &s.roll_open);
    }
}

/// The one snapshot writer: header, then each of `names` that `encode` still
/// finds (entity records, each after a 1), then a 0 and the checksum.
pub(super) fn write_entities(
    id: &NodeIdentity,
    interval: u32,
    names: &[String],
    w: &mut dyn std::io::Write,
    encode: &mut dyn FnMut(&[String], &mut Vec<u8>),
) -> std::io::Result<()> {
    let mut out = Summed { w, sum: FNV0 };
    let mut head = MAGIC.to_vec();
    put_bytes(&mut head, id.machine_id.as_bytes());
    put_bytes(&mut head, id.boot_id.as_bytes());
    put_varint(&mut head, id.uptime_secs.map_or(0, |u| u.saturating_add(1)));
    put_bytes(&mut head, &metric_table());
    put_varint(&mut head, interval.into());
    out.put(&head)?;
    let mut buf = Vec::new();
    for batch in names.chunks(SNAPSHOT_BATCH) {
        buf.clear();
        encode(batch, &mut buf);
        out.put(&buf)?;
    }
    out.put(&[0])?;
    let sum = out.sum;
    out.w.write_all(&sum.to_le_bytes())
}

/// Writes a snapshot of the cache behind `db`, holding its lock only while a
/// batch of entities is encoded (never while writing), so collection and
/// queries go on; each entity is consistent, the whole is as of its batch.
pub fn write_snapshot_locked(
    db: &std::sync::Mutex<Tsdb>,
    id: &NodeIdentity,
    w: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let lock = || db.lock().unwrap_or_else(|e| e.into_inner());
    let (interval, names) = {
        let g = lock();
        (g.interval, g.entities.keys().cloned().collect::<Vec<_>>())
    };
    write_entities(id, interval, &names, w, &mut |batch, out| {
        let g = lock();
        for name in batch {
            if let Some(e) = g.entities.get(name) {
                put_entity(out, name, e);
            }
        }
    })
}

impl Tsdb {
    /// Writes the whole cache (for `--state-dir`, so a restart does not blind
    /// the engine) with the node's identity and the metric table.
    pub fn write_snapshot(
        &self,
        id: &NodeIdentity,
        w: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        let names: Vec<String> = self.entities.keys().cloned().collect();
        write_entities(id, self.interval, &names, w, &mut |batch, out| {
            for name in batch {
                if let Some(e) = self.entities.get(name) {
                    put_entity(out, name, e);
                }
            }
        })
    }

    /// [`Tsdb::write_snapshot`] into memory.
    pub fn to_snapshot(&self, id: &NodeIdentity) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = self.write_snapshot(id, &mut out);
        out
    }

    /// Loads a snapshot written on this machine (`here`; an empty machine id
    /// on either side is not checked) with this metric table and `interval`.
    pub fn from_snapshot(
        b: &[u8],
        here: &NodeIdentity,
        interval: u32,
    ) -> Result<Loaded, SnapshotError> {
        if b.len() < MAGIC.len() + 8 || &b[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::Foreign);
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if fnv(FNV0, body).to_le_bytes() != sum {
            return Err(SnapshotError::Corrupt);
        }
        let mut r = Reader {
            b: body,
            pos: MAGIC.len(),
        };
        let (machine, boot) = (r.string()?, r.string()?);
        let uptime = r.varint()?.checked_sub(1);
        if !machine.is_empty() && !here.machine_id.is_empty() && machine != here.machine_id {
            return Err(SnapshotError::OtherNode {
                snapshot: machine,
                here: here.machine_id.clone(),
            });
        }
        if r.bytes()? != metric_table() {
            return Err(SnapshotError::MetricTable);
        }
        let old = r.u32()?;
        if old != interval.clamp(1, 600) {
            return Err(SnapshotError::Interval { old, new: interval });
        }
        let mut db = Tsdb::new(old);
        while r.present()? {
            let name = r.string()?;
            let last_seen = r.u32()?;
            let ns = r.varint()?;
            if ns > Metric::ALL.len() as u64 {
                return Err(SnapshotError::Corrupt);
            }
            // exactly as many as the entity has (ns is bounded above): a vector
            // grown by doubling would keep a quarter of its slots empty for good
            let mut series: Vec<(Metric, Series)> = Vec::with_capacity(ns as usize);
            for _ in 0..ns {
                let m = Metric::from_id(r.take(1)?[0]).ok_or(SnapshotError::Corrupt)?;
                if series.iter().any(|(x, _)| *x == m) {
                    return Err(SnapshotError::Corrupt);
                }
                let last =
                    f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| SnapshotError::Corrupt)?);
                let sc = Scale::of(m);
                series.push((
                    m,
                    Series {
                        last,
                        last_code: encode_at(last, sc.unit, sc.raw),
                        spare: Vec::new(),
                        last_ts: r.u32()?,
                        raw: r.sealed()?,
                        raw_open: r.raw_block()?,
                        roll: r.sealed()?,
                        roll_open: r.roll(sc.hist.is_some())?,
                    },
                ));
            }
            db.series += series.len();
            if db
                .entities
                .insert(name, Entity { last_seen, series })
                .is_some()
            {
                return Err(SnapshotError::Corrupt);
            }
        }
        if r.pos != body.len() {
            return Err(SnapshotError::Corrupt);
        }
        let same_boot = !boot.is_empty() && boot == here.boot_id;
        let series_now = match (same_boot, uptime, here.uptime_secs) {
            (true, Some(then), Some(now)) if now >= then && db.newest() > 0 => Some(
                u32::try_from(u64::from(db.newest()).saturating_add(now - then))
                    .unwrap_or(u32::MAX),
            ),
            _ => None,
        };
        Ok(Loaded {
            tsdb: db,
            other_boot: !boot.is_empty() && !here.boot_id.is_empty() && boot != here.boot_id,
            series_now,
        })
    }
}
