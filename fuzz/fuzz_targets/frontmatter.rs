//! Frontmatter parsing never panics, and the body it returns (trimmed, as
//! letta-code's compiler trims it) is part of the normalised text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mini_letta::memfs::frontmatter::{normalize, parse_frontmatter};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = parse_frontmatter(&text);
    let normalized = normalize(&text);
    assert!(normalized.contains(parsed.body.as_str()));
    let _ = parsed.description();
});
