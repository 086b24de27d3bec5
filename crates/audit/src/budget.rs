//! Token budgets: what the operator set per agent (root's file beside the
//! log), the tokens spent per period (summed from the log's `model`
//! records, the one source of truth), and the check a model call passes.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use serde::{Deserialize, Serialize};

use super::error::AuditError;
use crate::paths::Home;

/// Over what a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// A UTC calendar day.
    Day,
    /// A UTC calendar month.
    Month,
    /// Everything, for ever.
    Total,
}

impl std::str::FromStr for Period {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "day" => Ok(Period::Day),
            "month" => Ok(Period::Month),
            "total" => Ok(Period::Total),
            other => Err(format!("unknown period {other:?} (day, month or total)")),
        }
    }
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
            Period::Total => "total",
        }
    }

    /// The prefix of a record time inside the period holding `now`
    /// (`""`: every record), and when the period ends.
    pub fn window(self, now: time::OffsetDateTime) -> (String, Option<time::OffsetDateTime>) {
        let now = now.to_offset(time::UtcOffset::UTC);
        let day = now.date();
        match self {
            Period::Day => (
                format!(
                    "{:04}-{:02}-{:02}",
                    day.year(),
                    u8::from(day.month()),
                    day.day()
                ),
                day.next_day().map(|d| d.midnight().assume_utc()),
            ),
            Period::Month => {
                let (y, m) = (day.year(), day.month());
                let next = if m == time::Month::December {
                    time::Date::from_calendar_date(y + 1, time::Month::January, 1)
                } else {
                    time::Date::from_calendar_date(y, m.next(), 1)
                };
                (
                    format!("{y:04}-{:02}", u8::from(m)),
                    next.ok().map(|d| d.midnight().assume_utc()),
                )
            }
            Period::Total => (String::new(), None),
        }
    }
}

/// One agent's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Input plus output tokens of every model call of the agent and its
    /// sub-agents.
    pub tokens: u64,
    pub period: Period,
}

/// Every agent's budget, by id (none: no file).
pub fn load(home: &Home) -> Result<BTreeMap<String, Budget>, AuditError> {
    let path = home.budgets_file();
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| AuditError::Corrupt {
            path,
            detail: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(AuditError::Io { path, source }),
    }
}

/// Set (or with `None` clear) an agent's budget: the file is replaced
/// whole (temp file, fsync, rename), root's only.
pub fn set(home: &Home, agent: &str, budget: Option<Budget>) -> Result<(), AuditError> {
    let dir = super::file::ensure_dir(home)?;
    let mut all = load(home)?;
    match budget {
        Some(b) => all.insert(agent.to_string(), b),
        None => all.remove(agent),
    };
    let path = home.budgets_file();
    let io = |source| AuditError::Io {
        path: path.clone(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(&all).map_err(|e| AuditError::Corrupt {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    let tmp = dir.join(format!(".budgets.{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .map_err(io)?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(())
}

/// Tokens spent per agent per UTC day, as the log says; kept current by
/// the supervisor as it appends `model` records.
#[derive(Debug, Default)]
pub struct Spent {
    /// agent id → day (`YYYY-MM-DD`) → tokens.
    days: HashMap<String, BTreeMap<String, u64>>,
    /// Records up to this number are in `days` (read from the log).
    read_up_to: u64,
}

impl Spent {
    /// Sum the log's `model` records: the usage summary's days where it
    /// holds, and the records after it.
    pub fn read(home: &Home) -> Result<Spent, AuditError> {
        let (days, last) = super::summary::days_now(home)?;
        let mut spent = Spent {
            read_up_to: last,
            ..Spent::default()
        };
        for (day, agents) in days {
            // Only a full record time has a day (as the log's own reading).
            if day.len() != 10 {
                continue;
            }
            for (agent, sums) in agents {
                let tokens = sums.input_tokens.saturating_add(sums.output_tokens);
                *spent
                    .days
                    .entry(agent)
                    .or_default()
                    .entry(day.clone())
                    .or_default() += tokens;
            }
        }
        Ok(spent)
    }

    /// A `model` record appended after the read.
    pub fn add(&mut self, seq: u64, agent: &str, time: &str, tokens: u64) {
        if seq <= self.read_up_to {
            return;
        }
        if let Some(day) = time.get(..10) {
            *self
                .days
                .entry(agent.to_string())
                .or_default()
                .entry(day.to_string())
                .or_default() += tokens;
        }
    }

    /// Tokens `agent` spent in the period holding `now`.
    pub fn used(&self, agent: &str, period: Period, now: time::OffsetDateTime) -> u64 {
        let (prefix, _) = period.window(now);
        self.days.get(agent).map_or(0, |days| {
            days.iter()
                .filter(|(d, _)| d.starts_with(&prefix))
                .map(|(_, n)| *n)
                .sum()
        })
    }
}

/// A budget found spent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    pub budget: u64,
    pub period: Period,
    pub used: u64,
    /// When the period ends (`None`: a total budget never resets).
    pub resets: Option<String>,
    pub message: String,
}

/// Whether `agent` (named `name` in the message) may make another model
/// call, with `in_flight` tokens reserved by its calls under way: a call
/// starts only while what is spent and reserved stays below the budget.
pub fn check(
    budget: Option<Budget>,
    spent: &Spent,
    agent: &str,
    name: &str,
    now: time::OffsetDateTime,
    in_flight: u64,
) -> Option<Refusal> {
    let budget = budget?;
    let used = spent.used(agent, budget.period, now);
    if used.saturating_add(in_flight) < budget.tokens {
        return None;
    }
    let resets = budget.period.window(now).1.map(super::record::format_time);
    let when = match &resets {
        Some(t) => format!("it resets at {t}"),
        None => "a total budget never resets".to_string(),
    };
    Some(Refusal {
        budget: budget.tokens,
        period: budget.period,
        used,
        message: format!(
            "token budget spent: agent {name} has used {used}{reserved} of its {} tokens per {} ({when}); raise it with `mini-letta agent set-budget {name} --tokens TOKENS` or remove it with --clear",
            budget.tokens,
            budget.period.as_str(),
            reserved = if in_flight > 0 {
                format!(" (and {in_flight} more are reserved by calls under way)")
            } else {
                String::new()
            },
        ),
        resets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_end_at_the_next_day_and_month() {
        let now = time::macros::datetime!(2025-12-31 23:00 UTC);
        let (p, end) = Period::Day.window(now);
        assert_eq!(p, "2025-12-31");
        assert_eq!(end, Some(time::macros::datetime!(2026-01-01 0:00 UTC)));
        let (p, end) = Period::Month.window(now);
        assert_eq!(p, "2025-12");
        assert_eq!(end, Some(time::macros::datetime!(2026-01-01 0:00 UTC)));
        assert_eq!(Period::Total.window(now), (String::new(), None));
    }

    #[test]
    fn a_spent_budget_is_refused_and_says_when_it_resets() {
        let now = time::macros::datetime!(2025-06-15 10:00 UTC);
        let mut spent = Spent::default();
        spent.add(1, "a", "2025-06-14T10:00:00.000000Z", 50);
        spent.add(2, "a", "2025-06-15T09:00:00.000000Z", 5);
        let day = Budget {
            tokens: 10,
            period: Period::Day,
        };
        assert!(check(Some(day), &spent, "a", "owl", now, 0).is_none());
        // Calls under way count with what is spent: 5 + 4 < 10, 5 + 5 not.
        assert!(check(Some(day), &spent, "a", "owl", now, 4).is_none());
        let r = check(Some(day), &spent, "a", "owl", now, 5).unwrap();
        assert!(r.message.contains("5 more are reserved"), "{}", r.message);
        let month = Budget {
            tokens: 10,
            period: Period::Month,
        };
        let r = check(Some(month), &spent, "a", "owl", now, 0).unwrap();
        assert_eq!(r.used, 55);
        assert!(
            r.message.contains("resets at 2025-07-01T00:00:00"),
            "{}",
            r.message
        );
        assert!(check(None, &spent, "a", "owl", now, 1_000).is_none());
    }
}
