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
    collator().compare(a, b)
}

/// Stable sort by a string key with [`locale_compare`].
pub fn sort_by_locale<T>(items: &mut [T], key: impl Fn(&T) -> &str) {
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
    fn ignorable_ties_keep_incoming_order() {
        // U+200B is ignorable: both strings collate equal, order is preserved.
        assert_eq!(locale_compare("a\u{200B}b", "ab"), Ordering::Equal);
        assert_eq!(sorted(vec!["a\u{200B}b", "ab"]), ["a\u{200B}b", "ab"]);
        assert_eq!(sorted(vec!["ab", "a\u{200B}b"]), ["ab", "a\u{200B}b"]);
    }
}
