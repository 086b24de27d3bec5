//! The system-prompt compiler: committed memory (HEAD) → `coreMemory`, injected
//! into the agent's raw system prompt.
//!
//! * **memfs-v2** (root `MEMORY.md` in HEAD) renders as the book's chapter 8:
//!   a `<label>` block per root file, then one `<memory>` block with the root
//!   index body and a `<deferred-memory>` line per first-level `X/MEMORY.md`.
//!   No metadata block, so the same HEAD compiles to the same bytes in every
//!   conversation.
//! * **memfs-v1** renders as letta-code does: `<self>`, the `system/` tree, an
//!   `<external_projection>` listing, and a `<memory_metadata>` block.
//!
//! Only HEAD is read, through git2, and only the blobs whose contents are
//! rendered: v2 reads root files and first-level indexes, v1 reads `system/`
//! files and lists the rest by path. Compile cost therefore does not grow
//! with the size of on-demand files (v1 still walks every tree to list them).
//!
//! Where letta-code has a bug we do the right thing instead (each is pinned by
//! a test):
//! * non-ASCII file and directory names are included (letta-code drops them
//!   because `git ls-tree` quotes them under the default `core.quotePath`);
//!   so are names with quotes, backslashes or leading spaces;
//! * files over 1 MiB are rendered (letta-code's `execFileSync` buffer limit
//!   silently drops them), and an unreadable object is an error, not a silent
//!   omission;
//! * labels such as `constructor`, `__proto__` or `__value__` behave like any
//!   other (letta-code's v1 tree is a plain JS object and loses them);
//! * `$` sequences in memory text are injected literally (letta-code's
//!   `replaceAll` with a string replacement expands `$&`, `` $` ``, `$'`, `$$`).
//!
//! Documented renderings: a repository without commits compiles as memfs-v1
//! with no files (metadata only, no revision); blobs that are not UTF-8 are
//! decoded with U+FFFD replacements; a committed symlink named `*.md`
//! contributes its target path as text (what git stores for it); submodule
//! entries are skipped (they have no blob).

use std::path::Path;

use git2::Repository;
use serde::Serialize;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::collate::{locale_compare, sort_by_locale};
use super::frontmatter::parse_frontmatter;
use super::layout::{INDEX_FILE, MemoryFormat, is_child_index_path, label_of};
use super::repo::{self, RepoError};
use super::snapshot::{Entry, Head, read_commit, read_head};
use super::text::{js_trim, js_trim_end};

/// The placeholder replaced by coreMemory.
pub const CORE_MEMORY_VARIABLE: &str = "{CORE_MEMORY}";

/// Inputs besides the repository.
#[derive(Debug, Clone)]
pub struct CompileOptions<'a> {
    pub agent_id: &'a str,
    pub conversation_id: &'a str,
    /// The raw system prompt (may contain `{CORE_MEMORY}`).
    pub system: &'a str,
    pub now: OffsetDateTime,
    pub previous_message_count: u64,
}

/// The compiled prompt and its fingerprints (field names as letta-code's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompiledPrompt {
    pub content: String,
    pub core_memory: String,
    pub compiled_at: String,
    pub raw_system_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memfs_revision: Option<String>,
    pub memory_format: MemoryFormat,
}

/// The memory part alone: rendered projection, format and revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    pub content: String,
    pub format: MemoryFormat,
    pub revision: Option<String>,
}

/// Compile the repository at `memory_dir` (its working-tree root or git dir).
pub fn compile_dir(
    memory_dir: &Path,
    opts: &CompileOptions<'_>,
) -> Result<CompiledPrompt, RepoError> {
    let repo = repo::open(memory_dir)?;
    compile_repo(&repo, opts)
}

/// Compile an open repository.
pub fn compile_repo(
    repo: &Repository,
    opts: &CompileOptions<'_>,
) -> Result<CompiledPrompt, RepoError> {
    let projection = render_projection(repo)?;
    Ok(assemble(projection, opts))
}

/// Combine a projection with the metadata block and the raw system prompt.
pub(crate) fn assemble(projection: Projection, opts: &CompileOptions<'_>) -> CompiledPrompt {
    let metadata = match projection.format {
        MemoryFormat::V2 => String::new(),
        MemoryFormat::V1 => metadata_block(opts),
    };
    let core_memory = [projection.content.as_str(), metadata.as_str()]
        .into_iter()
        .filter(|part| !js_trim(part).is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    CompiledPrompt {
        content: inject_core_memory(opts.system, &core_memory),
        compiled_at: crate::clock::js_iso(opts.now),
        raw_system_hash: sha256_hex(opts.system.as_bytes()),
        memfs_revision: projection.revision,
        memory_format: projection.format,
        core_memory,
    }
}

/// One read memory file.
#[derive(Debug, Clone)]
struct MemoryFile {
    path: String,
    label: String,
    value: String,
    description: String,
}

fn read_file(head: &Head<'_>, entry: &Entry) -> Result<MemoryFile, RepoError> {
    let raw = head.read_text(entry)?;
    let parsed = parse_frontmatter(&raw);
    Ok(MemoryFile {
        label: label_of(&entry.path).to_string(),
        description: parsed.description().to_string(),
        value: parsed.body,
        path: entry.path.clone(),
    })
}

/// Render the committed memory of `repo`.
pub(crate) fn render_projection(repo: &Repository) -> Result<Projection, RepoError> {
    let Some(head) = read_head(repo)? else {
        return Ok(Projection {
            content: String::new(),
            format: MemoryFormat::V1,
            revision: None,
        });
    };
    render_snapshot(&head)
}

/// Compile the tree of commit `id` instead of HEAD's.
pub(crate) fn compile_commit(
    repo: &Repository,
    id: git2::Oid,
    opts: &CompileOptions<'_>,
) -> Result<CompiledPrompt, RepoError> {
    let head = read_commit(repo, id)?;
    Ok(assemble(render_snapshot(&head)?, opts))
}

fn render_snapshot(head: &Head<'_>) -> Result<Projection, RepoError> {
    let revision = Some(head.revision().to_string());
    if head.has_root_index() {
        let blocks = v2_blocks(head)?;
        Ok(Projection {
            content: join_blocks(&blocks),
            format: MemoryFormat::V2,
            revision,
        })
    } else {
        let mut files = Vec::new();
        for entry in head
            .all_blobs()?
            .into_iter()
            .filter(|e| e.path.ends_with(".md"))
        {
            // Only `system/` files are rendered with their contents; the rest
            // appear in the external listing by path alone, so they are not
            // read (letta-code reads every file, which makes v1 cost grow
            // with the number of on-demand files).
            if entry.path.starts_with("system/") {
                files.push(read_file(head, &entry)?);
            } else {
                files.push(MemoryFile {
                    label: label_of(&entry.path).to_string(),
                    path: entry.path,
                    value: String::new(),
                    description: String::new(),
                });
            }
        }
        sort_by_locale(&mut files, |f| &f.label);
        Ok(Projection {
            content: render_v1(&files),
            format: MemoryFormat::V1,
            revision,
        })
    }
}

/// One block of a memfs-v2 projection and the files it shows: a root
/// file's `<label>` block, or the `<memory>` block (the root index and the
/// child indexes it defers to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionBlock {
    pub paths: Vec<String>,
    pub text: String,
}

/// The projection's blocks, in order, when HEAD is a memfs-v2 tree
/// (`None` for memfs-v1 or an empty repository): what a `<memory_update>`
/// that shows only changed files is cut from.
pub(crate) fn projection_blocks(
    repo: &Repository,
) -> Result<Option<Vec<ProjectionBlock>>, RepoError> {
    match read_head(repo)? {
        Some(head) if head.has_root_index() => v2_blocks(&head).map(Some),
        _ => Ok(None),
    }
}

fn join_blocks(blocks: &[ProjectionBlock]) -> String {
    blocks
        .iter()
        .map(|b| b.text.as_str())
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn v2_blocks(head: &Head<'_>) -> Result<Vec<ProjectionBlock>, RepoError> {
    let (root, indexes) = head.root_and_child_indexes()?;
    let mut root_files = Vec::new();
    let mut root_index = None;
    for entry in root.iter().filter(|e| e.path.ends_with(".md")) {
        let file = read_file(head, entry)?;
        if entry.path == INDEX_FILE {
            root_index = Some(file);
        } else {
            root_files.push(file);
        }
    }
    let mut children: Vec<&Entry> = indexes
        .iter()
        .filter(|e| is_child_index_path(&e.path) && e.path != "skills/MEMORY.md")
        .collect();
    sort_by_locale(&mut root_files, |f| &f.label);
    children.sort_by(|a, b| locale_compare(&a.path, &b.path));
    let dirs: Vec<&str> = children
        .iter()
        .filter_map(|e| e.path.strip_suffix("/MEMORY.md"))
        .collect();
    let mut blocks = Vec::new();
    for file in &root_files {
        let mut lines = vec![format!("<{}>", file.label)];
        if !file.description.is_empty() {
            lines.push(format!("<description>{}</description>", file.description));
        }
        let value = js_trim_end(&file.value);
        if !value.is_empty() {
            lines.push(value.to_string());
        }
        lines.push(format!("</{}>", file.label));
        blocks.push(ProjectionBlock {
            paths: vec![file.path.clone()],
            text: lines.join("\n"),
        });
    }
    if let Some(index) = root_index {
        let mut lines = vec!["<memory>".to_string()];
        let value = js_trim_end(&index.value);
        if !value.is_empty() {
            lines.push(value.to_string());
        }
        if !dirs.is_empty() {
            lines.push("<deferred-memory>".to_string());
            for dir in &dirs {
                let esc = escape_xml_attribute(dir);
                lines.push(format!(
                    "<directory path=\"{esc}/\" index=\"{esc}/MEMORY.md\" />"
                ));
            }
            lines.push("</deferred-memory>".to_string());
        }
        lines.push("</memory>".to_string());
        let mut paths = vec![INDEX_FILE.to_string()];
        paths.extend(children.iter().map(|e| e.path.clone()));
        blocks.push(ProjectionBlock {
            paths,
            text: lines.join("\n"),
        });
    }
    Ok(blocks)
}

/// Escape `& " ' < >` for an XML attribute value, `&` first.
pub(crate) fn escape_xml_attribute(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

const V1_REMINDER: &str =
    "Reminder: <projection> contains the local path of the memory file projection.";

fn render_v1(files: &[MemoryFile]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let mut lines = vec![V1_REMINDER.to_string()];
    if let Some(persona) = files.iter().find(|f| f.label == "system/persona") {
        lines.push(String::new());
        lines.push("<self>".to_string());
        lines.push("<projection>$MEMORY_DIR/system/persona.md</projection>".to_string());
        lines.push(js_trim_end(&persona.value).to_string());
        lines.push("</self>".to_string());
    }
    let system: Vec<&MemoryFile> = files
        .iter()
        .filter(|f| f.label.starts_with("system/") && f.label != "system/persona")
        .collect();
    let external: Vec<&MemoryFile> = files
        .iter()
        .filter(|f| !f.label.starts_with("system/") && !f.label.starts_with("skills/"))
        .collect();
    if !system.is_empty() || !external.is_empty() {
        lines.push(String::new());
        lines.push("<memory>".to_string());
        let tree = render_system_tree(&system);
        if !tree.is_empty() {
            lines.push(tree);
        }
        if !external.is_empty() {
            lines.push(render_external_tree(&external));
        }
        lines.push("</memory>".to_string());
    }
    lines.join("\n")
}

/// A node of the `system/` tree: maybe a file, maybe a directory, maybe both.
#[derive(Default)]
struct SystemNode<'a> {
    leaf: Option<&'a MemoryFile>,
    children: Vec<(String, SystemNode<'a>)>,
}

impl<'a> SystemNode<'a> {
    fn child(&mut self, name: &str) -> &mut SystemNode<'a> {
        let pos = match self.children.iter().position(|(n, _)| n == name) {
            Some(p) => p,
            None => {
                self.children
                    .push((name.to_string(), SystemNode::default()));
                self.children.len() - 1
            }
        };
        &mut self.children[pos].1
    }
}

fn render_system_tree(files: &[&MemoryFile]) -> String {
    let mut root = SystemNode::default();
    for file in files {
        let label = file.label.strip_prefix("system/").unwrap_or(&file.label);
        let parts: Vec<&str> = label.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() {
            continue;
        }
        let mut node = &mut root;
        for part in parts {
            node = node.child(part);
        }
        node.leaf = Some(file);
    }
    let mut lines = Vec::new();
    render_system_node(&mut root, 0, &mut Vec::new(), &mut lines);
    lines.join("\n")
}

fn render_system_node<'a>(
    node: &mut SystemNode<'a>,
    indent: usize,
    path: &mut Vec<String>,
    lines: &mut Vec<String>,
) {
    let pad = "  ".repeat(indent);
    node.children.sort_by(|(a, _), (b, _)| locale_compare(a, b));
    for (key, child) in node.children.iter_mut() {
        path.push(key.clone());
        lines.push(format!("{pad}<{key}>"));
        if let Some(file) = child.leaf {
            lines.push(format!(
                "{pad}  <projection>$MEMORY_DIR/system/{}.md</projection>",
                path.join("/")
            ));
            if !file.description.is_empty() {
                lines.push(format!(
                    "{pad}  <description>{}</description>",
                    file.description
                ));
            }
            let value = js_trim_end(&file.value);
            if !value.is_empty() {
                lines.push(format!("{pad}  {value}"));
            }
        }
        render_system_node(child, indent + 1, path, lines);
        lines.push(format!("{pad}</{key}>"));
        path.pop();
    }
}

/// A directory of the external listing. Entries keep insertion order (as a
/// JS `Map` does); `index` finds a name without a linear scan, which matters
/// for repositories with thousands of files. Names borrow from the paths.
#[derive(Default)]
struct ExternalDir<'a> {
    entries: Vec<(&'a str, Option<ExternalDir<'a>>)>,
    index: std::collections::HashMap<&'a str, usize>,
}

impl<'a> ExternalDir<'a> {
    /// `Map.set`: an existing key keeps its position, its value is replaced.
    fn set(&mut self, name: &'a str, value: Option<ExternalDir<'a>>) -> usize {
        match self.index.get(name) {
            Some(&p) => {
                self.entries[p].1 = value;
                p
            }
            None => {
                self.entries.push((name, value));
                self.index.insert(name, self.entries.len() - 1);
                self.entries.len() - 1
            }
        }
    }

    /// The subdirectory `name`, created (replacing a file of that name) if
    /// it is not a directory yet.
    fn subdir(&mut self, name: &'a str) -> &mut ExternalDir<'a> {
        let pos = match self.index.get(name) {
            Some(&p) if self.entries[p].1.is_some() => p,
            _ => self.set(name, Some(ExternalDir::default())),
        };
        self.entries[pos].1.get_or_insert_with(ExternalDir::default)
    }
}

fn render_external_tree(files: &[&MemoryFile]) -> String {
    let mut root = ExternalDir::default();
    for file in files {
        let mut parts = file.path.split('/').filter(|p| !p.is_empty()).peekable();
        let mut node = &mut root;
        while let Some(part) = parts.next() {
            if parts.peek().is_some() {
                node = node.subdir(part);
            } else {
                node.set(part, None);
            }
        }
    }
    let mut out = String::from("<external_projection>\n${MEMORY_DIR}/\n");
    let mut prefix = String::new();
    render_external_dir(&mut root, &mut prefix, &mut out);
    out.push_str("</external_projection>");
    out
}

/// Append `dir`'s lines to `out`; `prefix` is the indentation drawn so far
/// (restored before returning).
fn render_external_dir(dir: &mut ExternalDir<'_>, prefix: &mut String, out: &mut String) {
    let dir = &mut dir.entries;
    dir.sort_by(|(a, av), (b, bv)| match (av.is_some(), bv.is_some()) {
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => locale_compare(a, b),
    });
    let count = dir.len();
    for (i, (name, child)) in dir.iter_mut().enumerate() {
        let last = i + 1 == count;
        out.push_str(prefix);
        out.push_str(if last { "└── " } else { "├── " });
        out.push_str(name);
        match child {
            Some(sub) => {
                out.push_str("/\n");
                let len = prefix.len();
                prefix.push_str(if last { "    " } else { "│   " });
                render_external_dir(sub, prefix, out);
                prefix.truncate(len);
            }
            None => out.push('\n'),
        }
    }
}

fn metadata_block(opts: &CompileOptions<'_>) -> String {
    [
        "<memory_metadata>".to_string(),
        format!("- AGENT_ID: {}", opts.agent_id),
        format!("- CONVERSATION_ID: {}", opts.conversation_id),
        format!(
            "- System prompt last recompiled: {}",
            crate::clock::prompt_metadata(opts.now)
        ),
        format!(
            "- {} previous messages between you and the user are stored in recall memory",
            opts.previous_message_count
        ),
        "</memory_metadata>".to_string(),
    ]
    .join("\n")
}

/// Put coreMemory into the raw prompt: replace every `{CORE_MEMORY}`, or
/// append it after a blank line. The replacement is literal.
pub(crate) fn inject_core_memory(system: &str, core_memory: &str) -> String {
    if system.contains(CORE_MEMORY_VARIABLE) {
        system.replace(CORE_MEMORY_VARIABLE, core_memory)
    } else {
        format!("{}\n\n{core_memory}", js_trim_end(system))
    }
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injection_is_literal() {
        assert_eq!(
            inject_core_memory("A {CORE_MEMORY} B", "$& $$ $` $'"),
            "A $& $$ $` $' B"
        );
        assert_eq!(
            inject_core_memory("X {CORE_MEMORY}{CORE_MEMORY}", "m"),
            "X mm"
        );
        assert_eq!(inject_core_memory("sys \n\t", "m"), "sys\n\nm");
        assert_eq!(inject_core_memory("", "m"), "\n\nm");
    }

    #[test]
    fn escaping_order() {
        assert_eq!(
            escape_xml_attribute(r#"R&D "q" it's <a> "#),
            "R&amp;D &quot;q&quot; it&#x27;s &lt;a&gt; "
        );
    }

    #[test]
    fn hash() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
