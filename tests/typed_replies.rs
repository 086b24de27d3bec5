//! Replies are typed (`protocol::replies`), and this test keeps them so:
//! the supervisor builds no reply from `json!` (nor any `Outcome::Result`
//! by hand: `Outcome::reply` takes a reply type), and no program reads a
//! reply as untyped JSON (`call_json`, `wait_response_*`) outside the
//! protocol module — but where it prints one whole as evidence or for a
//! diagnostic tool, each named below with its reason. Test code is free to
//! look at the wire as it is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

#[path = "common/workspace.rs"]
mod workspace;
use workspace::{member_sources, rs_files, test_only};

/// Files that may read a reply as it came, and why.
const RAW_READERS: &[(&str, &str)] = &[
    (
        "crates/agent/src/agent/channel.rs",
        "`mini-letta-agent channel call` prints any method's reply whole",
    ),
    (
        "crates/sandbox/src/probes/channel.rs",
        "an attack's evidence quotes whatever the supervisor answered",
    ),
];

/// The untyped readers of a reply.
const UNTYPED: &[&str] = &[
    "call_json",
    "wait_response_with",
    "wait_response_keeping_exits",
];

fn attrs_of(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// What one file's non-test code does with replies.
#[derive(Default)]
struct Found {
    /// `json!` invocations (line numbers).
    json_macros: Vec<usize>,
    /// `Outcome::Result` named.
    raw_outcomes: Vec<usize>,
    /// Untyped reply reads: the method and the line.
    untyped: Vec<(String, usize)>,
    /// Files declared test-only from here (`#[cfg(test)] mod x;`).
    test_files: Vec<PathBuf>,
}

struct Visitor<'a> {
    found: &'a mut Found,
    /// Where the file's child modules live, and where `#[path]` is
    /// relative to.
    children_dir: PathBuf,
    file_dir: PathBuf,
}

impl<'ast> Visit<'ast> for Visitor<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if test_only(attrs_of(item)) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                let named = m.attrs.iter().find_map(|a| match &a.meta {
                    syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                        syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(s),
                            ..
                        }) => Some(self.file_dir.join(s.value())),
                        _ => None,
                    },
                    _ => None,
                });
                let name = m.ident.to_string();
                self.found.test_files.extend(match named {
                    Some(p) => vec![p],
                    None => vec![
                        self.children_dir.join(format!("{name}.rs")),
                        self.children_dir.join(&name).join("mod.rs"),
                    ],
                });
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let test = match item {
            syn::ImplItem::Fn(f) => test_only(&f.attrs),
            _ => false,
        };
        if !test {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if mac.path.segments.last().is_some_and(|s| s.ident == "json") {
            let line = mac.path.segments[0].ident.span().start().line;
            self.found.json_macros.push(line);
        }
        syn::visit::visit_macro(self, mac);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if names.ends_with(&["Outcome".to_string(), "Result".to_string()]) {
            let line = path.segments[0].ident.span().start().line;
            self.found.raw_outcomes.push(line);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let name = call.method.to_string();
        if UNTYPED.contains(&name.as_str()) {
            let line = call.method.span().start().line;
            self.found.untyped.push((name, line));
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// What breaks the rule in the workspace at `root`, one line each.
fn violations(root: &Path) -> Vec<String> {
    let manifest_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: Vec<PathBuf> = member_sources(manifest_root)
        .iter()
        .flat_map(|dir| rs_files(&root.join(dir)))
        .collect();
    let mut per_file = Vec::new();
    let mut test_files = BTreeSet::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let file_dir = path.parent().unwrap().to_path_buf();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let children_dir = if stem == "mod" || stem == "lib" || stem == "main" {
            file_dir.clone()
        } else {
            file_dir.join(&stem)
        };
        let mut found = Found::default();
        Visitor {
            found: &mut found,
            children_dir,
            file_dir,
        }
        .visit_file(&ast);
        test_files.extend(found.test_files.drain(..));
        per_file.push((path.clone(), found));
    }
    let mut out = Vec::new();
    for (path, found) in per_file {
        if test_files.contains(&path) {
            continue;
        }
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.contains("src/supervisor/") {
            for line in found.json_macros {
                out.push(format!(
                    "{rel}:{line}: json! in the supervisor (answer with a type of protocol::replies)"
                ));
            }
            for line in found.raw_outcomes {
                out.push(format!(
                    "{rel}:{line}: Outcome::Result in the supervisor (use Outcome::reply)"
                ));
            }
        }
        let raw_reader = RAW_READERS.iter().any(|(f, _)| *f == rel);
        if !rel.starts_with("crates/core/src/protocol/") && !raw_reader {
            for (method, line) in found.untyped {
                out.push(format!(
                    "{rel}:{line}: {method} reads a reply untyped (use call_as / wait_reply_*)"
                ));
            }
        }
    }
    out
}

#[test]
fn replies_are_built_and_read_typed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = violations(root);
    assert!(found.is_empty(), "untyped replies:\n{}", found.join("\n"));
    // Each exception is still a file that needs it.
    for (file, why) in RAW_READERS {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            text.contains("call_json"),
            "{file} is excused ({why}) but reads no reply untyped: drop it from the list"
        );
    }
}

#[test]
fn the_check_catches_each_kind_of_untyped_reply() {
    let dir = tempfile::tempdir().unwrap();
    let src = &dir.path().join("src");
    std::fs::create_dir_all(src.join("supervisor")).unwrap();
    std::fs::create_dir_all(src.join("cli")).unwrap();
    std::fs::write(
        src.join("supervisor/mod.rs"),
        "#[cfg(test)]\n#[path = \"planted_tests.rs\"]\nmod tests;\n\
         fn a() -> Outcome { Outcome::Result(serde_json::json!({\"x\": 1})) }\n",
    )
    .unwrap();
    // Test code may do as it likes.
    std::fs::write(
        src.join("supervisor/planted_tests.rs"),
        "fn t() { let _ = json!({}); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("cli/ps.rs"),
        "fn b(c: &mut Client) { let v = c.call_json(Call::Ps {}).unwrap(); }\n\
         #[cfg(test)]\nmod tests { fn t(c: &mut Client) { c.call_json(Call::Ps {}); } }\n",
    )
    .unwrap();
    let found = violations(dir.path());
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/cli/ps.rs:1: call_json")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/supervisor/mod.rs:4: json!"))
    );
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/supervisor/mod.rs:4: Outcome::Result"))
    );
}
