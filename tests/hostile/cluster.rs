//! A host that lost ownership while it was paused (issue 35): its turn was
//! under way — it had committed, not yet pushed — when its supervisor was
//! stopped for longer than its lease; another host took the agent over and
//! pushed. Back from the pause, the stale host must push nothing: its turn
//! fails saying ownership was lost, the remote's `main` stays the new
//! owner's, and the stale commit is kept under a backup ref.

use std::time::Duration;

use crate::common::cluster::{Hosts, signal};
use crate::common::etcd::Etcd;
use crate::common::remote::main_of;
use crate::common::*;

#[test]
fn a_stale_owner_back_from_a_pause_pushes_nothing() {
    if !confinement_or_skip("stale owner") {
        return;
    }
    let Some(etcd) = Etcd::start("stale owner") else {
        return;
    };
    let mut h = Hosts::new(etcd);
    // A's model commits at once, then answers slowly: the pause falls
    // between the turn's commit and its push.
    let script = h.a.home.path().join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"turns": [
            {"tool_calls": [{"name": "memory", "arguments": {
                "command": "insert", "file_path": "human.md",
                "insert_text": "- 我喜欢咖啡", "reason": "remember"}}]},
            {"text": "好的", "delay_ms": 3000}
        ]})
        .to_string(),
    )
    .unwrap();
    h.a.env.push((
        "MINI_LETTA_SCRIPTED_MODEL".into(),
        script.display().to_string(),
    ));
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    h.start(&h.b);
    let o = h.chat(&h.a, &[], "记住: 我住在杭州");
    assert!(o.status.success(), "{}", stderr(&o));
    let a_git = h.a.home.path().join(format!("agents/{id}/memory.git"));
    let acknowledged = main_of(&a_git);

    // A's slow turn: wait for its commit, then pause its supervisor.
    let turn = h
        .command(
            &h.a,
            &[
                "chat",
                "-a",
                "agent-demo",
                "--model",
                "mock/scripted",
                "-p",
                "x",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(30, || main_of(&a_git) != acknowledged),
        "A's turn did not commit"
    );
    let stale = main_of(&a_git);
    signal(a_pid, nix::sys::signal::Signal::SIGSTOP);

    // B takes the agent over and pushes its own history.
    let o = h.chat(&h.b, &["--wait-owner", "30"], "记住: 我养了一只猫");
    assert!(o.status.success(), "{}", stderr(&o));
    let b_history = main_of(&h.bare(&id));
    assert_eq!(h.owner_key(&id), "host-b");

    // A wakes; its turn ends refused, and pushed nothing.
    std::thread::sleep(Duration::from_millis(200));
    signal(a_pid, nix::sys::signal::Signal::SIGCONT);
    let out = turn.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "the stale turn reported success: {err}"
    );
    assert!(err.contains("ownership"), "{err}");
    assert_eq!(main_of(&h.bare(&id)), b_history, "the stale host pushed");
    let human = h.remote_file(&id, "human.md");
    assert!(!human.contains("我喜欢咖啡"), "{human}");
    assert!(human.contains("我养了一只猫"), "{human}");
    // The stale commit is kept, never lost.
    let refs = crate::common::remote::git_ok(
        std::path::Path::new("/"),
        &[
            "--git-dir",
            a_git.to_str().unwrap(),
            "for-each-ref",
            "--contains",
            &stale,
            "--format=%(refname)",
            "refs/mini-letta/backup/",
        ],
    );
    assert!(!refs.trim().is_empty(), "no backup ref holds {stale}");
}

/// etcd's data is not trusted (threat model, attacker 3): an owner key
/// planted with terminal escapes is shown visibly — in the refusal of a
/// turn and in `cluster status` — and the agent is still refused.
#[test]
fn an_owner_planted_with_escapes_never_reaches_the_terminal_raw() {
    let Some(etcd) = Etcd::start("planted owner") else {
        return;
    };
    let h = Hosts::new(etcd);
    let id = create_agent(h.b.home.path(), &["agent-demo"]);
    let evil = "evil\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let put = h.etcd.ctl(
        &h.etcd.endpoints(),
        &["put", &mini_letta::cluster::owner_key(&id), evil],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );

    let o = h.chat(&h.b, &[], "hi");
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(err.contains("is owned by host"), "{err}");
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    assert!(err.contains("evil"), "{err}");

    let o = h.on(&h.b, &["cluster", "status"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("evil"), "{out}");
    // JSON keeps the bytes exactly (escaped as JSON).
    let o = h.on(&h.b, &["cluster", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(row["owner"], evil);
}
