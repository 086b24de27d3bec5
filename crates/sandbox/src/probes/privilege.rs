//! Privilege gain: user namespaces, setuid binaries, capabilities, device
//! nodes, terminal injection (§d rows 31–34, 41).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{
    close, cpath, errno_name, in_child, io_name, join, last_errno, raw_errno, self_status,
    slot_result, unique,
};
use super::verdict::Verdict;

/// Row 31: `unshare(CLONE_NEWUSER)` and `clone(CLONE_NEWUSER)`, each in a
/// throwaway process. Escaped if either creates a user namespace.
pub(crate) fn new_user_namespace(_ctx: &ProbeContext) -> Verdict {
    let unshared = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: raw system call in a throwaway child.
        slots[0] = if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 {
            0
        } else {
            raw_errno()
        };
    });
    let cloned = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: raw clone without a new stack behaves like fork; the new
        // process leaves at once with `_exit`, and we reap it.
        unsafe {
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
            let pid = libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize);
            if pid == 0 {
                libc::_exit(0);
            }
            if pid < 0 {
                slots[0] = raw_errno();
            } else {
                slots[0] = 0;
                let mut status = 0;
                libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL);
            }
        }
    });
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (what, r) in [
        ("unshare(CLONE_NEWUSER)", unshared),
        ("clone(CLONE_NEWUSER)", cloned),
    ] {
        match r {
            Ok((slots, _)) if slots[0] == 0 => got.push(format!("{what} succeeded")),
            Ok((slots, end)) => refused.push(format!("{what}: {} ({end})", slot_result(slots[0]))),
            Err(e) => refused.push(format!("{what}: cannot start the process: {e}")),
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 32: exec the setuid copy of `id` planted in A (`id -u` prints the
/// effective uid). Escaped if the euid became the file owner's; skipped if
/// none was planted or this process already runs as that owner.
pub(crate) fn setuid_binary(ctx: &ProbeContext) -> Verdict {
    let Some(path) = &ctx.planted_setuid else {
        return Verdict::skipped(
            "no planted setuid binary in the context (planted_setuid is null)",
        );
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Verdict::blocked(format!("stat {}: {}", path.display(), io_name(&e))),
    };
    let owner = meta.uid();
    let euid = nix::unistd::geteuid().as_raw();
    if euid == owner {
        return Verdict::skipped(format!(
            "already running with euid {euid}, the owner of {}; a setuid binary cannot show a gain",
            path.display()
        ));
    }
    let setuid_bit = meta.mode() & 0o4000 != 0;
    let out = match std::process::Command::new(path)
        .arg("-u")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => return Verdict::blocked(format!("exec {}: {}", path.display(), io_name(&e))),
    };
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match text.parse::<u32>() {
        Ok(u) if u == owner && u != euid => Verdict::escaped(format!(
            "{} ran with euid {u} (ours is {euid})",
            path.display()
        )),
        Ok(u) => Verdict::blocked(format!(
            "euid unchanged: {} printed {u} (ours {euid}, owner {owner}, setuid bit {})",
            path.display(),
            if setuid_bit { "set" } else { "missing" }
        )),
        Err(_) => Verdict::blocked(format!(
            "{} did not print a uid ({}; stderr {:?})",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

fn hex_field(key: &str) -> Option<u64> {
    self_status(key).and_then(|v| u64::from_str_radix(&v, 16).ok())
}

/// Row 33: read `CapEff`, `CapPrm`, `CapBnd`, `CapAmb` and `NoNewPrivs`.
/// Escaped if any of these capability sets is non-empty or no_new_privs is
/// off (`CapInh` alone grants nothing and is not judged).
pub fn capabilities(ctx: &ProbeContext) -> Verdict {
    let keys = ["CapEff", "CapPrm", "CapBnd", "CapAmb"];
    let mut bad = Vec::new();
    let mut seen = Vec::new();
    for k in keys {
        match hex_field(k) {
            Some(0) => seen.push(format!("{k} 0")),
            Some(v) => bad.push(format!("{k} {v:016x}")),
            None => seen.push(format!("{k} unreadable")),
        }
    }
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointers.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    if nnp == 1 {
        seen.push("NoNewPrivs 1".into());
    } else {
        bad.push(format!("NoNewPrivs {nnp}"));
    }
    if bad.is_empty() {
        return Verdict::blocked(join(&seen));
    }
    let v = Verdict::escaped(format!("{} (also {})", join(&bad), join(&seen)));
    // Only the bounding set left, which nothing can draw on without
    // a capability held and with no_new_privs (no setuid, no file
    // capabilities): at a level whose children cannot empty it, by design.
    let only_bounding = bad.len() == 1 && bad[0].starts_with("CapBnd");
    match &ctx.by_design {
        Some(d) if only_bounding => d.judge(v, &[&d.keeps_bounding_set]),
        _ => v,
    }
}

/// The first block device in `/proc/partitions`: (name, major, minor).
fn first_disk() -> Option<(String, u32, u32)> {
    let text = std::fs::read_to_string("/proc/partitions").ok()?;
    text.lines().skip(2).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        Some((
            f.get(3)?.to_string(),
            f.first()?.parse().ok()?,
            f.get(1)?.parse().ok()?,
        ))
    })
}

/// Row 34: `mknod A/x c 1 3`, `mknod A/d b <disk>`, and open `/dev/<disk>`
/// read-only (nothing is read). Escaped if a node is made (removed at once)
/// or the disk opens.
pub(crate) fn device_nodes(ctx: &ProbeContext) -> Verdict {
    let disk = first_disk();
    let (dname, dmaj, dmin) = disk.clone().unwrap_or_else(|| ("sda".into(), 8, 0));
    let nodes = [
        ("char 1:3", libc::S_IFCHR, libc::makedev(1, 3)),
        ("block", libc::S_IFBLK, libc::makedev(dmaj, dmin)),
    ];
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (what, kind, dev) in nodes {
        let path = ctx.scratch_dir.join(unique("node"));
        let Some(c) = cpath(&path) else {
            continue;
        };
        // SAFETY: mknod on a prepared C string.
        if unsafe { libc::mknod(c.as_ptr(), kind | 0o600, dev) } == 0 {
            let _ = std::fs::remove_file(&path);
            got.push(format!("mknod {what} in the own dir worked (removed)"));
        } else {
            refused.push(format!("mknod {what}: {}", last_errno()));
        }
    }
    let mut devs = vec![format!("/dev/{dname}")];
    for d in ["/dev/vda", "/dev/sda", "/dev/nvme0n1"] {
        if !devs.iter().any(|x| x == d) {
            devs.push(d.to_string());
        }
    }
    for d in devs {
        let p = Path::new(&d);
        let Some(c) = cpath(p) else { continue };
        // SAFETY: open read-only and non-blocking; closed at once.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd >= 0 {
            close(fd);
            got.push(format!("opened {d} read-only"));
        } else {
            refused.push(format!("open {d}: {}", last_errno()));
        }
    }
    if disk.is_none() {
        refused.push("no disk in /proc/partitions (tried 8:0)".into());
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// `ioctl(fd, TIOCSTI, " ")`: `Ok` if the byte was injected.
fn tiocsti(fd: i32) -> Result<(), String> {
    let byte: libc::c_char = b' ' as libc::c_char;
    // SAFETY: TIOCSTI reads one byte from the pointer.
    if unsafe { libc::ioctl(fd, libc::TIOCSTI, &byte) } == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

/// Whether `fd` is this process's controlling terminal (TIOCGSID answers
/// only for that, or for a pty master).
fn is_controlling(fd: i32) -> bool {
    let mut sid: libc::pid_t = 0;
    // SAFETY: TIOCGSID writes one pid_t.
    unsafe { libc::ioctl(fd, libc::TIOCGSID, &mut sid) == 0 }
}

/// A fresh pty pair (master, slave), opened without becoming the
/// controlling terminal.
fn open_pty() -> Result<(i32, i32), String> {
    // SAFETY: plain pty calls on descriptors we own.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(format!("posix_openpt: {}", last_errno()));
        }
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            let e = last_errno();
            libc::close(m);
            return Err(format!("grantpt/unlockpt: {e}"));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            let e = last_errno();
            libc::close(m);
            return Err(format!("ptsname: {e}"));
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            let e = last_errno();
            libc::close(m);
            return Err(format!("open pty slave: {e}"));
        }
        Ok((m, s))
    }
}

/// Row 41: `ioctl(TIOCSTI)` on (a) a terminal on fds 0–2 that is not the
/// controlling terminal (the verifier's pty), (b) a fresh pty of our own —
/// both succeed only with `CAP_SYS_ADMIN`; the injected space lands in a
/// terminal nobody reads. The controlling terminal, if any, is never
/// injected into (it may be a person's shell): having one while
/// `dev.tty.legacy_tiocsti` is on counts as escaped. Blocked if every
/// attempt fails, including when no terminal is reachable at all.
pub(crate) fn terminal_injection(_ctx: &ProbeContext) -> Verdict {
    let mut got = Vec::new();
    let mut refused = Vec::new();
    let legacy = std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
        .map(|s| s.trim().to_string())
        .ok();
    for fd in 0..3 {
        // SAFETY: isatty only queries the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            continue;
        }
        if is_controlling(fd) {
            continue;
        }
        match tiocsti(fd) {
            Ok(()) => got.push(format!("TIOCSTI on fd {fd} (a terminal) injected a byte")),
            Err(e) => refused.push(format!("TIOCSTI fd {fd}: {e}")),
        }
    }
    match open_pty() {
        Ok((m, s)) => {
            match tiocsti(s) {
                Ok(()) => got.push("TIOCSTI on a fresh pty (not our controlling terminal) injected a byte: CAP_SYS_ADMIN".into()),
                Err(e) => refused.push(format!("TIOCSTI on a fresh pty: {e}")),
            }
            close(s);
            close(m);
        }
        Err(e) => refused.push(e),
    }
    let tty = c"/dev/tty";
    // SAFETY: open/close of the controlling terminal, nothing written.
    let ctty = unsafe {
        libc::open(
            tty.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if ctty >= 0 {
        close(ctty);
        let note = format!(
            "a controlling terminal is reachable (/dev/tty opened; legacy_tiocsti {}) — not injected into",
            legacy.as_deref().unwrap_or("unknown")
        );
        if legacy.as_deref() == Some("0") {
            refused.push(note);
        } else {
            got.push(note);
        }
    } else {
        refused.push(format!(
            "/dev/tty: {}",
            errno_name(nix::errno::Errno::last_raw())
        ));
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}
