//! The config file as a policy source: [`Reloader`] tells a change of the
//! file's `policy:` section (held still for one poll) from a change of other
//! keys, and [`watch_file`] has the agent's policy hub poll it on a thread of
//! its own (its stat, parse and the block-device lookups never run on the
//! thread that serves kubelet). The hub decides what is in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use qoslet_agent::{PolicyHub, Source};

/// Offers every change of `path`'s `policy:` section to `hub` as the file
/// source, checked every `every` (from the file as it is now: a change from
/// here on is seen).
pub fn watch_file(hub: &Arc<PolicyHub>, path: PathBuf, every: Duration) {
    let mut r = Reloader::new(path);
    hub.poll_source(Source::File, every, move || r.poll());
}

/// Watches the config file: a (modified, length) change triggers a re-parse once
/// it has held for one poll. An editor or `echo >` truncates the file and then
/// writes it: read between the two, the empty file would parse as the default
/// policy and be published for a moment.
pub(crate) struct Reloader {
    path: PathBuf,
    seen: Option<(std::time::SystemTime, u64)>,
    /// A changed stamp seen once: it is acted on if the next poll sees it again.
    pending: Option<Option<(std::time::SystemTime, u64)>>,
    current: crate::config::FileConfig,
    /// The last change was invalid (a valid file then counts as a change, to clear the error).
    failed: bool,
}

impl Reloader {
    fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
        let m = std::fs::metadata(path).ok()?;
        Some((m.modified().ok()?, m.len()))
    }

    pub(crate) fn new(path: PathBuf) -> Self {
        let current = crate::config::load(&path, false).unwrap_or_default();
        Self {
            seen: Self::stamp(&path),
            pending: None,
            path,
            current,
            failed: false,
        }
    }

    /// `Some(Ok(policy))` when the file changed (and held still since the last
    /// poll) and its policy with it; `Some(Err(why))` when the changed file is
    /// invalid.
    pub(crate) fn poll(&mut self) -> Option<Result<crate::config::PolicyConfig, String>> {
        let stamp = Self::stamp(&self.path);
        if stamp == self.seen {
            self.pending = None;
            return None;
        }
        if self.pending != Some(stamp) {
            self.pending = Some(stamp);
            return None;
        }
        self.pending = None;
        self.seen = stamp;
        let next = match crate::config::load(&self.path, false) {
            Ok(c) => c,
            Err(e) => {
                self.failed = true;
                return Some(Err(format!("{e:#}")));
            }
        };
        let policy_changed = next.policy != self.current.policy || self.failed;
        self.failed = false;
        let others_changed = crate::config::FileConfig {
            policy: None,
            ..next.clone()
        } != crate::config::FileConfig {
            policy: None,
            ..self.current.clone()
        };
        if others_changed {
            warn!(path = %self.path.display(), "config keys other than policy changed; they take effect at the next restart");
        }
        self.current = next;
        policy_changed.then(|| Ok(self.current.policy.clone().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyConfig;

    fn scratch(tag: &str) -> PathBuf {
        qoslet_cgroups::testing::tree::<&str, &str>(&format!("policy-{tag}"), &[])
    }

    /// A change is acted on at the second poll that sees it (the first only notes it).
    fn settled(r: &mut Reloader) -> Option<Result<PolicyConfig, String>> {
        assert!(
            r.poll().is_none(),
            "a change is not read the first time it is seen"
        );
        r.poll()
    }

    #[test]
    fn reloader_reports_policy_changes_and_invalid_files() {
        let d = scratch("reload");
        let f = d.join("qoslet.yaml");
        std::fs::write(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n",
        )
        .unwrap();
        let mut r = Reloader::new(f.clone());
        assert!(r.poll().is_none(), "unchanged");
        // a different length is a change whatever the clock's resolution
        std::fs::write(&f, "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n").unwrap();
        let p = settled(&mut r).unwrap().unwrap();
        assert_eq!(
            p.resource_used_threshold_with_be
                .cpu_suppress_threshold_percent,
            40
        );
        std::fs::write(
            &f,
            "policy:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 400\n",
        )
        .unwrap();
        let e = settled(&mut r).unwrap().unwrap_err();
        assert!(e.contains("cpuSuppressThresholdPercent"), "{e}");
        // the last good file again: the error clears (the policy itself is the same)
        std::fs::write(&f, "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n").unwrap();
        assert!(settled(&mut r).unwrap().is_ok());
        // a change of another key only: no new policy
        std::fs::write(&f, "logLevel: debug\npolicy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n").unwrap();
        assert!(settled(&mut r).is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A file read between its truncation and its write (what `echo > file`
    /// and most editors do) is not published: the empty file would be the
    /// default policy. Found by CI: the watcher thread published a default
    /// `cpuSuppressThresholdPercent` (65) between the two.
    #[test]
    fn a_half_written_file_is_not_published() {
        let d = scratch("half");
        let f = d.join("qoslet.yaml");
        std::fs::write(&f, "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n").unwrap();
        let mut r = Reloader::new(f.clone());
        std::fs::write(&f, "").unwrap();
        assert!(r.poll().is_none(), "truncated, seen once");
        std::fs::write(&f, "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 30\n").unwrap();
        assert!(r.poll().is_none(), "written since: seen once again");
        let p = r.poll().unwrap().unwrap();
        assert_eq!(
            p.resource_used_threshold_with_be
                .cpu_suppress_threshold_percent,
            30
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Writes `f` whole, as a ConfigMap mount or `mv` does (a truncated file is
    /// the test above's subject, not this one's).
    fn replace(f: &Path, text: &str) {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, f).unwrap();
    }

    /// One source, any subscriber: a changed policy is published whole, an
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
        let initial = crate::config::load(&f, true).unwrap().policy;
        let hub = PolicyHub::new(initial);
        let mut rx = hub.subscribe();
        watch_file(&hub, f.clone(), Duration::from_millis(10));
        replace(&f, "policy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: 40\n");
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
}
