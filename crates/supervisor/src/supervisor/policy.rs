//! Who may call what: one allow-list row per method, one column per kind of
//! peer. The supervisor decides from the connection's identity (the control
//! socket, or the role it recorded when it launched a child), never from
//! anything in the frame. `docs/protocol.md` shows the same table; a test
//! keeps the two equal.

/// The kinds of peer, in the table's column order.
pub const PEERS: &[&str] = &[
    "cli",
    "agent",
    "memory-worker",
    "reflection",
    "tool",
    "recall",
];

/// `(method, [cli, agent, memory-worker, reflection, tool, recall])`.
///
/// Why each child column is as narrow as it is:
/// * only the agent's turn loop reports turn events (a tool could forge
///   tool calls in `attach` otherwise);
/// * a tool command never reaches the model proxy (it would spend the
///   operator's API key);
/// * workers and reflections commit only in their own worktree (the
///   supervisor routes their `memory.commit` there from its child table);
///   it merges the worktree into `main` when they exit.
pub const TABLE: &[(&str, [bool; 6])] = &[
    ("ping", [true, true, true, true, true, true]),
    (
        "supervisor.status",
        [true, false, false, false, false, false],
    ),
    ("supervisor.stop", [true, false, false, false, false, false]),
    ("ps", [true, false, false, false, false, false]),
    ("child.spawn", [true, false, false, false, false, false]),
    ("child.kill", [true, false, false, false, false, false]),
    ("child.timings", [true, false, false, false, false, false]),
    (
        "events.subscribe",
        [true, false, false, false, false, false],
    ),
    ("memory.commit", [true, true, true, true, true, false]),
    ("memory.lease", [true, true, false, false, true, false]),
    ("memory.release", [true, true, false, false, true, false]),
    ("memory.status", [true, true, true, true, true, false]),
    ("model.complete", [true, true, true, true, false, true]),
    ("model.info", [true, true, true, true, false, true]),
    ("turn.run", [true, false, false, false, false, false]),
    ("turn.cancel", [true, false, false, false, false, false]),
    ("turn.event", [false, true, false, false, false, false]),
    ("log", [true, true, true, true, true, true]),
    ("task.get", [false, false, true, true, false, true]),
    ("task.finish", [false, false, true, true, false, true]),
    ("reflect.run", [true, false, false, false, false, false]),
    ("reflect.status", [true, false, false, false, false, false]),
    ("worker.start", [false, true, false, false, false, false]),
    ("recall.delegate", [false, true, false, false, false, false]),
    ("memory.merge", [false, true, false, false, false, false]),
    ("memory.sync", [true, false, false, false, false, false]),
    ("memory.repair", [false, true, false, false, false, false]),
    ("agent.release", [true, false, false, false, false, false]),
];

/// Whether `peer` (`"cli"` or a child role) may call `method`. Unknown
/// methods and unknown roles are refused.
pub fn allowed(peer: &str, method: &str) -> bool {
    let Some(col) = PEERS.iter().position(|p| *p == peer) else {
        return false;
    };
    TABLE
        .iter()
        .find(|(m, _)| *m == method)
        .is_some_and(|(_, row)| row[col])
}

/// The refusal a peer gets for a method outside its column.
pub fn refusal(peer: &str, method: &str) -> String {
    match peer {
        "cli" => format!("{method} comes from agent children only"),
        role => format!("{method} is not available to children (role {role})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_method_has_a_row_and_no_row_is_extra() {
        let mut rows: Vec<&str> = TABLE.iter().map(|(m, _)| *m).collect();
        let mut methods: Vec<&str> = crate::protocol::METHODS.to_vec();
        rows.sort_unstable();
        methods.sort_unstable();
        assert_eq!(rows, methods);
    }

    #[test]
    fn the_roles_are_the_launchers_roles() {
        assert_eq!(&PEERS[1..], crate::supervisor::children::ROLES);
    }

    #[test]
    fn decisions() {
        let cases = [
            ("tool", "model.complete", false),
            ("tool", "turn.event", false),
            ("tool", "memory.commit", true),
            ("agent", "model.complete", true),
            ("agent", "turn.event", true),
            ("agent", "child.spawn", false),
            ("agent", "events.subscribe", false),
            ("memory-worker", "memory.commit", true),
            ("memory-worker", "memory.lease", false),
            ("agent", "task.get", false),
            ("tool", "worker.start", false),
            ("reflection", "worker.start", false),
            ("recall", "memory.commit", false),
            ("recall", "model.complete", true),
            ("recall", "recall.delegate", false),
            ("agent", "recall.delegate", true),
            ("agent", "memory.repair", true),
            ("tool", "memory.repair", false),
            ("memory-worker", "memory.repair", false),
            ("cli", "memory.repair", false),
            ("reflection", "model.complete", true),
            ("cli", "turn.event", false),
            ("cli", "child.spawn", true),
            ("cli", "nope", false),
            ("root", "ping", false),
        ];
        for (peer, method, want) in cases {
            assert_eq!(allowed(peer, method), want, "{peer} {method}");
        }
    }

    /// The table in `docs/protocol.md` §6 says the same as this one.
    #[test]
    fn the_documented_table_matches() {
        let doc = include_str!("../../../../docs/protocol.md");
        let mut seen = 0;
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // | `method` | cli | agent | memory-worker | reflection | tool | recall |
            if cells.len() != 9 || !cells[1].starts_with('`') {
                continue;
            }
            let method = cells[1].trim_matches('`');
            let Some((_, row)) = TABLE.iter().find(|(m, _)| *m == method) else {
                continue;
            };
            let doc_row: Vec<bool> = cells[2..8].iter().map(|c| *c == "yes").collect();
            assert_eq!(&doc_row[..], &row[..], "docs/protocol.md row for {method}");
            seen += 1;
        }
        assert_eq!(
            seen,
            TABLE.len(),
            "every method has one row in the doc table"
        );
    }
}
