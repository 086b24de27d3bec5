//! Several hosts under one etcd cluster (issue 35): a real three-member
//! etcd on loopback and two supervisors with separate homes sharing a
//! directory remote. One host owns an agent at a time; the other is
//! refused naming it, takes over when the owner's lease expires (with
//! everything the owner acknowledged), the old owner comes back to a
//! refusal, and without an etcd quorum nothing runs and nothing is pushed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::cluster::{Hosts, LEASE, signal};
use common::etcd::Etcd;
use common::remote::main_of;
use common::*;
use serde_json::Value;

/// Two hosts sharing a fresh three-member etcd on loopback and a remote
/// root, or `None` after saying loudly why not (failing under
/// `MINI_LETTA_REQUIRE_SANDBOX=1`).
fn hosts(test: &str) -> Option<Hosts> {
    if !confinement_or_skip(test) {
        return None;
    }
    Etcd::start(test).map(Hosts::new)
}

/// The message of the remote's newest fence commit of agent `id`.
fn fence_text(h: &Hosts, id: &str) -> String {
    git_at(
        &h.bare(id),
        &["log", "-1", "--format=%B", "refs/mini-letta/fence"],
    )
}

/// The epoch a fence commit's message is stamped with.
fn stamped_epoch(text: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix("epoch: "))
        .and_then(|e| e.trim().parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {text:?}"))
}

fn owner_of(status: &Value, id: &str) -> Value {
    status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .map(|a| a["owner"].clone())
        .unwrap_or(Value::Null)
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}{}", stdout(o), stderr(o));
    stdout(o)
}

#[test]
fn one_owner_at_a_time_failover_fencing_and_quorum() {
    let Some(mut h) = hosts("cluster") else {
        return;
    };
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    h.start(&h.b);

    // A's turn: A owns the agent, and what it acknowledged is on the remote.
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    assert_eq!(h.owner_key(&id), "host-a");
    let s = h.status(&h.b);
    assert_eq!(owner_of(&s, &id), "host-a", "{s}");
    assert!(h.remote_file(&id, "human.md").contains("我住在杭州"));

    // B is refused, naming A (it clones the agent first: that is local).
    let o = h.chat(&h.b, &[], "你知道我什么？");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("host-a"), "{}", stderr(&o));
    let remote_before = main_of(&h.bare(&id));

    // A learns one more thing; acknowledged means on the remote.
    ok(&h.chat(&h.a, &[], "记住: 我喜欢绿茶"));
    assert_ne!(main_of(&h.bare(&id)), remote_before);
    assert!(h.remote_file(&id, "human.md").contains("我喜欢绿茶"));

    // A's supervisor stops answering: B takes over once A's lease is gone,
    // and knows what A acknowledged.
    signal(a_pid, nix::sys::signal::Signal::SIGSTOP);
    let began = Instant::now();
    let o = h.chat(&h.b, &["--wait-owner", "30"], "你知道我什么？");
    let took = began.elapsed();
    let answer = ok(&o);
    assert!(answer.contains("我喜欢绿茶"), "{answer}");
    assert!(
        took < Duration::from_secs(LEASE + 6),
        "B answered after {took:?} (lease {LEASE} s)"
    );
    assert_eq!(h.owner_key(&id), "host-b");
    ok(&h.chat(&h.b, &[], "记住: 我养了一只猫"));
    let b_history = main_of(&h.bare(&id));
    assert!(h.remote_file(&id, "human.md").contains("我养了一只猫"));

    // A wakes up: its next turn is refused, and the remote is B's, untouched.
    signal(a_pid, nix::sys::signal::Signal::SIGCONT);
    let o = h.chat(&h.a, &[], "记住: 我喜欢咖啡");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("host-b"), "{}", stderr(&o));
    assert_eq!(main_of(&h.bare(&id)), b_history);
    assert!(!h.remote_file(&id, "human.md").contains("我喜欢咖啡"));
    let s = h.status(&h.a);
    assert_eq!(owner_of(&s, &id), "host-b", "{s}");
    let hosts = s["hosts"].as_array().unwrap();
    let b_row = hosts.iter().find(|r| r["id"] == "host-b").unwrap();
    assert_eq!(b_row["alive"], true, "{s}");
    assert_eq!(b_row["agents"], 1, "{s}");
    // Palace shows the owner.
    let site = tempfile::tempdir().unwrap();
    let out = site.path().join("site");
    ok(&h.on(&h.a, &["palace", "export", out.to_str().unwrap()]));
    let index = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(index.contains("<th>Owner</th>"), "{index}");
    assert!(index.contains("<td>host-b</td>"), "{index}");

    // One member down: turns still work.
    h.etcd.kill(0);
    ok(&h.chat(&h.b, &[], "记住: 我会弹钢琴"));
    assert!(h.remote_file(&id, "human.md").contains("我会弹钢琴"));

    // Two down: refused within a bounded time, naming etcd; nothing pushed.
    h.etcd.kill(1);
    let before = main_of(&h.bare(&id));
    let began = Instant::now();
    let o = h.chat(&h.b, &[], "记住: 我会游泳");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("etcd"), "{}", stderr(&o));
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(main_of(&h.bare(&id)), before);
    let b_memory = h.b.home.path().join(format!("agents/{id}/memory/human.md"));
    assert!(
        !std::fs::read_to_string(b_memory)
            .unwrap()
            .contains("我会游泳")
    );
}

#[test]
fn release_and_clean_stop_give_the_agent_back() {
    let Some(h) = hosts("cluster release") else {
        return;
    };
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    h.start(&h.a);
    h.start(&h.b);
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    assert_eq!(h.owner_key(&id), "host-a");

    // `agent release`: B may take it at once.
    let o = h.on(&h.a, &["agent", "release", "agent-demo"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(h.owner_key(&id), "");
    ok(&h.chat(&h.b, &[], "记住: 我喜欢绿茶"));
    assert_eq!(h.owner_key(&id), "host-b");

    // A host that does not own it cannot release it.
    let o = h.on(&h.a, &["agent", "release", "agent-demo"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("host-b"), "{}", stderr(&o));

    // A clean stop releases what it owned: A takes over without waiting.
    let o = h.on(&h.b, &["supervisor", "stop"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(h.owner_key(&id), "");
    let s = h.status(&h.a);
    let b_row = s["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "host-b")
        .cloned()
        .unwrap();
    assert_eq!(b_row["alive"], false, "{s}");
    let began = Instant::now();
    let answer = ok(&h.chat(&h.a, &[], "你知道我什么？"));
    assert!(answer.contains("我喜欢绿茶"), "{answer}");
    assert!(
        began.elapsed() < Duration::from_secs(LEASE),
        "waited for a lease"
    );

    // Every owner change is a record of the host's audit log, in order,
    // with its epoch: A took, released, took again; B took and, stopping,
    // gave back.
    let changes = |host: &common::cluster::Host| -> Vec<(String, i64, u64)> {
        let o = h.on(host, &["audit", "log", "--kind", "owner", "--json"]);
        ok(&o)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["agent"] == id.as_str())
            .map(|r| {
                assert_eq!(r["host"], host.id, "{r}");
                (
                    r["change"].as_str().unwrap().to_string(),
                    r["epoch"].as_i64().unwrap(),
                    r["at_ms"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let a = changes(&h.a);
    let b = changes(&h.b);
    let kinds = |v: &[(String, i64, u64)]| v.iter().map(|c| c.0.clone()).collect::<Vec<_>>();
    assert_eq!(kinds(&a), ["taken", "released", "taken"], "{a:?}");
    assert_eq!(kinds(&b), ["taken", "released"], "{b:?}");
    // One epoch per ownership, and never two owners at once: in epoch
    // order, each ownership ended before the next one began.
    let mut spans: std::collections::BTreeMap<i64, (u64, Option<u64>)> = Default::default();
    for (change, epoch, at) in [a.clone(), b.clone()].concat() {
        let span = spans.entry(epoch).or_insert((0, None));
        match change.as_str() {
            "taken" => span.0 = at,
            _ => span.1 = Some(at),
        }
    }
    assert_eq!(spans.len(), 3, "{spans:?}");
    let spans: Vec<_> = spans.into_values().collect();
    for w in spans.windows(2) {
        let ended = w[0].1.expect("an earlier ownership never ended");
        assert!(ended <= w[1].0, "two owners at once: {spans:?}");
    }
}

/// Nothing configured: no etcd, no ownership, the commands say so.
#[test]
fn without_a_cluster_nothing_changes() {
    let home = open_home();
    let o = run(home.path(), &["cluster", "status", "--json"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("MINI_LETTA_ETCD"), "{}", stderr(&o));
}

/// `git --git-dir DIR ARGS`, which must succeed; its stdout.
fn git_at(dir: &std::path::Path, args: &[&str]) -> String {
    let o = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    stdout(&o)
}

/// Issue 43 §2: a host killed inside the remote's ref-lock window leaves
/// `main.lock` and `fence.lock` there. They blocked every take-over for
/// good (`refs/mini-letta/fence is being updated`); now the next owner —
/// whose etcd lease outlived the dead writer's — clears them and takes
/// over within the lease and a few seconds, with everything acknowledged,
/// and the remote stays consistent.
#[test]
fn a_writer_killed_in_the_remotes_lock_window_blocks_nobody() {
    let Some(h) = hosts("cluster lock window") else {
        return;
    };
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    h.start(&h.b);
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    let bare = h.bare(&id);
    let acknowledged = main_of(&bare);
    // What a writer killed between taking the locks and renaming them
    // leaves: both locks, each holding the value it was about to write.
    signal(a_pid, nix::sys::signal::Signal::SIGKILL);
    std::fs::write(
        bare.join("refs/heads/main.lock"),
        format!("{acknowledged}\n"),
    )
    .unwrap();
    let fence = git_at(&bare, &["rev-parse", "refs/mini-letta/fence"]);
    std::fs::write(bare.join("refs/mini-letta/fence.lock"), &fence).unwrap();

    let began = Instant::now();
    let answer = ok(&h.chat(&h.b, &["--wait-owner", "30"], "你知道我什么？"));
    let took = began.elapsed();
    assert!(answer.contains("我住在杭州"), "{answer}");
    assert!(
        took < Duration::from_secs(LEASE + 8),
        "B took over after {took:?} (lease {LEASE} s)"
    );
    assert_eq!(h.owner_key(&id), "host-b");
    assert!(!bare.join("refs/heads/main.lock").exists());
    assert!(!bare.join("refs/mini-letta/fence.lock").exists());
    // B writes on: main and the fence move together again.
    ok(&h.chat(&h.b, &[], "记住: 我养了一只猫"));
    assert!(h.remote_file(&id, "human.md").contains("我养了一只猫"));
    assert!(h.remote_file(&id, "human.md").contains("我住在杭州"));
    git_at(&bare, &["fsck", "--no-dangling"]);
    let fence = fence_text(&h, &id);
    let main = main_of(&bare);
    assert!(
        fence.contains("host: host-b") && fence.contains(&format!("main: {main}")),
        "the fence records B and the main it pushed: {fence}"
    );
}

/// Issue 43 §4: a remote whose `main` was rolled back behind the owners'
/// backs (acknowledged facts gone) was adopted silently at the next
/// take-over. The fence records the `main` each push acknowledged, so the
/// take-over refuses it, naming both commits, keeps the recorded history
/// under a backup ref, and pushes nothing.
#[test]
fn a_remote_rolled_back_is_refused_at_take_over() {
    let Some(h) = hosts("cluster rollback") else {
        return;
    };
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    h.start(&h.b);
    let bare = h.bare(&id);
    ok(&h.chat(&h.a, &[], "记住: rb-1"));
    let first = main_of(&bare);
    ok(&h.chat(&h.a, &[], "记住: rb-2"));
    ok(&h.chat(&h.a, &[], "记住: rb-3"));
    let last = main_of(&bare);
    assert!(h.remote_file(&id, "human.md").contains("rb-3"));
    // Someone with write access to the remote rolls main back; A dies.
    git_at(&bare, &["update-ref", "refs/heads/main", &first]);
    signal(a_pid, nix::sys::signal::Signal::SIGKILL);

    let o = h.chat(&h.b, &["--wait-owner", "30"], "你知道我什么？");
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(err.contains("rolled back"), "{err}");
    assert!(
        err.contains(&first) && err.contains(&last),
        "names both: {err}"
    );
    assert_eq!(main_of(&bare), first, "nothing pushed over it");
    // The recorded history is kept on B, whole.
    let b_git = h.b.home.path().join(format!("agents/{id}/memory.git"));
    let backups = git_at(
        &b_git,
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname)",
            "refs/mini-letta/backup/",
        ],
    );
    let kept = backups
        .lines()
        .find(|l| l.ends_with(&last))
        .unwrap_or_else(|| panic!("no backup at {last}: {backups}"));
    let name = kept.split(' ').next().unwrap();
    let human = git_at(&b_git, &["show", &format!("{name}:human.md")]);
    assert!(human.contains("rb-2") && human.contains("rb-3"), "{human}");
    // Restored on the remote, B takes over with everything.
    git_at(&bare, &["update-ref", "refs/heads/main", &last]);
    let answer = ok(&h.chat(&h.b, &["--wait-owner", "30"], "你知道我什么？"));
    assert!(answer.contains("rb-3"), "{answer}");
}

/// Issue 43 §3: etcd loses its data (every member's data directory gone,
/// the cluster started anew: revisions begin again from 1). No host could
/// take any agent over — each fresh epoch was below the remote's fence —
/// and the refusal did not say why. Now a supervisor that registers with
/// an etcd without an epoch base sets one past every fence in the remote
/// before anything is taken, so turns resume by themselves, with
/// everything acknowledged and larger fence epochs. An etcd restored from
/// an old snapshot (a base, but a stale one) is refused saying etcd lost
/// data, and `cluster recover` raises the base; fencing holds throughout.
#[test]
fn after_etcd_loses_its_data_turns_resume_with_fencing_intact() {
    let Some(mut h) = hosts("cluster etcd wipe") else {
        return;
    };
    // Revisions well above what the new cluster will have reached when B
    // takes over, as on any etcd that ran a while.
    let live = h.etcd.endpoints();
    for i in 0..60 {
        let o = h.etcd.ctl(&live, &["put", "/test/traffic", &i.to_string()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    let b_pid = h.start(&h.b);
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    let epoch_in = stamped_epoch;
    let old_epoch = epoch_in(&fence_text(&h, &id));
    assert!(old_epoch > 60, "{old_epoch}");
    signal(a_pid, nix::sys::signal::Signal::SIGKILL);
    h.etcd.wipe();

    // By itself: B re-registers, sets the base past the fence, takes over.
    let began = Instant::now();
    let answer = ok(&h.chat(&h.b, &["--wait-owner", "30"], "你知道我什么？"));
    assert!(answer.contains("我住在杭州"), "{answer}");
    assert!(
        began.elapsed() < Duration::from_secs(LEASE + 10),
        "{:?}",
        began.elapsed()
    );
    let base: i64 = h.etcd.get("/mini-letta/epoch-base").parse().unwrap();
    assert!(base > old_epoch, "base {base}, fence epoch {old_epoch}");
    ok(&h.chat(&h.b, &[], "记住: 我养了一只猫"));
    let fence = fence_text(&h, &id);
    assert!(fence.contains("host: host-b"), "{fence}");
    let b_epoch = epoch_in(&fence);
    assert!(b_epoch > old_epoch, "{fence}");

    // etcd restored from an old snapshot: a base, but below the fences.
    h.start(&h.a);
    signal(b_pid, nix::sys::signal::Signal::SIGKILL);
    let o = h.etcd.ctl(&live, &["put", "/mini-letta/epoch-base", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = h.chat(&h.a, &["--wait-owner", "15"], "你知道我什么？");
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        err.contains("lost its data") && err.contains("cluster recover"),
        "{err}"
    );
    assert!(
        fence_text(&h, &id).contains("host: host-b"),
        "nothing pushed"
    );

    let o = h.on(&h.a, &["cluster", "recover", "--json"]);
    let v: Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(v["largest_fence_epoch"], b_epoch, "{v}");
    assert_eq!(v["base_before"], 1, "{v}");
    assert!(v["base"].as_i64().unwrap() > b_epoch, "{v}");
    assert_eq!(v["fences"][0]["host"], "host-b", "{v}");
    // Again: nothing to do, the base never goes down.
    let again: Value =
        serde_json::from_str(&ok(&h.on(&h.a, &["cluster", "recover", "--json"]))).unwrap();
    assert_eq!(again["base"], v["base"], "{again}");
    assert_eq!(again["base_before"], v["base"], "{again}");

    let answer = ok(&h.chat(&h.a, &["--wait-owner", "30"], "你知道我什么？"));
    assert!(answer.contains("我养了一只猫"), "{answer}");
    let fence = fence_text(&h, &id);
    assert!(fence.contains("host: host-a"), "{fence}");
    assert!(epoch_in(&fence) > b_epoch, "{fence}");
    let human = h.remote_file(&id, "human.md");
    assert!(
        human.contains("我住在杭州") && human.contains("我养了一只猫"),
        "{human}"
    );
}

/// Issue 43, LOW: a duplicate host id, or a planted host key (no lease, so
/// it never expires), was reported as "unreachable or without quorum"
/// with the cause only in the log. The refusal now names the cause.
#[test]
fn a_host_id_in_use_or_planted_is_named_as_such() {
    let Some(h) = hosts("cluster host id") else {
        return;
    };
    create_agent(h.b.home.path(), &["agent-demo"]);
    h.start(&h.a);
    // B's supervisor, given A's id by mistake.
    let twin = common::cluster::Host {
        home: tempfile::tempdir().unwrap(),
        id: "host-a",
        env: Vec::new(),
    };
    let _ = std::fs::remove_dir(twin.home.path());
    std::fs::rename(h.b.home.path(), twin.home.path()).unwrap();
    std::fs::create_dir(h.b.home.path()).unwrap();
    let o = h.chat(&twin, &[], "hello");
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        err.contains("in use by another live supervisor") && err.contains("MINI_LETTA_HOST_ID"),
        "{err}"
    );
    assert!(!err.contains("without quorum"), "{err}");
    // A key written by hand for host-c: it never expires.
    let live = h.etcd.endpoints();
    let o = h.etcd.ctl(&live, &["put", "/mini-letta/hosts/host-c", "x"]);
    assert!(o.status.success());
    let planted = common::cluster::Host {
        home: twin.home,
        id: "host-c",
        env: Vec::new(),
    };
    let o = h.chat(&planted, &[], "hello");
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        err.contains("holds no lease") && err.contains("etcdctl del"),
        "{err}"
    );
}

/// Issue 43, LOW: an owner key under a key that is no agent id (planted)
/// was counted for the host its value names. It is listed, flagged and
/// counted for no host.
#[test]
fn planted_owner_keys_with_invalid_agent_ids_count_for_no_host() {
    let Some(etcd) = Etcd::start("cluster planted owner keys") else {
        return;
    };
    let h = Hosts::new(etcd);
    let live = h.etcd.endpoints();
    for key in [
        "/mini-letta/agents/NOT AN ID/owner",
        "/mini-letta/agents/agent-\u{1b}[2J/owner",
    ] {
        let o = h.etcd.ctl(&live, &["put", key, "host-a"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let s = h.status(&h.b);
    let a_row = s["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "host-a")
        .cloned()
        .unwrap_or(Value::Null);
    assert!(
        a_row.is_null() || a_row["agents"] == 0,
        "planted keys counted for host-a: {s}"
    );
    let planted: Vec<&Value> = s["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["valid"] == false)
        .collect();
    assert_eq!(planted.len(), 2, "{s}");
    assert!(!s.to_string().contains('\u{1b}'), "{s}");
    let o = h.on(&h.b, &["cluster", "status"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("name no agent id"), "{}", stderr(&o));
    assert!(!stdout(&o).contains('\u{1b}'), "{}", stdout(&o));
}

/// Issue 43, LOW: `cluster status` failed 4 reads of 10 with one etcd
/// member down, and every read past 4 MiB of planted values (gRPC's
/// message limit). It is answered by any live member, in pages.
#[test]
fn cluster_status_answers_with_a_member_down_and_past_4_mib_of_planted_values() {
    let Some(mut h) = hosts("cluster status paged") else {
        return;
    };
    h.start(&h.a);
    let row_of = |s: &Value, id: &str| {
        s["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    // Planted: five values of 1 MiB each (stdin: one argument may not
    // be that long).
    let live = h.etcd.endpoints();
    for i in 0..5 {
        let mut put = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &live,
                "put",
                &format!("/mini-letta/zz-planted/{i}"),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        put.stdin
            .take()
            .unwrap()
            .write_all(&vec![b'v'; 1024 * 1024])
            .unwrap();
        assert!(put.wait().unwrap().success());
    }
    let s = h.status(&h.b);
    assert_eq!(row_of(&s, "host-a")["alive"], true, "{s}");
    h.etcd.kill(0);
    for i in 0..10 {
        let o = h.on(&h.b, &["cluster", "status", "--json"]);
        assert!(o.status.success(), "read {i} failed: {}", stderr(&o));
        let s: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(row_of(&s, "host-a")["alive"], true, "{s}");
    }
}

/// Issue 43, LOW: a frozen etcd leader (SIGSTOP: its connections stay
/// open, nothing answers) cost every request sent to it the whole bound —
/// re-sent only on connect errors — and turns failed naming etcd. A try
/// unanswered for a third of the bound is sent again; turns go on.
#[test]
fn a_frozen_etcd_leader_does_not_stop_the_turns() {
    let Some(h) = hosts("cluster frozen leader") else {
        return;
    };
    create_agent(h.a.home.path(), &["agent-demo"]);
    h.start(&h.a);
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    let leader = h.etcd.leader().expect("no etcd leader");
    h.etcd.freeze(leader, true);
    // A new leader is elected within about one election timeout.
    std::thread::sleep(Duration::from_millis(1500));
    let mut failed = Vec::new();
    for i in 0..8 {
        let began = Instant::now();
        let o = h.chat(&h.a, &[], &format!("记住: 事实{i}"));
        let took = began.elapsed();
        if !o.status.success() || took > Duration::from_secs(4) {
            failed.push(format!("turn {i}: {took:?}: {}", stderr(&o)));
        }
    }
    h.etcd.freeze(leader, false);
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Issue 43, LOW: a host paused while it held the remote's ref locks had
/// its push land, and its turn acknowledged, after its lease expired.
/// The owner's supervisor is stopped the moment its `main.lock` appears in
/// the remote (a thread watches for it); B takes over once A's lease is
/// gone; A, woken, lands nothing: its turn is not acknowledged and the
/// remote is B's.
#[test]
fn a_host_paused_inside_the_lock_window_lands_nothing_after_its_lease() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(h) = hosts("cluster paused in the lock window") else {
        return;
    };
    let id = create_agent(h.a.home.path(), &["agent-demo"]);
    let a_pid = h.start(&h.a);
    h.start(&h.b);
    ok(&h.chat(&h.a, &[], "记住: 我住在杭州"));
    let lock = h.bare(&id).join("refs/heads/main.lock");
    let mut caught = None;
    for n in 0..40 {
        let stop = AtomicBool::new(false);
        let paused = AtomicBool::new(false);
        let fact = format!("事实-a-{n}");
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if lock.exists() {
                        signal(a_pid, nix::sys::signal::Signal::SIGSTOP);
                        // Stopped while the lock is still there: caught.
                        if lock.exists() {
                            paused.store(true, Ordering::SeqCst);
                            return;
                        }
                        signal(a_pid, nix::sys::signal::Signal::SIGCONT);
                    }
                    std::hint::spin_loop();
                }
            });
            let turn = s.spawn(|| h.chat(&h.a, &[], &format!("记住: {fact}")));
            // The turn returns when it is done, or not at all while A is
            // stopped: then B goes ahead.
            let began = Instant::now();
            while !turn.is_finished() && !paused.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
                if began.elapsed() > Duration::from_secs(30) {
                    break;
                }
            }
            if paused.load(Ordering::SeqCst) {
                // A holds the locks, stopped. B takes over after A's lease.
                let o = h.chat(&h.b, &["--wait-owner", "30"], "记住: 我养了一只猫");
                let b_main = main_of(&h.bare(&id));
                signal(a_pid, nix::sys::signal::Signal::SIGCONT);
                let a_turn = turn.join().unwrap();
                caught = Some((o, a_turn, fact.clone(), b_main));
            } else {
                stop.store(true, Ordering::Relaxed);
                let _ = turn.join();
            }
        });
        if caught.is_some() {
            break;
        }
    }
    let Some((b_turn, a_turn, fact, b_main)) = caught else {
        panic!("never caught A inside the lock window in 40 turns");
    };
    assert!(b_turn.status.success(), "B: {}", stderr(&b_turn));
    assert!(
        !a_turn.status.success(),
        "A's turn was acknowledged after its lease: {}",
        stdout(&a_turn)
    );
    // Its stream never claimed the change was made good: the memory line
    // says it is this host's until pushed, and the end says it was not.
    let a_err = stderr(&a_turn);
    assert!(
        a_err.contains("· memory changed")
            && a_err.contains("on this host; acknowledged only once the turn pushes it")
            && a_err.contains("not acknowledged"),
        "{a_err}"
    );
    // Whatever A did once woken, the remote is B's.
    std::thread::sleep(Duration::from_millis(500));
    let main = main_of(&h.bare(&id));
    assert_eq!(main, b_main, "the remote moved after B's turn");
    let human = h.remote_file(&id, "human.md");
    assert!(human.contains("我养了一只猫"), "{human}");
    assert!(!human.contains(&fact), "A's paused push landed: {human}");
    let fence = fence_text(&h, &id);
    assert!(fence.contains("host: host-b"), "{fence}");
}

/// Issue 43, LOW: `cluster status` showed a killed host alive for the
/// rest of its lease. Liveness (lease renewals) is shown apart from the
/// lease: the killed host is not alive while its lease still holds.
#[test]
fn cluster_status_shows_a_killed_host_dead_before_its_lease_ends() {
    let Some(h) = hosts("cluster status liveness") else {
        return;
    };
    let a_pid = h.start(&h.a);
    h.start(&h.b);
    let row = |s: &Value| {
        s["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == "host-a")
            .cloned()
            .unwrap_or(Value::Null)
    };
    // Registered (a supervisor answers on its socket before it has joined
    // the cluster; a loaded machine shows the gap).
    assert!(
        wait_until(10, || row(&h.status(&h.b))["alive"] == true),
        "host-a never showed up alive: {}",
        h.status(&h.b)
    );
    // Alive across several renewals.
    for _ in 0..5 {
        let r = row(&h.status(&h.b));
        assert_eq!(
            (r["alive"].clone(), r["lease"].clone()),
            (true.into(), true.into()),
            "{r}"
        );
        std::thread::sleep(Duration::from_millis(400));
    }
    signal(a_pid, nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let mut seen = Vec::new();
    while killed.elapsed() < Duration::from_secs(LEASE + 3) {
        let r = row(&h.status(&h.b));
        seen.push((
            killed.elapsed().as_millis(),
            r["alive"].clone(),
            r["lease"].clone(),
        ));
        if r["lease"] != true {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.iter()
            .any(|(_, alive, lease)| *alive == false && *lease == true),
        "never shown dead while its lease held: {seen:?}"
    );
    assert!(
        seen.last().is_some_and(|(_, _, lease)| *lease != true),
        "its lease never ended: {seen:?}"
    );
}
