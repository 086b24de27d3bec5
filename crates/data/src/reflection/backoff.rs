//! `reflections/backoff.json`: after a reflection's proposal is thrown away
//! because the parent memory was dirty or the merge conflicted, automatic
//! launches wait before trying again (spec §5.4 [B]).
//!
//! ```json
//! {"delayMs": 120000, "retryAt": "2026-12-02T11:02:00Z"}
//! ```
//!
//! The delay starts at 60 s and doubles with each further failure, capped
//! at 30 min. Automatic launches skip while `now < retryAt`; manual launches
//! ignore the file (the caller decides); a successful reflection clears it.
//! An unreadable or malformed file counts as no backoff (with a warning):
//! it can only ever delay reflection, never be needed for correctness.

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::{MAX_SMALL_JSON_BYTES, PUBLIC_FILE_MODE, ReflectionError};
use crate::paths::{AgentPaths, REFLECTION_BACKOFF_FILE_NAME};

/// The first delay after a failure.
pub const INITIAL_DELAY: Duration = Duration::seconds(60);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::minutes(30);

/// The backoff record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    /// The delay last applied, in milliseconds.
    pub delay_ms: u64,
    /// When automatic launches may run again (RFC 3339).
    pub retry_at: String,
}

impl Backoff {
    /// `retryAt` as a time (`None` when the file's text is not one).
    pub(crate) fn retry_time(&self) -> Option<OffsetDateTime> {
        crate::clock::parse_rfc3339(&self.retry_at)
    }
}

/// The delay after one more failure, given the last one.
pub(crate) fn next_delay(previous: Option<Duration>) -> Duration {
    match previous {
        Some(d) if d > Duration::ZERO => std::cmp::min(d.saturating_mul(2), MAX_DELAY),
        _ => INITIAL_DELAY,
    }
}

/// The stored backoff, `None` when there is none or it cannot be used.
pub fn load(agent: &AgentPaths) -> Result<Option<Backoff>, ReflectionError> {
    let Some(dir) = super::open_reflections_dir(agent, false)? else {
        return Ok(None);
    };
    match super::read_json::<Backoff>(&dir, REFLECTION_BACKOFF_FILE_NAME, MAX_SMALL_JSON_BYTES) {
        Ok(b) => Ok(b),
        Err(ReflectionError::Corrupt { path, message }) => {
            tracing::warn!("{}: {message}; ignoring it", path.display());
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Record a `parent_dirty` / `merge_conflict` outcome at `now`: the delay
/// doubles (from 60 s, at most 30 min) and automatic launches wait it out.
pub fn record_failure(agent: &AgentPaths, now: OffsetDateTime) -> Result<Backoff, ReflectionError> {
    let previous =
        load(agent)?.map(|b| Duration::milliseconds(i64::try_from(b.delay_ms).unwrap_or(i64::MAX)));
    let delay = next_delay(previous);
    let backoff = Backoff {
        delay_ms: u64::try_from(delay.whole_milliseconds()).unwrap_or(0),
        retry_at: crate::clock::rfc3339(now + delay),
    };
    let bytes = super::to_pretty_json(&backoff, agent.reflection_backoff_json())?;
    let dir = super::open_reflections_dir(agent, true)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflections_dir(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    dir.replace_file(REFLECTION_BACKOFF_FILE_NAME, &bytes, PUBLIC_FILE_MODE)?;
    Ok(backoff)
}

/// When automatic launches may run again, if that is after `now`.
pub fn check(
    agent: &AgentPaths,
    now: OffsetDateTime,
) -> Result<Option<OffsetDateTime>, ReflectionError> {
    Ok(load(agent)?
        .and_then(|b| b.retry_time())
        .filter(|retry| now < *retry))
}

/// Forget the backoff (a reflection succeeded).
pub fn clear(agent: &AgentPaths) -> Result<(), ReflectionError> {
    let Some(dir) = super::open_reflections_dir(agent, false)? else {
        return Ok(());
    };
    match dir.remove_file(REFLECTION_BACKOFF_FILE_NAME) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil;
    use time::macros::datetime;

    #[test]
    fn delays_double_from_a_minute_up_to_half_an_hour() {
        let (_t, agent) = testutil::agent();
        let now = datetime!(2026-12-02 10:00 UTC);
        let expected = [60, 120, 240, 480, 960, 1800, 1800];
        for secs in expected {
            let b = record_failure(&agent, now).expect("record");
            assert_eq!(b.delay_ms, secs * 1000);
            assert_eq!(b.retry_time(), Some(now + Duration::seconds(secs as i64)));
        }
    }

    #[test]
    fn check_skips_until_retry_at_and_clear_resets() {
        let (_t, agent) = testutil::agent();
        let now = datetime!(2026-12-02 10:00 UTC);
        assert_eq!(check(&agent, now).expect("check"), None);
        record_failure(&agent, now).expect("record");
        let retry = now + Duration::seconds(60);
        assert_eq!(check(&agent, now).expect("check"), Some(retry));
        assert_eq!(
            check(&agent, retry - Duration::seconds(1)).expect("check"),
            Some(retry)
        );
        assert_eq!(check(&agent, retry).expect("check"), None, "due at retryAt");
        clear(&agent).expect("clear");
        assert_eq!(check(&agent, now).expect("check"), None);
        clear(&agent).expect("clearing twice is fine");
        let b = record_failure(&agent, now).expect("record");
        assert_eq!(b.delay_ms, 60_000, "a cleared backoff starts over");
    }

    #[test]
    fn the_file_uses_camel_case() {
        let (_t, agent) = testutil::agent();
        record_failure(&agent, datetime!(2026-12-02 10:00 UTC)).expect("record");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(agent.reflection_backoff_json()).expect("read"))
                .expect("json");
        assert_eq!(v["delayMs"], 60_000);
        assert_eq!(v["retryAt"], "2026-12-02T10:01:00Z");
    }

    #[test]
    fn a_malformed_file_means_no_backoff() {
        let (_t, agent) = testutil::agent();
        std::fs::create_dir_all(agent.reflections_dir()).expect("mkdir");
        std::fs::write(agent.reflection_backoff_json(), b"[1,2").expect("write");
        let now = datetime!(2026-12-02 10:00 UTC);
        assert_eq!(check(&agent, now).expect("check"), None);
        assert_eq!(
            record_failure(&agent, now).expect("record").delay_ms,
            60_000
        );
    }
}
