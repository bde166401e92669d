//! The seed scenario (`qoslet_qos_engine::sim`): prints the timeline as CSV on
//! stdout and a summary on stderr.
//!
//! `qos_sim [--threshold 98] [--seconds 90]`

use std::io::Write;

use qoslet_qos_engine::sim::{self, Row};
use qoslet_qos_engine::synth;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threshold = synth::flag::<u32>(&args, "--threshold", 98);
    let seconds = synth::flag::<u32>(&args, "--seconds", 90);
    let root = std::env::temp_dir().join(format!("qoslet-sim-{}", std::process::id()));
    let rows = match sim::run(i64::from(threshold), seconds, &root) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("qos_sim: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", Row::CSV_HEADER);
    for r in &rows {
        if writeln!(out, "{}", r.csv()).is_err() {
            break; // the reader went away (| head)
        }
    }
    let short = rows.iter().filter(|r| r.ls_unmet() > 0.5).count();
    let worst = rows.iter().map(Row::ls_unmet).fold(0.0, f64::max);
    let held = rows
        .iter()
        .rfind(|r| (10..50).contains(&r.t))
        .map(|r| r.be_usage)
        .unwrap_or(0.0);
    let mut ticks: Vec<f64> = rows.iter().skip(1).map(|r| r.tick_ms).collect();
    ticks.sort_by(f64::total_cmp);
    eprintln!(
        "threshold {threshold}%: LS short of CPU for {short} s (worst {worst:.0} cores); BE held at {held:.1} cores during the burst; engine tick p50 {:.2} ms",
        ticks.get(ticks.len() / 2).copied().unwrap_or(0.0)
    );
}
