//! What the eviction loop keeps across a restart, in the state dir
//! (`evictions.json`, 0600 in the private dir, written atomically after each
//! eviction): the recent records, and from them what a restarted qoslet must
//! not forget under pressure: a BE pod evicted lately is still refused
//! admission (kubelet recreates its sandbox), a pod Koordinator's model
//! evicted is not chosen again and its feature keeps cooling down, and
//! kubelet's model still waits for its last victim's memory to be released
//! before it chooses another pod. Nothing secret is kept (pod names, figures,
//! messages). A file that cannot be read or parsed is logged and ignored.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use qoslet_eviction::Signal;
use qoslet_state::statefile;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::view::{Record, MAX_RECORDS};

/// The file's name in the state dir.
pub const FILE: &str = "evictions.json";
/// A file larger than this is not read.
const MAX_BYTES: u64 = 4 << 20;
/// A message or name longer than this is cut when read back.
const MAX_TEXT: usize = 4096;
const VERSION: u32 = 1;

/// The reasons a record may carry (a record's reason is `&'static str`).
const REASONS: [&str; 5] = [
    "node-pressure",
    "be-memory",
    "be-cpu-satisfaction",
    "admission",
    "node-reclaim",
];

/// kubelet's model's last victim, until its memory is released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Victim {
    pub uid: String,
    /// The signal it was evicted for.
    #[serde(default)]
    pub signal: Option<String>,
    pub cgroup: String,
    pub working_set: i64,
    /// Unix seconds.
    pub at: u64,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    version: u32,
    records: Vec<SavedRecord>,
    #[serde(default)]
    victim: Option<Victim>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedRecord {
    at: u64,
    sandbox_id: String,
    uid: String,
    namespace: String,
    name: String,
    reason: String,
    signal: Option<String>,
    observed: Option<i64>,
    threshold: Option<i64>,
    grace_seconds: i64,
    message: String,
    dry_run: bool,
    outcome: String,
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_TEXT {
        let mut n = MAX_TEXT;
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        s.truncate(n);
    }
    s
}

impl From<&Record> for SavedRecord {
    fn from(r: &Record) -> Self {
        Self {
            at: r.at,
            sandbox_id: r.sandbox_id.clone(),
            uid: r.uid.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            reason: r.reason.into(),
            signal: r.signal.map(|s| s.as_str().into()),
            observed: r.observed,
            threshold: r.threshold,
            grace_seconds: r.grace_seconds,
            // a reclaim's message lists every image removed: cut, so the
            // file stays far under what is read back
            message: cut(r.message.clone()),
            dry_run: r.dry_run,
            outcome: cut(r.outcome.clone()),
        }
    }
}

impl SavedRecord {
    fn into_record(self) -> Option<Record> {
        let reason = REASONS.into_iter().find(|r| *r == self.reason)?;
        Some(Record {
            at: self.at,
            sandbox_id: cut(self.sandbox_id),
            uid: cut(self.uid),
            namespace: cut(self.namespace),
            name: cut(self.name),
            reason,
            signal: self.signal.as_deref().and_then(Signal::parse),
            observed: self.observed,
            threshold: self.threshold,
            grace_seconds: self.grace_seconds,
            message: cut(self.message),
            dry_run: self.dry_run,
            outcome: cut(self.outcome),
        })
    }
}

/// What was kept: the records (oldest first) and kubelet's last victim.
#[derive(Debug, Default)]
pub struct Restored {
    pub records: Vec<Record>,
    pub victim: Option<Victim>,
}

/// The file, and one writer at a time.
#[derive(Debug)]
pub struct Persist {
    path: PathBuf,
    victim: Mutex<Option<Victim>>,
    writing: tokio::sync::Mutex<()>,
}

impl Persist {
    /// In `state_dir` (the agent's private dir).
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE),
            victim: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what a previous run kept (nothing when absent; a bad file is
    /// logged and ignored). Blocking: at start, off the async workers.
    pub fn load(&self) -> Restored {
        let bytes = match statefile::read_capped(&self.path, MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Restored::default(),
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "eviction records not read; starting without them");
                return Restored::default();
            }
        };
        let saved: Saved = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "eviction records not parsed; starting without them");
                return Restored::default();
            }
        };
        if saved.version != VERSION {
            warn!(path = %self.path.display(), version = saved.version, "eviction records of another version; starting without them");
            return Restored::default();
        }
        let n = saved.records.len();
        let records = saved
            .records
            .into_iter()
            .skip(n.saturating_sub(MAX_RECORDS))
            .filter_map(SavedRecord::into_record)
            .collect();
        let victim = saved.victim.map(|v| Victim {
            uid: cut(v.uid),
            cgroup: cut(v.cgroup),
            ..v
        });
        *self.victim.lock().unwrap_or_else(|e| e.into_inner()) = victim.clone();
        Restored { records, victim }
    }

    /// kubelet's model chose `v` (kept with the next write).
    pub fn set_victim(&self, v: Option<Victim>) {
        *self.victim.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// Writes `records` (and the victim) atomically, off the async workers;
    /// writes are serialized, each one with the records as they are then.
    pub async fn save(&self, records: impl FnOnce() -> Vec<Record>) {
        let _one = self.writing.lock().await;
        let saved = Saved {
            version: VERSION,
            records: records().iter().map(SavedRecord::from).collect(),
            victim: self
                .victim
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        let path = self.path.clone();
        let done = tokio::task::spawn_blocking(move || {
            let bytes = serde_json::to_vec(&saved).unwrap_or_default();
            statefile::write_atomic(&path, &bytes)
        })
        .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "eviction records not written"),
            Err(e) => warn!(error = %e, "eviction records not written"),
        }
    }
}

impl super::Cycle {
    /// Takes back what a previous run kept: Koordinator's remembered pods
    /// and cool-downs, kubelet's model's victim still being cleaned up, the
    /// records and admission's refusals.
    pub(super) fn restore(&mut self, r: Restored) {
        use qoslet_eviction::koord::Feature;
        use std::time::{Duration, Instant};
        let now_unix = super::view::unix_now();
        let now = self.start.elapsed();
        let ago = |at: u64| Duration::from_secs(now_unix.saturating_sub(at));
        for rec in &r.records {
            let done = matches!(rec.outcome.as_str(), "stopped" | "stopping" | "gone");
            if rec.dry_run || !done {
                continue;
            }
            let at = now.saturating_sub(ago(rec.at));
            match rec.reason {
                "be-memory" => self
                    .koord
                    .remember_evicted(rec.uid.clone(), Feature::BeMemory, at),
                "be-cpu-satisfaction" => {
                    self.koord
                        .remember_evicted(rec.uid.clone(), Feature::BeCpu, at)
                }
                _ => {}
            }
        }
        if let Some(v) = r.victim {
            let ago = ago(v.at);
            let cg = qoslet_cgroups::CgroupPath::parse(&v.cgroup);
            if let (true, Ok(cgroup), Some(since)) = (
                ago < qoslet_eviction::kubelet::CLEANUP_WAIT,
                cg,
                Instant::now().checked_sub(ago),
            ) {
                tracing::info!(uid = %v.uid, cgroup = %v.cgroup, ago_s = ago.as_secs(), "restart: waiting for the last victim's memory before evicting another pod");
                self.kubelet.evicted(&v.uid, now.saturating_sub(ago));
                self.cleanup = Some(super::Cleanup {
                    uid: v.uid.clone(),
                    signal: v
                        .signal
                        .as_deref()
                        .and_then(Signal::parse)
                        .unwrap_or(Signal::MemoryAvailable),
                    cgroup,
                    working_set: v.working_set,
                    since,
                });
            }
        }
        if !r.records.is_empty() {
            tracing::info!(
                records = r.records.len(),
                "eviction records of the previous run restored"
            );
        }
        self.view.restore(r.records, now_unix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str, reason: &'static str) -> Record {
        Record {
            at: 1_700_000_000,
            sandbox_id: format!("sb-{uid}"),
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            reason,
            signal: Some(Signal::MemoryAvailable),
            observed: Some(1),
            threshold: Some(2),
            grace_seconds: 0,
            message: "m".into(),
            dry_run: false,
            outcome: "stopped".into(),
        }
    }

    #[tokio::test]
    async fn round_trip_private_and_bad_files_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("qoslet-persist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        statefile::ensure_private_dir(&dir).unwrap();
        let p = Persist::new(&dir);
        assert!(p.load().records.is_empty(), "no file: nothing");
        let victim = Victim {
            uid: "a".into(),
            signal: Some("memory.available".into()),
            cgroup: "/kubepods/besteffort/poda".into(),
            working_set: 42,
            at: 1_700_000_000,
        };
        p.set_victim(Some(victim.clone()));
        let recs = vec![
            record("a", "node-pressure"),
            record("b", "be-cpu-satisfaction"),
        ];
        p.save(|| recs.clone()).await;
        let mode = std::fs::metadata(p.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let q = Persist::new(&dir);
        let r = q.load();
        assert_eq!(r.records, recs);
        assert_eq!(r.victim, Some(victim));
        // an unknown reason is dropped, the rest kept
        let text = std::fs::read_to_string(p.path())
            .unwrap()
            .replace("be-cpu-satisfaction", "bogus");
        std::fs::write(p.path(), text).unwrap();
        assert_eq!(q.load().records, recs[..1]);
        // garbage, another version, too large: nothing, no panic
        for bad in [
            b"{not json".to_vec(),
            br#"{"version":9,"records":[]}"#.to_vec(),
            vec![b' '; (MAX_BYTES + 1) as usize],
        ] {
            std::fs::write(p.path(), bad).unwrap();
            let r = q.load();
            assert!(r.records.is_empty() && r.victim.is_none());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
