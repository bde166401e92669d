//! The config file as a policy source: [`Reloader`] tells a change of the
//! file's `policy:` section (its content held still for one poll) from a
//! change of other keys, and [`watch_file`] has the agent's policy hub poll it
//! on a thread of its own (its reads, parse and the block-device lookups never
//! run on the thread that serves kubelet). The hub decides what is in force.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::FileConfig;
use qoslet_agent::hub::Offer;
use qoslet_agent::{PolicyHub, Source};

/// Offers every change of `path`'s `policy:` section to `hub` as the file
/// source, checked every `every`. `loaded`: the file as read at start (what
/// the hub holds): a change made since, even before the watch began, is seen.
pub fn watch_file(
    hub: &Arc<PolicyHub>,
    path: PathBuf,
    every: Duration,
    loaded: FileConfig,
    eviction: tokio::sync::watch::Sender<qoslet_eviction::Eviction>,
) {
    let mut r = Reloader::new(path, loaded).with_eviction(eviction);
    hub.poll_source(Source::File, every, move || r.poll());
}

/// The config file is read at most this large (it is a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Watches the config file by its content: a change is acted on once the
/// same content is read at two polls in a row. An editor or `echo >`
/// truncates the file and then writes it: read between the two, the empty
/// file would be the default policy; a copy that keeps the modification time
/// (`cp -p`, `rsync -t`) would be missed by a stat. A file that is empty,
/// missing or unreadable leaves the last good policy in force (the source is
/// stale); a file without `policy:` withdraws it (the defaults, or another
/// source, are in force).
pub(crate) struct Reloader {
    path: PathBuf,
    /// What was last acted on (a hash of the read's outcome); `None`: nothing yet.
    seen: Option<u64>,
    /// A new content read once: acted on if the next poll reads it again.
    pending: Option<u64>,
    current: FileConfig,
    /// The last change left the source invalid or stale: the same good file
    /// again counts as a change (to clear that).
    degraded: bool,
    /// Where a changed `eviction:` section goes (validated).
    eviction: Option<tokio::sync::watch::Sender<qoslet_eviction::Eviction>>,
}

/// What one read of the file found.
#[derive(Hash)]
enum Read {
    Text(String),
    Missing,
    Failed(String),
}

impl Reloader {
    /// `current`: the file as last loaded (the policy the hub holds for it).
    pub(crate) fn new(path: PathBuf, current: FileConfig) -> Self {
        let mut r = Self {
            path,
            seen: None,
            pending: None,
            current,
            degraded: false,
            eviction: None,
        };
        // the file as it is now, when it is the one loaded: already acted on,
        // so the watcher's thread parses only a change (before, its second poll
        // parsed the whole config once more to find it unchanged)
        let now = r.read();
        if let Read::Text(t) = &now {
            if crate::config::parse(t).is_ok_and(|c| c == r.current) {
                r.seen = Some(Self::hash(&now));
            }
        }
        r
    }

    /// Publishes the `eviction:` section's changes to `tx`.
    pub(crate) fn with_eviction(
        mut self,
        tx: tokio::sync::watch::Sender<qoslet_eviction::Eviction>,
    ) -> Self {
        self.eviction = Some(tx);
        self
    }

    /// A changed `eviction:` section, validated and published; one refused
    /// is logged and the last good one stays (kept as current, so the file
    /// fixed counts as a change).
    fn reload_eviction(&mut self, next: &mut FileConfig) {
        if next.eviction == self.current.eviction {
            return;
        }
        match next.eviction.clone().unwrap_or_default().validate() {
            Ok(e) => {
                info!(path = %self.path.display(), "eviction: section reloaded");
                if let Some(tx) = &self.eviction {
                    tx.send_replace(e);
                }
            }
            Err(err) => {
                warn!(path = %self.path.display(), error = %err, "eviction: the changed section is refused; the last good one stays");
                next.eviction = self.current.eviction.clone();
            }
        }
    }

    fn hash(read: &Read) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        read.hash(&mut h);
        h.finish()
    }

    fn read(&self) -> Read {
        use std::io::Read as _;
        let f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Missing,
            Err(e) => return Read::Failed(e.to_string()),
        };
        let mut text = String::new();
        match f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text) {
            Ok(n) if n as u64 > MAX_CONFIG_BYTES => {
                Read::Failed(format!("larger than {MAX_CONFIG_BYTES} bytes"))
            }
            Ok(_) => Read::Text(text),
            Err(e) => Read::Failed(e.to_string()),
        }
    }

    /// What the hub is offered when the file's content changed and held
    /// still since the last poll (`None`: nothing to offer).
    pub(crate) fn poll(&mut self) -> Option<Offer> {
        let read = self.read();
        let h = Self::hash(&read);
        if self.seen == Some(h) {
            self.pending = None;
            return None;
        }
        if self.pending != Some(h) {
            self.pending = Some(h);
            return None;
        }
        self.pending = None;
        self.seen = Some(h);
        let text = match read {
            Read::Text(t) if !t.trim().is_empty() => t,
            Read::Text(_) => return self.stale("the config file is empty"),
            Read::Missing => return self.stale("the config file is gone"),
            Read::Failed(e) => return self.stale(&format!("the config file cannot be read: {e}")),
        };
        let mut next = match crate::config::parse(&text) {
            Ok(c) => c,
            Err(e) => {
                self.degraded = true;
                return Some(Offer::Invalid(format!("{e:#}")));
            }
        };
        self.reload_eviction(&mut next);
        let policy_changed = next.policy != self.current.policy || self.degraded;
        self.degraded = false;
        let others_changed = FileConfig {
            policy: None,
            eviction: None,
            ..next.clone()
        } != FileConfig {
            policy: None,
            eviction: None,
            ..self.current.clone()
        };
        if others_changed {
            warn!(path = %self.path.display(), "config keys other than policy and eviction changed; they take effect at the next restart");
        }
        self.current = next;
        if !policy_changed {
            return None;
        }
        Some(match &self.current.policy {
            Some(p) => Offer::Policy(p.clone()),
            None => Offer::Withdrawn,
        })
    }

    fn stale(&mut self, why: &str) -> Option<Offer> {
        self.degraded = true;
        Some(Offer::Stale(format!("{}: {why}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scratch(tag: &str) -> PathBuf {
        qoslet_cgroups::testing::tree::<&str, &str>(&format!("policy-{tag}"), &[])
    }

    fn loaded(f: &Path) -> FileConfig {
        crate::config::load(f, true).unwrap()
    }

    /// A change is acted on at the second poll that reads it (the first only notes it).
    fn settled(r: &mut Reloader) -> Option<Offer> {
        assert!(
            r.poll().is_none(),
            "a change is not acted on the first time it is read"
        );
        r.poll()
    }

    fn suppress(o: Option<Offer>) -> i64 {
        match o {
            Some(Offer::Policy(p)) => {
                p.resource_used_threshold_with_be
                    .cpu_suppress_threshold_percent
            }
            other => panic!("{other:?}"),
        }
    }

    const P40: &str = "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n";
    const P30: &str = "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 30\n";

    #[test]
    fn reloader_reports_policy_changes_and_invalid_files() {
        let d = scratch("reload");
        let f = d.join("qoslet.yaml");
        std::fs::write(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n",
        )
        .unwrap();
        let mut r = Reloader::new(f.clone(), loaded(&f));
        assert!(
            r.seen.is_some(),
            "the file as loaded is known from the start: polls only read it"
        );
        assert!(
            Reloader::new(f.clone(), FileConfig::default())
                .seen
                .is_none(),
            "a file that is not the one loaded is acted on"
        );
        assert!(
            settled(&mut r).is_none(),
            "the file as loaded: nothing to offer"
        );
        assert!(r.poll().is_none(), "unchanged");
        std::fs::write(&f, P40).unwrap();
        assert_eq!(suppress(settled(&mut r)), 40);
        std::fs::write(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 400\n",
        )
        .unwrap();
        match settled(&mut r) {
            Some(Offer::Invalid(e)) => assert!(e.contains("cpuSuppressThresholdPercent"), "{e}"),
            other => panic!("{other:?}"),
        }
        // the last good file again: offered again, to clear the error
        std::fs::write(&f, P40).unwrap();
        assert_eq!(suppress(settled(&mut r)), 40);
        // a change of another key only: no new policy
        std::fs::write(&f, format!("logLevel: debug\n{P40}")).unwrap();
        assert!(settled(&mut r).is_none());
        // policy: removed: the file withdraws its policy
        std::fs::write(&f, "logLevel: debug\n").unwrap();
        assert!(matches!(settled(&mut r), Some(Offer::Withdrawn)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A file read between its truncation and its write (what `echo > file`
    /// and most editors do) is not published: the empty file would be the
    /// default policy. Found by CI: the watcher thread published a default
    /// `cpuSuppressThresholdPercent` (65) between the two. An empty or
    /// missing file that stays so makes the source stale: the last good
    /// policy stays.
    #[test]
    fn a_half_written_empty_or_missing_file_keeps_the_last_good_policy() {
        let d = scratch("half");
        let f = d.join("qoslet.yaml");
        std::fs::write(&f, P40).unwrap();
        let mut r = Reloader::new(f.clone(), loaded(&f));
        assert!(settled(&mut r).is_none());
        std::fs::write(&f, "").unwrap();
        assert!(r.poll().is_none(), "truncated, read once");
        std::fs::write(&f, P30).unwrap();
        assert!(r.poll().is_none(), "written since: read once again");
        assert_eq!(suppress(r.poll()), 30);
        std::fs::write(&f, "").unwrap();
        assert!(matches!(settled(&mut r), Some(Offer::Stale(w)) if w.contains("empty")));
        std::fs::remove_file(&f).unwrap();
        assert!(matches!(settled(&mut r), Some(Offer::Stale(w)) if w.contains("gone")));
        // back as it was: offered again (the source is no longer stale)
        std::fs::write(&f, P30).unwrap();
        assert_eq!(suppress(settled(&mut r)), 30);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The review's cases: a change made between the start-up read and the
    /// watch is offered, and so is a copy that kept the size and the
    /// modification time (`cp -p`).
    #[test]
    fn changes_a_stat_would_miss_are_seen() {
        let d = scratch("missed");
        let f = d.join("qoslet.yaml");
        std::fs::write(&f, P40).unwrap();
        let at_start = loaded(&f);
        std::fs::write(&f, P30).unwrap();
        let mut r = Reloader::new(f.clone(), at_start);
        assert_eq!(
            suppress(settled(&mut r)),
            30,
            "changed before the watch began"
        );
        let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::fs::write(&f, P40).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(suppress(settled(&mut r)), 40, "same size, same mtime");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Writes `f` whole, as a ConfigMap mount or `mv` does.
    fn replace(f: &Path, text: &str) {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, f).unwrap();
    }

    /// The file through the hub: a changed policy is published whole, an
    /// invalid file keeps the last good policy and carries the error.
    #[tokio::test]
    async fn the_file_source_publishes_changes_and_errors() {
        let d = scratch("watch");
        let f = d.join("qoslet.yaml");
        std::fs::write(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n",
        )
        .unwrap();
        let at_start = loaded(&f);
        let hub = PolicyHub::new(at_start.policy.clone());
        let mut rx = hub.subscribe();
        let (tx, _rx) = tokio::sync::watch::channel(
            qoslet_eviction::EvictionConfig::default()
                .validate()
                .unwrap(),
        );
        watch_file(&hub, f.clone(), Duration::from_millis(10), at_start, tx);
        replace(&f, P40);
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let p = rx.borrow_and_update().clone();
        assert_eq!(
            p.policy
                .resource_used_threshold_with_be
                .cpu_suppress_threshold_percent,
            40
        );
        assert!(p.error.is_none());
        replace(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 400\n",
        );
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let p = rx.borrow_and_update().clone();
        assert_eq!(
            p.policy
                .resource_used_threshold_with_be
                .cpu_suppress_threshold_percent,
            40,
            "the last good one"
        );
        assert!(
            p.error
                .as_deref()
                .is_some_and(|e| e.contains("cpuSuppressThresholdPercent")),
            "{:?}",
            p.error
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Issue 30: the `eviction:` section is hot-reloaded: a valid change is
    /// published (validated), a refused one leaves the last good section
    /// (and the policy offer goes on), the file fixed publishes again.
    #[test]
    fn eviction_section_is_reloaded_and_a_bad_one_refused() {
        let d = scratch("reload-eviction");
        let f = d.join("qoslet.yaml");
        std::fs::write(
            &f,
            "eviction:\n  evictionHard:\n    memory.available: 100Mi\n",
        )
        .unwrap();
        let first = loaded(&f).eviction.unwrap().validate().unwrap();
        let (tx, mut rx) = tokio::sync::watch::channel(first);
        let mut r = Reloader::new(f.clone(), loaded(&f)).with_eviction(tx);
        assert!(settled(&mut r).is_none());
        assert!(!rx.has_changed().unwrap());
        std::fs::write(
            &f,
            "eviction:\n  dryRun: true\n  evictionHard:\n    memory.available: 300Mi\n",
        )
        .unwrap();
        assert!(settled(&mut r).is_none(), "no policy change to offer");
        assert!(rx.has_changed().unwrap());
        let e = rx.borrow_and_update().clone();
        assert!(e.dry_run);
        assert_eq!(
            e.kubelet.thresholds[0].value,
            qoslet_eviction::Amount::Quantity(300 << 20)
        );
        // a refused section: nothing published, the policy still reloads
        std::fs::write(
            &f,
            format!("{P40}eviction:\n  evictionHard:\n    memory.available: 150%\n"),
        )
        .unwrap();
        assert_eq!(suppress(settled(&mut r)), 40);
        assert!(!rx.has_changed().unwrap(), "a refused section published");
        // fixed: published
        std::fs::write(
            &f,
            format!("{P40}eviction:\n  evictionHard:\n    memory.available: 200Mi\n"),
        )
        .unwrap();
        assert!(settled(&mut r).is_none());
        assert!(rx.has_changed().unwrap());
        assert!(!rx.borrow_and_update().dry_run);
    }
}
