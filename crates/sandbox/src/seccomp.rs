//! The seccomp filter of every confined child (spec sandbox.md §c.6), as an
//! allow-list per role: a call that is not listed fails with `ENOSYS` (so
//! programs take the fallback they have for an old kernel), calls that
//! escape or widen a sandbox fail with `EPERM`, and a few calls are judged
//! by an argument:
//!
//! * `clone` with a `CLONE_NEW*` flag → `EPERM` (`clone3`, whose flags live
//!   in memory out of the filter's reach, is unlisted → `ENOSYS`, and libc
//!   falls back to `clone`);
//! * `socket` / `socketpair` of any family but `AF_UNIX` → `EPERM` (roles
//!   have no network); with the egress proxy (`Options::egress`), `socket`
//!   also of `AF_INET`/`AF_INET6` but only `SOCK_STREAM` — TCP to the
//!   proxy endpoint, which landlock narrows to its port; UDP and raw
//!   sockets still get `EPERM`, so a resolver inside learns nothing;
//! * `ioctl(TIOCSTI)` / `ioctl(TIOCLINUX)` → `EPERM` (terminal injection);
//! * `mknod` / `mknodat` of a character or block device → `EPERM` (FIFOs
//!   and plain files stay allowed: `mkfifo` is a coreutils program).
//!
//! Every argument the kernel reads as a 32-bit value (`int domain`,
//! `unsigned int cmd`, `umode_t mode`, and `clone`'s flags, of which it keeps
//! the lower half) is compared on its lower 32 bits only, so garbage in the
//! upper half cannot slip past a full 64-bit comparison (CVE-2019-10063).
//!
//! Before any of that, the filter checks `seccomp_data.arch` and kills the
//! process on a foreign one (a 32-bit `int 0x80` on x86_64 is `i386`, with
//! different numbers), and on x86_64 refuses the x32 numbers (bit 30 set),
//! which name the same kernel functions under other numbers.
//!
//! The program is assembled here rather than by seccompiler's rule builder,
//! which emits five instructions per listed call and scans them in order:
//! about 1,400 instructions for these lists, in two filters (it has one
//! match action per filter). Here one filter binary-searches the sorted
//! call numbers down to small leaves of comparisons, so a call takes ~20
//! steps (at most 24) instead of up to ~450. That matters twice: at install time the
//! kernel emulates the filter for every call number to build its cache of
//! always-allowed calls (the bulk of the install cost, paid on every child
//! launch), and at run time for every call it could not cache (those with
//! argument checks: `ioctl`, `clone`, `socket`…). seccompiler still
//! installs it.

use std::fmt;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::socket::{AddressFamily, SockType};
use nix::sys::stat::SFlag;
use seccompiler::{BpfProgram, sock_filter};
use serde::{Deserialize, Serialize};

/// The role whose list applies (the roles of `sandbox-profiles/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Agent,
    Tool,
    MemoryWorker,
    Reflection,
    Recall,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Agent,
        Role::Tool,
        Role::MemoryWorker,
        Role::Reflection,
        Role::Recall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Tool => "tool",
            Role::MemoryWorker => "memory-worker",
            Role::Reflection => "reflection",
            Role::Recall => "recall",
        }
    }

    /// The role of a profile name; `None` for anything else (the caller
    /// refuses to launch).
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("no seccomp filter for this architecture (x86_64 and little-endian aarch64 only)")]
    UnsupportedArch,
    #[error("the filter would have {0} instructions, more than the kernel's 4096")]
    TooLarge(usize),
    #[error("installing the filter: {0}")]
    Install(String),
}

/// One system call: its name (for tests and reports) and number.
pub type Syscall = (&'static str, i64);

/// A call of the libc crate's numbering, by name: the name and the number
/// come from one identifier, so they cannot disagree.
macro_rules! call {
    ($name:ident) => {
        (stringify!($name), libc::$name as i64)
    };
}

macro_rules! calls {
    ($($name:ident),* $(,)?) => {
        &[$(call!($name)),*]
    };
}

// Numbers the libc crate does not define for every architecture. From 424
// on, every architecture shares one numbering (include/uapi/asm-generic/
// unistd.h), so one value serves x86_64 and aarch64.
const NR_EPOLL_PWAIT2: i64 = 441;
const NR_FCHMODAT2: i64 = 452;
const NR_MAP_SHADOW_STACK: i64 = 453;
const NR_STATMOUNT: i64 = 457;
const NR_LISTMOUNT: i64 = 458;
const NR_OPEN_TREE_ATTR: i64 = 467;

/// What a shell, coreutils, the git CLI, python3 and our own binary (tokio,
/// std, glibc) need, on both architectures. Everything a file descriptor or
/// path reaches stays under landlock and the mount view; these are only
/// the kernel entry points.
#[rustfmt::skip]
const BASE: &[Syscall] = calls![
    // Files and directories.
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv,
    SYS_pwritev, SYS_preadv2, SYS_pwritev2, SYS_openat, SYS_openat2, SYS_close, SYS_close_range,
    SYS_lseek, SYS_fstat, SYS_newfstatat, SYS_statx, SYS_statfs, SYS_fstatfs, SYS_getdents64,
    SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_mkdirat, SYS_unlinkat, SYS_renameat2, SYS_linkat,
    SYS_symlinkat, SYS_readlinkat, SYS_faccessat, SYS_faccessat2, SYS_fchmod, SYS_fchmodat,
    SYS_fchown, SYS_fchownat, SYS_truncate, SYS_ftruncate, SYS_fallocate, SYS_fsync,
    SYS_fdatasync, SYS_sync, SYS_syncfs, SYS_utimensat, SYS_dup, SYS_dup3, SYS_fcntl, SYS_flock,
    SYS_umask, SYS_getxattr, SYS_lgetxattr, SYS_fgetxattr, SYS_listxattr, SYS_llistxattr,
    SYS_flistxattr, SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr, SYS_removexattr, SYS_lremovexattr,
    SYS_fremovexattr, SYS_sendfile, SYS_copy_file_range, SYS_splice, SYS_tee, SYS_readahead,
    SYS_fadvise64, SYS_inotify_init1, SYS_inotify_add_watch, SYS_inotify_rm_watch,
    SYS_memfd_create,
    // Pipes, events, polling.
    SYS_pipe2, SYS_eventfd2, SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime,
    SYS_signalfd4, SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_ppoll, SYS_pselect6,
    // Memory.
    SYS_brk, SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_madvise, SYS_msync, SYS_mincore,
    SYS_mlock, SYS_munlock, SYS_mlock2, SYS_membarrier, SYS_mseal,
    // Processes (clone's namespace flags are checked below).
    SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid, SYS_getpid,
    SYS_getppid, SYS_gettid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getresuid,
    SYS_getresgid, SYS_getgroups, SYS_getpgid, SYS_setpgid, SYS_getsid, SYS_setsid, SYS_getrusage,
    SYS_prlimit64, SYS_times, SYS_uname, SYS_sysinfo, SYS_getpriority, SYS_setpriority,
    SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_getparam, SYS_sched_getscheduler,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_set_tid_address,
    SYS_set_robust_list, SYS_rseq, SYS_prctl, SYS_capget, SYS_getcpu, SYS_getrandom,
    SYS_pidfd_open, SYS_pidfd_send_signal,
    // Signals (to processes this uid may signal; landlock scopes the rest).
    SYS_kill, SYS_tkill, SYS_tgkill, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn,
    SYS_rt_sigsuspend, SYS_rt_sigpending, SYS_rt_sigtimedwait, SYS_sigaltstack,
    SYS_restart_syscall,
    // Time and waiting.
    SYS_nanosleep, SYS_clock_nanosleep, SYS_clock_gettime, SYS_clock_getres, SYS_gettimeofday,
    SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_settime, SYS_timer_gettime,
    SYS_timer_getoverrun, SYS_timer_delete, SYS_futex, SYS_futex_waitv,
    // Sockets (the family of socket/socketpair is checked below).
    SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_sendto, SYS_recvfrom,
    SYS_sendmsg, SYS_recvmsg, SYS_sendmmsg, SYS_recvmmsg, SYS_shutdown, SYS_getsockname,
    SYS_getpeername, SYS_getsockopt, SYS_setsockopt,
    // Narrowing one's own confinement further is always allowed (a nested
    // stage 2 for a tool command, a program's own sandbox).
    SYS_seccomp, SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self,
];

/// Numbers of [`BASE`] the libc crate lacks on some architecture.
const BASE_RAW: &[Syscall] = &[
    ("SYS_epoll_pwait2", NR_EPOLL_PWAIT2),
    // glibc ≥ 2.39 tries it first for lchmod-style calls.
    ("SYS_fchmodat2", NR_FCHMODAT2),
    // glibc on a CPU with shadow stacks (x86 CET, arm64 GCS) maps thread
    // shadow stacks with it.
    ("SYS_map_shadow_stack", NR_MAP_SHADOW_STACK),
];

/// The old entry points x86_64 keeps beside the `*at` ones (aarch64 never
/// had them); static binaries and old programs still call them.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
const BASE_ARCH: &[Syscall] = calls![
    SYS_open, SYS_creat, SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_rename, SYS_renameat,
    SYS_mkdir, SYS_rmdir, SYS_unlink, SYS_link, SYS_symlink, SYS_chmod, SYS_chown, SYS_lchown,
    SYS_fork, SYS_vfork, SYS_getdents, SYS_utimes, SYS_utime, SYS_futimesat, SYS_pipe, SYS_dup2,
    SYS_poll, SYS_select, SYS_epoll_wait, SYS_epoll_create, SYS_eventfd, SYS_signalfd,
    SYS_inotify_init, SYS_pause, SYS_alarm, SYS_time, SYS_getpgrp, SYS_arch_prctl,
    SYS_sync_file_range, SYS_getrlimit, SYS_setrlimit,
];

/// The generic numbers (asm-generic/unistd.h) of calls the libc crate does
/// not name for aarch64.
#[cfg(target_arch = "aarch64")]
const BASE_ARCH: &[Syscall] = &[
    ("SYS_renameat", 38),
    ("SYS_sync_file_range", 84),
    ("SYS_getrlimit", 163),
    ("SYS_setrlimit", 164),
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const BASE_ARCH: &[Syscall] = &[];

/// SysV IPC and POSIX message queues (databases, test suites). Objects
/// live in an IPC namespace: private to the sandbox at L0, the host's at L2
/// (a channel to other agents — row 45), hence granted only with a
/// private one.
#[rustfmt::skip]
const IPC: &[Syscall] = calls![
    SYS_shmget, SYS_shmat, SYS_shmdt, SYS_shmctl, SYS_semget, SYS_semop, SYS_semtimedop,
    SYS_semctl, SYS_msgget, SYS_msgsnd, SYS_msgrcv, SYS_msgctl, SYS_mq_open, SYS_mq_unlink,
    SYS_mq_timedsend, SYS_mq_timedreceive, SYS_mq_notify, SYS_mq_getsetattr,
];

/// What else arbitrary tool commands may need: scheduler tuning
/// (`taskset`, `chrt`, `ionice`), `personality` (`setarch`), Linux AIO,
/// and setting ids to the ones the command already has (`make` spawns each
/// recipe with `POSIX_SPAWN_RESETIDS`, i.e. `setresuid(-1, uid, -1)`).
/// The latter can change nothing: the child holds no capability (bounding
/// set emptied, `capset` cleared), so the kernel allows only its own ids,
/// which are all one agent uid; `setgroups` stays out.
#[rustfmt::skip]
const TOOLS: &[Syscall] = calls![
    SYS_sched_setaffinity, SYS_sched_setparam, SYS_sched_setscheduler, SYS_sched_getattr,
    SYS_sched_setattr, SYS_ioprio_get, SYS_ioprio_set, SYS_personality, SYS_io_setup,
    SYS_io_destroy, SYS_io_submit, SYS_io_cancel, SYS_io_getevents, SYS_setuid, SYS_setgid,
    SYS_setreuid, SYS_setregid, SYS_setresuid, SYS_setresgid, SYS_setfsuid, SYS_setfsgid,
];

/// A group of calls a role may get on top of [`BASE`].
#[derive(Debug, Clone, Copy)]
struct Group {
    calls: &'static [Syscall],
    /// Only when the child has an IPC namespace of its own.
    needs_private_ipc: bool,
}

const IPC_GROUP: Group = Group {
    calls: IPC,
    needs_private_ipc: true,
};
const TOOLS_GROUP: Group = Group {
    calls: TOOLS,
    needs_private_ipc: false,
};

/// The per-role differences, in one table: the groups each role gets on
/// top of [`BASE`]. The agent's in-process tools, the memory worker and
/// reflection run our binary, git and shell pipelines; only `tool` runs
/// arbitrary programs.
const ROLE_EXTRAS: &[(Role, &[Group])] = &[
    (Role::Agent, &[]),
    (Role::Tool, &[IPC_GROUP, TOOLS_GROUP]),
    (Role::MemoryWorker, &[]),
    (Role::Reflection, &[]),
    (Role::Recall, &[]),
];

/// What the filter depends on besides the role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// No sockets but Unix ones (every role today).
    pub no_network: bool,
    /// The child has its own IPC namespace (the namespace layer is on).
    pub private_ipc: bool,
    /// The child reaches the egress proxy: TCP sockets (see
    /// [`Check::UnixOrStream`]).
    pub egress: bool,
}

/// Calls that escape or widen a sandbox, refused with `EPERM` in every
/// role (a clear "not permitted", where `ENOSYS` would invite a fallback).
#[rustfmt::skip]
const DENIED: &[Syscall] = calls![
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_pidfd_getfd, SYS_kcmp, SYS_mount,
    SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_fsopen, SYS_fsmount, SYS_fsconfig, SYS_fspick,
    SYS_move_mount, SYS_open_tree, SYS_mount_setattr, SYS_unshare, SYS_setns, SYS_keyctl,
    SYS_add_key, SYS_request_key, SYS_bpf, SYS_perf_event_open, SYS_io_uring_setup,
    SYS_io_uring_enter, SYS_io_uring_register, SYS_userfaultfd, SYS_init_module, SYS_finit_module,
    SYS_delete_module, SYS_kexec_load, SYS_kexec_file_load, SYS_open_by_handle_at,
    SYS_name_to_handle_at, SYS_fanotify_init, SYS_fanotify_mark, SYS_swapon, SYS_swapoff,
    SYS_reboot, SYS_acct, SYS_syslog, SYS_quotactl, SYS_vhangup, SYS_clock_settime,
    SYS_settimeofday, SYS_sethostname, SYS_setdomainname,
];

/// Denied numbers the libc crate lacks (mount API additions of 6.8–6.15).
const DENIED_RAW: &[Syscall] = &[
    ("SYS_statmount", NR_STATMOUNT),
    ("SYS_listmount", NR_LISTMOUNT),
    ("SYS_open_tree_attr", NR_OPEN_TREE_ATTR),
];

/// x86_64 only: I/O port access and LDT changes.
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[Syscall] = calls![SYS_iopl, SYS_ioperm, SYS_modify_ldt];
#[cfg(not(target_arch = "x86_64"))]
const DENIED_ARCH: &[Syscall] = &[];

/// `clone` flags that create namespaces (`CLONE_NEWTIME` shares its bit
/// with the exit signal in `clone`; it only exists for `unshare`/`clone3`,
/// both refused outright).
const CLONE_NS_FLAGS: u32 = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWUSER)
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP)
    .bits() as u32;

/// How a call's argument decides.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// `EPERM` when any of these bits is set.
    AnyBit(u32),
    /// `EPERM` unless the argument is this value.
    Only(u32),
    /// `EPERM` when the argument is one of these.
    OneOf(&'static [u32]),
    /// `EPERM` when `argument & mask` is one of these.
    MaskedOneOf(u32, &'static [u32]),
    /// `socket`'s domain (argument 0): `AF_UNIX` of any type; these
    /// families only with type (argument 1, flags masked off)
    /// `SOCK_STREAM`; `EPERM` for the rest.
    UnixOrStream(&'static [u32]),
}

/// A call allowed unless its argument `arg` fails `check`.
#[derive(Debug, Clone, Copy)]
struct ArgRule {
    call: Syscall,
    arg: u32,
    check: Check,
}

const DEVICE_TYPES: &[u32] = &[SFlag::S_IFCHR.bits(), SFlag::S_IFBLK.bits()];
const TERMINAL_INJECTION: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// The families a command may open stream sockets of for the proxy.
const EGRESS_FAMILIES: &[u32] = &[AddressFamily::Inet as u32, AddressFamily::Inet6 as u32];

fn arg_rules(opts: Options) -> Vec<ArgRule> {
    let no_network = opts.no_network;
    let mut v = vec![
        ArgRule {
            call: call!(SYS_clone),
            arg: 0,
            check: Check::AnyBit(CLONE_NS_FLAGS),
        },
        ArgRule {
            call: call!(SYS_ioctl),
            arg: 1,
            check: Check::OneOf(TERMINAL_INJECTION),
        },
        ArgRule {
            call: call!(SYS_mknodat),
            arg: 2,
            check: Check::MaskedOneOf(SFlag::S_IFMT.bits(), DEVICE_TYPES),
        },
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(ArgRule {
        call: call!(SYS_mknod),
        arg: 1,
        check: Check::MaskedOneOf(SFlag::S_IFMT.bits(), DEVICE_TYPES),
    });
    let domain = |call: Syscall| ArgRule {
        call,
        arg: 0,
        check: if no_network {
            Check::Only(AddressFamily::Unix as u32)
        } else {
            Check::OneOf(&[])
        },
    };
    let socket = call!(SYS_socket);
    v.push(if no_network && opts.egress {
        ArgRule {
            call: socket,
            arg: 0,
            check: Check::UnixOrStream(EGRESS_FAMILIES),
        }
    } else {
        domain(socket)
    });
    // A pair of inet sockets does not exist: Unix only, egress or not.
    v.push(domain(call!(SYS_socketpair)));
    v
}

/// Every call `role` may make without an argument check.
pub fn allowed(role: Role, opts: Options) -> Vec<Syscall> {
    let mut v: Vec<Syscall> = BASE
        .iter()
        .chain(BASE_RAW)
        .chain(BASE_ARCH)
        .copied()
        .collect();
    for (r, groups) in ROLE_EXTRAS {
        if *r == role {
            for g in groups
                .iter()
                .filter(|g| opts.private_ipc || !g.needs_private_ipc)
            {
                v.extend_from_slice(g.calls);
            }
        }
    }
    v.sort_by_key(|c| c.1);
    v.dedup_by_key(|c| c.1);
    v
}

/// Every call refused with `EPERM` whatever its arguments.
pub fn denied() -> Vec<Syscall> {
    let mut v: Vec<Syscall> = DENIED
        .iter()
        .chain(DENIED_RAW)
        .chain(DENIED_ARCH)
        .copied()
        .collect();
    v.sort_by_key(|c| c.1);
    v.dedup_by_key(|c| c.1);
    v
}

/// Calls allowed with an argument check (their names).
pub fn checked(no_network: bool) -> Vec<&'static str> {
    arg_rules(Options {
        no_network,
        private_ipc: false,
        egress: false,
    })
    .iter()
    .map(|r| r.call.0)
    .collect()
}

// Classic BPF, as in linux/filter.h and linux/bpf_common.h.
// BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x04 | 0x50;
const BPF_JMP_JA: u16 = 0x05;
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JGE_K: u16 = 0x05 | 0x30;
const BPF_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Lower 32 bits of `args[i]` (little-endian only; see [`audit_arch`]).
fn off_arg_low(i: u32) -> u32 {
    16 + 8 * i
}

pub const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
pub const RET_KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
pub const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | Errno::EPERM as u32;
pub const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | Errno::ENOSYS as u32;

/// The x32 ABI marks its call numbers with bit 30 (`__X32_SYSCALL_BIT`).
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `AUDIT_ARCH_*` of the architecture we are built for.
pub(crate) fn audit_arch() -> Result<u32, SeccompError> {
    // EM_X86_64 / EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE. The
    // argument offsets above assume little-endian.
    if cfg!(target_endian = "big") {
        Err(SeccompError::UnsupportedArch)
    } else if cfg!(target_arch = "x86_64") {
        Ok(62 | 0x8000_0000 | 0x4000_0000)
    } else if cfg!(target_arch = "aarch64") {
        Ok(183 | 0x8000_0000 | 0x4000_0000)
    } else {
        Err(SeccompError::UnsupportedArch)
    }
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// What the filter answers for one call number.
#[derive(Debug, Clone, Copy)]
enum Action {
    Allow,
    Deny,
    /// Judged by an argument.
    Args(ArgRule),
}

/// Every listed call number with its action, sorted; a number on two
/// lists (none today) takes the strictest action (denied, then checked).
fn entries(role: Role, opts: Options) -> Vec<(u32, Action)> {
    let num = |nr: i64| u32::try_from(nr).unwrap_or(u32::MAX);
    let mut v: Vec<(u32, Action)> = denied().iter().map(|c| (num(c.1), Action::Deny)).collect();
    v.extend(
        arg_rules(opts)
            .into_iter()
            .map(|r| (num(r.call.1), Action::Args(r))),
    );
    v.extend(
        allowed(role, opts)
            .iter()
            .map(|c| (num(c.1), Action::Allow)),
    );
    // Stable: the first (strictest) entry of a number is kept.
    v.sort_by_key(|e| e.0);
    v.dedup_by_key(|e| e.0);
    v
}

/// Calls compared one by one at the bottom of the search tree. Measured on
/// the development VM: leaves of 6–48 all install in ~90–100 µs (a linear
/// scan of the same lists: ~300 µs); 16 was the fastest.
const LEAF: usize = 16;

/// A binary search over the sorted call numbers (in the accumulator):
/// each level is `JGE` plus, on the upper side, a 32-bit `JA` over the
/// lower half (conditional jumps reach only 255 instructions). The kernel
/// runs this on every call it has not cached as "always allowed", and
/// emulates it for every call number when the filter is installed, so
/// ~10 steps instead of a scan of ~300 comparisons matter on both counts.
fn search(entries: &[(u32, Action)]) -> BpfProgram {
    if entries.len() <= LEAF {
        return leaf(entries);
    }
    let (low, high) = entries.split_at(entries.len() / 2);
    let left = search(low);
    let right = search(high);
    let mut v = vec![
        jump(BPF_JGE_K, high[0].0, 0, 1),
        stmt(BPF_JMP_JA, u32::try_from(left.len()).unwrap_or(u32::MAX)),
    ];
    v.extend(left);
    v.extend(right);
    v
}

/// A few calls compared in turn, their returns after them, then the
/// bodies of argument checks; an unmatched number gets `ENOSYS`.
fn leaf(entries: &[(u32, Action)]) -> BpfProgram {
    let k = entries.len();
    // Index k is the ENOSYS return an unmatched number falls through to.
    let (allow, eperm) = (k + 1, k + 2);
    let mut bodies: Vec<sock_filter> = Vec::new();
    let mut v = Vec::with_capacity(k + 3);
    for (i, (nr, action)) in entries.iter().enumerate() {
        let target = match action {
            Action::Allow => allow,
            Action::Deny => eperm,
            Action::Args(rule) => {
                let at = k + 3 + bodies.len();
                bodies.extend(arg_body(rule));
                at
            }
        };
        // Leaves are small: the offset always fits.
        let jt = u8::try_from(target - i - 1).unwrap_or(u8::MAX);
        v.push(jump(BPF_JEQ_K, *nr, jt, 0));
    }
    v.push(stmt(BPF_RET_K, RET_ENOSYS));
    v.push(stmt(BPF_RET_K, RET_ALLOW));
    v.push(stmt(BPF_RET_K, RET_EPERM));
    v.extend(bodies);
    v
}

/// The check of one argument; always returns (it overwrites the
/// accumulator).
fn arg_body(rule: &ArgRule) -> BpfProgram {
    let mut body = vec![stmt(BPF_LD_W_ABS, off_arg_low(rule.arg))];
    let values = match rule.check {
        Check::UnixOrStream(families) => {
            body.extend(unix_or_stream(families));
            None
        }
        Check::AnyBit(bits) => {
            body.push(jump(BPF_JSET_K, bits, 0, 1));
            body.push(stmt(BPF_RET_K, RET_EPERM));
            body.push(stmt(BPF_RET_K, RET_ALLOW));
            None
        }
        Check::Only(v) => {
            body.push(jump(BPF_JEQ_K, v, 0, 1));
            body.push(stmt(BPF_RET_K, RET_ALLOW));
            body.push(stmt(BPF_RET_K, RET_EPERM));
            None
        }
        Check::OneOf(vs) => Some(vs),
        Check::MaskedOneOf(mask, vs) => {
            body.push(stmt(BPF_ALU_AND_K, mask));
            Some(vs)
        }
    };
    if let Some(vs) = values {
        let n = vs.len();
        for (i, v) in vs.iter().enumerate() {
            // To the EPERM return after the remaining comparisons and the
            // ALLOW return.
            let jt = u8::try_from(n - i).unwrap_or(u8::MAX);
            body.push(jump(BPF_JEQ_K, *v, jt, 0));
        }
        body.push(stmt(BPF_RET_K, RET_ALLOW));
        body.push(stmt(BPF_RET_K, RET_EPERM));
    }
    body
}

/// The rest of [`Check::UnixOrStream`] after the domain is loaded:
/// `AF_UNIX` allowed; a listed family jumps to the type check; anything
/// else `EPERM`. The type check masks off `SOCK_CLOEXEC`/`SOCK_NONBLOCK`.
fn unix_or_stream(families: &[u32]) -> BpfProgram {
    let n = families.len();
    // Offsets below count from the instruction after the jump.
    let to = |from: usize, target: usize| u8::try_from(target - from - 1).unwrap_or(u8::MAX);
    // Instruction indexes in this block (the domain load precedes it).
    let (type_check, allow) = (n + 2, n + 9);
    let mut v = vec![jump(BPF_JEQ_K, AddressFamily::Unix as u32, to(0, allow), 0)];
    for (i, f) in families.iter().enumerate() {
        v.push(jump(BPF_JEQ_K, *f, to(i + 1, type_check), 0));
    }
    v.push(stmt(BPF_RET_K, RET_EPERM));
    // The type, flags masked off: stream only.
    v.push(stmt(BPF_LD_W_ABS, off_arg_low(1)));
    v.push(stmt(BPF_ALU_AND_K, 0xf));
    v.push(jump(BPF_JEQ_K, SockType::Stream as u32, 0, 3));
    // The protocol: the default or TCP. Another stream protocol (MPTCP)
    // is not what landlock's TCP rules cover.
    v.push(stmt(BPF_LD_W_ABS, off_arg_low(2)));
    v.push(jump(BPF_JEQ_K, 0, 2, 0));
    v.push(jump(BPF_JEQ_K, libc::IPPROTO_TCP as u32, 1, 0));
    v.push(stmt(BPF_RET_K, RET_EPERM));
    v.push(stmt(BPF_RET_K, RET_ALLOW));
    debug_assert_eq!(v.len(), allow + 1);
    v
}

/// The whole program for `role`.
pub fn program(role: Role, opts: Options) -> Result<BpfProgram, SeccompError> {
    let arch = audit_arch()?;
    let mut prog: BpfProgram = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, arch, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        prog.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1));
        prog.push(stmt(BPF_RET_K, RET_EPERM));
    }
    prog.extend(search(&entries(role, opts)));
    if prog.len() > 4096 {
        return Err(SeccompError::TooLarge(prog.len()));
    }
    Ok(prog)
}

/// Install the filter of `role` on this thread (no_new_privs is set first).
pub fn install(role: Role, opts: Options) -> Result<(), SeccompError> {
    let prog = program(role, opts)?;
    seccompiler::apply_filter(&prog).map_err(|e| SeccompError::Install(e.to_string()))
}

/// A classic-BPF interpreter for the instructions [`program`] emits, as the
/// kernel runs them on a `seccomp_data`: for tests and measurements, never
/// for enforcement. `None` for an instruction it does not know.
pub fn evaluate(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> Option<u32> {
    run_counting(prog, arch, nr, args).map(|(ret, _)| ret)
}

/// [`evaluate`], also counting the instructions executed.
pub(crate) fn run_counting(
    prog: &[sock_filter],
    arch: u32,
    nr: u32,
    args: [u64; 6],
) -> Option<(u32, usize)> {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    let mut steps = 0usize;
    while let Some(ins) = prog.get(pc) {
        steps += 1;
        let k = ins.k;
        let next = |taken: bool| pc + 1 + usize::from(if taken { ins.jt } else { ins.jf });
        pc = match ins.code {
            BPF_LD_W_ABS => {
                let o = usize::try_from(k).ok()?;
                let bytes: [u8; 4] = data.get(o..o + 4)?.try_into().ok()?;
                acc = u32::from_le_bytes(bytes);
                pc + 1
            }
            BPF_ALU_AND_K => {
                acc &= k;
                pc + 1
            }
            BPF_JMP_JA => pc + 1 + usize::try_from(k).ok()?,
            BPF_JEQ_K => next(acc == k),
            BPF_JGE_K => next(acc >= k),
            BPF_JSET_K => next(acc & k != 0),
            BPF_RET_K => return Some((k, steps)),
            _ => return None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;
    use nix::sys::socket::SockFlag;

    use super::*;

    fn arch() -> u32 {
        audit_arch().unwrap()
    }

    fn run(role: Role, nr: i64, args: [u64; 6]) -> u32 {
        let prog = program(role, STRICT).unwrap();
        evaluate(&prog, arch(), u32::try_from(nr).unwrap(), args).unwrap()
    }

    const NONE: [u64; 6] = [0; 6];

    /// Every role's situation at L0.
    const STRICT: Options = Options {
        no_network: true,
        private_ipc: true,
        egress: false,
    };

    // Verdicts, short, for the tables below.
    const A: u32 = RET_ALLOW;
    const E: u32 = RET_EPERM;
    const N: u32 = RET_ENOSYS;

    /// A verdict's name, for readable failures.
    fn show(verdict: u32) -> &'static str {
        match verdict {
            RET_ALLOW => "allow",
            RET_EPERM => "EPERM",
            RET_ENOSYS => "ENOSYS",
            RET_KILL_PROCESS => "kill",
            _ => "other",
        }
    }

    /// What each role's filter answers for a call, whatever its arguments,
    /// at L0 (`STRICT`). Columns in [`Role::ALL`] order; `N` = not on the
    /// role's list (ENOSYS).
    #[rustfmt::skip]
    const CALL_VERDICTS: &[(Syscall, [u32; 5])] = &[
        //                                        agent tool memory-worker reflection recall
        // Files, memory, processes, time: every role.
        (call!(SYS_read),                        [A, A, A, A, A]),
        (call!(SYS_write),                       [A, A, A, A, A]),
        (call!(SYS_openat),                      [A, A, A, A, A]),
        (call!(SYS_openat2),                     [A, A, A, A, A]),
        (call!(SYS_close),                       [A, A, A, A, A]),
        (call!(SYS_renameat2),                   [A, A, A, A, A]),
        (call!(SYS_mmap),                        [A, A, A, A, A]),
        (call!(SYS_mprotect),                    [A, A, A, A, A]),
        (call!(SYS_futex),                       [A, A, A, A, A]),
        (call!(SYS_execve),                      [A, A, A, A, A]),
        (call!(SYS_wait4),                       [A, A, A, A, A]),
        (call!(SYS_pipe2),                       [A, A, A, A, A]),
        (call!(SYS_ppoll),                       [A, A, A, A, A]),
        (call!(SYS_epoll_pwait),                 [A, A, A, A, A]),
        (("SYS_epoll_pwait2", NR_EPOLL_PWAIT2),  [A, A, A, A, A]),
        (("SYS_fchmodat2", NR_FCHMODAT2),        [A, A, A, A, A]),
        (("SYS_map_shadow_stack", NR_MAP_SHADOW_STACK), [A, A, A, A, A]),
        (call!(SYS_getrandom),                   [A, A, A, A, A]),
        (call!(SYS_clock_gettime),               [A, A, A, A, A]),
        (call!(SYS_prlimit64),                   [A, A, A, A, A]),
        (call!(SYS_rt_sigaction),                [A, A, A, A, A]),
        (call!(SYS_kill),                        [A, A, A, A, A]),
        (call!(SYS_pidfd_open),                  [A, A, A, A, A]),
        (call!(SYS_connect),                     [A, A, A, A, A]),
        (call!(SYS_sendmsg),                     [A, A, A, A, A]),
        (call!(SYS_recvmsg),                     [A, A, A, A, A]),
        // Narrowing one's own confinement.
        (call!(SYS_seccomp),                     [A, A, A, A, A]),
        (call!(SYS_landlock_create_ruleset),     [A, A, A, A, A]),
        (call!(SYS_landlock_restrict_self),      [A, A, A, A, A]),
        // Only tool runs arbitrary programs: SysV/POSIX IPC, scheduler
        // tuning, personality, Linux AIO.
        (call!(SYS_shmget),                      [N, A, N, N, N]),
        (call!(SYS_shmat),                       [N, A, N, N, N]),
        (call!(SYS_semop),                       [N, A, N, N, N]),
        (call!(SYS_msgget),                      [N, A, N, N, N]),
        (call!(SYS_mq_open),                     [N, A, N, N, N]),
        (call!(SYS_sched_setaffinity),           [N, A, N, N, N]),
        (call!(SYS_sched_setscheduler),          [N, A, N, N, N]),
        (call!(SYS_ioprio_set),                  [N, A, N, N, N]),
        (call!(SYS_personality),                 [N, A, N, N, N]),
        (call!(SYS_io_setup),                    [N, A, N, N, N]),
        (call!(SYS_io_submit),                   [N, A, N, N, N]),
        // Escaping or widening a sandbox: refused everywhere.
        (call!(SYS_ptrace),                      [E, E, E, E, E]),
        (call!(SYS_process_vm_readv),            [E, E, E, E, E]),
        (call!(SYS_process_vm_writev),           [E, E, E, E, E]),
        (call!(SYS_pidfd_getfd),                 [E, E, E, E, E]),
        (call!(SYS_kcmp),                        [E, E, E, E, E]),
        (call!(SYS_mount),                       [E, E, E, E, E]),
        (call!(SYS_umount2),                     [E, E, E, E, E]),
        (call!(SYS_pivot_root),                  [E, E, E, E, E]),
        (call!(SYS_chroot),                      [E, E, E, E, E]),
        (call!(SYS_fsopen),                      [E, E, E, E, E]),
        (call!(SYS_fspick),                      [E, E, E, E, E]),
        (call!(SYS_move_mount),                  [E, E, E, E, E]),
        (call!(SYS_open_tree),                   [E, E, E, E, E]),
        (call!(SYS_mount_setattr),               [E, E, E, E, E]),
        (("SYS_statmount", NR_STATMOUNT),        [E, E, E, E, E]),
        (("SYS_listmount", NR_LISTMOUNT),        [E, E, E, E, E]),
        (("SYS_open_tree_attr", NR_OPEN_TREE_ATTR), [E, E, E, E, E]),
        (call!(SYS_unshare),                     [E, E, E, E, E]),
        (call!(SYS_setns),                       [E, E, E, E, E]),
        (call!(SYS_keyctl),                      [E, E, E, E, E]),
        (call!(SYS_add_key),                     [E, E, E, E, E]),
        (call!(SYS_request_key),                 [E, E, E, E, E]),
        (call!(SYS_bpf),                         [E, E, E, E, E]),
        (call!(SYS_perf_event_open),             [E, E, E, E, E]),
        (call!(SYS_userfaultfd),                 [E, E, E, E, E]),
        (call!(SYS_io_uring_setup),              [E, E, E, E, E]),
        (call!(SYS_io_uring_enter),              [E, E, E, E, E]),
        (call!(SYS_init_module),                 [E, E, E, E, E]),
        (call!(SYS_finit_module),                [E, E, E, E, E]),
        (call!(SYS_kexec_load),                  [E, E, E, E, E]),
        (call!(SYS_open_by_handle_at),           [E, E, E, E, E]),
        (call!(SYS_name_to_handle_at),           [E, E, E, E, E]),
        (call!(SYS_fanotify_init),               [E, E, E, E, E]),
        (call!(SYS_fanotify_mark),               [E, E, E, E, E]),
        (call!(SYS_swapon),                      [E, E, E, E, E]),
        (call!(SYS_reboot),                      [E, E, E, E, E]),
        (call!(SYS_acct),                        [E, E, E, E, E]),
        (call!(SYS_syslog),                      [E, E, E, E, E]),
        (call!(SYS_quotactl),                    [E, E, E, E, E]),
        (call!(SYS_clock_settime),               [E, E, E, E, E]),
        (call!(SYS_settimeofday),                [E, E, E, E, E]),
        (call!(SYS_sethostname),                 [E, E, E, E, E]),
        (call!(SYS_setdomainname),               [E, E, E, E, E]),
        // Unlisted (a fallback exists) and numbers no kernel has yet.
        (call!(SYS_clone3),                      [N, N, N, N, N]),
        (call!(SYS_adjtimex),                    [N, N, N, N, N]),
        (call!(SYS_lookup_dcookie),              [N, N, N, N, N]),
        (call!(SYS_setuid),                      [N, A, N, N, N]),
        (call!(SYS_setresuid),                   [N, A, N, N, N]),
        (call!(SYS_setgroups),                   [N, N, N, N, N]),
        (call!(SYS_capset),                      [N, N, N, N, N]),
        (call!(SYS_vmsplice),                    [N, N, N, N, N]),
        (("no call 1000", 1000),                 [N, N, N, N, N]),
        (("no call 4095", 4095),                 [N, N, N, N, N]),
    ];

    /// The old entry points x86_64 keeps, and its port and LDT calls.
    #[cfg(target_arch = "x86_64")]
    #[rustfmt::skip]
    const ARCH_VERDICTS: &[(Syscall, [u32; 5])] = &[
        (call!(SYS_open),                        [A, A, A, A, A]),
        (call!(SYS_stat),                        [A, A, A, A, A]),
        (call!(SYS_fork),                        [A, A, A, A, A]),
        (call!(SYS_vfork),                       [A, A, A, A, A]),
        (call!(SYS_arch_prctl),                  [A, A, A, A, A]),
        (call!(SYS_iopl),                        [E, E, E, E, E]),
        (call!(SYS_ioperm),                      [E, E, E, E, E]),
        (call!(SYS_modify_ldt),                  [E, E, E, E, E]),
        (call!(SYS_uselib),                      [N, N, N, N, N]),
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const ARCH_VERDICTS: &[(Syscall, [u32; 5])] = &[];

    #[test]
    fn each_role_allows_and_denies_its_calls() {
        // The tables' column order.
        use Role::*;
        assert_eq!(Role::ALL, [Agent, Tool, MemoryWorker, Reflection, Recall]);
        for ((name, nr), verdicts) in CALL_VERDICTS.iter().chain(ARCH_VERDICTS) {
            for (role, want) in Role::ALL.into_iter().zip(verdicts) {
                assert_eq!(show(run(role, *nr, NONE)), show(*want), "{role}: {name}");
            }
        }
    }

    /// Without an IPC namespace of its own (L2), SysV/POSIX IPC would be a
    /// channel to other agents: (call, verdict per role with a private IPC
    /// namespace, without one).
    #[test]
    fn ipc_only_with_a_private_ipc_namespace() {
        #[rustfmt::skip]
        let table: &[(Syscall, [u32; 5], [u32; 5])] = &[
            //                                 private ipc   shared ipc
            (call!(SYS_shmget),               [N, A, N, N, N], [N, N, N, N, N]),
            (call!(SYS_shmctl),               [N, A, N, N, N], [N, N, N, N, N]),
            (call!(SYS_semget),               [N, A, N, N, N], [N, N, N, N, N]),
            (call!(SYS_msgsnd),               [N, A, N, N, N], [N, N, N, N, N]),
            (call!(SYS_mq_unlink),            [N, A, N, N, N], [N, N, N, N, N]),
            (call!(SYS_mq_timedreceive),      [N, A, N, N, N], [N, N, N, N, N]),
            // The rest of tool's extras does not depend on it.
            (call!(SYS_sched_setaffinity),    [N, A, N, N, N], [N, A, N, N, N]),
            (call!(SYS_personality),          [N, A, N, N, N], [N, A, N, N, N]),
            (call!(SYS_io_setup),             [N, A, N, N, N], [N, A, N, N, N]),
            (call!(SYS_read),                 [A, A, A, A, A], [A, A, A, A, A]),
            (call!(SYS_mount),                [E, E, E, E, E], [E, E, E, E, E]),
        ];
        for role in Role::ALL {
            let col = Role::ALL.iter().position(|r| *r == role).unwrap();
            for (private_ipc, pick) in [(true, 0), (false, 1)] {
                let opts = Options {
                    private_ipc,
                    ..STRICT
                };
                let prog = program(role, opts).unwrap();
                for ((name, nr), with, without) in table {
                    let want = [with, without][pick][col];
                    let got = evaluate(&prog, arch(), u32::try_from(*nr).unwrap(), NONE);
                    assert_eq!(
                        got.map(show),
                        Some(show(want)),
                        "{role} private ipc {private_ipc}: {name}"
                    );
                }
            }
        }
    }

    /// Calls judged by an argument: (call, argument index, value, verdict
    /// per role). Arguments the kernel reads as 32 bits are compared on
    /// those: garbage in the upper half changes nothing (CVE-2019-10063).
    #[test]
    fn argument_checks_per_role() {
        // nix leaves out the three flags that pass pointers to the kernel.
        let tls = libc::CLONE_SETTLS | libc::CLONE_PARENT_SETTID | libc::CLONE_CHILD_CLEARTID;
        let thread = (CloneFlags::CLONE_VM
            | CloneFlags::CLONE_FS
            | CloneFlags::CLONE_FILES
            | CloneFlags::CLONE_SIGHAND
            | CloneFlags::CLONE_THREAD
            | CloneFlags::CLONE_SYSVSEM)
            .bits() as u64
            | tls as u64;
        let fork = Signal::SIGCHLD as u64;
        let ns = |flag: CloneFlags| flag.bits() as u64 | fork;
        let high = 1u64 << 32;
        let unix = AddressFamily::Unix as u64;
        let mode = |m: SFlag| u64::from(m.bits() | 0o600);
        #[rustfmt::skip]
        let mut table: Vec<(Syscall, usize, u64, [u32; 5])> = vec![
            // fork and thread creation as glibc does them; no namespace.
            (call!(SYS_clone), 0, fork,                            [A, A, A, A, A]),
            (call!(SYS_clone), 0, thread,                          [A, A, A, A, A]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWUSER),   [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWNS),     [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWPID),    [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWNET),    [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWIPC),    [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWUTS),    [E, E, E, E, E]),
            (call!(SYS_clone), 0, ns(CloneFlags::CLONE_NEWCGROUP), [E, E, E, E, E]),
            // Unix sockets only.
            (call!(SYS_socket), 0, unix,                           [A, A, A, A, A]),
            (call!(SYS_socket), 0, high | unix,                    [A, A, A, A, A]),
            (call!(SYS_socketpair), 0, unix,                       [A, A, A, A, A]),
            (call!(SYS_socketpair), 0, high | unix,                [A, A, A, A, A]),
            // No terminal injection.
            (call!(SYS_ioctl), 1, libc::TCGETS,                    [A, A, A, A, A]),
            (call!(SYS_ioctl), 1, libc::FIONREAD,                  [A, A, A, A, A]),
            (call!(SYS_ioctl), 1, libc::TIOCSTI,                   [E, E, E, E, E]),
            (call!(SYS_ioctl), 1, libc::TIOCLINUX,                 [E, E, E, E, E]),
            (call!(SYS_ioctl), 1, high | libc::TIOCSTI,            [E, E, E, E, E]),
            // FIFOs and files, never devices.
            (call!(SYS_mknodat), 2, mode(SFlag::S_IFIFO),          [A, A, A, A, A]),
            (call!(SYS_mknodat), 2, mode(SFlag::S_IFREG),          [A, A, A, A, A]),
            (call!(SYS_mknodat), 2, mode(SFlag::S_IFCHR),          [E, E, E, E, E]),
            (call!(SYS_mknodat), 2, mode(SFlag::S_IFBLK),          [E, E, E, E, E]),
            (call!(SYS_mknodat), 2, high | mode(SFlag::S_IFCHR),   [E, E, E, E, E]),
        ];
        #[cfg(target_arch = "x86_64")]
        #[rustfmt::skip]
        table.extend([
            (call!(SYS_mknod), 1, mode(SFlag::S_IFIFO),            [A, A, A, A, A]),
            (call!(SYS_mknod), 1, mode(SFlag::S_IFCHR),            [E, E, E, E, E]),
            (call!(SYS_mknod), 1, mode(SFlag::S_IFBLK),            [E, E, E, E, E]),
        ]);
        // Every other socket family, for both calls.
        for call in [call!(SYS_socket), call!(SYS_socketpair)] {
            for family in (0..=46u64).filter(|f| *f != unix) {
                table.push((call, 0, family, [E, E, E, E, E]));
            }
        }
        for ((name, nr), arg, value, verdicts) in &table {
            let mut args = NONE;
            args[*arg] = *value;
            for (role, want) in Role::ALL.into_iter().zip(verdicts) {
                assert_eq!(
                    show(run(role, *nr, args)),
                    show(*want),
                    "{role}: {name} arg {arg} = {value:#x}"
                );
            }
        }
        // With the egress proxy: Unix sockets, and TCP of IPv4 and IPv6
        // (any flags); UDP, raw and every other family refused, as is a
        // pair of inet sockets.
        let egress = program(
            Role::Tool,
            Options {
                egress: true,
                ..STRICT
            },
        )
        .unwrap();
        let (inet, inet6) = (AddressFamily::Inet as u64, AddressFamily::Inet6 as u64);
        let (stream, dgram) = (SockType::Stream as u64, SockType::Datagram as u64);
        let (raw, seqpacket) = (SockType::Raw as u64, SockType::SeqPacket as u64);
        let flags = (SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK).bits() as u64;
        let (socket, socketpair) = (call!(SYS_socket).1, call!(SYS_socketpair).1);
        #[rustfmt::skip]
        let (tcp, mptcp) = (libc::IPPROTO_TCP as u64, libc::IPPROTO_MPTCP as u64);
        let egress_table: Vec<(i64, u64, u64, u64, u32)> = vec![
            (socket, unix, dgram, 0, A),
            (socket, unix, stream, 7, A),
            (socket, inet, stream, 0, A),
            (socket, inet, stream, tcp, A),
            (socket, inet, stream | flags, 0, A),
            (socket, high | inet6, high | stream, high | tcp, A),
            (socket, inet, stream, mptcp, E),
            (socket, inet6, stream | flags, mptcp, E),
            (socket, inet, stream, libc::IPPROTO_SCTP as u64, E),
            (socket, inet, stream, 1, E),
            (socket, inet, dgram, 0, E),
            (socket, inet6, dgram | flags, 0, E),
            (socket, inet, raw, 0, E),
            (socket, inet, seqpacket, 0, E),
            (socket, AddressFamily::Packet as u64, stream, 0, E),
            (socket, AddressFamily::Netlink as u64, raw, 0, E),
            (socket, AddressFamily::Vsock as u64, stream, 0, E),
            (socketpair, inet, stream, 0, E),
            (socketpair, unix, stream, 0, A),
        ];
        for (nr, domain, ty, proto, want) in egress_table {
            let mut args = NONE;
            args[0] = domain;
            args[1] = ty;
            args[2] = proto;
            let got = evaluate(&egress, arch(), nr as u32, args);
            assert_eq!(
                got.map(show),
                Some(show(want)),
                "egress: {nr} ({domain:#x}, {ty:#x}, {proto:#x})"
            );
        }
        // With network (no role has it today) every family passes.
        let prog = program(
            Role::Tool,
            Options {
                no_network: false,
                ..STRICT
            },
        )
        .unwrap();
        let mut args = NONE;
        args[0] = AddressFamily::Inet as u64;
        let v = evaluate(&prog, arch(), call!(SYS_socket).1 as u32, args);
        assert_eq!(v, Some(RET_ALLOW));
    }

    /// The typed flags the filter is built from are the kernel's numbers
    /// (include/uapi/linux/sched.h, stat.h, socket.h, errno.h): a wrapper
    /// that renamed or dropped one would open a hole no other test sees.
    #[test]
    fn typed_constants_are_the_kernels_numbers() {
        assert_eq!(CLONE_NS_FLAGS, 0x7E02_0000);
        assert_eq!(DEVICE_TYPES, &[0o020000, 0o060000]);
        assert_eq!(SFlag::S_IFMT.bits(), 0o170000);
        assert_eq!(AddressFamily::Unix as u32, 1);
        assert_eq!((RET_EPERM, RET_ENOSYS), (0x0005_0001, 0x0005_0026));
    }

    #[test]
    fn foreign_architectures_are_killed_and_x32_refused() {
        for role in Role::ALL {
            let prog = program(role, STRICT).unwrap();
            // AUDIT_ARCH_I386 (int 0x80), AUDIT_ARCH_ARM, the other 64-bit one.
            for foreign in [0x4000_0003u32, 0x4000_0028, 0xC000_00B7, 0xC000_003E] {
                if foreign == arch() {
                    continue;
                }
                let nr = call!(SYS_getpid).1 as u32;
                assert_eq!(evaluate(&prog, foreign, nr, NONE), Some(RET_KILL_PROCESS));
            }
            if cfg!(target_arch = "x86_64") {
                let x32 = X32_SYSCALL_BIT | call!(SYS_getpid).1 as u32;
                assert_eq!(evaluate(&prog, arch(), x32, NONE), Some(RET_EPERM));
                assert_eq!(evaluate(&prog, arch(), u32::MAX, NONE), Some(RET_EPERM));
            }
        }
    }

    #[test]
    fn lists_are_sane() {
        for role in Role::ALL {
            let allowed = allowed(role, STRICT);
            let denied = denied();
            let checked = checked(true);
            for (name, n) in allowed.iter().chain(&denied) {
                assert!((0..1024).contains(n), "{name} = {n}");
            }
            for c in &allowed {
                assert!(
                    !denied.iter().any(|d| d.1 == c.1),
                    "{} allowed and denied",
                    c.0
                );
                assert!(
                    !checked.contains(&c.0),
                    "{} listed and argument-checked",
                    c.0
                );
            }
            let len = program(role, STRICT).unwrap().len();
            // Kept small: it is checked and compiled on every launch.
            assert!(len < 600, "{role}: {len} instructions");
            eprintln!(
                "{role}: {} allowed, {} denied, {len} instructions",
                allowed.len(),
                denied.len()
            );
        }
        // Every role is in the table once.
        for role in Role::ALL {
            assert_eq!(ROLE_EXTRAS.iter().filter(|(r, _)| *r == role).count(), 1);
        }
    }

    /// The verdict the lists mean, computed without BPF.
    struct Reference {
        allowed: Vec<Syscall>,
        denied: Vec<Syscall>,
        rules: Vec<ArgRule>,
    }

    impl Reference {
        fn new(role: Role, opts: Options) -> Self {
            Self {
                allowed: allowed(role, opts),
                denied: denied(),
                rules: arg_rules(opts),
            }
        }

        fn verdict(&self, nr: u32, args: [u64; 6]) -> u32 {
            if cfg!(target_arch = "x86_64") && nr >= X32_SYSCALL_BIT {
                return RET_EPERM;
            }
            let is = |c: &Syscall| i64::from(nr) == c.1;
            if self.denied.iter().any(is) {
                return RET_EPERM;
            }
            if let Some(rule) = self.rules.iter().find(|r| is(&r.call)) {
                // The low 32 bits, as the kernel reads these arguments.
                let a = args[rule.arg as usize] as u32;
                let refused = match rule.check {
                    Check::AnyBit(bits) => a & bits != 0,
                    Check::Only(v) => a != v,
                    Check::OneOf(vs) => vs.contains(&a),
                    Check::MaskedOneOf(mask, vs) => vs.contains(&(a & mask)),
                    Check::UnixOrStream(families) => {
                        let ty = args[1] as u32 & 0xf;
                        a != AddressFamily::Unix as u32
                            && !(families.contains(&a) && ty == SockType::Stream as u32)
                    }
                };
                return if refused { RET_EPERM } else { RET_ALLOW };
            }
            if self.allowed.iter().any(is) {
                RET_ALLOW
            } else {
                RET_ENOSYS
            }
        }
    }

    /// The program agrees with the lists for every call number (and the
    /// x32 range), every role and option, and a spread of arguments.
    #[test]
    fn program_matches_the_lists_everywhere() {
        let samples: Vec<[u64; 6]> = [
            0u64,
            AddressFamily::Unix as u64,
            AddressFamily::Inet as u64,
            AddressFamily::Inet6 as u64,
            SockType::Stream as u64,
            SockType::Datagram as u64,
            Signal::SIGCHLD as u64,
            CloneFlags::CLONE_NEWUSER.bits() as u64 | Signal::SIGCHLD as u64,
            libc::TIOCSTI,
            libc::TIOCLINUX,
            libc::TCGETS,
            u64::from(SFlag::S_IFCHR.bits() | 0o600),
            u64::from(SFlag::S_IFIFO.bits() | 0o600),
            u64::MAX,
            1 << 32,
        ]
        .iter()
        .map(|v| [*v; 6])
        .collect();
        // A family with a type: the two differ only for the socket check.
        let mut samples = samples;
        for family in [
            AddressFamily::Unix,
            AddressFamily::Inet,
            AddressFamily::Inet6,
            AddressFamily::Packet,
        ] {
            for ty in [
                SockType::Stream as i32,
                SockType::Datagram as i32,
                SockType::Raw as i32 | SockFlag::SOCK_CLOEXEC.bits(),
            ] {
                samples.push([family as u64, ty as u64, 0, 0, 0, 0]);
            }
        }
        let modes = [(true, false), (false, false), (true, true)];
        for role in Role::ALL {
            for (no_network, egress) in modes {
                for private_ipc in [true, false] {
                    let opts = Options {
                        no_network,
                        private_ipc,
                        egress,
                    };
                    let prog = program(role, opts).unwrap();
                    let reference = Reference::new(role, opts);
                    let checked: Vec<u32> = reference
                        .rules
                        .iter()
                        .map(|r| u32::try_from(r.call.1).unwrap())
                        .collect();
                    let numbers = (0..2048u32).chain([X32_SYSCALL_BIT | 39, u32::MAX]);
                    for nr in numbers {
                        // Arguments matter only where they are checked.
                        let n = if checked.contains(&nr) {
                            samples.len()
                        } else {
                            1
                        };
                        for args in &samples[..n] {
                            let want = reference.verdict(nr, *args);
                            let got = evaluate(&prog, arch(), nr, *args);
                            assert_eq!(got, Some(want), "{role} {opts:?} nr {nr} args {args:?}");
                        }
                    }
                }
            }
        }
    }

    /// Why the program is assembled here: the same lists through
    /// seccompiler's builder (an allow filter and an EPERM filter, without
    /// the argument checks) are several times larger.
    #[test]
    fn smaller_than_seccompiler_would_build() {
        use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
        let target = if cfg!(target_arch = "x86_64") {
            TargetArch::x86_64
        } else {
            TargetArch::aarch64
        };
        let build = |calls: Vec<Syscall>, mismatch, matched| -> usize {
            let rules = calls.iter().map(|c| (c.1, vec![])).collect();
            let f = SeccompFilter::new(rules, mismatch, matched, target).unwrap();
            let p: BpfProgram = f.try_into().unwrap();
            p.len()
        };
        let theirs = build(
            allowed(Role::Agent, STRICT),
            SeccompAction::Errno(Errno::ENOSYS as u32),
            SeccompAction::Allow,
        ) + build(
            denied(),
            SeccompAction::Allow,
            SeccompAction::Errno(Errno::EPERM as u32),
        );
        let prog = program(Role::Agent, STRICT).unwrap();
        let ours = prog.len();
        // Steps per call number: what the kernel emulates at install time
        // for each number, and runs for each uncached call.
        let steps = |p: &[sock_filter]| {
            let v: Vec<usize> = (0..512u32)
                .filter_map(|nr| super::run_counting(p, arch(), nr, NONE).map(|(_, s)| s))
                .collect();
            (
                v.iter().sum::<usize>(),
                v.iter().copied().max().unwrap_or(0),
            )
        };
        let allow_theirs: BpfProgram = SeccompFilter::new(
            allowed(Role::Agent, STRICT)
                .iter()
                .map(|c| (c.1, vec![]))
                .collect(),
            SeccompAction::Errno(Errno::ENOSYS as u32),
            SeccompAction::Allow,
            target,
        )
        .unwrap()
        .try_into()
        .unwrap();
        let (our_total, our_max) = steps(&prog);
        let (their_total, their_max) = steps(&allow_theirs);
        eprintln!(
            "seccompiler: {theirs} instructions, its allow filter alone {their_total} steps for \
             call numbers 0-511 (at most {their_max}); here: {ours} instructions, \
             {our_total} steps (at most {our_max})"
        );
        assert!(ours * 2 < theirs, "{ours} vs {theirs}");
        assert!(our_total * 5 < their_total, "{our_total} vs {their_total}");
        assert!(our_max <= 30, "{our_max}");
    }

    /// The program really installs, and a call outside the list answers
    /// ENOSYS while a listed one works (in a throwaway child).
    #[test]
    fn installs_and_enforces() {
        use nix::sys::socket::{SockFlag, SockType, socket};
        use nix::sys::wait::{WaitStatus, waitpid};
        use nix::unistd::ForkResult;
        // Built before the fork: the test harness has other threads, so the
        // child must not allocate.
        let prog = program(Role::MemoryWorker, STRICT).unwrap();
        // SAFETY: the child makes only system calls that do not allocate
        // and leaves with _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            ForkResult::Child => {
                let code = (|| {
                    if seccompiler::apply_filter(&prog).is_err() {
                        return 10;
                    }
                    if nix::unistd::getpid().as_raw() <= 0 {
                        return 11;
                    }
                    // Raw on purpose: numbers no wrapper would issue.
                    // SAFETY: an unknown call number and a harmless shmget.
                    let unlisted = |nr: i64| unsafe { libc::syscall(nr, 0, 0, 0) };
                    if unlisted(1000) != -1 || Errno::last() != Errno::ENOSYS {
                        return 12;
                    }
                    if unlisted(call!(SYS_shmget).1) != -1 || Errno::last() != Errno::ENOSYS {
                        return 13;
                    }
                    let dgram =
                        |family| socket(family, SockType::Datagram, SockFlag::empty(), None);
                    if dgram(AddressFamily::Inet).err() != Some(Errno::EPERM) {
                        return 14;
                    }
                    if dgram(AddressFamily::Unix).is_err() {
                        return 15;
                    }
                    0
                })();
                super::super::sys::exit_now(code);
            }
            ForkResult::Parent { child } => {
                assert_eq!(waitpid(child, None).unwrap(), WaitStatus::Exited(child, 0));
            }
        }
    }
}
