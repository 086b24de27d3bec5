//! Provider configuration: `<home>/config.toml` plus the usual environment
//! variables. Only the supervisor reads it — it alone holds credentials and
//! network — so nothing here is ever passed to an agent child.
//!
//! ```toml
//! [model]
//! default = "mock"            # handle used when an agent names none
//! context_window = 128000     # optional, tokens, applies to every model
//!
//! [model.context_windows]     # optional, per model; wins over the above and
//! "openai/gpt-4o-mini" = 64000  # over the built-in table (`model::windows`)
//!
//! [providers.openai]          # any OpenAI-compatible server (Ollama, vLLM, llama.cpp)
//! base_url = "https://api.openai.com/v1"   # else $OPENAI_BASE_URL, else this default
//! api_key_env = "OPENAI_API_KEY"           # variable holding the key (the default)
//! # api_key = "sk-..."        # discouraged (a secret in a file), but allowed; wins over the env
//! timeout_secs = 300          # one request's limit, answer streamed included (the default)
//!
//! [providers.anthropic]
//! base_url = "https://api.anthropic.com"   # else $ANTHROPIC_BASE_URL, else this default
//! api_key_env = "ANTHROPIC_API_KEY"
//!
//! [providers.mock]
//! context_window = 900        # optional: the mock answers ContextOverflow above it
//!
//! [reflection]
//! context_window = 8000       # optional: the window of reflections and other
//!                             # sub-agents (agent::context::window)
//! ```
//!
//! The file may be absent: everything has a default and the default model is
//! `mock`, so a fresh machine works offline. Other top-level tables are left
//! to other subsystems; unknown keys inside `[model]` and `[providers.*]` are
//! errors, because a typo there would silently send requests elsewhere.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::paths::Home;

use super::provider::ModelError;

/// Default OpenAI endpoint.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// Default Anthropic endpoint.
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The model used when nothing is configured.
pub const DEFAULT_MODEL: &str = "mock";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration in {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

impl From<ConfigError> for ModelError {
    fn from(e: ConfigError) -> Self {
        ModelError::fatal(e.to_string())
    }
}

/// Where one real provider lives and how it authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Base URL without a trailing `/`.
    pub base_url: String,
    /// The key, from the file's `api_key` or the `api_key_env` variable.
    pub api_key: Option<String>,
    /// The variable the key is read from (named in error messages).
    pub api_key_env: String,
    /// How long one request may take, connecting to the end of the
    /// streamed answer (`timeout_secs`; [`DEFAULT_TIMEOUT_SECS`]).
    pub timeout_secs: u64,
}

/// A request's time limit when `timeout_secs` says none (letta-code's
/// default is five minutes too).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// Everything the model factory needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// `[model] default`.
    pub default_model: Option<String>,
    /// `[model] context_window`.
    pub context_window: Option<u64>,
    /// `[model.context_windows]`: per model handle.
    pub context_windows: std::collections::BTreeMap<String, u64>,
    /// `[providers.mock] context_window`.
    pub mock_context_window: Option<u64>,
    /// `[reflection] context_window`: sub-agents' own window.
    pub reflection_context_window: Option<u64>,
    pub openai: EndpointConfig,
    pub anthropic: EndpointConfig,
    /// The scripted test model's script (`MINI_LETTA_SCRIPTED_MODEL` in the
    /// supervisor's own environment): the handle `mock/scripted` uses it.
    /// Never taken from a model name, which a child could choose.
    pub scripted_script: Option<PathBuf>,
    /// The file read, when it existed.
    pub source: Option<PathBuf>,
}

/// The variable naming the scripted model's script.
pub const SCRIPTED_MODEL_ENV: &str = "MINI_LETTA_SCRIPTED_MODEL";

#[derive(Debug, Default, Deserialize)]
struct FileConfig {
    #[serde(default)]
    model: ModelSection,
    #[serde(default)]
    providers: ProvidersSection,
    #[serde(default)]
    reflection: ReflectionSection,
    /// The other tables (each read by the module it configures), and
    /// anything misspelt.
    #[serde(flatten)]
    rest: std::collections::BTreeMap<String, toml::Value>,
}

/// Every top-level table of `config.toml`. This file is read by nearly
/// every command, so a misspelt table (`[modle]`) is refused here, naming
/// its line — it would otherwise be ignored in silence by every reader.
pub const TABLES: &[&str] = &[
    "model",
    "providers",
    "reflection",
    "network",
    "quota",
    "cluster",
    "audit",
];

/// Refuse top-level names of `text` that are no table of [`TABLES`]: the
/// line, the name, the closest valid one.
fn check_tables(text: &str, names: impl Iterator<Item = String>) -> Result<(), String> {
    for name in names {
        if TABLES.contains(&name.as_str()) {
            continue;
        }
        let line = text
            .lines()
            .position(|l| {
                let l = l.trim_start().trim_start_matches('[').trim_start();
                l.strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.trim_start().starts_with(['=', ']', '.']))
            })
            .map(|i| format!("line {}: ", i + 1))
            .unwrap_or_default();
        let closest = TABLES
            .iter()
            .map(|t| (edit_distance(t, &name), t))
            .min()
            .filter(|(d, _)| *d <= 2)
            .map(|(_, t)| format!("did you mean [{t}]? "))
            .unwrap_or_default();
        let all: Vec<String> = TABLES.iter().map(|t| format!("[{t}]")).collect();
        return Err(format!(
            "{line}unknown table or key {name:?}; {closest}config.toml has {}",
            all.join(", ")
        ));
    }
    Ok(())
}

/// Levenshtein distance (names are a few letters long).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReflectionSection {
    context_window: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSection {
    default: Option<String>,
    context_window: Option<u64>,
    #[serde(default)]
    context_windows: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProvidersSection {
    #[serde(default)]
    openai: EndpointSection,
    #[serde(default)]
    anthropic: EndpointSection,
    #[serde(default)]
    mock: MockSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointSection {
    base_url: Option<String>,
    api_key_env: Option<String>,
    api_key: Option<String>,
    timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MockSection {
    context_window: Option<u64>,
}

impl ProviderConfig {
    /// Reads `<home>/config.toml` (if present) and the process environment.
    pub fn load(home: &Home) -> Result<Self, ConfigError> {
        Self::load_from(&home.config_file(), &|k| std::env::var(k).ok())
    }

    /// Reads `path` (if present) with `env` standing in for the environment.
    pub fn load_from(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let (text, source) = match std::fs::read_to_string(path) {
            Ok(t) => (t, Some(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), None),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: FileConfig = toml::from_str(&text).map_err(|e| {
            // One line: where, then what (toml's own text spans several).
            let at = e.span().map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}: ")
            });
            invalid(format!(
                "{}{}",
                at.unwrap_or_default(),
                e.message().trim().replace('\n', " ")
            ))
        })?;
        check_tables(&text, file.rest.keys().cloned()).map_err(invalid)?;
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let openai = endpoint(
            file.providers.openai,
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            OPENAI_DEFAULT_BASE_URL,
            &env,
        )
        .map_err(|m| invalid(format!("[providers.openai] {m}")))?;
        let anthropic = endpoint(
            file.providers.anthropic,
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            ANTHROPIC_DEFAULT_BASE_URL,
            &env,
        )
        .map_err(|m| invalid(format!("[providers.anthropic] {m}")))?;
        if let Some(d) = &file.model.default
            && d.trim().is_empty()
        {
            return Err(invalid("[model] default must not be empty".into()));
        }
        for (name, w) in [
            ("[model] context_window", file.model.context_window),
            (
                "[providers.mock] context_window",
                file.providers.mock.context_window,
            ),
            (
                "[reflection] context_window",
                file.reflection.context_window,
            ),
        ] {
            if w == Some(0) {
                return Err(invalid(format!("{name} must be greater than 0")));
            }
        }
        if let Some((handle, _)) = file.model.context_windows.iter().find(|(_, w)| **w == 0) {
            return Err(invalid(format!(
                "[model.context_windows] {handle:?} must be greater than 0"
            )));
        }
        Ok(Self {
            default_model: file.model.default,
            context_window: file.model.context_window,
            context_windows: file.model.context_windows,
            mock_context_window: file.providers.mock.context_window,
            reflection_context_window: file.reflection.context_window,
            openai,
            anthropic,
            scripted_script: env(SCRIPTED_MODEL_ENV).map(PathBuf::from),
            source,
        })
    }

    /// The configuration with nothing configured (no file, no environment).
    pub fn offline() -> Self {
        let ep = |env_name: &str, url: &str| EndpointConfig {
            base_url: url.to_string(),
            api_key: None,
            api_key_env: env_name.to_string(),
            timeout_secs: DEFAULT_TIMEOUT_SECS,
        };
        Self {
            default_model: None,
            context_window: None,
            context_windows: Default::default(),
            mock_context_window: None,
            reflection_context_window: None,
            openai: ep("OPENAI_API_KEY", OPENAI_DEFAULT_BASE_URL),
            anthropic: ep("ANTHROPIC_API_KEY", ANTHROPIC_DEFAULT_BASE_URL),
            scripted_script: None,
            source: None,
        }
    }

    /// The context window of `handle`: `[model.context_windows]` for it,
    /// `[providers.mock] context_window` for mock handles, `[model]
    /// context_window`, else the model's known window
    /// ([`crate::windows`]).
    pub fn context_window_for(&self, handle: &str) -> Option<u64> {
        self.window_origin(handle).map(|(w, _)| w)
    }

    /// [`Self::context_window_for`] and where it came from, as an operator
    /// reads it.
    pub(crate) fn window_origin(&self, handle: &str) -> Option<(u64, &'static str)> {
        let handle = handle.trim();
        let is_mock = handle == "mock" || handle.starts_with("mock/");
        let configured = self
            .context_windows
            .get(handle)
            .copied()
            .or(if is_mock {
                self.mock_context_window
            } else {
                None
            })
            .or(self.context_window);
        match configured {
            Some(w) => Some((w, "config.toml for the model")),
            None => crate::windows::known_window(handle).map(|w| {
                (
                    w,
                    "the model's published window (config.toml [model.context_windows] overrides it)",
                )
            }),
        }
    }
}

fn endpoint(
    section: EndpointSection,
    default_key_env: &str,
    base_url_env: &str,
    default_base_url: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EndpointConfig, String> {
    let base_url = section
        .base_url
        .or_else(|| env(base_url_env))
        .unwrap_or_else(|| default_base_url.to_string());
    let base_url = base_url.trim().trim_end_matches('/').to_string();
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(format!(
            "base_url {base_url:?} must start with http:// or https://"
        ));
    }
    let api_key_env = section
        .api_key_env
        .unwrap_or_else(|| default_key_env.to_string());
    if api_key_env.trim().is_empty() {
        return Err("api_key_env must not be empty".into());
    }
    let api_key = section
        .api_key
        .filter(|k| !k.trim().is_empty())
        .or_else(|| env(&api_key_env));
    let timeout_secs = section.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout_secs == 0 {
        return Err("timeout_secs must be greater than 0".into());
    }
    Ok(EndpointConfig {
        base_url,
        api_key,
        api_key_env,
        timeout_secs,
    })
}

/// The model handle to use when an agent names none: `[model] default`,
/// else `mock`.
pub fn default_model(cfg: &ProviderConfig) -> String {
    cfg.default_model
        .clone()
        .unwrap_or_else(|| DEFAULT_MODEL.to_string())
}

/// Whether `base_url` points at this machine (a local Ollama or llama.cpp
/// server needs no key).
pub(crate) fn is_loopback_url(base_url: &str) -> bool {
    let rest = base_url
        .strip_prefix("http://")
        .or_else(|| base_url.strip_prefix("https://"))
        .unwrap_or(base_url);
    let authority = rest.split('/').next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost") || host.starts_with("127.") || host == "::1"
}
