//! Signals to a child's whole tree: the launcher (namespace monitor or
//! bubblewrap) is not the program, and a pid read from `/proc` may be
//! reused, so every signal goes through a pidfd checked to descend from
//! the child.

use std::time::Duration;

use crate::retry::Policy;

use crate::sandbox::proc_tree::{process_levels, process_tree};
use crate::sandbox::sys;

/// How long a kill waits for a child's launcher to reap what it launched
/// before the launcher is killed too (100 ms, looking every millisecond).
const LAUNCHER_REAPS: Policy =
    Policy::polling(Duration::from_millis(1), Duration::from_millis(100));

/// SIGKILL a child: every process of its tree, which a program that left
/// the group with `setsid` is still part of, and its launcher's process
/// group (in a pid namespace the namespace dies with its init).
///
/// From the bottom up: the program and the namespace's init first, while
/// the launcher (monitor, bubblewrap) lives to reap them — resumed if it
/// was stopped. Killed together, the launcher often died first and left
/// its init a zombie for the host's pid 1, which may reap it late (a
/// container's or VM's init may never); until then the child's `pids`
/// cgroup stays charged and cannot be removed (a fault soak left an
/// agent's groups behind at its supervisor's stop that way).
pub(crate) fn kill_child_tree(pid: u32) -> nix::Result<()> {
    use nix::sys::signal::Signal;
    let Some(started) = crate::sandbox::identity::process_start_time(pid) else {
        return Err(nix::errno::Errno::ESRCH);
    };
    let below: Vec<u32> = process_tree(pid).into_iter().skip(1).collect();
    for p in &below {
        let _ = signal_descendant(pid, *p, Signal::SIGKILL);
    }
    if !below.is_empty() {
        if process_state(pid) == Some('T') {
            let _ = signal_descendant(pid, pid, Signal::SIGCONT);
        }
        LAUNCHER_REAPS.wait_for(|| process_tree(pid).len() == 1);
    }
    let leader = nix::unistd::Pid::from_raw(pid as i32);
    // A launcher that ended once its init was gone may be reaped already:
    // its number may then be another process's (another start time), whose
    // group is not ours to signal.
    if crate::sandbox::identity::process_start_time(pid) != Some(started) {
        return Ok(());
    }
    let group = nix::sys::signal::killpg(leader, Signal::SIGKILL);
    // What was forked meanwhile.
    for p in process_tree(pid).into_iter().skip(1) {
        let _ = signal_descendant(pid, p, Signal::SIGKILL);
    }
    group
}

/// Send `signal` to the program a child runs, not just to its launcher: a
/// confined child's recorded pid is its namespace monitor's (or
/// bubblewrap's), and the program lives in a pid namespace behind it, so a
/// signal to the launcher alone would never reach it (bubblewrap would only
/// kill it with SIGKILL on exit).
///
/// The wrappers spared are the first `wrapper_depth` levels of the tree —
/// known from the launch plan, never from names, which a program chooses.
/// No process of the program can sit at those levels: the monitor forks
/// only init, and orphans in a pid namespace go to its init.
pub(crate) fn signal_child_tree(
    pid: u32,
    wrapper_depth: usize,
    signal: nix::sys::signal::Signal,
) -> nix::Result<()> {
    let targets: Vec<u32> = process_levels(pid)
        .into_iter()
        .filter(|(_, level)| *level >= wrapper_depth)
        .map(|(p, _)| p)
        .collect();
    if targets.is_empty() {
        return nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
    }
    let mut result = Ok(());
    for p in targets {
        if let Err(e) = signal_descendant(pid, p, signal)
            && e != nix::errno::Errno::ESRCH
        {
            result = Err(e);
        }
    }
    result
}

/// Send SIGCONT to every process of child `pid`'s tree stopped by a signal
/// (state `T`); one stopped by a debugger (`t`) is left to it. How many.
pub(crate) fn resume_stopped(pid: u32) -> usize {
    process_tree(pid)
        .into_iter()
        .filter(|p| process_state(*p) == Some('T'))
        .filter(|p| signal_descendant(pid, *p, nix::sys::signal::Signal::SIGCONT).is_ok())
        .count()
}

/// The state letter of process `pid` (field 3 of `/proc/<pid>/stat`).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Signal `target` through a pidfd, after checking — with the pidfd
/// holding that very process — that it still descends from `root`: a pid
/// read from `/proc` and then reused by an unrelated process is never hit.
fn signal_descendant(root: u32, target: u32, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    use std::os::fd::AsFd;
    let errno = |e: std::io::Error| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0));
    let pidfd = sys::pidfd_open(target).map_err(errno)?;
    if !descends_from(target, root) {
        return Err(nix::errno::Errno::ESRCH);
    }
    sys::pidfd_send_signal(pidfd.as_fd(), signal).map_err(errno)
}

/// Whether `pid`'s chain of parents reaches `root`.
fn descends_from(pid: u32, root: u32) -> bool {
    let mut here = pid;
    for _ in 0..128 {
        if here == root {
            return true;
        }
        let Some(parent) = std::fs::read_to_string(format!("/proc/{here}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<u32>()
                    .ok()
            })
        else {
            return false;
        };
        if parent <= 1 {
            return false;
        }
        here = parent;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal reaches a process of the tree, never one outside it.
    #[test]
    fn descent_is_checked_through_parents() {
        let me = std::process::id();
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, child.id()));
        // A process outside the tree is not signalled (ESRCH), the child is.
        assert_eq!(
            signal_descendant(child.id(), me, nix::sys::signal::Signal::SIGCONT),
            Err(nix::errno::Errno::ESRCH)
        );
        let mut child = child;
        signal_descendant(me, child.id(), nix::sys::signal::Signal::SIGKILL).unwrap();
        assert!(!child.wait().unwrap().success());
    }
}
