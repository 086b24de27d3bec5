//! Property tests for the memory path rules: no accepted path escapes the
//! memory root (lexically: every component a plain name), and every path
//! made of plain segments is accepted unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Component, Path};

use mini_letta::memfs::pathrules::check_relative;
use proptest::prelude::*;

/// Strings biased towards what breaks path handling.
fn hostile_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("\\".to_string()),
        Just("\0".to_string()),
        Just("~".to_string()),
        Just("a".to_string()),
        Just("MEMORY.md".to_string()),
        Just("日本".to_string()),
        Just(" ".to_string()),
        "[a-z.]{1,3}".prop_map(|s| s),
        any::<char>().prop_map(|c| c.to_string()),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

fn plain_segment() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_\\-][A-Za-z0-9_.\\- 日本]{0,12}"
        .prop_filter("not a dot segment", |s| s != "." && s != "..")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_accepted_path_escapes_the_root(p in hostile_path()) {
        if let Ok(ok) = check_relative(&p) {
            prop_assert_eq!(&ok, &p);
            prop_assert!(!ok.contains('\0') && !ok.contains('\\'));
            prop_assert!(mini_letta::names::first_unsafe(&ok).is_none(), "{:?}", ok);
            for c in Path::new(&ok).components() {
                prop_assert!(
                    matches!(c, Component::Normal(_)),
                    "{:?} has component {:?}", ok, c
                );
            }
            let root = Path::new("/memory-root");
            prop_assert!(root.join(&ok).starts_with(root));
            prop_assert_eq!(Path::new(&ok).components().count(), ok.split('/').count());
        }
    }

    #[test]
    fn plain_segments_are_accepted(segs in prop::collection::vec(plain_segment(), 1..6)) {
        let p = segs.join("/");
        prop_assert_eq!(check_relative(&p), Ok(p.clone()));
    }
}
