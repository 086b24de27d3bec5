//! Sync against a hostile remote (issue 36): anyone who can write the shared
//! remote root — another host, another tenant with push access — is an
//! attacker. Each test plants something in the root (a symlink to another
//! tenant's repository, a commit with a dangerous tree) and checks that the
//! sync refuses it and leaves everything local as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::remote::{git_ok, has_object, json, main_of, object_at, ok, on};
use crate::common::*;

/// Every file of a directory with its bytes.
type Files = Vec<(String, Vec<u8>)>;

/// `main`, the checkout's `.git` pointer, the checkout's files.
type LocalState = (String, Vec<u8>, Files);

/// Something planted in the remote root, named.
type Setup<'a> = (&'static str, Box<dyn Fn() + 'a>);

/// One home with agent `al`, synced once to a fresh remote root.
struct Tenant {
    home: tempfile::TempDir,
    root: tempfile::TempDir,
    id: String,
}

impl Tenant {
    fn synced() -> Self {
        let home = open_home();
        let root = tempfile::tempdir().unwrap();
        let id = create_agent(home.path(), &["al"]);
        let t = Tenant { home, root, id };
        let (o, v) = t.sync(&[]);
        assert!(o.status.success(), "{v}");
        assert_eq!(v["status"], "pushed", "{v}");
        t
    }

    fn bare(&self) -> PathBuf {
        self.root.path().join(format!("{}.git", self.id))
    }

    fn agent_dir(&self) -> PathBuf {
        self.home.path().join("agents").join(&self.id)
    }

    fn git_dir(&self) -> PathBuf {
        self.agent_dir().join("memory.git")
    }

    fn memory(&self) -> PathBuf {
        self.agent_dir().join("memory")
    }

    fn main(&self) -> String {
        main_of(&self.git_dir())
    }

    /// `sync -a al --json ARGS`: the exit status and the answer.
    fn sync(&self, args: &[&str]) -> (Output, Value) {
        let mut all = vec!["sync", "-a", "al", "--json"];
        all.extend_from_slice(args);
        let o = on(self.home.path(), self.root.path(), &all);
        let v = serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
        (o, v)
    }

    /// What `doctor -a al --json` finds, as one string per finding.
    fn doctor(&self) -> Vec<String> {
        let o = on(
            self.home.path(),
            self.root.path(),
            &["doctor", "-a", "al", "--json"],
        );
        let v: Value = serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{} {} {}", f["check"], f["severity"], f["message"]))
            .collect()
    }

    /// Everything local a refused sync must leave alone: `main`, the
    /// checkout's `.git` pointer and every file of the checkout.
    fn local_state(&self) -> LocalState {
        let pointer = std::fs::read(self.memory().join(".git")).unwrap();
        (self.main(), pointer, files(&self.memory()))
    }
}

/// Every file below `dir` with its bytes (symlinks as their target).
fn files(dir: &Path) -> Files {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                stack.push(p);
            } else if kind.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, t.as_os_str().as_encoded_bytes().to_vec()));
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `git --git-dir GIT_DIR ARGS` with `input` on stdin; its trimmed stdout.
fn git_in(git_dir: &Path, args: &[&str], input: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Mallory")
        .env("GIT_AUTHOR_EMAIL", "m@example.com")
        .env("GIT_COMMITTER_NAME", "Mallory")
        .env("GIT_COMMITTER_EMAIL", "m@example.com")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    stdout(&o).trim().to_string()
}

/// A blob written into `git_dir`.
fn blob(git_dir: &Path, content: &[u8]) -> String {
    git_in(git_dir, &["hash-object", "-w", "--stdin"], content)
}

/// A tree of `entries` (mode, object, name), written with `git mktree`,
/// which checks no names: what an attacker's git can put in a tree.
fn tree(git_dir: &Path, entries: &[(&str, String, &str)]) -> String {
    let text: String = entries
        .iter()
        .map(|(mode, oid, name)| {
            let kind = match *mode {
                "040000" => "tree",
                "160000" => "commit",
                _ => "blob",
            };
            format!("{mode} {kind} {oid}\t{name}\n")
        })
        .collect();
    git_in(git_dir, &["mktree"], text.as_bytes())
}

/// The attacker's commit on top of `main` of the bare repository: main's
/// root tree without `drop`, plus `add` (mode, object, name); `main` moves
/// to it. Returns the commit.
fn plant(bare: &Path, add: &[(&str, String, &str)], drop: &[&str]) -> String {
    let listing = git_in(bare, &["ls-tree", "main"], b"");
    let mut entries: Vec<(String, String, String)> = listing
        .lines()
        .filter_map(|l| {
            let (meta, name) = l.split_once('\t')?;
            let mut m = meta.split(' ');
            let (mode, _, oid) = (m.next()?, m.next()?, m.next()?);
            Some((mode.to_string(), oid.to_string(), name.to_string()))
        })
        .filter(|(_, _, n)| !drop.contains(&n.as_str()) && !add.iter().any(|a| a.2 == n))
        .collect();
    entries.extend(
        add.iter()
            .map(|(m, o, n)| (m.to_string(), o.clone(), n.to_string())),
    );
    let borrowed: Vec<(&str, String, &str)> = entries
        .iter()
        .map(|(m, o, n)| (m.as_str(), o.clone(), n.as_str()))
        .collect();
    let t = tree(bare, &borrowed);
    let c = git_in(
        bare,
        &["commit-tree", &t, "-p", "main", "-m", "hostile"],
        b"",
    );
    git_in(bare, &["update-ref", "refs/heads/main", &c], b"");
    c
}

fn note(text: &str) -> Vec<u8> {
    format!("---\nname: note\ndescription: A note.\n---\n\n{text}\n").into_bytes()
}

/// One hostile tree: its entries, and a word the refusal must contain.
struct Hostile {
    what: &'static str,
    add: Vec<(&'static str, String, &'static str)>,
    expect: &'static str,
}

/// The trees a remote must never move `main` to (issue 36 §2, §3).
fn hostile_trees(bare: &Path) -> Vec<Hostile> {
    let big = vec![b'x'; 2 << 20];
    let sub = blob(bare, &note("nested"));
    let config = br#"{"version":1,"maxCoreMemoryCharacters":99999999}"#;
    vec![
        Hostile {
            what: "a symlink out of the tree",
            add: vec![("120000", blob(bare, b"/etc/shadow"), "leak")],
            expect: "leak: symbolic link points outside the memory directory",
        },
        Hostile {
            what: "a symlink into .git",
            add: vec![("120000", blob(bare, b".git/config"), "cfg")],
            expect: "cfg: symbolic link points outside the memory directory",
        },
        Hostile {
            what: "a .gitattributes filter",
            add: vec![("100644", blob(bare, b"* filter=evil\n"), ".gitattributes")],
            expect: ".gitattributes: ",
        },
        Hostile {
            what: "a submodule",
            add: vec![
                (
                    "100644",
                    blob(bare, b"[submodule \"s\"]\n\tpath = s\n\turl = /tmp/x\n"),
                    ".gitmodules",
                ),
                (
                    "160000",
                    "1234567890123456789012345678901234567890".into(),
                    "s",
                ),
            ],
            expect: "s: gitlink",
        },
        Hostile {
            what: "a file over the byte limit",
            add: vec![("100644", blob(bare, &big), "big.txt")],
            expect: "big.txt: 2097152 bytes exceeds",
        },
        Hostile {
            what: "names equal but for case",
            add: vec![
                ("100644", blob(bare, b"a\n"), "Notes.txt"),
                ("100644", blob(bare, b"b\n"), "notes.txt"),
            ],
            expect: "differs only in case",
        },
        Hostile {
            what: "a control character in a name",
            add: vec![("100644", blob(bare, b"x\n"), "evil\u{1b}]0;pwned\u{7}.txt")],
            expect: "control character U+001B",
        },
        Hostile {
            what: "a .git directory",
            add: vec![(
                "040000",
                tree(bare, &[("100644", sub.clone(), "config")]),
                ".git",
            )],
            expect: ".git/config: ",
        },
        Hostile {
            what: "a constraints change nobody here approved",
            add: vec![("100644", blob(bare, config), ".memfs.config.json")],
            expect: "requires human approval",
        },
    ]
}

/// §2, §3: a fast-forward to any hostile tree is refused; `main`, the
/// checkout and its `.git` pointer stay exactly as they were, the next sync
/// says the same (not `dirty`), and doctor says why.
#[test]
fn a_hostile_fast_forward_is_refused_and_main_stays() {
    let t = Tenant::synced();
    let good = main_of(&t.bare());
    for h in hostile_trees(&t.bare()) {
        git_in(&t.bare(), &["update-ref", "refs/heads/main", &good], b"");
        let before = t.local_state();
        plant(&t.bare(), &h.add, &[]);
        for round in 0..2 {
            let (o, v) = t.sync(&[]);
            assert!(!o.status.success(), "{}: {v}", h.what);
            assert_eq!(v["status"], "invalid", "{} (round {round}): {v}", h.what);
            let message = v["message"].as_str().unwrap();
            assert!(message.contains(h.expect), "{}: {message}", h.what);
            assert_eq!(t.local_state(), before, "{}: local state changed", h.what);
        }
        let found = t.doctor();
        assert!(
            found
                .iter()
                .any(|f| f.contains("\"sync\" \"error\"") && f.contains(h.expect)),
            "{}: doctor says {found:#?}",
            h.what
        );
    }
}

/// §3: a remote commit with a `.git` path used to fail every sync and take
/// the checkout's `.git` pointer with it. Now it is refused, the agent still
/// commits, and once the remote is fixed the sync carries on.
#[test]
fn a_dot_git_path_on_the_remote_breaks_nothing_and_the_fixed_remote_syncs() {
    let t = Tenant::synced();
    let pointer = std::fs::read(t.memory().join(".git")).unwrap();
    for (n, name) in [".git", ".GIT"].into_iter().enumerate() {
        plant(
            &t.bare(),
            &[("100644", blob(&t.bare(), b"gitdir: /etc\n"), name)],
            &[],
        );
        let before = t.local_state();
        let (o, v) = t.sync(&[]);
        assert!(!o.status.success(), "{v}");
        assert_eq!(v["status"], "invalid", "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{name}: ")),
            "{v}"
        );
        assert_eq!(t.local_state(), before);

        // The agent still commits...
        let file = format!("kept-{n}.md");
        ok(on(
            t.home.path(),
            t.root.path(),
            &[
                "memory",
                "create",
                "-a",
                "al",
                &file,
                "--description",
                "Kept.",
                "--body",
                "still writing",
            ],
        ));
        // ...and the remote, fixed by a commit that removes the path,
        // takes the local commit on top of its own.
        let fixed = plant(&t.bare(), &[], &[name]);
        let (o, v) = t.sync(&[]);
        assert!(o.status.success(), "{v}");
        assert_eq!(v["status"], "pushed", "{v}");
        assert_eq!(main_of(&t.bare()), t.main());
        let ancestry = Command::new("git")
            .arg("--git-dir")
            .arg(t.bare())
            .args(["merge-base", "--is-ancestor", &fixed, "main"])
            .status()
            .unwrap();
        assert!(
            ancestry.success(),
            "the fixed remote is not in main's history"
        );
        assert!(t.memory().join(&file).is_file());
        assert_eq!(std::fs::read(t.memory().join(".git")).unwrap(), pointer);
    }
}

/// §2 for a clone: a host that has never seen the agent refuses a remote
/// whose memory is hostile, and keeps nothing of it.
#[test]
fn a_hostile_remote_is_not_cloned() {
    let t = Tenant::synced();
    plant(
        &t.bare(),
        &[("120000", blob(&t.bare(), b"/etc/shadow"), "leak")],
        &[],
    );
    let other = open_home();
    let o = on(other.path(), t.root.path(), &["sync", "-a", "al", "--json"]);
    assert!(!o.status.success(), "{}", stdout(&o));
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        text.contains("leak: symbolic link points outside"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(other.path().join("agents"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| n.to_string_lossy().ends_with(".json")),
        "{left:?}"
    );
}

/// A second agent in the same home, with a secret committed; its git
/// directory, and the secret's blob id.
fn victim(home: &Path) -> (PathBuf, String) {
    let id = create_agent(home, &["victim"]);
    ok(run(
        home,
        &[
            "memory",
            "create",
            "-a",
            "victim",
            "secret.md",
            "--description",
            "Secret.",
            "--body",
            "the victim's secret 4711",
        ],
    ));
    let git_dir = home.join("agents").join(&id).join("memory.git");
    let secret = object_at(&git_dir, "main:secret.md");
    (git_dir, secret.trim().to_string())
}

/// Every file of a git directory with its bytes: a refused sync writes
/// nothing there.
fn snapshot(git_dir: &Path) -> Files {
    files(git_dir)
        .into_iter()
        .filter(|(p, _)| !p.ends_with(".lock"))
        .collect()
}

/// §1, critical: the remote path of one tenant made a way into another
/// tenant's repository — a symlink at `<root>/<id>.git`, a symlink inside
/// a real directory there, `objects/info/alternates`, a `commondir` file,
/// a `.git` inside. Each is refused naming the path: no object of the other
/// agent reaches this agent's repository and nothing is written into the
/// other's, with and without `--repair`; `agent list --remote` does not
/// read it either.
#[test]
fn a_remote_path_leading_into_another_tenants_repository_is_refused() {
    let home = open_home();
    let h = home.path();
    let root = tempfile::tempdir().unwrap();
    let al = create_agent(h, &["al"]);
    let (theirs, secret) = victim(h);
    let mine = h.join("agents").join(&al).join("memory.git");
    let bare = root.path().join(format!("{al}.git"));
    let objects = theirs.join("objects");
    let setups: Vec<Setup> = vec![
        (
            "a symlink to the other repository",
            Box::new(|| std::os::unix::fs::symlink(&theirs, &bare).unwrap()),
        ),
        (
            "a symlinked objects directory",
            Box::new(|| {
                git_ok(
                    Path::new("/"),
                    &["init", "-q", "--bare", bare.to_str().unwrap()],
                );
                std::fs::remove_dir_all(bare.join("objects")).unwrap();
                std::os::unix::fs::symlink(&objects, bare.join("objects")).unwrap();
            }),
        ),
        (
            "alternates",
            Box::new(|| {
                git_ok(
                    Path::new("/"),
                    &["init", "-q", "--bare", bare.to_str().unwrap()],
                );
                std::fs::write(
                    bare.join("objects/info/alternates"),
                    format!("{}\n", objects.display()),
                )
                .unwrap();
            }),
        ),
        (
            "a commondir file",
            Box::new(|| {
                std::fs::create_dir(&bare).unwrap();
                std::fs::write(bare.join("commondir"), format!("{}\n", theirs.display())).unwrap();
            }),
        ),
        (
            "a gitfile inside",
            Box::new(|| {
                std::fs::create_dir(&bare).unwrap();
                std::fs::write(bare.join(".git"), format!("gitdir: {}\n", theirs.display()))
                    .unwrap();
            }),
        ),
    ];
    for (what, setup) in setups {
        let _ = std::fs::remove_file(&bare);
        let _ = std::fs::remove_dir_all(&bare);
        setup();
        let before = snapshot(&theirs);
        for args in [&[][..], &["--repair"][..]] {
            let mut all = vec!["sync", "-a", "al", "--json"];
            all.extend_from_slice(args);
            let o = on(h, root.path(), &all);
            let text = format!("{}{}", stdout(&o), stderr(&o));
            assert!(!o.status.success(), "{what}: {text}");
            assert!(
                text.contains(&bare.display().to_string()) && text.contains("refus"),
                "{what}: the refusal names the path: {text}"
            );
            assert!(
                !has_object(&mine, &secret),
                "{what}: the other tenant's memory reached this agent"
            );
            assert_eq!(
                snapshot(&theirs),
                before,
                "{what}: written into the other tenant"
            );
        }
        let v = json(on(h, root.path(), &["agent", "list", "--remote", "--json"]));
        let listed = v["agents"].as_array().unwrap();
        assert!(
            listed
                .iter()
                .all(|a| a["name"] != "victim" && a["name"] != "al"),
            "{what}: listed as an agent: {v}"
        );
    }
}

/// §1: a remote root inside the home (where every agent's repository is)
/// is refused too.
#[test]
fn a_remote_root_inside_the_home_is_refused() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["al"]);
    for root in [h.to_path_buf(), h.join("agents")] {
        let o = on(h, &root, &["sync", "-a", "al", "--json"]);
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!o.status.success(), "{text}");
        assert!(text.contains("inside the home"), "{text}");
    }
}

/// §2 through a turn: the agent's own commit meets a hostile remote; the
/// sync after the turn refuses it, `main` keeps the agent's commit only,
/// and the agent's next turn is told why (`MEMORY SYNC FAILED`).
#[test]
fn a_turn_meeting_a_hostile_remote_leaves_a_sync_failed_reminder() {
    if !confinement_or_skip("hostile remote after a turn") {
        return;
    }
    let t = Tenant::synced();
    let hostile = plant(
        &t.bare(),
        &[("120000", blob(&t.bare(), b"/etc/shadow"), "leak")],
        &[],
    );
    ok(on(
        t.home.path(),
        t.root.path(),
        &["chat", "-a", "al", "-p", "记住: 我住在杭州"],
    ));
    let human = std::fs::read_to_string(t.memory().join("human.md")).unwrap();
    assert!(human.contains("我住在杭州"), "{human}");
    assert!(!t.memory().join("leak").exists());
    assert_eq!(main_of(&t.bare()), hostile, "nothing was pushed");
    let pending = std::fs::read_to_string(
        t.agent_dir()
            .join("conversations/default/pending-reminders.json"),
    )
    .unwrap();
    assert!(pending.contains("MEMORY SYNC FAILED"), "{pending}");
    assert!(
        pending.contains("leak: symbolic link points outside"),
        "{pending}"
    );
}

/// Two homes, one agent: A creates and pushes it, B clones it.
struct TwoHosts {
    root: tempfile::TempDir,
    a: tempfile::TempDir,
    b: tempfile::TempDir,
    id: String,
}

impl TwoHosts {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let a = open_home();
        let b = open_home();
        let id = create_agent(a.path(), &["al"]);
        let v = json(on(a.path(), root.path(), &["sync", "-a", "al", "--json"]));
        assert_eq!(v["status"], "pushed", "{v}");
        let v = json(on(b.path(), root.path(), &["sync", "-a", "al", "--json"]));
        assert_eq!(v["cloned"], true, "{v}");
        TwoHosts { root, a, b, id }
    }

    fn replace(&self, home: &Path, new: &str) -> String {
        ok(on(
            home,
            self.root.path(),
            &[
                "memory",
                "replace",
                "-a",
                "al",
                "persona.md",
                "--old",
                "a helpful assistant that remembers",
                "--new",
                new,
            ],
        ));
        main_of(&home.join("agents").join(&self.id).join("memory.git"))
    }
}

/// §5: a repair that cannot keep the local side (the mock repair worker
/// re-applies facts only; this change is not one) must not report success:
/// non-zero, the paths it could not carry over named, the backup ref kept.
#[test]
fn a_repair_that_drops_the_local_change_fails_and_loses_nothing() {
    if !confinement_or_skip("sync --repair that cannot carry the change") {
        return;
    }
    let h = TwoHosts::new();
    h.replace(h.a.path(), "an assistant that speaks like a sailor");
    json(on(
        h.a.path(),
        h.root.path(),
        &["sync", "-a", "al", "--json"],
    ));
    let local = h.replace(h.b.path(), "an assistant that speaks like a pirate");
    let o = on(
        h.b.path(),
        h.root.path(),
        &["sync", "-a", "al", "--repair", "--json"],
    );
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    assert!(!o.status.success(), "reported success: {v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("persona.md"), "{v}");
    assert!(message.contains("not carried over"), "{v}");
    let backup = v["backup_ref"].as_str().unwrap();
    let b_git = h.b.path().join("agents").join(&h.id).join("memory.git");
    let kept = git_ok(
        Path::new("/"),
        &["--git-dir", b_git.to_str().unwrap(), "rev-parse", backup],
    );
    assert_eq!(kept.trim(), local, "the backup ref holds the local commit");
    let text = git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            b_git.to_str().unwrap(),
            "show",
            &format!("{backup}:persona.md"),
        ],
    );
    assert!(text.contains("speaks like a pirate"), "{text}");
}

/// Issue 43: a remote file over the size limit is refused from its header,
/// and the refusal names its path — which the remote chose. A name made of
/// escape sequences reaches neither `sync`'s nor `doctor`'s output raw,
/// and nothing of the blob is fetched.
#[test]
fn an_oversized_remote_file_with_an_escape_in_its_name_is_refused_visibly() {
    let t = Tenant::synced();
    let before = t.local_state();
    let big = vec![b'x'; 2 << 20];
    let name = "big\u{1b}]0;pwned\u{7}\u{1b}[2J.txt";
    let oid = blob(&t.bare(), &big);
    plant(&t.bare(), &[("100644", oid.clone(), name)], &[]);
    for args in [&["sync", "-a", "al"][..], &["doctor", "-a", "al"][..]] {
        let o = on(t.home.path(), t.root.path(), args);
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!o.status.success(), "{args:?}: {text}");
        assert!(text.contains("bytes exceeds"), "{args:?}: {text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{args:?}: {text:?}"
        );
    }
    assert!(!has_object(&t.git_dir(), &oid), "the blob was fetched");
    assert_eq!(t.local_state(), before, "local state changed");
}
