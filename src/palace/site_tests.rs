//! Palace's data layer on a real agent: parameters that name things outside
//! the memory are refused, and rendering every page writes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use super::data::Site;
use super::{PalaceError, pages};
use crate::paths::Home;

fn fingerprint(root: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(
                e.path().to_string_lossy().into_owned(),
                (m.len(), m.modified().unwrap()),
            );
        }
    }
    out
}

/// An agent whose `main` also holds a symlink (`leak.md` → `/etc/passwd`),
/// as a hostile history could.
fn agent_with_symlink() -> (tempfile::TempDir, Home, String) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path());
    let record = crate::store::create(&home, "owl", None).unwrap();
    let paths = home.agent(&record.id).unwrap();
    let repo = crate::memfs::repo::open_agent(&paths).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let link = repo.blob(b"/etc/passwd").unwrap();
    let mut tb = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
    tb.insert("leak.md", link, 0o120000).unwrap();
    let tree = repo.find_tree(tb.write().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@x").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "a symlink", &tree, &[&head])
        .unwrap();
    (dir, home, record.id)
}

#[test]
fn parameters_never_reach_outside_the_memory() {
    let (_d, home, id) = agent_with_symlink();
    let site = Site::new(home, None, true);
    let status = |r: Result<super::data::FileView, PalaceError>| r.unwrap_err().status();
    assert_eq!(status(site.file(&id, "leak.md", None)), 404);
    assert_eq!(status(site.file(&id, "../agent.json", None)), 400);
    assert_eq!(status(site.file(&id, "/etc/passwd", None)), 400);
    assert_eq!(status(site.file(&id, "missing.md", None)), 404);
    let other = git2::Oid::from_str(&"1".repeat(40)).unwrap();
    assert_eq!(status(site.file(&id, "human.md", Some(other))), 404);
    assert!(
        site.file(&id, "human.md", None)
            .unwrap()
            .text
            .contains("name:")
    );
    assert_eq!(site.memory("../etc").unwrap_err().status(), 400);
    assert_eq!(site.memory("agent-nobody").unwrap_err().status(), 404);
    assert_eq!(site.conversation(&id, "../x").unwrap_err().status(), 400);
    assert_eq!(site.conversation(&id, "none").unwrap_err().status(), 404);
    // `-a` limits the site to one agent.
    let only = Site::new(site.home.clone(), Some("agent-other".into()), true);
    assert_eq!(only.memory(&id).unwrap_err().status(), 404);
}

#[test]
fn rendering_every_page_writes_nothing() {
    let (dir, home, id) = agent_with_symlink();
    let paths = home.agent(&id).unwrap();
    let mut conv = crate::store::conversation::Conversation::open(&paths, "default").unwrap();
    let mid = conv.next_id();
    conv.append(crate::store::conversation::StoredMessage::new(
        mid,
        crate::protocol::messages::Role::User,
        vec![crate::protocol::messages::Part::text("<b>hello</b>")],
    ))
    .unwrap();
    drop(conv);
    let before = fingerprint(dir.path());
    let site = Site::new(home, None, true);
    let all = pages::agent_site(&site, &id).unwrap();
    assert!(all.iter().any(|(p, _)| p.ends_with("c/default.html")));
    assert!(all.iter().any(|(p, _)| p.ends_with("history.html")));
    let conv_page = &all
        .iter()
        .find(|(p, _)| p.ends_with("c/default.html"))
        .unwrap()
        .1;
    assert!(conv_page.contains("&lt;b&gt;hello&lt;/b&gt;"), "escaped");
    assert!(!conv_page.contains("<b>hello"));
    let _ = site.search(&id, "hello").unwrap();
    let _ = site.agents().unwrap();
    assert_eq!(fingerprint(dir.path()), before, "a page wrote to the home");
}
