//! Every spelling of a remote root gets one check (issue 43 §1, critical).
//!
//! A `file://` root skipped every check a directory root gets: with
//! `<root>/<Y's id>.git` a symlink to tenant X's `memory.git`, Y's sync
//! fetched X's memory into Y's repository, `--repair` checked it out, and
//! with the symlink at X's remote, Y's push landed there. Roots that git
//! would read as an option (`--upload-pack=…`) or as a transport that runs
//! a program (`fd::`, `ext::`) were taken as a relative path or hung the
//! sync for two minutes. Each test is the attack.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::remote::{has_object, main_of, object_at, ok};
use crate::common::*;

/// `mini-letta ARGS` on `home` with the remote root spelled `root`, run
/// in `cwd` (a relative root would land there).
fn on_root(home: &Path, root: &str, cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Every file below `dir` with its bytes (lock files aside).
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() && !p.to_string_lossy().ends_with(".lock") {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

/// Tenant X: a home of its own with agent `xx`, a secret committed and
/// synced to X's own remote root. Its `memory.git`, its remote repository
/// and the secret's blob id.
struct TenantX {
    _home: tempfile::TempDir,
    _root: tempfile::TempDir,
    git_dir: PathBuf,
    remote: PathBuf,
    secret: String,
}

fn tenant_x() -> TenantX {
    let home = open_home();
    let root = tempfile::tempdir().unwrap();
    let id = create_agent(home.path(), &["xx"]);
    ok(run(
        home.path(),
        &[
            "memory",
            "create",
            "-a",
            "xx",
            "secret.md",
            "--description",
            "Secret.",
            "--body",
            "SECRET-X-42",
        ],
    ));
    let o = on_root(
        home.path(),
        root.path().to_str().unwrap(),
        root.path(),
        &["sync", "-a", "xx", "--json"],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let git_dir = home.path().join("agents").join(&id).join("memory.git");
    let secret = object_at(&git_dir, "main:secret.md");
    let remote = root.path().join(format!("{id}.git"));
    assert!(remote.is_dir());
    TenantX {
        _home: home,
        _root: root,
        git_dir,
        remote,
        secret,
    }
}

/// The spellings of one directory root as a `file://` URL.
fn file_urls(root: &Path) -> Vec<String> {
    let r = root.display();
    vec![
        format!("file://{r}"),
        format!("file://{r}/"),
        format!("file://localhost{r}"),
        format!("FILE://{r}"),
    ]
}

/// §1: Y's remote root, spelled as a `file://` URL, holds a symlink at
/// Y's repository into X's `memory.git` or X's remote repository. Every
/// spelling is refused naming the path, with and without `--repair`: no
/// byte of X's history reaches Y's repository, nothing is written into
/// X's, and `agent list --remote` reads neither.
#[test]
fn a_file_url_root_gets_every_check_of_a_directory_root() {
    let x = tenant_x();
    let home = open_home();
    let h = home.path();
    let cwd = tempfile::tempdir().unwrap();
    let y = create_agent(h, &["yy"]);
    let mine = h.join("agents").join(&y).join("memory.git");
    let y_main = main_of(&mine);
    for target in [&x.git_dir, &x.remote] {
        let root = tempfile::tempdir().unwrap();
        let link = root.path().join(format!("{y}.git"));
        std::os::unix::fs::symlink(target, &link).unwrap();
        let (before_git, before_remote) = (files(&x.git_dir), files(&x.remote));
        for url in file_urls(root.path()) {
            for args in [&[][..], &["--repair"][..]] {
                let mut all = vec!["sync", "-a", "yy", "--json"];
                all.extend_from_slice(args);
                let o = on_root(h, &url, cwd.path(), &all);
                let text = format!("{}{}", stdout(&o), stderr(&o));
                assert!(!o.status.success(), "{url} {args:?}: {text}");
                assert!(
                    text.contains("refus") && text.contains(&link.display().to_string()),
                    "{url}: the refusal names the path: {text}"
                );
                assert!(
                    !has_object(&mine, &x.secret),
                    "{url} {args:?}: X's memory reached Y's repository"
                );
                assert_eq!(main_of(&mine), y_main, "{url}: Y's main moved");
                let checkout = std::fs::read_dir(h.join("agents").join(&y).join("memory"))
                    .unwrap()
                    .flatten()
                    .any(|e| e.file_name() == "secret.md");
                assert!(!checkout, "{url}: X's memory checked out in Y's");
                assert_eq!(files(&x.git_dir), before_git, "{url}: written into X");
                assert_eq!(files(&x.remote), before_remote, "{url}: pushed into X");
            }
            let o = on_root(
                h,
                &url,
                cwd.path(),
                &["agent", "list", "--remote", "--json"],
            );
            let text = stdout(&o);
            assert!(
                !text.contains("\"xx\"") && !text.contains("\"yy\""),
                "{url}: the symlinked repository was read: {text}{}",
                stderr(&o)
            );
        }
    }
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing made relative to the working directory"
    );
}

/// §1, the other side: a `file://` root is a directory root in every
/// respect — made on first use, synced in-process, listed by name and
/// cloned by another home — so the same root spelled either way works.
#[test]
fn a_file_url_root_syncs_lists_and_clones_like_a_path() {
    let home = open_home();
    let h = home.path();
    let root = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let url = format!("file://{}", root.path().display());
    let id = create_agent(h, &["al"]);
    let o = on_root(h, &url, cwd.path(), &["sync", "-a", "al", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["status"], "pushed", "{v}{}", stderr(&o));
    let bare = root.path().join(format!("{id}.git"));
    assert_eq!(
        main_of(&bare),
        main_of(&h.join("agents").join(&id).join("memory.git"))
    );
    let o = on_root(
        h,
        &url,
        cwd.path(),
        &["agent", "list", "--remote", "--json"],
    );
    let text = ok(o);
    assert!(text.contains(&id) && text.contains("\"al\""), "{text}");
    // Another home clones it by name through the same spelling.
    let other = open_home();
    let o = on_root(
        other.path(),
        &url,
        cwd.path(),
        &["chat", "-a", "al", "-p", "hello"],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        other
            .path()
            .join("agents")
            .join(&id)
            .join("memory.git")
            .is_dir()
    );
}

/// §1: roots git would read as an option or as a transport that runs a
/// program are refused before any git starts, quickly, saying why: no
/// marker file is made by a planted command, nothing is created relative
/// to the working directory, and no sync waits out git's timeout.
#[test]
fn a_root_git_would_read_as_an_option_or_a_program_is_refused() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["al"]);
    let cwd = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let marker = marks.path().join("ran");
    let m = marker.display();
    let roots = [
        format!("--upload-pack=touch {m}:x"),
        format!("-oProxyCommand=touch {m}"),
        "fd::3".to_string(),
        format!("ext::sh -c touch% {m}"),
        format!("ssh://-oProxyCommand=touch%20{m}/x"),
        "git@-oProxyCommand=x:y".to_string(),
        format!("git@-oProxyCommand=touch {m}:x"),
        "relative/mem".to_string(),
        "gopher://example.invalid/mem".to_string(),
        "file://elsewhere.example/srv/mem".to_string(),
        "file:///srv/\u{1b}]0;pwned\u{7}mem".to_string(),
    ];
    for root in &roots {
        let started = Instant::now();
        let o = on_root(h, root, cwd.path(), &["sync", "-a", "al", "--json"]);
        let took = started.elapsed();
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!o.status.success(), "{root:?}: {text}");
        assert!(
            text.contains("refusing the remote root"),
            "{root:?}: says the root is refused: {text}"
        );
        assert!(
            took < Duration::from_secs(20),
            "{root:?}: the refusal took {took:?}"
        );
        assert!(
            !text.contains('\u{1b}'),
            "{root:?}: an escape reached the output"
        );
        assert!(!marker.exists(), "{root:?}: a planted command ran");
        assert_eq!(
            std::fs::read_dir(cwd.path()).unwrap().count(),
            0,
            "{root:?}: something was made in the working directory"
        );
    }
}
