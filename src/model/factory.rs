//! Model handles → models. The handle names the provider so that one agent
//! record (`"model": "openai/gpt-4o-mini"`) is enough to reach it; the
//! endpoint and key come from the supervisor's [`ProviderConfig`].

use super::anthropic::AnthropicModel;
use super::config::{EndpointConfig, ProviderConfig, SCRIPTED_MODEL_ENV, is_loopback_url};
use super::mock::MockModel;
use super::openai::OpenAiModel;
use super::scripted::ScriptedModel;
use super::{Model, ModelError};

const VALID_FORMS: &str = "valid forms: `mock`, `mock/scripted` (the script named by \
MINI_LETTA_SCRIPTED_MODEL when the supervisor starts), \
`openai/<model>` (OpenAI-compatible Chat Completions), `anthropic/<model>`";

/// Builds the model a handle names.
pub fn open_model(handle: &str, cfg: &ProviderConfig) -> Result<Box<dyn Model>, ModelError> {
    let handle = handle.trim();
    if handle == "mock" {
        let window = cfg.context_window_for(handle);
        return Ok(Box::new(MockModel::new().with_context_window(window)));
    }
    if handle == "mock/scripted" {
        let Some(path) = &cfg.scripted_script else {
            return Err(ModelError::fatal(format!(
                "model \"mock/scripted\" needs {SCRIPTED_MODEL_ENV}=<path to JSON script> in the \
                 supervisor's environment when it starts"
            )));
        };
        return Ok(Box::new(ScriptedModel::open(path)?));
    }
    if handle.starts_with("mock/scripted:") {
        // A path in a model name would let whoever names the model (a child)
        // make the supervisor read and write files of its choosing.
        return Err(ModelError::fatal(format!(
            "model {handle:?} names a script path: the scripted model's script is chosen only \
             by the supervisor's start-up configuration ({SCRIPTED_MODEL_ENV}); use \
             \"mock/scripted\"; {VALID_FORMS}"
        )));
    }
    if let Some(name) = handle.strip_prefix("openai/") {
        check(handle, name, &cfg.openai)?;
        return Ok(Box::new(OpenAiModel::new(name, &cfg.openai)));
    }
    if let Some(name) = handle.strip_prefix("anthropic/") {
        check(handle, name, &cfg.anthropic)?;
        return Ok(Box::new(AnthropicModel::new(name, &cfg.anthropic)));
    }
    Err(ModelError::fatal(format!(
        "unknown model {handle:?}; {VALID_FORMS}"
    )))
}

/// A real provider needs a model name and a key, unless its server runs on
/// this machine (Ollama, llama.cpp).
fn check(handle: &str, name: &str, ep: &EndpointConfig) -> Result<(), ModelError> {
    if name.trim().is_empty() {
        return Err(ModelError::fatal(format!(
            "model {handle:?} names no model; {VALID_FORMS}"
        )));
    }
    if ep.api_key.is_none() && !is_loopback_url(&ep.base_url) {
        return Err(ModelError::fatal(format!(
            "no API key for {handle:?} at {}: set {} (or api_key_env / api_key in config.toml)",
            ep.base_url, ep.api_key_env
        )));
    }
    Ok(())
}
