//! The writer's side of the usage summary: kept current as records are
//! appended, brought up to the log's end when another appender moved it,
//! saved now and then (`summary::SAVE_EVERY`), when the log rolls over
//! and when the writer stops.

use super::error::AuditError;
use super::record;
use super::summary::{self, Day, Pos, Resolved, Summary};
use super::tally;
use crate::paths::Home;

pub(crate) struct Tracker {
    sum: Summary,
    /// Records added since the last save.
    unsaved: u64,
}

impl Tracker {
    /// The saved summary brought up to the log's end, or (when there is
    /// none that holds) one made from the whole log.
    pub fn open(home: &Home) -> Result<Tracker, AuditError> {
        let mut t = Tracker {
            sum: summary::load(home).unwrap_or_default(),
            unsaved: 0,
        };
        t.catch_up(home)?;
        Ok(t)
    }

    /// Add the records another appender wrote since this one's last.
    pub fn catch_up(&mut self, home: &Home) -> Result<(), AuditError> {
        let sum = std::mem::take(&mut self.sum);
        let resolved = summary::resolve(home, sum)?.and_then(renumbered);
        let (files, real, from) = match resolved {
            Some((r, sum)) => {
                self.sum = sum;
                (r.files, r.real, r.end)
            }
            None => {
                tracing::info!("the usage summary does not hold for this log; made again from it");
                self.sum = Summary {
                    version: summary::VERSION,
                    ..Summary::default()
                };
                self.unsaved = 1;
                let (files, real) = summary::numbered(home)?;
                (files, real, (0, 0))
            }
        };
        summary::stream(&files, from, |(i, offset), line| {
            let file = real.get(i).copied().unwrap_or(u64::MAX);
            self.add(Pos { file, offset }, line);
        })
    }

    /// Account the line at `pos` (a record or not).
    pub fn add(&mut self, pos: Pos, line: &[u8]) {
        let Some((seq, _)) = record::header(line) else {
            return;
        };
        if let Some(r) = tally::scan(line) {
            let day = match self.sum.days.get_mut(r.day()) {
                Some(d) => d,
                None => self.sum.days.entry(r.day().to_string()).or_insert(Day {
                    start: pos,
                    agents: Default::default(),
                }),
            };
            tally::add_to(&mut day.agents, &r);
        }
        self.sum.seq = seq;
        self.sum.head = record::hex(&record::line_hash(line));
        self.sum.end = Pos {
            file: pos.file,
            offset: pos.offset + line.len() as u64 + 1,
        };
        self.unsaved += 1;
    }

    /// `audit.jsonl` became `audit-<n>.jsonl`.
    pub fn rotated(&mut self, n: u64) {
        let moved = |p: &mut Pos| {
            if p.file == 0 {
                p.file = n;
            }
        };
        moved(&mut self.sum.end);
        self.sum.days.values_mut().for_each(|d| moved(&mut d.start));
    }

    pub fn due(&self) -> bool {
        self.unsaved >= summary::SAVE_EVERY
    }

    /// Save what is not saved yet.
    pub fn save(&mut self, home: &Home) {
        if self.unsaved == 0 || self.sum.seq == 0 {
            return;
        }
        match summary::save(home, &self.sum) {
            Ok(()) => self.unsaved = 0,
            Err(e) => tracing::warn!("cannot save the usage summary: {e}"),
        }
    }
}

/// The summary with its positions named by the files' numbers as they are
/// now (`None`: one names a file that is gone).
fn renumbered(r: Resolved) -> Option<(Resolved, Summary)> {
    let mut sum = r.summary.clone();
    let now = |p: &mut Pos| -> Option<()> {
        let (i, _) = r.at(*p)?;
        p.file = *r.real.get(i)?;
        Some(())
    };
    now(&mut sum.end)?;
    for d in sum.days.values_mut() {
        now(&mut d.start)?;
    }
    Some((r, sum))
}
