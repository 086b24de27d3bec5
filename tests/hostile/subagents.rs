//! Sub-agents' files (issue 37): a reflection's own directory
//! (`agents/<id>~reflection/`) was root's 0755 with world-readable system
//! prompts, and outlived `agent delete`; a memory worker's `memory.status`
//! described the main checkout instead of its worktree.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::common::*;
use mini_letta::protocol::{Call, SpawnParams, StdioMode};
use serde_json::Value;

fn ok(home: &Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Every entry under `dir` (not following symlinks), with its mode.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, std::fs::Metadata)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let is_dir = meta.is_dir();
        out.push((e.path(), meta));
        if is_dir {
            walk(&e.path(), out);
        }
    }
}

/// What a user who is neither root nor an agent can reach under
/// `agents/`: an entry readable or writable by others whose every
/// directory above (below `agents/`) lets others through, and anything
/// world-writable at all.
fn exposed(agents: &Path) -> Vec<String> {
    let mut all = Vec::new();
    walk(agents, &mut all);
    let mode_of: std::collections::HashMap<PathBuf, u32> = all
        .iter()
        .map(|(p, m)| (p.clone(), m.mode() & 0o7777))
        .collect();
    let reachable = |p: &Path| {
        p.ancestors()
            .skip(1)
            .take_while(|a| *a != agents)
            .all(|a| mode_of.get(a).is_some_and(|m| m & 0o001 != 0))
    };
    all.iter()
        .filter(|(_, m)| !m.file_type().is_symlink())
        .filter_map(|(p, m)| {
            let mode = m.mode() & 0o7777;
            let world_writable = mode & 0o002 != 0;
            let readable = mode & 0o004 != 0 && reachable(p);
            (world_writable || readable).then(|| {
                format!(
                    "{:o} {}",
                    mode,
                    p.strip_prefix(agents).unwrap_or(p).display()
                )
            })
        })
        .collect()
}

/// Make a reflection's directory as an older supervisor left it.
fn loosen(dir: &Path) {
    let mut all = Vec::new();
    walk(dir, &mut all);
    for (p, m) in all {
        let mode = if m.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn sub_agent_directories_are_private_and_go_with_their_agent() {
    if !confinement_or_skip("sub-agent directories") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let owl = create_agent(h, &["owl"]);
    let cat = create_agent(h, &["cat"]);
    for name in ["owl", "cat"] {
        ok(h, &["chat", "-a", name, "-p", "我住在杭州"]);
        ok(h, &["chat", "-a", name, "-p", "后台记住: 我养了一只猫"]);
        let v: Value =
            serde_json::from_str(&ok(h, &["reflect", "-a", name, "--json", "--wait"])).unwrap();
        assert_eq!(v["result"]["status"], "merged", "{v}");
    }
    let agents = h.join("agents");
    let reflection_dir = |id: &str| agents.join(format!("{id}~reflection"));
    assert!(reflection_dir(&owl).is_dir() && reflection_dir(&cat).is_dir());
    let open = exposed(&agents);
    assert!(open.is_empty(), "others can reach: {open:#?}");

    // An older supervisor's modes are made private when one starts.
    loosen(&reflection_dir(&owl));
    std::fs::set_permissions(
        agents.join("index.json"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    ok(h, &["supervisor", "start"]);
    ok(h, &["supervisor", "stop", "--timeout", "5"]);
    let open = exposed(&agents);
    assert!(open.is_empty(), "left open after a start: {open:#?}");

    // Deleted: nothing of the agent is left, under agents/ or beside it.
    let history = h.join("history").join(&cat);
    std::fs::create_dir_all(history.parent().unwrap()).unwrap();
    std::fs::write(&history, "我住在杭州\n").unwrap();
    ok(h, &["agent", "delete", "cat", "--yes"]);
    let mut left = Vec::new();
    walk(h, &mut left);
    let named: Vec<_> = left
        .iter()
        .map(|(p, _)| p.display().to_string())
        .filter(|p| p.contains(&cat))
        .collect();
    assert!(named.is_empty(), "left of the deleted agent: {named:#?}");
    let open = exposed(&agents);
    assert!(open.is_empty(), "others can reach: {open:#?}");
    assert!(reflection_dir(&owl).is_dir(), "another agent's files went");

    // One an older version left after deleting its agent goes at a start.
    let orphan = agents.join("agent-0123~reflection/conversations/reflection-1");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("system-prompt.json"), "{}").unwrap();
    ok(h, &["supervisor", "start"]);
    ok(h, &["supervisor", "stop", "--timeout", "5"]);
    assert!(!agents.join("agent-0123~reflection").exists());
    assert!(reflection_dir(&owl).is_dir(), "a living agent's went");
}

/// A memory-worker child started without a worktree (by the operator's
/// `child.spawn`) has no checkout of its own: its `memory.status` is
/// refused rather than answered with the main checkout's.
#[test]
fn a_worker_child_without_a_worktree_gets_no_status() {
    let d = Daemon::start(&["owl"]);
    let dir = d.path().join("agents").join(&d.agents[0]);
    std::fs::write(dir.join("memory/scratch.md"), "not committed\n").unwrap();
    let me = agent_bin();
    let probe = format!(
        "if {} channel call memory.status '{{}}' > status.out 2> status.err; then echo ok > status.rc; else echo refused > status.rc; fi",
        me.display()
    );
    let mut c = d.client();
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: d.agents[0].clone(),
            role: "memory-worker".into(),
            argv: vec!["sh".into(), "-c".into(), probe],
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some("off".into()),
            model: None,
        }))
        .unwrap();
    let child = v["child"].as_u64().unwrap();
    assert!(
        wait_until(30, || dir.join("status.rc").exists()
            && std::fs::read_to_string(dir.join("status.rc"))
                .is_ok_and(|s| s.ends_with('\n'))),
        "child {child} never answered"
    );
    let rc = std::fs::read_to_string(dir.join("status.rc")).unwrap();
    let out = std::fs::read_to_string(dir.join("status.out")).unwrap_or_default();
    assert_eq!(rc.trim(), "refused", "answered: {out}");
    assert!(!out.contains("scratch.md"), "{out}");
}
