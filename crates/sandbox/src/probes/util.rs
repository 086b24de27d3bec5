//! Helpers shared by the probes: errno names, bounded reads, unique names,
//! pid-namespace awareness, and throwaway child processes.
//!
//! Throwaway children are forked from a process that may have other threads
//! (the in-process tests), so the closures they run must stick to raw system
//! calls on data prepared before the fork: no allocation, no locks.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::errno::Errno;

use super::verdict::Verdict;

/// `EACCES`-style name of an errno value.
pub(crate) fn errno_name(code: i32) -> String {
    let e = Errno::from_raw(code);
    if e == Errno::UnknownErrno {
        format!("errno {code}")
    } else {
        format!("{e:?}")
    }
}

/// The errno name of an I/O error, else its text.
pub(crate) fn io_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => errno_name(code),
        None => e.to_string(),
    }
}

/// The errno name of the last failed libc call.
pub(crate) fn last_errno() -> String {
    errno_name(Errno::last_raw())
}

/// A name no other probe run uses: `.mini-letta-probe-<pid>-<tag>-<n>`.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        ".mini-letta-probe-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A path as a C string (`None` if it holds a NUL byte).
pub(crate) fn cpath(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_bytes()).ok()
}

/// `base` with an absolute `path` appended below it (`/proc/1/root` + `/a/b`).
pub fn below(base: &Path, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    base.join(rel)
}

/// Read at most `max` bytes of a file.
pub(crate) fn read_limited(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Read `path` looking for the secret marker: readable ⇒ escaped (saying
/// whether the marker was there), refused ⇒ blocked with the errno.
pub(crate) fn read_for_marker(path: &Path, marker: &str, what: &str) -> Verdict {
    match read_limited(path, 1 << 20) {
        Ok(bytes) if contains(&bytes, marker.as_bytes()) => Verdict::escaped(format!(
            "{what}: read {} bytes from {}, the secret marker is in them",
            bytes.len(),
            path.display()
        )),
        Ok(bytes) => Verdict::escaped(format!(
            "{what}: {} is readable ({} bytes, marker absent)",
            path.display(),
            bytes.len()
        )),
        Err(e) => Verdict::blocked(format!(
            "{what}: open/read {}: {}",
            path.display(),
            io_name(&e)
        )),
    }
}

/// One `key: value` line of `/proc/self/status`.
pub(crate) fn self_status(key: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim().to_string())
    })
}

/// `(mount point, filesystem type)` of every mount, in mountinfo order.
fn mounts() -> Vec<(String, String)> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            let mp = head.split(' ').nth(4)?;
            Some((unescape(mp), tail.split(' ').next()?.to_string()))
        })
        .collect()
}

/// The filesystem type mounted exactly at `path` (the topmost mount there).
pub(crate) fn mount_at(path: &Path) -> Option<String> {
    let want = path.to_str()?;
    mounts()
        .into_iter()
        .rev()
        .find(|(mp, _)| mp == want)
        .map(|(_, fs)| fs)
}

/// The filesystem type of the mount holding `path` (longest mount point
/// above it; the topmost one when several are stacked).
pub(crate) fn mount_holding(path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for (mp, fs) in mounts() {
        if path.starts_with(Path::new(&mp)) && best.as_ref().is_none_or(|(len, _)| mp.len() >= *len)
        {
            best = Some((mp.len(), fs));
        }
    }
    best.map(|(_, fs)| fs)
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `dir` lies on a tmpfs *of this sandbox's own mount namespace* (a
/// mask such as `--tmpfs /root` or `--tmpfs /tmp`): what is written there
/// never reaches the host. The namespace is taken as private when this
/// process is in its own pid namespace (the sandbox then always has its own
/// mount namespace) or when the supervisor's differs from ours.
pub(crate) fn private_tmpfs(dir: &Path, supervisor_pid: u32) -> bool {
    if mount_holding(dir).as_deref() != Some("tmpfs") {
        return false;
    }
    if pid_view(supervisor_pid).nested {
        return true;
    }
    let ours = std::fs::read_link("/proc/self/ns/mnt");
    let sup = std::fs::read_link(format!("/proc/{supervisor_pid}/ns/mnt"));
    matches!((ours, sup), (Ok(a), Ok(b)) if a != b)
}

/// How pid numbers given by the host are to be read here.
#[derive(Debug, Clone, Copy)]
pub struct PidView {
    /// This process is not in the supervisor's pid namespace: system calls
    /// with a host pid number reach nothing, or a sandbox-local process.
    pub nested: bool,
    /// `/proc` shows the supervisor (host numbering, or at least an
    /// ancestor namespace's).
    pub proc_is_host: bool,
    /// This process is in the kernel's initial pid namespace, where a pid
    /// number can only ever mean one process.
    pub init_ns: bool,
}

/// `/proc/self/ns/pid` of the initial pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NS: &str = "pid:[4026531836]";

/// Whether `pid` is in this process's own session. The launcher gives every
/// child a session of its own and the supervisor has its own, so such a pid
/// is a sandbox-local process that merely carries the same number.
pub(crate) fn same_session(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: getsid only reads process attributes.
    let (theirs, ours) = unsafe { (libc::getsid(raw), libc::getsid(0)) };
    theirs >= 0 && theirs == ours
}

/// Work out whether the supervisor's pid numbering applies here. `NSpid`
/// alone is not enough: a procfs mounted inside a pid namespace shows only
/// that namespace's level, so the supervisor's visibility and pid namespace
/// are checked too. Outside the initial pid namespace a pid in this
/// process's own session is taken for a sandbox-local namesake.
pub(crate) fn pid_view(supervisor_pid: u32) -> PidView {
    let nspid_nested = self_status("NSpid")
        .map(|v| v.split_whitespace().count() > 1)
        .unwrap_or(false);
    let own_ns = std::fs::read_link("/proc/self/ns/pid");
    let init_ns = !nspid_nested && own_ns.as_ref().is_ok_and(|l| l.as_os_str() == INIT_PID_NS);
    let sup_dir = PathBuf::from(format!("/proc/{supervisor_pid}"));
    let sup_seen =
        supervisor_pid > 1 && sup_dir.exists() && (init_ns || !same_session(supervisor_pid));
    let ns_differs = matches!(
        (own_ns, std::fs::read_link(sup_dir.join("ns/pid"))),
        (Ok(a), Ok(b)) if a != b
    );
    PidView {
        nested: nspid_nested || !sup_seen || ns_differs,
        proc_is_host: sup_seen,
        init_ns,
    }
}

/// Whether a successful pid-addressed call on `pid` really reached the host
/// process of that number (not a sandbox-local one).
pub(crate) fn reached_host_pid(view: PidView, pid: u32) -> bool {
    !view.nested && (view.init_ns || !same_session(pid))
}

/// How a throwaway child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    Code(i32),
    Signal(i32),
    TimedOut,
}

impl std::fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit {c}"),
            Self::Signal(s) => write!(f, "killed by signal {s}"),
            Self::TimedOut => write!(f, "timed out"),
        }
    }
}

/// Wait for `pid` up to `timeout`; past it the child is killed and reaped.
pub fn wait_child(pid: libc::pid_t, timeout: Duration) -> ChildEnd {
    let mut end = None;
    crate::retry::Policy::polling(Duration::from_millis(2), timeout).wait_for(|| {
        let mut status = 0;
        // SAFETY: plain waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG | libc::__WALL) };
        if r == pid {
            end = Some(decode_status(status));
        } else if r < 0 && Errno::last() != Errno::EINTR {
            end = Some(ChildEnd::Code(-1));
        }
        end.is_some()
    });
    end.unwrap_or_else(|| {
        let mut status = 0;
        // SAFETY: signalling and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut status, libc::__WALL);
        }
        ChildEnd::TimedOut
    })
}

fn decode_status(status: i32) -> ChildEnd {
    if libc::WIFEXITED(status) {
        ChildEnd::Code(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        ChildEnd::Signal(libc::WTERMSIG(status))
    } else {
        ChildEnd::Code(-1)
    }
}

/// Number of `i64` slots a throwaway child can report.
pub const SLOTS: usize = 8;

/// Fork a throwaway child that runs `f` (raw system calls only — see the
/// module doc), which fills report slots; returns the slots and how the
/// child ended. Slots the child never wrote stay `i64::MIN`.
pub(crate) fn in_child<F>(timeout: Duration, f: F) -> Result<([i64; SLOTS], ChildEnd), String>
where
    F: FnOnce(&mut [i64; SLOTS]),
{
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", last_errno()));
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: the child runs only `f` (raw system calls on prepared data),
    // writes its report and leaves with `_exit`, never returning here.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = last_errno();
        // SAFETY: closing our own pipe.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(format!("fork: {e}"));
    }
    if pid == 0 {
        let mut slots = [i64::MIN; SLOTS];
        f(&mut slots);
        // SAFETY: writing a plain array to our pipe, then leaving.
        unsafe {
            libc::write(wfd, slots.as_ptr().cast(), std::mem::size_of_val(&slots));
            libc::_exit(0);
        }
    }
    // SAFETY: the parent's copy of the write end is no longer needed.
    unsafe { libc::close(wfd) };
    let end = wait_child(pid, timeout);
    let mut slots = [i64::MIN; SLOTS];
    let want = std::mem::size_of_val(&slots);
    // SAFETY: reading at most `want` bytes into the array; the child has
    // ended, so the read cannot block.
    let got = unsafe { libc::read(rfd, slots.as_mut_ptr().cast(), want) };
    // SAFETY: closing our read end.
    unsafe { libc::close(rfd) };
    if got != want as isize {
        slots = [i64::MIN; SLOTS];
    }
    Ok((slots, end))
}

/// The errno of the last failed call, for a child's report slot.
pub(crate) fn raw_errno() -> i64 {
    i64::from(Errno::last_raw())
}

/// `0` ⇒ `ok`, positive ⇒ errno name, `i64::MIN` ⇒ `not reached`.
pub(crate) fn slot_result(v: i64) -> String {
    match v {
        0 => "ok".into(),
        i64::MIN => "not reached".into(),
        v => i32::try_from(v)
            .map(errno_name)
            .unwrap_or_else(|_| format!("{v}")),
    }
}

/// Whether a route in this network namespace covers `addr` (IPv4 only,
/// from `/proc/net/route`): `Ok(Some(iface))` if one does.
pub(crate) fn route_to(addr: std::net::Ipv4Addr) -> Result<Option<String>, String> {
    let table = std::fs::read_to_string("/proc/net/route")
        .map_err(|e| format!("cannot read /proc/net/route: {}", io_name(&e)))?;
    let target = u32::from_ne_bytes(addr.octets());
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(iface), Some(dest), Some(flags), Some(mask)) =
            (f.first(), f.get(1), f.get(3), f.get(7))
        else {
            continue;
        };
        let parse = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(dest), Some(flags), Some(mask)) = (parse(dest), parse(flags), parse(mask)) else {
            continue;
        };
        // RTF_UP
        if flags & 1 == 0 {
            continue;
        }
        if target & mask == dest & mask {
            return Ok(Some((*iface).to_string()));
        }
    }
    Ok(None)
}

/// Close a raw descriptor returned by a probe call.
pub fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: the caller owns `fd` and does not use it again.
        unsafe { libc::close(fd) };
    }
}

/// Join the pieces of evidence of a multi-step probe.
pub fn join(parts: &[String]) -> String {
    parts.join("; ")
}
