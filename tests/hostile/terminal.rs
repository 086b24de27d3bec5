//! Attack: text an agent (or a remote, or an archive) controls reaches the
//! operator's terminal as control sequences — `ESC ] 52` writes the
//! clipboard, `ESC ] 0` the window title, `ESC [ 2 J` clears the screen —
//! through the commands that print memory, history, conversations, agent
//! records and sync results. Every command runs on a real pty here; none of
//! the planted sequences may reach it, while their visible form does. In a
//! pipe, listings quote odd names and content commands stay byte-exact.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::pty::{self, assert_terminal_safe};
use crate::common::*;

const CLIPBOARD: &str = "\u{1b}]52;c;SGVsbG8=\u{7}";
const TITLE: &str = "\u{1b}]0;pwned\u{7}";
const CLEAR: &str = "\u{1b}[2J";
/// A memory file name an agent chose.
const BAD_NAME: &str = "notes-\u{1b}]0;pwned\u{7}.md";
/// How the title sequence shows on a terminal.
const SHOWN: &str = "^[]0;pwned";

/// Every planted sequence, and a bare BEL.
fn planted() -> String {
    format!("{CLIPBOARD} {TITLE} {CLEAR} \u{7}")
}

fn agent_paths(home: &Path, id: &str) -> mini_letta::paths::AgentPaths {
    mini_letta::paths::Home::at(home).agent(id).unwrap()
}

/// Commit, straight into the agent's memory repository as root would (no
/// hook: creation through mini-letta refuses such names), a file with an
/// escape-laden name and `persona.md` with escape-laden contents, under a
/// commit message holding the sequences; then check it out and leave an
/// uncommitted edit of `human.md` and a staged escape-named file.
fn plant_memory(home: &Path, id: &str) -> String {
    let paths = agent_paths(home, id);
    let repo = mini_letta::memfs::repo::open_agent(&paths).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let persona = format!(
        "---\nname: Persona\ndescription: Who I am.\n---\n\nI am owl. {}\n",
        planted()
    );
    let mut tree = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
    let blob = repo.blob(persona.as_bytes()).unwrap();
    tree.insert("persona.md", blob, 0o100644).unwrap();
    // No frontmatter: the validator names the file (doctor, validate).
    let note = repo
        .blob(format!("loose {}\n", planted()).as_bytes())
        .unwrap();
    tree.insert(BAD_NAME, note, 0o100644).unwrap();
    let tree = repo.find_tree(tree.write().unwrap()).unwrap();
    let sig = git2::Signature::now("owl", "owl@agent").unwrap();
    let message = format!("remember {}\n\nbody {}\n", planted(), planted());
    repo.commit(Some("HEAD"), &sig, &sig, &message, &tree, &[&head])
        .unwrap();
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    repo.checkout_head(Some(&mut checkout)).unwrap();
    let human = paths.memory_dir().join("human.md");
    let mut text = std::fs::read_to_string(&human).unwrap();
    text.push_str(&format!("- edited {}\n", planted()));
    std::fs::write(&human, text).unwrap();
    // A file the agent named and staged, without frontmatter (doctor and
    // the validator name it).
    let draft = format!("draft{TITLE}.md");
    std::fs::write(paths.memory_dir().join(&draft), "draft\n").unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new(&draft)).unwrap();
    index.write().unwrap();
    persona
}

/// Run on a pty; the output must be terminal-safe and show `visible`.
fn on_tty(home: &Path, args: &[&str], env: &[(&str, &str)], visible: &str) -> pty::PtyRun {
    let r = pty::run(home, args, env);
    assert_terminal_safe(&format!("{args:?}"), &r.out);
    assert!(
        r.text().contains(visible),
        "{args:?}: {visible:?} should be shown: {:?}",
        r.text()
    );
    r
}

#[test]
fn memory_history_names_and_contents_reach_a_terminal_only_visibly() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    plant_memory(home, &id);
    let commands: &[&[&str]] = &[
        &["memory", "log"],
        &["memory", "tree"],
        &["memory", "show", "persona.md"],
        &["memory", "diff"],
        &["memory", "compile", "-a", "owl"],
        &["prompt", "--fresh"],
        &["doctor"],
        &["memory", "validate"],
    ];
    for args in commands {
        on_tty(home, args, &[], SHOWN);
    }
}

#[test]
fn in_a_pipe_listings_quote_odd_names_and_contents_stay_exact() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    let persona = plant_memory(home, &id);

    let o = run(home, &["memory", "show", "persona.md"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, persona.as_bytes(), "memory show is byte-exact");
    let o = run(home, &["prompt", "--fresh"]);
    assert!(stdout(&o).contains(&planted()), "prompt is byte-exact");
    let o = run(home, &["memory", "diff"]);
    assert!(stdout(&o).contains(&planted()), "a patch is byte-exact");

    let quoted = format!("{BAD_NAME:?}");
    let o = run(home, &["memory", "tree"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&quoted), "{}", stdout(&o));
    assert!(!o.stdout.contains(&0x1b), "{}", stdout(&o));
    let o = run(home, &["memory", "log"]);
    assert!(
        stdout(&o).contains(&format!("{:?}", format!("remember {}", planted()))),
        "{}",
        stdout(&o)
    );
    assert!(!o.stdout.contains(&0x1b), "{}", stdout(&o));

    // --json is exact.
    let o = run(home, &["memory", "tree", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == BAD_NAME),
        "{v}"
    );
}

#[test]
fn conversation_texts_ids_and_times_reach_a_terminal_only_visibly() {
    use mini_letta::protocol::messages::{Part, Role};
    use mini_letta::store::conversation::{Conversation, StoredMessage};
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    let paths = agent_paths(home, &id);
    let mut conv = Conversation::open(&paths, "default").unwrap();
    let text = format!("clipboard {}", planted());
    let mid = conv.next_id();
    conv.append(StoredMessage::new(
        mid,
        Role::User,
        vec![Part::Text { text: text.clone() }],
    ))
    .unwrap();
    let mut m = StoredMessage::new(
        format!("msg-{TITLE}"),
        Role::Assistant,
        vec![Part::Text {
            text: format!("clipboard again {CLEAR}"),
        }],
    );
    m.ts = format!("2026-01-01{TITLE}");
    conv.append(m).unwrap();

    on_tty(home, &["conversations"], &[], SHOWN);
    on_tty(home, &["recall", "search", "clipboard"], &[], "^[]52;c;");
    on_tty(home, &["attach", "--no-follow"], &[], "clipboard");

    // In a pipe the odd time is quoted; --json keeps it exact.
    let o = run(home, &["conversations"]);
    assert!(!o.stdout.contains(&0x1b), "{}", stdout(&o));
    assert!(stdout(&o).contains(&format!("{:?}", format!("2026-01-01{TITLE}"))));
    let o = run(home, &["recall", "search", "--json", "clipboard"]);
    let hits: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(hits.to_string().contains("\\u001b]52"), "{hits}");
}

/// An agent record planted with escapes (as an older clone or import left
/// it): every command that prints it shows them visibly.
#[test]
fn a_planted_agent_record_reaches_a_terminal_only_visibly() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    let file = agent_paths(home, &id).dir().join("agent.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    record["created_at"] = format!("2026-01-01T00:00:00Z{CLEAR}").into();
    record["description"] = planted().into();
    record["tags"] = serde_json::json!([TITLE]);
    record["system"] = format!("Be kind.\n{}\n", planted()).into();
    std::fs::write(&file, serde_json::to_vec(&record).unwrap()).unwrap();

    on_tty(home, &["agent", "list"], &[], "^[[2J");
    on_tty(home, &["agent", "show", "owl"], &[], "^[]52;c;");
    let o = run(home, &["agent", "list"]);
    assert!(!o.stdout.contains(&0x1b), "{}", stdout(&o));
}

/// A remote root with agent `owl` pushed, whose record ref is then replaced
/// by one with `fields` changed (as a hostile host would push).
fn remote_with_record(fields: &[(&str, Value)]) -> (tempfile::TempDir, String) {
    let source = open_home();
    let root = tempfile::tempdir().unwrap();
    let id = create_agent(source.path(), &["owl"]);
    let o = Command::new(bin())
        .args(["sync", "-a", "owl", "--json"])
        .env("MINI_LETTA_HOME", source.path())
        .env("MINI_LETTA_REMOTE_ROOT", root.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let bare = git2::Repository::open_bare(root.path().join(format!("{id}.git"))).unwrap();
    let tip = bare
        .find_reference(mini_letta::remote::RECORD_REF)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let entry = tip.tree().unwrap().get_name("agent.json").unwrap().id();
    let mut record: Value =
        serde_json::from_slice(bare.find_blob(entry).unwrap().content()).unwrap();
    for (k, v) in fields {
        record[*k] = v.clone();
    }
    let blob = bare.blob(&serde_json::to_vec(&record).unwrap()).unwrap();
    let mut tree = bare.treebuilder(None).unwrap();
    tree.insert("agent.json", blob, 0o100644).unwrap();
    let tree = bare.find_tree(tree.write().unwrap()).unwrap();
    let sig = git2::Signature::now("hostile", "hostile@host").unwrap();
    bare.commit(
        Some(mini_letta::remote::RECORD_REF),
        &sig,
        &sig,
        "record",
        &tree,
        &[&tip],
    )
    .unwrap();
    (root, id)
}

#[test]
fn a_remote_record_with_escapes_is_refused_and_never_printed_raw() {
    let (root, id) = remote_with_record(&[
        ("created_at", format!("2026-01-01T00:00:00Z{CLEAR}").into()),
        ("description", planted().into()),
        ("tags", serde_json::json!([TITLE])),
    ]);
    let dir = open_home();
    let home = dir.path();
    let env = [("MINI_LETTA_REMOTE_ROOT", root.path().to_str().unwrap())];
    let r = pty::run(home, &["agent", "list", "--remote"], &env);
    assert_terminal_safe("agent list --remote", &r.out);
    assert!(r.text().contains(&id), "{}", r.text());

    let o = Command::new(bin())
        .args(["agent", "list", "--remote", "--json"])
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let error = v["agents"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("contains the control character U+001B"),
        "the record is refused: {v}"
    );

    // Cloning it is refused too, and says so safely.
    let r = pty::run(home, &["sync", "-a", &id], &env);
    assert_terminal_safe("sync (clone)", &r.out);
    assert_ne!(r.code, Some(0), "{}", r.text());
    assert!(
        !agent_paths(home, &id).dir().exists(),
        "cloned: {}",
        r.text()
    );

    // A name with a bidirectional override is refused as well.
    let (root, id) = remote_with_record(&[("name", "owl\u{202e}gpj.exe".into())]);
    let o = Command::new(bin())
        .args(["agent", "list", "--remote", "--json"])
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["agents"][0]["id"], id.as_str());
    assert!(v["agents"][0]["error"].is_string(), "{v}");
}

#[test]
fn sync_names_escape_laden_files_only_visibly() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        agent_paths(home, &id).memory_dir().join(BAD_NAME),
        "---\nname: n\ndescription: d\n---\n",
    )
    .unwrap();
    let env = [("MINI_LETTA_REMOTE_ROOT", root.path().to_str().unwrap())];
    let r = on_tty(home, &["sync"], &env, SHOWN);
    assert!(r.text().contains("dirty"), "{}", r.text());
}

/// Data an error line quotes (here a file name the operator was handed)
/// reaches stderr visibly.
#[test]
fn error_lines_show_quoted_data_visibly() {
    let dir = open_home();
    let home = dir.path();
    create_agent(home, &["owl"]);
    let archive = home.join(format!("owl{TITLE}.tar.gz"));
    std::fs::write(&archive, b"not an archive").unwrap();
    let r = on_tty(
        home,
        &["agent", "import", archive.to_str().unwrap()],
        &[],
        SHOWN,
    );
    assert_eq!(r.code, Some(1));
}

/// Names with control or bidirectional characters are refused where they
/// are created: the CLI's memory writes, agent names, conversation ids.
#[test]
fn names_with_unsafe_characters_are_refused_when_created() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["owl"]);
    let memory = agent_paths(home, &id).memory_dir();
    let refused = |args: &[&str], why: &str| {
        let o = run(home, args);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
        assert!(!o.stderr.contains(&0x1b), "{}", stderr(&o));
    };
    refused(
        &["memory", "create", BAD_NAME, "--description", "d"],
        "control character",
    );
    refused(
        &[
            "memory",
            "create",
            "evil\u{202e}dm.txt",
            "--description",
            "d",
        ],
        "U+202E",
    );
    std::fs::write(memory.join(BAD_NAME), "---\nname: n\ndescription: d\n---\n").unwrap();
    refused(
        &["memory", "commit", "-m", "x", BAD_NAME],
        "control character",
    );
    refused(&["agent", "create", "owl\u{202e}gpj.exe"], "U+202E");
    refused(&["agent", "rename", "owl", &format!("o{TITLE}")], "U+001B");
    refused(
        &["prompt", "--conversation", &format!("c{TITLE}")],
        "invalid conversation id",
    );
    let o = run(home, &["memory", "tree", "--json"]);
    assert!(!stdout(&o).contains("notes-"), "{}", stdout(&o));
}

/// A tool child commits a file whose name holds a title sequence through
/// `memory.commit`: refused, nothing committed (such a name would make the
/// agent impossible to import elsewhere).
#[test]
fn a_child_cannot_commit_a_control_character_path() {
    use mini_letta::protocol::{Call, Event, ServerFrame, SpawnParams, StdioMode};
    let d = Daemon::start(&["a"]);
    let mut c = d.client();
    c.call_json(Call::Subscribe {}).unwrap();
    let script = format!(
        r#"cd memory
f=$(printf 'notes-\033]0;pwned\007.md')
printf -- '---\nname: n\ndescription: d\n---\nbody\n' > "$f"
{me} channel call memory.commit '{{"paths":["notes-\u001b]0;pwned\u0007.md"],"message":"x"}}' 2> err.txt
echo $? > rc.txt
"#,
        me = agent_bin().display()
    );
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: "a".into(),
            role: "tool".into(),
            argv: vec!["sh".into(), "-c".into(), script],
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some("off".into()),
            model: None,
        }))
        .unwrap();
    let child = v["child"].as_u64().unwrap();
    loop {
        if let ServerFrame::Event(Event::ChildExit(exit)) = c.read_frame().unwrap()
            && exit.child == child
        {
            break;
        }
    }
    let mem = d.memory_dir(0);
    let err = std::fs::read_to_string(mem.join("err.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(mem.join("rc.txt")).unwrap().trim(),
        "1",
        "{err}"
    );
    assert!(err.contains("control character"), "{err}");
    let repo = git2::Repository::open(&mem).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    assert!(tree.get_name(BAD_NAME).is_none(), "committed");
}
