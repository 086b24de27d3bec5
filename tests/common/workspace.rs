//! The workspace's sources as the shape tests read them (`layout.rs`,
//! `typed_replies.rs`): its members' source folders, their `.rs` files,
//! and which items are test-only.

use std::path::{Path, PathBuf};

/// The source folders of the workspace's members, from the manifest at
/// `root` (the root package's is `src`).
pub fn member_sources(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m.as_str().unwrap() {
            "." => "src".to_string(),
            m => format!("{m}/src"),
        })
        .collect()
}

/// Every `.rs` file under `dir`, sorted (none when it does not exist).
pub fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether `attrs` make an item test-only (`#[cfg(test)]`, `#[cfg(all(test,
/// …))]`).
pub fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let cfg = a
            .meta
            .require_list()
            .map(|l| l.tokens.to_string().replace(' ', ""))
            .unwrap_or_default();
        cfg == "test" || cfg.starts_with("all(test,") || cfg.contains(",test)")
    })
}
