//! The system calls confinement needs that `nix` does not wrap, each
//! checked: a failure comes back as its errno in a `std::io::Error`, never
//! as a sentinel value left for the caller to test. Everything else the
//! sandbox, the launcher and the supervisor call goes through `nix`.
//!
//! Every function here allocates nothing and makes only async-signal-safe
//! calls, so it may run between `fork` and `exec` of a multi-threaded
//! process (the launcher's `pre_exec`, the namespace probe). The escape
//! probes (`probes/`) do not use this module: they issue their raw calls on
//! purpose.

use std::ffi::{CStr, c_long, c_uint, c_ulong, c_void};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, FcntlArg, FdFlag, fcntl};
use nix::sys::signal::Signal;
use nix::unistd::{SysconfVar, sysconf};

/// `r`, or the errno of the call that just returned it (negative).
fn check(r: c_long) -> io::Result<c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Make the mount read-only (`MOUNT_ATTR_RDONLY`).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// Ignore set-user-id bits and file capabilities (`MOUNT_ATTR_NOSUID`).
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// Refuse access to device nodes (`MOUNT_ATTR_NODEV`).
pub const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` of `linux/mount.h`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set the `MOUNT_ATTR_*` bits of `attr_set` on the mount at `path` and on
/// every mount below it (`mount_setattr(AT_RECURSIVE)`, Linux 5.12).
pub(crate) fn mount_setattr_recursive(path: &CStr, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a NUL-terminated path and a valid `mount_attr` with its size,
    // both outliving the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            AT_FDCWD.as_raw_fd(),
            path.as_ptr(),
            libc::AT_RECURSIVE as c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(r).map(drop)
}

/// A capability [`clear_bounding_set`] could not remove.
#[derive(Debug)]
pub struct BoundingSetError {
    /// The capability number.
    pub cap: u32,
    /// `PR_CAPBSET_DROP` succeeded but `PR_CAPBSET_READ` still finds it.
    pub still_set: bool,
    /// The errno (`EPERM` when `still_set`).
    pub source: io::Error,
}

impl fmt::Display for BoundingSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.still_set {
            write!(f, "capability {} is still in the bounding set", self.cap)
        } else {
            write!(f, "prctl(PR_CAPBSET_DROP, {}): {}", self.cap, self.source)
        }
    }
}

impl std::error::Error for BoundingSetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<BoundingSetError> for io::Error {
    fn from(e: BoundingSetError) -> Self {
        e.source
    }
}

/// Empty the capability bounding set (needs `CAP_SETPCAP`), reading each
/// capability back: one left there could come back through a file
/// capability if `no_new_privs` were ever missing. `EINVAL` marks a number
/// past the kernel's last capability: the end.
pub fn clear_bounding_set() -> Result<(), BoundingSetError> {
    for cap in 0..=63u32 {
        // SAFETY: PR_CAPBSET_DROP takes integers only.
        let dropped = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, c_ulong::from(cap), 0, 0, 0) };
        if let Err(source) = check(dropped.into()) {
            if source.raw_os_error() == Some(Errno::EINVAL as i32) {
                break;
            }
            return Err(BoundingSetError {
                cap,
                still_set: false,
                source,
            });
        }
        // SAFETY: PR_CAPBSET_READ takes integers only.
        let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, c_ulong::from(cap), 0, 0, 0) };
        if held != 0 {
            return Err(BoundingSetError {
                cap,
                still_set: true,
                source: Errno::EPERM.into(),
            });
        }
    }
    Ok(())
}

/// Empty the ambient capability set (`PR_CAP_AMBIENT_CLEAR_ALL`).
pub(crate) fn clear_ambient_capabilities() -> io::Result<()> {
    // SAFETY: PR_CAP_AMBIENT takes integers only.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    check(r.into()).map(drop)
}

/// Empty the effective, permitted and inheritable capability sets
/// (`capset`, version 3: both 32-bit halves).
pub(crate) fn clear_capability_sets() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a version-3 header and the two data structures it announces,
    // both outliving the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    check(r).map(drop)
}

/// A pidfd for `pid` (`pidfd_open`, Linux 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::from(Errno::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(Errno::EBADF))?;
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Send `signal` to the process `pidfd` holds (`pidfd_send_signal`).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: Signal) -> io::Result<()> {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as i32,
            std::ptr::null::<c_void>(),
            0,
        )
    };
    check(r).map(drop)
}

/// Make `fd` also descriptor `at`, inherited across `exec` (`dup2`, then
/// `FD_CLOEXEC` cleared: `dup2` onto the same number keeps the flag).
/// `at` is taken over whatever it was: use it before `exec` only.
pub fn install_fd(fd: BorrowedFd<'_>, at: RawFd) -> io::Result<()> {
    // Raw: nix's `dup2` wants the target as an `OwnedFd`, and `at` need
    // not be open yet.
    // SAFETY: dup2 of a descriptor we hold onto a number we give up.
    check(unsafe { libc::dup2(fd.as_raw_fd(), at) }.into())?;
    // SAFETY: dup2 just made `at` an open descriptor, and it stays open:
    // nothing closes it before exec.
    let installed = unsafe { BorrowedFd::borrow_raw(at) };
    fcntl(installed, FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok(())
}

/// Mark every descriptor from `first` up close-on-exec. `close_range`
/// (Linux 5.11) does it at once; before that each possible number is
/// marked in turn, and the numbers that are not open answer `EBADF`, which
/// is the expected answer there, not a failure.
pub fn cloexec_from(first: u32) {
    // SAFETY: close_range with integer arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    let max = sysconf(SysconfVar::OPEN_MAX)
        .ok()
        .flatten()
        .unwrap_or(0)
        .clamp(256, 65536) as RawFd;
    let first = RawFd::try_from(first).unwrap_or(RawFd::MAX);
    for fd in first..max {
        // Raw: most of these numbers are not open, and a `BorrowedFd` for
        // one that is not would be a lie.
        // SAFETY: F_SETFD with integer flags; a number that is not open
        // answers EBADF and changes nothing.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// Close descriptor `fd`, which nothing in this process owns (stdio the
/// process gives up, say).
pub fn close(fd: RawFd) -> io::Result<()> {
    Ok(nix::unistd::close(fd)?)
}

/// Leave at once with `code`, running no destructor and no `atexit`
/// handler (a forked copy of a process, whose state belongs to its parent).
pub fn exit_now(code: i32) -> ! {
    // Raw: nix has no `_exit`, and `std::process::exit` runs `atexit`.
    // SAFETY: _exit never returns and touches no process state.
    unsafe { libc::_exit(code) }
}

/// The landlock ABI version of the running kernel
/// (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`).
pub(crate) fn landlock_abi_version() -> io::Result<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;
    // SAFETY: the documented version query: no ruleset, size 0.
    let v = check(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })?;
    Ok(i32::try_from(v).unwrap_or(i32::MAX))
}

/// Create a new SysV shared-memory segment of `size` bytes under `key`,
/// mode 0600 (`shmget(IPC_CREAT | IPC_EXCL)`); its id.
pub fn shm_create(key: i32, size: usize) -> io::Result<i32> {
    // SAFETY: shmget takes integers only.
    let id = unsafe { libc::shmget(key, size, libc::IPC_CREAT | libc::IPC_EXCL | 0o600) };
    check(id.into()).map(|_| id)
}

/// Remove the SysV shared-memory segment `id` (`shmctl(IPC_RMID)`).
pub fn shm_remove(id: i32) -> io::Result<()> {
    // SAFETY: IPC_RMID takes no buffer.
    check(unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) }.into()).map(drop)
}

/// What an exited (not yet reaped) child used, with its reaped
/// descendants: CPU time (user + system, µs) and peak resident set
/// (bytes). `None` while it still runs. The child stays a zombie
/// (`WNOWAIT`): whoever reaps it still gets its status.
pub fn exited_usage(pidfd: BorrowedFd<'_>) -> io::Result<Option<(u64, u64)>> {
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: zeroed siginfo and rusage are valid plain data for the kernel to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the raw waitid takes a fifth argument, the rusage to fill;
    // both out-pointers outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_waitid,
            P_PIDFD,
            pidfd.as_raw_fd(),
            &mut info as *mut libc::siginfo_t,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            &mut usage as *mut libc::rusage,
        )
    };
    check(r)?;
    // SAFETY: waitid filled `info`; si_pid is 0 when no child was waitable.
    if unsafe { info.si_pid() } == 0 {
        return Ok(None);
    }
    let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    let cpu = us(usage.ru_utime) + us(usage.ru_stime);
    Ok(Some((cpu, (usage.ru_maxrss.max(0) as u64) * 1024)))
}

/// Bring the loopback interface `lo` of the calling thread's network
/// namespace up (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with `IFF_UP`), which
/// gives it `127.0.0.1`; a new namespace starts with it down. Needs
/// `CAP_NET_ADMIN` over the namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() returns a new descriptor or -1 (checked), owned here.
    let sock = unsafe {
        OwnedFd::from_raw_fd(check(
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0).into(),
        )? as RawFd)
    };
    // SAFETY: an all-zero ifreq is a valid request (empty name, no flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq it is given.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) }.into())?;
    // SAFETY: the flags member is the one SIOCGIFFLAGS just wrote.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq it is given.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }.into()).map(drop)
}
