//! What a verify run reports: one result per attack of the catalogue, the
//! tally, and why the run fails, if it does.

use serde::Serialize;

use crate::sandbox::probes::Verdict;
use crate::sandbox::report::{Isolation, Level};

/// Attacks that must actually run (not be skipped) for strict mode to pass.
pub const MIN_ATTEMPTED: usize = 40;

/// One attack's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct AttackResult {
    pub id: String,
    pub number: u32,
    pub title: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub level: Level,
    pub isolation: Isolation,
    pub role: String,
    pub results: Vec<AttackResult>,
    pub blocked: usize,
    pub escaped: usize,
    pub skipped: usize,
    /// Why the run fails, if it does.
    pub failures: Vec<String>,
}

impl VerifyReport {
    /// Tally `results`: the run fails on any escape, and in strict mode
    /// when fewer than [`MIN_ATTEMPTED`] attacks were attempted (blocked or
    /// escaped, not skipped).
    pub fn new(level: Level, isolation: Isolation, role: &str, results: Vec<AttackResult>) -> Self {
        let count = |f: fn(&Verdict) -> bool| results.iter().filter(|r| f(&r.verdict)).count();
        let blocked = count(Verdict::is_blocked);
        let escaped = count(Verdict::is_escaped);
        let skipped = count(Verdict::is_skipped);
        let mut failures = Vec::new();
        if escaped > 0 {
            failures.push(format!("{escaped} attack(s) escaped"));
        }
        if isolation == Isolation::Strict && blocked + escaped < MIN_ATTEMPTED {
            failures.push(format!(
                "only {} attacks could be attempted; strict mode needs at least {MIN_ATTEMPTED}",
                blocked + escaped
            ));
        }
        Self {
            level,
            isolation,
            role: role.to_string(),
            results,
            blocked,
            escaped,
            skipped,
            failures,
        }
    }

    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(blocked: usize, escaped: usize, skipped: usize) -> Vec<AttackResult> {
        let verdicts = std::iter::repeat_n(Verdict::blocked("refused"), blocked)
            .chain(std::iter::repeat_n(Verdict::escaped("reached"), escaped))
            .chain(std::iter::repeat_n(Verdict::skipped("not here"), skipped));
        verdicts
            .enumerate()
            .map(|(i, verdict)| AttackResult {
                id: format!("{i:02}-row"),
                number: u32::try_from(i).unwrap(),
                title: "row".into(),
                verdict,
            })
            .collect()
    }

    /// (isolation, blocked, escaped, skipped, failures expected).
    #[test]
    fn the_run_fails_on_an_escape_and_on_too_few_attempts_in_strict_mode() {
        use Isolation::*;
        let n = MIN_ATTEMPTED;
        #[rustfmt::skip]
        let table: &[(Isolation, usize, usize, usize, &[&str])] = &[
            (Strict,   n,     0, 5, &[]),
            (Strict,   n - 1, 1, 0, &["1 attack(s) escaped"]),
            (Strict,   n - 1, 0, 9, &["strict mode needs at least"]),
            (Strict,   1,     2, 0, &["2 attack(s) escaped", "strict mode needs at least"]),
            (Degraded, 3,     0, 60, &[]),
            (Degraded, 3,     1, 0, &["1 attack(s) escaped"]),
            (Off,      0,     0, 0, &[]),
            (Off,      0,     7, 0, &["7 attack(s) escaped"]),
        ];
        for (isolation, blocked, escaped, skipped, want) in table {
            let r = VerifyReport::new(
                Level::L0,
                *isolation,
                "agent",
                results(*blocked, *escaped, *skipped),
            );
            let row = format!("{isolation:?} {blocked}/{escaped}/{skipped}");
            assert_eq!(
                (r.blocked, r.escaped, r.skipped),
                (*blocked, *escaped, *skipped),
                "{row}"
            );
            assert_eq!(r.failures.len(), want.len(), "{row}: {:?}", r.failures);
            for (got, want) in r.failures.iter().zip(*want) {
                assert!(got.contains(want), "{row}: {got:?} lacks {want:?}");
            }
            assert_eq!(r.ok(), want.is_empty(), "{row}");
        }
    }
}
