//! Model handles → models. The handle names the provider so that one agent
//! record (`"model": "openai/gpt-4o-mini"`) is enough to reach it; the
//! endpoint and key come from the supervisor's [`ProviderConfig`].

use super::anthropic::AnthropicModel;
use super::config::{EndpointConfig, ProviderConfig, SCRIPTED_MODEL_ENV, is_loopback_url};
use super::mock::MockModel;
use super::openai::OpenAiModel;
use super::provider::{Model, ModelError};
use super::scripted::ScriptedModel;

/// The handle forms [`parse_handle`] accepts, for error messages.
pub const VALID_FORMS: &str = "valid forms: `mock`, `mock/scripted` (the script named by \
MINI_LETTA_SCRIPTED_MODEL when the supervisor starts), \
`openai/<model>` (OpenAI-compatible Chat Completions), `anthropic/<model>`";

/// What a model handle names, by its form alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle<'a> {
    /// `mock`: the deterministic offline model.
    Mock,
    /// `mock/scripted`: the script the supervisor was started with.
    Scripted,
    /// `openai/<model>`.
    OpenAi(&'a str),
    /// `anthropic/<model>`.
    Anthropic(&'a str),
}

/// A model handle of no known form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandleError(String);

/// Parse a model handle (surrounding whitespace ignored) by its form only:
/// nothing is opened and no key or endpoint is needed, so an agent's
/// record can be checked on any machine.
pub fn parse_handle(handle: &str) -> Result<Handle<'_>, HandleError> {
    let handle = handle.trim();
    if handle.chars().any(char::is_control) {
        return Err(HandleError(format!(
            "model {handle:?} contains control characters; {VALID_FORMS}"
        )));
    }
    if handle == "mock" {
        return Ok(Handle::Mock);
    }
    if handle == "mock/scripted" {
        return Ok(Handle::Scripted);
    }
    if handle.starts_with("mock/scripted:") {
        // A path in a model name would let whoever names the model (a child)
        // make the supervisor read and write files of its choosing.
        return Err(HandleError(format!(
            "model {handle:?} names a script path: the scripted model's script is chosen only \
             by the supervisor's start-up configuration ({SCRIPTED_MODEL_ENV}); use \
             \"mock/scripted\"; {VALID_FORMS}"
        )));
    }
    let named = |name: &str| {
        if name.trim().is_empty() {
            Err(HandleError(format!(
                "model {handle:?} names no model; {VALID_FORMS}"
            )))
        } else {
            Ok(())
        }
    };
    if let Some(name) = handle.strip_prefix("openai/") {
        named(name)?;
        return Ok(Handle::OpenAi(name));
    }
    if let Some(name) = handle.strip_prefix("anthropic/") {
        named(name)?;
        return Ok(Handle::Anthropic(name));
    }
    Err(HandleError(format!(
        "unknown model {handle:?}; {VALID_FORMS}"
    )))
}

/// Builds the model a handle names.
pub fn open_model(handle: &str, cfg: &ProviderConfig) -> Result<Box<dyn Model>, ModelError> {
    let handle = handle.trim();
    match parse_handle(handle).map_err(|e| ModelError::fatal(e.to_string()))? {
        Handle::Mock => {
            let window = cfg.context_window_for(handle);
            Ok(Box::new(MockModel::new().with_context_window(window)))
        }
        Handle::Scripted => {
            let Some(path) = &cfg.scripted_script else {
                return Err(ModelError::fatal(format!(
                    "model \"mock/scripted\" needs {SCRIPTED_MODEL_ENV}=<path to JSON script> in \
                     the supervisor's environment when it starts"
                )));
            };
            Ok(Box::new(ScriptedModel::open(path)?))
        }
        Handle::OpenAi(name) => {
            check(handle, &cfg.openai)?;
            Ok(Box::new(OpenAiModel::new(name, &cfg.openai)))
        }
        Handle::Anthropic(name) => {
            check(handle, &cfg.anthropic)?;
            Ok(Box::new(AnthropicModel::new(name, &cfg.anthropic)))
        }
    }
}

/// A real provider needs a key, unless its server runs on this machine
/// (Ollama, llama.cpp).
fn check(handle: &str, ep: &EndpointConfig) -> Result<(), ModelError> {
    if ep.api_key.is_none() && !is_loopback_url(&ep.base_url) {
        return Err(ModelError::fatal(format!(
            "no API key for {handle:?} at {}: set {} (or api_key_env / api_key in config.toml)",
            ep.base_url, ep.api_key_env
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_parsed_by_form() {
        assert_eq!(parse_handle("mock"), Ok(Handle::Mock));
        assert_eq!(parse_handle(" mock/scripted "), Ok(Handle::Scripted));
        assert_eq!(parse_handle("openai/gpt-4o"), Ok(Handle::OpenAi("gpt-4o")));
        assert_eq!(
            parse_handle("anthropic/claude"),
            Ok(Handle::Anthropic("claude"))
        );
        for bad in [
            "",
            "gpt-4o",
            "openai/",
            "anthropic/ ",
            "mock/scripted:/x",
            "openai/a\nb",
        ] {
            let e = match parse_handle(bad) {
                Err(e) => e.to_string(),
                Ok(h) => panic!("{bad:?} parsed as {h:?}"),
            };
            assert!(e.contains("valid forms"), "{e}");
        }
    }
}
