//! Finding an agent by name reads the index and one record, and a stale,
//! torn or missing index never gives a wrong answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use mini_letta::paths::Home;
use mini_letta::store::{self, StoreError};

fn home_with(names: &[&str]) -> (tempfile::TempDir, Home, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path());
    let ids = names
        .iter()
        .map(|n| store::create(&home, n, None).unwrap().id)
        .collect();
    (dir, home, ids)
}

fn found_id(home: &Home, sel: Option<&str>) -> String {
    store::find(home, sel).unwrap().0.id
}

/// Through a current index, only the chosen record is read: another
/// agent's unreadable record does not stop the lookup (a scan would fail
/// on it).
#[test]
fn a_name_lookup_reads_the_index_and_one_record() {
    let (_d, home, ids) = home_with(&["alice", "bob"]);
    assert!(home.agents_index().is_file(), "create writes the index");
    std::fs::write(home.agent(&ids[1]).unwrap().agent_json(), b"{ torn").unwrap();
    assert_eq!(found_id(&home, Some("alice")), ids[0]);
    // The damaged record itself is still reported, by name and path.
    let err = store::find(&home, Some("bob")).unwrap_err();
    assert!(matches!(err, StoreError::Unreadable { .. }), "{err}");
    let path = home.agent(&ids[1]).unwrap().agent_json();
    assert!(
        err.to_string()
            .starts_with("agent \"bob\" exists but cannot be read: ")
            && err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// An index that maps a name to the wrong agent is caught by the record's
/// own name, and rebuilt.
#[test]
fn a_lying_index_is_not_believed() {
    let (_d, home, ids) = home_with(&["alice", "bob"]);
    let lie = serde_json::json!({"version": 1, "agents": [
        {"id": ids[0], "name": "bob"}, {"id": ids[1], "name": "alice"}]});
    std::fs::write(home.agents_index(), lie.to_string()).unwrap();
    assert_eq!(found_id(&home, Some("bob")), ids[1]);
    assert_eq!(found_id(&home, Some("alice")), ids[0]);
    let rebuilt = std::fs::read_to_string(home.agents_index()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&rebuilt).unwrap();
    assert_eq!(v["agents"][0]["name"], "alice", "{rebuilt}");
}

/// Missing, torn, or out of date (an agent directory the index does not
/// list, one it lists that is gone): every lookup still answers right.
#[test]
fn missing_torn_or_stale_indexes_rebuild() {
    let (_d, home, ids) = home_with(&["alice", "bob"]);
    std::fs::remove_file(home.agents_index()).unwrap();
    assert_eq!(found_id(&home, Some("bob")), ids[1]);
    assert!(home.agents_index().is_file(), "rebuilt after a scan");

    std::fs::write(home.agents_index(), b"\0\0not json").unwrap();
    assert_eq!(found_id(&home, Some("alice")), ids[0]);

    // An index written before bob existed: bob's directory is not in it.
    let old = serde_json::json!({"version": 1, "agents": [{"id": ids[0], "name": "alice"}]});
    std::fs::write(home.agents_index(), old.to_string()).unwrap();
    assert_eq!(found_id(&home, Some("bob")), ids[1]);
    let only = store::find(&home, None).unwrap_err();
    assert!(matches!(only, StoreError::Ambiguous(_)), "{only}");

    // Bob deleted behind the index's back: "the only agent" is alice.
    std::fs::remove_dir_all(home.agent(&ids[1]).unwrap().dir()).unwrap();
    assert_eq!(found_id(&home, None), ids[0]);
    let gone = store::find(&home, Some("bob")).unwrap_err();
    assert!(matches!(gone, StoreError::NotFound(_)), "{gone}");
}

/// Ids are read directly, and no agents at all is said plainly.
#[test]
fn ids_and_empty_homes() {
    let (_d, home, ids) = home_with(&["alice"]);
    assert_eq!(found_id(&home, Some(&ids[0])), ids[0]);
    let empty = tempfile::tempdir().unwrap();
    let err = store::find(&Home::at(empty.path()), None).unwrap_err();
    assert!(matches!(err, StoreError::NoAgents), "{err}");
}
