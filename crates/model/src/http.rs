//! The blocking HTTP side shared by the real providers: one `ureq` agent per
//! model, a streamed POST whose body is read incrementally, and the mapping
//! of failures onto [`ModelError`] so that the agent loop can tell what to
//! retry (429/5xx/transport), what to compact (context overflow) and what to
//! report (everything else). A provider module supplies only its
//! [`WireFormat`]; [`HttpModel`] does the rest. The trait is blocking; the
//! supervisor calls it from `spawn_blocking`, so a sync client is the simple,
//! honest choice. (Transient failures are retried by the agent loop, which
//! tells the user of each retry: see `agent::runtime`.)

use std::io::Read;
use std::marker::PhantomData;
use std::time::Duration;

use serde_json::Value;

use super::answer::{Assembler, read_answer};
use super::config::{EndpointConfig, is_loopback_url};
use super::provider::{Model, ModelError, ModelEvent};
use crate::protocol::messages::{ModelRequest, ModelResponse};

/// What a provider's module supplies: its wire format. Everything between
/// (the agent, the POST, timeouts, the mapping of failures) is shared.
pub trait WireFormat: 'static {
    /// Its provider and where its requests go.
    const WIRE: Wire;
    /// The headers a request carries besides content type and accept: the
    /// key (when there is one) and any version the API wants.
    fn headers(api_key: Option<&str>) -> Vec<(&'static str, String)>;
    /// The JSON body of a streamed request.
    fn request_body(model: &str, request: &ModelRequest) -> Value;
    /// A reader of one streamed answer from `model`.
    fn answer(model: &str) -> impl Assembler;
}

/// A wire format's provider and path.
#[derive(Debug, Clone, Copy)]
pub struct Wire {
    /// The `[providers.*]` table, and the handle's prefix (`openai`).
    provider: &'static str,
    /// The variable that sets its base URL when the file does not.
    base_url_env: &'static str,
    /// Where requests go, below the base URL (`/chat/completions`).
    path: &'static str,
}

impl Wire {
    pub const fn new(
        provider: &'static str,
        base_url_env: &'static str,
        path: &'static str,
    ) -> Self {
        Self {
            provider,
            base_url_env,
            path,
        }
    }
}

/// A model behind an HTTP provider speaking `W`.
pub struct HttpModel<W> {
    model: String,
    base_url: String,
    api_key: Option<String>,
    agent: ureq::Agent,
    site: Site,
    wire: PhantomData<fn() -> W>,
}

impl<W: WireFormat> HttpModel<W> {
    /// `model` is the provider's own name (`gpt-4o-mini`, `claude-sonnet-4-5`).
    pub fn new(model: &str, endpoint: &EndpointConfig) -> Self {
        let site = Site {
            wire: W::WIRE,
            timeout: Duration::from_secs(endpoint.timeout_secs),
        };
        Self {
            model: model.to_string(),
            base_url: endpoint.base_url.trim_end_matches('/').to_string(),
            api_key: endpoint.api_key.clone(),
            agent: agent_for(&endpoint.base_url, &site),
            site,
            wire: PhantomData,
        }
    }
}

impl<W: WireFormat> Model for HttpModel<W> {
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError> {
        let body = W::request_body(&self.model, request);
        let headers = W::headers(self.api_key.as_deref());
        let url = format!("{}{}", self.base_url, W::WIRE.path);
        let reader = post_json_stream(&self.agent, &url, &headers, &body, &self.site)?;
        read_answer(W::answer(&self.model), reader, on_event)
    }
}

impl<W: WireFormat> std::fmt::Debug for HttpModel<W> {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModel")
            .field("provider", &W::WIRE.provider)
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("has_key", &self.api_key.is_some())
            .finish()
    }
}

/// A provider's requests: which `[providers.*]` table configures them (named
/// in errors, so the fix is findable) and how long one may take
/// (`timeout_secs`).
#[derive(Debug, Clone)]
struct Site {
    wire: Wire,
    timeout: Duration,
}

impl Site {
    fn base_url_hint(&self) -> String {
        format!(
            "is the server running? If it listens elsewhere, set base_url in [providers.{}] of \
config.toml (or ${})",
            self.wire.provider, self.wire.base_url_env
        )
    }
}

/// How much of an error body is read.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// Markers of "the request does not fit the window" (letta-code's list in
/// `context-window-overflow.ts`, lower-cased).
const OVERFLOW_MARKERS: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "too many tokens",
    "context window",
    "exceeds the context",
    "input is too long",
];

/// Whether an error message says the prompt did not fit.
pub(crate) fn is_context_overflow(message: &str) -> bool {
    let m = message.to_lowercase();
    OVERFLOW_MARKERS.iter().any(|k| m.contains(k))
}

/// A `ureq` agent that hands back error statuses as responses, with the
/// provider timeout. Loopback servers are reached directly, never through a
/// proxy from the environment.
fn agent_for(base_url: &str, site: &Site) -> ureq::Agent {
    let mut b = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(site.timeout));
    if is_loopback_url(base_url) {
        b = b.proxy(None);
    }
    ureq::Agent::new_with_config(b.build())
}

/// POSTs `body` as JSON and returns a reader of the (streamed) response
/// body, or the error the status and body describe.
fn post_json_stream(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&'static str, String)],
    body: &Value,
    site: &Site,
) -> Result<impl Read + use<>, ModelError> {
    let payload = serde_json::to_vec(body)
        .map_err(|e| ModelError::fatal(format!("cannot encode the request: {e}")))?;
    let mut req = agent
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req
        .send(&payload[..])
        .map_err(|e| transport_error(e, url, site))?;
    let status = resp.status().as_u16();
    if (200..300).contains(&status) {
        let kind = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        // A 200 that is no event stream (a login page, a proxy's error
        // page, a server that ignored `stream`) is no answer, and asking
        // again gets the same page: say what came, never retry.
        if !kind.is_empty() && !kind.starts_with("text/event-stream") {
            let text = bounded_text(resp.into_body());
            return Err(ModelError::Fatal {
                status: Some(status),
                message: not_a_stream(url, &kind, &text),
            });
        }
        return Ok(Stalled {
            inner: resp.into_body().into_reader(),
            site: site.clone(),
        });
    }
    let retry_after_ms = retry_after_ms(resp.headers());
    let text = bounded_text(resp.into_body());
    Err(status_error(status, &text, retry_after_ms))
}

/// A body that is no answer (an error, a page), read up to
/// [`ERROR_BODY_LIMIT`] as text, for the message that quotes it.
fn bounded_text(mut body: ureq::Body) -> String {
    body.with_config()
        .limit(ERROR_BODY_LIMIT)
        .lossy_utf8(true)
        .read_to_string()
        .unwrap_or_default()
}

/// A successful status whose body is not an event stream: what it was.
fn not_a_stream(url: &str, kind: &str, body: &str) -> String {
    let kind = kind.split(';').next().unwrap_or(kind).trim();
    let lower = body.to_ascii_lowercase();
    // An HTML page says what it is in its title.
    let title = lower.find("<title").and_then(|start| {
        let open = start + lower[start..].find('>')? + 1;
        let close = open + lower[open..].find("</title")?;
        body.get(open..close)
            .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
    });
    let shown = match title {
        Some(t) if !t.is_empty() => format!("a page titled {t:?}"),
        _ => {
            let first: String = body.trim().chars().take(200).collect();
            format!("{:?}", first.lines().next().unwrap_or(""))
        }
    };
    format!(
        "{url} answered 200 with {kind}, not an event stream: {shown}. Is base_url the API's \
         address (for OpenAI-compatible servers it usually ends in /v1)?"
    )
}

/// The streamed body, whose time-out says which setting bounds it: a
/// stream that stalls runs into `timeout_secs`, which ureq reports only
/// as "timeout".
struct Stalled<R> {
    inner: R,
    site: Site,
}

impl<R: Read> Read for Stalled<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let timed_out = e.kind() == std::io::ErrorKind::TimedOut
                || e.to_string().to_ascii_lowercase().contains("timeout");
            if !timed_out {
                return e;
            }
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the answer stalled: the request reached its limit of {} s (timeout_secs \
                     in [providers.{}] of config.toml) before the stream ended",
                    self.site.timeout.as_secs(),
                    self.site.wire.provider
                ),
            )
        })
    }
}

/// Maps a non-2xx status and its body.
pub(crate) fn status_error(status: u16, body: &str, retry_after_ms: Option<u64>) -> ModelError {
    let message = error_message(body);
    if is_context_overflow(&message) || is_context_overflow(body) {
        return ModelError::ContextOverflow { message };
    }
    if status == 429 || status == 408 || status >= 500 {
        return ModelError::Transient {
            status: Some(status),
            message,
            retry_after_ms,
            hint: None,
        };
    }
    ModelError::Fatal {
        status: Some(status),
        message,
    }
}

/// The server's own words: `error.message` of an OpenAI or Anthropic error
/// body, else the body itself (shortened).
pub(crate) fn error_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        let err = v.get("error").unwrap_or(&v);
        if let Some(m) = err.get("message").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = err.as_str() {
            return m.to_string();
        }
    }
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return "empty error body".to_string();
    }
    trimmed.chars().take(2000).collect()
}

/// Maps a failure to reach the server at `url`: what happened, to which
/// URL, and (in the hint) the setting that fixes it. All are worth a retry.
fn transport_error(e: ureq::Error, url: &str, site: &Site) -> ModelError {
    use std::io::ErrorKind;
    use ureq::Error as E;
    let transient = |message: String, hint: Option<String>| ModelError::Transient {
        status: None,
        message,
        retry_after_ms: None,
        hint,
    };
    let timed_out = || {
        let secs = site.timeout.as_secs();
        transient(
            format!("no answer from {url} within {secs} s: the request timed out"),
            Some(format!(
                "the server took the connection but did not answer; if it is only slow, raise \
timeout_secs in [providers.{}] of config.toml",
                site.wire.provider
            )),
        )
    };
    match e {
        E::Timeout(_) => timed_out(),
        E::Io(io) if io.kind() == ErrorKind::TimedOut => timed_out(),
        E::Io(io) if io.kind() == ErrorKind::ConnectionRefused => transient(
            format!("connection refused by {url}: nothing listens there"),
            Some(site.base_url_hint()),
        ),
        E::ConnectionFailed => transient(
            format!("cannot connect to {url}"),
            Some(site.base_url_hint()),
        ),
        E::HostNotFound => transient(
            format!("the host of {url} was not found"),
            Some(site.base_url_hint()),
        ),
        e @ (E::Io(_) | E::Protocol(_)) => transient(format!("{url}: {e}"), None),
        other => ModelError::fatal(format!("HTTP request to {url} failed: {other}")),
    }
}

/// An error the server reported inside the stream (`err`, its error
/// object): a prompt that did not fit is an overflow whatever its kind;
/// otherwise `retry` (the wire format's verdict on the kind) decides, and
/// `kind`, when given, is named before the message.
pub(crate) fn reported_error(err: &Value, kind: Option<&str>, retry: bool) -> ModelError {
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| err.to_string());
    if is_context_overflow(&message) {
        return ModelError::ContextOverflow { message };
    }
    let message = match kind {
        Some(kind) => format!("{kind}: {message}"),
        None => message,
    };
    if !retry {
        return ModelError::Fatal {
            status: None,
            message,
        };
    }
    ModelError::Transient {
        status: None,
        message,
        retry_after_ms: None,
        hint: None,
    }
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds.
fn retry_after_ms(headers: &ureq::http::HeaderMap) -> Option<u64> {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(ms.max(0.0) as u64);
    }
    get("retry-after")
        .and_then(|v| v.parse::<f64>().ok())
        .map(|s| (s.max(0.0) * 1000.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::super::openai::OpenAiModel;
    use super::*;

    /// A model's debug form names its provider and endpoint, never its key.
    #[test]
    fn debug_output_holds_no_key() {
        let endpoint = EndpointConfig {
            base_url: "http://127.0.0.1:9/v1/".into(),
            api_key: Some("sk-never-shown-1234".into()),
            api_key_env: "OPENAI_API_KEY".into(),
            timeout_secs: 5,
        };
        let shown = format!("{:?}", OpenAiModel::new("gpt-x", &endpoint));
        assert!(!shown.contains("sk-never-shown"), "{shown}");
        for part in [
            "openai",
            "gpt-x",
            "http://127.0.0.1:9/v1\"",
            "has_key: true",
        ] {
            assert!(shown.contains(part), "{part} not in {shown}");
        }
    }
}
