//! The context windows of common real models, in one table.
//!
//! Why: without a window nothing compacts until the provider refuses a
//! request, and a user who named `openai/gpt-4o-mini` should not have to
//! look its window up. `config.toml` overrides any entry
//! (`[model.context_windows]`, or `[model] context_window` for all).

/// Model-name prefixes and their windows in tokens, as the providers
/// publish them. A prefix matches a name equal to it or followed by `-`
/// (a dated snapshot such as `gpt-4o-2024-08-06`); the longest wins.
const KNOWN: &[(&str, &str, u64)] = &[
    ("openai", "gpt-5", 400_000),
    ("openai", "gpt-4.1", 1_047_576),
    ("openai", "gpt-4o", 128_000),
    ("openai", "chatgpt-4o", 128_000),
    ("openai", "gpt-4-turbo", 128_000),
    ("openai", "gpt-4", 8_192),
    ("openai", "gpt-3.5-turbo", 16_385),
    ("openai", "o1", 200_000),
    ("openai", "o1-mini", 128_000),
    ("openai", "o3", 200_000),
    ("openai", "o4-mini", 200_000),
    ("anthropic", "claude", 200_000),
];

/// The known window of `handle` (`provider/model`), if the table has it.
pub fn known_window(handle: &str) -> Option<u64> {
    let (provider, name) = handle.trim().split_once('/')?;
    KNOWN
        .iter()
        .filter(|(p, prefix, _)| {
            *p == provider
                && name
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        })
        .max_by_key(|(_, prefix, _)| prefix.len())
        .map(|(_, _, window)| *window)
}

#[cfg(test)]
mod tests {
    use super::known_window;

    #[test]
    fn the_longest_matching_prefix_names_the_window() {
        assert_eq!(known_window("openai/gpt-4o-mini"), Some(128_000));
        assert_eq!(known_window("openai/gpt-4o-2024-08-06"), Some(128_000));
        assert_eq!(known_window("openai/gpt-4-0613"), Some(8_192));
        assert_eq!(known_window("openai/gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(known_window("openai/o1-mini"), Some(128_000));
        assert_eq!(known_window("anthropic/claude-sonnet-4-5"), Some(200_000));
    }

    #[test]
    fn unknown_names_and_near_misses_have_none() {
        // `gpt-4` must not claim `gpt-4.5-preview`, nor a local model.
        assert_eq!(known_window("openai/gpt-4.5-preview"), None);
        assert_eq!(known_window("openai/llama3"), None);
        assert_eq!(known_window("anthropic/gpt-4o"), None);
        assert_eq!(known_window("mock"), None);
        assert_eq!(known_window("gpt-4o"), None);
    }
}
