//! The system-prompt compiler against real git repositories: the book's
//! golden output, letta-code's memfs-v1 rendering, the edge cases of
//! spec/compiler.md §11, and the letta-code bugs we deliberately fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestRepo;
use mini_letta::memfs::compiler::{CompileOptions, CompiledPrompt, compile_dir};
use mini_letta::memfs::layout::MemoryFormat;
use time::macros::datetime;

fn opts(system: &str) -> CompileOptions<'_> {
    CompileOptions {
        agent_id: "agent-demo",
        conversation_id: "c",
        system,
        now: datetime!(2026-05-04 00:00:00 UTC),
        previous_message_count: 0,
    }
}

fn compile(r: &TestRepo) -> CompiledPrompt {
    compile_dir(r.path(), &opts("SYSTEM {CORE_MEMORY}")).unwrap()
}

/// The repository of the book's §8.6 differential test.
fn book_repo() -> TestRepo {
    TestRepo::with_files(&[
        (
            "MEMORY.md",
            "# Memory\n\n- [persona](persona.md) — Who I am and how I behave.\n- [human](human.md) — What I know about the user.\n- [projects](projects/MEMORY.md) — project notes, read on demand\n",
        ),
        (
            "human.md",
            "---\nname: Human\ndescription: What I know about the user.\n---\n\n- 我叫小陆，主要写 TypeScript\n- 我更喜欢用 tabs 缩进\n",
        ),
        (
            "persona.md",
            "---\nname: Persona\ndescription: Who I am and how I behave.\n---\nI am mini-letta, a helpful assistant that remembers.\n- 回答末尾总是加上 🦉\n",
        ),
        (
            "projects/MEMORY.md",
            "# Projects\n\n- [mini-letta](mini-letta.md)\n",
        ),
        (
            "projects/mini-letta.md",
            "---\nname: Mini Letta\ndescription: The project.\n---\nA Rust port. SECRET-ON-DEMAND-TEXT\n",
        ),
        (
            "skills/release-notes/SKILL.md",
            "---\nname: release-notes\ndescription: Write release notes.\n---\nSKILL-BODY-TEXT\n",
        ),
    ])
}

#[test]
fn book_8_6_golden_599_bytes() {
    let golden = include_str!("golden/book-8-6.txt");
    assert_eq!(golden.len(), 599);
    // The golden file is the book's text; check it against the seed when the
    // shared directory sits beside the checkout.
    let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/seeds/000_f31d9c8bd29b81d3.txt");
    if let Ok(text) = std::fs::read_to_string(&seed) {
        assert!(
            text.contains(golden),
            "golden file drifted from the seed text"
        );
    } else {
        eprintln!(
            "note: {} not found; golden file checked by length only",
            seed.display()
        );
    }
    let r = book_repo();
    let out = compile(&r);
    assert_eq!(out.core_memory, golden);
    assert_eq!(out.core_memory.len(), 599);
    assert_eq!(out.memory_format, MemoryFormat::V2);
    assert_eq!(out.content, format!("SYSTEM {golden}"));
    let head = r
        .repo
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    assert_eq!(out.memfs_revision.as_deref(), Some(head.as_str()));
    assert_eq!(out.compiled_at, "2026-05-04T00:00:00.000Z");
    // sha256("SYSTEM {CORE_MEMORY}")
    assert_eq!(out.raw_system_hash.len(), 64);
    assert_eq!(
        out.raw_system_hash,
        mini_letta::memfs::compiler::sha256_hex(b"SYSTEM {CORE_MEMORY}")
    );
}

#[test]
fn book_8_5_unit_expectation() {
    let r = TestRepo::with_files(&[
        (
            "human.md",
            "---\nname: Human\ndescription: The user\n---\n- likes pnpm\n",
        ),
        ("MEMORY.md", "# Memory\n- [projects](projects/MEMORY.md)\n"),
        ("projects/MEMORY.md", "# Projects\n"),
    ]);
    let expected = [
        "<human>",
        "<description>The user</description>",
        "- likes pnpm",
        "</human>",
        "",
        "<memory>",
        "# Memory",
        "- [projects](projects/MEMORY.md)",
        "<deferred-memory>",
        "<directory path=\"projects/\" index=\"projects/MEMORY.md\" />",
        "</deferred-memory>",
        "</memory>",
    ]
    .join("\n");
    assert_eq!(compile(&r).core_memory, expected);
}

/// Many v2 edge cases in one repository; the expected text was written by
/// hand from the rules of spec/compiler.md §5B and §8.
#[test]
fn v2_edge_cases() {
    let r = TestRepo::with_files(&[
        ("MEMORY.md", "\u{FEFF}# Memory\r\n\r\n- idx\r\n\r\n"),
        (
            "human.md",
            "\u{FEFF}---\r\nname: Human\r\ndescription:  Ünïcödé — 说明 🦉 \r\n---\r\n\r\n\r\n- a\r\n\r\n- b\r\n\r\n",
        ),
        ("cr.md", "---\rname: Cr\rdescription: cr only\r---\rx\ry\r"),
        (
            "empty.md",
            "---\nname: Empty\ndescription: nothing here\n---\n",
        ),
        ("blank.md", "\n\n  text  \n\n"),
        (
            "日本語.md",
            "---\nname: J\ndescription: 日本\n---\nこんにちは\n",
        ),
        ("🦉.md", "---\nname: Owl\ndescription: owl\n---\nhoot\n"),
        ("apple.md", "---\nname: A\ndescription: a\n---\n"),
        ("Banana.md", "---\nname: B\ndescription: b\n---\n"),
        ("x1.md", "1"),
        ("x10.md", "10"),
        ("x9.md", "9"),
        ("PROJECT-MEMORY.md", "---\nname: P\ndescription: p\n---\np"),
        ("a-b/MEMORY.md", "never shown A-B"),
        ("a/MEMORY.md", "never shown A"),
        ("ab/MEMORY.md", "never shown AB"),
        ("R&D \"q\" it's <x> y/MEMORY.md", "never shown RD"),
        ("Skills/MEMORY.md", "never shown Skills"),
        ("skills/MEMORY.md", "never shown skills"),
        ("skills/s/SKILL.md", "never shown skill"),
        ("deep/MEMORY.md", "never shown deep"),
        ("deep/sub/MEMORY.md", "never shown sub"),
        ("deep/sub/more/MEMORY.md", "never shown more"),
        ("deep/sub/more/x.md", "never shown x"),
        ("noindex/file.md", "never shown noindex"),
        ("notes.txt", "never shown txt"),
        ("README.markdown", "never shown markdown"),
        ("old.md.bak", "never shown bak"),
    ]);
    let expected = "\
<🦉>
<description>owl</description>
hoot
</🦉>

<apple>
<description>a</description>
</apple>

<Banana>
<description>b</description>
</Banana>

<blank>


  text
</blank>

<cr>
<description>cr only</description>
x
y
</cr>

<empty>
<description>nothing here</description>
</empty>

<human>
<description>Ünïcödé — 说明 🦉</description>
- a

- b
</human>

<PROJECT-MEMORY>
<description>p</description>
p
</PROJECT-MEMORY>

<x1>
1
</x1>

<x10>
10
</x10>

<x9>
9
</x9>

<日本語>
<description>日本</description>
こんにちは
</日本語>

<memory>
# Memory

- idx
<deferred-memory>
<directory path=\"a-b/\" index=\"a-b/MEMORY.md\" />
<directory path=\"a/\" index=\"a/MEMORY.md\" />
<directory path=\"ab/\" index=\"ab/MEMORY.md\" />
<directory path=\"deep/\" index=\"deep/MEMORY.md\" />
<directory path=\"R&amp;D &quot;q&quot; it&#x27;s &lt;x&gt; y/\" index=\"R&amp;D &quot;q&quot; it&#x27;s &lt;x&gt; y/MEMORY.md\" />
<directory path=\"Skills/\" index=\"Skills/MEMORY.md\" />
</deferred-memory>
</memory>";
    let out = compile(&r);
    assert_eq!(out.core_memory, expected);
    assert!(!out.core_memory.contains("never shown"));
}

#[test]
fn v2_mixed_case_and_lowercase_memory_md() {
    // `memory.md` is an ordinary root file; only `MEMORY.md` is the index.
    let r = TestRepo::with_files(&[
        ("MEMORY.md", "# Index"),
        ("memory.md", "lower"),
        ("persona.md", "P"),
        ("human.md", "H"),
    ]);
    assert_eq!(
        compile(&r).core_memory,
        "<human>\nH\n</human>\n\n<memory>\nlower\n</memory>\n\n<persona>\nP\n</persona>\n\n<memory>\n# Index\n</memory>"
    );
}

#[test]
fn v2_index_only_and_empty_index() {
    let r = TestRepo::with_files(&[("MEMORY.md", "")]);
    assert_eq!(compile(&r).core_memory, "<memory>\n</memory>");
    let r = TestRepo::with_files(&[("MEMORY.md", "# Memory\n")]);
    let out = compile(&r);
    assert_eq!(out.core_memory, "<memory>\n# Memory\n</memory>");
    assert_eq!(out.content, "SYSTEM <memory>\n# Memory\n</memory>");
}

/// memfs-v1 as letta-code renders it; expected text written by hand from
/// letta-code's `renderMemfsProjection` rules (spec/compiler.md §6–7).
#[test]
fn v1_rendering_with_metadata() {
    let r = TestRepo::with_files(&[
        ("system/persona.md", "---\ndescription: me\n---\nI am X.\n"),
        (
            "system/human.md",
            "---\ndescription: The user\n---\n- likes tea\n",
        ),
        (
            "system/notes/deep.md",
            "---\ndescription: deep\n---\nline1\nline2\n",
        ),
        ("reference/a.md", "plain\n"),
        ("skills/s/SKILL.md", "---\nname: s\n---\n"),
        ("top.md", "x"),
        ("other.txt", "ignored"),
    ]);
    let out = compile_dir(
        r.path(),
        &CompileOptions {
            agent_id: "agent 1 é",
            conversation_id: "conv-x",
            system: "You are X.  \n",
            now: datetime!(2024-02-29 12:34:56.789 UTC),
            previous_message_count: 12345,
        },
    )
    .unwrap();
    let expected = "\
Reminder: <projection> contains the local path of the memory file projection.

<self>
<projection>$MEMORY_DIR/system/persona.md</projection>
I am X.
</self>

<memory>
<human>
  <projection>$MEMORY_DIR/system/human.md</projection>
  <description>The user</description>
  - likes tea
</human>
<notes>
  <deep>
    <projection>$MEMORY_DIR/system/notes/deep.md</projection>
    <description>deep</description>
    line1
line2
  </deep>
</notes>
<external_projection>
${MEMORY_DIR}/
├── reference/
│   └── a.md
└── top.md
</external_projection>
</memory>

<memory_metadata>
- AGENT_ID: agent 1 é
- CONVERSATION_ID: conv-x
- System prompt last recompiled: 2024-02-29 12:34:56 PM UTC+0000
- 12345 previous messages between you and the user are stored in recall memory
</memory_metadata>";
    assert_eq!(out.core_memory, expected);
    assert_eq!(out.memory_format, MemoryFormat::V1);
    assert_eq!(out.content, format!("You are X.\n\n{expected}"));
    assert_eq!(out.compiled_at, "2024-02-29T12:34:56.789Z");
}

#[test]
fn v1_tree_ordering_and_file_and_directory_with_same_label() {
    let r = TestRepo::with_files(&[
        ("system/a.md", "A"),
        ("system/a/b.md", "AB"),
        ("system/x10.md", ""),
        ("system/x1.md", ""),
        ("system/x9.md", ""),
        ("ab.md", ""),
        ("a.md", ""),
        ("a-b.md", ""),
        ("a/b.md", ""),
        ("Z/y.md", ""),
    ]);
    let out = compile(&r);
    let expected_memory = "\
<memory>
<a>
  <projection>$MEMORY_DIR/system/a.md</projection>
  A
  <b>
    <projection>$MEMORY_DIR/system/a/b.md</projection>
    AB
  </b>
</a>
<x1>
  <projection>$MEMORY_DIR/system/x1.md</projection>
</x1>
<x10>
  <projection>$MEMORY_DIR/system/x10.md</projection>
</x10>
<x9>
  <projection>$MEMORY_DIR/system/x9.md</projection>
</x9>
<external_projection>
${MEMORY_DIR}/
├── a/
│   └── b.md
├── Z/
│   └── y.md
├── a-b.md
├── a.md
└── ab.md
</external_projection>
</memory>";
    assert!(
        out.core_memory.contains(expected_memory),
        "got:\n{}",
        out.core_memory
    );
    assert!(!out.core_memory.contains("<self>"));
}

#[test]
fn v1_only_skills_renders_reminder_line() {
    let r = TestRepo::with_files(&[("skills/x/SKILL.md", "s")]);
    let out = compile(&r);
    assert!(out.core_memory.starts_with(
        "Reminder: <projection> contains the local path of the memory file projection.\n\n<memory_metadata>"
    ));
}

#[test]
fn v1_prototype_labels_behave_like_any_other() {
    // letta-code's JS-object tree drops these; we render them.
    let r = TestRepo::with_files(&[
        ("system/constructor.md", "C"),
        ("system/__proto__/x.md", "P"),
        ("system/topic.md", "T"),
        ("system/topic/__value__.md", "V"),
    ]);
    let core = compile(&r).core_memory;
    assert!(core.contains("<constructor>\n  <projection>$MEMORY_DIR/system/constructor.md</projection>\n  C\n</constructor>"), "{core}");
    assert!(core.contains("<__proto__>\n  <x>\n    <projection>$MEMORY_DIR/system/__proto__/x.md</projection>\n    P\n  </x>\n</__proto__>"), "{core}");
    assert!(
        core.contains(
            "<topic>\n  <projection>$MEMORY_DIR/system/topic.md</projection>\n  T\n  <__value__>"
        ),
        "{core}"
    );
    assert!(!core.contains("[object Object]"));
}

#[test]
fn non_ascii_paths_are_included() {
    let r = TestRepo::with_files(&[
        ("MEMORY.md", "# M"),
        ("café.md", "---\nname: C\ndescription: accent\n---\nok"),
        ("メモ/MEMORY.md", "x"),
        (" lead.md", "leading space"),
    ]);
    let core = compile(&r).core_memory;
    assert!(
        core.contains("<café>\n<description>accent</description>\nok\n</café>"),
        "{core}"
    );
    assert!(
        core.contains("<directory path=\"メモ/\" index=\"メモ/MEMORY.md\" />"),
        "{core}"
    );
    assert!(core.contains("< lead>\nleading space\n</ lead>"), "{core}");
}

#[test]
fn large_files_are_not_dropped() {
    let big = format!(
        "---\nname: Big\ndescription: big\n---\n{}END",
        "x".repeat(1024 * 1024 + 10)
    );
    let r = TestRepo::with_files(&[("MEMORY.md", "# M"), ("big.md", big.as_str())]);
    let core = compile(&r).core_memory;
    assert!(core.starts_with("<big>\n<description>big</description>\nxxx"));
    assert!(core.contains("END\n</big>"));
}

#[test]
fn dollar_sequences_are_injected_literally() {
    let r = TestRepo::with_files(&[("MEMORY.md", "# M"), ("p.md", "cost: $& $$ $` $' $1")]);
    let out = compile_dir(r.path(), &opts("before {CORE_MEMORY} after")).unwrap();
    assert_eq!(
        out.content,
        "before <p>\ncost: $& $$ $` $' $1\n</p>\n\n<memory>\n# M\n</memory> after"
    );
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    let r = TestRepo::new();
    r.write("MEMORY.md", "# M");
    r.write("bad.md", b"ok \xff\xfe end".as_slice());
    r.commit_all("bin");
    let core = compile(&r).core_memory;
    assert!(
        core.contains("<bad>\nok \u{FFFD}\u{FFFD} end\n</bad>"),
        "{core}"
    );
}

#[test]
fn symlink_renders_its_target_path() {
    let r = TestRepo::new();
    r.write("MEMORY.md", "# M");
    std::os::unix::fs::symlink("/etc/hostname", r.path().join("link.md")).unwrap();
    r.commit_all("link");
    assert!(
        compile(&r)
            .core_memory
            .contains("<link>\n/etc/hostname\n</link>")
    );
}

#[test]
fn only_head_counts() {
    let r = book_repo();
    let before = compile(&r);
    // Unstaged edit, staged new core file, untracked file, deleted file.
    r.write(
        "human.md",
        "---\nname: Human\ndescription: CHANGED\n---\nCHANGED\n",
    );
    r.write(
        "staged.md",
        "---\nname: S\ndescription: staged\n---\nSTAGED\n",
    );
    r.stage("staged.md");
    r.write("untracked.md", "UNTRACKED");
    r.remove("persona.md");
    r.write("MEMORY.md", "CHANGED INDEX");
    let after = compile(&r);
    assert_eq!(before, after);
    assert!(!after.core_memory.contains("CHANGED"));
    assert!(!after.core_memory.contains("STAGED"));
    assert!(!after.core_memory.contains("UNTRACKED"));
}

#[test]
fn older_commits_do_not_count() {
    let r = book_repo();
    r.write(
        "persona.md",
        "---\nname: Persona\ndescription: new\n---\nNEW BODY\n",
    );
    r.commit_all("second");
    let core = compile(&r).core_memory;
    assert!(core.contains("<persona>\n<description>new</description>\nNEW BODY\n</persona>"));
    assert!(!core.contains("helpful assistant that remembers"));
}

#[test]
fn format_follows_head_not_working_tree() {
    let r = TestRepo::with_files(&[("system/persona.md", "P")]);
    r.write("MEMORY.md", "# now v2 on disk only");
    assert_eq!(compile(&r).memory_format, MemoryFormat::V1);
    r.commit_all("v2");
    assert_eq!(compile(&r).memory_format, MemoryFormat::V2);
}

#[test]
fn empty_repository_compiles_to_metadata_only() {
    let r = TestRepo::new();
    let out = compile(&r);
    assert_eq!(out.memfs_revision, None);
    assert_eq!(out.memory_format, MemoryFormat::V1);
    assert!(
        out.core_memory
            .starts_with("<memory_metadata>\n- AGENT_ID: agent-demo\n")
    );
}

#[test]
fn not_a_repository_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = compile_dir(dir.path(), &opts("")).unwrap_err();
    assert!(err.to_string().contains("not a git repository"), "{err}");
    let err = compile_dir(&dir.path().join("missing"), &opts("")).unwrap_err();
    assert!(err.to_string().contains("no such directory"), "{err}");
}

#[test]
fn corrupt_object_is_an_error() {
    let r = book_repo();
    let head = r.repo.head().unwrap().peel_to_tree().unwrap();
    let oid = head.get_name("persona.md").unwrap().id().to_string();
    let obj = r
        .path()
        .join(".git/objects")
        .join(&oid[..2])
        .join(&oid[2..]);
    let mut perms = std::fs::metadata(&obj).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&obj, perms).unwrap();
    std::fs::write(&obj, b"garbage").unwrap();
    let err = compile_dir(r.path(), &opts("")).unwrap_err();
    assert!(err.to_string().contains("cannot read git object"), "{err}");
}
