//! Regression rows for the seccomp allow-list (rows 50–63, beyond §d):
//! kernel entry points a confined child must not reach at all, most of
//! which the kernel would refuse anyway for lack of a capability. They
//! check that the *filter* answers first: `EPERM` (an escape call) or
//! `ENOSYS` (not on the role's list), or the process is killed (a foreign
//! architecture).
//!
//! Arguments are chosen so that a call the filter lets through still
//! changes nothing, even as root on an unconfined host (the control
//! column): invalid magic numbers or flags that the kernel rejects right
//! after its privilege check, paths that do not exist, descriptors closed
//! at once, and state-changing calls made in a throwaway process. So an
//! answer other than the filter's (`EINVAL`, `ENOENT`, `EBADF`, …) means
//! the call reached the kernel's own code: a regression of the filter,
//! reported as escaped.

use std::time::Duration;

use super::context::ProbeContext;
use super::util::{
    close, cpath, errno_name, in_child, join, raw_errno, self_status, slot_result, unique,
};
use super::verdict::Verdict;

/// One attempt: its label and what the call returned (`Ok(value)`) or
/// its errno (`Err`).
struct Attempt {
    what: String,
    /// What the call returned, or its errno; `None` when the process
    /// making it was killed (the filter's answer to a foreign
    /// architecture) or never reported.
    result: Option<Result<i64, i32>>,
    /// Errors that count as refused besides the filter's `EPERM`/`ENOSYS`
    /// (e.g. landlock's `EACCES` for a file operation).
    also_refused: &'static [i32],
    /// Only `ENOSYS` counts as refused (the allow-list's default, which
    /// libc fallbacks rely on).
    want_enosys: bool,
}

impl Attempt {
    fn refused(&self) -> bool {
        match self.result {
            None => true,
            Some(Ok(_)) => false,
            Some(Err(e)) if self.want_enosys => e == libc::ENOSYS,
            Some(Err(e)) => e == libc::EPERM || e == libc::ENOSYS || self.also_refused.contains(&e),
        }
    }

    fn describe(&self) -> String {
        match self.result {
            None => self.what.clone(),
            Some(Ok(v)) => format!("{}: succeeded ({v})", self.what),
            Some(Err(e)) if self.refused() => format!("{}: {}", self.what, errno_name(e)),
            Some(Err(e)) if self.want_enosys => format!(
                "{}: {}, expected ENOSYS (the allow-list's default)",
                self.what,
                errno_name(e)
            ),
            Some(Err(e)) => format!(
                "{}: reached the kernel ({}), the filter let it through",
                self.what,
                errno_name(e)
            ),
        }
    }
}

/// The outcome of a raw call made here; a returned descriptor is closed
/// when `is_fd`.
fn attempt(what: impl Into<String>, ret: libc::c_long, is_fd: bool) -> Attempt {
    let result = if ret < 0 {
        Err(nix::errno::Errno::last_raw())
    } else {
        if is_fd {
            close(i32::try_from(ret).unwrap_or(-1));
        }
        Ok(ret)
    };
    Attempt {
        what: what.into(),
        result: Some(result),
        also_refused: &[],
        want_enosys: false,
    }
}

/// The outcome a throwaway child reported in slot 0 (`0` = success, else
/// the errno); a child killed by a signal was refused by it.
fn from_child(
    what: &str,
    r: Result<([i64; super::util::SLOTS], super::util::ChildEnd), String>,
) -> Attempt {
    use super::util::ChildEnd;
    let (what, result) = match r {
        Ok((_, ChildEnd::Signal(sig))) => (
            format!("{what}: the process was killed by signal {sig}"),
            None,
        ),
        Ok((slots, end)) => match slots[0] {
            0 => (what.to_string(), Some(Ok(0))),
            i64::MIN => (
                format!("{what}: no report ({end}, {})", slot_result(slots[0])),
                None,
            ),
            e => (
                what.to_string(),
                Some(Err(i32::try_from(e).unwrap_or(libc::EINVAL))),
            ),
        },
        Err(e) => (format!("{what}: cannot start the process: {e}"), None),
    };
    Attempt {
        what,
        result,
        also_refused: &[],
        want_enosys: false,
    }
}

/// Blocked when every attempt was refused.
fn verdict(attempts: &[Attempt]) -> Verdict {
    let text = join(&attempts.iter().map(Attempt::describe).collect::<Vec<_>>());
    if attempts.iter().all(Attempt::refused) {
        Verdict::blocked(text)
    } else {
        Verdict::escaped(text)
    }
}

/// Slot 0 of a throwaway child: `0` when `ret >= 0`, else the errno.
fn slot(ret: libc::c_long) -> i64 {
    if ret >= 0 { 0 } else { raw_errno() }
}

/// Row 50: a 32-bit system call through `int 0x80` on x86_64 (i386
/// `getpid`, number 20), in a throwaway process. The filter sees a foreign
/// architecture and kills it; a pid coming back is an escape (a filter
/// for x86_64 numbers would be judging i386 ones).
pub(crate) fn int80(_ctx: &ProbeContext) -> Verdict {
    #[cfg(target_arch = "x86_64")]
    {
        let r = in_child(Duration::from_secs(5), |slots| {
            let mut ret: i64 = 20;
            // SAFETY: the i386 getpid takes no argument; r8–r11 are
            // declared clobbered (older kernels zeroed them on this path).
            unsafe {
                std::arch::asm!(
                    "int 0x80",
                    inlateout("rax") ret,
                    out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                    options(nostack)
                );
            }
            slots[0] = if ret > 0 { 0 } else { -ret };
        });
        // Without 32-bit emulation in the kernel the instruction faults
        // (SIGSEGV): refused as well, by the kernel.
        verdict(&[from_child("int 0x80 (i386 getpid)", r)])
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Verdict::skipped("int 0x80 exists on x86_64 only")
    }
}

/// Row 51: the mount API and root changes: `fspick("/")`,
/// `open_tree_attr(scratch, OPEN_TREE_CLONE)` (a detached copy, closed at
/// once), `mount_setattr` with an empty change, `pivot_root` between two
/// paths that do not exist, and `chroot` into the scratch directory (in a
/// throwaway process).
pub(crate) fn mount_api(ctx: &ProbeContext) -> Verdict {
    let (Some(scratch), Some(missing)) = (
        cpath(&ctx.scratch_dir),
        cpath(&ctx.scratch_dir.join(unique("absent"))),
    ) else {
        return Verdict::skipped("a path contains a NUL byte");
    };
    let mut v = Vec::new();
    const FSPICK_CLOEXEC: libc::c_uint = 1;
    // SAFETY: raw calls on NUL-terminated strings; descriptors are closed.
    unsafe {
        v.push(attempt(
            "fspick(/)",
            libc::syscall(
                libc::SYS_fspick,
                libc::AT_FDCWD,
                c"/".as_ptr(),
                FSPICK_CLOEXEC,
            ),
            true,
        ));
        const OPEN_TREE_CLONE: libc::c_uint = 1;
        v.push(attempt(
            "open_tree_attr(OPEN_TREE_CLONE)",
            libc::syscall(
                467,
                libc::AT_FDCWD,
                scratch.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                std::ptr::null::<u8>(),
                0usize,
            ),
            true,
        ));
        // struct mount_attr with nothing to change.
        let attr = [0u64; 4];
        v.push(attempt(
            "mount_setattr(no change)",
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                scratch.as_ptr(),
                0 as libc::c_uint,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            ),
            false,
        ));
        v.push(attempt(
            "pivot_root(absent, absent)",
            libc::syscall(libc::SYS_pivot_root, missing.as_ptr(), missing.as_ptr()),
            false,
        ));
    }
    let r = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: chroot in a throwaway process.
        slots[0] = slot(unsafe { libc::chroot(scratch.as_ptr()) } as _);
    });
    v.push(from_child("chroot(scratch)", r));
    verdict(&v)
}

/// Row 52: new namespaces, each in a throwaway process:
/// `unshare(CLONE_NEWTIME)`, `setns` back into its own UTS namespace,
/// `clone(CLONE_NEWUSER)`, and a plain fork through `clone3` (which must
/// answer `ENOSYS`, so libc falls back to `clone`, whose flags the filter
/// can see).
pub fn namespaces(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    let r = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: unshare in a throwaway process.
        slots[0] = slot(unsafe { libc::unshare(libc::CLONE_NEWTIME) } as _);
    });
    v.push(from_child("unshare(CLONE_NEWTIME)", r));
    let r = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: raw calls in a throwaway process; the descriptor dies
        // with it.
        unsafe {
            let fd = libc::open(
                c"/proc/self/ns/uts".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            slots[0] = slot(libc::setns(fd, libc::CLONE_NEWUTS) as _);
        }
    });
    v.push(from_child("setns(own UTS namespace)", r));
    let r = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: raw clone without a new stack behaves like fork; the new
        // process leaves at once.
        unsafe {
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
            let pid = libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize);
            if pid == 0 {
                libc::_exit(0);
            }
            slots[0] = slot(pid);
            if pid > 0 {
                let mut status = 0;
                libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL);
            }
        }
    });
    v.push(from_child("clone(CLONE_NEWUSER)", r));
    let r = in_child(Duration::from_secs(5), |slots| {
        // struct clone_args (version 0, 64 bytes): flags, pidfd,
        // child_tid, parent_tid, exit_signal, stack, stack_size, tls.
        let mut args = [0u64; 8];
        args[4] = libc::SIGCHLD as u64;
        // SAFETY: no new stack: the child continues like a fork and leaves
        // at once.
        unsafe {
            let pid = libc::syscall(libc::SYS_clone3, args.as_mut_ptr(), 64usize);
            if pid == 0 {
                libc::_exit(0);
            }
            slots[0] = slot(pid);
            if pid > 0 {
                let mut status = 0;
                libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL);
            }
        }
    });
    let mut a = from_child("clone3(plain fork)", r);
    // The filter's answer must be ENOSYS here: EPERM would stop libc's
    // fallback to clone.
    a.want_enosys = true;
    v.push(a);
    verdict(&v)
}

/// Row 53: `ptrace(PTRACE_SEIZE)` of pid 1 with an invalid option (the
/// kernel answers EIO before attaching, so nothing is ever attached) and
/// `kcmp(1, self, KCMP_VM)` (a read-only comparison). Pid 1 is the
/// sandbox's own init when there is a pid namespace — same uid, so only
/// the filter stands in the way.
pub(crate) fn ptrace_kcmp_init(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    const INVALID_OPTION: libc::c_ulong = 1 << 31;
    const KCMP_VM: libc::c_int = 1;
    // SAFETY: raw calls with integer arguments.
    unsafe {
        v.push(attempt(
            "ptrace(PTRACE_SEIZE, 1, invalid option)",
            libc::syscall(
                libc::SYS_ptrace,
                libc::PTRACE_SEIZE,
                1 as libc::pid_t,
                0usize,
                INVALID_OPTION,
            ),
            false,
        ));
        v.push(attempt(
            "kcmp(1, self, KCMP_VM)",
            libc::syscall(
                libc::SYS_kcmp,
                1 as libc::pid_t,
                libc::getpid(),
                KCMP_VM,
                0usize,
                0usize,
            ),
            false,
        ));
    }
    verdict(&v)
}

/// Row 54: kernel objects and side doors: `keyctl` (user keyring id),
/// `add_key` (a process-keyring key, in a throwaway process), `bpf` (an
/// array map), `perf_event_open` (a software clock on itself),
/// `userfaultfd` (user-mode only) and `io_uring_setup`. Descriptors are
/// closed at once.
pub(crate) fn kernel_objects(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
    const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
    const KEY_SPEC_PROCESS_KEYRING: libc::c_long = -2;
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    // SAFETY: raw calls; every pointer is to a buffer of the size the
    // kernel reads; descriptors are closed.
    unsafe {
        v.push(attempt(
            "keyctl(GET_KEYRING_ID)",
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_GET_KEYRING_ID,
                KEY_SPEC_USER_KEYRING,
                0usize,
            ),
            false,
        ));
        let mut attr = [0u32; 30];
        attr[..4].copy_from_slice(&[2, 4, 4, 1]); // BPF_MAP_TYPE_ARRAY, 4-byte key/value, 1 entry
        v.push(attempt(
            "bpf(BPF_MAP_CREATE)",
            libc::syscall(libc::SYS_bpf, 0 as libc::c_long, attr.as_mut_ptr(), 120u32),
            true,
        ));
        // perf_event_attr v0 (64 bytes): PERF_TYPE_SOFTWARE, size 64,
        // PERF_COUNT_SW_CPU_CLOCK, disabled | exclude_kernel | exclude_hv.
        let mut pattr = [0u64; 16];
        pattr[0] = 1 | (64u64 << 32);
        pattr[5] = 1 | (1 << 5) | (1 << 6);
        v.push(attempt(
            "perf_event_open(software clock)",
            libc::syscall(
                libc::SYS_perf_event_open,
                pattr.as_mut_ptr(),
                0 as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                0 as libc::c_ulong,
            ),
            true,
        ));
        v.push(attempt(
            "userfaultfd(UFFD_USER_MODE_ONLY)",
            libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | UFFD_USER_MODE_ONLY),
            true,
        ));
        let mut params = [0u8; 120];
        v.push(attempt(
            "io_uring_setup",
            libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()),
            true,
        ));
    }
    let r = in_child(Duration::from_secs(5), |slots| {
        // SAFETY: add_key on NUL-terminated strings; the process keyring
        // and its key die with this throwaway process.
        slots[0] = slot(unsafe {
            libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                c"mini-letta-probe".as_ptr(),
                c"x".as_ptr(),
                1usize,
                KEY_SPEC_PROCESS_KEYRING,
            )
        });
    });
    v.push(from_child("add_key(user, process keyring)", r));
    verdict(&v)
}

/// Row 55: `name_to_handle_at("/")` (needs no privilege at all) and
/// `open_by_handle_at` of a made-up handle (the kernel would answer ESTALE
/// after its capability check). Descriptors are closed.
pub(crate) fn file_handles(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    // struct file_handle: handle_bytes, handle_type, then the bytes.
    let mut buf = [0u32; 34];
    buf[0] = 128;
    let mut mount_id: libc::c_int = 0;
    // SAFETY: buffers of the sizes the kernel reads and writes.
    unsafe {
        v.push(attempt(
            "name_to_handle_at(/)",
            libc::syscall(
                libc::SYS_name_to_handle_at,
                libc::AT_FDCWD,
                c"/".as_ptr(),
                buf.as_mut_ptr(),
                &mut mount_id as *mut libc::c_int,
                0 as libc::c_int,
            ),
            false,
        ));
        let mut made_up = [0u32; 4];
        made_up[0] = 8;
        made_up[1] = 1;
        v.push(attempt(
            "open_by_handle_at(made-up handle)",
            libc::syscall(
                libc::SYS_open_by_handle_at,
                libc::AT_FDCWD,
                made_up.as_mut_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            ),
            true,
        ));
    }
    verdict(&v)
}

/// Row 56: the kernel log and the machine: `syslog(SIZE_BUFFER)` (a
/// query), `reboot` with a wrong magic number, `kexec_load` with an
/// invalid flag and too many segments, `init_module` of an empty image —
/// each rejected by the kernel right after its capability check.
pub(crate) fn kernel_log_and_boot(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    const SYSLOG_ACTION_SIZE_BUFFER: libc::c_int = 10;
    // SAFETY: raw calls whose arguments the kernel rejects (see above).
    unsafe {
        v.push(attempt(
            "syslog(SIZE_BUFFER)",
            libc::syscall(
                libc::SYS_syslog,
                SYSLOG_ACTION_SIZE_BUFFER,
                0usize,
                0 as libc::c_int,
            ),
            false,
        ));
        v.push(attempt(
            "reboot(wrong magic)",
            libc::syscall(
                libc::SYS_reboot,
                0 as libc::c_int,
                0 as libc::c_int,
                0u32,
                0usize,
            ),
            false,
        ));
        v.push(attempt(
            "kexec_load(invalid flag, 17 segments)",
            libc::syscall(libc::SYS_kexec_load, 0usize, 17usize, 0usize, 0x8000usize),
            false,
        ));
        v.push(attempt(
            "init_module(empty image)",
            libc::syscall(libc::SYS_init_module, 0usize, 0usize, c"".as_ptr()),
            false,
        ));
    }
    verdict(&v)
}

/// Row 57: `clock_settime(CLOCK_REALTIME)` with an invalid nanosecond
/// count and `sethostname` with a name longer than the kernel accepts.
pub(crate) fn clock_and_hostname(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    let bad = libc::timespec {
        tv_sec: 0,
        tv_nsec: 2_000_000_000,
    };
    let name = [b'x'; 1000];
    // SAFETY: pointers to values of the sizes the kernel reads.
    unsafe {
        v.push(attempt(
            "clock_settime(invalid time)",
            libc::syscall(
                libc::SYS_clock_settime,
                libc::CLOCK_REALTIME,
                &bad as *const libc::timespec,
            ),
            false,
        ));
        v.push(attempt(
            "sethostname(1000 bytes)",
            libc::syscall(libc::SYS_sethostname, name.as_ptr(), name.len()),
            false,
        ));
    }
    verdict(&v)
}

/// Row 58: `mknodat` of a character (1:3) and a block device in the
/// scratch directory (removed at once if made); a FIFO must still work
/// there (`mkfifo` is a coreutils program), which the evidence records.
pub(crate) fn mknodat_devices(ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    for (what, kind, dev) in [
        ("char 1:3", libc::S_IFCHR, libc::makedev(1, 3)),
        ("block 7:0", libc::S_IFBLK, libc::makedev(7, 0)),
    ] {
        let path = ctx.scratch_dir.join(unique("node"));
        let Some(c) = cpath(&path) else { continue };
        // SAFETY: mknodat on a NUL-terminated path.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mknodat,
                libc::AT_FDCWD,
                c.as_ptr(),
                kind | 0o600,
                dev,
            )
        };
        let mut a = attempt(format!("mknodat({what})"), r, false);
        if r == 0 {
            let _ = std::fs::remove_file(&path);
        }
        // Landlock refuses device creation too (EACCES).
        a.also_refused = &[libc::EACCES, libc::EROFS];
        v.push(a);
    }
    let fifo = ctx.scratch_dir.join(unique("fifo"));
    let note = match cpath(&fifo) {
        // SAFETY: mknodat on a NUL-terminated path.
        Some(c) => match unsafe {
            libc::syscall(
                libc::SYS_mknodat,
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::S_IFIFO | 0o600,
                0,
            )
        } {
            0 => {
                let _ = std::fs::remove_file(&fifo);
                "a FIFO can still be made".to_string()
            }
            _ => format!(
                "a FIFO cannot be made either ({})",
                super::util::last_errno()
            ),
        },
        None => "no FIFO tried".to_string(),
    };
    match verdict(&v) {
        Verdict::Blocked { evidence } => Verdict::blocked(format!("{evidence}; {note}")),
        other => other,
    }
}

/// Socket types tried for every family.
const SOCKET_TYPES: &[(libc::c_int, &str)] = &[
    (libc::SOCK_STREAM, "stream"),
    (libc::SOCK_DGRAM, "dgram"),
    (libc::SOCK_RAW, "raw"),
    (libc::SOCK_SEQPACKET, "seqpacket"),
];

/// Families a kernel has built in (tried even without a filter: asking
/// for any other family makes the kernel load its module).
const BUILT_IN_FAMILIES: &[libc::c_int] = &[
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
    libc::AF_PACKET,
];

/// Row 59: `socket` of every family 0–46 but `AF_UNIX`, with four types
/// each, and `socketpair` of each family. Escaped if any socket is made
/// (closed at once). Without a seccomp filter on this process only the
/// families every kernel has built in are tried, so that an unconfined run
/// does not make the kernel load protocol modules.
pub(crate) fn socket_families(ctx: &ProbeContext) -> Verdict {
    let filtered = self_status("Seccomp").is_some_and(|v| v == "2");
    // With the egress proxy, TCP sockets are the child's way to it.
    let expected = |fam: libc::c_int, ty: libc::c_int| {
        ctx.egress.is_some()
            && ty == libc::SOCK_STREAM
            && (fam == libc::AF_INET || fam == libc::AF_INET6)
    };
    let families: Vec<libc::c_int> = (0..=46)
        .filter(|f| *f != libc::AF_UNIX)
        .filter(|f| filtered || BUILT_IN_FAMILIES.contains(f))
        .collect();
    let mut made = Vec::new();
    let mut errnos: std::collections::BTreeMap<String, usize> = Default::default();
    for fam in &families {
        for (ty, tname) in SOCKET_TYPES {
            // SAFETY: socket returns a new descriptor or -1.
            let fd = unsafe { libc::socket(*fam, ty | libc::SOCK_CLOEXEC, 0) };
            if fd >= 0 && expected(*fam, *ty) {
                close(fd);
            } else if fd >= 0 {
                close(fd);
                made.push(format!("socket({fam}, {tname})"));
            } else {
                *errnos.entry(super::util::last_errno()).or_default() += 1;
            }
        }
        let mut pair = [-1; 2];
        // SAFETY: socketpair fills the two-element array.
        if unsafe {
            libc::socketpair(
                *fam,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        } == 0
        {
            close(pair[0]);
            close(pair[1]);
            made.push(format!("socketpair({fam})"));
        } else {
            *errnos.entry(super::util::last_errno()).or_default() += 1;
        }
    }
    let summary = errnos
        .iter()
        .map(|(e, n)| format!("{e} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let scope = if filtered {
        let tcp = if ctx.egress.is_some() {
            ", TCP of AF_INET/AF_INET6 expected (the egress proxy)"
        } else {
            ""
        };
        format!("{} families (0–46 but AF_UNIX{tcp})", families.len())
    } else {
        format!(
            "{} built-in families only (no seccomp filter here: other families would load modules)",
            families.len()
        )
    };
    if made.is_empty() {
        Verdict::blocked(format!("{scope}: every call refused ({summary})"))
    } else {
        Verdict::escaped(format!("{scope}: {} (refused: {summary})", join(&made)))
    }
}

/// Row 60: create a file in `/dev/shm` (POSIX shared memory; a channel to
/// whoever else sees that directory). Escaped if it is made (removed).
pub(crate) fn dev_shm_write(_ctx: &ProbeContext) -> Verdict {
    let path = std::path::Path::new("/dev/shm").join(unique("shm"));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            Verdict::escaped(format!("created {} (removed)", path.display()))
        }
        Err(e) => Verdict::blocked(format!(
            "create {}: {}",
            path.display(),
            super::util::io_name(&e)
        )),
    }
}

/// Row 61: open `/proc/kmsg` (the kernel log, host-wide). Escaped if it
/// opens (closed without reading, which would consume messages).
pub(crate) fn proc_kmsg(_ctx: &ProbeContext) -> Verdict {
    // SAFETY: open/close; nothing is read.
    let fd = unsafe {
        libc::open(
            c"/proc/kmsg".as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        close(fd);
        Verdict::escaped("opened /proc/kmsg (nothing read)")
    } else {
        Verdict::blocked(format!("open /proc/kmsg: {}", super::util::last_errno()))
    }
}

/// Row 62: `getpid` under its x32 number (bit 30 set). The filter refuses
/// every x32 number; a kernel without x32 support answers ENOSYS itself.
pub(crate) fn x32_bit(_ctx: &ProbeContext) -> Verdict {
    if !cfg!(target_arch = "x86_64") {
        return Verdict::skipped("the x32 ABI exists on x86_64 only");
    }
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    // SAFETY: getpid takes no argument.
    let r = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) };
    verdict(&[attempt("getpid | 0x40000000", r, false)])
}

/// Row 63: calls outside every list answer `ENOSYS` (so programs take
/// their old-kernel fallback): numbers no kernel assigns yet (1000, 1023)
/// and a real call no role lists (`adjtimex` reading the clock state).
pub(crate) fn unknown_syscalls(_ctx: &ProbeContext) -> Verdict {
    let mut v = Vec::new();
    // struct timex is 208 bytes on 64-bit; modes = 0 only reads.
    let mut timex = [0u64; 26];
    // SAFETY: numbers without a handler take no argument; adjtimex with
    // modes 0 only fills the buffer.
    unsafe {
        v.push(attempt("syscall 1000", libc::syscall(1000), false));
        v.push(attempt("syscall 1023", libc::syscall(1023), false));
        v.push(attempt(
            "adjtimex(read only)",
            libc::syscall(libc::SYS_adjtimex, timex.as_mut_ptr()),
            false,
        ));
    }
    // The allow-list's default must be ENOSYS, not EPERM.
    for a in &mut v {
        a.want_enosys = true;
    }
    verdict(&v)
}
