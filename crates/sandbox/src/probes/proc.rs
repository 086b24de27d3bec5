//! Attacks on other processes: the supervisor, a sibling agent's child, the
//! parent agent — through `/proc`, signals, ptrace, pidfds, inherited
//! environment and descriptors (§d rows 11–21).
//!
//! Host pids are meaningless inside a pid namespace: when this process is in
//! one, a host pid number either names nothing or a sandbox-local process, so
//! such attempts are reported as blocked *by the namespace* with that note.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{
    close, contains, errno_name, in_child, io_name, join, last_errno, pid_view, reached_host_pid,
    read_limited, same_session, slot_result,
};
use super::verdict::Verdict;
use crate::protocol::CHANNEL_FD_ENV;

fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

/// `Some(verdict)` when `/proc` here does not show the supervisor `pid`.
fn proc_hidden(pid: u32) -> Option<Verdict> {
    let view = pid_view(pid);
    if view.proc_is_host {
        return None;
    }
    let here = if proc_dir(pid).exists() {
        "names a sandbox-local process"
    } else {
        "is absent"
    };
    Some(Verdict::blocked(format!(
        "/proc does not show the supervisor: host pid {pid} is not visible here (/proc/{pid} {here})"
    )))
}

/// Row 11: open B's secret through `/proc/<sup>/root` and `readlink
/// /proc/<sup>/cwd`. Escaped if either works.
pub(crate) fn supervisor_root_cwd(ctx: &ProbeContext) -> Verdict {
    if let Some(v) = proc_hidden(ctx.supervisor_pid) {
        return v;
    }
    let dir = proc_dir(ctx.supervisor_pid);
    let mut got = Vec::new();
    let mut refused = Vec::new();
    let through_root = super::util::below(&dir.join("root"), &ctx.other_secret_file);
    match read_limited(&through_root, 1 << 20) {
        Ok(b) => got.push(format!(
            "read {} ({} bytes, marker {})",
            through_root.display(),
            b.len(),
            if contains(&b, ctx.secret_marker.as_bytes()) {
                "present"
            } else {
                "absent"
            }
        )),
        Err(e) => refused.push(format!("{}: {}", through_root.display(), io_name(&e))),
    }
    match std::fs::read_dir(dir.join("root")) {
        Ok(entries) => got.push(format!(
            "listed {}/root ({} entries)",
            dir.display(),
            entries.count()
        )),
        Err(e) => refused.push(format!("readdir {}/root: {}", dir.display(), io_name(&e))),
    }
    match std::fs::read_link(dir.join("cwd")) {
        Ok(p) => got.push(format!("readlink {}/cwd = {}", dir.display(), p.display())),
        Err(e) => refused.push(format!("readlink {}/cwd: {}", dir.display(), io_name(&e))),
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 12: read `/proc/<sup>/environ`. Escaped if readable (the evidence
/// says whether the secret value was in it).
pub(crate) fn supervisor_environ(ctx: &ProbeContext) -> Verdict {
    if let Some(v) = proc_hidden(ctx.supervisor_pid) {
        return v;
    }
    let path = proc_dir(ctx.supervisor_pid).join("environ");
    match read_limited(&path, 1 << 20) {
        Ok(b) => {
            let secret =
                !ctx.env_secret_value.is_empty() && contains(&b, ctx.env_secret_value.as_bytes());
            Verdict::escaped(format!(
                "read {} ({} bytes); the secret value is {}",
                path.display(),
                b.len(),
                if secret { "IN IT" } else { "not in it" }
            ))
        }
        Err(e) => Verdict::blocked(format!("{}: {}", path.display(), io_name(&e))),
    }
}

/// Row 13: open `/proc/<sup>/mem` and `process_vm_readv` from it. Escaped
/// if the open works or `process_vm_readv` passes its permission check
/// (it then fails with `EFAULT` on the unmapped address 0x1000, or reads).
pub(crate) fn supervisor_memory(ctx: &ProbeContext) -> Verdict {
    let pid = ctx.supervisor_pid;
    let mut got = Vec::new();
    let mut refused = Vec::new();
    match proc_hidden(pid) {
        Some(v) => refused.push(v.detail().to_string()),
        None => {
            let path = proc_dir(pid).join("mem");
            match std::fs::File::open(&path) {
                Ok(_) => got.push(format!("opened {} for reading", path.display())),
                Err(e) => refused.push(format!("{}: {}", path.display(), io_name(&e))),
            }
        }
    }
    let view = pid_view(pid);
    {
        let mut byte = [0u8; 1];
        let local = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let remote = libc::iovec {
            iov_base: 0x1000 as *mut libc::c_void,
            iov_len: 1,
        };
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            return Verdict::skipped(format!("pid {pid} out of range"));
        };
        // SAFETY: one valid local iovec of one byte; the remote one is only
        // read by the kernel on the target's side.
        let r = unsafe { libc::process_vm_readv(raw, &local, 1, &remote, 1, 0) };
        let e = nix::errno::Errno::last();
        let passed = r >= 0 || e == nix::errno::Errno::EFAULT;
        if passed && !reached_host_pid(view, pid) {
            refused.push(format!(
                "process_vm_readv on {pid} reached a sandbox-local process of that number, not the supervisor"
            ));
        } else if r >= 0 {
            got.push(format!("process_vm_readv read {r} bytes"));
        } else if passed {
            got.push(
                "process_vm_readv passed the permission check (EFAULT on address 0x1000)".into(),
            );
        } else {
            refused.push(format!("process_vm_readv: {}", errno_name(e as i32)));
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Open `path` write-only (no truncation, nothing written).
fn open_for_write(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("{}: {}", path.display(), io_name(&e)))
}

/// Row 14: open the supervisor's binary for writing, through
/// `/proc/<sup>/exe`, through the path it links to, and this program's own
/// binary (the supervisor runs the same one). Nothing is ever written or
/// truncated. Escaped if any open for writing succeeds.
pub(crate) fn supervisor_exe_write(ctx: &ProbeContext) -> Verdict {
    let mut targets: Vec<PathBuf> = Vec::new();
    let mut refused = Vec::new();
    match proc_hidden(ctx.supervisor_pid) {
        Some(v) => refused.push(v.detail().to_string()),
        None => {
            let exe = proc_dir(ctx.supervisor_pid).join("exe");
            match std::fs::read_link(&exe) {
                Ok(p) => targets.push(p),
                Err(e) => refused.push(format!("readlink {}: {}", exe.display(), io_name(&e))),
            }
            targets.insert(0, exe);
        }
    }
    if let Ok(own) = std::env::current_exe()
        && !targets.contains(&own)
    {
        targets.push(own);
    }
    let mut got = Vec::new();
    for t in &targets {
        match open_for_write(t) {
            Ok(()) => got.push(format!(
                "opened {} for writing (nothing written)",
                t.display()
            )),
            Err(e) => refused.push(e),
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 15: count the pids in `/proc`. Escaped if the supervisor's or the
/// sibling's pid is visible there (and is not a sandbox-local process of
/// the same number).
pub(crate) fn visible_pids(ctx: &ProbeContext) -> Verdict {
    let entries = match std::fs::read_dir("/proc") {
        Ok(e) => e,
        Err(e) => return Verdict::blocked(format!("readdir /proc: {}", io_name(&e))),
    };
    let pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    let view = pid_view(ctx.supervisor_pid);
    let mut seen = Vec::new();
    for (what, pid) in [
        ("supervisor", ctx.supervisor_pid),
        ("sibling", ctx.sibling_pid),
    ] {
        if view.proc_is_host && pids.contains(&pid) && (view.init_ns || !same_session(pid)) {
            seen.push(format!("{what} pid {pid}"));
        }
    }
    if seen.is_empty() {
        Verdict::blocked(format!(
            "{} pids visible in /proc; supervisor and sibling not among them{}",
            pids.len(),
            if view.nested {
                " (own pid namespace)"
            } else {
                ""
            }
        ))
    } else {
        let v = Verdict::escaped(format!(
            "{} pids visible in /proc, including {}",
            pids.len(),
            seen.join(" and ")
        ));
        match &ctx.by_design {
            Some(d) => d.judge(v, &[&d.no_pid_namespace]),
            None => v,
        }
    }
}

/// `kill(pid, 0)`: can this process signal `pid`?
fn signal_zero(ctx: &ProbeContext, pid: u32, what: &str) -> Verdict {
    let view = pid_view(ctx.supervisor_pid);
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return Verdict::skipped(format!("pid {pid} out of range"));
    };
    if raw <= 1 {
        return Verdict::skipped(format!("refusing to signal pid {raw}"));
    }
    // SAFETY: signal 0 only checks permission and existence.
    if unsafe { libc::kill(raw, 0) } == 0 {
        if reached_host_pid(view, pid) {
            Verdict::escaped(format!(
                "kill({pid}, 0) succeeded: the {what} can be signalled (no real signal sent)"
            ))
        } else {
            Verdict::blocked(format!(
                "kill({pid}, 0) reached a sandbox-local process of that number, not the {what}"
            ))
        }
    } else {
        let ns = if view.nested {
            " (own pid namespace)"
        } else {
            ""
        };
        Verdict::blocked(format!("kill({pid}, 0): {}{ns}", last_errno()))
    }
}

/// Row 16: signal the supervisor. Uses signal 0 (permission and existence
/// check only) so that a probe never kills it; escaped if it succeeds.
pub(crate) fn signal_supervisor(ctx: &ProbeContext) -> Verdict {
    signal_zero(ctx, ctx.supervisor_pid, "supervisor")
}

/// Row 17: signal a sibling (another agent's child). Signal 0 as in row 16;
/// escaped if it succeeds.
pub(crate) fn signal_sibling(ctx: &ProbeContext) -> Verdict {
    signal_zero(ctx, ctx.sibling_pid, "sibling")
}

/// Row 18: `PTRACE_SEIZE` the supervisor, the sibling and the parent
/// process, from a throwaway process whose exit detaches at once (seize
/// sends no signal, so the tracee never stops). Escaped if any seize works
/// (on the real supervisor/sibling, not a sandbox-local namesake).
pub(crate) fn ptrace_attach(ctx: &ProbeContext) -> Verdict {
    let view = pid_view(ctx.supervisor_pid);
    let ppid = nix::unistd::getppid().as_raw();
    // (label, pid, whether a success must be checked against namesakes)
    let mut targets: Vec<(String, libc::pid_t, bool)> = Vec::new();
    for (what, pid) in [
        ("supervisor", ctx.supervisor_pid),
        ("sibling", ctx.sibling_pid),
    ] {
        if let Ok(p) = libc::pid_t::try_from(pid)
            && p > 1
        {
            targets.push((format!("{what} {pid}"), p, true));
        }
    }
    // The parent agent process; the host's pid 1 (our parent when orphaned)
    // is left alone, pid 1 of our own namespace is the launcher.
    if ppid > 1 || (ppid == 1 && view.nested) {
        targets.push((format!("parent {ppid}"), ppid, false));
    }
    let pids: Vec<libc::pid_t> = targets.iter().map(|t| t.1).collect();
    let result = in_child(Duration::from_secs(5), |slots| {
        for (i, pid) in pids.iter().enumerate().take(slots.len()) {
            // SAFETY: seize without options; this process exits right after,
            // which detaches every tracee.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_SEIZE,
                    *pid,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            slots[i] = if r == 0 { 0 } else { super::util::raw_errno() };
        }
    });
    let (slots, end) = match result {
        Ok(r) => r,
        Err(e) => return Verdict::skipped(format!("cannot start the tracer process: {e}")),
    };
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (i, (what, pid, check)) in targets.iter().enumerate() {
        let host = u32::try_from(*pid)
            .map(|p| reached_host_pid(view, p))
            .unwrap_or(false);
        match slots.get(i).copied().unwrap_or(i64::MIN) {
            0 if *check && !host => refused.push(format!(
                "PTRACE_SEIZE {what} reached a sandbox-local process of that number"
            )),
            0 => got.push(format!("PTRACE_SEIZE {what} succeeded (detached by exit)")),
            v => refused.push(format!("PTRACE_SEIZE {what}: {}", slot_result(v))),
        }
    }
    if got.is_empty() {
        if targets.is_empty() {
            return Verdict::skipped("no pid to trace");
        }
        refused.push(format!("tracer {end}"));
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 19: `pidfd_open` the supervisor and the sibling, then
/// `pidfd_getfd(pidfd, 0)` to steal their stdin. Escaped if a descriptor
/// is obtained (closed at once) from the real process.
pub(crate) fn pidfd_getfd(ctx: &ProbeContext) -> Verdict {
    let view = pid_view(ctx.supervisor_pid);
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (what, pid) in [
        ("supervisor", ctx.supervisor_pid),
        ("sibling", ctx.sibling_pid),
    ] {
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            continue;
        };
        // SAFETY: pidfd_open(pid, 0) returns a new descriptor or -1.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) } as i32;
        if pidfd < 0 {
            refused.push(format!("pidfd_open {what} {pid}: {}", last_errno()));
            continue;
        }
        // SAFETY: pidfd_getfd(pidfd, 0, 0) returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, 0, 0) } as i32;
        if fd >= 0 {
            close(fd);
            if reached_host_pid(view, pid) {
                got.push(format!("pidfd_getfd stole fd 0 of the {what} {pid}"));
            } else {
                refused.push(format!(
                    "pidfd {pid} names a sandbox-local process, not the {what}"
                ));
            }
        } else {
            refused.push(format!("pidfd_getfd {what} {pid}: {}", last_errno()));
        }
        close(pidfd);
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 20: look for the supervisor's secret in the own environment, argv
/// (`/proc/self/cmdline`), and the parent's `/proc/<ppid>/environ`.
/// Escaped if the secret's name (own env) or value appears anywhere.
pub(crate) fn env_secrets(ctx: &ProbeContext) -> Verdict {
    let value = ctx.env_secret_value.as_bytes();
    let mut found = Vec::new();
    let mut notes = Vec::new();
    for (k, v) in std::env::vars_os() {
        if k.as_bytes() == ctx.env_secret_name.as_bytes() {
            found.push(format!("own environment has {}", ctx.env_secret_name));
        } else if contains(v.as_bytes(), value) {
            found.push(format!(
                "own environment variable {} holds the secret value",
                k.to_string_lossy()
            ));
        }
    }
    for path in ["/proc/self/environ", "/proc/self/cmdline"] {
        match read_limited(Path::new(path), 1 << 20) {
            Ok(b) if contains(&b, value) => found.push(format!("{path} holds the secret value")),
            Ok(_) => notes.push(format!("{path}: clean")),
            Err(e) => notes.push(format!("{path}: {}", io_name(&e))),
        }
    }
    let ppid = nix::unistd::getppid().as_raw();
    let penv = PathBuf::from(format!("/proc/{ppid}/environ"));
    match read_limited(&penv, 1 << 20) {
        Ok(b) if contains(&b, value) => {
            found.push(format!("{} holds the secret value", penv.display()))
        }
        Ok(b) => notes.push(format!(
            "{} readable ({} bytes), no secret",
            penv.display(),
            b.len()
        )),
        Err(e) => notes.push(format!("{}: {}", penv.display(), io_name(&e))),
    }
    if found.is_empty() {
        Verdict::blocked(format!("no secret present; {}", join(&notes)))
    } else {
        Verdict::escaped(join(&found))
    }
}

/// Row 21: descriptors 3 and up other than the supervisor channel
/// (`MINI_LETTA_CHANNEL_FD`). Escaped if any is open; the evidence names
/// what each points at.
pub(crate) fn leaked_fds(_ctx: &ProbeContext) -> Verdict {
    let channel: Option<i32> = std::env::var(CHANNEL_FD_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    // Collect numbers first; the directory's own descriptor is closed by the
    // time they are checked, so it drops out.
    let listed: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
            .collect(),
        Err(_) => (3..1024).collect(),
    };
    let mut open = Vec::new();
    for fd in listed {
        if fd < 3 || Some(fd) == channel {
            continue;
        }
        // SAFETY: F_GETFD only queries the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            continue;
        }
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("? ({})", io_name(&e)));
        open.push(format!("fd {fd} → {target}"));
    }
    let chan = match channel {
        Some(c) => format!(" (channel fd {c} excluded)"),
        None => String::new(),
    };
    if open.is_empty() {
        Verdict::blocked(format!("no descriptor ≥ 3 open{chan}"))
    } else {
        Verdict::escaped(format!("{} open{chan}: {}", open.len(), open.join(", ")))
    }
}
