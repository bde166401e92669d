//! Koordinator's BE eviction (koordlet's `memoryevict` and `cpuevict`
//! plugins, BE features): batch pods go before LS pods feel memory or CPU
//! pressure. Only pods labelled `koordinator.sh/qosClass: BE` are candidates;
//! LS, LSR, LSE and SYSTEM pods are never chosen here.
//!
//! - memory: node usage (MemTotal − MemAvailable) at or above the threshold
//!   percent releases `capacity × (usage% − lower%)`, pods by priority, then
//!   memory used (anonymous + unevictable), largest first;
//! - CPU: BE satisfaction (the real BE limit, or the node's batch-cpu
//!   allocatable, over the BE pods' batch-cpu requests) at or below the lower
//!   percent while BE usage is at or above the usage threshold, averaged over
//!   the time window, releases requests up to the upper percent; pods by
//!   priority, then CPU used over request;
//! - a cool-down after each round that evicted (memory 4 s, CPU 20 s, the CPU
//!   one also from the start), and a pod already evicted is not evicted
//!   again but counts toward what its round releases.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::pod::Pod;

/// Which BE feature a task serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    BeMemory,
    BeCpu,
}

impl Feature {
    /// koordlet's feature gate names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeMemory => "BEMemoryEvict",
            Self::BeCpu => "BECPUEvict",
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `memoryEvictThresholdPercent` and its lower bound, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPolicy {
    threshold_percent: i64,
    lower_percent: i64,
}

/// Why a memory policy cannot run (koordlet skips the feature with a warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryPolicyError {
    #[error("memoryEvictThresholdPercent is not set")]
    Unset,
    #[error("memoryEvictThresholdPercent {0} is not in [0, 100]")]
    Threshold(i64),
    #[error(
        "memoryEvictLowerPercent {lower} is not below memoryEvictThresholdPercent {threshold}"
    )]
    Lower { lower: i64, threshold: i64 },
}

impl MemoryPolicy {
    /// koordlet's `generateConfigCheck` for BEMemoryEvict: a threshold is
    /// needed, the lower bound (the threshold − 2 unless set) must be below it.
    pub fn new(threshold: Option<i64>, lower: Option<i64>) -> Result<Self, MemoryPolicyError> {
        let t = threshold.ok_or(MemoryPolicyError::Unset)?;
        if !(0..=100).contains(&t) {
            return Err(MemoryPolicyError::Threshold(t));
        }
        let lower = lower.unwrap_or(t - 2);
        if lower >= t || lower < 0 {
            return Err(MemoryPolicyError::Lower {
                lower,
                threshold: t,
            });
        }
        Ok(Self {
            threshold_percent: t,
            lower_percent: lower,
        })
    }

    pub fn threshold_percent(&self) -> i64 {
        self.threshold_percent
    }

    pub fn lower_percent(&self) -> i64 {
        self.lower_percent
    }
}

/// Koordinator's `koordinator.sh/eviction-policy` annotation: the BE
/// features that may evict the pod (a JSON array of feature names). Pods
/// without it may be evicted by any; a malformed or empty one by none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    #[default]
    Any,
    Only(Vec<String>),
}

pub const ANNOTATION_EVICTION_POLICY: &str = "koordinator.sh/eviction-policy";

impl EvictionPolicy {
    /// From the annotation's value (`None`: no annotation). Bounded: at most
    /// 4 KiB and 16 names are read.
    pub fn parse(v: Option<&str>) -> Self {
        let Some(v) = v else {
            return Self::Any;
        };
        if v.len() > 4096 {
            return Self::Only(vec![]);
        }
        let names = parse_string_array(v).unwrap_or_default();
        Self::Only(names.into_iter().take(16).collect())
    }

    pub fn allows(&self, f: Feature) -> bool {
        match self {
            Self::Any => true,
            Self::Only(names) => names.iter().any(|n| n == f.as_str()),
        }
    }
}

/// A JSON array of strings without escapes (feature names), or `None`.
fn parse_string_array(v: &str) -> Option<Vec<String>> {
    let inner = v.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    if inner.is_empty() {
        return Some(vec![]);
    }
    inner
        .split(',')
        .map(|item| {
            let item = item.trim();
            let s = item.strip_prefix('"')?.strip_suffix('"')?;
            (!s.contains('"') && !s.contains('\\')).then(|| s.to_string())
        })
        .collect()
}

/// How the BE limit in the satisfaction is taken (`cpuEvictPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuEvictPolicy {
    /// The real BE limit: the smallest BE cpuset, capped by the besteffort quota.
    #[default]
    ByRealLimit,
    /// The node's `kubernetes.io/batch-cpu` allocatable.
    ByAllocatable,
}

/// The `cpuEvictBE…` fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuPolicy {
    pub lower_percent: i64,
    pub upper_percent: i64,
    /// `cpuEvictBEUsageThresholdPercent` (90 when unset).
    pub usage_threshold_percent: i64,
    /// `cpuEvictTimeWindowSeconds` (the collect interval when unset or shorter).
    pub window: Duration,
    pub policy: CpuEvictPolicy,
}

/// Why a CPU policy cannot run (koordlet skips the feature with a warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CpuPolicyError {
    #[error("cpuEvictBESatisfactionLowerPercent {0} is not in (0, 60]")]
    Lower(i64),
    #[error("cpuEvictBESatisfactionUpperPercent {0} is not in (0, 100)")]
    Upper(i64),
    #[error("cpuEvictBESatisfactionUpperPercent {upper} is below cpuEvictBESatisfactionLowerPercent {lower}")]
    Order { lower: i64, upper: i64 },
}

impl CpuPolicy {
    /// koordlet's `isSatisfactionConfigValid`.
    pub fn check(&self) -> Result<(), CpuPolicyError> {
        if self.lower_percent <= 0 || self.lower_percent > 60 {
            return Err(CpuPolicyError::Lower(self.lower_percent));
        }
        if self.upper_percent <= 0 || self.upper_percent >= 100 {
            return Err(CpuPolicyError::Upper(self.upper_percent));
        }
        if self.upper_percent < self.lower_percent {
            return Err(CpuPolicyError::Order {
                lower: self.lower_percent,
                upper: self.upper_percent,
            });
        }
        Ok(())
    }
}

/// Node memory as koordlet reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMemory {
    /// MemTotal − MemAvailable (or the scope's working set), bytes.
    pub used: i64,
    /// The node's memory capacity, bytes.
    pub capacity: i64,
}

/// One reading of the BE CPU figures, milli-cores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeCpu {
    /// The real BE limit (cpuset size × 1000, capped by the besteffort quota).
    pub real_limit: i64,
    /// The BE pods' batch-cpu requests.
    pub request: i64,
    /// What the besteffort cgroup used.
    pub usage: i64,
}

/// A round's work for one feature: release this much, trying pods in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub feature: Feature,
    /// Bytes (memory) or batch-cpu milli-cores (CPU).
    pub release: i64,
    /// Indices into the pods, in eviction order.
    pub order: Vec<usize>,
    /// Why, with the figures (for the log, the event and `qoslet explain`).
    pub reason: String,
}

fn percent_used(used: i64, capacity: i64) -> i64 {
    ((used as i128 * 100) / capacity as i128) as i64
}

/// The BE memory task: `None` below the threshold or without capacity.
pub fn memory_task(policy: MemoryPolicy, node: NodeMemory, pods: &[Pod]) -> Option<Task> {
    if node.capacity <= 0 {
        return None;
    }
    let pct = percent_used(node.used, node.capacity);
    if pct < policy.threshold_percent {
        return None;
    }
    let release =
        ((node.capacity as i128 * (pct - policy.lower_percent) as i128) / 100).max(0) as i64;
    if release <= 0 {
        return None;
    }
    let used = |p: &Pod| p.stats.as_ref().and_then(|s| s.memory_used).unwrap_or(0);
    let mut order: Vec<usize> = (0..pods.len())
        .filter(|i| pods[*i].be_labelled && pods[*i].eviction_policy.allows(Feature::BeMemory))
        .collect();
    // koordlet compares priorities only when both are set, which is no total
    // order when some are unset (and Rust's sort needs one): an unset priority
    // ranks as 0, kubelet's convention; the same order when all or none are set
    order.sort_by(|&i, &j| {
        let (a, b) = (&pods[i], &pods[j]);
        a.priority_or_zero()
            .cmp(&b.priority_or_zero())
            .then_with(|| match (used(a), used(b)) {
                (0, 0) => b.name.cmp(&a.name),
                (0, _) => std::cmp::Ordering::Greater,
                (_, 0) => std::cmp::Ordering::Less,
                (x, y) => y.cmp(&x),
            })
    });
    Some(Task {
        feature: Feature::BeMemory,
        release,
        order,
        reason: format!(
            "node memory used {pct}% >= memoryEvictThresholdPercent {}%; releasing {} bytes to reach {}%",
            policy.threshold_percent, release, policy.lower_percent
        ),
    })
}

/// The samples of BE CPU over time (koordlet's metric cache, for this feature).
#[derive(Debug, Clone, Default)]
pub struct CpuHistory {
    samples: VecDeque<(Duration, BeCpu)>,
}

/// BE CPU figures as floats (koordlet's metric cache answers in float64).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BeCpuF {
    pub real_limit: f64,
    pub request: f64,
    pub usage: f64,
}

impl From<BeCpu> for BeCpuF {
    fn from(s: BeCpu) -> Self {
        Self {
            real_limit: s.real_limit as f64,
            request: s.request as f64,
            usage: s.usage as f64,
        }
    }
}

/// The history's view of a window: the mean, how many samples, the last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuWindow {
    pub avg: BeCpuF,
    pub count: usize,
    pub current: BeCpuF,
}

impl CpuHistory {
    /// Records a reading; readings older than `keep` are dropped.
    pub fn push(&mut self, now: Duration, sample: BeCpu, keep: Duration) {
        self.samples.push_back((now, sample));
        while let Some((t, _)) = self.samples.front() {
            if now.saturating_sub(*t) > keep {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    /// The time between the last two readings (zero with fewer).
    pub fn interval(&self) -> Duration {
        let n = self.samples.len();
        if n < 2 {
            return Duration::ZERO;
        }
        self.samples[n - 1].0.saturating_sub(self.samples[n - 2].0)
    }

    /// The readings within `[now − window, now]`.
    pub fn window(&self, now: Duration, window: Duration) -> Option<CpuWindow> {
        let inside: Vec<BeCpu> = self
            .samples
            .iter()
            .filter(|(t, _)| now.saturating_sub(*t) <= window && *t <= now)
            .map(|(_, s)| *s)
            .collect();
        let current = BeCpuF::from(*inside.last()?);
        let n = inside.len() as f64;
        let sum = inside.iter().fold((0f64, 0f64, 0f64), |a, s| {
            (
                a.0 + s.real_limit as f64,
                a.1 + s.request as f64,
                a.2 + s.usage as f64,
            )
        });
        Some(CpuWindow {
            avg: BeCpuF {
                real_limit: sum.0 / n,
                request: sum.1 / n,
                usage: sum.2 / n,
            },
            count: inside.len(),
            current,
        })
    }
}

/// koordlet's `isBECPUUsageHighEnough`.
fn usage_high_enough(usage: f64, limit: f64, threshold_percent: i64) -> bool {
    if limit <= 0.0 {
        return false;
    }
    if limit < 1000.0 {
        return true;
    }
    usage / limit >= threshold_percent as f64 / 100.0
}

/// Milli-cores of requests to release to bring satisfaction up to the upper
/// percent (0: satisfied enough).
fn release_for(policy: &CpuPolicy, request: f64, limit: f64) -> i64 {
    if request <= 0.0 {
        return 0;
    }
    let sat = limit / request;
    if sat > policy.lower_percent as f64 / 100.0 {
        return 0;
    }
    let gap = policy.upper_percent as f64 / 100.0 - sat;
    if gap <= 0.0 {
        return 0;
    }
    (request * gap) as i64
}

/// The BE CPU task. `batch_allocatable` is the node's batch-cpu allocatable
/// in milli-cores (for `evictByAllocatable`; unknown → no task).
pub fn cpu_task(
    policy: &CpuPolicy,
    w: &CpuWindow,
    window_samples_needed: usize,
    batch_allocatable: Option<i64>,
    pods: &[Pod],
) -> Result<Option<Task>, CpuPolicyError> {
    policy.check()?;
    if w.count < window_samples_needed {
        return Ok(None);
    }
    let limit_of = |s: &BeCpuF| match policy.policy {
        CpuEvictPolicy::ByRealLimit => s.real_limit,
        CpuEvictPolicy::ByAllocatable => match batch_allocatable {
            Some(0) => 1.0,
            Some(a) if a > 0 => a as f64,
            _ => -1.0,
        },
    };
    let (avg_limit, cur_limit) = (limit_of(&w.avg), limit_of(&w.current));
    if !usage_high_enough(w.avg.usage, avg_limit, policy.usage_threshold_percent) {
        return Ok(None);
    }
    let avg_release = release_for(policy, w.avg.request, avg_limit);
    if avg_release <= 0 {
        return Ok(None);
    }
    if !usage_high_enough(w.current.usage, cur_limit, policy.usage_threshold_percent) {
        return Ok(None);
    }
    let release = if w.current.request == w.avg.request && cur_limit == avg_limit {
        avg_release
    } else {
        let cur = release_for(policy, w.current.request, cur_limit);
        if cur <= 0 {
            return Ok(None);
        }
        avg_release.min(cur)
    };
    let cpu_share = |p: &Pod| {
        let used = p.stats.as_ref().and_then(|s| s.cpu_milli).unwrap_or(0);
        if p.requests.batch_cpu_milli > 0 {
            used as f64 / p.requests.batch_cpu_milli as f64
        } else {
            0.0
        }
    };
    let mut order: Vec<usize> = (0..pods.len())
        .filter(|i| pods[*i].be_labelled && pods[*i].eviction_policy.allows(Feature::BeCpu))
        .collect();
    // an unset priority ranks as 0 (see the memory task)
    order.sort_by(|&i, &j| {
        let (a, b) = (&pods[i], &pods[j]);
        a.priority_or_zero()
            .cmp(&b.priority_or_zero())
            .then_with(|| cpu_share(b).total_cmp(&cpu_share(a)))
    });
    let sat = if w.avg.request > 0.0 {
        avg_limit * 100.0 / w.avg.request
    } else {
        0.0
    };
    Ok(Some(Task {
        feature: Feature::BeCpu,
        release,
        order,
        reason: format!(
            "BE CPU satisfaction {sat:.0}% <= cpuEvictBESatisfactionLowerPercent {}% (limit {avg_limit:.0}m, request {:.0}m, usage {:.0}m); releasing {release}m of batch-cpu requests to reach {}%",
            policy.lower_percent, w.avg.request, w.avg.usage, policy.upper_percent
        ),
    }))
}

/// What a round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    /// Pods newly evicted, by index, with the feature that chose each.
    pub evicted: Vec<(usize, Feature)>,
    /// Released per feature, counting pods evicted earlier and still listed.
    pub released: BTreeMap<Feature, i64>,
    /// Features whose target was not reached (the pods ran out).
    pub short: Vec<Feature>,
}

/// koordlet's `KillAndEvictPods`: tasks in order; a pod evicted for one task
/// counts toward every task; a pod evicted in an earlier round counts as
/// pending release without being evicted again; a task stops once its target
/// is released. `evict` returns whether the pod was evicted.
pub fn execute(
    tasks: &[Task],
    pods: &[Pod],
    already_evicted: impl Fn(&Pod) -> bool,
    mut evict: impl FnMut(&Pod, &Task) -> bool,
) -> Round {
    let amount = |p: &Pod, f: Feature| match f {
        Feature::BeMemory => p.stats.as_ref().and_then(|s| s.memory_used).unwrap_or(0),
        Feature::BeCpu => p.requests.batch_cpu_milli.max(0),
    };
    let mut round = Round::default();
    let mut handled = vec![false; pods.len()];
    let credit = |round: &mut Round, p: &Pod| {
        for t in tasks.iter().filter(|t| t.release > 0) {
            *round.released.entry(t.feature).or_default() += amount(p, t.feature);
        }
    };
    for task in tasks {
        let done =
            |round: &Round| round.released.get(&task.feature).copied().unwrap_or(0) >= task.release;
        if done(&round) {
            continue;
        }
        for &i in &task.order {
            if handled[i] {
                continue;
            }
            let p = &pods[i];
            if already_evicted(p) {
                handled[i] = true;
                credit(&mut round, p);
            } else if evict(p, task) {
                handled[i] = true;
                round.evicted.push((i, task.feature));
                credit(&mut round, p);
            } else {
                continue;
            }
            if done(&round) {
                break;
            }
        }
        if !done(&round) {
            round.short.push(task.feature);
        }
    }
    round
}

/// koordlet's cool-downs and its memory of evicted pods.
#[derive(Debug, Clone)]
pub struct Koord {
    pub memory_cool: Duration,
    pub cpu_cool: Duration,
    /// How long an evicted pod's UID is remembered.
    pub remember: Duration,
    last_memory: Option<Duration>,
    last_cpu: Duration,
    evicted: BTreeMap<String, Duration>,
}

/// At most this many evicted UIDs are remembered.
pub const MAX_REMEMBERED: usize = 4096;

impl Koord {
    /// Starts at `now`: the CPU feature is cooling from the start, as koordlet's.
    pub fn new(now: Duration) -> Self {
        Self {
            memory_cool: Duration::from_secs(4),
            cpu_cool: Duration::from_secs(20),
            remember: Duration::from_secs(120),
            last_memory: None,
            last_cpu: now,
            evicted: BTreeMap::new(),
        }
    }

    pub fn memory_cooling(&self, now: Duration) -> bool {
        self.last_memory.is_some_and(|t| now < t + self.memory_cool)
    }

    pub fn cpu_cooling(&self, now: Duration) -> bool {
        now.saturating_sub(self.last_cpu) < self.cpu_cool
    }

    /// Whether the pod was evicted (and is still remembered).
    pub fn was_evicted(&self, uid: &str, now: Duration) -> bool {
        self.evicted
            .get(uid)
            .is_some_and(|t| now.saturating_sub(*t) < self.remember)
    }

    /// Remembers a round: its evicted pods, and the cool-down of each feature
    /// that evicted one.
    pub fn record(&mut self, now: Duration, round: &Round, pods: &[Pod]) {
        for (i, f) in &round.evicted {
            match f {
                Feature::BeMemory => self.last_memory = Some(now),
                Feature::BeCpu => self.last_cpu = now,
            }
            if !pods[*i].uid.is_empty() {
                self.evicted.insert(pods[*i].uid.clone(), now);
            }
        }
        let remember = self.remember;
        self.evicted
            .retain(|_, t| now.saturating_sub(*t) < remember);
        while self.evicted.len() > MAX_REMEMBERED {
            let oldest = self
                .evicted
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.evicted.remove(&k),
                None => break,
            };
        }
    }

    /// Forgets a pod whose eviction failed: it is a candidate again, and no
    /// longer counted as releasing what it holds.
    pub fn forget(&mut self, uid: &str) {
        self.evicted.remove(uid);
    }

    /// Marks a UID evicted at `at` by `feature` (restored after a restart):
    /// remembered, and the feature cooling down from `at`.
    pub fn remember_evicted(&mut self, uid: String, feature: Feature, at: Duration) {
        match feature {
            Feature::BeMemory => {
                self.last_memory = Some(self.last_memory.map_or(at, |t| t.max(at)))
            }
            Feature::BeCpu => self.last_cpu = self.last_cpu.max(at),
        }
        if !uid.is_empty() && self.evicted.len() < MAX_REMEMBERED {
            self.evicted.insert(uid, at);
        }
    }
}
