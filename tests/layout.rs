//! The house's shape, held by a test: which parts may not know which —
//! the map at the top of `docs/architecture.md` — and where things live.
//! (A rule broken here is a design regression, not a style nit.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

#[path = "common/workspace.rs"]
mod workspace;
use workspace::{member_sources, rs_files, test_only};

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

#[test]
fn the_supervisor_has_no_catch_all_server_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/supervisor/src/supervisor");
    for (path, text) in sources("crates/supervisor/src/supervisor") {
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

// ---------------------------------------------------------------------------
// The import rules. `docs/architecture.md` opens with the map: one row per
// top-level module of `src/`, what it may import and what it must never
// import. The checker below reads every `src/**/*.rs` (test-only code left
// out), collects which module refers to which, and holds the code to the map:
// no import outside a row, none a row forbids, no module without a row, and
// no cycle — between top-level modules or between the files of one folder.
// ---------------------------------------------------------------------------

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::Visit;

/// A module's path in the map (`["memfs", "worktree", "merge"]`).
type ModPath = Vec<String>;

/// A crate of the workspace as the map sees it: where its sources are, the
/// name others use for it, the module of the map its root is (`None`: the
/// map's top level) and the names its `crate::` reaches that are top-level
/// modules of the map (what its root imports from the core, and a module
/// of its own the map lists on its own).
struct Krate {
    dir: &'static str,
    extern_name: &'static str,
    module: Option<&'static str>,
    top: &'static [&'static str],
}

/// The workspace's crates (the `[workspace]` members of `Cargo.toml`).
const CRATES: &[Krate] = &[
    Krate {
        dir: "src",
        extern_name: "mini_letta",
        module: None,
        top: &[],
    },
    Krate {
        dir: "crates/core/src",
        extern_name: "mini_letta_core",
        module: None,
        top: &[],
    },
    Krate {
        dir: "crates/sandbox/src",
        extern_name: "mini_letta_sandbox",
        module: Some("sandbox"),
        top: &["agentfs", "paths", "protocol", "retry", "child"],
    },
    Krate {
        dir: "crates/model/src",
        extern_name: "mini_letta_model",
        module: Some("model"),
        top: &["fsutil", "paths", "protocol"],
    },
    Krate {
        dir: "crates/audit/src",
        extern_name: "mini_letta_audit",
        module: Some("audit"),
        top: &["clock", "paths"],
    },
    Krate {
        dir: "crates/data/src",
        extern_name: "mini_letta_data",
        module: None,
        top: &[],
    },
    Krate {
        dir: "crates/agent/src",
        extern_name: "mini_letta_agent_program",
        module: None,
        top: &[],
    },
    Krate {
        dir: "crates/supervisor/src",
        extern_name: "mini_letta_supervisor",
        module: None,
        top: &[],
    },
];

impl Krate {
    /// The map's module a path from this crate's root starts in:
    /// `first` is the path's first name below the root.
    fn base(&self, first: Option<&String>) -> ModPath {
        match self.module {
            Some(m) if !first.is_some_and(|f| self.top.contains(&f.as_str())) => {
                vec![m.to_string()]
            }
            _ => Vec::new(),
        }
    }
}

/// Who refers to whom: each referring module file and the module paths it
/// names (resolved to the longest module that exists).
type Refs = BTreeMap<ModPath, BTreeSet<ModPath>>;

/// One row of the map.
#[derive(Debug, Default)]
struct Row {
    may: BTreeSet<String>,
    never: BTreeSet<String>,
}

/// The map's table: the rows between the marker and the first line that is
/// not a table row.
fn read_rules(doc: &str) -> BTreeMap<String, Row> {
    let start = doc
        .find("<!-- layout rules")
        .expect("the layout rules marker in docs/architecture.md");
    let mut rules = BTreeMap::new();
    let rows = doc[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .skip(2);
    for line in rows {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a map row has four cells: {line}");
        let names = |cell: &str| -> BTreeSet<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let module = names(cells[0])
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("a map row names its module: {line}"));
        let row = Row {
            may: names(cells[2]),
            never: names(cells[3]),
        };
        assert!(
            rules.insert(module.clone(), row).is_none(),
            "{module} has two rows"
        );
    }
    assert!(!rules.is_empty(), "the map has no rows");
    rules
}

/// Collects the `crate::`, `super::` and `self::` paths of one file.
struct Collector<'a> {
    /// The crate the file is in.
    krate: &'a Krate,
    /// The module the code being visited is in (the file's, plus inline
    /// modules).
    here: ModPath,
    /// Paths named, resolved against `here` to crate-absolute form.
    found: &'a mut Vec<ModPath>,
    /// Child modules declared test-only (`#[cfg(test)] mod x;`).
    test_modules: &'a mut Vec<ModPath>,
}

impl Collector<'_> {
    /// `segments` made absolute: from `crate`, a crate of the workspace,
    /// `self`, `super`, or else `here`.
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => self.krate.base(rest.first()),
            name if CRATES.iter().any(|k| k.extern_name == name) => CRATES
                .iter()
                .find(|k| k.extern_name == name)?
                .base(rest.first()),
            "self" => self.here.clone(),
            "super" => {
                let mut b = self.here.clone();
                b.pop()?;
                b
            }
            // Relative to `here`: a child module (`use child::f`) when one
            // of that name exists; anything else (a type, a local, another
            // crate) resolves to `here` itself, which is no edge.
            _ => {
                let mut b = self.here.clone();
                b.extend(segments.iter().cloned());
                return Some(b);
            }
        };
        let mut rest = rest.iter().peekable();
        while rest.peek().is_some_and(|s| s.as_str() == "super") {
            base.pop()?;
            rest.next();
        }
        base.extend(rest.cloned());
        Some(base)
    }

    fn note(&mut self, segments: &[String]) {
        if let Some(p) = self.absolute(segments) {
            self.found.push(p);
        }
    }

    /// Every path of a `use` tree (`crate::a::{b, c::d}` names `a::b` and
    /// `a::c::d`).
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.note(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.note(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.note(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside a macro's tokens (`format!("{}", crate::a::b(x))`):
    /// every `crate`/`super`/`self` followed by `::` and names.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id)
                    if ["crate", "super", "self"].contains(&&*id.to_string())
                        || CRATES.iter().any(|k| *id == k.extern_name) =>
                {
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(n.to_string());
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.note(&segments);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if test_only(attrs) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                let mut p = self.here.clone();
                p.push(m.ident.to_string());
                self.test_modules.push(p);
            }
            return;
        }
        match item {
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    self.here.push(m.ident.to_string());
                    for i in items {
                        self.visit_item(i);
                    }
                    self.here.pop();
                }
            }
            syn::Item::Use(u) => self.use_tree(&mut Vec::new(), &u.tree),
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    /// `pub(super)` and `pub(in crate::x)` say who may see an item; they
    /// name no module the item uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// The module of the map a file of `krate` is (`memfs/worktree/mod.rs`
/// is `memfs::worktree`; the sandbox crate's `plan.rs` is `sandbox::plan`);
/// `None` for a crate root that is no module and for the binaries.
fn module_of(krate: &Krate, rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match (parts.first().map(String::as_str), krate.module) {
        (Some("main" | "bin") | None, _) | (Some("lib"), None) => return None,
        (Some("lib"), Some(m)) => return Some(vec![m.to_string()]),
        _ => {}
    }
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    let mut module = krate.base(parts.first());
    module.extend(parts);
    Some(module)
}

/// Every module of the workspace at `root` (each crate's sources) and the
/// modules each refers to, test code left out.
fn references(root: &Path) -> Refs {
    let mut files = Vec::new();
    let mut test_modules = Vec::new();
    for krate in CRATES {
        let src = root.join(krate.dir);
        for path in rs_files(&src) {
            {
                let Some(module) = module_of(krate, path.strip_prefix(&src).unwrap()) else {
                    continue;
                };
                let text = std::fs::read_to_string(&path).unwrap();
                let file =
                    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let mut found = Vec::new();
                let mut c = Collector {
                    krate,
                    here: module.clone(),
                    found: &mut found,
                    test_modules: &mut test_modules,
                };
                for item in &file.items {
                    c.visit_item(item);
                }
                files.push((module, found));
            }
        }
    }
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut refs = Refs::new();
    for (module, found) in files {
        if test_modules.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let named = found
            .into_iter()
            .filter_map(|p| {
                (1..=p.len())
                    .rev()
                    .map(|k| p[..k].to_vec())
                    .find(|k| modules.contains(k))
            })
            // Its own items (a type, a local) are no reference.
            .filter(|k| *k != module)
            .collect();
        refs.insert(module, named);
    }
    refs
}

/// The edges between the children of each folder (the crate root's
/// children are the top-level modules): `a::x::y` naming `a::z::w` is the
/// edge `x → z` in folder `a`. A module naming its own ancestor or
/// descendant is no edge.
fn folder_edges(refs: &Refs) -> BTreeMap<ModPath, BTreeSet<(String, String)>> {
    let mut folders: BTreeMap<ModPath, BTreeSet<(String, String)>> = BTreeMap::new();
    for (from, named) in refs {
        for to in named {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                folders
                    .entry(from[..common].to_vec())
                    .or_default()
                    .insert((from[common].clone(), to[common].clone()));
            }
        }
    }
    folders
}

/// Loops between a module's own file and a module below it (`a/mod.rs`
/// using `a::x`, which uses what `a/mod.rs` itself defines): a folder's
/// edges leave them out, as a module naming its own ancestor or
/// descendant is no edge between siblings; they are loops all the same.
/// What both sides need belongs in a file of its own below `a`.
fn nested_loops(refs: &Refs) -> Vec<String> {
    let mut out = Vec::new();
    for (below, named) in refs {
        for depth in 1..below.len() {
            let above = &below[..depth];
            if !named.contains(above) {
                continue;
            }
            let branch = &below[..depth + 1];
            let back = refs
                .get(above)
                .is_some_and(|n| n.iter().any(|m| m.starts_with(branch)));
            if back {
                out.push(format!(
                    "import loop between {} and {}: each names the other; move what both use below {}",
                    above.join("::"),
                    below.join("::"),
                    above.join("::")
                ));
            }
        }
    }
    out
}

/// One cycle of `edges`, as a path that ends where it began, if any.
fn a_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    fn visit<'a>(
        n: &'a str,
        edges: &'a BTreeSet<(String, String)>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for (_, to) in edges.iter().filter(|(f, _)| f == n) {
            if let Some(c) = visit(to, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges
        .iter()
        .find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

/// Everything in the workspace at `root` that breaks `rules`, one line
/// each.
fn violations(root: &Path, rules: &BTreeMap<String, Row>) -> Vec<String> {
    let refs = references(root);
    let folders = folder_edges(&refs);
    let mut out = Vec::new();
    let tops: BTreeSet<&String> = refs.keys().filter_map(|m| m.first()).collect();
    for top in &tops {
        if !rules.contains_key(*top) {
            out.push(format!("{top} has no row in the map"));
        }
    }
    for (module, row) in rules {
        if !tops.contains(module) {
            out.push(format!(
                "the map has a row for {module}, which is no module"
            ));
        }
        for banned in row.may.intersection(&row.never) {
            out.push(format!(
                "the map lets {module} import {banned}, which its row forbids"
            ));
        }
    }
    let allowed: BTreeSet<(String, String)> = rules
        .iter()
        .flat_map(|(m, r)| r.may.iter().map(move |t| (m.clone(), t.clone())))
        .collect();
    if let Some(c) = a_cycle(&allowed) {
        out.push(format!("the map allows a cycle: {}", c.join(" → ")));
    }
    let top_edges = folders.get(&Vec::new()).cloned().unwrap_or_default();
    for (from, to) in &top_edges {
        let Some(row) = rules.get(from) else { continue };
        let files: Vec<String> = refs
            .iter()
            .filter(|(m, named)| m[0] == *from && named.iter().any(|n| n[0] == *to))
            .map(|(m, _)| m.join("::"))
            .collect();
        if row.never.contains(to) {
            out.push(format!(
                "{from} → {to} is forbidden (in {})",
                files.join(", ")
            ));
        } else if !row.may.contains(to) {
            out.push(format!(
                "{from} → {to} is not in {from}'s row (in {})",
                files.join(", ")
            ));
        }
    }
    // An allowed edge nobody uses is a door left open: the next import
    // through it would pass unreviewed.
    for (from, to) in &allowed {
        if tops.contains(from) && !top_edges.contains(&(from.clone(), to.clone())) {
            out.push(format!(
                "the map lets {from} import {to}, which nothing in {from} does: drop it from the row"
            ));
        }
    }
    out.extend(nested_loops(&refs));
    for (folder, edges) in &folders {
        if let Some(c) = a_cycle(edges) {
            let at = if folder.is_empty() {
                "top-level modules".to_string()
            } else {
                format!("{}/", folder.join("/"))
            };
            out.push(format!("import cycle in {at}: {}", c.join(" → ")));
        }
    }
    out
}

/// A crate the map does not read would hold code no rule checks.
#[test]
fn every_crate_of_the_workspace_is_read() {
    let read: BTreeSet<String> = CRATES.iter().map(|k| k.dir.to_string()).collect();
    let members: BTreeSet<String> = member_sources(&repo_path("")).into_iter().collect();
    assert_eq!(read, members);
}

/// A member of the workspace: its package name, sources and the packages
/// of the workspace it depends on.
struct Member {
    package: String,
    dir: String,
    depends: BTreeSet<String>,
}

/// The workspace's members, from the manifests under `root`.
fn members(root: &Path) -> Vec<Member> {
    let manifest = |dir: &Path| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap()
    };
    let top = manifest(root);
    top["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let m = m.as_str().unwrap();
            let own = manifest(&root.join(m));
            let depends = own["dependencies"]
                .as_table()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with("mini-letta"))
                .cloned()
                .collect();
            Member {
                package: own["package"]["name"].as_str().unwrap().to_string(),
                dir: match m {
                    "." => "src".to_string(),
                    m => format!("{m}/src"),
                },
                depends,
            }
        })
        .collect()
}

/// A crate may depend on another only where one of its modules may import
/// one of the other's (the map's rows): the compiler then refuses every
/// import the map forbids between crates, and this says which dependency
/// may not be added (the agent program on the providers, say).
fn crate_violations(root: &Path, members: &[Member], rules: &BTreeMap<String, Row>) -> Vec<String> {
    let modules = |dir: &str| -> BTreeSet<String> {
        let krate = CRATES.iter().find(|k| k.dir == dir).unwrap();
        let src = root.join(dir);
        rs_files(&src)
            .iter()
            .filter_map(|p| module_of(krate, p.strip_prefix(&src).unwrap()))
            .filter_map(|m| m.first().cloned())
            .collect()
    };
    let mut out = Vec::new();
    for m in members {
        let own = modules(&m.dir);
        for dep in &m.depends {
            let Some(d) = members.iter().find(|o| &o.package == dep) else {
                out.push(format!(
                    "{} depends on {dep}, which is no member",
                    m.package
                ));
                continue;
            };
            let theirs = modules(&d.dir);
            let allowed = own.iter().any(|a| {
                rules
                    .get(a)
                    .is_some_and(|r| theirs.iter().any(|b| r.may.contains(b)))
            });
            if !allowed {
                out.push(format!(
                    "{} depends on {dep}, but none of {own:?} may import any of {theirs:?}",
                    m.package
                ));
            }
        }
    }
    out
}

#[test]
fn crates_depend_only_where_the_map_allows() {
    let root = repo_path("");
    let mut found = members(&root);
    assert!(crate_violations(&root, &found, &the_map()).is_empty());
    // The agent program reaching for the providers would compile once
    // its manifest named them: the manifest may not.
    let agent = found
        .iter_mut()
        .find(|m| m.package == "mini-letta-agent-program")
        .expect("the agent program's crate");
    agent.depends.insert("mini-letta-model".into());
    assert_eq!(
        crate_violations(&root, &found, &the_map()),
        [
            "mini-letta-agent-program depends on mini-letta-model, but none of {\"agent\"} may import any of {\"model\"}"
        ]
    );
}

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn the_map() -> BTreeMap<String, Row> {
    read_rules(&std::fs::read_to_string(repo_path("docs/architecture.md")).unwrap())
}

#[test]
fn src_follows_the_map() {
    let found = violations(&repo_path(""), &the_map());
    assert!(found.is_empty(), "{found:#?}");
}

/// A copy of the workspace's sources with one line appended to `file`.
fn src_with(file: &str, line: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let dest = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy(&path, &dest);
            } else {
                std::fs::copy(&path, &dest).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for krate in CRATES {
        copy(&repo_path(krate.dir), &dir.path().join(krate.dir));
    }
    let target = dir.path().join(file);
    let mut text = std::fs::read_to_string(&target).unwrap();
    text.push_str(line);
    std::fs::write(&target, text).unwrap();
    dir
}

/// The memory core knowing an agent again is caught three ways: outside
/// memfs's row, forbidden by it, and a cycle with the agent program.
#[test]
fn an_allowed_edge_nobody_uses_fails_the_rules() {
    let mut map = the_map();
    let row = map.get_mut("names").expect("a row for names");
    row.may.insert("paths".to_string());
    let found = violations(&repo_path(""), &map);
    assert_eq!(
        found,
        ["the map lets names import paths, which nothing in names does: drop it from the row"],
    );
}

#[test]
fn an_edge_added_back_fails_the_rules() {
    let tree = src_with(
        "crates/data/src/memfs/worktree/merge.rs",
        "\npub fn signature_again(a: &crate::paths::AgentPaths) -> bool {\n    \
         crate::agent::runtime::broken_links_text(a, &[]).is_empty()\n}\n",
    );
    let found = violations(tree.path(), &the_map());
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("memfs → agent is forbidden (in memfs::worktree::merge)")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("import cycle in top-level modules:")),
        "{found:#?}"
    );
    // The sandbox crate's files are the map's `sandbox` module: its
    // `crate::` names its own modules, and what its root imports.
    let tree = src_with(
        "crates/sandbox/src/plan.rs",
        "\npub use crate::child::STAGE_FAILURE as _again;\n",
    );
    let found = violations(tree.path(), &the_map());
    assert_eq!(
        found,
        [
            "sandbox → child is not in sandbox's row (in sandbox::plan)",
            "import cycle in top-level modules: sandbox → child → sandbox",
        ],
    );
    // Inside a folder: worktree/merge.rs reaching up to advance.rs again.
    let tree = src_with(
        "crates/data/src/memfs/worktree/merge.rs",
        "\nuse super::advance::advance_main as _again;\n",
    );
    let found = violations(tree.path(), &the_map());
    assert!(
        found.contains(&"import cycle in memfs/worktree/: advance → merge → advance".to_string())
            || found
                .contains(&"import cycle in memfs/worktree/: merge → advance → merge".to_string()),
        "{found:#?}"
    );
}

/// A module's own file and a child naming each other is a loop, however
/// the child reaches it (`super::`, `crate::`), and whichever way the parent
/// names the child (`use child::x`, relative); `pub(super)` names nothing.
#[test]
fn a_loop_between_a_module_and_its_child_fails_the_rules() {
    let before = violations(&repo_path(""), &the_map());
    let tree = src_with(
        "crates/supervisor/src/cluster/keys.rs",
        "\npub(super) fn again(c: &super::ClusterConfig) -> &str {\n    &c.host_id\n}\n",
    );
    let after = violations(tree.path(), &the_map());
    let new: Vec<&String> = after.iter().filter(|v| !before.contains(v)).collect();
    assert_eq!(
        new,
        [
            "import loop between cluster and cluster::keys: each names the other; move what both use below cluster"
        ],
    );
}

/// The checker itself, over a tree small enough to know every edge: `use`
/// groups, `super::super`, paths in macros count; comments, strings and
/// test-only code (inline or a `#[cfg(test)] mod x;` file) do not.
#[test]
fn the_checker_reads_every_kind_of_reference() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let p = dir.path().join("src").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod low; pub mod mid; pub mod top;");
    write(
        "low.rs",
        "// crate::top in a comment\npub fn f() -> &'static str { \"crate::top::g\" }\n#[cfg(test)]\nmod tests { use crate::top; }\n",
    );
    write(
        "mid/mod.rs",
        "pub mod a; pub mod b;\n#[cfg(test)]\nmod checks;\n",
    );
    write(
        "mid/a.rs",
        "use super::super::{low, mid::b};\npub fn a() { b::b(); low::f(); }\n",
    );
    write(
        "mid/b.rs",
        "pub fn b() { let _ = format!(\"{}\", crate::low::f()); }\n",
    );
    write("mid/checks.rs", "use crate::top;\n");
    write("top.rs", "pub use crate::mid::{a::a as alias};\n");
    let refs = references(dir.path());
    let names = |m: &str| -> Vec<String> {
        let key: ModPath = m.split("::").map(str::to_string).collect();
        refs[&key].iter().map(|p| p.join("::")).collect()
    };
    assert_eq!(names("low"), Vec::<String>::new());
    assert_eq!(names("mid::a"), ["low", "mid::b"]);
    assert_eq!(names("mid::b"), ["low"]);
    assert_eq!(names("top"), ["mid::a"]);
    assert!(!refs.contains_key(&vec!["mid".to_string(), "checks".to_string()]));
    let folders = folder_edges(&refs);
    let top: Vec<(String, String)> = folders[&Vec::new()].iter().cloned().collect();
    assert_eq!(
        top,
        [("mid".into(), "low".into()), ("top".into(), "mid".into())]
    );
    assert_eq!(a_cycle(&folders[&Vec::new()]), None);

    // A rule the tree breaks, and a cycle it then has.
    let rules = read_rules(
        "<!-- layout rules -->\n| module | owns | may import | never |\n|---|---|---|---|\n\
         | `low` | a | — | `top` |\n| `mid` | b | `low` | |\n| `top` | c | `mid` | |\n",
    );
    assert!(violations(dir.path(), &rules).is_empty());
    write(
        "low.rs",
        "pub fn f() -> &'static str { crate::top::NAME }\n",
    );
    write(
        "top.rs",
        "pub use crate::mid::{a::a as alias};\npub const NAME: &str = \"n\";\n",
    );
    let found = violations(dir.path(), &rules);
    assert_eq!(
        found,
        [
            "low → top is forbidden (in low)",
            "import cycle in top-level modules: low → top → mid → low",
        ]
    );
}

/// Issue 49: a non-test function is at most [`FN_LIMIT`] lines, a file at
/// most [`FILE_LIMIT`] non-test lines, everywhere in the workspace.
const FN_LIMIT: usize = 100;
const FILE_LIMIT: usize = 800;

/// Sizes over the limits in the workspace at `root`: `file` → non-test
/// lines, `file: fn` → lines (files named from `root`).
fn oversized(root: &Path) -> BTreeMap<String, usize> {
    struct Fns<'a> {
        file: &'a str,
        out: &'a mut BTreeMap<String, usize>,
        test_lines: usize,
        test_modules: &'a mut Vec<PathBuf>,
        dir: PathBuf,
    }
    fn lines(span: proc_macro2::Span) -> usize {
        span.end().line + 1 - span.start().line
    }
    impl Fns<'_> {
        /// From `fn` to the closing brace (doc comments do not count).
        fn fun(&mut self, sig: &syn::Signature, block: &syn::Block) {
            let name = &sig.ident;
            let n = block.brace_token.span.close().end().line + 1 - sig.fn_token.span.start().line;
            if n > FN_LIMIT {
                let key = format!("{}: {name}", self.file);
                let e = self.out.entry(key).or_default();
                *e = (*e).max(n);
            }
        }
    }
    impl<'ast> Visit<'ast> for Fns<'_> {
        fn visit_item(&mut self, item: &'ast syn::Item) {
            let attrs = match item {
                syn::Item::Fn(f) => &f.attrs,
                syn::Item::Mod(m) => &m.attrs,
                syn::Item::Impl(i) => &i.attrs,
                _ => &Vec::new(),
            };
            if test_only(attrs) {
                use syn::spanned::Spanned;
                self.test_lines += lines(item.span());
                if let syn::Item::Mod(m) = item
                    && m.content.is_none()
                {
                    self.test_modules.push(self.dir.join(m.ident.to_string()));
                }
                return;
            }
            if let syn::Item::Fn(f) = item {
                self.fun(&f.sig, &f.block);
            }
            syn::visit::visit_item(self, item);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if test_only(&f.attrs) {
                return;
            }
            self.fun(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    let mut out = BTreeMap::new();
    let mut test_modules = Vec::new();
    let mut files: Vec<(PathBuf, usize, usize)> = Vec::new();
    let paths = CRATES.iter().flat_map(|k| rs_files(&root.join(k.dir)));
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        // `a/mod.rs` and `a.rs` declare children in `a/`.
        let dir = if path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
        {
            path.parent().unwrap().to_path_buf()
        } else {
            path.with_extension("")
        };
        let mut fns = BTreeMap::new();
        let mut v = Fns {
            file: &rel,
            out: &mut fns,
            test_lines: 0,
            test_modules: &mut test_modules,
            dir,
        };
        for item in &file.items {
            v.visit_item(item);
        }
        let test_lines = v.test_lines;
        out.extend(fns);
        files.push((path, text.lines().count(), test_lines));
    }
    for (path, total, test_lines) in files {
        let module = path.with_extension("");
        let test_file = test_modules
            .iter()
            .any(|t| module.starts_with(t) || path.parent() == Some(t.as_path()));
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        if test_file {
            out.retain(|k, _| !k.starts_with(&format!("{rel}:")));
            continue;
        }
        let n = total - test_lines;
        if n > FILE_LIMIT {
            out.insert(rel, n);
        }
    }
    out
}

#[test]
fn functions_and_files_keep_their_limits() {
    let problems: Vec<String> = oversized(&repo_path(""))
        .into_iter()
        .map(|(what, n)| {
            format!(
                "{what}: {n} lines, over the limit ({FN_LIMIT} a function, {FILE_LIMIT} a file)"
            )
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The measure itself: a long function counts from `fn` to its closing
/// brace, doc comments aside; test code — inline or a test-only file —
/// does not count.
#[test]
fn the_limits_measure_what_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let body = "    let _ = 1;\n".repeat(FN_LIMIT - 1);
    let docs = "/// doc\n".repeat(50);
    std::fs::write(
        src.join("lib.rs"),
        format!(
            "{docs}pub fn long() {{\n{body}}}\n{docs}pub fn fits() {{\n{}}}\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline {{\n    fn long_test() {{\n{body}{body}    }}\n}}\n",
            "    let _ = 1;\n".repeat(FN_LIMIT - 2)
        ),
    )
    .unwrap();
    std::fs::write(
        src.join("tests.rs"),
        format!("fn long_test() {{\n{body}{body}}}\n"),
    )
    .unwrap();
    let found = oversized(dir.path());
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        [("src/lib.rs: long".to_string(), FN_LIMIT + 1)]
    );
}
