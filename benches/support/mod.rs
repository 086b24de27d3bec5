//! What every benchmark shares: which binaries it times, medians, and
//! cases run in alternation so a drift of the machine's speed during the
//! run moves every case alike instead of skewing their ratio.
//!
//! `MINI_LETTA_BIN=PATH` times that binary (and the `mini-letta-agent` /
//! `mini-letta-stage2` beside it, or `MINI_LETTA_AGENT_BIN` /
//! `MINI_LETTA_STAGE2_BIN`) instead of the one cargo built for this
//! checkout. Each bench file uses a part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Instant;

/// The `mini-letta` binary under test.
pub fn bin() -> PathBuf {
    match std::env::var_os("MINI_LETTA_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_mini-letta")),
    }
}

/// A companion binary: its own variable, else beside `MINI_LETTA_BIN`,
/// else cargo's build of it.
fn companion(var: &str, name: &str, built: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if std::env::var_os("MINI_LETTA_BIN").is_some_and(|p| !p.is_empty()) {
        let beside = bin().with_file_name(name);
        if beside.exists() {
            return beside;
        }
    }
    PathBuf::from(built)
}

/// The `mini-letta-agent` binary under test.
pub fn agent_bin() -> PathBuf {
    companion(
        "MINI_LETTA_AGENT_BIN",
        "mini-letta-agent",
        env!("CARGO_BIN_EXE_mini-letta-agent"),
    )
}

/// The `mini-letta-stage2` binary under test.
pub fn stage2_bin() -> PathBuf {
    companion(
        "MINI_LETTA_STAGE2_BIN",
        "mini-letta-stage2",
        env!("CARGO_BIN_EXE_mini-letta-stage2"),
    )
}

/// Name the binary timed, so a figure can be traced to what produced it.
pub fn say_binary() {
    let from = if std::env::var_os("MINI_LETTA_BIN").is_some_and(|p| !p.is_empty()) {
        "MINI_LETTA_BIN"
    } else {
        "this checkout's build"
    };
    println!("binary: {} ({from})", bin().display());
}

/// The median of `v` (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The `p`-th percentile (0–100) of `v` (0 when empty).
pub fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = ((v.len() - 1) as f64 * p / 100.0).round() as usize;
    v[at.min(v.len() - 1)]
}

/// Milliseconds `f` took.
pub fn time_ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1000.0
}

/// One case of a comparison: a label and a run returning its figure.
pub struct Case<'a> {
    pub label: &'a str,
    pub run: Box<dyn FnMut() -> f64 + 'a>,
}

impl<'a> Case<'a> {
    pub fn new(label: &'a str, run: impl FnMut() -> f64 + 'a) -> Self {
        Case {
            label,
            run: Box::new(run),
        }
    }
}

/// The samples of cases run in alternation, round by round.
pub struct Rounds {
    pub labels: Vec<String>,
    /// `samples[case][round]`.
    pub samples: Vec<Vec<f64>>,
}

/// Run every case once per round for `rounds` rounds (A, B, A, B…), the
/// order rotated each round so no case always runs first (after another's
/// warm caches, or its cleanup).
pub fn alternate(rounds: usize, mut cases: Vec<Case<'_>>) -> Rounds {
    let n = cases.len();
    let mut samples = vec![Vec::with_capacity(rounds); n];
    for r in 0..rounds {
        for k in 0..n {
            let i = (r + k) % n;
            let x = (cases[i].run)();
            samples[i].push(x);
        }
    }
    Rounds {
        labels: cases.iter().map(|c| c.label.to_string()).collect(),
        samples,
    }
}

impl Rounds {
    /// The median of case `i`.
    pub fn median(&self, i: usize) -> f64 {
        median(self.samples[i].clone())
    }

    /// The median of the per-round ratios case `a` / case `b`.
    pub fn ratio(&self, a: usize, b: usize) -> f64 {
        median(
            self.samples[a]
                .iter()
                .zip(&self.samples[b])
                .filter(|(_, y)| **y > 0.0)
                .map(|(x, y)| x / y)
                .collect(),
        )
    }

    /// Print each case's median, and each case's ratio of pairs against
    /// the last case (the yardstick), in `unit`.
    pub fn print(&self, title: &str, unit: &str) {
        let rounds = self.samples.first().map_or(0, Vec::len);
        println!("{title} ({rounds} rounds, cases alternated; medians):");
        let last = self.labels.len().saturating_sub(1);
        for (i, label) in self.labels.iter().enumerate() {
            let mut line = format!("  {label:<34} {:>10.3} {unit}", self.median(i));
            if i != last {
                line.push_str(&format!(
                    "   ratio of pairs vs {}: {:.3}",
                    self.labels[last],
                    self.ratio(i, last)
                ));
            }
            println!("{line}");
        }
    }
}
