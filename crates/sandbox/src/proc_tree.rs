//! A process and its descendants, as `/proc` shows them: what is
//! signalled, resumed or measured when a child's whole tree is meant.

/// `pid` and all its descendants, parents before children (from each
/// process's `/proc/<pid>/task/<pid>/children`).
pub fn process_tree(pid: u32) -> Vec<u32> {
    process_levels(pid).into_iter().map(|(p, _)| p).collect()
}

/// [`process_tree`] with each process's depth below `pid` (0 for `pid`).
pub fn process_levels(pid: u32) -> Vec<(u32, usize)> {
    let mut tree = vec![(pid, 0)];
    let mut i = 0;
    while i < tree.len() {
        let (p, level) = tree[i];
        tree.extend(children_of(p).into_iter().map(|k| (k, level + 1)));
        i += 1;
    }
    tree
}

/// Children of `pid` forked by any of its threads (each thread has its own
/// `children` list; reading only the main thread's would miss a child
/// forked from another thread).
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return kids;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            kids.extend(
                text.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
    }
    kids
}

/// How many tasks (threads included, as `RLIMIT_NPROC` counts them) run
/// with real uid `uid` on this host now.
pub(crate) fn tasks_of_uid(uid: u32) -> u64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut tasks = 0u64;
    for entry in procs.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            tasks += field("Threads:").unwrap_or(1);
        }
    }
    tasks
}
