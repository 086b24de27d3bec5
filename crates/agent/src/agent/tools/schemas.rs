//! How much of the tool definitions a request carries: the rule that makes
//! the tools' cost scale with the context window (issue 31 §1, book lab 4).
//!
//! Every request carries the tools' JSON schemas, and in a small window
//! they are most of the floor a conversation can never compact away: at
//! 900 tokens the six full definitions (about 580 tokens) plus the system
//! prompt were over the 720-token threshold before any message. So, by the
//! window `W` the turn accounts with:
//!
//! | window | schemas | tools offered |
//! |---|---|---|
//! | unknown, or `W ≥ 8192` ([`COMPACT_BELOW`]) | full | all |
//! | `2048 ≤ W < 8192` | compact | all |
//! | `W < 2048` ([`MINIMAL_BELOW`]) | compact | [`MINIMAL_TOOLS`] only |
//!
//! *Compact* keeps each description's first sentence and drops what the
//! properties say about themselves (`description`, `minimum`, `maximum`,
//! `default`, `examples`); names, types, enums and `required` stay, so a
//! call valid under the full schema is valid under the compact one.
//! *Minimal* offers only `memory` and `recall_search`: their results are a
//! line or a few, while `Bash` and `Read` return up to 30,000 characters
//! (several times a window this small), and `Write`/`Edit` carry whole file
//! texts in their arguments. A call to a tool the request did not offer is
//! answered with an error naming this rule (`super::not_offered`).
//!
//! `mini-letta context` shows which schemas and tools a request carries,
//! and what each tool costs.

use serde::Serialize;
use serde_json::Value;

use crate::protocol::messages::ToolSpec;

/// Below this window the schemas are compact.
pub const COMPACT_BELOW: u64 = 8_192;
/// Below this window only [`MINIMAL_TOOLS`] are offered.
pub const MINIMAL_BELOW: u64 = 2_048;
/// The tools a window below [`MINIMAL_BELOW`] can use.
pub const MINIMAL_TOOLS: &[&str] = &["memory", "recall_search"];

/// What the property schemas lose in compact form.
const PROPERTY_NOTES: &[&str] = &["description", "minimum", "maximum", "default", "examples"];

/// How much of the definitions a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schemas {
    Full,
    Compact,
    Minimal,
}

impl Schemas {
    /// The rule (see the module doc).
    pub fn for_window(window: Option<u64>) -> Self {
        match window {
            Some(w) if w < MINIMAL_BELOW => Schemas::Minimal,
            Some(w) if w < COMPACT_BELOW => Schemas::Compact,
            _ => Schemas::Full,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Schemas::Full => "full",
            Schemas::Compact => "compact",
            Schemas::Minimal => "minimal",
        }
    }

    /// Whether a main-agent request carries tool `name`. (A sub-agent's
    /// tools are chosen for its task: they are shaped, never dropped.)
    pub fn offers(self, name: &str) -> bool {
        self != Schemas::Minimal || MINIMAL_TOOLS.contains(&name)
    }

    /// `spec` as this form carries it.
    pub fn shape(self, spec: ToolSpec) -> ToolSpec {
        if self == Schemas::Full {
            return spec;
        }
        let mut parameters = spec.parameters;
        strip_property_notes(&mut parameters);
        ToolSpec {
            description: first_sentence(&spec.description).to_string(),
            name: spec.name,
            parameters,
        }
    }
}

/// The description up to its first full stop followed by a space (or the
/// end).
fn first_sentence(s: &str) -> &str {
    let s = s.trim();
    match s.find(". ").or_else(|| s.find(".\n")) {
        Some(i) => &s[..=i],
        None => s,
    }
}

/// Remove [`PROPERTY_NOTES`] from every property schema, at any depth.
fn strip_property_notes(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(props) = obj.get_mut("properties").and_then(Value::as_object_mut) {
        for prop in props.values_mut() {
            if let Some(p) = prop.as_object_mut() {
                for key in PROPERTY_NOTES {
                    p.remove(*key);
                }
            }
            strip_property_notes(prop);
        }
    }
    if let Some(items) = obj.get_mut("items") {
        if let Some(p) = items.as_object_mut() {
            for key in PROPERTY_NOTES {
                p.remove(*key);
            }
        }
        strip_property_notes(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rule_by_window() {
        assert_eq!(Schemas::for_window(None), Schemas::Full);
        assert_eq!(Schemas::for_window(Some(128_000)), Schemas::Full);
        assert_eq!(Schemas::for_window(Some(8_192)), Schemas::Full);
        assert_eq!(Schemas::for_window(Some(8_191)), Schemas::Compact);
        assert_eq!(Schemas::for_window(Some(2_048)), Schemas::Compact);
        assert_eq!(Schemas::for_window(Some(2_047)), Schemas::Minimal);
        assert_eq!(Schemas::for_window(Some(900)), Schemas::Minimal);
        assert!(Schemas::Minimal.offers("memory") && !Schemas::Minimal.offers("Bash"));
        assert!(Schemas::Compact.offers("Bash"));
    }

    #[test]
    fn compact_keeps_names_types_enums_and_required() {
        let spec = ToolSpec {
            name: "t".into(),
            description: "Do a thing (carefully). Then more words. And more.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["a", "b"], "description": "which"},
                    "n": {"type": "integer", "minimum": 1, "description": "how many"},
                    "list": {"type": "array", "items": {"type": "object", "description": "x",
                        "properties": {"k": {"type": "string", "description": "deep"}}}}
                },
                "required": ["command"]
            }),
        };
        let full = Schemas::Full.shape(spec.clone());
        assert_eq!(full, spec);
        let c = Schemas::Compact.shape(spec);
        assert_eq!(c.description, "Do a thing (carefully).");
        assert_eq!(
            c.parameters,
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["a", "b"]},
                    "n": {"type": "integer"},
                    "list": {"type": "array", "items": {"type": "object",
                        "properties": {"k": {"type": "string"}}}}
                },
                "required": ["command"]
            })
        );
        assert_eq!(first_sentence("No stop at all"), "No stop at all");
        assert_eq!(first_sentence("Ends here."), "Ends here.");
    }
}
