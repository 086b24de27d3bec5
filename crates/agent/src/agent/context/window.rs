//! The context window and when to compact (spec agent-loop.md §4, book
//! ch. 11).
//!
//! `reserve = min(16384, max(1, floor(W × 0.2)))`, `threshold = max(0, W −
//! reserve)`, and a conversation is compacted when its tokens are strictly
//! above the threshold. The model's `max_tokens` is deliberately not part of
//! it: a small `max_tokens` must end a response with a length stop, not
//! compact the conversation, and a large one must not compact it early.
//!
//! Which window: the first of
//!
//! 1. `chat --context-window N` (which also becomes the conversation's own
//!    setting, so it stays for later turns),
//! 2. `MINI_LETTA_CONTEXT_WINDOW` (this invocation only),
//! 3. the conversation's settings (`settings.json`, `context_window_limit`),
//! 4. the agent's `model_settings.context_window_limit` (`agent create
//!    --context-window N`),
//! 5. the window the supervisor's configuration gives the model
//!    (`[providers.mock] context_window`, `[model] context_window`;
//!    `model.info` from a child),
//!
//! else none: without a window nothing compacts for pressure (a provider's
//! overflow error still does).
//!
//! Sub-agents (reflections, memory workers, recall) have a window of their
//! own, so that a tiny main window (book lab 4: 900) does not make every
//! reflection fail. The supervisor takes the first of ([`first_window`]):
//!
//! 1. `MINI_LETTA_REFLECTION_CONTEXT_WINDOW` in the supervisor's own
//!    environment (the operator's word; an embedded supervisor has the
//!    environment of the command that started it),
//! 2. `[reflection] context_window` in `config.toml`,
//! 3. the window the command asked with (its
//!    `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`, else its main window),
//! 4. the agent's `model_settings.context_window_limit`,
//! 5. the window `config.toml` gives the agent's model.
//!
//! `mini-letta context` shows it with its source: this shell's variable
//! (as an embedded supervisor would see it), `config.toml`, else the
//! conversation's main window.

use serde::Serialize;

/// The reserve's cap, in tokens.
pub const RESERVE_CAP: u64 = 16_384;
/// `chat`'s and `context`'s window for this invocation.
pub const CONTEXT_WINDOW_ENV: &str = "MINI_LETTA_CONTEXT_WINDOW";
/// The window reflection sub-agents get.
pub const REFLECTION_CONTEXT_WINDOW_ENV: &str = "MINI_LETTA_REFLECTION_CONTEXT_WINDOW";
/// The key of the window in an agent's `model_settings` (and in a
/// conversation's settings).
pub const WINDOW_SETTING: &str = "context_window_limit";

/// Tokens kept free below the window: `min(16384, max(1, floor(W × 0.2)))`.
/// (`floor(W × 0.2)` is `W / 5` in integers: the fractional parts of `W / 5`
/// are multiples of 0.2, far from the float's rounding error.)
pub fn reserve(window: u64) -> u64 {
    (window / 5).clamp(1, RESERVE_CAP)
}

/// The compaction threshold of a window: `max(0, W − reserve)`.
pub fn threshold(window: u64) -> u64 {
    window.saturating_sub(reserve(window))
}

/// Whether `tokens` call for a compaction in `window` (strictly above the
/// threshold; never without a window).
pub(crate) fn should_compact(tokens: u64, window: Option<u64>) -> bool {
    window.is_some_and(|w| tokens > threshold(w))
}

/// A window that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not a context window (a whole number of tokens, at least 1)")]
pub struct WindowError {
    pub name: String,
    pub value: String,
}

/// A window given as text (an environment variable): a positive integer.
pub(crate) fn parse_window(name: &str, value: &str) -> Result<u64, WindowError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|w| *w > 0)
        .ok_or_else(|| WindowError {
            name: name.to_string(),
            value: value.to_string(),
        })
}

/// The windows a program passes to a turn from its environment:
/// `MINI_LETTA_CONTEXT_WINDOW` and `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`.
pub fn env_windows() -> Result<(Option<u64>, Option<u64>), WindowError> {
    Ok((
        env_window(CONTEXT_WINDOW_ENV)?,
        env_window(REFLECTION_CONTEXT_WINDOW_ENV)?,
    ))
}

/// The window in environment variable `name`, if set (an empty value is
/// unset).
pub fn env_window(name: &str) -> Result<Option<u64>, WindowError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => parse_window(name, &v).map(Some),
        Ok(_) => Ok(None),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(WindowError {
            name: name.to_string(),
            value: v.to_string_lossy().into_owned(),
        }),
    }
}

/// The window an agent's `model_settings` give (a positive integer).
pub fn agent_window(model_settings: &serde_json::Map<String, serde_json::Value>) -> Option<u64> {
    model_settings
        .get(WINDOW_SETTING)
        .and_then(serde_json::Value::as_u64)
        .filter(|w| *w > 0)
}

/// Where a window came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowSource {
    /// `chat --context-window N`.
    Option,
    /// `MINI_LETTA_CONTEXT_WINDOW`.
    Environment,
    /// The conversation's settings.
    Conversation,
    /// The agent's `model_settings`.
    Agent,
    /// The supervisor's configuration for the model.
    Provider,
    /// Nowhere: no window is known.
    None,
}

impl WindowSource {
    pub fn as_str(self) -> &'static str {
        match self {
            WindowSource::Option => "option",
            WindowSource::Environment => "environment",
            WindowSource::Conversation => "conversation",
            WindowSource::Agent => "agent",
            WindowSource::Provider => "provider",
            WindowSource::None => "none",
        }
    }
}

/// Where a sub-agent's window came from (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReflectionWindowSource {
    /// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`.
    Environment,
    /// `config.toml`'s `[reflection] context_window`.
    Config,
    /// The window the command that started it asked with.
    Caller,
    /// The agent's `model_settings`.
    Agent,
    /// What `config.toml` gives the agent's model.
    Provider,
    /// The conversation's own window (`mini-letta context`).
    Main,
    /// Nowhere.
    None,
}

impl ReflectionWindowSource {
    /// How `mini-letta context` says it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Environment => "$MINI_LETTA_REFLECTION_CONTEXT_WINDOW",
            Self::Config => "config.toml [reflection] context_window",
            Self::Caller => "the window the command asked with",
            Self::Agent => "the agent's setting",
            Self::Provider => "config.toml for the model",
            Self::Main => {
                "the conversation's window; set MINI_LETTA_REFLECTION_CONTEXT_WINDOW or [reflection] context_window for one of its own"
            }
            Self::None => "none",
        }
    }
}

/// The first positive window of `candidates`, with its source.
pub fn first_window<S: Copy>(candidates: &[(Option<u64>, S)], none: S) -> (Option<u64>, S) {
    candidates
        .iter()
        .find_map(|(w, s)| w.filter(|w| *w > 0).map(|w| (Some(w), *s)))
        .unwrap_or((None, none))
}

/// What the window is resolved from, highest priority first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowInputs {
    pub option: Option<u64>,
    pub environment: Option<u64>,
    pub conversation: Option<u64>,
    pub agent: Option<u64>,
    /// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW`.
    pub reflection: Option<u64>,
    /// `config.toml`'s `[reflection] context_window`.
    pub reflection_config: Option<u64>,
}

/// The window a conversation's turns use, and what follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResolvedWindow {
    pub context_window: Option<u64>,
    #[serde(rename = "window_source")]
    pub source: WindowSource,
    /// Compaction above this many tokens.
    pub threshold: Option<u64>,
    pub reserve: Option<u64>,
    /// The reflection sub-agents' window: its own setting, else the main one.
    pub reflection_context_window: Option<u64>,
    #[serde(rename = "reflection_window_source")]
    pub reflection_source: ReflectionWindowSource,
}

impl ResolvedWindow {
    /// The window from `inputs`; `provider` is asked only when nothing
    /// before it gives one (for a child it is a request to the supervisor).
    pub fn resolve(inputs: &WindowInputs, provider: impl FnOnce() -> Option<u64>) -> Self {
        let found = [
            (inputs.option, WindowSource::Option),
            (inputs.environment, WindowSource::Environment),
            (inputs.conversation, WindowSource::Conversation),
            (inputs.agent, WindowSource::Agent),
        ]
        .into_iter()
        .find_map(|(w, s)| w.filter(|w| *w > 0).map(|w| (w, s)));
        let (window, source) = match found {
            Some((w, s)) => (Some(w), s),
            None => match provider().filter(|w| *w > 0) {
                Some(w) => (Some(w), WindowSource::Provider),
                None => (None, WindowSource::None),
            },
        };
        let (reflection_context_window, reflection_source) = first_window(
            &[
                (inputs.reflection, ReflectionWindowSource::Environment),
                (inputs.reflection_config, ReflectionWindowSource::Config),
                (window, ReflectionWindowSource::Main),
            ],
            ReflectionWindowSource::None,
        );
        Self {
            context_window: window,
            source,
            threshold: window.map(threshold),
            reserve: window.map(reserve),
            reflection_context_window,
            reflection_source,
        }
    }

    /// Whether `tokens` call for a compaction.
    pub fn over(&self, tokens: u64) -> bool {
        should_compact(tokens, self.context_window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_table() {
        for (window, want) in [
            (8192, 6554),
            (128_000, 111_616),
            (1_000_000, 983_616),
            (900, 720),
            (32_768, 26_215),
        ] {
            assert_eq!(threshold(window), want, "window {window}");
        }
        // The reserve is capped, and at least one token.
        assert_eq!(reserve(1_000_000), RESERVE_CAP);
        assert_eq!(reserve(4), 1);
        assert_eq!(threshold(1), 0);
        // floor(W × 0.2) computed in floats agrees with W / 5.
        for w in (1..20_000).chain([81_920, 81_921, 81_924, 10_000_001]) {
            assert_eq!(
                reserve(w),
                ((w as f64 * 0.2).floor() as u64).clamp(1, RESERVE_CAP)
            );
        }
    }

    #[test]
    fn strictly_above_the_threshold_and_never_without_a_window() {
        assert!(!should_compact(720, Some(900)));
        assert!(should_compact(721, Some(900)));
        assert!(!should_compact(u64::MAX, None));
    }

    #[test]
    fn resolution_order() {
        let all = WindowInputs {
            option: Some(1),
            environment: Some(2),
            conversation: Some(3),
            agent: Some(4),
            reflection: None,
            reflection_config: None,
        };
        let r = ResolvedWindow::resolve(&all, || Some(5));
        assert_eq!(
            (r.context_window, r.source),
            (Some(1), WindowSource::Option)
        );
        let r = ResolvedWindow::resolve(
            &WindowInputs {
                option: None,
                ..all
            },
            || Some(5),
        );
        assert_eq!(r.source, WindowSource::Environment);
        let r = ResolvedWindow::resolve(
            &WindowInputs {
                conversation: Some(3),
                agent: Some(4),
                ..Default::default()
            },
            || panic!("the provider is not asked when a setting gives the window"),
        );
        assert_eq!(
            (r.context_window, r.source),
            (Some(3), WindowSource::Conversation)
        );
        let r = ResolvedWindow::resolve(
            &WindowInputs {
                agent: Some(900),
                ..Default::default()
            },
            || None,
        );
        assert_eq!(
            (r.context_window, r.threshold, r.source),
            (Some(900), Some(720), WindowSource::Agent)
        );
        let r = ResolvedWindow::resolve(&WindowInputs::default(), || Some(8192));
        assert_eq!(
            (r.context_window, r.source),
            (Some(8192), WindowSource::Provider)
        );
        let r = ResolvedWindow::resolve(&WindowInputs::default(), || None);
        assert_eq!((r.context_window, r.threshold), (None, None));
        assert!(!r.over(1_000_000));
    }

    #[test]
    fn the_reflection_window_defaults_to_the_main_one() {
        let tiny = WindowInputs {
            option: Some(900),
            ..Default::default()
        };
        assert_eq!(
            ResolvedWindow::resolve(&tiny, || None).reflection_context_window,
            Some(900)
        );
        let r = ResolvedWindow::resolve(&tiny, || None);
        assert_eq!(r.reflection_source, ReflectionWindowSource::Main);
        let configured = WindowInputs {
            reflection_config: Some(8000),
            ..tiny
        };
        let r = ResolvedWindow::resolve(&configured, || None);
        assert_eq!(
            (r.reflection_context_window, r.reflection_source),
            (Some(8000), ReflectionWindowSource::Config)
        );
        let larger = WindowInputs {
            reflection: Some(16000),
            ..configured
        };
        let r = ResolvedWindow::resolve(&larger, || None);
        assert_eq!(
            (r.reflection_context_window, r.reflection_source),
            (Some(16000), ReflectionWindowSource::Environment)
        );
        let none = ResolvedWindow::resolve(&WindowInputs::default(), || None);
        assert_eq!(
            (none.reflection_context_window, none.reflection_source),
            (None, ReflectionWindowSource::None)
        );
    }

    #[test]
    fn windows_from_text_and_settings() {
        assert_eq!(parse_window("W", " 900 "), Ok(900));
        for bad in ["0", "-1", "9k", "", "1.5"] {
            let e = parse_window("W", bad).unwrap_err();
            assert!(e.to_string().starts_with("W="), "{e}");
        }
        let mut settings = serde_json::Map::new();
        assert_eq!(agent_window(&settings), None);
        settings.insert(WINDOW_SETTING.into(), serde_json::json!(900));
        assert_eq!(agent_window(&settings), Some(900));
        settings.insert(WINDOW_SETTING.into(), serde_json::json!("900"));
        assert_eq!(agent_window(&settings), None);
    }
}
