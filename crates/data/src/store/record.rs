//! `agent.json`: what an agent is.

use serde::{Deserialize, Serialize};

/// The system prompt a new agent gets unless `--system-file` says otherwise.
/// Memory is appended after a blank line (no `{CORE_MEMORY}` placeholder).
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant with long-term memory.\n\
Your memory is a git repository of Markdown files. The files below are your core memory and are \
always in view; directories listed as deferred memory hold more, behind their MEMORY.md index. \
Keep memory accurate and concise: record what matters about the user and yourself, and never \
store secrets.";

/// The model used when nothing else is configured: offline and deterministic.
pub const DEFAULT_MODEL: &str = "mock";

/// The longest agent name, in characters.
pub const MAX_NAME_CHARS: usize = 100;

/// The agent record, as stored in `agents/<id>/agent.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Raw system prompt; may contain `{CORE_MEMORY}`.
    pub system: String,
    #[serde(default)]
    pub tags: Vec<String>,
    pub model: String,
    /// Free-form model settings; `context_window_limit` (tokens) is the
    /// context window of the agent's turns (`agent create --context-window`).
    #[serde(default)]
    pub model_settings: serde_json::Map<String, serde_json::Value>,
    pub created_at: String,
    /// The uid this agent's confined processes run as (assigned by the
    /// supervisor at first launch when it runs as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_uid: Option<u32>,
    /// Disk and inode quota: the agent's directory is a volume this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<crate::sandbox::volume::Quota>,
    /// How its conversations are compacted (`mode`, `prompt`, `clip_chars`,
    /// `sliding_window_percentage`); the defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_settings: Option<CompactionSettings>,
    /// Where `model` came from (`agent show` says); absent in records
    /// made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_source: Option<ModelSource>,
}

/// How a compaction summarises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Summarise the oldest messages, keep the recent ones.
    #[default]
    SlidingWindow,
    /// Summarise everything but what waits for the model.
    All,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::SlidingWindow => "sliding_window",
            Mode::All => "all",
        }
    }

    /// `all` or `sliding_window`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Mode::All),
            "sliding_window" => Some(Mode::SlidingWindow),
            _ => None,
        }
    }
}

/// An agent's `compaction_settings` (in `agent.json`; every field
/// optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompactionSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// A compaction prompt replacing the default of `mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Longest summary in characters (50,000 unless set; 0: never clipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_chars: Option<u64>,
    /// The sliding window's starting percentage (0.3 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_percentage: Option<f64>,
}

/// Where an agent's model was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// `agent create --model`.
    Flag,
    /// `[model] default` in `config.toml` when the agent was created.
    Config,
    /// Nothing named one: the built-in default.
    Builtin,
    /// `agent set-model`.
    SetModel,
    /// A value a newer version wrote.
    #[serde(other)]
    Unknown,
}

impl ModelSource {
    /// How `agent show` says it.
    pub fn describe(self) -> &'static str {
        match self {
            ModelSource::Flag => "from --model",
            ModelSource::Config => "from [model] default in config.toml",
            ModelSource::Builtin => {
                "the built-in default: neither --model nor [model] default in config.toml named one"
            }
            ModelSource::SetModel => "set with `agent set-model`",
            ModelSource::Unknown => "recorded by another version",
        }
    }
}

/// Bounds on a record read from elsewhere (a remote, an archive): generous
/// for anything `agent create` makes, small enough that a listing stays a
/// listing.
pub const MAX_DESCRIPTION_CHARS: usize = 1000;
pub const MAX_TAGS: usize = 64;
pub const MAX_TAG_CHARS: usize = 100;
/// The largest record a remote carries is 256 KiB; a prompt is within it.
pub const MAX_SYSTEM_BYTES: usize = 256 * 1024;
const MAX_MODEL_CHARS: usize = 200;
const MAX_TIME_CHARS: usize = 64;

impl AgentRecord {
    /// Check a record that another host or an archive wrote, field by
    /// field, before it is listed, cloned or imported: an id of the id
    /// form; name, description, tags, model and `created_at` bounded and
    /// free of the characters [`crate::names`] refuses (`created_at` must
    /// also be RFC 3339); the system prompt bounded and without control
    /// characters but line breaks and tabs. The reason names the field and
    /// the character, never the value (it is printed).
    pub fn check_untrusted(&self) -> Result<(), String> {
        if !crate::paths::is_valid_agent_id(&self.id) {
            return Err("the id is not of the agent id form".into());
        }
        if self.name.is_empty() {
            return Err("the name is empty".into());
        }
        check_field("name", &self.name, MAX_NAME_CHARS)?;
        if let Some(d) = &self.description {
            check_field("description", d, MAX_DESCRIPTION_CHARS)?;
        }
        if self.tags.len() > MAX_TAGS {
            return Err(format!("{} tags (at most {MAX_TAGS})", self.tags.len()));
        }
        for tag in &self.tags {
            check_field("a tag", tag, MAX_TAG_CHARS)?;
        }
        check_field("model", &self.model, MAX_MODEL_CHARS)?;
        check_field("created_at", &self.created_at, MAX_TIME_CHARS)?;
        crate::clock::parse_rfc3339(&self.created_at)
            .ok_or_else(|| "created_at is not an RFC 3339 time".to_string())?;
        check_system(&self.system)
    }
}

/// `value` of record field `what`: at most `max` characters, none unsafe.
fn check_field(what: &str, value: &str, max: usize) -> Result<(), String> {
    let chars = value.chars().count();
    if chars > max {
        return Err(format!("{what} is {chars} characters (at most {max})"));
    }
    crate::names::check(value).map_err(|why| format!("{what} {why}"))
}

/// A system prompt is text of many lines: bounded, and no control
/// character but `\n`, `\t` and `\r` (files saved with CRLF line ends).
/// Bidirectional marks are prose here (Arabic, Hebrew), and the prompt is
/// printed through the terminal-safe layer.
pub fn check_system(system: &str) -> Result<(), String> {
    if system.len() > MAX_SYSTEM_BYTES {
        return Err(format!(
            "the system prompt is {} bytes (at most {MAX_SYSTEM_BYTES})",
            system.len()
        ));
    }
    match system
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        Some(c) => Err(format!("the system prompt {}", crate::names::describe(c))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AgentRecord {
        AgentRecord {
            id: "agent-1".into(),
            name: "owl".into(),
            description: Some("Keeps notes – in 日本語 too.".into()),
            system: "Be kind.\r\n\tAlways.\nمرحبا\u{200f}".into(),
            tags: vec!["work".into()],
            model: "mock".into(),
            model_settings: serde_json::Map::new(),
            created_at: "2026-12-04T17:17:53.043Z".into(),
            sandbox_uid: None,
            quota: None,
            compaction_settings: None,
            model_source: None,
        }
    }

    #[test]
    fn a_plain_record_passes_and_each_unsafe_field_is_named() {
        assert_eq!(record().check_untrusted(), Ok(()));
        let esc = "x\u{1b}]52;c;SGVsbG8=\u{7}";
        type Set = fn(&mut AgentRecord, &str);
        let cases: Vec<(Set, &str)> = vec![
            (|r, v| r.name = v.into(), "name"),
            (|r, v| r.description = Some(v.into()), "description"),
            (|r, v| r.tags = vec![v.into()], "a tag"),
            (|r, v| r.model = v.into(), "model"),
            (
                |r, v| r.created_at = format!("2026-12-04T17:17:53Z{v}"),
                "created_at",
            ),
            (|r, v| r.system = format!("ok\n{v}"), "system prompt"),
        ];
        for (set, field) in cases {
            for bad in [esc, "a\u{202e}b", "a\u{9b}2Jb"] {
                let mut r = record();
                set(&mut r, bad);
                if field == "system prompt" && bad == "a\u{202e}b" {
                    // Prose may hold bidirectional marks.
                    assert_eq!(r.check_untrusted(), Ok(()));
                    continue;
                }
                let why = r.check_untrusted().unwrap_err();
                assert!(why.contains(field), "{field}: {why}");
                assert!(crate::names::first_unsafe(&why).is_none(), "{why:?}");
            }
        }
    }

    #[test]
    fn bounds_and_forms() {
        let mut r = record();
        r.created_at = "yesterday".into();
        assert!(r.check_untrusted().unwrap_err().contains("RFC 3339"));
        let mut r = record();
        r.tags = vec!["t".into(); MAX_TAGS + 1];
        assert!(r.check_untrusted().is_err());
        let mut r = record();
        r.description = Some("d".repeat(MAX_DESCRIPTION_CHARS + 1));
        assert!(r.check_untrusted().unwrap_err().contains("description"));
        let mut r = record();
        r.system = "s".repeat(MAX_SYSTEM_BYTES + 1);
        assert!(r.check_untrusted().unwrap_err().contains("system prompt"));
        let mut r = record();
        r.id = "../x".into();
        assert!(r.check_untrusted().is_err());
        let mut r = record();
        r.name = String::new();
        assert!(r.check_untrusted().is_err());
    }
}
