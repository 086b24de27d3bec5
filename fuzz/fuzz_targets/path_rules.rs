//! No path the memory path rules accept leaves the memory root.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use mini_letta::memfs::pathrules::check_relative;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(ok) = check_relative(&text) {
        assert_eq!(ok, text);
        assert!(
            Path::new(&ok)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        );
    }
});
