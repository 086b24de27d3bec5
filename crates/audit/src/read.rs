//! Reading records back: every line of the chain in order, filtered by
//! agent, kind and time; and per-agent usage summed from them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};

use serde::Serialize;

use super::chain::chain_files;
use super::error::AuditError;
use super::record;
use super::summary;
use super::tally::{self, Agents};
use crate::paths::Home;

/// Which records a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// An agent id.
    pub agent: Option<String>,
    pub kind: Option<String>,
    /// A record time (fixed format, `record::format_time`): records at or
    /// after it.
    pub since: Option<String>,
}

pub use super::tally::View;

impl Filter {
    pub fn matches(&self, v: &View) -> bool {
        self.agent
            .as_ref()
            .is_none_or(|a| v.agent.as_ref() == Some(a))
            && self.kind.as_ref().is_none_or(|k| &v.kind == k)
            && self
                .since
                .as_ref()
                .is_none_or(|s| v.time.as_str() >= s.as_str())
    }
}

/// Call `f` with every complete record line of the chain (oldest first)
/// and its parsed view; lines that are not records are skipped (`audit
/// verify` is where they are reported).
pub fn for_each(
    home: &Home,
    mut f: impl FnMut(&[u8], &View) -> std::ops::ControlFlow<()>,
) -> Result<(), AuditError> {
    for path in chain_files(home)? {
        let io = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        let mut reader = BufReader::with_capacity(1 << 20, File::open(&path).map_err(io)?);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if reader.read_until(b'\n', &mut buf).map_err(io)? == 0 {
                break;
            }
            let Some(line) = buf.strip_suffix(b"\n") else {
                break;
            };
            if record::header(line).is_none() {
                continue;
            }
            let Ok(view) = serde_json::from_slice::<View>(line) else {
                continue;
            };
            if f(line, &view).is_break() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// What an agent's children used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub agent: String,
    pub turns: u64,
    pub model_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub tool_calls: u64,
    pub cpu_ms: u64,
    pub peak_memory_bytes: u64,
    pub egress_bytes: u64,
    pub budget_refusals: u64,
}

/// Usage per agent id from the records `filter` keeps (its `kind` ignored):
/// whole days from the usage summary where it holds, and only the records
/// after it (and those of `since`'s own day) from the log.
pub fn usage(home: &Home, filter: &Filter) -> Result<BTreeMap<String, Usage>, AuditError> {
    let agent = filter.agent.as_deref();
    let mut by_agent = Agents::new();
    match filter.since.as_deref() {
        None => {
            let (days, _) = summary::days_now(home)?;
            for agents in days.values() {
                merge(&mut by_agent, agents, agent);
            }
        }
        Some(since) => usage_since(home, since, agent, &mut by_agent)?,
    }
    Ok(by_agent
        .into_iter()
        .map(|(id, s)| {
            let u = Usage {
                agent: id.clone(),
                turns: s.turns,
                model_calls: s.model_calls,
                input_tokens: s.input_tokens,
                output_tokens: s.output_tokens,
                tool_calls: s.tool_calls,
                cpu_ms: s.cpu_us.div_ceil(1000),
                peak_memory_bytes: s.peak_memory_bytes,
                egress_bytes: s.egress_bytes,
                budget_refusals: s.budget_refusals,
            };
            (id, u)
        })
        .collect())
}

fn merge(into: &mut Agents, from: &Agents, agent: Option<&str>) {
    for (id, s) in from {
        if agent.is_none_or(|a| a == id) {
            into.entry(id.clone()).or_default().merge(s);
        }
    }
}

/// Usage from `since` on: the summary's days after `since`'s day whole,
/// and the records read from where that day starts.
fn usage_since(
    home: &Home,
    since: &str,
    agent: Option<&str>,
    by_agent: &mut Agents,
) -> Result<(), AuditError> {
    let day = tally::day_of(since);
    let keeps = |r: &tally::Rec<'_>| {
        r.time.as_ref() >= since && agent.is_none_or(|a| r.agent.as_deref() == Some(a))
    };
    let resolved = match summary::load(home) {
        // A day is its ten first bytes only in a full record time.
        Some(s) if since.len() >= 10 => summary::resolve(home, s)?,
        _ => None,
    };
    let from = match &resolved {
        Some(r) => day_start(r, day)?,
        None => None,
    };
    let (Some(r), Some(from)) = (resolved, from) else {
        let files = chain_files(home)?;
        return summary::stream(&files, (0, 0), |_, line| {
            if let Some(rec) = tally::scan(line).filter(keeps) {
                tally::add_to(by_agent, &rec);
            }
        });
    };
    for (_, d) in r.summary.days.iter().filter(|(d, _)| d.as_str() > day) {
        merge(by_agent, &d.agents, agent);
    }
    summary::stream(&r.files, from, |at, line| {
        let Some(rec) = tally::scan(line) else { return };
        // Other days the summary covers are counted whole above.
        if at < r.end && rec.day() != day {
            return;
        }
        if keeps(&rec) {
            tally::add_to(by_agent, &rec);
        }
    })
}

/// Where to read from for `day`: where the summary says it starts (it
/// must start a record of that day), or the summary's end when it has no
/// record of that day. `None`: the summary cannot say.
fn day_start(r: &summary::Resolved, day: &str) -> Result<Option<summary::At>, AuditError> {
    let Some(d) = r.summary.days.get(day) else {
        return Ok(Some(r.end));
    };
    let Some(at) = r.at(d.start).filter(|at| *at < r.end) else {
        return Ok(None);
    };
    let line = summary::line_at(&r.files, at)?;
    let starts_day = line
        .as_deref()
        .and_then(tally::scan)
        .is_some_and(|rec| rec.day() == day);
    Ok(starts_day.then_some(at))
}

/// `--since`: an RFC 3339 time, a date (`2025-01-31`, midnight UTC), or an
/// age (`30m`, `12h`, `7d`); as a record time.
pub fn parse_since(s: &str) -> Result<String, String> {
    let s = s.trim();
    if let Some(t) = crate::clock::parse_rfc3339(s) {
        return Ok(record::format_time(t));
    }
    if let Some(d) = crate::clock::parse_day(s) {
        return Ok(record::format_time(d.midnight().assume_utc()));
    }
    let unit = s.chars().last().unwrap_or(' ');
    let secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    let n: Option<i64> = s[..s.len() - unit.len_utf8().min(s.len())].parse().ok();
    match n {
        Some(n) if secs > 0 && n >= 0 => Ok(record::format_time(
            time::OffsetDateTime::now_utc() - time::Duration::seconds(n.saturating_mul(secs)),
        )),
        _ => Err(format!(
            "--since {s:?}: give an RFC 3339 time (2025-01-31T12:00:00Z), a date (2025-01-31) or an age (30m, 12h, 7d)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_times_dates_and_ages() {
        assert_eq!(
            parse_since("2025-01-31T12:00:00+01:00").unwrap(),
            "2025-01-31T11:00:00.000000Z"
        );
        assert_eq!(
            parse_since("2025-01-31").unwrap(),
            "2025-01-31T00:00:00.000000Z"
        );
        let hour_ago = parse_since("1h").unwrap();
        assert!(hour_ago < record::now());
        assert!(parse_since("yesterday").is_err());
        assert!(parse_since("-3d").is_err());
    }
}
