//! The house's shape, held by a test: which parts may not know which.
//! (A rule broken here is a design regression, not a style nit.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut out);
    assert!(!out.is_empty(), "no sources under {dir}");
    out
}

/// Lines of the sources under `dir` that use a path starting with one of
/// `forbidden` (as `use` or inline, followed by `::`, `;` or `}`).
fn offending(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in sources(dir) {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for f in forbidden {
                for (i, _) in code.match_indices(f) {
                    let next = code[i + f.len()..].chars().next();
                    if matches!(next, Some(':' | ';' | '}' | ',' | ' ') | None) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn the_agent_child_speaks_only_the_protocol() {
    let bad = offending("src/agent", &["crate::supervisor", "crate::model"]);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn confinement_knows_no_agent_logic() {
    let bad = offending(
        "src/sandbox",
        &["crate::agent", "crate::supervisor", "crate::verify"],
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_supervisor_has_no_catch_all_server_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/supervisor");
    for (path, text) in sources("src/supervisor") {
        let lines = text.lines().count();
        assert!(
            !path.ends_with("server.rs") || lines < 300,
            "{} has {lines} lines",
            path.display()
        );
    }
    for part in ["listener.rs", "dispatch.rs", "launch.rs"] {
        assert!(dir.join(part).is_file(), "{part} missing");
    }
}

/// The protocol document lists exactly the methods the code decodes, in
/// the code's order.
#[test]
fn the_protocol_document_lists_every_method() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocol.md"))
            .unwrap();
    let start = doc
        .find("`protocol::METHODS`, in order:")
        .expect("the method list");
    let list = &doc[start..];
    let list = &list[..list.find(".\n").expect("the list's end")];
    let listed: Vec<&str> = list.split('`').skip(3).step_by(2).collect();
    assert_eq!(listed, mini_letta::protocol::METHODS);
}
