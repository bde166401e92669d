use super::*;

fn tree(tag: &str, files: &[(&str, String)]) -> PathBuf {
    qoslet_cgroups::testing::tree(&format!("metrics-{tag}"), files)
}

/// A clock that stands still: each cgroup is read at the tick's instant.
fn frozen() -> Clock {
    Box::new(|| 0)
}

fn put(d: &Path, p: &str, c: impl ToString) {
    std::fs::write(d.join(p), c.to_string()).unwrap();
}

fn proc_files(busy: u64, idle: u64) -> Vec<(&'static str, String)> {
    vec![
        ("proc/stat", format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")),
        ("proc/meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\nCached: 200 kB\n".into()),
        ("proc/loadavg", "1.50 1.00 0.50 2/100 1234\n".into()),
        ("proc/pressure/cpu", "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".into()),
    ]
}

fn target(entity: &str, kind: Kind, cg: &str, class: &str) -> Target {
    Target {
        entity: entity.into(),
        kind,
        cgroup: CgroupPath::parse(cg).unwrap(),
        namespace: "ns".into(),
        pod: "p".into(),
        container: if kind == Kind::Container {
            "c".into()
        } else {
            String::new()
        },
        qos_class: class.into(),
        pod_entity: "pod/p".into(),
    }
}

fn v1_cgroup(
    cg: &str,
    cpu_ns: u64,
    periods: u64,
    throttled: u64,
    usage: u64,
) -> Vec<(String, String)> {
    vec![
        (
            format!("cg/cpu/{cg}/cpu.stat"),
            format!(
                "nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {}\n",
                throttled * 1_000_000
            ),
        ),
        (
            format!("cg/cpuacct/{cg}/cpuacct.usage"),
            format!("{cpu_ns}\n"),
        ),
        (
            format!("cg/memory/{cg}/memory.usage_in_bytes"),
            format!("{usage}\n"),
        ),
        (
            format!("cg/memory/{cg}/memory.stat"),
            format!(
                "total_cache {}\ntotal_rss {}\ntotal_inactive_file {}\ntotal_pgpgin {}\n",
                usage / 4,
                usage / 2,
                usage / 8,
                // pages come in as the cgroup reads from disk
                cpu_ns / 1000 / 4096
            ),
        ),
        (
            format!("cg/memory/{cg}/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n".into(),
        ),
        (
            format!("cg/blkio/{cg}/blkio.throttle.io_service_bytes_recursive"),
            format!("254:0 Read {}\n254:0 Write 0\nTotal 0\n", cpu_ns / 1000),
        ),
        (
            format!("cg/blkio/{cg}/blkio.throttle.io_serviced_recursive"),
            "254:0 Read 10\n254:0 Write 0\nTotal 10\n".into(),
        ),
    ]
}

fn v1_host(d: &Path) -> Host {
    for c in ["cpu", "cpuacct", "memory", "blkio"] {
        std::fs::create_dir_all(d.join("cg").join(c)).unwrap();
        put(d, &format!("cg/{c}/cgroup.procs"), "");
    }
    Host::detect(&d.join("cg")).unwrap()
}

#[test]
fn v1_rates_aggregates_and_bad_input() {
    let mut files: Vec<(String, String)> = proc_files(100, 100)
        .into_iter()
        .map(|(a, b)| (a.to_string(), b))
        .collect();
    // be1 has a CFS quota: the kernel has counted periods already
    files.extend(v1_cgroup("kubepods/be1", 0, 10, 0, 64 << 20));
    files.extend(v1_cgroup("kubepods/be1/c1", 0, 0, 0, 60 << 20));
    files.extend(v1_cgroup("kubepods/ls1", 0, 0, 0, 32 << 20));
    let refs: Vec<(&str, String)> = files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    let d = tree("v1", &refs);
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
    let targets = vec![
        target("pod/be1", Kind::Pod, "/kubepods/be1", "BE"),
        target("container/c1", Kind::Container, "/kubepods/be1/c1", "BE"),
        target("pod/ls1", Kind::Pod, "/kubepods/ls1", "LS"),
        // a container whose cgroup is gone (or never was)
        target(
            "container/ghost",
            Kind::Container,
            "/kubepods/be1/ghost",
            "BE",
        ),
    ]
    .into_iter()
    .map(Arc::new)
    .collect::<Vec<_>>();
    let t = c.tick(1000, 0, &targets);
    assert_eq!(t.readings.len(), 3);
    assert_eq!(t.skipped, 1, "the ghost");
    let be = &t.readings[0].samples;
    assert_eq!(get(be, Metric::MemoryUsage), Some((64u64 << 20) as f64));
    assert_eq!(
        get(be, Metric::MemoryWorkingSet),
        Some((56u64 << 20) as f64)
    );
    assert_eq!(get(be, Metric::OomKills), Some(1.0));
    assert_eq!(get(be, Metric::CpuUsage), None, "no rate on the first tick");

    // one second later: be1 used 0.5 s of CPU, 40 of 100 periods throttled
    for (p, v) in v1_cgroup("kubepods/be1", 500_000_000, 110, 40, 64 << 20) {
        put(&d, &p, v);
    }
    for (p, v) in v1_cgroup("kubepods/ls1", 600_000_000, 0, 0, 32 << 20) {
        put(&d, &p, v);
    }
    // node: 2 CPUs, busy 3 of 4 ticks -> 1.5 cores
    put(
        &d,
        "proc/stat",
        "cpu  103 0 0 101 0 0 0 0 0 0\ncpu0 0\ncpu1 0\n",
    );
    put(
        &d,
        "proc/pressure/cpu",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=251000\n",
    );
    let t = c.tick(1001, 1_000_000_000, &targets);
    assert_eq!(t.skipped, 1);
    assert_eq!(t.readings.len(), 3);
    let be = &t.readings[0].samples;
    assert!((get(be, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9);
    assert!((get(be, Metric::CpuThrottledRatio).unwrap() - 0.4).abs() < 1e-9);
    assert!((get(be, Metric::CpuThrottledTime).unwrap() - 0.04).abs() < 1e-9);
    assert!((get(be, Metric::IoReadBytes).unwrap() - 500_000.0).abs() < 1e-6);
    assert_eq!(get(be, Metric::IoReadOps), Some(0.0));
    assert!((get(&t.node, Metric::CpuUsage).unwrap() - 1.5).abs() < 1e-9);
    assert!((get(&t.node, Metric::PsiCpuSome).unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(get(&t.node, Metric::CpuCapacity), Some(2.0));
    assert_eq!(get(&t.node, Metric::MemoryUsage), Some(600.0 * 1024.0));
    assert_eq!(get(&t.node, Metric::Load1), Some(1.5));
    // no QoS groups known: system = node - the pods (every pod has a rate), BE = BE pods
    assert!((get(&t.system, Metric::CpuUsage).unwrap() - 0.4).abs() < 1e-9);
    assert!((get(&t.be, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9);

    // a counter reset (cgroup recreated): no rate this tick, no spike
    for (p, v) in v1_cgroup("kubepods/be1", 1_000, 1, 0, 64 << 20) {
        put(&d, &p, v);
    }
    // a malformed file: that entity is skipped
    put(&d, "cg/memory/kubepods/ls1/memory.stat", "garbage");
    let t = c.tick(1002, 2_000_000_000, &targets);
    assert_eq!(t.readings.len(), 2, "ls1 skipped");
    assert!(t.readings.iter().all(|r| r.target.entity != "pod/ls1"));
    assert_eq!(get(&t.readings[0].samples, Metric::CpuUsage), None);
    assert_eq!(
        get(&t.readings[0].samples, Metric::MemoryUsage),
        Some((64u64 << 20) as f64)
    );
    // next tick rates resume from the new base
    for (p, v) in v1_cgroup("kubepods/be1", 250_001_000, 11, 0, 64 << 20) {
        put(&d, &p, v);
    }
    let t = c.tick(1003, 3_000_000_000, &targets);
    assert!((get(&t.readings[0].samples, Metric::CpuUsage).unwrap() - 0.25).abs() < 1e-9);
    assert!(c.open_files() > 0, "handles are kept across ticks");

    // a container removed while its files are open: the kernel answers ENODEV
    // at once; on a file tree the directory check finds it within SLOW_EVERY ticks
    std::fs::remove_dir_all(d.join("cg/cpu/kubepods/be1/c1")).unwrap();
    let open = c.open_files();
    let gone = (4..4 + SLOW_EVERY as u32 + 1).any(|i| {
        let t = c.tick(1000 + i, u64::from(i) * 1_000_000_000, &targets);
        t.readings.iter().all(|r| r.target.entity != "container/c1")
    });
    assert!(gone, "the removed container is skipped");
    assert!(c.open_files() < open, "and its handles closed");
    std::fs::remove_dir_all(&d).unwrap();
}

fn v1_tree(tag: &str, cgroups: &[&str]) -> PathBuf {
    let mut files: Vec<(String, String)> = proc_files(100, 100)
        .into_iter()
        .map(|(a, b)| (a.to_string(), b))
        .collect();
    for cg in cgroups {
        files.extend(v1_cgroup(cg, 0, 0, 0, 1 << 20));
    }
    let refs: Vec<(&str, String)> = files.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    tree(tag, &refs)
}

fn v1_counters(d: &Path, cg: &str, usage: u64, periods: u64, throttled: u64, read_bytes: u64) {
    put(d, &format!("cg/cpuacct/{cg}/cpuacct.usage"), usage);
    put(
        d,
        &format!("cg/cpu/{cg}/cpu.stat"),
        format!(
            "nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {}\n",
            throttled * 10_000_000
        ),
    );
    put(
        d,
        &format!("cg/blkio/{cg}/blkio.throttle.io_service_bytes_recursive"),
        format!("254:0 Read {read_bytes}\n254:0 Write 0\nTotal {read_bytes}\n"),
    );
    // what a buffered read leaves in memory.stat: pages charged
    put(
        d,
        &format!("cg/memory/{cg}/memory.stat"),
        format!(
            "total_cache 262144\ntotal_rss 524288\ntotal_inactive_file 131072\ntotal_pgpgin {}\n",
            read_bytes / 4096
        ),
    );
}

/// A 3 s burst (CPU, throttling, I/O) after idle ticks, at any phase of the
/// slow re-read: every burst tick shows its exact rates, and the I/O rate
/// summed over the ticks is every byte read.
#[test]
fn short_bursts_are_seen_whole() {
    let sec = 1_000_000_000u64;
    for phase in 0..SLOW_EVERY {
        let d = v1_tree(&format!("burst{phase}"), &["kubepods/b"]);
        let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
        let targets = vec![Arc::new(target("pod/b", Kind::Pod, "/kubepods/b", "LS"))];
        // it has a CFS quota and ran before: the kernel counted periods
        let (mut usage, mut periods, mut throttled, mut bytes) = (sec, 100u64, 0u64, 0u64);
        let mut seen_bytes = 0.0;
        let mut seen_ratio = Vec::new();
        for n in 0..(30 + phase) {
            let burst = (20 + phase..23 + phase).contains(&n);
            if burst {
                usage += sec / 2;
                periods += 10;
                throttled += 5;
                bytes += 4 << 20;
            }
            v1_counters(&d, "kubepods/b", usage, periods, throttled, bytes);
            let t = c.tick(1000 + n as u32, n * sec, &targets);
            let s = &t.readings[0].samples;
            if n == 0 {
                continue;
            }
            let io = get(s, Metric::IoReadBytes).expect("an I/O rate every tick");
            seen_bytes += io; // each sample stands for one second
            let ratio = get(s, Metric::CpuThrottledRatio).expect("a ratio every tick");
            if burst {
                assert!(
                    (io - (4 << 20) as f64).abs() < 1e-6,
                    "phase {phase} tick {n}: {s:?}"
                );
                assert!((get(s, Metric::CpuThrottledTime).unwrap() - 0.05).abs() < 1e-9);
                seen_ratio.push(ratio);
            } else {
                assert_eq!(io, 0.0, "phase {phase} tick {n}");
                assert_eq!(ratio, 0.0);
            }
        }
        assert_eq!(seen_ratio, vec![0.5; 3], "phase {phase}");
        assert!(
            (seen_bytes - (12u64 << 20) as f64).abs() < 1e-3,
            "phase {phase}: {seen_bytes}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// Direct I/O leaves no sign in memory.stat: while the CPU runs, the I/O
/// counters are believed still until the slow re-read finds them moved; the
/// bytes are then averaged over the whole time since their last read (no
/// spike), and once moving they are read every tick (exact rates).
#[test]
fn io_without_signs_is_averaged_then_followed() {
    let sec = 1_000_000_000u64;
    let d = v1_tree("believed", &["kubepods/q"]);
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
    let targets = vec![Arc::new(target("pod/q", Kind::Pod, "/kubepods/q", "LS"))];
    let io = |d: &Path, bytes: u64| {
        put(
            d,
            "cg/blkio/kubepods/q/blkio.throttle.io_service_bytes_recursive",
            format!("254:0 Read {bytes}\n254:0 Write 0\nTotal {bytes}\n"),
        )
    };
    let mut bytes = 0u64;
    let mut samples = Vec::new();
    for n in 0..=2 * SLOW_EVERY {
        // the CPU runs every tick; from tick 3, 10 MB/s of direct reads
        put(&d, "cg/cpuacct/kubepods/q/cpuacct.usage", (n + 1) * sec / 2);
        if n >= 3 {
            bytes += 10_000_000;
        }
        io(&d, bytes);
        let t = c.tick(1000 + n as u32, n * sec, &targets);
        samples.push(get(&t.readings[0].samples, Metric::IoReadBytes));
    }
    let first = samples.iter().position(|v| v.is_some_and(|v| v > 0.0));
    let first = first.expect("found on the slow re-read");
    assert_eq!(first as u64, SLOW_EVERY, "the slow re-read: {samples:?}");
    // averaged over the SLOW_EVERY seconds since the last read, never above the true rate
    let avg = samples[first].unwrap();
    let want = (SLOW_EVERY - 2) as f64 * 10_000_000.0 / SLOW_EVERY as f64;
    assert!((avg - want).abs() < 1e-3, "{avg} vs {want}");
    // then read every tick while it moves: exact
    for v in &samples[first + 1..] {
        assert!((v.unwrap() - 10_000_000.0).abs() < 1e-3, "{samples:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Direct I/O while the CPU runs, then the CPU stops before the slow
/// re-read: the ticks where the CPU stood still prove nothing about the
/// unread stretch before them, so the bytes found later are averaged over
/// the whole time since the last read; no sample is above the true rate.
#[test]
fn io_unread_while_moving_then_still_never_spikes() {
    let sec = 1_000_000_000u64;
    let d = v1_tree("unreadstill", &["kubepods/u"]);
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
    let targets = vec![Arc::new(target("pod/u", Kind::Pod, "/kubepods/u", "LS"))];
    let (mut usage, mut bytes) = (sec, 0u64);
    let mut samples = Vec::new();
    for n in 0..=SLOW_EVERY {
        // ticks 2-4: the CPU runs and reads 10 MB/s directly (no sign in
        // memory.stat); then it stands still
        if (2..5).contains(&n) {
            usage += sec / 2;
            bytes += 10_000_000;
        }
        put(&d, "cg/cpuacct/kubepods/u/cpuacct.usage", usage);
        put(
            &d,
            "cg/blkio/kubepods/u/blkio.throttle.io_service_bytes_recursive",
            format!("254:0 Read {bytes}\n254:0 Write 0\nTotal {bytes}\n"),
        );
        let t = c.tick(1000 + n as u32, n * sec, &targets);
        samples.push(get(&t.readings[0].samples, Metric::IoReadBytes).unwrap_or(0.0));
    }
    assert!(
        samples.iter().all(|v| *v <= 10_000_000.0 + 1e-6),
        "a spike: {samples:?}"
    );
    // found on the slow re-read, over the time since tick 1 (the last
    // instant it was proven still before the unread stretch)
    let last = samples[SLOW_EVERY as usize];
    let want = 30_000_000.0 / (SLOW_EVERY - 1) as f64;
    assert!((last - want).abs() < 1e-3, "{samples:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A counter that the belief "still" missed (here v1 cpu.stat moving while
/// the usage stands still, which a file tree allows) never makes a spike:
/// its delta spans the time since it was last read.
#[test]
fn a_moved_counter_never_spikes() {
    let mut c: Option<Counter<u64>> = None;
    assert_eq!(step(&mut c, Some(5), 0, false), None);
    // believed still for 9 ticks, then read: 90 over 10 s
    for t in 1..10 {
        assert_eq!(step(&mut c, None, t, false), Some((5, t)));
    }
    assert_eq!(step(&mut c, Some(95), 10, false), Some((5, 10)));
    // proven still, then read: the delta spans one tick
    assert_eq!(step(&mut c, None, 11, true), Some((95, 1)));
    assert_eq!(step(&mut c, Some(96), 12, true), Some((95, 1)));
    // believed still while it may move (ticks 13-15), then proven still
    // (16-19): the proof does not cover the believed stretch, so the read
    // at 20 spans the 8 s since the last read, not the 1 s since a proof
    for t in 13..16 {
        assert_eq!(step(&mut c, None, t, false), Some((96, t - 12)));
    }
    for t in 16..20 {
        assert_eq!(step(&mut c, None, t, true), Some((96, t - 12)));
    }
    assert_eq!(step(&mut c, Some(176), 20, true), Some((96, 8)));
    assert_eq!(step(&mut c, None, 21, true), Some((176, 1)));
}

/// Each cgroup's rate uses the instant of its own read: a read pass that
/// takes 150 ms per cgroup one tick and 10 ms the next skews none of them
/// (one tick timestamp for all made the later ones read far off).
#[test]
fn rates_use_each_cgroups_own_read_instant() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let names: Vec<String> = (0..8).map(|i| format!("kubepods/s{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let d = v1_tree("slowpass", &refs);
    let now = Arc::new(AtomicU64::new(0));
    let step = Arc::new(AtomicU64::new(0));
    let (clock_now, clock_step, dir, cgs) = (now.clone(), step.clone(), d.clone(), names.clone());
    // each look at the clock is `step` later (150 ms, then 10 ms: a pass
    // whose pace changes), and every cgroup has used exactly one core up to
    // that instant (its file shows it)
    let clock: Clock = Box::new(move || {
        let s = clock_step.load(Ordering::SeqCst);
        let t = clock_now.fetch_add(s, Ordering::SeqCst) + s;
        for cg in &cgs {
            put(&dir, &format!("cg/cpuacct/{cg}/cpuacct.usage"), t);
        }
        t
    });
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(clock);
    let targets: Vec<Arc<Target>> = names
        .iter()
        .map(|cg| {
            Arc::new(target(
                &format!("pod/{cg}"),
                Kind::Pod,
                &format!("/{cg}"),
                "LS",
            ))
        })
        .collect();
    for n in 0..4u64 {
        step.store(
            if n % 2 == 0 { 150_000_000 } else { 10_000_000 },
            Ordering::SeqCst,
        );
        // the tick begins at the clock's next reading
        let mono = now.load(Ordering::SeqCst) + step.load(Ordering::SeqCst);
        let t = c.tick(1000 + n as u32, mono, &targets);
        if n == 0 {
            continue;
        }
        for r in &t.readings {
            let u = get(&r.samples, Metric::CpuUsage).unwrap();
            assert!((u - 1.0).abs() < 1e-9, "{}: {u}", r.target.entity);
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Each target's files and counters follow its entity whatever the list's
/// order or Arcs; a target no longer asked for closes its files; a cgroup
/// removed and made again on a file tree is read from its new files.
#[test]
fn state_follows_the_entity_not_the_list() {
    let sec = 1_000_000_000u64;
    let d = v1_tree("slots", &["kubepods/a", "kubepods/b"]);
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
    let list = |names: &[&str]| -> Vec<Arc<Target>> {
        names
            .iter()
            .map(|n| {
                Arc::new(target(
                    &format!("pod/{n}"),
                    Kind::Pod,
                    &format!("/kubepods/{n}"),
                    "LS",
                ))
            })
            .collect()
    };
    let t = c.tick(1000, 0, &list(&["a", "b"]));
    assert_eq!(t.readings.len(), 2);
    let open = c.open_files();
    put(&d, "cg/cpuacct/kubepods/a/cpuacct.usage", sec / 2);
    put(&d, "cg/cpuacct/kubepods/b/cpuacct.usage", sec / 4);
    // the same entities, new Arcs, the other order: rates at once
    let t = c.tick(1001, sec, &list(&["b", "a"]));
    let rate = |t: &Tick, e: &str| {
        let r = t.readings.iter().find(|r| r.target.entity == e).unwrap();
        get(&r.samples, Metric::CpuUsage)
    };
    assert_eq!(t.readings[0].target.entity, "pod/b");
    assert!((rate(&t, "pod/a").unwrap() - 0.5).abs() < 1e-9);
    assert!((rate(&t, "pod/b").unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(c.open_files(), open, "no file opened again");
    // b no longer asked for: its files close; a keeps its counters
    put(&d, "cg/cpuacct/kubepods/a/cpuacct.usage", sec);
    let t = c.tick(1002, 2 * sec, &list(&["a"]));
    assert!((rate(&t, "pod/a").unwrap() - 0.5).abs() < 1e-9);
    assert!(c.open_files() < open, "b's files closed");
    // a removed and made again (new files, a counter restarted)
    std::fs::remove_dir_all(d.join("cg/memory/kubepods/a")).unwrap();
    std::fs::remove_dir_all(d.join("cg/cpu/kubepods/a")).unwrap();
    std::fs::remove_dir_all(d.join("cg/cpuacct/kubepods/a")).unwrap();
    for (p, v) in v1_cgroup("kubepods/a", 1000, 0, 0, 3 << 20) {
        std::fs::create_dir_all(d.join(&p).parent().unwrap()).unwrap();
        put(&d, &p, v);
    }
    let seen = (3..3 + SLOW_EVERY as u32 + 1).any(|i| {
        let t = c.tick(1000 + i, u64::from(i) * sec, &list(&["a"]));
        t.readings
            .iter()
            .any(|r| get(&r.samples, Metric::MemoryUsage) == Some((3u64 << 20) as f64))
    });
    assert!(seen, "the new cgroup's files are read");
    // a name given twice (a bad inventory): every file is counted closed
    c.tick(2000, 100 * sec, &list(&["a", "a"]));
    c.tick(2001, 101 * sec, &list(&["a"]));
    assert!(c.open_files() > 0);
    c.tick(2002, 102 * sec, &[]);
    assert_eq!(c.open_files(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

/// System and BE figures come from the QoS cgroups: a pod without a rate
/// this tick (its first, or a reset) does not remove them.
#[test]
fn aggregates_survive_pod_churn() {
    let sec = 1_000_000_000u64;
    let d = v1_tree(
        "churn",
        &[
            "kubepods",
            "kubepods/besteffort",
            "kubepods/besteffort/p1",
            "kubepods/p2",
        ],
    );
    let mut c = Collector::new(v1_host(&d), &d.join("proc")).with_clock(frozen());
    c.set_groups(Groups {
        pods: Some(CgroupPath::parse("/kubepods").unwrap()),
        besteffort: Some(CgroupPath::parse("/kubepods/besteffort").unwrap()),
    });
    let mut targets = vec![Arc::new(target(
        "pod/p1",
        Kind::Pod,
        "/kubepods/besteffort/p1",
        "BE",
    ))];
    let t = c.tick(1000, 0, &targets);
    assert_eq!(
        get(&t.system, Metric::CpuUsage),
        None,
        "no rate for the pods' root yet: not guessed"
    );
    // a second later: node 1.5 cores busy, pods 1.0, BE 0.25; a new pod arrives
    put(
        &d,
        "proc/stat",
        "cpu  103 0 0 101 0 0 0 0 0 0\ncpu0 0\ncpu1 0\n",
    );
    put(&d, "cg/cpuacct/kubepods/cpuacct.usage", sec);
    put(&d, "cg/cpuacct/kubepods/besteffort/cpuacct.usage", sec / 4);
    targets.push(Arc::new(target("pod/p2", Kind::Pod, "/kubepods/p2", "LS")));
    let t = c.tick(1001, sec, &targets);
    assert_eq!(
        get(&t.readings[1].samples, Metric::CpuUsage),
        None,
        "the new pod's first tick"
    );
    assert!(
        (get(&t.system, Metric::CpuUsage).unwrap() - 0.5).abs() < 1e-9,
        "{:?}",
        t.system
    );
    assert!(
        (get(&t.be, Metric::CpuUsage).unwrap() - 0.25).abs() < 1e-9,
        "{:?}",
        t.be
    );
    // memory: node working set (total − free − inactive file) minus the pods' root
    put(
        &d,
        "proc/meminfo",
        "MemTotal: 4000000 kB\nMemFree: 1000000 kB\nMemAvailable: 2500000 kB\nCached: 1500000 kB\nInactive(file): 1000000 kB\n",
    );
    let t = c.tick(1002, 2 * sec, &targets);
    let node_ws = get(&t.node, Metric::MemoryWorkingSet).unwrap();
    assert_eq!(node_ws, 2_000_000.0 * 1024.0);
    let pods_ws = (1u64 << 20) - (1u64 << 20) / 8;
    assert_eq!(
        get(&t.system, Metric::MemoryWorkingSet),
        Some(node_ws - pods_ws as f64)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn steal_is_not_busy() {
    let c = parse::proc_stat("cpu  100 0 0 300 0 0 0 100 0 0\ncpu0 0\n").unwrap();
    assert_eq!((c.busy, c.total), (100, 500));
}

#[test]
fn v2_cgroups_with_psi_and_io() {
    let cg = "kubepods.slice/kubepods-pod1.slice";
    let files = |usage_usec: u64, some: u64, rbytes: u64| -> Vec<(String, String)> {
        vec![
            ("cg/cgroup.controllers".into(), "cpu io memory pids\n".into()),
            (format!("cg/{cg}/cpu.stat"), format!("usage_usec {usage_usec}\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")),
            (format!("cg/{cg}/memory.current"), "1048576\n".into()),
            // the page cache grows by what is read
            (format!("cg/{cg}/memory.stat"), format!("anon 524288\nfile {}\ninactive_file 131072\n", 262144 + rbytes)),
            (format!("cg/{cg}/memory.events"), "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n".into()),
            (format!("cg/{cg}/io.stat"), format!("8:0 rbytes={rbytes} wbytes=0 rios=0 wios=0 dbytes=0 dios=0\n")),
            (format!("cg/{cg}/cpu.pressure"), format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")),
            (format!("cg/{cg}/memory.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".into()),
        ]
    };
    let mut all: Vec<(String, String)> = proc_files(0, 100)
        .into_iter()
        .map(|(a, b)| (a.to_string(), b))
        .collect();
    all.extend(files(1_000_000, 0, 0));
    let refs: Vec<(&str, String)> = all.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    let d = tree("v2", &refs);
    let mut c =
        Collector::new(Host::detect(&d.join("cg")).unwrap(), &d.join("proc")).with_clock(frozen());
    let targets = vec![Arc::new(target(
        "pod/1",
        Kind::Pod,
        &format!("/{cg}"),
        "LS",
    ))];
    c.tick(10, 0, &targets);
    for (p, v) in files(3_000_000, 100_000, 4096) {
        put(&d, &p, v);
    }
    let t = c.tick(12, 2_000_000_000, &targets);
    let s = &t.readings[0].samples;
    assert!(
        (get(s, Metric::CpuUsage).unwrap() - 1.0).abs() < 1e-9,
        "2 s of CPU in 2 s"
    );
    assert_eq!(get(s, Metric::MemoryWorkingSet), Some(1048576.0 - 131072.0));
    assert_eq!(get(s, Metric::MemoryRss), Some(524288.0));
    assert!((get(s, Metric::PsiCpuSome).unwrap() - 0.05).abs() < 1e-9);
    assert_eq!(get(s, Metric::PsiMemoryFull), Some(0.0));
    assert_eq!(get(s, Metric::IoReadBytes), Some(2048.0));
    assert_eq!(get(s, Metric::OomKills), Some(0.0));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn cpi_is_reported_unavailable_without_a_pmu() {
    let d = tree(
        "sys",
        &[("bus/event_source/devices/software/type", "1\n".into())],
    );
    assert!(cpi_status(&d).contains("no hardware PMU"));
    std::fs::remove_dir_all(&d).unwrap();
}
