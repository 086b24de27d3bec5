//! `reflections/settings.json`: when an agent reflects and how its
//! proposals are merged (spec §5.1).
//!
//! ```json
//! {"trigger": "step-count", "stepCount": 25, "merge": "auto", "mergeInstructions": ""}
//! ```
//!
//! A missing file is the default (step-count, 25, auto, no instructions).
//! Each field is read on its own: one that is missing keeps its default
//! silently, one that is invalid keeps its default with a warning, so one
//! bad field never throws away the others.

use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{MAX_SMALL_JSON_BYTES, PUBLIC_FILE_MODE, ReflectionError};
use crate::paths::{AgentPaths, REFLECTION_SETTINGS_FILE_NAME};

/// Default steps between automatic reflections.
pub const DEFAULT_STEP_COUNT: u32 = 25;

/// What launches a reflection automatically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// Never automatically (manual launches still work).
    Off,
    /// After `step_count` assistant steps since the last success.
    #[default]
    StepCount,
    /// After a compaction of the conversation.
    #[serde(alias = "compaction", alias = "auto-compaction")]
    CompactionEvent,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Off => "off",
            Trigger::StepCount => "step-count",
            Trigger::CompactionEvent => "compaction-event",
        }
    }
}

impl FromStr for Trigger {
    type Err = ReflectionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" => Ok(Trigger::Off),
            "step-count" => Ok(Trigger::StepCount),
            // The legacy spellings letta-code still accepts.
            "compaction-event" | "compaction" | "auto-compaction" => Ok(Trigger::CompactionEvent),
            other => Err(ReflectionError::InvalidSettings(format!(
                "trigger {other:?} is not one of off, step-count, compaction-event"
            ))),
        }
    }
}

/// Who merges a successful reflection's branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeMode {
    /// The harness merges.
    #[default]
    Auto,
    /// The primary agent reviews and merges in an integration conversation.
    Explicit,
}

impl MergeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MergeMode::Auto => "auto",
            MergeMode::Explicit => "explicit",
        }
    }
}

impl FromStr for MergeMode {
    type Err = ReflectionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(MergeMode::Auto),
            "explicit" => Ok(MergeMode::Explicit),
            other => Err(ReflectionError::InvalidSettings(format!(
                "merge mode {other:?} is not one of auto, explicit"
            ))),
        }
    }
}

/// An agent's reflection settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReflectionSettings {
    pub trigger: Trigger,
    /// Steps between automatic reflections (`> 0`).
    pub step_count: u32,
    pub merge: MergeMode,
    /// Extra text for the integration agent in explicit mode (trimmed).
    pub merge_instructions: String,
}

impl Default for ReflectionSettings {
    fn default() -> Self {
        Self {
            trigger: Trigger::StepCount,
            step_count: DEFAULT_STEP_COUNT,
            merge: MergeMode::Auto,
            merge_instructions: String::new(),
        }
    }
}

impl ReflectionSettings {
    /// Settings from a file's bytes, each invalid field replaced by its
    /// default; the warnings say which and why.
    pub fn parse(bytes: &[u8]) -> (Self, Vec<String>) {
        let mut out = Self::default();
        let mut warnings = Vec::new();
        let obj = match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                warnings.push("reflection settings are not a JSON object; using defaults".into());
                return (out, warnings);
            }
            Err(e) => {
                warnings.push(format!(
                    "reflection settings are not valid JSON ({e}); using defaults"
                ));
                return (out, warnings);
            }
        };
        if let Some(v) = obj.get("trigger") {
            match v.as_str().map(Trigger::from_str) {
                Some(Ok(t)) => out.trigger = t,
                _ => warnings.push(format!(
                    "trigger {v} is invalid; using {}",
                    out.trigger.as_str()
                )),
            }
        }
        if let Some(v) = obj.get("stepCount") {
            match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n > 0 => out.step_count = n,
                _ => warnings.push(format!(
                    "stepCount {v} is not a positive integer; using {}",
                    out.step_count
                )),
            }
        }
        if let Some(v) = obj.get("merge") {
            match v.as_str().map(MergeMode::from_str) {
                Some(Ok(m)) => out.merge = m,
                _ => warnings.push(format!(
                    "merge {v} is invalid; using {}",
                    out.merge.as_str()
                )),
            }
        }
        if let Some(v) = obj.get("mergeInstructions") {
            match v.as_str() {
                Some(s) => out.merge_instructions = s.trim().to_string(),
                None => warnings.push(format!("mergeInstructions {v} is not a string; ignored")),
            }
        }
        (out, warnings)
    }

    /// Refuse settings that cannot be saved (a zero step count).
    pub fn validate(&self) -> Result<(), ReflectionError> {
        if self.step_count == 0 {
            return Err(ReflectionError::InvalidSettings(
                "stepCount must be greater than 0".into(),
            ));
        }
        Ok(())
    }
}

/// The agent's settings and any warnings about fields that were replaced
/// by defaults. A settings file that cannot be read safely (a symlink,
/// too large) is an error, not a silent default.
pub(crate) fn load_with_warnings(
    agent: &AgentPaths,
) -> Result<(ReflectionSettings, Vec<String>), ReflectionError> {
    let Some(dir) = super::open_reflections_dir(agent, false)? else {
        return Ok((ReflectionSettings::default(), Vec::new()));
    };
    match super::read_optional(&dir, REFLECTION_SETTINGS_FILE_NAME, MAX_SMALL_JSON_BYTES)? {
        None => Ok((ReflectionSettings::default(), Vec::new())),
        Some(bytes) => Ok(ReflectionSettings::parse(&bytes)),
    }
}

/// The agent's settings; warnings are logged.
pub fn load(agent: &AgentPaths) -> Result<ReflectionSettings, ReflectionError> {
    let (settings, warnings) = load_with_warnings(agent)?;
    for w in warnings {
        tracing::warn!("{}: {w}", agent.reflection_settings_json().display());
    }
    Ok(settings)
}

/// Save the agent's settings (validated; instructions trimmed).
pub fn save(agent: &AgentPaths, settings: &ReflectionSettings) -> Result<(), ReflectionError> {
    settings.validate()?;
    let mut settings = settings.clone();
    settings.merge_instructions = settings.merge_instructions.trim().to_string();
    let bytes = super::to_pretty_json(&settings, agent.reflection_settings_json())?;
    let dir = super::open_reflections_dir(agent, true)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflections_dir(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    dir.replace_file(REFLECTION_SETTINGS_FILE_NAME, &bytes, PUBLIC_FILE_MODE)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil;

    #[test]
    fn missing_file_is_the_default() {
        let (_t, agent) = testutil::agent();
        let s = load(&agent).expect("load");
        assert_eq!(s, ReflectionSettings::default());
        assert_eq!(s.trigger, Trigger::StepCount);
        assert_eq!(s.step_count, 25);
        assert_eq!(s.merge, MergeMode::Auto);
        assert_eq!(s.merge_instructions, "");
    }

    #[test]
    fn save_then_load_round_trips_in_kebab_and_camel_case() {
        let (_t, agent) = testutil::agent();
        let s = ReflectionSettings {
            trigger: Trigger::CompactionEvent,
            step_count: 7,
            merge: MergeMode::Explicit,
            merge_instructions: "  keep it short \n".into(),
        };
        save(&agent, &s).expect("save");
        let text = std::fs::read_to_string(agent.reflection_settings_json()).expect("read");
        assert!(text.contains("\"trigger\": \"compaction-event\""), "{text}");
        assert!(text.contains("\"stepCount\": 7"), "{text}");
        assert!(text.contains("\"merge\": \"explicit\""), "{text}");
        let back = load(&agent).expect("load");
        assert_eq!(back.trigger, Trigger::CompactionEvent);
        assert_eq!(back.step_count, 7);
        assert_eq!(back.merge, MergeMode::Explicit);
        assert_eq!(back.merge_instructions, "keep it short");
    }

    #[test]
    fn zero_step_count_is_refused_on_save() {
        let (_t, agent) = testutil::agent();
        let s = ReflectionSettings {
            step_count: 0,
            ..Default::default()
        };
        assert!(matches!(
            save(&agent, &s),
            Err(ReflectionError::InvalidSettings(_))
        ));
        assert!(!agent.reflection_settings_json().exists());
    }

    #[test]
    fn each_invalid_field_falls_back_alone() {
        let (_t, agent) = testutil::agent();
        std::fs::create_dir_all(agent.reflections_dir()).expect("mkdir");
        std::fs::write(
            agent.reflection_settings_json(),
            r#"{"trigger":"sometimes","stepCount":0,"merge":"explicit","mergeInstructions":5}"#,
        )
        .expect("write");
        let (s, warnings) = load_with_warnings(&agent).expect("load");
        assert_eq!(s.trigger, Trigger::StepCount);
        assert_eq!(s.step_count, 25);
        assert_eq!(s.merge, MergeMode::Explicit, "a valid field is kept");
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("trigger"));
        assert!(warnings[1].contains("stepCount"));
    }

    #[test]
    fn garbage_file_is_the_default_with_a_warning() {
        let (_t, agent) = testutil::agent();
        std::fs::create_dir_all(agent.reflections_dir()).expect("mkdir");
        std::fs::write(agent.reflection_settings_json(), b"{not json").expect("write");
        let (s, warnings) = load_with_warnings(&agent).expect("load");
        assert_eq!(s, ReflectionSettings::default());
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn legacy_trigger_spellings_are_accepted() {
        let (s, w) = ReflectionSettings::parse(br#"{"trigger":"auto-compaction","stepCount":3}"#);
        assert_eq!(s.trigger, Trigger::CompactionEvent);
        assert_eq!(s.step_count, 3);
        assert!(w.is_empty());
    }

    #[test]
    fn a_symlinked_settings_file_is_refused() {
        let (t, agent) = testutil::agent();
        std::fs::create_dir_all(agent.reflections_dir()).expect("mkdir");
        let target = t.path().join("elsewhere.json");
        std::fs::write(&target, br#"{"trigger":"off"}"#).expect("write");
        std::os::unix::fs::symlink(&target, agent.reflection_settings_json()).expect("symlink");
        assert!(load(&agent).is_err());
    }
}
