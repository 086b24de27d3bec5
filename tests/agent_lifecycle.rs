#![allow(clippy::unwrap_used, clippy::expect_used)]
//! An agent's life beyond create and chat: rename, set-model, export and
//! import (round trip and refusals), unreadable agents, delete's
//! confirmation, and `ps` (live children by default, `--all`, names).

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Daemon, bin, create_agent, open_home, run, stderr, stdout, wait_until};
use mini_letta::paths::Home;
use mini_letta::protocol::{Call, SpawnParams, StdioMode};
use mini_letta::store::archive::{self, ArchiveError, ImportOptions, Limits};
use serde_json::Value;

fn ok(home: &Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn json(home: &Path, args: &[&str]) -> Value {
    let out = ok(home, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// The command fails; its stderr.
fn fails(home: &Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(!o.status.success(), "{args:?} succeeded: {}", stdout(&o));
    stderr(&o)
}

fn human_md(home: &Path, agent: &str) -> String {
    ok(home, &["memory", "show", "-a", agent, "human.md"])
}

/// What is in `<home>/agents`, by name (to see nothing was left behind).
fn agents_dir_names(home: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(home.join("agents"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every entry of a `.tar.gz`: path and header.
fn entries(archive: &Path) -> Vec<(String, tar::Header, Vec<u8>)> {
    let f = std::fs::File::open(archive).unwrap();
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(f));
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (path, e.header().clone(), data)
        })
        .collect()
}

/// A copy of `src` with entries changed by `edit` and `extra` appended.
fn rewrite(
    src: &Path,
    dst: &Path,
    mut edit: impl FnMut(&str, &mut Vec<u8>),
    extra: impl FnOnce(&mut tar::Builder<flate2::write::GzEncoder<std::fs::File>>),
) {
    let out = std::fs::File::create(dst).unwrap();
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
        out,
        flate2::Compression::fast(),
    ));
    for (path, mut header, mut data) in entries(src) {
        edit(&path, &mut data);
        header.set_size(data.len() as u64);
        b.append_data(&mut header, &path, data.as_slice()).unwrap();
    }
    extra(&mut b);
    b.into_inner().unwrap().finish().unwrap();
}

/// An entry whose name is written as raw bytes (the tar crate's own path
/// setters refuse `..` and absolute paths, as a hostile archive would not).
fn raw_entry(
    b: &mut tar::Builder<flate2::write::GzEncoder<std::fs::File>>,
    name: &[u8],
    kind: tar::EntryType,
    link: Option<&str>,
    data: &[u8],
) {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    if let Some(l) = link {
        h.set_link_name(l).unwrap();
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// Export → delete → import: the agent comes back with its memory (and
/// its history), remembers what it was told before, and chats on. The
/// archive carries no uid, no runtime leftovers, no git config or hooks.
#[test]
fn export_delete_import_round_trip_keeps_memory() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["alice"]);
    let o = run(
        home,
        &["chat", "-a", "alice", "-p", "记住: the cat is named Tom"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(human_md(home, "alice").contains("- the cat is named Tom"));
    let log_before = ok(home, &["memory", "log", "-a", "alice"]);

    // Default output: <name>.mini-letta.tar.gz in the current directory.
    let cwd = tempfile::tempdir().unwrap();
    let o = Command::new(bin())
        .args(["agent", "export", "alice", "--json"])
        .env("MINI_LETTA_HOME", home)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let exported: Value = serde_json::from_slice(&o.stdout).unwrap();
    let file = cwd.path().join("alice.mini-letta.tar.gz");
    assert!(file.is_file(), "{exported}");
    assert_eq!(exported["id"], id.as_str());
    // Nothing but the archive: the temporary file was renamed.
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 1);

    let listed = entries(&file);
    let names: Vec<&str> = listed.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(names[0], "mini-letta-export.json");
    for want in [
        "agent.json",
        "memory/human.md",
        "memory.git/HEAD",
        "conversations/default/messages.jsonl",
    ] {
        assert!(names.contains(&want), "{want} missing: {names:?}");
    }
    for p in &names {
        assert!(
            !p.starts_with("tmp")
                && !p.starts_with("memory-worktrees")
                && !p.starts_with("reflections")
                && !p.ends_with(".lock")
                && !p.starts_with(".owned")
                && !p.starts_with("memory.git/hooks")
                && !p.starts_with("memory.git/config")
                && *p != "memory/.git",
            "{p} should not be exported"
        );
    }
    let record = &listed.iter().find(|(p, _, _)| p == "agent.json").unwrap().2;
    let record: Value = serde_json::from_slice(record).unwrap();
    assert!(record.get("sandbox_uid").is_none(), "{record}");
    assert_eq!(record["name"], "alice");

    // Into a home that has never had an agent: another machine, say.
    let elsewhere = open_home();
    let v = json(
        elsewhere.path(),
        &["agent", "import", file.to_str().unwrap(), "--json"],
    );
    assert_eq!(v["id"], id.as_str());
    assert!(human_md(elsewhere.path(), "alice").contains("- the cat is named Tom"));

    ok(home, &["agent", "delete", "alice", "--yes"]);
    assert!(fails(home, &["agent", "show", "alice"]).contains("no agent"));

    let v = json(home, &["agent", "import", file.to_str().unwrap(), "--json"]);
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["name"], "alice");
    assert!(v.get("sandbox_uid").is_none());
    assert!(human_md(home, "alice").contains("- the cat is named Tom"));
    let prompt = ok(home, &["prompt", "-a", "alice", "--fresh"]);
    assert!(prompt.contains("the cat is named Tom"), "{prompt}");
    assert_eq!(ok(home, &["memory", "log", "-a", "alice"]), log_before);
    let list = json(home, &["agent", "list", "--json"]);
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);

    // The imported agent works: a new turn remembers on top.
    let o = run(home, &["chat", "-a", "alice", "-p", "记住: the dog is Rex"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let human = human_md(home, "alice");
    assert!(
        human.contains("- the cat is named Tom") && human.contains("- the dog is Rex"),
        "{human}"
    );
    // The imported repository is a proper one: validator clean, the hook in.
    ok(
        home,
        &["memory", "validate", "-a", "alice", "--rev", "HEAD"],
    );
    let git_dir = home.join("agents").join(&id).join("memory.git");
    assert!(git_dir.join("hooks/pre-commit").is_file());
}

/// Symlinks and special files in the agent's trees are skipped with a
/// warning, never archived; the export still imports.
#[test]
fn export_skips_symlinks_and_special_files() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["alice"]);
    let agent = home.join("agents").join(&id);
    std::os::unix::fs::symlink("/etc/passwd", agent.join("memory/passwd.md")).unwrap();
    std::fs::create_dir_all(agent.join("conversations/default")).unwrap();
    nix::unistd::mkfifo(
        &agent.join("conversations/default/pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let out = dir.path().join("a.tar.gz");
    let o = run(
        home,
        &["agent", "export", "alice", "-o", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("skipped memory/passwd.md") && err.contains("symbolic link"),
        "{err}"
    );
    assert!(err.contains("skipped conversations/default/pipe"), "{err}");
    let names: Vec<String> = entries(&out).into_iter().map(|(p, _, _)| p).collect();
    assert!(
        !names
            .iter()
            .any(|p| p.contains("passwd") || p.ends_with("pipe"))
    );

    ok(home, &["agent", "delete", "alice", "--yes"]);
    ok(home, &["agent", "import", out.to_str().unwrap()]);
    assert!(!agent.join("memory/passwd.md").exists());
}

/// Import refusals: each hostile or broken archive is refused with a
/// clear error and leaves nothing in the home.
#[test]
fn hostile_or_broken_archives_are_refused_and_leave_nothing() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["alice"]);
    let work = tempfile::tempdir().unwrap();
    let good = work.path().join("good.tar.gz");
    ok(
        home,
        &["agent", "export", "alice", "-o", good.to_str().unwrap()],
    );

    // Same id (and name) present: refused; --name does not get around an id.
    let err = fails(home, &["agent", "import", good.to_str().unwrap()]);
    assert!(err.contains("already exists") && err.contains(&id), "{err}");
    let err = fails(
        home,
        &["agent", "import", good.to_str().unwrap(), "--name", "other"],
    );
    assert!(err.contains(&id), "{err}");

    // Only the name taken (another agent called alice): --name is the way.
    ok(home, &["agent", "delete", "alice", "--yes"]);
    let other = create_agent(home, &["alice"]);
    let before = agents_dir_names(home);
    let err = fails(home, &["agent", "import", good.to_str().unwrap()]);
    assert!(
        err.contains("named \"alice\" already exists") && err.contains("--name"),
        "{err}"
    );
    assert_eq!(agents_dir_names(home), before);

    let mut cases: Vec<(&str, PathBuf, &str)> = Vec::new();
    let mut case = |name: &'static str, want: &'static str, f: &dyn Fn(&Path)| {
        let p = work.path().join(format!("{name}.tar.gz"));
        f(&p);
        cases.push((name, p, want));
    };
    case("dotdot", "`..`", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| raw_entry(b, b"../evil", tar::EntryType::Regular, None, b"x"),
        )
    });
    case("nested-dotdot", "`..`", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| raw_entry(b, b"memory/../../evil", tar::EntryType::Regular, None, b"x"),
        )
    });
    case("absolute", "absolute path", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| {
                raw_entry(
                    b,
                    b"/tmp/mini-letta-evil",
                    tar::EntryType::Regular,
                    None,
                    b"x",
                )
            },
        )
    });
    case("symlink", "symbolic link", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| {
                raw_entry(
                    b,
                    b"memory/link.md",
                    tar::EntryType::Symlink,
                    Some("/etc/shadow"),
                    b"",
                )
            },
        )
    });
    case("hardlink", "hard link", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| {
                raw_entry(
                    b,
                    b"memory/hard.md",
                    tar::EntryType::Link,
                    Some("memory/human.md"),
                    b"",
                )
            },
        )
    });
    case("device", "character device", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| raw_entry(b, b"memory/null", tar::EntryType::Char, None, b""),
        )
    });
    case("stranger", "not part of an agent export", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| raw_entry(b, b"tmp/x", tar::EntryType::Regular, None, b"x"),
        )
    });
    case("duplicate-entry", "appears twice", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| raw_entry(b, b"memory/human.md", tar::EntryType::Regular, None, b"x"),
        )
    });
    // A tar bomb: a header that claims 64 GiB.
    case("bomb", "tar bomb", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(64 << 30);
                h.set_mode(0o644);
                b.append_data(&mut h, "conversations/huge", &b"x"[..])
                    .unwrap_or(())
            },
        )
    });
    // A long name the tar reader would hold in memory whole.
    case("long-name-bomb", "extension header", &|p| {
        rewrite(
            &good,
            p,
            |_, _| {},
            |b| {
                let mut h = tar::Header::new_gnu();
                h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
                h.set_entry_type(tar::EntryType::GNULongName);
                h.set_size(1 << 30);
                h.set_mode(0o644);
                h.set_cksum();
                b.append(&h, &b"memory/x.md"[..]).unwrap_or(())
            },
        )
    });
    case("bad-record", "agent.json is invalid", &|p| {
        rewrite(
            &good,
            p,
            |path, data| {
                if path == "agent.json" {
                    *data = b"{ torn".to_vec();
                }
            },
            |_| {},
        )
    });
    case("bad-head", "HEAD does not resolve", &|p| {
        rewrite(
            &good,
            p,
            |path, data| {
                if path == "memory.git/HEAD" {
                    *data = b"ref: refs/heads/nowhere\n".to_vec();
                }
            },
            |_| {},
        )
    });
    case(
        "not-gzip",
        "not a readable gzip-compressed tar archive",
        &|p| std::fs::write(p, b"hello, this is not an archive").unwrap(),
    );

    for (name, file, want) in &cases {
        let err = fails(
            home,
            &["agent", "import", file.to_str().unwrap(), "--name", "fresh"],
        );
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            err.contains("refus")
                || err.contains("invalid")
                || err.contains("not a")
                || err.contains("damaged"),
            "{name}: {err}"
        );
        assert_eq!(agents_dir_names(home), before, "{name} left something");
    }
    assert!(!Path::new("/tmp/mini-letta-evil").exists());
    assert!(!work.path().parent().unwrap().join("evil").exists());
    let list = json(home, &["agent", "list", "--json"]);
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
    assert_eq!(list["agents"][0]["id"], other.as_str());

    // The good archive under a free name goes in.
    let v = json(
        home,
        &[
            "agent",
            "import",
            good.to_str().unwrap(),
            "--name",
            "alice2",
            "--json",
        ],
    );
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["name"], "alice2");
    assert_eq!(
        json(home, &["agent", "show", "alice2", "--json"])["id"],
        id.as_str()
    );
}

/// A memory history whose HEAD does not pass the validator is refused.
#[test]
fn an_invalid_memory_tree_is_refused() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["alice"]);
    // A commit made behind the validator's back: a private key in memory.
    let git_dir = home.join("agents").join(&id).join("memory.git");
    let repo = git2::Repository::open_bare(&git_dir).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let blob = repo
        .blob(
            b"---\nname: Human\ndescription: What I know about the user.\n---\n\
              -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n",
        )
        .unwrap();
    let mut tb = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
    tb.insert("human.md", blob, 0o100644).unwrap();
    let tree = repo.find_tree(tb.write().unwrap()).unwrap();
    let sig = git2::Signature::now("x", "x@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "bad", &tree, &[&head])
        .unwrap();

    let file = dir.path().join("bad.tar.gz");
    ok(
        home,
        &["agent", "export", "alice", "-o", file.to_str().unwrap()],
    );
    ok(home, &["agent", "delete", "alice", "--yes"]);
    let before = agents_dir_names(home);
    let err = fails(home, &["agent", "import", file.to_str().unwrap()]);
    assert!(
        err.contains("does not pass the validator") && err.contains("possible secret"),
        "{err}"
    );
    assert_eq!(agents_dir_names(home), before);
    assert!(fails(home, &["agent", "show", "alice"]).contains("no agent"));
}

/// Size and count limits hold on what is read, not only on what headers
/// claim (through the library, with small limits).
#[test]
fn import_limits_count_entries_and_bytes() {
    let dir = open_home();
    let home = dir.path();
    create_agent(home, &["alice"]);
    let good = dir.path().join("good.tar.gz");
    ok(
        home,
        &["agent", "export", "alice", "-o", good.to_str().unwrap()],
    );
    ok(home, &["agent", "delete", "alice", "--yes"]);
    let mhome = Home::at(home);
    let small = |max_entries, max_total_bytes| ImportOptions {
        limits: Limits {
            max_entries,
            max_total_bytes,
        },
        ..Default::default()
    };
    let e = archive::import(&mhome, &good, &small(5, 1 << 30)).unwrap_err();
    assert!(matches!(e, ArchiveError::TooManyEntries { max: 5 }), "{e}");
    let e = archive::import(&mhome, &good, &small(100_000, 1000)).unwrap_err();
    assert!(matches!(e, ArchiveError::TooLarge { max: 1000 }), "{e}");
    assert!(e.to_string().contains("tar bomb"), "{e}");
    assert_eq!(agents_dir_names(home), vec!["index.json"]);
    archive::import(&mhome, &good, &ImportOptions::default()).unwrap();
}

/// Rename: unique names, the index follows, and the agent answers to its
/// new name (chat included).
#[test]
fn rename_then_chat_by_the_new_name() {
    let dir = open_home();
    let home = dir.path();
    let id = create_agent(home, &["alice"]);
    create_agent(home, &["carol"]);
    let v = json(home, &["agent", "rename", "alice", "bob", "--json"]);
    assert_eq!(
        (v["id"].as_str(), v["name"].as_str()),
        (Some(id.as_str()), Some("bob"))
    );
    assert!(fails(home, &["agent", "show", "alice"]).contains("no agent \"alice\""));
    let index = std::fs::read_to_string(home.join("agents/index.json")).unwrap();
    assert!(
        index.contains("\"bob\"") && !index.contains("\"alice\""),
        "{index}"
    );

    let err = fails(home, &["agent", "rename", "bob", "carol"]);
    assert!(err.contains("\"carol\" already exists"), "{err}");
    let err = fails(home, &["agent", "rename", "bob", ""]);
    assert!(err.contains("names must be"), "{err}");
    assert!(fails(home, &["agent", "rename", "nobody", "x"]).contains("no agent"));

    let o = run(home, &["chat", "-a", "bob", "-p", "记住: renamed fine"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(human_md(home, "bob").contains("- renamed fine"));
    assert!(ok(home, &["agent", "show", &id]).contains("name:       bob"));
}

/// Models: create --model and set-model record a handle of a valid form,
/// anything else is refused with the valid forms listed.
#[test]
fn create_with_a_model_and_set_model() {
    let dir = open_home();
    let home = dir.path();
    let v = json(
        home,
        &[
            "agent",
            "create",
            "alice",
            "--model",
            "openai/gpt-4o-mini",
            "--json",
        ],
    );
    assert_eq!(v["model"], "openai/gpt-4o-mini");
    assert_eq!(
        json(home, &["agent", "show", "alice", "--json"])["model"],
        "openai/gpt-4o-mini"
    );
    let err = fails(home, &["agent", "create", "bob", "--model", "gpt-4o"]);
    assert!(
        err.contains("unknown model") && err.contains("valid forms"),
        "{err}"
    );
    assert!(fails(home, &["agent", "show", "bob"]).contains("no agent"));

    let v = json(
        home,
        &[
            "agent",
            "set-model",
            "alice",
            "anthropic/claude-test",
            "--json",
        ],
    );
    assert_eq!(v["model"], "anthropic/claude-test");
    assert_eq!(
        json(home, &["agent", "show", "alice", "--json"])["model"],
        "anthropic/claude-test"
    );
    for bad in ["gpt", "openai/", "mock/scripted:/etc/passwd"] {
        let err = fails(home, &["agent", "set-model", "alice", bad]);
        assert!(err.contains("valid forms"), "{bad}: {err}");
    }
    assert_eq!(
        json(home, &["agent", "show", "alice", "--json"])["model"],
        "anthropic/claude-test"
    );
    ok(home, &["agent", "set-model", "alice", "mock"]);
    let o = run(home, &["chat", "-a", "alice", "-p", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The table shows it, with a header and second-precision UTC times.
    let table = ok(home, &["agent", "list"]);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("ID") && header.contains("NAME") && header.contains("CREATED"));
    let row = lines.next().unwrap();
    assert!(row.contains("alice") && row.contains("mock"), "{table}");
    let re = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$").unwrap();
    assert!(re.is_match(row.trim_end()), "{row}");
}

/// An agent directory whose record cannot be read is listed as such and
/// found as such, by id and by the name the index knew.
#[test]
fn unreadable_agents_are_reported_not_skipped() {
    let dir = open_home();
    let home = dir.path();
    create_agent(home, &["alice"]);
    let bob = create_agent(home, &["bob"]);
    let record = home.join("agents").join(&bob).join("agent.json");
    let original = std::fs::read(&record).unwrap();

    for damage in ["torn", "directory"] {
        std::fs::remove_file(&record).ok();
        std::fs::remove_dir(&record).ok();
        match damage {
            "torn" => std::fs::write(&record, b"{ torn").unwrap(),
            _ => std::fs::create_dir(&record).unwrap(),
        }
        let table = ok(home, &["agent", "list"]);
        let row = table
            .lines()
            .find(|l| l.contains(&bob))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(
            row.contains("unreadable: ") && row.contains("bob"),
            "{damage}: {table}"
        );
        assert!(table.contains("alice"));

        let v = json(home, &["agent", "list", "--json"]);
        let agents = v["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 2);
        let entry = agents.iter().find(|a| a["id"] == bob.as_str()).unwrap();
        assert!(
            entry["error"].as_str().unwrap().contains("agent.json"),
            "{entry}"
        );
        assert_eq!(entry["name"], "bob");

        for sel in ["bob", bob.as_str()] {
            let err = fails(home, &["agent", "show", sel]);
            assert!(
                err.contains(&format!("agent \"{sel}\" exists but cannot be read")),
                "{damage}: {err}"
            );
        }
        let err = fails(home, &["chat", "-a", "bob", "-p", "hi"]);
        assert!(err.contains("exists but cannot be read"), "{err}");
        // Its name stays taken.
        assert!(fails(home, &["agent", "create", "bob"]).contains("already exists"));
        // Without the index, the id still finds it.
        std::fs::remove_file(home.join("agents/index.json")).unwrap();
        let err = fails(home, &["agent", "show", &bob]);
        assert!(err.contains("exists but cannot be read"), "{err}");
        ok(home, &["agent", "show", "alice"]);

        // Repaired, it is an agent again (and the index learns its name).
        std::fs::remove_file(&record).ok();
        std::fs::remove_dir(&record).ok();
        std::fs::write(&record, &original).unwrap();
        assert!(ok(home, &["agent", "list"]).contains("bob"));
        ok(home, &["agent", "show", "bob"]);
    }
}

/// Delete refuses without --yes unless a terminal confirms by the name.
#[test]
fn delete_needs_yes_or_the_name_typed_on_a_terminal() {
    let dir = open_home();
    let home = dir.path();
    create_agent(home, &["alice"]);
    let err = fails(home, &["agent", "delete", "alice"]);
    assert!(err.contains("--yes"), "{err}");
    ok(home, &["agent", "show", "alice"]);

    let on_tty = |typed: &str| {
        let pty = nix::pty::openpty(None, None).unwrap();
        let child = Command::new(bin())
            .args(["agent", "delete", "alice"])
            .env("MINI_LETTA_HOME", home)
            .stdin(Stdio::from(pty.slave))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut master = std::fs::File::from(pty.master);
        master.write_all(format!("{typed}\n").as_bytes()).unwrap();
        let o = child.wait_with_output().unwrap();
        (o.status.success(), stderr(&o))
    };
    let (done, err) = on_tty("bob");
    assert!(!done && err.contains("not deleted"), "{err}");
    assert!(err.contains("Type the agent's name"), "{err}");
    ok(home, &["agent", "show", "alice"]);
    let (done, err) = on_tty("alice");
    assert!(done, "{err}");
    assert!(fails(home, &["agent", "show", "alice"]).contains("no agent"));
}

/// `ps` shows live children with their agent's name; `--all` adds ended
/// ones; `supervisor status` counts live ones only.
#[test]
fn ps_shows_live_children_by_default_and_ended_ones_with_all() {
    let d = Daemon::start(&["owl"]);
    let mut c = d.client();
    let spawn = |c: &mut mini_letta::protocol::client::Client, argv: &[&str]| {
        c.call_json(Call::Spawn(SpawnParams {
            agent: "owl".into(),
            role: "tool".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some("off".into()),
            model: None,
        }))
        .unwrap()["child"]
            .as_u64()
            .unwrap()
    };
    let short = spawn(&mut c, &["true"]);
    let long = spawn(&mut c, &["sleep", "30"]);
    let ps = |all: bool| {
        let mut args = vec!["ps", "--json"];
        if all {
            args.push("--all");
        }
        json(d.path(), &args)["children"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert!(wait_until(10, || ps(true)
        .iter()
        .any(|r| r["id"] == short && r["state"] == "exited")));
    let live = ps(false);
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["id"], long);
    assert_eq!(live[0]["agent"], d.agents[0].as_str());
    assert_eq!(live[0]["agent_name"], "owl");
    let all = ps(true);
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|r| r["agent_name"] == "owl"));

    let table = ok(d.path(), &["ps"]);
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("NAME") && header.contains("STATE"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(
        table.contains("owl") && !table.contains("exited"),
        "{table}"
    );
    let table = ok(d.path(), &["ps", "--all"]);
    assert!(table.contains("exited 0"), "{table}");

    let status = json(d.path(), &["supervisor", "status", "--json"]);
    assert_eq!(status["children"], 1, "{status}");
    c.call_json(Call::Kill {
        child: long,
        signal: None,
    })
    .ok();
}
