//! `agent import` of a crafted archive: a normal export whose
//! `memory.git` borrows another tenant's objects (`objects/info/alternates`),
//! rewrites history (`info/grafts`, `shallow`) or carries refs and files a
//! repository only needs on the host that made it (`refs/replace/`,
//! `refs/remotes/`, `packed-refs` lines, `objects/info/*`).

use std::path::{Path, PathBuf};

use crate::common::{self, open_home, run, stderr, stdout};
use crate::planted::{MARKER, Tenants, git};

/// A real export of a fresh agent named `decoy` made in another home
/// (so its id is free in the victim's), unpacked into a directory.
fn decoy_export(work: &Path) -> PathBuf {
    let home = open_home();
    common::create_agent(home.path(), &["decoy"]);
    let archive = work.join("decoy.tar.gz");
    let o = run(
        home.path(),
        &["agent", "export", "decoy", "-o", archive.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = work.join("unpacked");
    std::fs::create_dir(&dir).unwrap();
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(&archive).unwrap());
    tar::Archive::new(gz).unpack(&dir).unwrap();
    assert!(dir.join("memory.git/HEAD").is_file());
    dir
}

/// Pack `dir` (an unpacked export) back into `out`, entries in the order
/// an export writes them.
fn repack(dir: &Path, out: &Path) {
    let f = std::fs::File::create(out).unwrap();
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    for name in ["mini-letta-export.json", "agent.json"] {
        tar.append_path_with_name(dir.join(name), name).unwrap();
    }
    for name in ["memory.git", "memory", "conversations"] {
        if dir.join(name).exists() {
            tar.append_dir_all(name, dir.join(name)).unwrap();
        }
    }
    tar.into_inner().unwrap().finish().unwrap();
}

/// Import `archive` as `thief`.
fn import(t: &Tenants, archive: &Path) -> std::process::Output {
    run(
        t.path(),
        &[
            "agent",
            "import",
            archive.to_str().unwrap(),
            "--name",
            "thief",
        ],
    )
}

/// Nothing of a refused import is left in the home: no agent, no staging.
fn assert_nothing_left(t: &Tenants) {
    let left: Vec<String> = std::fs::read_dir(t.path().join("agents"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != &t.victim_id && n != "index.json")
        .collect();
    assert!(left.is_empty(), "a refused import left {left:?}");
    let o = run(t.path(), &["agent", "list", "--json"]);
    assert!(!stdout(&o).contains("thief"), "{}", stdout(&o));
}

/// Empty the archive's own object store (directories stay).
fn remove_own_objects(git_dir: &Path) {
    for e in std::fs::read_dir(git_dir.join("objects"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.len() == 2 || name == "pack" {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The archive: `objects/info/alternates` naming the victim's
/// objects, `main` set to the victim's commit, its own objects removed.
/// Before the fix the import was accepted (HEAD resolved and the tree
/// validated, through the alternate) and `memory show`, `prompt`,
/// `recompile` and Palace showed the victim's secret.
#[test]
fn alternates_archive_is_refused_and_never_shows_another_tenant() {
    let t = Tenants::new();
    let work = tempfile::tempdir().unwrap();
    let dir = decoy_export(work.path());
    let git_dir = dir.join("memory.git");
    remove_own_objects(&git_dir);
    write(
        &git_dir.join("objects/info/alternates"),
        &format!("{}\n", t.victim_objects().display()),
    );
    write(
        &git_dir.join("refs/heads/main"),
        &format!("{}\n", t.victim_commit),
    );
    let _ = std::fs::remove_file(git_dir.join("packed-refs"));
    let evil = work.path().join("evil.tar.gz");
    repack(&dir, &evil);

    let o = import(&t, &evil);
    let said = stderr(&o);
    assert!(!o.status.success(), "the import was accepted: {said}");
    assert!(
        said.contains("missing") && said.contains(&t.victim_commit),
        "the refusal does not say which object the archive lacks: {said}"
    );
    assert!(!said.contains(MARKER), "{said}");
    assert_nothing_left(&t);
    t.assert_never_shown("thief");
}

/// The same alternates file beside a complete object store, plus refs a
/// memory repository never needs from elsewhere: the agent is imported,
/// and none of it is kept.
#[test]
fn foreign_refs_and_object_info_are_not_imported() {
    let t = Tenants::new();
    let work = tempfile::tempdir().unwrap();
    let dir = decoy_export(work.path());
    let git_dir = dir.join("memory.git");
    let own = git(&git_dir, &["rev-parse", "refs/heads/main"]);
    write(
        &git_dir.join("objects/info/alternates"),
        &format!("{}\n", t.victim_objects().display()),
    );
    write(&git_dir.join("objects/info/http-alternates"), "http://x/\n");
    write(&git_dir.join("objects/info/commit-graph"), "not a graph");
    write(&git_dir.join("objects/stray"), "junk");
    // A replace ref would make the git CLI read the victim's commit in
    // place of the agent's own.
    write(
        &git_dir.join(format!("refs/replace/{own}")),
        &format!("{}\n", t.victim_commit),
    );
    write(
        &git_dir.join("refs/remotes/origin/main"),
        &format!("{}\n", t.victim_commit),
    );
    write(
        &git_dir.join("refs/tags/v1"),
        &format!("{}\n", t.victim_commit),
    );
    write(
        &git_dir.join("packed-refs"),
        &format!(
            "# pack-refs with: peeled fully-peeled sorted \n\
             {own} refs/heads/kept\n\
             {v} refs/remotes/origin/other\n\
             {v} refs/replace/{own}\n\
             {v} refs/tags/v2\n\
             ^{v}\n",
            v = t.victim_commit
        ),
    );
    let evil = work.path().join("evil.tar.gz");
    repack(&dir, &evil);

    let o = import(&t, &evil);
    assert!(o.status.success(), "{}", stderr(&o));
    let thief = t.other_agent_dirs().pop().unwrap();
    let imported = thief.join("memory.git");
    for gone in [
        "objects/info/alternates",
        "objects/info/http-alternates",
        "objects/info/commit-graph",
        "objects/stray",
        "refs/replace",
        "refs/remotes",
        "refs/tags/v1",
    ] {
        assert!(
            !imported.join(gone).exists(),
            "{gone} was imported into {}",
            imported.display()
        );
    }
    let refs = git(&imported, &["for-each-ref", "--format=%(refname)"]);
    let refs: Vec<&str> = refs.lines().collect();
    assert_eq!(refs, ["refs/heads/kept", "refs/heads/main"], "{refs:?}");
    let packed = std::fs::read_to_string(imported.join("packed-refs")).unwrap_or_default();
    assert!(!packed.contains(&t.victim_commit), "{packed}");
    let o = run(t.path(), &["memory", "show", "-a", "thief", "persona.md"]);
    assert!(o.status.success(), "{}", stderr(&o));
    t.assert_never_shown("thief");
}

/// `info/grafts` and `shallow` give the agent's commit the victim's as a
/// parent (with an alternate to find it). They are not imported; the
/// history read is the archive's own.
#[test]
fn grafts_and_shallow_archive_are_imported_without_them() {
    let t = Tenants::new();
    let work = tempfile::tempdir().unwrap();
    let dir = decoy_export(work.path());
    let git_dir = dir.join("memory.git");
    let own = git(&git_dir, &["rev-parse", "refs/heads/main"]);
    write(
        &git_dir.join("objects/info/alternates"),
        &format!("{}\n", t.victim_objects().display()),
    );
    write(
        &git_dir.join("info/grafts"),
        &format!("{own} {}\n", t.victim_commit),
    );
    write(&git_dir.join("shallow"), &format!("{own}\n"));
    let evil = work.path().join("evil.tar.gz");
    repack(&dir, &evil);

    let o = import(&t, &evil);
    assert!(o.status.success(), "{}", stderr(&o));
    let thief = t.other_agent_dirs().pop().unwrap();
    for gone in ["info/grafts", "shallow", "objects/info/alternates"] {
        assert!(!thief.join("memory.git").join(gone).exists(), "{gone}");
    }
    let log = run(t.path(), &["memory", "log", "-a", "thief"]);
    assert!(log.status.success(), "{}", stderr(&log));
    assert!(
        !stdout(&log).contains(&t.victim_commit[..7]),
        "{}",
        stdout(&log)
    );
    t.assert_never_shown("thief");
}

/// A history whose older commit is missing (a truncated object store,
/// no alternate at all) is refused, naming the object: every object
/// reachable from every kept ref must be in the archive itself.
#[test]
fn an_archive_missing_any_reachable_object_is_refused() {
    let t = Tenants::new();
    let work = tempfile::tempdir().unwrap();
    let dir = decoy_export(work.path());
    let git_dir = dir.join("memory.git");
    let own = git(&git_dir, &["rev-parse", "refs/heads/main"]);
    let persona = git(&git_dir, &["rev-parse", "refs/heads/main:persona.md"]);
    // A second branch whose tree holds a blob HEAD never names; then
    // that blob is lost.
    let lost = git_in(&git_dir, &["hash-object", "-w", "--stdin"], "only here\n");
    let tree = git_in(
        &git_dir,
        &["mktree"],
        &format!("100644 blob {persona}\tpersona.md\n100644 blob {lost}\tlost.md\n"),
    );
    let side = git(&git_dir, &["commit-tree", &tree, "-p", &own, "-m", "side"]);
    write(&git_dir.join("refs/heads/side"), &format!("{side}\n"));
    std::fs::remove_file(git_dir.join("objects").join(&lost[..2]).join(&lost[2..])).unwrap();
    let evil = work.path().join("evil.tar.gz");
    repack(&dir, &evil);

    let o = import(&t, &evil);
    let said = stderr(&o);
    assert!(!o.status.success(), "accepted: {said}");
    assert!(
        said.contains(&lost),
        "the refusal does not name {lost}: {said}"
    );
    assert_nothing_left(&t);
}

/// `git ARGS` on `git_dir` with `input` on its stdin; its trimmed stdout.
fn git_in(git_dir: &Path, args: &[&str], input: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut c = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "git {args:?}");
    stdout(&o).trim().to_string()
}
