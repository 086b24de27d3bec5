//! Issue 48 (18): every `Examples:` line of every help page runs, as
//! written, in a shell, against a prepared home, and ends as its comment
//! says:
//!
//! - no comment (or one that only explains): exits 0;
//! - `# exits N …`: exits N, and every CAPITALISED_NAME the comment gives
//!   (the variable that would make it succeed) is named in what it printed;
//! - `# … until Ctrl-C …`: still runs after two seconds, and ends on
//!   SIGINT.
//!
//! The prepared home is what a user who followed the book has: agents
//! `owl` and/or `alice` (whichever the example names, so that an example
//! without `-a` finds "the only agent"; none it creates), each with a
//! memory of a few commits (`human.md` saying `likes tea` and `outdated`,
//! `facts.md`, `projects/` with its index and `old.md`), a conversation
//! `work`, a synced remote and published audit heads; in the current
//! directory (also $HOME) `question.txt`, an exported
//! `alice.mini-letta.tar.gz`, a checkout of owl's memory in `./memory`,
//! `~/project` with a Makefile, `saved-head`, and the directories shells
//! read completions and man pages from. The pages about uncommitted
//! changes (`memory commit`, `memory status`, `memory diff`) get some:
//! `persona.md` edited and a new `notes/` with its index.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/help_pages.rs"]
mod help_pages;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use help_pages::{Example, examples, shell_words};

/// The agents examples name; a home holds those its example names.
const AGENTS: [&str; 2] = ["owl", "alice"];

/// Absolute paths an example may name: none is written (`--home DIR
/// config path` only prints where the file would be).
const ABSOLUTE_OK: &[&str] = &["/srv/agents"];

/// Pages whose examples are about uncommitted memory changes.
const DIRTY_PAGES: &[&str] = &["memory commit", "memory status", "memory diff"];

/// How long an example may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(90);

fn mini(home: &Path, args: &[&str]) -> std::process::Output {
    let o = Command::new(help_pages::bin())
        .args(args)
        .current_dir(home)
        .envs(env_for(home))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "prepare: mini-letta {}: {}{}",
        args.join(" "),
        common::stdout(&o),
        common::stderr(&o)
    );
    o
}

/// The environment every command in `home` runs with.
fn env_for(home: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("HOME", home.to_path_buf()),
        ("MINI_LETTA_HOME", home.join(".mini-letta")),
        ("MINI_LETTA_REMOTE_ROOT", home.join("remotes")),
    ]
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A memory directory `dir` with its index and one note `name`.md.
fn indexed_note(dir: &Path, title: &str, name: &str, description: &str) {
    write(
        &dir.join("MEMORY.md"),
        &format!("# {title}\n\n- [{name}]({name}.md) — {description}\n"),
    );
    write(
        &dir.join(format!("{name}.md")),
        &format!("---\nname: {name}\ndescription: {description}\n---\n- noted\n"),
    );
}

/// The directory of agent `name`'s memory working tree.
fn memory_of(home: &Path, name: &str) -> PathBuf {
    let o = mini(home, &["agent", "show", name, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    home.join(".mini-letta/agents").join(id).join("memory")
}

/// An agent as the book leaves it: a few commits, a conversation, synced.
fn prepare_agent(home: &Path, name: &str) {
    mini(home, &["agent", "create", name]);
    let m = |args: &[&str]| {
        let mut all = vec!["memory"];
        all.extend_from_slice(args);
        mini(home, &all);
    };
    m(&["insert", "-a", name, "human.md", "--text", "- likes tea"]);
    m(&["insert", "-a", name, "human.md", "--text", "- outdated"]);
    m(&[
        "create",
        "-a",
        name,
        "facts.md",
        "--description",
        "Facts.",
        "--body",
        "- water is wet",
    ]);
    let mem = memory_of(home, name);
    indexed_note(&mem.join("projects"), "Projects", "old", "An old project.");
    m(&["commit", "-a", name, "-m", "projects", "projects/"]);
    mini(
        home,
        &[
            "chat",
            "-a",
            name,
            "--conversation",
            "work",
            "-p",
            "hello: we deploy green tea",
        ],
    );
    mini(home, &["sync", "-a", name]);
}

/// A home with `agents` and the current directory's files.
fn prepare_home(home: &Path, agents: &[&str], archive: Option<&Path>, memory_git: Option<&Path>) {
    std::fs::create_dir_all(home.join(".mini-letta")).unwrap();
    for dir in [
        "remotes",
        "project",
        ".local/share/bash-completion/completions",
        ".zfunc",
        ".config/fish/completions",
        ".local/share/man/man1",
    ] {
        std::fs::create_dir_all(home.join(dir)).unwrap();
    }
    write(
        &home.join("project/Makefile"),
        "test:\n\t@echo tests pass\n",
    );
    write(&home.join("question.txt"), "What do I like?\n");
    for name in agents {
        prepare_agent(home, name);
    }
    // (A home without agents has no audit record yet, hence no head.)
    if !agents.is_empty() {
        let o = mini(home, &["audit", "head"]);
        std::fs::write(home.join("saved-head"), &o.stdout).unwrap();
        let heads = home.join("audit-heads");
        mini(
            home,
            &["audit", "head", "--publish", heads.to_str().unwrap()],
        );
    }
    if let Some(archive) = archive {
        std::fs::copy(archive, home.join("alice.mini-letta.tar.gz")).unwrap();
    }
    if let Some(git) = memory_git {
        let o = Command::new("git")
            .args(["clone", "-q"])
            .arg(git)
            .arg(home.join("memory"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::stderr(&o));
    }
}

/// The prepared homes, one per set of agents, built once.
struct Templates {
    root: tempfile::TempDir,
    built: Mutex<BTreeMap<Vec<&'static str>, PathBuf>>,
    archive: PathBuf,
    memory_git: PathBuf,
}

impl Templates {
    fn new() -> Self {
        let root = common::open_home();
        // Owl's memory (for ./memory) and alice's archive come from homes
        // of their own, made first.
        let seed = root.path().join("seed");
        std::fs::create_dir_all(&seed).unwrap();
        prepare_home(&seed, &["owl", "alice"], None, None);
        let archive = root.path().join("alice.tar.gz");
        mini(
            &seed,
            &["agent", "export", "alice", "-o", archive.to_str().unwrap()],
        );
        let memory_git = memory_of(&seed, "owl").with_file_name("memory.git");
        mini(&seed, &["supervisor", "stop"]);
        Templates {
            root,
            built: Mutex::new(BTreeMap::new()),
            archive,
            memory_git,
        }
    }

    fn home(&self, agents: Vec<&'static str>) -> PathBuf {
        let mut built = self.built.lock().unwrap();
        if let Some(p) = built.get(&agents) {
            return p.clone();
        }
        let dir = self.root.path().join(format!("t-{}", agents.join("-")));
        std::fs::create_dir_all(&dir).unwrap();
        prepare_home(&dir, &agents, Some(&self.archive), Some(&self.memory_git));
        built.insert(agents, dir.clone());
        dir
    }
}

/// The agents an example's home holds: those it names, but not one it
/// creates; `owl` alone when it names none (so it is the only agent).
fn agents_for(words: &[String]) -> Vec<&'static str> {
    let created = words
        .windows(3)
        .find(|w| w[0] == "agent" && w[1] == "create")
        .map(|w| w[2].clone());
    let named: Vec<&'static str> = AGENTS
        .iter()
        .copied()
        .filter(|a| words.iter().any(|w| w == a) && created.as_deref() != Some(a))
        .collect();
    if named.is_empty() && created.is_none() {
        vec!["owl"]
    } else {
        named
    }
}

/// What the comment says the example does.
#[derive(Debug, PartialEq)]
enum Expect {
    Exit(i32, Vec<String>),
    UntilInterrupted,
}

fn expectation(comment: Option<&str>) -> Expect {
    let Some(c) = comment else {
        return Expect::Exit(0, Vec::new());
    };
    if c.contains("until Ctrl-C") {
        return Expect::UntilInterrupted;
    }
    let mut words = c.split_whitespace();
    if words.next() == Some("exits") {
        let code = words
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("`# exits N`: no number in {c:?}"));
        let names = c
            .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .filter(|w| {
                w.len() > 3
                    && w.contains('_')
                    && w.chars()
                        .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_')
            })
            .map(str::to_string)
            .collect();
        return Expect::Exit(code, names);
    }
    Expect::Exit(0, Vec::new())
}

/// The programs an example runs besides mini-letta (after `--` or a pipe).
fn other_programs(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, part) in command.split('|').enumerate() {
        let words = shell_words(part);
        if i > 0 {
            out.extend(words.first().cloned());
        }
        if let Some(pos) = words.iter().position(|w| w == "--") {
            out.extend(words.get(pos + 1).cloned());
        }
    }
    out
}

/// Run one example in a copy of its prepared home; `Err` says how it did
/// not end as its comment says.
fn run_example(t: &Templates, n: usize, ex: &Example) -> Result<(), String> {
    let words = shell_words(&ex.command);
    let page = ex.page.join(" ");
    for w in &words {
        if w.starts_with('/') && !ABSOLUTE_OK.contains(&w.as_str()) {
            return Err(format!("names {w}, outside the prepared home"));
        }
    }
    if ex.command.contains("${") {
        return Err("expands a shell variable the prepared home cannot set".into());
    }
    let template = t.home(agents_for(&words));
    let home = t.root.path().join(format!("run-{n}"));
    let o = Command::new("cp")
        .arg("-a")
        .arg(&template)
        .arg(&home)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    if DIRTY_PAGES.contains(&page.as_str()) {
        for name in AGENTS {
            let mem = home.join(".mini-letta/agents");
            for entry in std::fs::read_dir(&mem).unwrap().flatten() {
                let m = entry.path().join("memory");
                let Ok(record) = std::fs::read_to_string(entry.path().join("agent.json")) else {
                    continue;
                };
                if !record.contains(&format!("\"{name}\"")) {
                    continue;
                }
                let persona = m.join("persona.md");
                let mut text = std::fs::read_to_string(&persona).unwrap();
                text.push_str("- plainer\n");
                std::fs::write(&persona, text).unwrap();
                indexed_note(&m.join("notes"), "Notes", "a", "A note.");
            }
        }
    }
    let bin_dir = common::bin().parent().unwrap().to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin_dir];
    paths.extend(std::env::split_paths(&path));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&ex.command)
        .current_dir(&home)
        .envs(env_for(&home))
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env_remove("RUST_LOG")
        .env_remove("MINI_LETTA_ETCD")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            std::fs::File::create(home.join(".out")).unwrap(),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(home.join(".err")).unwrap(),
        ))
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let expect = expectation(ex.comment.as_deref());
    let started = Instant::now();
    let wait = |child: &mut std::process::Child, limit: Duration| loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = match &expect {
        Expect::UntilInterrupted => {
            if let Some(status) = wait(&mut child, Duration::from_secs(2)) {
                Err(format!("ended by itself ({status}) before Ctrl-C"))
            } else {
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT);
                match wait(&mut child, Duration::from_secs(2) + LIMIT) {
                    Some(_) => Ok(()),
                    None => Err("still running after Ctrl-C".into()),
                }
            }
        }
        Expect::Exit(code, names) => match wait(&mut child, LIMIT) {
            None => Err(format!("still running after {} s", LIMIT.as_secs())),
            Some(status) => {
                let said = format!(
                    "{}{}",
                    std::fs::read_to_string(home.join(".out")).unwrap_or_default(),
                    std::fs::read_to_string(home.join(".err")).unwrap_or_default()
                );
                if status.code() != Some(*code) {
                    Err(format!("exited {status}, not {code}"))
                } else if let Some(missing) = names.iter().find(|n| !said.contains(n.as_str())) {
                    Err(format!("exited {code} without naming {missing}"))
                } else {
                    Ok(())
                }
            }
        },
    };
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    // A supervisor an example started ends with its home.
    let _ = Command::new(help_pages::bin())
        .args(["supervisor", "stop"])
        .envs(env_for(&home))
        .output();
    let result = result.map_err(|why| {
        format!(
            "{why}\n    stdout: {}\n    stderr: {}",
            std::fs::read_to_string(home.join(".out"))
                .unwrap_or_default()
                .trim_end(),
            std::fs::read_to_string(home.join(".err"))
                .unwrap_or_default()
                .trim_end()
        )
    });
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&home);
    }
    result
}

#[test]
fn the_comment_grammar_reads_as_documented() {
    assert_eq!(expectation(None), Expect::Exit(0, vec![]));
    assert_eq!(
        expectation(Some("with fpath+=(~/.zfunc) in ~/.zshrc")),
        Expect::Exit(0, vec![])
    );
    assert_eq!(
        expectation(Some("exits 1 without OPENAI_API_KEY")),
        Expect::Exit(1, vec!["OPENAI_API_KEY".into()])
    );
    assert_eq!(
        expectation(Some("exits 3 when none runs")),
        Expect::Exit(3, vec![])
    );
    assert_eq!(
        expectation(Some("serves until Ctrl-C")),
        Expect::UntilInterrupted
    );
    let (cmd, comment) =
        help_pages::split_comment("mini-letta x -p '# not a comment'   # a comment");
    assert_eq!(cmd, "mini-letta x -p '# not a comment'");
    assert_eq!(comment.as_deref(), Some("a comment"));
    assert_eq!(
        agents_for(&shell_words("mini-letta agent create owl")),
        Vec::<&str>::new()
    );
    assert_eq!(
        agents_for(&shell_words("mini-letta memory tree")),
        vec!["owl"]
    );
    assert_eq!(
        agents_for(&shell_words("mini-letta chat -a alice -p hi")),
        vec!["alice"]
    );
    assert_eq!(
        other_programs("mini-letta audit log --json | jq .kind"),
        vec!["jq".to_string()]
    );
    assert_eq!(
        other_programs("mini-letta sandbox run -- sh -c 'ls'"),
        vec!["sh".to_string()]
    );
}

#[test]
fn every_help_example_runs_as_written_and_ends_as_its_comment_says() {
    if !common::confinement_or_skip("help examples") {
        return;
    }
    let all = examples();
    assert!(all.len() > 100, "only {} examples found", all.len());
    let runnable: Vec<(usize, &Example)> = all
        .iter()
        .enumerate()
        .filter(|(_, ex)| {
            other_programs(&ex.command)
                .iter()
                .all(|p| common::tool_present(p))
        })
        .collect();
    let existed: Vec<bool> = ABSOLUTE_OK.iter().map(|p| Path::new(p).exists()).collect();
    let templates = Templates::new();
    let failures = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    // One at a time: the copies of one prepared home share its agents'
    // uids, and a supervisor starting in one copy ends the processes of
    // its agents' uids it finds (leftovers, as far as it can tell).
    std::thread::scope(|s| {
        for _ in 0..1 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some((n, ex)) = runnable.get(i) else {
                        break;
                    };
                    if let Err(why) = run_example(&templates, *n, ex) {
                        failures.lock().unwrap().push(format!(
                            "[{}] {}{}: {why}",
                            ex.page.join(" "),
                            ex.command,
                            ex.comment
                                .as_deref()
                                .map(|c| format!("   # {c}"))
                                .unwrap_or_default()
                        ));
                    }
                }
            });
        }
    });
    for (p, existed) in ABSOLUTE_OK.iter().zip(existed) {
        assert!(existed || !Path::new(p).exists(), "an example created {p}");
    }
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} help examples did not end as written:\n{}",
        failures.len(),
        runnable.len(),
        failures.join("\n")
    );
}
