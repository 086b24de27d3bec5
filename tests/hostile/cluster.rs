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
    // JSON does not report it as a host id; it shows it, visibly.
    let o = h.on(&h.b, &["cluster", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(row["owner_valid"], false, "{row}");
    let owner = row["owner"].as_str().unwrap();
    assert!(
        owner.contains("evil") && !owner.contains('\u{1b}'),
        "{owner:?}"
    );
}

/// Write `value` under `key` in etcd as a hostile party with access to it
/// would: any bytes, any size etcd takes, no lease.
fn plant(etcd: &Etcd, key: &[u8], value: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let endpoints: Vec<String> = etcd.endpoints().split(',').map(String::from).collect();
        let mut c = etcd_client::Client::connect(endpoints, None).await.unwrap();
        c.put(key, value, None).await.unwrap();
    });
}

/// No raw escape, bell or other control character, and no byte of a
/// planted value that was not UTF-8.
fn terminal_safe(what: &str, text: &[u8]) {
    let text = std::str::from_utf8(text).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(bad.is_empty(), "{what}: raw {bad:?} in {text:?}");
}

/// etcd's data is not trusted (threat model, attacker 3): owner values
/// that are no host id — a megabyte, bytes that are not UTF-8, a value
/// equal to this host's id but under no lease of its — and keys naming
/// agents and hosts with escapes and a path. Each is refused or shown
/// visibly and briefly (never a megabyte on a terminal, a page or in an
/// error), nothing is opened by it, and nothing planted is acted on: the
/// agents stay refused and the planted keys stay as they were.
#[test]
fn hostile_etcd_data_is_refused_or_shown_visibly_never_trusted() {
    let Some(etcd) = Etcd::start("hostile etcd data") else {
        return;
    };
    let h = Hosts::new(etcd);
    let huge_id = create_agent(h.b.home.path(), &["agent-huge"]);
    let garbage_id = create_agent(h.b.home.path(), &["agent-garbage"]);
    let self_id = create_agent(h.b.home.path(), &["agent-self"]);
    let huge = "H".repeat(1 << 20);
    let garbage = b"\xff\xfe\x1b[31mred\x1b[0m\x9b2J\x00end".as_slice();
    let owner = |id: &str| mini_letta::cluster::owner_key(id).into_bytes();
    plant(&h.etcd, &owner(&huge_id), huge.as_bytes());
    plant(&h.etcd, &owner(&garbage_id), garbage);
    plant(&h.etcd, &owner(&self_id), b"host-b");
    plant(
        &h.etcd,
        b"/mini-letta/agents/../../etc\x1b]0;x\x07/owner",
        b"host-z",
    );
    plant(&h.etcd, b"/mini-letta/hosts/\x1b[2Jevil", b"{not json\x07");
    plant(
        &h.etcd,
        format!("/mini-letta/members/{huge}").as_bytes(),
        b"{}",
    );
    let planted: Vec<(String, String)> = [&huge_id, &garbage_id, &self_id]
        .iter()
        .map(|id| (id.to_string(), h.owner_key(id)))
        .collect();

    // Turns: refused, each error one short visible line naming what is wrong.
    for name in ["agent-huge", "agent-garbage", "agent-self"] {
        let o = h.on(&h.b, &["chat", "-a", name, "-p", "hi"]);
        assert!(!o.status.success(), "{name}: {}", stdout(&o));
        terminal_safe(name, &o.stderr);
        assert!(
            o.stderr.len() < 2048,
            "{name}: {} bytes of error",
            o.stderr.len()
        );
        assert!(
            stderr(&o).contains("owned by host"),
            "{name}: {}",
            stderr(&o)
        );
    }
    let o = h.on(&h.b, &["chat", "-a", "agent-huge", "-p", "hi"]);
    assert!(stderr(&o).contains("bytes"), "{}", stderr(&o));
    let o = h.on(&h.b, &["agent", "release", "agent-huge"]);
    assert!(!o.status.success());
    terminal_safe("release", &o.stderr);
    assert!(o.stderr.len() < 2048, "{} bytes of error", o.stderr.len());

    // `cluster status`: short, visible, every planted row there.
    let o = h.on(&h.b, &["cluster", "status"]);
    assert!(o.status.success(), "{}", stderr(&o));
    terminal_safe("status", &o.stdout);
    assert!(o.stdout.len() < 8192, "{} bytes of status", o.stdout.len());
    let out = stdout(&o);
    assert!(out.contains("etc"), "{out}");
    assert!(out.contains("evil"), "{out}");
    let o = h.on(&h.b, &["cluster", "status", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.len() < 8192, "{} bytes of JSON", o.stdout.len());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = |id: &str| {
        v["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id)
            .cloned()
            .unwrap()
    };
    // An owner that is no host id is not reported as one.
    for id in [&huge_id, &garbage_id] {
        let r = row(id);
        assert_eq!(r["owner_valid"], false, "{r}");
        assert!(r["owner"].as_str().unwrap().len() < 256, "{r}");
    }
    assert_eq!(row(&self_id)["owner"], "host-b");

    // Palace: the owner column stays short and escaped.
    let site = tempfile::tempdir().unwrap();
    let dir = site.path().join("site");
    let o = h.on(&h.b, &["palace", "export", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let index = std::fs::read(dir.join("index.html")).unwrap();
    assert!(index.len() < 64 * 1024, "{} bytes of index", index.len());
    terminal_safe("palace", &index);

    // Nothing planted was acted on: no key taken over, none deleted.
    for (id, value) in planted {
        assert_eq!(h.owner_key(&id), value, "{id}'s owner key changed");
    }
}
