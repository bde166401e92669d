//! The executor: applies a plan through the cgroups layer, tick after tick.
//!
//! It remembers what it last wrote (or found already right) in each file.
//! A write whose value has not changed since is skipped without touching the
//! file, except on the tick when that file is due for a drift check: each
//! file is re-read once every `verify_every` ticks (spread evenly over the
//! ticks), and a value someone else changed is put back and reported as
//! drift. So a steady state costs almost no I/O and writes nothing, and drift
//! is undone within `verify_every` ticks. Sooner where the kernel tells of the
//! write: each cgroup a file is owned in is watched ([`qoslet_cgroups::watch`]),
//! and on the tick after anyone wrote a file there (systemd applying a unit's
//! properties again, the runtime, qoslet itself) its files are re-read, so
//! what another writer undid is back within one tick. The back-off on a file
//! that keeps drifting holds for these checks too.
//!
//! A setting that leaves the plan (its feature turned off, its pod now of
//! another class) is not just forgotten: where the kernel has a default that
//! koordlet writes back (group identity 0, SCHED_IDLE off, burst 0,
//! memory.min/low 0, memory.high max, no I/O limit) that value is written,
//! tick after tick until it sticks or the cgroup is gone. Settings the
//! runtime owns (quota, shares, memory limit, cpuset) are put back by the
//! plugins that changed them and by kubelet's next update.

// settings by (cgroup, knob): names from the store (kubelet's and the
// runtime's ids), not chosen by pod authors; SipHash showed in the tick's profile
use qoslet_metrics::fasthash::FastMap;

use qoslet_cgroups::fs::Outcome;
use qoslet_cgroups::watch::Written;
use qoslet_cgroups::{CgroupError, CgroupPath, Cgroups, Knob, KnobKind};

use crate::error::EngineError;
use crate::plan::{key, Key, Plan};

/// What executing a plan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Files changed this tick.
    pub written: usize,
    /// Files read and found right.
    pub unchanged: usize,
    /// Writes skipped: the value is the one applied before and the file was not due for a check.
    pub skipped: usize,
    /// Files someone else had changed, put back (each line names the cgroup, the setting and the value).
    pub drift: Vec<String>,
    /// Failed writes, each naming the file and value; the others still ran.
    pub errors: Vec<EngineError>,
    /// Writes to cgroups that were gone (removed since the inventory listed
    /// them: their pod or container ended): not errors.
    pub gone: usize,
    /// What happened to each write of the plan, in the plan's order.
    pub states: Vec<WriteState>,
}

/// What happened to one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteState {
    Written,
    /// Read and found right.
    Unchanged,
    /// Applied before and not due for a drift check: not read.
    Skipped,
    /// Dry run: the file differs (or could not be read) and would be written.
    WouldWrite,
    /// Dry run: the file already holds the value.
    WouldKeep,
    Error(String),
}

impl WriteState {
    /// Whether a file changed (or, in a dry run, would), or the write failed.
    pub fn changes(&self) -> bool {
        matches!(
            self,
            WriteState::Written | WriteState::WouldWrite | WriteState::Error(_)
        )
    }

    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        match self {
            WriteState::Written => "written".into(),
            WriteState::Unchanged => "unchanged".into(),
            WriteState::Skipped => "skipped".into(),
            WriteState::WouldWrite => "would-write".into(),
            WriteState::WouldKeep => "would-keep".into(),
            WriteState::Error(e) => format!("error: {e}").into(),
        }
    }
}

/// What a file would get (dry run): its cgroup, setting, and whether the file differs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The absolute file path and the value, per file the setting means on this host.
    pub files: Vec<(String, String)>,
    /// Whether any of them differs from the file now (`None`: unreadable).
    pub would_change: Option<bool>,
    /// Why the setting cannot be written here (missing kernel feature, bad path).
    pub error: Option<String>,
}

impl Preview {
    /// The dry run's answer as a write state.
    pub fn state(&self) -> WriteState {
        match (&self.error, self.would_change) {
            (Some(e), _) => WriteState::Error(e.clone()),
            (None, Some(false)) => WriteState::WouldKeep,
            (None, _) => WriteState::WouldWrite,
        }
    }
}

#[derive(Debug)]
struct Known {
    knob: Knob,
    /// The tick (mod verify_every) on which this file is re-read.
    slot: u64,
    /// Drift checks in a row that found someone else's value (another writer
    /// fighting over this file), and the tick before which it is not checked
    /// again: each repeat doubles the wait, up to [`MAX_BACKOFF`] checks.
    drifts: u32,
    quiet_until: u64,
    /// The tick a reset of this file to its unset value was last put back
    /// (`None`: never): resets on consecutive ticks are a writer that never
    /// stops, and meet the back-off.
    last_reset: Option<u64>,
    /// What the file goes back to when it leaves the plan (`None`: the
    /// kernel's default, [`restore_value`]).
    restore: Option<Knob>,
}

/// The value a file of `knob` holds when nobody set it (what systemd writes
/// for a unit property left unset): no limit for quotas and memory limits,
/// the kernel's default for the rest.
fn unset_value(knob: &Knob) -> Option<Knob> {
    match knob {
        Knob::CpuQuota {
            quota: Some(_),
            period,
        } => Some(Knob::CpuQuota {
            quota: None,
            period: *period,
        }),
        Knob::MemoryLimit(Some(_)) => Some(Knob::MemoryLimit(None)),
        k => k.kernel_default(),
    }
}

/// Whether `cg`'s files of `knob` hold its [`unset_value`] now (read only for
/// a file someone just wrote).
fn holds_unset(cgroups: &Cgroups, cg: &CgroupPath, knob: &Knob) -> bool {
    let Some(unset) = unset_value(knob) else {
        return false;
    };
    let Ok(files) = cgroups.plan(&unset) else {
        return false;
    };
    !files.is_empty()
        && files.iter().all(|f| {
            cgroups
                .path_of(cg, f)
                .and_then(|p| cgroups.read_file(&p))
                .is_ok_and(|cur| {
                    if f.keyed {
                        qoslet_cgroups::blkio::keyed_same(&cur, &f.value)
                    } else {
                        qoslet_cgroups::fs::same(&cur, &f.value)
                    }
                })
        })
}

/// The longest back-off on a file that keeps drifting, in drift-check intervals.
pub const MAX_BACKOFF: u64 = 64;

/// The value a setting goes back to when no plugin plans it any more, where
/// the kernel has a default (what koordlet writes back when a feature is
/// turned off); `None` for settings the runtime owns.
pub fn restore_value(k: &Knob) -> Option<Knob> {
    k.kernel_default()
}

/// [`restore_value`] on this layout: on cgroup v2 `memory.oom.group` is
/// kubelet's (>= 1.28 sets 1 on every container), never written back under it.
pub fn restore_value_on(k: &Knob, v2: bool) -> Option<Knob> {
    match k {
        Knob::MemoryTune(qoslet_cgroups::MemTune::OomGroup, _) if v2 => None,
        _ => restore_value(k),
    }
}

/// Applies plans; keeps what it applied between ticks.
#[derive(Debug)]
pub struct Executor {
    known: FastMap<Key, Known>,
    /// Settings that left the plan, still to be written back to their default.
    restoring: FastMap<Key, (CgroupPath, Knob)>,
    tick: u64,
    next_slot: u64,
    verify_every: u64,
    /// The next tick on which lost watch events may make every file due.
    next_full_check: u64,
}

impl Executor {
    /// `verify_every`: re-read each file once every this many ticks (1: every tick).
    pub fn new(verify_every: u64) -> Self {
        Self {
            known: FastMap::default(),
            restoring: FastMap::default(),
            tick: 0,
            next_slot: 0,
            verify_every: verify_every.max(1),
            next_full_check: 0,
        }
    }

    /// How many files the executor remembers.
    pub fn known_files(&self) -> usize {
        self.known.len()
    }

    /// Applies `plan` (in the order the kernel accepts, every write tried even
    /// when one fails). Files no longer in the plan are forgotten.
    pub fn execute(&mut self, plan: &Plan, cgroups: &Cgroups) -> Report {
        self.tick += 1;
        let v2 = cgroups.host().is_v2();
        let phase = self.tick % self.verify_every;
        // the files someone wrote in watched cgroups since the last tick are due
        // now (events lost: every file, at most once per drift-check interval)
        let (all_due, written) = match cgroups.written() {
            Written::Some(v) => {
                let mut m: FastMap<CgroupPath, Vec<String>> = FastMap::default();
                for (cg, f) in v {
                    m.entry(cg).or_default().push(f);
                }
                (false, m)
            }
            Written::Unknown => {
                let now = self.tick >= self.next_full_check;
                if now {
                    self.next_full_check = self.tick + self.verify_every;
                }
                (now, FastMap::default())
            }
        };
        let due = |cg: &CgroupPath, knob: &Knob| {
            all_due
                || written
                    .get(cg)
                    .is_some_and(|names| match cgroups.plan(knob) {
                        Ok(files) => files.iter().any(|f| names.iter().any(|n| n == f.file)),
                        Err(_) => true,
                    })
        };
        let mut r = Report {
            states: vec![WriteState::Skipped; plan.len()],
            ..Default::default()
        };
        // first what left the plan goes back to the kernel's default (a burst to 0
        // before any quota shrinks against it), until it sticks or the cgroup is gone
        let restoring = &mut self.restoring;
        self.known.retain(|k, kn| {
            let keep = plan.contains(k);
            if !keep {
                let back = match &kn.restore {
                    Some(r) => (*r != kn.knob).then(|| r.clone()),
                    None => restore_value_on(&kn.knob, v2),
                };
                if let Some(v) = back {
                    restoring.insert(k.clone(), (k.0.clone(), v));
                }
            }
            keep
        });
        // a setting planned again is the plan's
        self.restoring.retain(|k, _| !plan.contains(k));
        let mut done = Vec::new();
        // in the order the kernel accepts (a burst back to 0 before its quota
        // shrinks, parents before children as quotas grow), as the plan's own
        let back: Vec<(&Key, (CgroupPath, Knob))> =
            self.restoring.iter().map(|(k, v)| (k, v.clone())).collect();
        let writes: Vec<(CgroupPath, Knob)> = back.iter().map(|(_, w)| w.clone()).collect();
        for i in cgroups.order(&writes) {
            let (k, (cg, knob)) = (&back[i].0, &back[i].1);
            match cgroups.apply(cg, knob) {
                Ok(o) => {
                    if o == Outcome::Written {
                        r.written += 1;
                    }
                    done.push((*k).clone());
                }
                Err(
                    CgroupError::Missing { .. }
                    | CgroupError::Unsupported { .. }
                    | CgroupError::Gone { .. },
                ) => done.push((*k).clone()),
                Err(e) => r.errors.push(EngineError::Restore {
                    cgroup: cg.clone(),
                    knob: knob.kind(),
                    device: k.2,
                    error: e.to_string(),
                }),
            }
        }
        for k in done {
            self.restoring.remove(&k);
        }
        let mut todo: Vec<(CgroupPath, Knob)> = Vec::new();
        // (key, same value as known, index in the plan, checked on its slot,
        // the file was just written by someone and now holds its unset value)
        let mut todo_keys: Vec<(Key, bool, usize, bool, bool)> = Vec::new();
        // the cgroups of files checked on their slot are watched again: a cgroup made
        // anew at the same path, or a watch the kernel's limit refused before
        let mut rewatch: FastMap<CgroupPath, ()> = FastMap::default();
        for (at, w) in plan.writes().iter().enumerate() {
            let k = key(w);
            match self.known.get(&k) {
                Some(kn)
                    if kn.knob == w.knob
                        && (self.tick < kn.quiet_until
                            || (kn.slot != phase && !due(&k.0, &w.knob))) =>
                {
                    r.skipped += 1
                }
                Some(kn) => {
                    let same = kn.knob == w.knob;
                    let on_slot = kn.slot == phase;
                    if on_slot && !rewatch.contains_key(&k.0) {
                        rewatch.insert(k.0.clone(), ());
                    }
                    // a write seen by its watch that put the file back to its unset
                    // value is a reset (systemd applying a unit's properties again,
                    // as kubelet's QoS updates make it on every new pod), not another
                    // writer with a value of its own: put back at once, every time
                    let reset = same
                        && !all_due
                        && written.contains_key(&k.0)
                        && holds_unset(cgroups, &w.cgroup, &w.knob);
                    todo.push((w.cgroup.clone(), w.knob.clone()));
                    todo_keys.push((k, same, at, on_slot, reset));
                }
                None => {
                    todo.push((w.cgroup.clone(), w.knob.clone()));
                    todo_keys.push((k, false, at, true, false));
                }
            }
        }
        for cg in rewatch.keys() {
            cgroups.watch(cg);
        }
        // new values go in the order the kernel accepts (which reads the files'
        // current values); drift checks re-apply what is already known to be
        // accepted, after them, without that extra read
        let (new, checks): (Vec<usize>, Vec<usize>) =
            (0..todo.len()).partition(|&i| !todo_keys[i].1);
        let new_writes: Vec<(CgroupPath, Knob)> = new.iter().map(|&i| todo[i].clone()).collect();
        // cpusets: every cgroup first widened to old ∪ new (parents first), so the
        // children-first writes of the new sets meet the kernel's containment rule
        for e in cgroups.widen_cpusets(&new_writes) {
            r.errors.push(EngineError::WidenCpuset {
                path: e
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                error: e.to_string(),
            });
        }
        let order: Vec<usize> = cgroups
            .order(&new_writes)
            .into_iter()
            .map(|j| new[j])
            .chain(checks)
            .collect();
        for i in order {
            let (cg, knob) = &todo[i];
            let (k, expected, at, on_slot, reset) = &todo_keys[i];
            if !self.known.contains_key(k) {
                // told of anyone's writes to it from before qoslet's first
                cgroups.watch(cg);
            }
            match cgroups.apply(cg, knob) {
                Ok(o) => {
                    r.states[*at] = if o == Outcome::Written {
                        WriteState::Written
                    } else {
                        WriteState::Unchanged
                    };
                    let (slot, mut drifts, mut last_reset) = match self.known.get(k) {
                        Some(kn) => (kn.slot, kn.drifts, kn.last_reset),
                        None => {
                            self.next_slot += 1;
                            (self.next_slot % self.verify_every, 0, None)
                        }
                    };
                    let mut quiet_until = 0;
                    let tick = self.tick;
                    // a reset on the tick after the last one put back is a writer that
                    // never stops: the back-off's, as a rival's (and so is every reset
                    // until a check on the file's slot finds its value right again)
                    let lone_reset =
                        *reset && drifts == 0 && last_reset.is_none_or(|t| t + 1 < tick);
                    if *reset && o == Outcome::Written {
                        last_reset = Some(tick);
                    }
                    if o == Outcome::Written {
                        r.written += 1;
                        if *expected && lone_reset {
                            r.drift.push(format!(
                                "{cg}: {} was reset to its unset value outside qoslet (a unit's properties applied again?); put back to {knob:?}",
                                knob.name()
                            ));
                        } else if *expected {
                            drifts = drifts.saturating_add(1);
                            // a second drift in a row: another writer fights over this
                            // file; check it less and less often instead of every time
                            let wait = if drifts >= 2 {
                                (1u64 << (drifts - 1).min(6)).min(MAX_BACKOFF)
                            } else {
                                0
                            };
                            quiet_until = self.tick + wait * self.verify_every;
                            r.drift.push(if wait > 0 {
                                format!(
                                    "{cg}: {} was changed outside qoslet again ({drifts} checks in a row); put back to {knob:?}, next check in {} ticks",
                                    knob.name(),
                                    wait * self.verify_every
                                )
                            } else {
                                format!(
                                    "{cg}: {} was changed outside qoslet; put back to {knob:?}",
                                    knob.name()
                                )
                            });
                        } else {
                            drifts = 0;
                        }
                    } else {
                        r.unchanged += 1;
                        // only a check on the file's own slot ends a run of drifts:
                        // the read-back after qoslet's own put-back write (its event)
                        // must not, or a writer slower than a tick is fought for ever
                        if *on_slot {
                            drifts = 0;
                        }
                    }
                    self.known.insert(
                        k.clone(),
                        Known {
                            knob: knob.clone(),
                            slot,
                            drifts,
                            quiet_until,
                            last_reset,
                            restore: plan.restore_of(k).cloned(),
                        },
                    );
                }
                Err(e @ CgroupError::Gone { .. }) => {
                    // the pod or container ended since the inventory: nothing to set
                    self.known.remove(k);
                    tracing::debug!(error = %e, "write skipped");
                    r.states[*at] = WriteState::Error(e.to_string());
                    r.gone += 1;
                }
                Err(e) => {
                    self.known.remove(k);
                    r.states[*at] = WriteState::Error(e.to_string());
                    r.errors.push(EngineError::write(k, &e));
                }
            }
        }
        // once per drift-check interval, the watches of cgroups no file is owned in
        // any more are dropped (the kernel does not tell of a removed cgroup)
        if phase == 0 {
            let owned: FastMap<&CgroupPath, ()> = self
                .known
                .keys()
                .map(|k| &k.0)
                .chain(self.restoring.values().map(|(cg, _)| cg))
                .map(|cg| (cg, ()))
                .collect();
            cgroups.retain_watches(&|cg| owned.contains_key(cg));
        }
        r
    }

    /// Forgets what was applied to one file, so the next plan writes it even if
    /// unchanged (its owner is known to have rewritten it: kubelet's update).
    pub fn forget(&mut self, cgroup: &CgroupPath, kind: KnobKind) {
        self.known.remove(&(cgroup.clone(), kind, None));
    }

    /// Settings waiting to be written back to their default.
    pub fn restoring(&self) -> usize {
        self.restoring.len()
    }

    /// What applying `plan` would do, file by file, without writing.
    pub fn preview(plan: &Plan, cgroups: &Cgroups) -> Vec<Preview> {
        plan.writes()
            .iter()
            .map(|w| {
                let files = cgroups
                    .plan(&w.knob)
                    .and_then(|fs| {
                        fs.into_iter()
                            .map(|f| cgroups.path_of(&w.cgroup, &f).map(|p| (p, f)))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(|e| e.to_string());
                match files {
                    Err(e) => Preview {
                        files: Vec::new(),
                        would_change: None,
                        error: Some(e),
                    },
                    Ok(fs) => {
                        let mut change = Some(false);
                        for (p, f) in &fs {
                            match cgroups.read_file(p) {
                                Ok(cur) => {
                                    // compared as the executor compares (kernel formats)
                                    let differs = if f.keyed {
                                        !qoslet_cgroups::blkio::keyed_same(&cur, &f.value)
                                    } else {
                                        !qoslet_cgroups::fs::same(&cur, &f.value)
                                    };
                                    if differs {
                                        change = change.map(|_| true);
                                    }
                                }
                                Err(_) => change = None,
                            }
                        }
                        Preview {
                            files: fs
                                .into_iter()
                                .map(|(p, f)| (p.display().to_string(), f.value))
                                .collect(),
                            would_change: change,
                            error: None,
                        }
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Write;
    use qoslet_cgroups::memfs::MemFs;
    use std::sync::Arc;

    /// The executor's tests run on the in-memory tree.
    fn tree() -> (Arc<MemFs>, Cgroups) {
        MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            // a cgroup without the quota files (a kernel without CFS bandwidth)
            ("cpu/kubepods/noquota/cgroup.procs", ""),
            ("cpu/kubepods/besteffort/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/besteffort/cpu.cfs_period_us", "100000\n"),
            ("cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/besteffort/pod1/cpu.cfs_period_us", "100000\n"),
        ])
    }

    fn quota(cg: &str, q: u64) -> Write {
        Write {
            cgroup: CgroupPath::parse(cg).unwrap(),
            knob: Knob::CpuQuota {
                quota: Some(q),
                period: 100_000,
            },
            plugin: crate::plan::Plugin::CpuSuppress,
            rule: String::new(),
        }
    }

    /// Issue 14: a setting that leaves the plan (the feature turned off) is
    /// written back to the kernel's default, as koordlet does; a gone cgroup
    /// ends the attempt.
    #[test]
    fn settings_leaving_the_plan_are_written_back_to_their_defaults() {
        let (m, cg) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.cfs_burst_us", "0\n"),
            ("cpu/cpu.idle", "0\n"),
            ("cpu/kubepods/burstable/pod1/cpu.cfs_burst_us", "0\n"),
            ("cpu/kubepods/burstable/pod1/cpu.idle", "0\n"),
            ("cpu/kubepods/burstable/pod1/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/burstable/pod1/cpu.cfs_period_us", "100000\n"),
        ]);
        let pod = CgroupPath::parse("/kubepods/burstable/pod1").unwrap();
        let w = |knob| Write {
            cgroup: pod.clone(),
            knob,
            plugin: crate::plan::Plugin::CpuSuppress,
            rule: String::new(),
        };
        let mut plan = Plan::new();
        plan.add(w(Knob::CpuBurst(50_000)));
        plan.add(w(Knob::CpuIdle(true)));
        plan.add(w(Knob::CpuQuota {
            quota: Some(200_000),
            period: 100_000,
        }));
        let mut e = Executor::new(10);
        assert_eq!(e.execute(&plan, &cg).written, 3);
        let read = |f: &str| {
            m.at(&format!("cpu/kubepods/burstable/pod1/{f}"))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(
            (read("cpu.cfs_burst_us"), read("cpu.idle")),
            ("50000".into(), "1".into())
        );
        // the features are turned off: nothing planned any more
        let r = e.execute(&Plan::new(), &cg);
        assert_eq!(r.written, 2, "{r:?}");
        assert_eq!(
            (read("cpu.cfs_burst_us"), read("cpu.idle")),
            ("0".into(), "0".into())
        );
        assert_eq!(
            read("cpu.cfs_quota_us"),
            "200000",
            "the runtime's: left to its owner"
        );
        assert_eq!(e.restoring(), 0);
        // a pod removed before its restore: dropped, not retried forever
        e.execute(&plan, &cg);
        m.remove("cpu/kubepods/burstable/pod1");
        let r = e.execute(&Plan::new(), &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(e.restoring(), 0);
    }

    #[test]
    fn steady_state_skips_and_drift_is_put_back_within_verify_every_ticks() {
        let (m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort", 300_000));
        plan.add(quota("/kubepods/besteffort/pod1", 200_000));
        let mut ex = Executor::new(5);
        let r = ex.execute(&plan, &cg);
        assert_eq!((r.written, r.errors.len()), (2, 0), "{r:?}");
        // the tick after, what was written (a write in a watched cgroup) is read once
        let r = ex.execute(&plan, &cg);
        assert_eq!((r.written, r.skipped, r.unchanged), (0, 0, 2), "{r:?}");
        // steady: no writes; most ticks touch no file at all
        let mut skipped = 0;
        for _ in 0..5 {
            let r = ex.execute(&plan, &cg);
            assert_eq!(r.written, 0, "{r:?}");
            skipped += r.skipped;
        }
        assert_eq!(skipped, 8, "each file read once in 5 ticks");
        // someone changes a file: put back within 5 ticks, reported as drift
        let f = "cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us";
        m.set(f, "50000");
        let mut drift = Vec::new();
        for _ in 0..5 {
            drift.extend(ex.execute(&plan, &cg).drift);
        }
        assert_eq!(m.at(f).unwrap(), "200000");
        assert_eq!(drift.len(), 1, "{drift:?}");
        assert!(drift[0].contains("pod1"), "{drift:?}");
        // a changed value is written at once
        let mut plan2 = Plan::new();
        plan2.add(quota("/kubepods/besteffort", 100_000));
        let r = ex.execute(&plan2, &cg);
        assert_eq!((r.written, r.drift.len()), (1, 0), "{r:?}");
        assert_eq!(ex.known_files(), 1, "files no longer planned are forgotten");
    }

    /// Issue 44: a file someone else writes (systemd applying a pod slice's
    /// properties again) is put back on the next tick, not at its next drift
    /// check; other cgroups' files stay unread; a writer that keeps undoing
    /// it meets the back-off instead of a write every tick.
    #[test]
    fn a_write_in_a_watched_cgroup_is_put_back_on_the_next_tick() {
        let (m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort", 300_000));
        plan.add(quota("/kubepods/besteffort/pod1", 200_000));
        let mut ex = Executor::new(100);
        assert_eq!(ex.execute(&plan, &cg).written, 2);
        ex.execute(&plan, &cg);
        let r = ex.execute(&plan, &cg);
        assert_eq!((r.skipped, r.written), (2, 0), "steady: {r:?}");
        let f = "cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us";
        m.set(f, "-1");
        let r = ex.execute(&plan, &cg);
        assert_eq!(m.at(f).unwrap(), "200000", "put back on the next tick");
        assert_eq!((r.written, r.skipped, r.drift.len()), (1, 1, 1), "{r:?}");
        // its own write is read back once, then quiet again
        assert_eq!(ex.execute(&plan, &cg).skipped, 1);
        assert_eq!(ex.execute(&plan, &cg).skipped, 2);
        // a writer that undoes it every tick: put back, then checked less and less
        let mut writes = 0;
        for _ in 0..40 {
            m.set(f, "-1");
            writes += ex.execute(&plan, &cg).written;
        }
        assert!(writes < 10, "a fight: {writes} writes in 40 ticks");
    }

    /// Review of issue 44: a writer slower than a tick (another agent's loop)
    /// with a value of its own still meets the back-off: the read-back of
    /// qoslet's own put-back write (its watch event) does not end the run of
    /// drifts.
    #[test]
    fn a_writer_slower_than_a_tick_meets_the_back_off() {
        let (m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort/pod1", 200_000));
        let mut ex = Executor::new(100);
        ex.execute(&plan, &cg);
        ex.execute(&plan, &cg);
        let f = "cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us";
        let mut writes = 0;
        for t in 0..60 {
            if t % 3 == 0 {
                m.set(f, "50000");
            }
            writes += ex.execute(&plan, &cg).written;
        }
        assert!(
            writes <= 3,
            "a fight every 3 ticks: {writes} writes in 60 ticks"
        );
    }

    /// Second review of issue 44: systemd applies a slice's properties again
    /// whenever kubelet updates its QoS cgroups (on every new pod), writing
    /// the unset value (`max`, -1) over qoslet's quota. That is no rival with
    /// a value of its own: each reset is put back at the next tick, never
    /// backed off, and logged; a rival's value afterwards still meets the
    /// back-off.
    #[test]
    fn a_reset_to_the_unset_value_is_put_back_every_time() {
        let (m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort/pod1", 200_000));
        let mut ex = Executor::new(100);
        ex.execute(&plan, &cg);
        ex.execute(&plan, &cg);
        let f = "cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us";
        let (mut writes, mut logged) = (0, 0);
        for t in 0..60 {
            if t % 3 == 0 {
                m.set(f, "-1");
            }
            let r = ex.execute(&plan, &cg);
            writes += r.written;
            logged += r.drift.len();
            assert_eq!(m.at(f).unwrap(), "200000", "tick {t}: the quota stands");
        }
        assert_eq!((writes, logged), (20, 20));
        let mut writes = 0;
        for t in 0..60 {
            if t % 3 == 0 {
                m.set(f, "50000");
            }
            writes += ex.execute(&plan, &cg).written;
        }
        assert!(writes <= 3, "a rival's value: {writes} writes in 60 ticks");
    }

    /// Review of issue 44: the kernel does not tell of a removed cgroup
    /// directory, so the watches of cgroups no file is owned in any more are
    /// dropped once per drift-check interval; only the files written are due.
    #[test]
    fn watches_follow_the_files_owned_and_only_the_written_file_is_due() {
        let (m, cg) = MemFs::v1_tree(&[
            ("cpu/cgroup.procs", ""),
            ("cpu/cpu.idle", "0\n"),
            ("cpu/kubepods/besteffort/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/besteffort/cpu.cfs_period_us", "100000\n"),
            ("cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us", "-1\n"),
            ("cpu/kubepods/besteffort/pod1/cpu.cfs_period_us", "100000\n"),
            ("cpu/kubepods/besteffort/pod1/cpu.idle", "0\n"),
        ]);
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort", 300_000));
        plan.add(quota("/kubepods/besteffort/pod1", 200_000));
        plan.add(Write {
            cgroup: CgroupPath::parse("/kubepods/besteffort/pod1").unwrap(),
            knob: Knob::CpuIdle(true),
            plugin: crate::plan::Plugin::CpuQos,
            rule: "test".into(),
        });
        let mut ex = Executor::new(100);
        ex.execute(&plan, &cg);
        // (each cgroup's directory in every v1 hierarchy that has it: cpu here)
        assert_eq!(m.watched(), 2);
        for _ in 0..4 {
            ex.execute(&plan, &cg);
        }
        // someone writes pod1's cpu.idle: that file is due, its quota is not
        m.set("cpu/kubepods/besteffort/pod1/cpu.idle", "0");
        let r = ex.execute(&plan, &cg);
        assert_eq!(m.at("cpu/kubepods/besteffort/pod1/cpu.idle").unwrap(), "1");
        assert_eq!((r.written, r.unchanged), (1, 0), "{r:?}");
        // pod1 leaves the plan: its watches go at the next drift-check tick
        let mut plan2 = Plan::new();
        plan2.add(quota("/kubepods/besteffort", 300_000));
        for _ in 0..100 {
            ex.execute(&plan2, &cg);
        }
        assert_eq!(m.watched(), 1);
    }

    /// Issue 15 item 12: a file that left the plan is forgotten at once, even
    /// while other writes fail (the cache once kept it whenever the plan was no
    /// smaller than the cache, so its drift went unchecked when it came back).
    #[test]
    fn files_leaving_the_plan_are_forgotten_while_others_fail() {
        let (m, cg) = tree();
        let mut e = Executor::new(100);
        let mut p = Plan::new();
        p.add(quota("kubepods/besteffort/pod1", 50_000));
        assert!(e.execute(&p, &cg).errors.is_empty());
        let mut p = Plan::new();
        p.add(quota("kubepods/besteffort", 80_000));
        p.add(quota("kubepods/besteffort/gone", 1_000));
        p.add(quota("kubepods/besteffort/gone2", 1_000));
        let r = e.execute(&p, &cg);
        assert_eq!(
            (r.errors.len(), r.gone),
            (0, 2),
            "gone cgroups are not errors"
        );
        assert_eq!(e.known_files(), 1, "only the written file is known");
        // someone changes pod1 meanwhile; when it is planned again it is read, not skipped
        m.set("cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us", "-1\n");
        let mut p = Plan::new();
        p.add(quota("kubepods/besteffort", 80_000));
        p.add(quota("kubepods/besteffort/pod1", 50_000));
        let r = e.execute(&p, &cg);
        assert_eq!(r.written, 1, "{r:?}");
        assert_eq!(
            m.at("cpu/kubepods/besteffort/pod1/cpu.cfs_quota_us")
                .unwrap()
                .trim(),
            "50000"
        );
    }

    /// Issue 15 item 10: a file another writer keeps changing is put back
    /// with a back-off (each repeat doubles the wait, up to 64 checks), not on
    /// every check with a warning each time; a check that finds the value
    /// right ends the back-off.
    #[test]
    fn a_file_that_keeps_drifting_is_checked_less_and_less_often() {
        let (m, cg) = tree();
        let f = "cpu/kubepods/besteffort/cpu.cfs_quota_us";
        let mut e = Executor::new(1);
        let mut p = Plan::new();
        p.add(quota("kubepods/besteffort", 50_000));
        let mut put_back = 0;
        for _ in 0..300 {
            m.set(f, "-1\n"); // the other writer, before every tick
            put_back += e.execute(&p, &cg).drift.len();
        }
        // 1, 2, 4 ... 64 ticks apart: about 10 put-backs in 300 ticks instead of 299
        assert!((5..=14).contains(&put_back), "{put_back}");
        // the other writer stops: once the value is found right, checks are regular again
        for _ in 0..200 {
            e.execute(&p, &cg);
        }
        m.set(f, "-1\n");
        assert_eq!(
            e.execute(&p, &cg).drift.len(),
            1,
            "checked on the next tick again"
        );
    }

    #[test]
    fn failures_are_reported_and_retried_and_the_others_still_run() {
        let (_m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/noquota", 50_000));
        plan.add(quota("/kubepods/besteffort", 70_000));
        // a pod that ended since the inventory: not an error
        plan.add(quota("/kubepods/gone", 50_000));
        let mut ex = Executor::new(10);
        let r = ex.execute(&plan, &cg);
        assert_eq!(r.written, 1, "{r:?}");
        assert_eq!((r.errors.len(), r.gone), (1, 1), "{r:?}");
        assert!(r.errors[0].to_string().contains("noquota"), "{r:?}");
        assert!(
            matches!(&r.errors[0], EngineError::Write { knob: KnobKind::CpuQuota, cgroup, .. } if cgroup.as_str().contains("noquota")),
            "{r:?}"
        );
        // the tick after, the file written is read back once (a write in a watched cgroup)
        let r = ex.execute(&plan, &cg);
        assert_eq!((r.errors.len(), r.skipped), (1, 0), "{r:?}");
        let r = ex.execute(&plan, &cg);
        assert_eq!(
            (r.errors.len(), r.skipped),
            (1, 1),
            "failed writes are retried: {r:?}"
        );
    }

    #[test]
    fn preview_names_files_and_does_not_write() {
        let (m, cg) = tree();
        let mut plan = Plan::new();
        plan.add(quota("/kubepods/besteffort", 70_000));
        let p = Executor::preview(&plan, &cg);
        assert_eq!(p[0].would_change, Some(true));
        assert_eq!(p[0].state(), WriteState::WouldWrite);
        assert_eq!(p[0].files.len(), 2);
        assert!(p[0].files[1].0.ends_with("besteffort/cpu.cfs_quota_us"));
        assert_eq!(p[0].files[1].1, "70000");
        assert_eq!(
            m.at("cpu/kubepods/besteffort/cpu.cfs_quota_us").unwrap(),
            "-1"
        );
    }
}
