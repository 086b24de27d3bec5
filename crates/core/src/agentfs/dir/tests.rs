//! The handles against a real tree: symlinks, FIFOs, devices and large
//! files refused, writes that never follow, listings and their caps.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::agentfs::beneath::{FILE_FLAGS, open_beneath_walk};

fn tree() -> (tempfile::TempDir, Dir) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::create_dir_all(p.join("in/a")).unwrap();
    std::fs::write(p.join("in/a/f.md"), "hello").unwrap();
    std::fs::write(p.join("outside.txt"), "secret").unwrap();
    std::os::unix::fs::symlink("../outside.txt", p.join("in/up")).unwrap();
    std::os::unix::fs::symlink("a", p.join("in/alias")).unwrap();
    std::os::unix::fs::symlink("f.md", p.join("in/a/same")).unwrap();
    let c = std::ffi::CString::new(p.join("in/fifo").as_os_str().as_bytes()).unwrap();
    nix::unistd::mkfifo(c.as_c_str(), Mode::from_bits_truncate(0o600)).unwrap();
    let d = Dir::open(&p.join("in")).unwrap();
    (t, d)
}

#[test]
fn reads_below_and_refuses_every_symlink() {
    let (_t, d) = tree();
    assert_eq!(d.read_file_capped("a/f.md", 100).unwrap().0, b"hello");
    for rel in [
        "up",
        "alias/f.md",
        "a/same",
        "../outside.txt",
        "/etc/passwd",
        "a/../a/f.md",
    ] {
        let e = d.read_file_capped(rel, 100).unwrap_err();
        assert!(
            matches!(e, FsError::Symlink { .. } | FsError::BadName { .. }),
            "{rel}: {e}"
        );
    }
    assert!(matches!(d.open_dir("alias"), Err(FsError::Symlink { .. })));
    assert_eq!(d.read_link("up").unwrap(), "../outside.txt");
}

#[test]
fn fifos_devices_and_large_files_are_refused_without_blocking() {
    let (t, d) = tree();
    let e = d.read_file_capped("fifo", 100).unwrap_err();
    assert!(e.to_string().contains("not a regular file (FIFO)"), "{e}");
    let dev = Dir::open(Path::new("/dev")).unwrap();
    let e = dev.read_file_capped("zero", 100).unwrap_err();
    assert!(matches!(e, FsError::NotRegular { .. }), "{e}");
    std::fs::write(t.path().join("in/big"), vec![b'x'; 101]).unwrap();
    let e = d.read_file_capped("big", 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: 101 bytes exceeds the 100-byte file limit",
            t.path().join("in/big").display()
        )
    );
    assert_eq!(d.read_file_capped("big", 101).unwrap().0.len(), 101);
}

#[test]
fn the_component_walk_refuses_what_openat2_refuses() {
    let (_t, d) = tree();
    let ok = open_beneath_walk(d.fd.as_fd(), OsStr::new("a/f.md"), FILE_FLAGS);
    assert!(ok.is_ok());
    for rel in [
        "up",
        "alias/f.md",
        "a/same",
        "../outside.txt",
        "/etc/passwd",
        "a//f.md",
    ] {
        let e = open_beneath_walk(d.fd.as_fd(), OsStr::new(rel), FILE_FLAGS).unwrap_err();
        assert!(
            matches!(e, Errno::ELOOP | Errno::ENOTDIR | Errno::EXDEV),
            "{rel}: {e}"
        );
    }
}

#[test]
fn the_root_is_not_followed_even_with_a_trailing_slash() {
    let (t, _d) = tree();
    let link = t.path().join("in/alias");
    let mut slashed = link.clone().into_os_string();
    slashed.push("/");
    for p in [link.clone(), PathBuf::from(slashed)] {
        assert!(
            matches!(
                Dir::open(&p),
                Err(FsError::Symlink { .. } | FsError::NotADirectory { .. })
            ),
            "{}",
            p.display()
        );
    }
}

#[test]
fn writes_replace_entries_and_never_follow() {
    let (t, d) = tree();
    d.create_file("new.md", b"one", 0o644).unwrap();
    assert!(d.create_file("up", b"x", 0o644).is_err());
    d.replace_file("new.md", b"two", 0o600).unwrap();
    let (bytes, st) = d.read_file_capped("new.md", 10).unwrap();
    assert_eq!((bytes.as_slice(), st.perm), (&b"two"[..], 0o600));
    // Replacing a symlink replaces the link, not its target.
    d.replace_file("up", b"mine", 0o644).unwrap();
    assert_eq!(
        std::fs::read(t.path().join("outside.txt")).unwrap(),
        b"secret"
    );
    assert_eq!(d.read_file_capped("up", 10).unwrap().0, b"mine");
    // The unsynced kind is as atomic and as careful with links.
    d.replace_file_unsynced("up", b"again", 0o640).unwrap();
    let (bytes, st) = d.read_file_capped("up", 10).unwrap();
    assert_eq!((bytes.as_slice(), st.perm), (&b"again"[..], 0o640));
    assert_eq!(
        std::fs::read(t.path().join("outside.txt")).unwrap(),
        b"secret"
    );
    assert!(d.replace_file_unsynced("../x", b"no", 0o600).is_err());
    let a = d.open_dir("a").unwrap();
    d.rename_to("new.md", &a, "moved.md").unwrap();
    assert!(d.stat_at("new.md").unwrap().is_none());
    a.remove_file("moved.md").unwrap();
    a.remove_file("same").unwrap();
    assert_eq!(std::fs::read(t.path().join("in/a/f.md")).unwrap(), b"hello");
    a.remove_file("f.md").unwrap();
    d.remove_dir("a").unwrap();
    assert_eq!(d.list(10).unwrap(), ["alias", "fifo", "up"]);
}

#[test]
fn root_writes_in_an_agents_directory_belong_to_the_agent() {
    if !nix::unistd::geteuid().is_root() {
        let msg = "SKIPPED (loudly): root_writes_in_an_agents_directory_belong_to_the_agent needs root to chown";
        assert!(
            std::env::var_os("MINI_LETTA_REQUIRE_SANDBOX").is_none_or(|v| v != "1"),
            "{msg}, and MINI_LETTA_REQUIRE_SANDBOX=1 forbids skipping"
        );
        eprintln!("{msg}");
        return;
    }
    let (t, d) = tree();
    std::os::unix::fs::chown(t.path().join("in/a"), Some(4242), Some(4343)).unwrap();
    let a = d.open_dir("a").unwrap();
    a.create_file("c.md", b"c", 0o644).unwrap();
    a.replace_file("r.md", b"r", 0o644).unwrap();
    drop(a.open_append("log", 0o644).unwrap());
    let sub = a.create_dir("sub", 0o755).unwrap();
    for name in ["c.md", "r.md", "log", "sub"] {
        let st = a.stat_at(name).unwrap().unwrap();
        assert_eq!((st.uid, st.gid), (4242, 4343), "{name}");
    }
    // In root's own directory, nothing changes hands.
    d.create_file("mine", b"m", 0o644).unwrap();
    assert_eq!(d.stat_at("mine").unwrap().unwrap().uid, 0);
    drop(sub);
    // A hard-linked log is not appended to.
    std::fs::hard_link(t.path().join("in/a/log"), t.path().join("in/a/log2")).unwrap();
    assert!(matches!(
        a.open_append("log", 0o644),
        Err(FsError::HardLinked { links: 2, .. })
    ));
}

#[test]
fn listing_entries_and_caps() {
    let (_t, d) = tree();
    let names = d.list(10).unwrap();
    assert_eq!(names, ["a", "alias", "fifo", "up"]);
    // Listing twice gives the same answer (no shared position).
    assert_eq!(d.list(10).unwrap(), names);
    assert!(matches!(d.list(3), Err(FsError::TooManyEntries { .. })));
    let e = d.entry("alias").unwrap().unwrap();
    assert_eq!(e.stat().kind, Kind::Symlink);
    assert!(e.open_dir().is_err());
    let a = d.entry("a").unwrap().unwrap();
    assert_eq!(a.open_dir().unwrap().list(10).unwrap(), ["f.md", "same"]);
    assert!(d.entry("nope").unwrap().is_none());
    let made = d.create_dir("new", 0o700).unwrap();
    assert_eq!(made.stat().unwrap().perm, 0o700);
    assert!(d.create_dir("alias", 0o700).is_err());
}
