use serde_json::json;

use super::*;
use crate::protocol::frames::Outcome;

#[test]
fn a_reply_goes_on_the_wire_as_the_untyped_one_did() {
    // The bytes of a reply are a JSON object with sorted keys, whatever
    // the field order here.
    let started = Started {
        child: 7,
        pid: 42,
        agent: "agent-1".into(),
        role: "agent".into(),
        warm: false,
        timings: None,
    };
    let Outcome::Result(v) = Outcome::reply(&started) else {
        panic!("a reply is a result");
    };
    assert_eq!(
        serde_json::to_string(&v).expect("json"),
        r#"{"agent":"agent-1","child":7,"pid":42,"role":"agent"}"#
    );
    let warm = Started {
        warm: true,
        ..started
    };
    assert_eq!(serde_json::to_value(&warm).expect("json")["warm"], true);
}

#[test]
fn a_newer_supervisors_fields_do_not_break_a_reader() {
    let v = json!({
        "running": true, "pid": 1, "uptime_ms": 5, "home": "/h", "socket": "/h/s",
        "version": "9", "protocol": 1, "children": 0, "children_known": 0,
        "cli_requests": 3, "something_new": {"x": 1}
    });
    let status: SupervisorStatus = decode(v).expect("an added field is ignored");
    assert_eq!(status.cli_requests, 3);
    // Where a reply is printed whole, what it does not know is kept.
    let merged: Merged = decode(json!({
        "status": "merged", "summary": "s", "commit_count": 1, "merge_commit": "abc",
        "changed_paths": ["a.md"], "branch": "b", "conflicts": [], "later": true
    }))
    .expect("merged");
    assert_eq!(merged.branch, "b");
    assert_eq!(merged.rest["later"], true);
    assert_eq!(serde_json::to_value(&merged).expect("json")["later"], true);
}

#[test]
fn a_ps_row_carries_its_state_and_a_live_childs_figures_flat() {
    let row = ChildRow {
        id: 3,
        agent: "a".into(),
        agent_name: "n".into(),
        role: "tool".into(),
        pid: 9,
        uptime_ms: 1000,
        state: ChildState::Exited { code: 2 },
        first_frame_us: None,
        figures: None,
    };
    let v = serde_json::to_value(&row).expect("json");
    assert_eq!(v["state"], "exited");
    assert_eq!(v["code"], 2);
    assert!(v.get("cpu_ms").is_none(), "an ended child has no figures");
    let live = ChildRow {
        state: ChildState::Running,
        figures: Some(LiveFigures {
            cpu_ms: 12,
            memory_bytes: 4096,
            peak_memory_bytes: None,
        }),
        ..row
    };
    let v = serde_json::to_value(&live).expect("json");
    assert_eq!(v["cpu_ms"], 12);
    let back: ChildRow = decode(v).expect("round trip");
    assert_eq!(back, live);
}

#[test]
fn a_turns_answer_is_the_launch_with_its_end() {
    let v = json!({
        "child": 4, "pid": 10, "agent": "a", "role": "agent",
        "exit": {"state": "exited", "code": 0}, "conversation": "default",
        "cancelled": false,
        "reflection": {"launched": false, "reason": "no_payload", "message": "No new"},
        "sync": {"status": "push_failed", "message": "lease"},
        "timings": [{"name": "sup.received", "at_us": 1}]
    });
    let ended: TurnEnded = decode(v).expect("turn.run");
    assert_eq!(ended.started.child, 4);
    assert_eq!(ended.exit, ChildEnd::Exited { code: 0 });
    let reflection = ended.reflection.expect("a reflection");
    assert!(reflection.nothing_new());
    let sync = ended.sync.expect("a sync");
    assert_eq!(sync.status, SyncStatus::PushFailed);
    assert!(!sync.status.is_settled());
    assert_eq!(ended.started.timings.map(|t| t.len()), Some(1));
}

#[test]
fn a_result_record_is_read_by_its_parts_and_keeps_the_rest() {
    let record = json!({
        "status": "merged", "summary": "Merged 1", "message": "Reflected.",
        "branch": "reflection/x", "finishedAt": "2026-01-01T00:00:00Z",
        "merge": {"status": "merged", "summary": "Merged 1", "commit_count": 1,
                  "changed_paths": ["a.md"]},
        "task": {"status": "failed", "exit": {"state": "exited", "code": 1},
                 "report": "window too small"},
        "report": null
    });
    let r = SubagentResult::from_record(record.clone());
    assert!(r.merged());
    assert_eq!(r.merge_status(), "merged");
    assert_eq!(r.task.as_ref().map(|t| t.status), Some(TaskStatus::Failed));
    assert_eq!(r.rest["branch"], "reflection/x");
    assert_eq!(serde_json::to_value(&r).expect("json"), record);
    // Not a record at all: a failed run that says so, never a panic.
    let odd = SubagentResult::from_record(json!(["not", "a", "record"]));
    assert_eq!(odd.status, "failed");
    assert!(odd.summary.contains("unreadable"), "{}", odd.summary);
}

#[test]
fn a_workers_answer_says_which_of_three_it_is() {
    let queued = serde_json::to_value(WorkerStarted::queued(2)).expect("json");
    assert_eq!(
        queued,
        json!({"launched": false, "queued": true, "position": 2})
    );
    let launched = serde_json::to_value(WorkerStarted::launched(
        "a".into(),
        5,
        "/w".into(),
        "worker/x".into(),
    ))
    .expect("json");
    assert_eq!(
        launched,
        json!({"launched": true, "agent": "a", "child": 5, "worktree": "/w", "branch": "worker/x"})
    );
    let refused = WorkerStarted::refused(LaunchResult {
        launched: false,
        reason: Some(Refusal::Error),
        message: "no disk".into(),
        launch_id: None,
        conversations: Vec::new(),
        retry_at: None,
    });
    let v = serde_json::to_value(refused).expect("json");
    assert_eq!(
        v,
        json!({"launched": false, "reason": "error", "message": "no disk"})
    );
}

#[test]
fn a_running_slot_of_zero_is_one_being_prepared() {
    assert_eq!(RunningSlot::of(None), None);
    let preparing = RunningSlot::of(Some(0)).expect("a slot");
    assert!(preparing.preparing);
    assert_eq!(
        serde_json::to_value(&preparing).expect("json"),
        json!({"child": null, "preparing": true})
    );
    assert_eq!(
        serde_json::to_value(RunningSlot::of(Some(8))).expect("json"),
        json!({"child": 8})
    );
}
