//! A block of whole lines, split at newlines into a part per core: each
//! part's lines are hashed (and their headers read) at once, since a
//! line's hash depends on nothing but its bytes; the links between them
//! are then checked in order by the caller. Lines a usage summary covers
//! are tallied on the way.

use std::collections::BTreeMap;

use super::record;
use super::summary::At;
use super::tally::{self, Agents};

/// Below this a block is not worth a second thread.
const MIN_PART: usize = 256 * 1024;

/// One line of a block.
pub(crate) struct Line {
    /// Where it starts in the block, and its length (no newline).
    pub start: usize,
    pub len: usize,
    pub header: Option<(u64, [u8; 32])>,
    pub hash: [u8; 32],
}

/// Usage per day of the lines before a place, with where each day starts.
pub(crate) type Days = BTreeMap<String, (At, Agents)>;

/// What to tally: the lines of file `file` (an index into the chain's
/// files) before `cover`.
#[derive(Clone, Copy)]
pub(crate) struct Tally {
    pub file: usize,
    pub cover: At,
}

/// Every line of `block` (whole lines: it ends in a newline), which starts
/// at `base` of its file; the lines `tally` names added to `days`.
pub(crate) fn lines(block: &[u8], base: u64, tally: Option<Tally>, days: &mut Days) -> Vec<Line> {
    let parts = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(block.len() / MIN_PART)
        .max(1);
    let mut cuts = vec![0];
    for k in 1..parts {
        let from = (block.len() * k / parts).max(*cuts.last().unwrap_or(&0));
        match memchr::memchr(b'\n', &block[from..]) {
            Some(nl) if from + nl + 1 < block.len() => cuts.push(from + nl + 1),
            _ => break,
        }
    }
    cuts.push(block.len());
    let ranges: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
    let work = |&(from, to): &(usize, usize)| part(block, from, to, base, tally);
    let results: Vec<(Vec<Line>, Days)> = match ranges.split_first() {
        Some((first, rest)) if !rest.is_empty() => std::thread::scope(|s| {
            let others: Vec<_> = rest.iter().map(|r| s.spawn(move || work(r))).collect();
            let mut all = vec![work(first)];
            for h in others {
                all.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            all
        }),
        _ => ranges.iter().map(work).collect(),
    };
    let mut out = Vec::with_capacity(results.iter().map(|r| r.0.len()).sum());
    for (found, part_days) in results {
        out.extend(found);
        // Parts in order: a day's first record is the first part's.
        for (day, (at, agents)) in part_days {
            fold(days, Some((day, at, agents)));
        }
    }
    out
}

/// The lines of `block[from..to]`.
fn part(
    block: &[u8],
    from: usize,
    to: usize,
    base: u64,
    tally: Option<Tally>,
) -> (Vec<Line>, Days) {
    let mut out = Vec::with_capacity((to - from) / 200 + 1);
    let mut days = Days::new();
    // The day being tallied: records come in days, so most lines add to it.
    let mut day: Option<(String, At, Agents)> = None;
    let mut at = from;
    while at < to {
        let len = memchr::memchr(b'\n', &block[at..to]).unwrap_or(to - at);
        let line = &block[at..at + len];
        let header = record::header(line);
        if let Some(t) = tally {
            let pos = (t.file, base + at as u64);
            if header.is_some()
                && pos < t.cover
                && let Some(r) = tally::scan_record(line)
            {
                match &mut day {
                    Some((d, _, agents)) if d.as_str() == r.day() => tally::add_to(agents, &r),
                    _ => {
                        fold(&mut days, day.take());
                        let mut agents = Agents::new();
                        tally::add_to(&mut agents, &r);
                        day = Some((r.day().to_string(), pos, agents));
                    }
                }
            }
        }
        out.push(Line {
            start: at,
            len,
            header,
            hash: record::line_hash(line),
        });
        at += len + 1;
    }
    fold(&mut days, day);
    (out, days)
}

/// Add a day's tally to `days` (where it is not the day's first, only its
/// usage).
fn fold(days: &mut Days, day: Option<(String, At, Agents)>) {
    let Some((day, at, agents)) = day else {
        return;
    };
    match days.get_mut(&day) {
        Some((_, have)) => {
            for (id, s) in agents {
                have.entry(id).or_default().merge(&s);
            }
        }
        None => {
            days.insert(day, (at, agents));
        }
    }
}
