//! Integration tests of the MemFS commit validator against real git2
//! repositories (trees built with an in-memory index, commits on `main`).

// Test fixtures fail loudly on setup errors; that is what `expect` is for here.
#![allow(clippy::expect_used)]

use git2::{Index, IndexEntry, IndexTime, Repository, RepositoryInitOptions, Signature};
use mini_letta::memfs::validate::{
    Block, Policy, Rule, TreeSnapshot, ValidateError, ValidateOptions, audit, audit_revision,
    validate, validate_staged,
};
use tempfile::TempDir;

const REGULAR: u32 = 0o100644;
const EXECUTABLE: u32 = 0o100755;
const SYMLINK: u32 = 0o120000;

struct Fixture {
    _dir: TempDir,
    repo: Repository,
}

/// A tree description: (raw path, mode, content).
#[derive(Clone, Default)]
struct Files(Vec<(Vec<u8>, u32, Vec<u8>)>);

impl Files {
    fn file(self, path: &str, content: &str) -> Self {
        self.raw(path.as_bytes(), REGULAR, content.as_bytes())
    }
    fn mode(self, path: &str, mode: u32, content: &str) -> Self {
        self.raw(path.as_bytes(), mode, content.as_bytes())
    }
    fn raw(mut self, path: &[u8], mode: u32, content: &[u8]) -> Self {
        self.0.retain(|(p, _, _)| p != path);
        self.0.push((path.to_vec(), mode, content.to_vec()));
        self
    }
    fn remove(mut self, path: &str) -> Self {
        self.0.retain(|(p, _, _)| p != path.as_bytes());
        self
    }
}

fn mem(name: &str, description: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\n{body}")
}

/// A valid v2 tree: root index plus two core files.
fn base() -> Files {
    Files::default()
        .file("MEMORY.md", "# Memory\n")
        .file("persona.md", &mem("Persona", "Who I am", "I help.\n"))
        .file("human.md", &mem("Human", "Who you are", "A user.\n"))
}

fn config(json: serde_json::Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(&json).unwrap_or_default()
    )
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = RepositoryInitOptions::new();
        opts.initial_head("main");
        let repo = Repository::init_opts(dir.path(), &opts).expect("init");
        Fixture { _dir: dir, repo }
    }

    fn fill_index(&self, index: &mut Index, files: &Files) {
        index.clear().expect("clear");
        for (path, mode, data) in &files.0 {
            let id = self.repo.blob(data).expect("blob");
            let entry = IndexEntry {
                ctime: IndexTime::new(0, 0),
                mtime: IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: *mode,
                uid: 0,
                gid: 0,
                file_size: data.len() as u32,
                id,
                flags: path.len().min(0xfff) as u16,
                flags_extended: 0,
                path: path.clone(),
            };
            index.add(&entry).expect("index add");
        }
    }

    /// Write `files` as a real git tree and list it back.
    fn snapshot(&self, files: &Files) -> TreeSnapshot {
        let mut index = Index::new().expect("index");
        self.fill_index(&mut index, files);
        let oid = index.write_tree_to(&self.repo).expect("write tree");
        let tree = self.repo.find_tree(oid).expect("tree");
        TreeSnapshot::from_tree(&self.repo, &tree).expect("snapshot")
    }

    /// Replace the repository's staged index with `files`.
    fn stage(&self, files: &Files) {
        let mut index = self.repo.index().expect("repo index");
        self.fill_index(&mut index, files);
        index.write().expect("write index");
    }

    /// Commit the staged index on HEAD.
    fn commit(&self, message: &str) {
        let mut index = self.repo.index().expect("repo index");
        let oid = index.write_tree().expect("write tree");
        let tree = self.repo.find_tree(oid).expect("tree");
        let sig = Signature::now("Test", "test@example.com").expect("sig");
        let parent = self.repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        self.repo
            .commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
            .expect("commit");
    }

    fn check(
        &self,
        candidate: &Files,
        accepted: Option<&Files>,
        opts: &ValidateOptions,
    ) -> mini_letta::memfs::validate::Report {
        let candidate = self.snapshot(candidate);
        let accepted = accepted.map(|a| self.snapshot(a));
        validate(&self.repo, &candidate, accepted.as_ref(), opts).expect("validate")
    }
}

fn v2() -> ValidateOptions {
    ValidateOptions::new(Policy::RootMarker)
}

/// Validate a v2 candidate against an accepted tree and return the messages.
fn messages(candidate: &Files, accepted: &Files) -> Vec<String> {
    let fx = Fixture::new();
    let report = fx.check(candidate, Some(accepted), &v2());
    report.violations.into_iter().map(|v| v.message).collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------- basics

#[test]
fn valid_v2_tree_passes_with_empty_block() {
    let fx = Fixture::new();
    let report = fx.check(&base(), Some(&base()), &v2());
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(report.render_block(), "");
}

#[test]
fn first_commit_without_accepted_tree_is_validated() {
    let fx = Fixture::new();
    let report = fx.check(&base(), None, &v2());
    assert!(report.is_ok(), "{:?}", report.violations);
    let bad = base().file("persona.md", "no frontmatter\n");
    let report = fx.check(&bad, None, &v2());
    assert_eq!(
        report.messages(),
        ["persona.md: missing frontmatter (must start with ---)"]
    );
}

// ------------------------------------------------------- chapter 5 answers

#[test]
fn chapter5_deleting_archive_index_is_rejected() {
    let accepted = base()
        .file(
            "projects/MEMORY.md",
            "# Projects\n- [archive](archive/MEMORY.md)\n",
        )
        .file("projects/archive/MEMORY.md", "# Archive\n")
        .file(
            "projects/archive/old.md",
            &mem("Old", "Old project", "done\n"),
        );
    let candidate = accepted.clone().remove("projects/archive/MEMORY.md");
    assert!(messages(&accepted, &accepted).is_empty());
    assert_eq!(
        messages(&candidate, &accepted),
        strings(&["projects/archive/old.md: missing required index projects/archive/MEMORY.md"])
    );
}

#[test]
fn chapter5_depth_three_exceeds_default_max_depth() {
    let with_indexes = base()
        .file("a/MEMORY.md", "# A\n")
        .file("a/b/MEMORY.md", "# B\n")
        .file("a/b/c/MEMORY.md", "# C\n")
        .file("a/b/c/d.md", &mem("D", "Deep", "x\n"));
    assert_eq!(
        messages(&with_indexes, &base()),
        strings(&[
            "a/b/c/MEMORY.md: depth 3 exceeds maxDepth 2",
            "a/b/c/d.md: depth 3 exceeds maxDepth 2"
        ])
    );
    // Without indexes: the first missing index (only) plus the depth error.
    let bare = base().file("a/b/c/d.md", &mem("D", "Deep", "x\n"));
    assert_eq!(
        messages(&bare, &base()),
        strings(&[
            "a/b/c/d.md: missing required index a/MEMORY.md",
            "a/b/c/d.md: depth 3 exceeds maxDepth 2"
        ])
    );
}

#[test]
fn depth_uses_configured_max_depth_and_counts_indexes() {
    let cfg = config(serde_json::json!({"version": 1, "maxDepth": 1}));
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("reference/MEMORY.md", "# R\n")
        .file("reference/deep/MEMORY.md", "# D\n");
    assert_eq!(
        messages(&tree, &tree),
        strings(&["reference/deep/MEMORY.md: depth 2 exceeds maxDepth 1"])
    );
}

// ------------------------------------------------------------- indexes, skills

#[test]
fn index_required_then_frontmatter_then_unknown_key_while_skills_ignored() {
    let skill = "no frontmatter here\n";
    let step1 = base()
        .file("projects/notes.md", "plain\n")
        .file("skills/deploy/SKILL.md", skill);
    assert_eq!(
        messages(&step1, &base()),
        strings(&["projects/notes.md: missing required index projects/MEMORY.md"])
    );
    let step2 = step1.clone().file("projects/MEMORY.md", "# Projects\n");
    let fx = Fixture::new();
    let report = fx.check(&step2, Some(&base()), &v2());
    assert_eq!(report.block, Block::MemoryFiles);
    assert_eq!(
        report.messages(),
        ["projects/notes.md: missing frontmatter (must start with ---)"]
    );
    let step3 = step2.file(
        "projects/notes.md",
        "---\nname: N\ndescription: D\nextra: 1\n---\n",
    );
    assert_eq!(
        messages(&step3, &base()),
        strings(&[
            "projects/notes.md: unknown frontmatter key 'extra' (allowed: name description)"
        ])
    );
}

#[test]
fn flat_skill_file_is_rejected_and_folder_skill_allowed() {
    let flat = base().file("skills/deploy.md", "x\n");
    assert_eq!(
        messages(&flat, &base()),
        strings(&[
            "skills/deploy.md: invalid skill path (skills must be folders). Use skills/<name>/SKILL.md"
        ])
    );
    let folder = base()
        .file("skills/deploy/SKILL.md", "---\nname: deploy\n---\n")
        .file("skills/deploy/scripts/run.sh", "echo\n");
    assert!(messages(&folder, &base()).is_empty());
}

#[test]
fn unchanged_flat_skill_in_head_is_not_reported_by_the_staged_rule() {
    let accepted = base().file("skills/old.md", "x\n");
    assert!(messages(&accepted, &accepted).is_empty());
}

// ------------------------------------------------------------- frontmatter

fn frontmatter_messages(content: &str) -> Vec<String> {
    messages(&base().file("notes.md", content), &base())
}

#[test]
fn frontmatter_missing() {
    assert_eq!(
        frontmatter_messages("# no\n"),
        strings(&["notes.md: missing frontmatter (must start with ---)"])
    );
}

#[test]
fn frontmatter_crlf_counts_as_missing() {
    assert_eq!(
        frontmatter_messages("---\r\nname: a\r\ndescription: b\r\n---\r\n"),
        strings(&["notes.md: missing frontmatter (must start with ---)"])
    );
}

#[test]
fn frontmatter_unclosed() {
    assert_eq!(
        frontmatter_messages("---\nname: a\ndescription: b\n"),
        strings(&["notes.md: frontmatter opened but never closed (missing closing ---)"])
    );
}

#[test]
fn frontmatter_duplicate_and_empty_and_missing() {
    assert_eq!(
        frontmatter_messages("---\nname: a\nname: ''\n---\n"),
        strings(&[
            "notes.md: duplicate frontmatter key 'name'",
            "notes.md: 'name' must not be empty",
            "notes.md: missing required field 'description'",
        ])
    );
}

#[test]
fn frontmatter_quoted_values_are_accepted() {
    assert!(
        frontmatter_messages("---\nname: \"Notes\"\ndescription: \"Things\"\n---\n").is_empty()
    );
    assert_eq!(
        frontmatter_messages("---\nname: \"\"\ndescription: x\n---\n"),
        strings(&["notes.md: 'name' must not be empty"])
    );
}

#[test]
fn root_memory_index_must_not_have_frontmatter_and_block_text() {
    let fx = Fixture::new();
    let tree = base().file("MEMORY.md", "---\nname: x\n---\n");
    let report = fx.check(&tree, Some(&base()), &v2());
    assert_eq!(
        report.messages(),
        ["MEMORY.md: MEMORY.md must not have frontmatter"]
    );
    assert_eq!(
        report.render_block(),
        "Memory validation failed:\n\n  MEMORY.md: MEMORY.md must not have frontmatter\n"
    );
}

#[test]
fn frontmatter_errors_stop_before_constraints() {
    // The depth problem is not reported while a frontmatter error exists.
    let tree = base()
        .file("notes.md", "x\n")
        .file("a/MEMORY.md", "# a\n")
        .file("a/b/MEMORY.md", "# b\n")
        .file("a/b/c/MEMORY.md", "# c\n");
    assert_eq!(
        messages(&tree, &base()),
        strings(&["notes.md: missing frontmatter (must start with ---)"])
    );
}

#[test]
fn unprojected_files_skip_frontmatter_but_get_index_error() {
    let tree = base().file("loose/x.md", "no frontmatter\n");
    assert_eq!(
        messages(&tree, &base()),
        strings(&["loose/x.md: missing required index loose/MEMORY.md"])
    );
}

// ------------------------------------------------------- whole staged tree

#[test]
fn pre_existing_problem_blocks_an_unrelated_commit() {
    let accepted = base().file("big.md", &mem("Big", "Big", &"b".repeat(20_000)));
    let candidate = accepted
        .clone()
        .file("human.md", &mem("Human", "Who you are", "Changed.\n"));
    let n = mem("Big", "Big", &"b".repeat(20_000)).chars().count();
    assert_eq!(
        messages(&candidate, &accepted),
        vec![format!(
            "big.md: {n} characters exceeds 20000 from maxFileCharacters"
        )]
    );
}

#[test]
fn staged_index_is_validated_not_the_working_tree() {
    let fx = Fixture::new();
    fx.stage(&base());
    // A broken working-tree file that is not staged must not matter.
    let workdir = fx.repo.workdir().expect("workdir").to_path_buf();
    std::fs::write(workdir.join("persona.md"), "broken\n").expect("write");
    let report = validate_staged(&fx.repo, &v2()).expect("validate");
    assert!(report.is_ok(), "{:?}", report.violations);
    fx.commit("seed");
    fx.stage(&base().file("persona.md", "broken\n"));
    let report = validate_staged(&fx.repo, &v2()).expect("validate");
    assert_eq!(
        report.messages(),
        ["persona.md: missing frontmatter (must start with ---)"]
    );
}

// ------------------------------------------------------- sizes and budgets

#[test]
fn default_file_limit_with_full_report_block() {
    let fx = Fixture::new();
    let content = mem("Persona", "Who I am", &"p".repeat(20_000));
    let n = content.chars().count();
    let tree = base().file("persona.md", &content);
    let report = fx.check(&tree, Some(&base()), &v2());
    assert_eq!(report.block, Block::Constraints);
    let expected = format!(
        "Memory validation blocked this commit.\n\
         No files were committed. Your staged changes are still present.\n\
         Validation checks the complete repository, so these problems may predate your staged changes.\n\
         \n\
         Fix these problems:\n  \
         persona.md: {n} characters exceeds 20000 from maxFileCharacters\n\
         \n\
         Move non-core detail out of root Markdown and behind MEMORY.md indexes.\n\
         Split files above their per-file limit, then retry the commit.\n\
         Limits come from .memfs.config.json, or the Letta Code defaults when it is absent.\n\
         Do not raise or disable these limits unless the user explicitly approves it.\n"
    );
    assert_eq!(report.render_block(), expected);
    assert_eq!(report.violations[0].rule, Rule::FileCharacters);
}

#[test]
fn first_matching_glob_override_wins_and_null_removes_limit() {
    let cfg = config(serde_json::json!({
        "version": 1,
        "maxFileCharacters": 60,
        "fileCharacterLimits": [
            {"pattern": "notes/**", "maxCharacters": 70},
            {"pattern": "archive/**/*.md", "maxCharacters": null},
            {"pattern": "notes/big.md", "maxCharacters": 1}
        ]
    }));
    let long = mem("N", "D", &"n".repeat(60));
    let n = long.chars().count();
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("notes/MEMORY.md", "# Notes\n")
        .file("notes/big.md", &long)
        .file("archive/MEMORY.md", "# Archive\n")
        .file("archive/huge.md", &mem("H", "D", &"h".repeat(5_000)))
        .file("other.md", &long);
    assert_eq!(
        messages(&tree, &tree),
        vec![
            format!("notes/big.md: {n} characters exceeds 70 from glob 'notes/**'"),
            format!("other.md: {n} characters exceeds 60 from maxFileCharacters"),
        ]
    );
}

#[test]
fn core_budget_counts_root_files_including_memory_md_but_not_children() {
    let cfg = config(serde_json::json!({"version": 1, "maxCoreMemoryCharacters": 100}));
    let persona = mem("Persona", "Who", &"x".repeat(80));
    let tree = Files::default()
        .file(".memfs.config.json", &cfg)
        .file("MEMORY.md", "# Memory\n")
        .file("persona.md", &persona)
        .file("projects/MEMORY.md", &"c".repeat(500))
        .file("projects/p.md", &mem("P", "D", &"c".repeat(500)));
    let total = "# Memory\n".chars().count() + persona.chars().count();
    assert!(total > 100);
    assert_eq!(
        messages(&tree, &tree),
        vec![format!(
            "core memory: {total} characters exceeds 100 from maxCoreMemoryCharacters"
        )]
    );
}

#[test]
fn old_v2_config_gets_default_core_budget() {
    let cfg = config(serde_json::json!({"version": 1, "maxFileCharacters": 100000}));
    let big = mem("Big", "D", &"b".repeat(70_000));
    let tree = base().file(".memfs.config.json", &cfg).file("big.md", &big);
    let total: usize = [
        "# Memory\n".to_string(),
        mem("Persona", "Who I am", "I help.\n"),
        mem("Human", "Who you are", "A user.\n"),
        big,
    ]
    .iter()
    .map(|s| s.chars().count())
    .sum();
    assert_eq!(
        messages(&tree, &tree),
        vec![format!(
            "core memory: {total} characters exceeds 65536 from maxCoreMemoryCharacters"
        )]
    );
}

#[test]
fn characters_are_code_points_not_bytes() {
    let cfg = config(serde_json::json!({"version": 1, "maxFileCharacters": 60}));
    // 31 characters of frontmatter + 20 emoji: 111 bytes but 51 code points.
    let ok = mem("E", "D", &"😀".repeat(20));
    assert!(ok.len() > 60 && ok.chars().count() <= 60);
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("emoji.md", &ok);
    assert!(messages(&tree, &tree).is_empty());
    let over = mem("E", "D", &"😀".repeat(40));
    let n = over.chars().count();
    let tree = tree.file("emoji.md", &over);
    assert_eq!(
        messages(&tree, &tree),
        vec![format!(
            "emoji.md: {n} characters exceeds 60 from maxFileCharacters"
        )]
    );
}

#[test]
fn root_marker_deletion_keeps_v2_constraints() {
    let cfg = config(serde_json::json!({"version": 1, "maxFileCharacters": 80}));
    let accepted = base().file(".memfs.config.json", &cfg);
    let grown = mem("Persona", "Who I am", &"p".repeat(100));
    let n = grown.chars().count();
    let candidate = accepted
        .clone()
        .remove("MEMORY.md")
        .file("persona.md", &grown);
    assert_eq!(
        messages(&candidate, &accepted),
        vec![
            "MEMORY.md: root memory index is required for MemFS v2".to_string(),
            format!("persona.md: {n} characters exceeds 80 from maxFileCharacters"),
        ]
    );
}

#[test]
fn large_file_over_one_mib_is_counted_when_byte_limit_is_off() {
    let fx = Fixture::new();
    let cfg = config(
        serde_json::json!({"version": 1, "maxFileCharacters": 2000000, "maxCoreMemoryCharacters": 2000000}),
    );
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("MEMORY.md", &"m".repeat(1_100_000));
    let report = fx.check(
        &tree,
        Some(&tree),
        &ValidateOptions::letta_parity(Policy::RootMarker),
    );
    assert!(report.is_ok(), "{:?}", report.violations);
}

// ------------------------------------------------------------ regular files

#[test]
fn symlinked_memory_markdown_is_rejected() {
    let tree = base().mode("MEMORY.md", SYMLINK, "huge.txt");
    assert_eq!(
        messages(&tree, &base()),
        strings(&["MEMORY.md: memory Markdown must be a regular file"])
    );
    let tree = base().mode("persona.md", SYMLINK, "/etc/passwd");
    assert_eq!(
        messages(&tree, &base()),
        strings(&["persona.md: memory Markdown must be a regular file"])
    );
}

// ------------------------------------------------------------ readOnlyFiles

fn read_only_accepted() -> Files {
    let cfg = config(
        serde_json::json!({"version": 1, "readOnlyFiles": ["persona.md", "assets/*.txt", "new.md"]}),
    );
    base()
        .file(".memfs.config.json", &cfg)
        .file("assets/logo.txt", "logo\n")
}

const READ_ONLY: &str = "read-only file cannot be created, changed or removed";

#[test]
fn read_only_unchanged_passes() {
    assert!(messages(&read_only_accepted(), &read_only_accepted()).is_empty());
}

#[test]
fn read_only_change_is_rejected() {
    let candidate =
        read_only_accepted().file("persona.md", &mem("Persona", "Who I am", "Rewritten.\n"));
    assert_eq!(
        messages(&candidate, &read_only_accepted()),
        vec![format!("persona.md: {READ_ONLY}")]
    );
}

#[test]
fn read_only_removal_is_rejected() {
    let candidate = read_only_accepted().remove("persona.md");
    assert_eq!(
        messages(&candidate, &read_only_accepted()),
        vec![format!("persona.md: {READ_ONLY}")]
    );
}

#[test]
fn read_only_creation_is_rejected() {
    let candidate = read_only_accepted().file("new.md", &mem("New", "New", "x\n"));
    assert_eq!(
        messages(&candidate, &read_only_accepted()),
        vec![format!("new.md: {READ_ONLY}")]
    );
}

#[test]
fn read_only_mode_change_on_non_markdown_is_rejected() {
    let candidate = read_only_accepted().mode("assets/logo.txt", EXECUTABLE, "logo\n");
    assert_eq!(
        messages(&candidate, &read_only_accepted()),
        vec![format!("assets/logo.txt: {READ_ONLY}")]
    );
}

#[test]
fn read_only_rename_reports_removed_then_created() {
    let cfg = config(serde_json::json!({"version": 1, "readOnlyFiles": ["*.md"]}));
    let accepted = base().file(".memfs.config.json", &cfg);
    let persona = mem("Persona", "Who I am", "I help.\n");
    let candidate = accepted
        .clone()
        .remove("persona.md")
        .file("soul.md", &persona);
    assert_eq!(
        messages(&candidate, &accepted),
        vec![
            format!("persona.md: {READ_ONLY}"),
            format!("soul.md: {READ_ONLY}")
        ]
    );
}

#[test]
fn read_only_without_accepted_tree_is_an_error() {
    let fx = Fixture::new();
    let candidate = fx.snapshot(&read_only_accepted());
    let err =
        validate(&fx.repo, &candidate, None, &v2().with_approval(true)).expect_err("must fail");
    assert!(matches!(err, ValidateError::MissingAcceptedTree));
    assert_eq!(
        err.render(),
        "Memory constraints failed:\n  readOnlyFiles requires the accepted memory tree\n"
    );
}

// ------------------------------------------------------ config protection

const PROTECTED: &str = ".memfs.config.json is protected and requires human approval to change";

#[test]
fn config_edit_without_approval_is_rejected_and_stops_tree_checks() {
    let fx = Fixture::new();
    let accepted = base().file(
        ".memfs.config.json",
        &config(serde_json::json!({"version": 1})),
    );
    // The new config would also produce a depth error; it must not be reached.
    let candidate = accepted
        .clone()
        .file(
            ".memfs.config.json",
            &config(serde_json::json!({"version": 1, "maxDepth": 0})),
        )
        .file("p/MEMORY.md", "# p\n");
    let report = fx.check(&candidate, Some(&accepted), &v2());
    assert_eq!(report.messages(), [PROTECTED]);
    assert_eq!(report.violations[0].rule, Rule::ConfigProtected);
    // With approval the edit is accepted and the new limits apply.
    let report = fx.check(&candidate, Some(&accepted), &v2().with_approval(true));
    assert_eq!(
        report.messages(),
        ["p/MEMORY.md: depth 1 exceeds maxDepth 0"]
    );
}

#[test]
fn config_creation_and_deletion_need_approval() {
    let with_cfg = base().file(
        ".memfs.config.json",
        &config(serde_json::json!({"version": 1})),
    );
    assert_eq!(messages(&with_cfg, &base()), strings(&[PROTECTED]));
    assert_eq!(messages(&base(), &with_cfg), strings(&[PROTECTED]));
    let fx = Fixture::new();
    assert!(
        fx.check(&with_cfg, Some(&base()), &v2().with_approval(true))
            .is_ok()
    );
    assert!(
        fx.check(&base(), Some(&with_cfg), &v2().with_approval(true))
            .is_ok()
    );
}

#[test]
fn approved_but_invalid_config_is_rejected() {
    let fx = Fixture::new();
    let bad = base().file(
        ".memfs.config.json",
        &config(serde_json::json!({
            "version": 2,
            "bogus": true,
            "readOnlyFiles": ["a/**b"],
            "secretScanAllow": "notes/*",
            "fileCharacterLimits": [{"pattern": "/abs", "maxCharacters": 0, "x": 1}, 5]
        })),
    );
    let report = fx.check(&bad, Some(&base()), &v2().with_approval(true));
    assert_eq!(
        report.messages(),
        [
            ".memfs.config.json: unknown field 'bogus'",
            ".memfs.config.json: version must be 1",
            ".memfs.config.json: readOnlyFiles[0]: '**' must be a complete path segment",
            ".memfs.config.json: fileCharacterLimits[0]: unknown field 'x'",
            ".memfs.config.json: fileCharacterLimits[0]: pattern must be a non-empty repo-relative glob using '/'",
            ".memfs.config.json: fileCharacterLimits[0]: maxCharacters must be a positive integer or null",
            ".memfs.config.json: fileCharacterLimits[1] must be an object",
            ".memfs.config.json: secretScanAllow must be an array",
        ]
    );
}

#[test]
fn unapproved_invalid_config_reports_approval_and_parse_errors() {
    let bad = base().file(".memfs.config.json", "{not json");
    let msgs = messages(&bad, &base());
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0], PROTECTED);
    assert!(
        msgs[1].starts_with(".memfs.config.json: invalid JSON ("),
        "{}",
        msgs[1]
    );
}

#[test]
fn non_object_config_and_symlinked_config() {
    let arr = base().file(".memfs.config.json", "[1]");
    assert_eq!(
        messages(&arr, &arr),
        strings(&[".memfs.config.json: expected a JSON object"])
    );
    let link = base().mode(".memfs.config.json", SYMLINK, "elsewhere.json");
    assert_eq!(
        messages(&link, &link),
        strings(&[".memfs.config.json: constraint config must be a regular file"])
    );
}

// ------------------------------------------------------------- formatting

#[test]
fn formatting_rules_report_without_rewriting() {
    let cfg = config(serde_json::json!({
        "version": 1,
        "formatting": {"lineEndings": "lf", "finalNewline": true, "trailingWhitespace": true}
    }));
    let body = "hard break  \ntrailing \n```\ncode   \n```\n";
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("notes.md", &mem("N", "D", body));
    assert_eq!(
        messages(&tree, &tree),
        strings(&["notes.md:6: formatting disallows trailing whitespace"])
    );
    let tree = tree.file("notes.md", &format!("{}x", mem("N", "D", "a\r\n")));
    assert_eq!(
        messages(&tree, &tree),
        strings(&[
            "notes.md: formatting requires LF line endings",
            "notes.md: formatting requires a final newline"
        ])
    );
}

// ------------------------------------------------------------ byte limit [B]

#[test]
fn one_mib_byte_limit() {
    let exact = "a".repeat(1_048_576);
    let over = "a".repeat(1_048_577);
    let cfg = config(
        serde_json::json!({"version": 1, "maxFileCharacters": 5000000, "maxCoreMemoryCharacters": 5000000}),
    );
    let ok = base()
        .file(".memfs.config.json", &cfg)
        .file("data/blob.bin", &exact);
    assert!(messages(&ok, &ok).is_empty());
    let bad = ok.clone().file("data/blob.bin", &over);
    assert_eq!(
        messages(&bad, &ok),
        strings(&["data/blob.bin: 1048577 bytes exceeds the 1048576-byte file limit"])
    );
    // Switchable, and it applies without a config or root marker too.
    let fx = Fixture::new();
    assert!(
        fx.check(
            &bad,
            Some(&ok),
            &ValidateOptions::letta_parity(Policy::RootMarker)
        )
        .is_ok()
    );
    let legacy = Files::default().file("notes.txt", &over);
    let report = fx.check(&legacy, None, &ValidateOptions::new(Policy::LegacyOnly));
    assert_eq!(
        report.messages(),
        ["notes.txt: 1048577 bytes exceeds the 1048576-byte file limit"]
    );
    assert_eq!(report.violations[0].rule, Rule::FileBytes);
}

// ------------------------------------------------------------ secrets [B]

fn secret_messages(text: &str) -> Vec<String> {
    let tree = base().file("notes.txt", &format!("intro\n{text}\n"));
    messages(&tree, &base())
}

fn expect_secret(text: &str, kind: &str) {
    assert_eq!(
        secret_messages(text),
        vec![format!(
            "notes.txt:2: possible secret ({kind}); remove it or add the path to secretScanAllow in .memfs.config.json"
        )],
        "input: {text}"
    );
}

#[test]
fn secret_private_key_block() {
    expect_secret(
        &format!("-----BEGIN RSA {}-----", "PRIVATE KEY"),
        "private key block",
    );
    expect_secret(
        &format!("-----BEGIN OPENSSH {}-----", "PRIVATE KEY"),
        "private key block",
    );
    expect_secret(
        &format!("-----BEGIN {}-----", "PRIVATE KEY"),
        "private key block",
    );
}

#[test]
fn secret_aws_access_key() {
    expect_secret(
        &format!("aws_key = {}{}", "AKIA", "IOSFODNN7EXAMPLE"),
        "AWS access key ID",
    );
    expect_secret(
        &format!("{}{}", "ASIA", "ABCDEFGHIJKLMNOP"),
        "AWS access key ID",
    );
}

#[test]
fn secret_google_api_key() {
    expect_secret(
        &format!("key={}{}", "AIza", "SyA-abcdefghijklmnopqrstuvwxyz01234"),
        "Google API key",
    );
}

#[test]
fn secret_sk_key() {
    expect_secret(
        &format!("OPENAI_API_KEY={}{}", "sk-", "proj-A1b2C3d4E5f6G7h8I9j0"),
        "sk- API key",
    );
    expect_secret(
        &format!("{}{}", "sk-", "ant-api03-abcdefghij0123456789"),
        "sk- API key",
    );
}

#[test]
fn secret_github_tokens() {
    expect_secret(
        &format!("token: {}{}", "ghp_", "a".repeat(30) + "123456"),
        "GitHub token",
    );
    expect_secret(
        &format!("{}{}", "github_pat_", "11ABCDEFG0123456789_abcdefghij"),
        "GitHub token",
    );
}

#[test]
fn secret_slack_token() {
    expect_secret(
        &format!("{}{}", "xoxb-", "123456789012-abcdefghij"),
        "Slack token",
    );
}

#[test]
fn secret_jwt() {
    expect_secret(
        &format!(
            "Authorization: Bearer {}.{}.{}",
            "eyJhbGciOiJIUzI1NiJ9", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", "dBjftJeZ4CVPmB92K27uhbUJU1p1r"
        ),
        "JWT",
    );
}

#[test]
fn secret_lookalike_prose_is_not_flagged() {
    assert!(
        secret_messages("the sk-learn-compatible-estimator and task-oriented-design-document")
            .is_empty()
    );
    assert!(secret_messages("-----BEGIN PUBLIC KEY-----").is_empty());
    assert!(secret_messages("AKIA alone, ghp_short, xoxb-nodigitshere").is_empty());
}

#[test]
fn secret_scan_covers_memory_markdown_and_reports_line() {
    let body = format!("line\nline\n{}{}\n", "AKIA", "IOSFODNN7EXAMPLE");
    let tree = base().file("persona.md", &mem("Persona", "Who I am", &body));
    assert_eq!(
        messages(&tree, &base()),
        strings(&[
            "persona.md:7: possible secret (AWS access key ID); remove it or add the path to secretScanAllow in .memfs.config.json"
        ])
    );
}

#[test]
fn secret_scan_allow_list_lets_path_pass() {
    let cfg = config(serde_json::json!({"version": 1, "secretScanAllow": ["fixtures/**"]}));
    let key = format!("{}{}\n", "AKIA", "IOSFODNN7EXAMPLE");
    let tree = base()
        .file(".memfs.config.json", &cfg)
        .file("fixtures/keys/aws.txt", &key);
    assert!(messages(&tree, &tree).is_empty());
    // The same content outside the allow-listed glob is caught.
    let tree = tree.file("notes.txt", &key);
    assert_eq!(
        messages(&tree, &tree),
        strings(&[
            "notes.txt:1: possible secret (AWS access key ID); remove it or add the path to secretScanAllow in .memfs.config.json"
        ])
    );
}

#[test]
fn adding_a_path_to_secret_scan_allow_needs_approval() {
    let accepted = base().file(
        ".memfs.config.json",
        &config(serde_json::json!({"version": 1})),
    );
    let key = format!("{}{}\n", "AKIA", "IOSFODNN7EXAMPLE");
    let candidate = accepted
        .clone()
        .file(
            ".memfs.config.json",
            &config(serde_json::json!({"version": 1, "secretScanAllow": ["notes.txt"]})),
        )
        .file("notes.txt", &key);
    assert_eq!(messages(&candidate, &accepted), strings(&[PROTECTED]));
}

#[test]
fn secret_split_across_two_commits_is_caught_on_the_second() {
    let fx = Fixture::new();
    fx.stage(&base());
    fx.commit("seed");
    // First half: no complete token yet.
    let first = base().file("notes.txt", "key: AKIAIOSF\n");
    fx.stage(&first);
    let report = validate_staged(&fx.repo, &v2()).expect("validate");
    assert!(report.is_ok(), "{:?}", report.violations);
    fx.commit("first half");
    // Second half completes it on the same line.
    let second = base().file("notes.txt", &format!("key: AKIAIOSF{}\n", "ODNN7EXAMPLE"));
    fx.stage(&second);
    let report = validate_staged(&fx.repo, &v2()).expect("validate");
    assert_eq!(
        report.messages(),
        [
            "notes.txt:1: possible secret (AWS access key ID); remove it or add the path to secretScanAllow in .memfs.config.json"
        ]
    );
    assert_eq!(report.violations[0].rule, Rule::Secret);
}

#[test]
fn secret_scan_can_be_switched_off() {
    let fx = Fixture::new();
    let tree = base().file("notes.txt", &format!("{}{}\n", "AKIA", "IOSFODNN7EXAMPLE"));
    let mut opts = v2();
    opts.secret_scan = false;
    assert!(fx.check(&tree, Some(&base()), &opts).is_ok());
}

// ------------------------------------------------------------ UTF-8 [B]

#[test]
fn non_utf8_path_is_a_clear_violation() {
    let fx = Fixture::new();
    let tree = base().raw(b"notes/\xffbad.md", REGULAR, b"x\n");
    let report = fx.check(&tree, Some(&base()), &v2());
    assert_eq!(
        report.messages(),
        ["notes/\\xffbad.md: path is not valid UTF-8"]
    );
    assert_eq!(report.violations[0].rule, Rule::NonUtf8Path);
}

#[test]
fn non_utf8_memory_content_is_a_clear_violation() {
    let fx = Fixture::new();
    let mut content = mem("Persona", "Who I am", "").into_bytes();
    content.extend_from_slice(b"caf\xe9\n");
    let tree = base().raw(b"persona.md", REGULAR, &content);
    let report = fx.check(&tree, Some(&base()), &v2());
    assert_eq!(
        report.messages(),
        ["persona.md: memory Markdown must be valid UTF-8 text"]
    );
}

// ------------------------------------------------------------ policies

#[test]
fn legacy_policy_frontmatter_block() {
    let fx = Fixture::new();
    let legacy = ValidateOptions::new(Policy::LegacyOnly);
    let accepted = Files::default().file(
        "system/persona.md",
        "---\ndescription: me\nread_only: true\n---\nx\n",
    );
    let candidate = accepted
        .clone()
        .file(
            "system/persona.md",
            "---\ndescription: me\nread_only: true\n---\nchanged\n",
        )
        .file("reference/new.md", "---\ndescription:\n---\n")
        .file(
            "notes/free.md",
            "no frontmatter needed outside system/reference\n",
        );
    let report = fx.check(&candidate, Some(&accepted), &legacy);
    assert_eq!(report.block, Block::LegacyFrontmatter);
    assert_eq!(
        report.render_block(),
        "Frontmatter validation failed:\n\n  \
         reference/new.md: 'description' must not be empty\n  \
         system/persona.md: file is read_only and cannot be modified\n"
    );
}

#[test]
fn legacy_policy_enforces_config_file_limit_under_system() {
    let cfg = config(serde_json::json!({"version": 1, "maxFileCharacters": 20}));
    let content = "---\ndescription: d\n---\nxxxxxxxxxxxx\n";
    let tree = Files::default()
        .file(".memfs.config.json", &cfg)
        .file("system/a.md", content)
        .file("notes.md", &"z".repeat(100));
    let fx = Fixture::new();
    let report = fx.check(
        &tree,
        Some(&tree),
        &ValidateOptions::new(Policy::LegacyOnly),
    );
    let n = content.chars().count();
    assert_eq!(
        report.messages(),
        [format!(
            "system/a.md: {n} characters exceeds 20 from maxFileCharacters"
        )]
    );
    // Legacy reports omit the root-marker guidance line.
    assert!(!report.render_block().contains("Move non-core detail"));
}

#[test]
fn shared_memory_requires_name_and_description_without_root_marker() {
    let fx = Fixture::new();
    let tree = Files::default().file("team/notes.md", "---\ndescription: d\n---\n");
    let report = fx.check(&tree, None, &ValidateOptions::new(Policy::SharedMemory));
    assert_eq!(report.block, Block::MemoryFiles);
    assert_eq!(
        report.messages(),
        ["team/notes.md: missing required field 'name'"]
    );
}

#[test]
fn markerless_root_marker_repo_stays_on_legacy_rules() {
    let fx = Fixture::new();
    let tree = Files::default()
        .file("notes.md", "no frontmatter\n")
        .file("system/a.md", "bad\n");
    let report = fx.check(&tree, None, &v2());
    assert_eq!(report.block, Block::LegacyFrontmatter);
    assert_eq!(
        report.messages(),
        ["system/a.md: missing frontmatter (must start with ---)"]
    );
}

// ------------------------------------------------------------ audit

#[test]
fn audit_reports_committed_problems_without_staged_sentence() {
    let fx = Fixture::new();
    let tree = base().file("a/b/c/d.md", &mem("D", "D", "x\n"));
    fx.stage(&tree);
    fx.commit("bad history");
    let report = audit_revision(&fx.repo, "HEAD", &ValidateOptions::default()).expect("audit");
    assert_eq!(report.policy, Policy::RootMarker);
    assert_eq!(
        report.render_audit(),
        "Memory constraints failed:\n  \
         a/b/c/d.md: missing required index a/MEMORY.md\n  \
         a/b/c/d.md: depth 3 exceeds maxDepth 2\n"
    );
    assert!(!report.render_audit().contains("staged changes"));
}

#[test]
fn audit_judges_a_revision_by_its_own_config_without_approval() {
    let fx = Fixture::new();
    let strict = config(serde_json::json!({"version": 1, "maxFileCharacters": 30}));
    let v1 = base().file(".memfs.config.json", &strict);
    fx.stage(&v1);
    fx.commit("strict");
    let loose = config(serde_json::json!({"version": 1, "maxFileCharacters": 100000}));
    fx.stage(&v1.clone().file(".memfs.config.json", &loose));
    fx.commit("loosen (approved)");
    let head = audit_revision(&fx.repo, "HEAD", &ValidateOptions::default()).expect("audit");
    assert!(head.is_ok(), "{:?}", head.violations);
    let parent = audit_revision(&fx.repo, "HEAD~1", &ValidateOptions::default()).expect("audit");
    let n = mem("Persona", "Who I am", "I help.\n").chars().count();
    let m = mem("Human", "Who you are", "A user.\n").chars().count();
    assert_eq!(
        parent.messages(),
        [
            format!("human.md: {m} characters exceeds 30 from maxFileCharacters"),
            format!("persona.md: {n} characters exceeds 30 from maxFileCharacters"),
        ]
    );
    // Direct audit of a snapshot gives the same result.
    let snap = TreeSnapshot::from_revision(&fx.repo, "HEAD~1").expect("snap");
    let again = audit(&fx.repo, &snap, &ValidateOptions::default()).expect("audit");
    assert_eq!(again.messages(), parent.messages());
}

#[test]
fn read_error_renders_the_hook_message() {
    let fx = Fixture::new();
    let mut candidate = fx.snapshot(&base());
    // An entry whose blob does not exist in the object database.
    let missing = git2::Oid::from_str("1111111111111111111111111111111111111111").expect("oid");
    candidate.insert(
        "notes.md",
        mini_letta::memfs::validate::Entry::new(REGULAR, missing),
    );
    let err = validate(&fx.repo, &candidate, None, &v2()).expect_err("must fail");
    assert_eq!(
        err.render(),
        "Memory validation could not read Git contents. No files were committed.\n"
    );
}
