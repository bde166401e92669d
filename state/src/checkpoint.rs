//! The store's checkpoint in `--state-dir`: written atomically (temp file,
//! fsync, rename, fsync of the directory) by a background task whenever the
//! store changes, and read once at start.
//!
//! A checkpoint that cannot be read, is corrupt, or belongs to another runtime
//! endpoint is logged and ignored: the store is then rebuilt from the runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::store::{Snapshot, Store};

/// Format tag: a file without it (or with another one) is foreign.
pub const FORMAT: &str = "qoslet.store/v1";
/// File name inside the state dir.
pub const FILE_NAME: &str = "store.json";
/// A checkpoint larger than this is refused at load (a node's store is a few MiB at most).
pub const MAX_BYTES: u64 = 64 << 20;

#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    runtime_endpoint: String,
    written_at: i64,
    #[serde(flatten)]
    snapshot: Snapshot,
}

/// Errors writing a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot write checkpoint: {0}")]
    State(#[from] crate::statefile::StateError),
    #[error("cannot encode checkpoint: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Why a checkpoint was not used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no checkpoint at {0}")]
    Missing(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("corrupt checkpoint {path}: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("foreign checkpoint {path}: format {format:?} for runtime {endpoint:?} (want {FORMAT:?} for {want:?})")]
    Foreign {
        path: PathBuf,
        format: String,
        endpoint: String,
        want: String,
    },
}

/// Whether two spellings name the same runtime socket (`unix:///run/x.sock`,
/// `/run/x.sock`, `unix:///run//x.sock`): a config that switched spelling keeps
/// its checkpoint.
fn same_endpoint(a: &str, b: &str) -> bool {
    // the directory resolved (`/var/run` is often a link to `/run`), the name as is
    let resolve = |e: &str| {
        crate::endpoint::unix_path(e).map(|p| {
            match (p.parent().map(std::fs::canonicalize), p.file_name()) {
                (Some(Ok(dir)), Some(name)) => dir.join(name),
                _ => p,
            }
        })
    };
    match (resolve(a), resolve(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Reads and writes the checkpoint file.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    runtime_endpoint: String,
}

impl Checkpoint {
    pub fn new(dir: impl Into<PathBuf>, runtime_endpoint: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            runtime_endpoint: runtime_endpoint.into(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads the checkpoint, refusing corrupt or foreign files.
    pub fn load(&self) -> Result<Snapshot, LoadError> {
        let path = self.path();
        let bytes = match crate::statefile::read_capped(&path, MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LoadError::Missing(path))
            }
            Err(source) => return Err(LoadError::Read { path, source }),
        };
        // check the tag first, so a foreign file of another shape says "foreign", not "corrupt"
        #[derive(Deserialize)]
        struct Tag {
            #[serde(default)]
            format: String,
            #[serde(default)]
            runtime_endpoint: String,
        }
        let tag: Tag = serde_json::from_slice(&bytes).map_err(|source| LoadError::Corrupt {
            path: path.clone(),
            source,
        })?;
        if tag.format != FORMAT || !same_endpoint(&tag.runtime_endpoint, &self.runtime_endpoint) {
            return Err(LoadError::Foreign {
                path,
                format: tag.format,
                endpoint: tag.runtime_endpoint,
                want: self.runtime_endpoint.clone(),
            });
        }
        let f: File =
            serde_json::from_slice(&bytes).map_err(|source| LoadError::Corrupt { path, source })?;
        Ok(f.snapshot)
    }

    /// Writes `snap` atomically and privately (see [`crate::statefile`]): the
    /// dir 0700, the file 0600, a temp file that never follows a symlink.
    pub fn save(&self, snap: Snapshot) -> Result<(), CheckpointError> {
        crate::statefile::ensure_private_dir(&self.dir)?;
        let f = File {
            format: FORMAT.into(),
            runtime_endpoint: self.runtime_endpoint.clone(),
            written_at: crate::store::now_nanos(),
            snapshot: snap,
        };
        // streamed through the writer's buffer: no copy of the whole
        // checkpoint in memory (hundreds of KiB at a thousand containers)
        crate::statefile::write_atomic_with(&self.path(), |w| {
            serde_json::to_writer(w, &f).map_err(std::io::Error::from)
        })?;
        Ok(())
    }

    /// Writes the store once at start (so a checkpoint of an older version is
    /// rewritten in today's shape), then whenever it changes (coalescing bursts of
    /// changes, at most one write per `min_interval`), and once more when
    /// `shutdown` fires.
    pub async fn run(
        self,
        store: Store,
        mut shutdown: watch::Receiver<bool>,
        min_interval: Duration,
    ) {
        // subscribed before the first snapshot: no change after it is missed
        let mut changes = store.subscribe();
        let mut first = true;
        loop {
            // decide first, snapshot after: a change made before shutdown is always in the last write
            let already = *shutdown.borrow();
            let stop = already
                || !std::mem::take(&mut first)
                    && tokio::select! {
                        _ = changes.changed() => false,
                        _ = shutdown.changed() => true,
                    };
            if !stop {
                tokio::time::sleep(min_interval).await; // let a burst of changes coalesce
            }
            let snap = store.snapshot();
            let this = self.clone();
            let n = (snap.pods.len(), snap.containers.len());
            match tokio::task::spawn_blocking(move || this.save(snap)).await {
                Ok(Ok(())) => debug!(pods = n.0, containers = n.1, "checkpoint written"),
                Ok(Err(e)) => warn!(error = %e, "checkpoint not written"),
                Err(e) => warn!(error = %e, "checkpoint task failed"),
            }
            if stop {
                info!(path = %self.path().display(), "final checkpoint written");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ContainerRecord, PodRecord};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qoslet-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tmpdir("rt");
        let ck = Checkpoint::new(&dir, "unix:///a.sock");
        assert!(matches!(ck.load(), Err(LoadError::Missing(_))));
        let snap = Snapshot {
            pods: vec![PodRecord {
                id: "p".into(),
                name: "web".into(),
                ..Default::default()
            }],
            containers: vec![ContainerRecord {
                id: "c".into(),
                pod_id: "p".into(),
                ..Default::default()
            }],
        };
        ck.save(snap.clone()).unwrap();
        assert_eq!(ck.load().unwrap(), snap);
        // no temp file left behind
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

        let other = Checkpoint::new(&dir, "unix:///b.sock");
        assert!(matches!(other.load(), Err(LoadError::Foreign { .. })));
        // another spelling of the same socket is the same runtime (issue 15 item 5)
        for same in ["/a.sock", "unix:////a.sock", "unix:///./a.sock"] {
            assert_eq!(Checkpoint::new(&dir, same).load().unwrap(), snap, "{same}");
        }
        // through a symlinked directory (/var/run -> /run)
        let real = dir.join("run");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.join("varrun")).unwrap();
        let linked = Checkpoint::new(&dir, format!("unix://{}/c.sock", real.display()));
        linked.save(snap.clone()).unwrap();
        let via = Checkpoint::new(&dir, format!("{}/varrun/c.sock", dir.display()));
        assert_eq!(via.load().unwrap(), snap);
        std::fs::remove_file(linked.path()).unwrap();
        std::fs::remove_file(dir.join("varrun")).unwrap();
        std::fs::remove_dir(&real).unwrap();

        std::fs::write(ck.path(), b"{\"format\":\"something-else\"}").unwrap();
        assert!(matches!(ck.load(), Err(LoadError::Foreign { .. })));
        std::fs::write(ck.path(), b"\x00\x01garbage").unwrap();
        assert!(matches!(ck.load(), Err(LoadError::Corrupt { .. })));
        std::fs::write(
            ck.path(),
            format!(
                "{{\"format\":\"{FORMAT}\",\"runtime_endpoint\":\"unix:///a.sock\",\"pods\":7}}"
            ),
        )
        .unwrap();
        assert!(matches!(ck.load(), Err(LoadError::Corrupt { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn background_writer_follows_the_store_and_flushes_at_shutdown() {
        let dir = tmpdir("bg");
        let ck = Checkpoint::new(&dir, "e");
        let store = Store::new();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(ck.clone().run(store.clone(), rx, Duration::from_millis(5)));
        store.upsert_pod(PodRecord {
            id: "p1".into(),
            ..Default::default()
        });
        for _ in 0..200 {
            if ck.load().map(|s| s.pods.len()).unwrap_or(0) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ck.load().unwrap().pods.len(), 1);
        store.upsert_pod(PodRecord {
            id: "p2".into(),
            ..Default::default()
        });
        tx.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(ck.load().unwrap().pods.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
