//! Native namespaces: the child stage builds its own user, mount, pid, net,
//! ipc, uts and cgroup namespaces and filesystem view, instead of running
//! bubblewrap first.
//!
//! The view is the one our bubblewrap invocation builds: `/` read-only
//! (recursively, `nosuid`, `nodev`), a private `/dev` with the harmless
//! device nodes, a fresh `/proc` for the new pid namespace (its `sys`,
//! `sysrq-trigger`, `irq` and `bus` read-only), then the profile's tmpfs
//! masks and binds in order. Nothing runs with a capability outside its
//! own user namespace: the stage starts unprivileged (as the agent's uid),
//! maps only that uid, and the program drops every capability (bounding,
//! ambient, permitted, effective) before landlock and seccomp are applied.
//!
//! Three processes, as with bubblewrap: the stage itself stays outside the
//! new pid namespace as a monitor (it is the pid the supervisor knows), an
//! init (pid 1) reaps and forwards signals — a pid-1 program would ignore
//! SIGTERM from outside — and the program runs as pid 2. The monitor and
//! init name themselves ([`MONITOR_COMM`], [`INIT_COMM`]) for `ps` readers;
//! the supervisor tells them from the program by their depth in the tree
//! (`LaunchPlan::wrapper_depth`), never by name. Why not bubblewrap: it costs one more
//! exec with four shared libraries and remounts every mount of the host one
//! by one; one `mount_setattr(AT_RECURSIVE)` does the same here, and the
//! launch is several milliseconds faster (`scripts/bench-sandbox`).
//! Nested user namespaces are refused by the seccomp filter (`unshare`,
//! `clone` namespace flags, `clone3`), where bubblewrap uses a sysctl.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::stat::{Mode, SFlag};
use nix::sys::wait::WaitStatus;
use nix::unistd::{ForkResult, Gid, Pid, Uid};
use serde::{Deserialize, Serialize};

use super::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// `comm` of the stage process left outside the pid namespace.
pub const MONITOR_COMM: &str = "ml-ns-monitor";
/// `comm` of pid 1 inside the pid namespace.
pub const INIT_COMM: &str = "ml-ns-init";

/// The namespaces and root every bubblewrap launch uses (also what the
/// layer probe and the benchmark run): new user, pid, net, ipc and uts
/// namespaces, no capabilities, no nested user namespaces, death with the
/// parent, a new session, a read-only root with private `/dev` and `/proc`.
pub const BWRAP_BASE_ARGS: &[&str] = &[
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
];

/// One step of the child's filesystem view, applied in order after `/`,
/// `/dev` and `/proc` are in place. Paths are absolute, as seen on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum MountStep {
    /// An empty private tmpfs hides what is there.
    Tmpfs { dest: PathBuf },
    /// `src` shown read-only at `dest`.
    RoBind { src: PathBuf, dest: PathBuf },
    /// `src` shown read-write at `dest`.
    Bind { src: PathBuf, dest: PathBuf },
}

/// What the child stage needs to build its namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacePlan {
    pub mounts: Vec<MountStep>,
}

#[derive(Debug, thiserror::Error)]
#[error("namespaces: {what}: {source}")]
pub struct NsError {
    what: String,
    source: std::io::Error,
}

impl NsError {
    fn new(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self {
            what: what.into(),
            source: source.into(),
        }
    }
}

fn cstr(p: &Path) -> Result<CString, NsError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| {
        NsError::new(
            format!("{}: path has a NUL byte", p.display()),
            std::io::Error::other(e),
        )
    })
}

/// Every namespace the child gets.
pub const NAMESPACE_FLAGS: CloneFlags = CloneFlags::CLONE_NEWUSER
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// Enter the namespaces and build the view. Returns only in the program
/// process (pid 2 of the new pid namespace), with no capability left; the
/// monitor and init processes exit with the program's status instead.
pub fn enter(plan: &NamespacePlan) -> Result<(), NsError> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let cwd = std::env::current_dir().ok();
    nix::sched::unshare(NAMESPACE_FLAGS).map_err(|e| NsError::new("unshare", e))?;
    write_proc("/proc/self/setgroups", "deny")?;
    write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
    write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    // Bind sources are opened in the host's view, before anything is
    // mounted over it (the staging tmpfs hides the host's /tmp), but in
    // our mount namespace: a mount of another one cannot be bound.
    let sources = plan
        .mounts
        .iter()
        .map(|m| match m {
            MountStep::Tmpfs { .. } => Ok(None),
            MountStep::RoBind { src, .. } | MountStep::Bind { src, .. } => open_path(src).map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The monitor holds the write end for its whole life: init sees the
    // monitor die even if that happens before its death signal is set.
    let (alive_r, alive_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| NsError::new("pipe", e))?;
    // SAFETY: this process is single-threaded (a fresh exec of the stage),
    // so the child may do anything after the fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(NsError::new("fork of the namespace init", e)),
        Ok(ForkResult::Child) => {
            drop(alive_w);
            init(plan, sources, alive_r, cwd.as_deref())
        }
        Ok(ForkResult::Parent { child }) => {
            drop(alive_r);
            drop(sources);
            monitor(child, alive_w)
        }
    }
}

/// The stage outside the pid namespace: wait for init, exit as it did.
fn monitor(child: Pid, alive: OwnedFd) -> ! {
    set_comm(MONITOR_COMM);
    stand_by(child, false, alive)
}

/// What the monitor and init do once their child runs: pass signals on,
/// hold no capability and none of the child's descriptors, wait for it
/// (reaping every orphan too, as pid 1 must), and exit as it did. The
/// `alive` pipe closes only when we exit.
fn stand_by(child: Pid, reap_all: bool, alive: OwnedFd) -> ! {
    forward_signals_to(child);
    // The monitor and init hold every capability of the new user
    // namespace until here; one that cannot shed them must not stay
    // beside the program: take the sandbox down instead.
    if let Err(e) = drop_capabilities() {
        eprintln!("mini-letta: child stage failed: {e}; stopping the sandbox");
        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        sys::exit_now(super::STAGE_FAILURE);
    }
    // Our copies of stdio and the channel; the child has its own. Some
    // may not be open (EBADF), which is as good.
    for fd in 0..=3 {
        let _ = sys::close(fd);
    }
    let status = wait_for(child, reap_all);
    drop(alive);
    // The monitor dies as its init did when that was SIGKILL: a kill from
    // outside — the supervisor's, which takes the tree from the bottom up
    // so the monitor reaps its init — reads as one. (Init itself cannot:
    // a namespace's init ignores its own signals.)
    if !reap_all && matches!(status, WaitStatus::Signaled(_, Signal::SIGKILL, _)) {
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGKILL);
    }
    let code = code_of(status);
    // A forked copy: leave without running its destructors.
    sys::exit_now(code)
}

/// Pid 1: build the view, start the program, then reap and forward.
fn init(
    plan: &NamespacePlan,
    sources: Vec<Option<OwnedFd>>,
    alive: OwnedFd,
    cwd: Option<&Path>,
) -> Result<(), NsError> {
    set_comm(INIT_COMM);
    // Without it, init (and the whole pid namespace) would outlive a
    // killed monitor: a sandbox nobody supervises.
    set_pdeathsig("init")?;
    // The monitor died before the death signal was set: nobody would
    // ever kill this namespace.
    let mut p = [PollFd::new(alive.as_fd(), PollFlags::POLLIN)];
    if nix::poll::poll(&mut p, PollTimeout::ZERO).is_ok_and(|n| n > 0) {
        sys::exit_now(1);
    }
    build_view(plan, &sources, cwd)?;
    drop(sources);
    // SAFETY: single-threaded; see `enter`.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(NsError::new("fork of the program", e)),
        Ok(ForkResult::Child) => {
            drop(alive);
            // Pid 1 dying takes the whole namespace anyway; the signal is
            // there for the window before that.
            set_pdeathsig("program")?;
            // A session of its own: no controlling terminal to inject into
            // (TIOCSTI) and the supervisor's process group is not ours.
            nix::unistd::setsid().map_err(|e| NsError::new("setsid of the program", e))?;
            drop_capabilities()
        }
        Ok(ForkResult::Parent { child }) => stand_by(child, true, alive),
    }
}

/// Set `flags` on the mount at `path` and every mount below it.
fn set_attr(path: &Path, flags: u64) -> Result<(), NsError> {
    sys::mount_setattr_recursive(&cstr(path)?, flags)
        .map_err(|e| NsError::new(format!("mount_setattr {}", path.display()), e))
}

fn mount(
    src: Option<&Path>,
    dest: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), NsError> {
    nix::mount::mount(src, dest, fstype, flags, data).map_err(|e| {
        let what = src.map_or_else(
            || fstype.unwrap_or("").to_string(),
            |s| s.display().to_string(),
        );
        NsError::new(format!("mount {what} on {}", dest.display()), e)
    })
}

fn tmpfs(dest: &Path, mode: &str) -> Result<(), NsError> {
    mount(
        None,
        dest,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(mode),
    )
}

/// Staging directory: a private tmpfs mounted over the host's `/tmp` in our
/// mount namespace only, holding the new root until `pivot_root`.
const STAGING: &str = "/tmp";
const NEW_ROOT: &str = "/tmp/newroot";

fn build_view(
    plan: &NamespacePlan,
    sources: &[Option<OwnedFd>],
    cwd: Option<&Path>,
) -> Result<(), NsError> {
    let root = Path::new(NEW_ROOT);
    mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;
    tmpfs(Path::new(STAGING), "mode=0700")?;
    std::fs::create_dir(root).map_err(|e| NsError::new(format!("mkdir {NEW_ROOT}"), e))?;
    mount(
        Some(Path::new("/")),
        root,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    set_attr(
        root,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    )?;
    build_dev(&root.join("dev"))?;
    let proc_dir = root.join("proc");
    mount(
        None,
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    for sub in ["sys", "sysrq-trigger", "irq", "bus"] {
        let p = proc_dir.join(sub);
        if p.exists() {
            mount(Some(&p), &p, None, MsFlags::MS_BIND | MsFlags::MS_REC, None)?;
            set_attr(&p, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
        }
    }
    for (step, source) in plan.mounts.iter().zip(sources) {
        match (step, source) {
            (MountStep::Tmpfs { dest }, _) => {
                let d = under(root, dest);
                ensure_mountpoint(&d, true)?;
                tmpfs(&d, "mode=0755")?;
            }
            (MountStep::RoBind { dest, .. } | MountStep::Bind { dest, .. }, Some(fd)) => {
                let d = under(root, dest);
                ensure_mountpoint(&d, is_dir(fd))?;
                let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                mount(
                    Some(&via),
                    &d,
                    None,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None,
                )?;
                let ro = matches!(step, MountStep::RoBind { .. });
                set_attr(
                    &d,
                    MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if ro { MOUNT_ATTR_RDONLY } else { 0 },
                )?;
            }
            (_, None) => {}
        }
    }
    // The documented pivot_root(".", ".") sequence: the old root is
    // stacked on the new one and detached right away.
    nix::unistd::chdir(root).map_err(|e| NsError::new("chdir new root", e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| NsError::new("pivot_root", e))?;
    nix::mount::umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| NsError::new("detach the old root", e))?;
    let back = cwd.filter(|c| c.is_dir()).unwrap_or(Path::new("/"));
    std::env::set_current_dir(back)
        .map_err(|e| NsError::new(format!("chdir {}", back.display()), e))
}

/// A private `/dev`: tmpfs, the data-only device nodes bound from the host,
/// the usual links, and a new `devpts` instance.
fn build_dev(dev: &Path) -> Result<(), NsError> {
    mount(
        None,
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let d = dev.join(node);
        ensure_mountpoint(&d, false)?;
        mount(
            Some(&Path::new("/dev").join(node)),
            &d,
            None,
            MsFlags::MS_BIND,
            None,
        )?;
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(name))
            .map_err(|e| NsError::new(format!("symlink /dev/{name}"), e))?;
    }
    for d in ["shm", "pts"] {
        std::fs::create_dir(dev.join(d)).map_err(|e| NsError::new(format!("mkdir /dev/{d}"), e))?;
    }
    mount(
        None,
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=620"),
    )
}

/// `path` (absolute, host view) inside the new root.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Make `path` exist as a directory or an empty file to mount on. Only
/// ever creates inside our own tmpfs masks; the read-only root refuses.
fn ensure_mountpoint(path: &Path, dir: bool) -> Result<(), NsError> {
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    let io = |e: std::io::Error| NsError::new(format!("create mount point {}", path.display()), e);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    if dir {
        std::fs::create_dir(path).map_err(io)
    } else {
        std::fs::File::create(path).map(drop).map_err(io)
    }
}

fn open_path(p: &Path) -> Result<OwnedFd, NsError> {
    nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| NsError::new(format!("open {}", p.display()), e))
}

fn is_dir(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| {
        SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
    })
}

fn write_proc(path: &str, text: &str) -> Result<(), NsError> {
    std::fs::write(path, text).map_err(|e| NsError::new(format!("write {path}"), e))
}

/// Name this process. Best effort on purpose: the name only tells the
/// supervisor which processes are wrappers (which forward signals
/// themselves); no confinement depends on it.
fn set_comm(name: &str) {
    if let Ok(c) = CString::new(name) {
        let _ = nix::sys::prctl::set_name(&c);
    }
}

/// `PR_SET_PDEATHSIG(SIGKILL)` for `who`, checked.
fn set_pdeathsig(who: &str) -> Result<(), NsError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| NsError::new(format!("prctl(PR_SET_PDEATHSIG) of the {who}"), e))
}

/// No capability of any kind, in any set, from here on.
fn drop_capabilities() -> Result<(), NsError> {
    // The bounding set first (needs CAP_SETPCAP, which capset removes).
    sys::clear_bounding_set().map_err(|e| NsError::new(e.to_string(), e))?;
    sys::clear_ambient_capabilities()
        .map_err(|e| NsError::new("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", e))?;
    sys::clear_capability_sets().map_err(|e| NsError::new("capset", e))
}

/// The process signals are passed on to.
static TARGET: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: std::ffi::c_int) {
    let pid = TARGET.load(Ordering::Relaxed);
    if pid > 0
        && let Ok(sig) = Signal::try_from(sig)
    {
        // kill is async-signal-safe; nix adds no allocation around it.
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

fn forward_signals_to(pid: Pid) {
    TARGET.store(pid.as_raw(), Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(forward),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        // SAFETY: `forward` is async-signal-safe (an atomic load and kill).
        let _ = unsafe { nix::sys::signal::sigaction(sig, &action) };
    }
}

/// Exit code for a wait status: the code, or 128 + the signal.
fn code_of(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, sig, _) => 128 + sig as i32,
        _ => 1,
    }
}

/// Wait until `child` exits (with `reap_all`, reaping any other child of
/// ours meanwhile) and return how it ended.
fn wait_for(child: Pid, reap_all: bool) -> WaitStatus {
    let target = if reap_all { Pid::from_raw(-1) } else { child };
    loop {
        match nix::sys::wait::waitpid(target, None) {
            Ok(status) if status.pid() == Some(child) => return status,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return WaitStatus::Exited(child, 1),
        }
    }
}

/// Fork a process into the pid namespace just unshared and have it mount
/// proc over `/proc` (in the private mount namespace): 0, or the errno of
/// the step that failed. Only calls that neither allocate nor lock (it runs
/// between fork and exec).
fn mount_proc_in_child() -> i32 {
    // SAFETY: fork in a single-threaded child; the grandchild only mounts
    // and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Errno::last_raw();
    }
    if pid == 0 {
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        // SAFETY: C string literals; a plain system call.
        let r = unsafe {
            libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                flags,
                std::ptr::null(),
            )
        };
        let code = if r == 0 { 0 } else { Errno::last_raw() };
        // SAFETY: leaves the grandchild without running anything of ours.
        unsafe { libc::_exit(code.clamp(0, 255)) };
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for the grandchild forked above.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if Errno::last_raw() != libc::EINTR {
            return Errno::last_raw();
        }
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        libc::ECHILD
    }
}

/// Whether this host lets an unprivileged process do what [`enter`] does:
/// create the namespaces, map its uid and set mount attributes. Run in a
/// child of the prober (which is multi-threaded), so only calls that do not
/// allocate (paths are C strings).
pub fn probe(as_uid: Option<u32>) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only system calls that neither allocate nor lock between fork
    // and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fail =
                |step: i32, e: Errno| std::io::Error::from_raw_os_error(step * 1000 + e as i32);
            if let Some(u) = as_uid {
                let (g, u) = (Gid::from_raw(u), Uid::from_raw(u));
                nix::unistd::setgroups(&[])
                    .and_then(|()| nix::unistd::setresgid(g, g, g))
                    .and_then(|()| nix::unistd::setresuid(u, u, u))
                    .map_err(|e| fail(1, e))?;
            }
            nix::sched::unshare(NAMESPACE_FLAGS).map_err(|e| fail(2, e))?;
            nix::mount::mount(
                None::<&std::ffi::CStr>,
                c"/",
                None::<&std::ffi::CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&std::ffi::CStr>,
            )
            .map_err(|e| fail(3, e))?;
            nix::mount::mount(
                Some(c"tmpfs"),
                c"/tmp",
                Some(c"tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                None::<&std::ffi::CStr>,
            )
            .map_err(|e| fail(4, e))?;
            sys::mount_setattr_recursive(c"/tmp", MOUNT_ATTR_RDONLY)
                .map_err(|e| fail(5, Errno::from_raw(e.raw_os_error().unwrap_or(0))))?;
            // What a launch does next: a process of the new pid namespace
            // mounts a fresh procfs. The kernel refuses it where the
            // visible /proc has masked paths (a default container), which
            // no step above notices (issue 46).
            let errno = mount_proc_in_child();
            if errno != 0 {
                return Err(fail(6, Errno::from_raw(errno)));
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("probe exited with {s}")),
        Err(e) => {
            let code = e.raw_os_error().unwrap_or(0);
            let step = match code / 1000 {
                1 => "switching to the probe uid",
                2 => "unshare of user/mount/pid/net/ipc/uts/cgroup namespaces",
                3 => "making mounts private",
                4 => "mounting a tmpfs",
                5 => "mount_setattr (needs Linux 5.12)",
                6 => {
                    "mounting proc in the new pid namespace (a /proc with masked paths, as in a default container, forbids it)"
                }
                _ => "starting the probe",
            };
            Err(format!(
                "{step}: {}",
                std::io::Error::from_raw_os_error(code % 1000)
            ))
        }
    }
}
