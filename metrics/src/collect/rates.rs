//! Counters into rates: CPU, throttling, I/O and PSI deltas between two
//! readings, counter resets, and the pod/QoS aggregates.

use super::*;

/// What is read every tick, as last read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prev {
    pub(super) mono_ns: u64,
    pub(super) cpu_ns: u64,
    pub(super) psi: [Option<Psi>; 3],
}

/// A counter read only when it may have moved.
#[derive(Debug, Clone)]
pub(super) struct Counter<T> {
    pub(super) value: T,
    /// Until when the value is known to hold: its read, or a later tick at
    /// which it was proven to stand still.
    pub(super) known_at: u64,
    /// Left unread at a tick where it may have moved: until it is read, a
    /// later proof of stillness says nothing about that stretch, so `known_at`
    /// stays where it was (else the stretch's movement, found later, would be
    /// charged to the ticks after the proof: a spike).
    pub(super) pending: bool,
}

/// Advances a counter to instant `at`: with `read` (a fresh value) or without.
/// Returns the previous value and the nanoseconds the delta spans (`None` on
/// the first read). Unread, it is `proven` still (v1: the cgroup did not run)
/// or only believed still: a later read's delta spans the time since it was
/// last read or proven still, so movement that the belief missed is averaged
/// over that time, never charged to one tick (no spike).
pub(super) fn step<T: PartialEq + Clone>(
    c: &mut Option<Counter<T>>,
    read: Option<T>,
    at: u64,
    proven: bool,
) -> Option<(T, u64)> {
    let Some(cur) = c.as_mut() else {
        *c = read.map(|value| Counter {
            value,
            known_at: at,
            pending: false,
        });
        return None;
    };
    let dt = at.saturating_sub(cur.known_at);
    match read {
        None => {
            if !proven {
                cur.pending = true;
            } else if !cur.pending {
                cur.known_at = at;
            }
            Some((cur.value.clone(), dt))
        }
        Some(v) => {
            let prev = std::mem::replace(&mut cur.value, v);
            cur.known_at = at;
            cur.pending = false;
            Some((prev, dt))
        }
    }
}

pub(super) fn io_totals(io: &Devices) -> Option<[u64; 4]> {
    // no device yet (a fresh v2 cgroup's empty io.stat) is zero, not unknown
    Some({
        io.iter().fold([0u64; 4], |a, (_, i)| {
            [
                a[0].saturating_add(i.read_bytes),
                a[1].saturating_add(i.write_bytes),
                a[2].saturating_add(i.read_ops),
                a[3].saturating_add(i.write_ops),
            ]
        })
    })
}

/// Throttled share of periods and throttled time per second, over `dt_ns`
/// since `p`; nothing on a reset (the cgroup recreated).
pub(super) fn throttle_rates(now: &CpuStat, p: &CpuStat, dt_ns: u64, out: &mut Vec<(Metric, f64)>) {
    let (Some(periods), Some(throttled), Some(time)) = (
        now.nr_periods.checked_sub(p.nr_periods),
        now.nr_throttled.checked_sub(p.nr_throttled),
        now.throttled_ns.checked_sub(p.throttled_ns),
    ) else {
        return;
    };
    out.push((
        Metric::CpuThrottledRatio,
        if periods == 0 {
            0.0
        } else {
            (throttled as f64 / periods as f64).min(1.0)
        },
    ));
    if dt_ns > 0 {
        out.push((Metric::CpuThrottledTime, time as f64 / dt_ns as f64));
    } else if time == 0 {
        out.push((Metric::CpuThrottledTime, 0.0));
    }
}

/// Samples of one cgroup: gauges, and the CPU usage and pressure rates against
/// `prev` (then replaced by now).
pub(super) fn samples(
    prev: &mut Option<Prev>,
    mono_ns: u64,
    raw: &CgroupRaw,
) -> Vec<(Metric, f64)> {
    let mut out = Vec::with_capacity(16);
    if let Some(m) = raw.memory {
        out.push((Metric::MemoryUsage, m.usage as f64));
        out.push((Metric::MemoryWorkingSet, m.working_set as f64));
        out.push((Metric::MemoryRss, m.rss as f64));
        out.push((Metric::MemoryCache, m.cache as f64));
    }
    if let Some(o) = raw.oom_kills {
        out.push((Metric::OomKills, o as f64));
    }
    let now = Prev {
        mono_ns,
        cpu_ns: raw.cpu_ns,
        psi: raw.psi,
    };
    let Some(p) = prev.replace(now) else {
        return out;
    };
    let dt = mono_ns.saturating_sub(p.mono_ns) as f64;
    if dt <= 0.0 {
        return out;
    }
    // a counter that went backwards: the cgroup was recreated; rates restart next tick
    if let Some(d) = raw.cpu_ns.checked_sub(p.cpu_ns) {
        out.push((Metric::CpuUsage, d as f64 / dt));
    }
    psi_rates(&raw.psi, &p.psi, dt, &mut out);
    out
}

/// Read/write bytes and ops per second over all devices; `None` after a reset
/// (a counter went backwards, or a device went away).
pub(super) fn io_rates(now: [u64; 4], prev: [u64; 4], dt_ns: f64) -> Option<[(Metric, f64); 4]> {
    if dt_ns <= 0.0 {
        return None;
    }
    let mut d = [0u64; 4];
    for i in 0..4 {
        d[i] = now[i].checked_sub(prev[i])?;
    }
    let s = dt_ns / 1e9;
    Some([
        (Metric::IoReadBytes, d[0] as f64 / s),
        (Metric::IoWriteBytes, d[1] as f64 / s),
        (Metric::IoReadOps, d[2] as f64 / s),
        (Metric::IoWriteOps, d[3] as f64 / s),
    ])
}

/// Stall share of time (µs stalled per µs) per resource; skipped on reset.
pub(super) fn psi_rates(
    now: &[Option<Psi>; 3],
    prev: &[Option<Psi>; 3],
    dt_ns: f64,
    out: &mut Vec<(Metric, f64)>,
) {
    let dt_us = dt_ns / 1000.0;
    let names = [
        (Metric::PsiCpuSome, None),
        (Metric::PsiMemorySome, Some(Metric::PsiMemoryFull)),
        (Metric::PsiIoSome, Some(Metric::PsiIoFull)),
    ];
    for (i, (some, full)) in names.into_iter().enumerate() {
        let (Some(n), Some(p)) = (now[i], prev[i]) else {
            continue;
        };
        if let Some(d) = n.some_us.checked_sub(p.some_us) {
            out.push((some, (d as f64 / dt_us).min(1.0)));
        }
        if let (Some(full), Some(nf), Some(pf)) = (full, n.full_us, p.full_us) {
            if let Some(d) = nf.checked_sub(pf) {
                out.push((full, (d as f64 / dt_us).min(1.0)));
            }
        }
    }
}

/// System (node minus the pods' root cgroup) and BE (the besteffort cgroup)
/// figures. A figure that cannot be known this tick (the root's first read, a
/// counter reset) is left out, never guessed as 0. Without QoS groups (no pods,
/// or pods outside the kubelet root qoslet knows) they are summed over the
/// pods, and only when every pod has its figure.
pub(super) fn aggregate(
    t: &mut Tick,
    groups: &Groups,
    pods: Option<&[(Metric, f64)]>,
    be: Option<&[(Metric, f64)]>,
) {
    if let Some(p) = pods {
        t.pods_root = p.to_vec();
    }
    let pod_readings: Vec<&Reading> = t
        .readings
        .iter()
        .filter(|r| r.target.kind == Kind::Pod)
        .collect();
    let sum = |m: Metric, be_only: bool| -> Option<f64> {
        pod_readings
            .iter()
            .filter(|r| !be_only || r.target.qos_class == "BE")
            .map(|r| get(&r.samples, m))
            .sum()
    };
    let mut system = Vec::new();
    let mut best_effort = Vec::new();
    for m in [Metric::CpuUsage, Metric::MemoryWorkingSet] {
        let Some(node) = get(&t.node, m) else {
            continue;
        };
        let (in_pods, in_be) = match (&groups.pods, pods) {
            (Some(_), Some(s)) => (
                get(s, m),
                match (&groups.besteffort, be) {
                    (Some(_), Some(b)) => get(b, m),
                    (Some(_), None) => None,
                    (None, _) => Some(0.0),
                },
            ),
            (Some(_), None) => (None, None),
            // no groups: the pods' own figures (no pods at all: 0)
            (None, _) => (sum(m, false), sum(m, true)),
        };
        if let Some(p) = in_pods {
            system.push((m, (node - p).max(0.0)));
        }
        if let Some(b) = in_be {
            best_effort.push((m, b.max(0.0)));
        }
    }
    t.system = system;
    t.be = best_effort;
}
