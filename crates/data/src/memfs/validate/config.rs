//! `.memfs.config.json`: strict parsing, defaults and the effective config.
//!
//! The parser collects every problem (spec §1.4 wording) instead of stopping
//! at the first, because the agent should fix them in one pass. JSON objects
//! are read in document order so "unknown field" errors come out in the same
//! order as letta-code's `Object.keys`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};

use super::glob::{Glob, check_pattern};

/// Tracked config path at the repository root.
pub const CONFIG_PATH: &str = ".memfs.config.json";
/// The only accepted `version`.
pub const CONFIG_VERSION: u32 = 1;
/// Default `maxDepth`.
pub const DEFAULT_MAX_DEPTH: u64 = 2;
/// Default `maxFileCharacters`.
pub const DEFAULT_MAX_FILE_CHARACTERS: u64 = 20_000;
/// Default `maxCoreMemoryCharacters`.
pub const DEFAULT_MAX_CORE_MEMORY_CHARACTERS: u64 = 65_536;

/// The default config file: the defaults pretty-printed with a 2-space indent.
pub const DEFAULT_CONFIG_CONTENT: &str = "{\n  \"version\": 1,\n  \"maxDepth\": 2,\n  \"maxFileCharacters\": 20000,\n  \"maxCoreMemoryCharacters\": 65536\n}\n";

/// JavaScript's `Number.MAX_SAFE_INTEGER`; letta-code accepts only safe integers.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// One ordered per-file override; `max_characters: None` means uncapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCharacterLimit {
    pub pattern: String,
    pub max_characters: Option<u64>,
}

/// Opt-in hygiene checks; the validator never rewrites files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Formatting {
    pub line_endings_lf: bool,
    pub final_newline: bool,
    pub trailing_whitespace: bool,
}

/// A parsed config. `None` fields were absent from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintsConfig {
    pub max_depth: Option<u64>,
    pub max_file_characters: Option<u64>,
    pub max_core_memory_characters: Option<u64>,
    pub file_character_limits: Vec<FileCharacterLimit>,
    pub read_only_files: Vec<String>,
    pub formatting: Option<Formatting>,
    /// [B] mini-letta extension: paths the secret scan skips.
    pub secret_scan_allow: Vec<String>,
}

impl ConstraintsConfig {
    /// The canonical defaults (what root-marker repos get without a file).
    pub fn defaults() -> Self {
        ConstraintsConfig {
            max_depth: Some(DEFAULT_MAX_DEPTH),
            max_file_characters: Some(DEFAULT_MAX_FILE_CHARACTERS),
            max_core_memory_characters: Some(DEFAULT_MAX_CORE_MEMORY_CHARACTERS),
            file_character_limits: Vec::new(),
            read_only_files: Vec::new(),
            formatting: None,
            secret_scan_allow: Vec::new(),
        }
    }

    /// Defaults overlaid by the fields the file sets (root-marker layout), so
    /// an older v2 config lacking a field still gets the canonical value.
    pub fn over_defaults(self) -> Self {
        let d = Self::defaults();
        ConstraintsConfig {
            max_depth: self.max_depth.or(d.max_depth),
            max_file_characters: self.max_file_characters.or(d.max_file_characters),
            max_core_memory_characters: self
                .max_core_memory_characters
                .or(d.max_core_memory_characters),
            ..self
        }
    }

    /// The size limit for `path` and where it comes from (`glob '<p>'` or
    /// `maxFileCharacters`); `None` limit = uncapped.
    pub fn limit_for(&self, path: &str) -> (Option<u64>, String) {
        for item in &self.file_character_limits {
            if Glob::new(&item.pattern).is_match(path) {
                return (item.max_characters, format!("glob '{}'", item.pattern));
            }
        }
        (self.max_file_characters, "maxFileCharacters".to_string())
    }
}

/// Parse the config text; on failure returns every error line (already
/// prefixed with `.memfs.config.json`), in letta-code's order.
pub fn parse_config(text: &str) -> Result<ConstraintsConfig, Vec<String>> {
    let p = CONFIG_PATH;
    let value: Json = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(vec![format!("{p}: invalid JSON ({e})")]),
    };
    let Json::Object(fields) = value else {
        return Err(vec![format!("{p}: expected a JSON object")]);
    };
    let mut errors = Vec::new();
    const KEYS: [&str; 8] = [
        "version",
        "maxDepth",
        "maxFileCharacters",
        "maxCoreMemoryCharacters",
        "fileCharacterLimits",
        "readOnlyFiles",
        "formatting",
        "secretScanAllow",
    ];
    for (key, _) in &fields {
        if !KEYS.contains(&key.as_str()) {
            errors.push(format!("{p}: unknown field '{key}'"));
        }
    }
    let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);

    if !matches!(get("version"), Some(Json::Number(n)) if *n == f64::from(CONFIG_VERSION)) {
        errors.push(format!("{p}: version must be {CONFIG_VERSION}"));
    }
    let max_depth = match get("maxDepth") {
        None => None,
        Some(v) => match safe_integer(v).filter(|n| *n >= 0.0) {
            Some(n) => Some(n as u64),
            None => {
                errors.push(format!("{p}: maxDepth must be a non-negative integer"));
                None
            }
        },
    };
    let positive = |key: &str, errors: &mut Vec<String>| match get(key) {
        None => None,
        Some(v) => match safe_integer(v).filter(|n| *n > 0.0) {
            Some(n) => Some(n as u64),
            None => {
                errors.push(format!("{p}: {key} must be a positive integer"));
                None
            }
        },
    };
    let max_file_characters = positive("maxFileCharacters", &mut errors);
    let max_core_memory_characters = positive("maxCoreMemoryCharacters", &mut errors);

    let read_only_files = glob_list(get("readOnlyFiles"), "readOnlyFiles", &mut errors);

    let formatting = get("formatting").and_then(|v| formatting_field(v, &mut errors));
    let file_character_limits = file_character_limits(get("fileCharacterLimits"), &mut errors);

    let secret_scan_allow = glob_list(get("secretScanAllow"), "secretScanAllow", &mut errors);

    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(ConstraintsConfig {
        max_depth,
        max_file_characters,
        max_core_memory_characters,
        file_character_limits,
        read_only_files,
        formatting,
        secret_scan_allow,
    })
}

/// `formatting`: the opt-in hygiene checks (`None` unless an object).
fn formatting_field(value: &Json, errors: &mut Vec<String>) -> Option<Formatting> {
    let p = CONFIG_PATH;
    let Json::Object(items) = value else {
        errors.push(format!("{p}: formatting must be an object"));
        return None;
    };
    let mut f = Formatting::default();
    for (key, value) in items {
        match key.as_str() {
            "lineEndings" => match value {
                Json::String(s) if s == "lf" => f.line_endings_lf = true,
                _ => errors.push(format!("{p}: formatting.lineEndings must be 'lf'")),
            },
            "finalNewline" | "trailingWhitespace" => match value {
                Json::Bool(b) => {
                    if key == "finalNewline" {
                        f.final_newline = *b;
                    } else {
                        f.trailing_whitespace = *b;
                    }
                }
                _ => errors.push(format!("{p}: formatting.{key} must be a boolean")),
            },
            _ => errors.push(format!("{p}: formatting: unknown field '{key}'")),
        }
    }
    Some(f)
}

/// `fileCharacterLimits`: the ordered per-file overrides that parse.
fn file_character_limits(
    value: Option<&Json>,
    errors: &mut Vec<String>,
) -> Vec<FileCharacterLimit> {
    let p = CONFIG_PATH;
    match value {
        None => Vec::new(),
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| file_character_limit(i, item, errors))
            .collect(),
        Some(_) => {
            errors.push(format!("{p}: fileCharacterLimits must be an array"));
            Vec::new()
        }
    }
}

/// `fileCharacterLimits[i]`, when both its fields are valid.
fn file_character_limit(
    i: usize,
    item: &Json,
    errors: &mut Vec<String>,
) -> Option<FileCharacterLimit> {
    let p = CONFIG_PATH;
    let label = format!("{p}: fileCharacterLimits[{i}]");
    let Json::Object(obj) = item else {
        errors.push(format!("{label} must be an object"));
        return None;
    };
    for (key, _) in obj {
        if key != "pattern" && key != "maxCharacters" {
            errors.push(format!("{label}: unknown field '{key}'"));
        }
    }
    let field = |name: &str| obj.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let pattern = match field("pattern") {
        Some(Json::String(s)) => match check_pattern(s) {
            Ok(()) => Some(s.clone()),
            Err(e) => {
                errors.push(format!("{label}: {}", e.message()));
                None
            }
        },
        _ => {
            errors.push(format!(
                "{label}: {}",
                super::glob::PatternError::NotRepoRelative.message()
            ));
            None
        }
    };
    // JavaScript: `maxCharacters !== null` – an absent key is an error.
    let max_characters = match field("maxCharacters") {
        Some(Json::Null) => Some(None),
        Some(v) => safe_integer(v).filter(|n| *n > 0.0).map(|n| Some(n as u64)),
        None => None,
    };
    if max_characters.is_none() {
        errors.push(format!(
            "{label}: maxCharacters must be a positive integer or null"
        ));
    }
    Some(FileCharacterLimit {
        pattern: pattern?,
        max_characters: max_characters?,
    })
}

/// An array of globs (`readOnlyFiles`, `secretScanAllow`).
fn glob_list(value: Option<&Json>, key: &str, errors: &mut Vec<String>) -> Vec<String> {
    let p = CONFIG_PATH;
    let mut out = Vec::new();
    match value {
        None => {}
        Some(Json::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let label = format!("{p}: {key}[{i}]");
                match item {
                    Json::String(s) => match check_pattern(s) {
                        Ok(()) => out.push(s.clone()),
                        Err(e) => errors.push(format!("{label}: {}", e.message())),
                    },
                    _ => errors.push(format!(
                        "{label}: {}",
                        super::glob::PatternError::NotRepoRelative.message()
                    )),
                }
            }
        }
        Some(_) => errors.push(format!("{p}: {key} must be an array")),
    }
    out
}

/// `Number.isSafeInteger`: JSON `1.0` counts as the integer 1, as in JavaScript.
fn safe_integer(value: &Json) -> Option<f64> {
    match value {
        Json::Number(n) if n.is_finite() && n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER => {
            Some(*n)
        }
        _ => None,
    }
}

/// A JSON value that keeps object keys in document order (serde_json's own
/// `Value` sorts them unless a crate-wide feature is enabled). A repeated key
/// keeps its first position and its last value, as `JSON.parse` does.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v as f64))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v as f64))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Number(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut fields: Vec<(String, Json)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            match fields.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => fields.push((key, value)),
            }
        }
        Ok(Json::Object(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_content_parses_to_defaults() {
        let parsed = parse_config(DEFAULT_CONFIG_CONTENT);
        assert_eq!(parsed, Ok(ConstraintsConfig::defaults()));
    }

    #[test]
    fn collects_errors_in_order() {
        let errs = parse_config(r#"{"zeta":1,"alpha":2,"version":2,"maxDepth":-1}"#).err();
        assert_eq!(
            errs,
            Some(vec![
                ".memfs.config.json: unknown field 'zeta'".to_string(),
                ".memfs.config.json: unknown field 'alpha'".to_string(),
                ".memfs.config.json: version must be 1".to_string(),
                ".memfs.config.json: maxDepth must be a non-negative integer".to_string(),
            ])
        );
    }

    #[test]
    fn float_integer_is_safe_integer() {
        let cfg = parse_config(r#"{"version":1.0,"maxFileCharacters":10.0}"#);
        assert_eq!(cfg.map(|c| c.max_file_characters), Ok(Some(10)));
        assert!(parse_config(r#"{"version":1,"maxFileCharacters":1.5}"#).is_err());
    }
}
