//! Where a turn's time goes (`chat --timings`): each process of a turn —
//! the CLI, the supervisor, the child stage, the agent program — records
//! when it reached each step. The clock is the system-wide monotonic one
//! (no child gets a time namespace), so marks of different processes
//! compare directly and one sorted list shows the phases.
//!
//! A mark costs one clock read. Processes that live for one turn (the CLI,
//! the stage, the agent) keep their marks in a process-wide list switched
//! on with [`enable`]; the supervisor, which runs many turns at once, keeps
//! a [`Marks`] per turn. Marks read from a child are checked like any of
//! its data: short names of plain characters, a bounded count.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

/// The environment variable the child stage hands its own marks to the
/// agent program in (the stage ends in an exec, so it cannot send them).
pub const STAGE_ENV: &str = "MINI_LETTA_STAGE_MARKS";

/// At most this many marks are kept from one process (a long turn takes a
/// handful per step).
pub const MAX_MARKS: usize = 256;

/// At most this many in one list: the four processes of a turn.
const MAX_LIST: usize = 4 * MAX_MARKS;

/// A step and when it was reached, in microseconds of the monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub name: String,
    pub at_us: u64,
}

/// The monotonic clock in microseconds (0 if it cannot be read, which
/// Linux never does for this clock).
pub fn now_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            let us = i128::from(t.tv_sec()) * 1_000_000 + i128::from(t.tv_nsec()) / 1_000;
            u64::try_from(us).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Marks of one turn in a process that runs many (the supervisor).
#[derive(Debug, Default)]
pub struct Marks {
    on: bool,
    list: Vec<Mark>,
}

impl Marks {
    /// Marks that are recorded only when `on` (the caller asked for them).
    pub fn new(on: bool) -> Marks {
        Marks {
            on,
            list: Vec::new(),
        }
    }

    pub fn mark(&mut self, name: &str) {
        if self.on && self.list.len() < MAX_LIST {
            self.list.push(Mark {
                name: name.to_string(),
                at_us: now_us(),
            });
        }
    }

    /// The marks so far (none when not recorded).
    pub fn list(&self) -> &[Mark] {
        &self.list
    }

    /// Whether marks are being recorded.
    pub fn enabled(&self) -> bool {
        self.on
    }

    /// Add marks taken elsewhere for this turn.
    pub fn extend(&mut self, marks: Vec<Mark>) {
        if self.on {
            self.list.extend(checked(marks));
            self.list.truncate(MAX_LIST);
        }
    }

    /// The marks, or `None` when they were not asked for.
    pub fn into_list(self) -> Option<Vec<Mark>> {
        self.on.then_some(self.list)
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static GLOBAL: Mutex<Vec<Mark>> = Mutex::new(Vec::new());
static PROCESS_START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Note when this program's `main` began (one clock read, always: whether
/// marks are wanted is known only once the arguments are parsed).
pub fn note_start() {
    PROCESS_START.store(now_us(), Ordering::Relaxed);
}

/// Start recording, with a first mark `name` at the noted start.
pub fn enable_from_start(name: &str) {
    enable();
    extend(vec![Mark {
        name: name.to_string(),
        at_us: PROCESS_START.load(Ordering::Relaxed),
    }]);
}

/// Start recording this process's marks (a one-turn process asked for them).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Record a mark of this process, when recording is on.
pub fn mark(name: &str) {
    if !enabled() {
        return;
    }
    let at_us = now_us();
    if let Ok(mut list) = GLOBAL.lock()
        && list.len() < MAX_LIST
    {
        list.push(Mark {
            name: name.to_string(),
            at_us,
        });
    }
}

/// Add marks another process of this turn recorded (they are checked).
pub fn extend(marks: Vec<Mark>) {
    if let Ok(mut list) = GLOBAL.lock() {
        for m in checked(marks) {
            if list.len() < MAX_LIST {
                list.push(m);
            }
        }
    }
}

/// This process's marks so far.
pub fn taken() -> Vec<Mark> {
    GLOBAL.lock().map(|l| l.clone()).unwrap_or_default()
}

/// A child's `hello` line with the marks its stage took so far: the
/// frame's fields plus `"marks"` (a supervisor reads them with
/// [`marks_in_hello`]; any other reader ignores the extra field).
pub fn hello_with_marks(version: u32, marks: &[Mark]) -> Vec<u8> {
    // Fields in this order: `"type"` first is what the reader looks for.
    #[derive(Serialize)]
    struct StageHello<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        version: u32,
        peer: super::PeerKind,
        marks: &'a [Mark],
    }
    let hello = StageHello {
        kind: "hello",
        version,
        peer: super::PeerKind::Child,
        marks,
    };
    let mut line = serde_json::to_vec(&hello).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The marks a child's `hello` line carried (see [`hello_with_marks`]),
/// checked; none for any other line. Only a line that starts as the
/// stage writes one is parsed a second time, so other frames cost nothing.
pub fn marks_in_hello(line: &[u8]) -> Vec<Mark> {
    #[derive(Deserialize)]
    struct Carried {
        #[serde(default)]
        marks: Vec<Mark>,
    }
    if !line.starts_with(br#"{"type":"hello""#) {
        return Vec::new();
    }
    serde_json::from_slice::<Carried>(line)
        .map(|c| checked(c.marks))
        .unwrap_or_default()
}

/// Whether a mark's name is one this program would write: short, of
/// lower-case letters, digits, `.`, `_` and `-`.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Marks that came from another process, kept only when well formed and
/// at most [`MAX_MARKS`] of them.
pub fn checked(marks: Vec<Mark>) -> Vec<Mark> {
    marks
        .into_iter()
        .filter(|m| valid_name(&m.name))
        .take(MAX_MARKS)
        .collect()
}

/// `name=us,name=us`: the stage's marks in its environment variable.
pub fn encode(marks: &[Mark]) -> String {
    marks
        .iter()
        .map(|m| format!("{}={}", m.name, m.at_us))
        .collect::<Vec<_>>()
        .join(",")
}

/// The marks of [`encode`]; malformed entries are dropped.
pub fn decode(text: &str) -> Vec<Mark> {
    checked(
        text.split(',')
            .filter_map(|entry| {
                let (name, at) = entry.split_once('=')?;
                Some(Mark {
                    name: name.to_string(),
                    at_us: at.parse().ok()?,
                })
            })
            .collect(),
    )
}

/// The marks in time order as a table for a person: milliseconds since
/// the first, since the mark before, and the name (names are checked
/// plain words, see [`valid_name`], so the text is safe on a terminal).
pub fn table(marks: &[Mark]) -> String {
    let mut sorted = marks.to_vec();
    sorted.sort_by_key(|m| m.at_us);
    let Some(first) = sorted.first().map(|m| m.at_us) else {
        return String::new();
    };
    let mut out = String::from("timings (ms): since start, since the mark before, mark\n");
    let mut before = first;
    for m in sorted.iter().filter(|m| valid_name(&m.name)) {
        out.push_str(&format!(
            "  {:>8.2} {:>8.2}  {}\n",
            m.at_us.saturating_sub(first) as f64 / 1000.0,
            m.at_us.saturating_sub(before) as f64 / 1000.0,
            m.name
        ));
        before = m.at_us;
    }
    out
}

/// `{"marks", "phases"}`: the marks as a `--json` document carries them.
pub fn document(marks: &[Mark]) -> serde_json::Value {
    serde_json::json!({ "marks": marks, "phases": phases(marks) })
}

/// One phase: from the mark before to this one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    pub from: String,
    pub to: String,
    pub ms: f64,
}

/// The marks in time order, as the phases between consecutive ones.
pub fn phases(marks: &[Mark]) -> Vec<Phase> {
    let mut sorted = marks.to_vec();
    sorted.sort_by_key(|m| m.at_us);
    sorted
        .windows(2)
        .map(|w| Phase {
            from: w[0].name.clone(),
            to: w[1].name.clone(),
            ms: w[1].at_us.saturating_sub(w[0].at_us) as f64 / 1000.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_travel_through_the_environment_and_bad_ones_are_dropped() {
        let marks = vec![
            Mark {
                name: "stage.start".into(),
                at_us: 10,
            },
            Mark {
                name: "stage.seccomp".into(),
                at_us: 25,
            },
        ];
        assert_eq!(decode(&encode(&marks)), marks);
        let hostile = "ok=1,\u{1b}[2J=2,BIG=3,x=notanumber,=4,y=5";
        let kept: Vec<String> = decode(hostile).into_iter().map(|m| m.name).collect();
        assert_eq!(kept, ["ok", "y"]);
        let many = (0..1000).map(|i| format!("m{i}=1")).collect::<Vec<_>>();
        assert_eq!(decode(&many.join(",")).len(), MAX_MARKS);
    }

    #[test]
    fn phases_are_the_gaps_between_marks_in_time_order() {
        let m = |name: &str, at_us| Mark {
            name: name.into(),
            at_us,
        };
        let p = phases(&[m("b", 3_000), m("a", 1_000), m("c", 3_500)]);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].from.as_str(), p[0].to.as_str(), p[0].ms),
            ("a", "b", 2.0)
        );
        assert_eq!(
            (p[1].from.as_str(), p[1].to.as_str(), p[1].ms),
            ("b", "c", 0.5)
        );
        let mut on = Marks::new(false);
        on.mark("x");
        assert_eq!(on.into_list(), None);
        let mut on = Marks::new(true);
        on.mark("x");
        assert_eq!(on.into_list().map(|l| l.len()), Some(1));
    }
}
