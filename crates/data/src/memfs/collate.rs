//! Label and path ordering identical to JavaScript's `a.localeCompare(b)`.
//!
//! letta-code sorts with `localeCompare` and no arguments, i.e. the default
//! `Intl.Collator` (CLDR root order, tertiary strength, punctuation not ignored,
//! no numeric collation). ICU4X's collator for locale `en` with default options
//! reproduces it (`human.md < MEMORY.md < persona.md`, `x1 < x10 < x9`,
//! `a-b.md < a.md < a/b.md < ab.md`). Ties (strings the collator calls equal,
//! e.g. differing only in ignorable characters) keep their incoming order, as
//! JavaScript's stable `Array.prototype.sort` does.

use std::cmp::Ordering;
use std::sync::OnceLock;

use icu_collator::options::CollatorOptions;
use icu_collator::{Collator, CollatorBorrowed};
use icu_locale_core::locale;

fn collator() -> &'static CollatorBorrowed<'static> {
    static COLLATOR: OnceLock<CollatorBorrowed<'static>> = OnceLock::new();
    COLLATOR.get_or_init(|| {
        // The compiled-in data always has `en`; failure here would be a build
        // defect, so fall back to the root collation rather than panic.
        Collator::try_new(locale!("en").into(), CollatorOptions::default())
            .or_else(|_| Collator::try_new(Default::default(), CollatorOptions::default()))
            .unwrap_or_else(|e| panic!("ICU collation data missing from the build: {e}"))
    })
}

/// `a.localeCompare(b)` with the default collator.
pub fn locale_compare(a: &str, b: &str) -> Ordering {
    match ascii_compare(a, b) {
        Some(o) => o,
        None => collator().compare(a, b),
    }
}

/// CLDR root primary order of printable ASCII, as bun's `localeCompare`
/// reports it (spec compiler.md §8.1); a letter's two cases share a primary.
const PRIMARY_ORDER: &[u8] =
    b" _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ";

/// Primary weight of each printable ASCII byte (0 for others).
const PRIMARY: [u8; 128] = {
    let mut table = [0u8; 128];
    let mut i = 0;
    let mut weight = 0u8;
    while i < PRIMARY_ORDER.len() {
        let c = PRIMARY_ORDER[i];
        // An uppercase letter follows its lowercase one with the same weight.
        if !(c.is_ascii_uppercase() && i > 0 && PRIMARY_ORDER[i - 1] == c.to_ascii_lowercase()) {
            weight += 1;
        }
        table[c as usize] = weight;
        i += 1;
    }
    table
};

/// The same order as the collator for two strings of printable ASCII
/// (a fast path: labels and paths are nearly always ASCII), else `None`.
/// Primary weights decide first (a shorter prefix first); then case,
/// position by position, lowercase before uppercase (tertiary strength).
fn ascii_compare(a: &str, b: &str) -> Option<Ordering> {
    let printable = |s: &str| s.bytes().all(|c| (0x20..0x7f).contains(&c));
    if !printable(a) || !printable(b) {
        return None;
    }
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let primary = a
        .iter()
        .map(|c| PRIMARY[*c as usize])
        .cmp(b.iter().map(|c| PRIMARY[*c as usize]));
    if primary != Ordering::Equal {
        return Some(primary);
    }
    Some(
        a.iter()
            .map(u8::is_ascii_uppercase)
            .cmp(b.iter().map(u8::is_ascii_uppercase)),
    )
}

/// Stable sort by a string key with [`locale_compare`].
pub(crate) fn sort_by_locale<T>(items: &mut [T], key: impl Fn(&T) -> &str) {
    items.sort_by(|a, b| locale_compare(key(a), key(b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<&str>) -> Vec<&str> {
        sort_by_locale(&mut v, |s| s);
        v
    }

    #[test]
    fn matches_js_locale_compare_examples() {
        assert_eq!(
            sorted(vec!["persona.md", "MEMORY.md", "human.md"]),
            ["human.md", "MEMORY.md", "persona.md"]
        );
        assert_eq!(sorted(vec!["x9", "x10", "x1"]), ["x1", "x10", "x9"]);
        assert_eq!(
            sorted(vec!["ab.md", "a/b.md", "a.md", "a-b.md"]),
            ["a-b.md", "a.md", "a/b.md", "ab.md"]
        );
        assert_eq!(sorted(vec!["Banana", "apple"]), ["apple", "Banana"]);
        assert_eq!(sorted(vec!["AB", "Ab", "aB"]), ["aB", "Ab", "AB"]);
        assert_eq!(
            sorted(vec!["ab", "a0", "a/b", "a.b", "a-b", "a_b", "a b", "a"]),
            ["a", "a b", "a_b", "a-b", "a.b", "a/b", "a0", "ab"]
        );
    }

    #[test]
    fn ascii_fast_path_agrees_with_the_collator() {
        // Every pair of single characters and a sample of longer strings.
        let chars: Vec<String> = (0x20u8..0x7f).map(|c| (c as char).to_string()).collect();
        for a in &chars {
            for b in &chars {
                assert_eq!(
                    ascii_compare(a, b),
                    Some(collator().compare(a, b)),
                    "{a:?} vs {b:?}"
                );
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        // Small alphabets so that prefixes, case and punctuation ties occur.
        let alphabet = b"aAbB-_./ 019zZ~$";
        for _ in 0..20_000 {
            let mut make = || -> String {
                let len = (next() % 7) as usize;
                (0..len)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize] as char)
                    .collect()
            };
            let (a, b) = (make(), make());
            assert_eq!(
                ascii_compare(&a, &b),
                Some(collator().compare(&a, &b)),
                "{a:?} vs {b:?}"
            );
        }
        for _ in 0..20_000 {
            let mut make = || -> String {
                let len = (next() % 9) as usize;
                (0..len)
                    .map(|_| (0x20 + (next() % 95) as u8) as char)
                    .collect()
            };
            let (a, b) = (make(), make());
            assert_eq!(
                ascii_compare(&a, &b),
                Some(collator().compare(&a, &b)),
                "{a:?} vs {b:?}"
            );
        }
        assert_eq!(ascii_compare("é", "e"), None);
        assert_eq!(ascii_compare("a\tb", "ab"), None);
    }

    #[test]
    fn ignorable_ties_keep_incoming_order() {
        // U+200B is ignorable: both strings collate equal, order is preserved.
        assert_eq!(locale_compare("a\u{200B}b", "ab"), Ordering::Equal);
        assert_eq!(sorted(vec!["a\u{200B}b", "ab"]), ["a\u{200B}b", "ab"]);
        assert_eq!(sorted(vec!["ab", "a\u{200B}b"]), ["ab", "a\u{200B}b"]);
    }
}
