//! Whether a finished turn launches a reflection automatically (spec §5.1).
//!
//! * `off` — never;
//! * `compaction-event` — when the conversation was compacted since the
//!   trigger last looked (its `compaction-event.json` carries an `at` the
//!   state has not recorded as seen);
//! * `step-count` — when the steps since the last successful reflection
//!   reach `stepCount`.
//!
//! [`evaluate`] records a compaction as seen whatever the trigger (one
//! compaction launches at most one reflection, and switching the trigger
//! later does not replay old compactions). Manual launches do not come
//! here at all.

use serde::{Deserialize, Serialize};

use super::settings::{ReflectionSettings, Trigger};
use super::state::{self, ReflectionState};
use super::{MAX_SMALL_JSON_BYTES, ReflectionError};
use crate::paths::{AgentPaths, COMPACTION_EVENT_FILE_NAME};
use crate::store::conversation;

/// Why an automatic reflection is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "trigger", rename_all = "kebab-case")]
pub enum TriggerReason {
    StepCount { steps: u64, threshold: u32 },
    CompactionEvent,
}

/// The decision for `settings` given the conversation's (refreshed)
/// `state` and whether a compaction happened since the last check.
pub(crate) fn should_launch(
    settings: &ReflectionSettings,
    state: &ReflectionState,
    compaction_happened: bool,
) -> Option<TriggerReason> {
    match settings.trigger {
        Trigger::Off => None,
        Trigger::CompactionEvent => compaction_happened.then_some(TriggerReason::CompactionEvent),
        Trigger::StepCount => {
            // A zero threshold (refused on save) is read as 1, not "always".
            let threshold = settings.step_count.max(1);
            (state.steps_since_last_reflection >= u64::from(threshold)).then_some(
                TriggerReason::StepCount {
                    steps: state.steps_since_last_reflection,
                    threshold,
                },
            )
        }
    }
}

/// The part of `compaction-event.json` read here.
#[derive(Deserialize)]
struct EventAt {
    at: String,
}

/// The `at` of conversation `id`'s latest compaction when `state` has not
/// seen it yet. A missing or malformed event file is no compaction.
pub(crate) fn pending_compaction(
    agent: &AgentPaths,
    id: &str,
    state: &ReflectionState,
) -> Result<Option<String>, ReflectionError> {
    let Some(dir) = conversation::open_dir(agent, id, false)? else {
        return Ok(None);
    };
    let at =
        match super::read_json::<EventAt>(&dir, COMPACTION_EVENT_FILE_NAME, MAX_SMALL_JSON_BYTES) {
            Ok(Some(e)) => e.at,
            Ok(None) => return Ok(None),
            Err(ReflectionError::Corrupt { path, message }) => {
                tracing::warn!("{}: {message}; ignored", path.display());
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
    if at.is_empty() || state.compaction_seen_at.as_deref() == Some(at.as_str()) {
        return Ok(None);
    }
    Ok(Some(at))
}

/// After a turn of conversation `id`: refresh its step count, look for a
/// new compaction (recording it as seen), and decide.
pub fn evaluate(
    agent: &AgentPaths,
    id: &str,
    settings: &ReflectionSettings,
) -> Result<Option<TriggerReason>, ReflectionError> {
    let mut st = state::refresh(agent, id)?;
    let pending = pending_compaction(agent, id, &st)?;
    if let Some(at) = &pending {
        st = state::note_compaction_seen(agent, id, at)?;
    }
    Ok(should_launch(settings, &st, pending.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::Role;
    use crate::reflection::settings::MergeMode;
    use crate::reflection::testutil::{self, say};
    use crate::store::conversation::Conversation;

    fn settings(trigger: Trigger, step_count: u32) -> ReflectionSettings {
        ReflectionSettings {
            trigger,
            step_count,
            merge: MergeMode::Auto,
            merge_instructions: String::new(),
        }
    }

    fn state(steps: u64) -> ReflectionState {
        ReflectionState {
            steps_since_last_reflection: steps,
            ..Default::default()
        }
    }

    #[test]
    fn the_decision_table() {
        assert_eq!(
            should_launch(&settings(Trigger::Off, 1), &state(100), true),
            None
        );
        assert_eq!(
            should_launch(&settings(Trigger::StepCount, 3), &state(2), true),
            None,
            "below the threshold, compaction or not"
        );
        assert_eq!(
            should_launch(&settings(Trigger::StepCount, 3), &state(3), false),
            Some(TriggerReason::StepCount {
                steps: 3,
                threshold: 3
            })
        );
        assert_eq!(
            should_launch(&settings(Trigger::CompactionEvent, 1), &state(100), false),
            None
        );
        assert_eq!(
            should_launch(&settings(Trigger::CompactionEvent, 1), &state(0), true),
            Some(TriggerReason::CompactionEvent)
        );
        assert_eq!(
            should_launch(&settings(Trigger::StepCount, 0), &state(0), false),
            None,
            "a zero threshold is not 'always'"
        );
    }

    #[test]
    fn evaluate_counts_steps_from_the_log() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        let s = settings(Trigger::StepCount, 2);
        say(&mut conv, Role::User, "one");
        say(&mut conv, Role::Assistant, "one back");
        assert_eq!(evaluate(&agent, "c1", &s).expect("eval"), None);
        say(&mut conv, Role::User, "two");
        say(&mut conv, Role::Assistant, "two back");
        assert_eq!(
            evaluate(&agent, "c1", &s).expect("eval"),
            Some(TriggerReason::StepCount {
                steps: 2,
                threshold: 2
            })
        );
    }

    #[test]
    fn a_compaction_launches_once() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let s = settings(Trigger::CompactionEvent, 25);
        assert_eq!(
            evaluate(&agent, "c1", &s).expect("eval"),
            None,
            "no event yet"
        );
        let event = agent.conversation("c1").expect("p").compaction_event_json();
        std::fs::write(&event, br#"{"at":"2026-12-02T10:00:00Z","trigger":"auto"}"#)
            .expect("write");
        assert_eq!(
            evaluate(&agent, "c1", &s).expect("eval"),
            Some(TriggerReason::CompactionEvent)
        );
        assert_eq!(evaluate(&agent, "c1", &s).expect("eval"), None, "consumed");
        std::fs::write(&event, br#"{"at":"2026-12-02T11:00:00Z"}"#).expect("write");
        assert_eq!(
            evaluate(&agent, "c1", &s).expect("eval"),
            Some(TriggerReason::CompactionEvent),
            "a newer compaction"
        );
    }

    #[test]
    fn step_count_mode_still_consumes_compactions() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let event = agent.conversation("c1").expect("p").compaction_event_json();
        std::fs::write(&event, br#"{"at":"2026-12-02T10:00:00Z"}"#).expect("write");
        assert_eq!(
            evaluate(&agent, "c1", &settings(Trigger::StepCount, 25)).expect("eval"),
            None
        );
        assert_eq!(
            evaluate(&agent, "c1", &settings(Trigger::CompactionEvent, 25)).expect("eval"),
            None,
            "already seen"
        );
    }

    #[test]
    fn a_malformed_event_is_no_compaction() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let event = agent.conversation("c1").expect("p").compaction_event_json();
        std::fs::write(&event, b"{\"at\": 5}").expect("write");
        let s = settings(Trigger::CompactionEvent, 25);
        assert_eq!(evaluate(&agent, "c1", &s).expect("eval"), None);
    }
}
