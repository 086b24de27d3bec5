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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use serde::{Deserialize, Serialize};

/// `comm` of the stage process left outside the pid namespace.
pub const MONITOR_COMM: &str = "ml-ns-monitor";
/// `comm` of pid 1 inside the pid namespace.
pub const INIT_COMM: &str = "ml-ns-init";

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

fn err(what: impl Into<String>) -> NsError {
    NsError {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

fn check(r: libc::c_long, what: impl FnOnce() -> String) -> Result<(), NsError> {
    if r < 0 { Err(err(what())) } else { Ok(()) }
}

fn cstr(p: &Path) -> Result<CString, NsError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| NsError {
        what: format!("{}: path has a NUL byte", p.display()),
        source: std::io::Error::other(e),
    })
}

/// Every namespace the child gets.
pub const NAMESPACE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// Enter the namespaces and build the view. Returns only in the program
/// process (pid 2 of the new pid namespace), with no capability left; the
/// monitor and init processes exit with the program's status instead.
pub fn enter(plan: &NamespacePlan) -> Result<(), NsError> {
    // SAFETY: plain id queries.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let cwd = std::env::current_dir().ok();
    // SAFETY: unshare with constant flags.
    check(unsafe { libc::unshare(NAMESPACE_FLAGS) } as _, || {
        "unshare".into()
    })?;
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
    let (alive_r, alive_w) = pipe()?;
    // SAFETY: this process is single-threaded (a fresh exec of the stage).
    match unsafe { libc::fork() } {
        -1 => Err(err("fork of the namespace init")),
        0 => {
            drop(alive_w);
            init(plan, sources, alive_r, cwd.as_deref())
        }
        child => {
            drop(alive_r);
            drop(sources);
            monitor(child, alive_w)
        }
    }
}

/// The stage outside the pid namespace: wait for init, exit as it did.
fn monitor(child: libc::pid_t, alive: OwnedFd) -> ! {
    set_comm(MONITOR_COMM);
    stand_by(child, false, alive)
}

/// What the monitor and init do once their child runs: pass signals on,
/// hold no capability and none of the child's descriptors, wait for it
/// (reaping every orphan too, as pid 1 must), and exit as it did. The
/// `alive` pipe closes only when we exit.
fn stand_by(child: libc::pid_t, reap_all: bool, alive: OwnedFd) -> ! {
    forward_signals_to(child);
    // The monitor and init hold every capability of the new user
    // namespace until here; one that cannot shed them must not stay
    // beside the program: take the sandbox down instead.
    if let Err(e) = drop_capabilities() {
        eprintln!("mini-letta: child stage failed: {e}; stopping the sandbox");
        // SAFETY: killing our own child, then leaving.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::_exit(crate::child::STAGE_FAILURE);
        }
    }
    // SAFETY: closing our copies of stdio and the channel; the child has
    // its own.
    unsafe {
        for fd in 0..=3 {
            libc::close(fd);
        }
    }
    let code = wait_for(child, reap_all);
    drop(alive);
    // SAFETY: leaving without running destructors of a forked state.
    unsafe { libc::_exit(code) }
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
    // SAFETY: a poll on our own pipe.
    unsafe {
        let mut p = libc::pollfd {
            fd: alive.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut p, 1, 0) > 0 {
            libc::_exit(1);
        }
    }
    build_view(plan, &sources, cwd)?;
    drop(sources);
    // SAFETY: single-threaded; see `enter`.
    match unsafe { libc::fork() } {
        -1 => Err(err("fork of the program")),
        0 => {
            drop(alive);
            // Pid 1 dying takes the whole namespace anyway; the signal is
            // there for the window before that.
            set_pdeathsig("program")?;
            // A session of its own: no controlling terminal to inject into
            // (TIOCSTI) and the supervisor's process group is not ours.
            nix::unistd::setsid().map_err(|e| NsError {
                what: "setsid of the program".into(),
                source: e.into(),
            })?;
            drop_capabilities()
        }
        program => stand_by(program, true, alive),
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set `flags` on the mount at `path` and every mount below it.
fn set_attr(path: &Path, flags: u64) -> Result<(), NsError> {
    let c = cstr(path)?;
    let attr = MountAttr {
        attr_set: flags,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: documented mount_setattr call with a valid struct and size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(r, || format!("mount_setattr {}", path.display()))
}

fn mount(
    src: Option<&Path>,
    dest: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), NsError> {
    let src_c = src.map(cstr).transpose()?;
    let dest_c = cstr(dest)?;
    let fs_c = fstype.map(|s| CString::new(s).unwrap_or_default());
    let data_c = data.map(|s| CString::new(s).unwrap_or_default());
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            ptr(&src_c),
            dest_c.as_ptr(),
            ptr(&fs_c),
            flags,
            ptr(&data_c).cast(),
        )
    };
    check(r as _, || {
        format!(
            "mount {} on {}",
            src.map_or_else(
                || fstype.unwrap_or("").to_string(),
                |s| s.display().to_string()
            ),
            dest.display()
        )
    })
}

fn tmpfs(dest: &Path, mode: &str) -> Result<(), NsError> {
    mount(
        None,
        dest,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
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
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    tmpfs(Path::new(STAGING), "mode=0700")?;
    std::fs::create_dir(root).map_err(|e| NsError {
        what: format!("mkdir {NEW_ROOT}"),
        source: e,
    })?;
    mount(
        Some(Path::new("/")),
        root,
        None,
        libc::MS_BIND | libc::MS_REC,
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
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    for sub in ["sys", "sysrq-trigger", "irq", "bus"] {
        let p = proc_dir.join(sub);
        if p.exists() {
            mount(Some(&p), &p, None, libc::MS_BIND | libc::MS_REC, None)?;
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
                mount(Some(&via), &d, None, libc::MS_BIND | libc::MS_REC, None)?;
                let ro = matches!(step, MountStep::RoBind { .. });
                set_attr(
                    &d,
                    MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if ro { MOUNT_ATTR_RDONLY } else { 0 },
                )?;
            }
            (_, None) => {}
        }
    }
    let here = cstr(root)?;
    let dot = c".";
    // SAFETY: documented pivot_root(".", ".") sequence: the old root is
    // stacked on the new one and detached right away.
    unsafe {
        check(libc::chdir(here.as_ptr()) as _, || "chdir new root".into())?;
        check(
            libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()),
            || "pivot_root".into(),
        )?;
        check(libc::umount2(dot.as_ptr(), libc::MNT_DETACH) as _, || {
            "detach the old root".into()
        })?;
    }
    let back = cwd.filter(|c| c.is_dir()).unwrap_or(Path::new("/"));
    std::env::set_current_dir(back).map_err(|e| NsError {
        what: format!("chdir {}", back.display()),
        source: e,
    })
}

/// A private `/dev`: tmpfs, the data-only device nodes bound from the host,
/// the usual links, and a new `devpts` instance.
fn build_dev(dev: &Path) -> Result<(), NsError> {
    mount(None, dev, Some("tmpfs"), libc::MS_NOSUID, Some("mode=0755"))?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let d = dev.join(node);
        ensure_mountpoint(&d, false)?;
        mount(
            Some(&Path::new("/dev").join(node)),
            &d,
            None,
            libc::MS_BIND,
            None,
        )?;
    }
    let io = |what: String| move |e: std::io::Error| NsError { what, source: e };
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(name))
            .map_err(io(format!("symlink /dev/{name}")))?;
    }
    for d in ["shm", "pts"] {
        std::fs::create_dir(dev.join(d)).map_err(io(format!("mkdir /dev/{d}")))?;
    }
    mount(
        None,
        &dev.join("pts"),
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
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
    let io = |e: std::io::Error| NsError {
        what: format!("create mount point {}", path.display()),
        source: e,
    };
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
    let c = cstr(p)?;
    // SAFETY: open with O_PATH; the descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(err(format!("open {}", p.display())));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn is_dir(fd: &OwnedFd) -> bool {
    // SAFETY: fstat into a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd.as_raw_fd(), &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFDIR
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), NsError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 into a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(err("pipe"));
    }
    // SAFETY: fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn write_proc(path: &str, text: &str) -> Result<(), NsError> {
    std::fs::write(path, text).map_err(|e| NsError {
        what: format!("write {path}"),
        source: e,
    })
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
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(|e| NsError {
        what: format!("prctl(PR_SET_PDEATHSIG) of the {who}"),
        source: e.into(),
    })
}

/// No capability of any kind, in any set, from here on.
fn drop_capabilities() -> Result<(), NsError> {
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
    // The bounding set first (needs CAP_SETPCAP, which capset removes).
    // EINVAL means a number past the kernel's last capability: the end.
    for cap in 0..=63 {
        // SAFETY: PR_CAPBSET_DROP takes integers only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
            if errno() == libc::EINVAL {
                break;
            }
            return Err(err(format!("prctl(PR_CAPBSET_DROP, {cap})")));
        }
        // Read back: a capability left in the bounding set could come back
        // through a file capability if no_new_privs were ever missing.
        // SAFETY: PR_CAPBSET_READ takes integers only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) } != 0 {
            return Err(NsError {
                what: format!("capability {cap} is still in the bounding set"),
                source: std::io::Error::from_raw_os_error(libc::EPERM),
            });
        }
    }
    // SAFETY: PR_CAP_AMBIENT takes integers only.
    check(
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        } as _,
        || "prctl(PR_CAP_AMBIENT_CLEAR_ALL)".into(),
    )?;
    // SAFETY: capset with valid structures.
    unsafe {
        let header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(
            libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()),
            || "capset".into(),
        )
    }
}

/// The process signals are passed on to.
static TARGET: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = TARGET.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

fn forward_signals_to(pid: libc::pid_t) {
    TARGET.store(pid, Ordering::Relaxed);
    for sig in [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: installing an async-signal-safe handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Exit code for a wait status: the code, or 128 + the signal.
fn code_of(status: libc::c_int) -> libc::c_int {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

/// Wait until `child` exits (with `reap_all`, reaping any other child of
/// ours meanwhile) and return its exit code.
fn wait_for(child: libc::pid_t, reap_all: bool) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own children.
        let r = unsafe { libc::waitpid(if reap_all { -1 } else { child }, &mut status, 0) };
        if r == child {
            return code_of(status);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// Whether this host lets an unprivileged process do what [`enter`] does:
/// create the namespaces, map its uid and set mount attributes. Run in a
/// child of the prober (which is multi-threaded), so only raw calls.
pub fn probe(as_uid: Option<u32>) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only raw system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fail = |step: i32| std::io::Error::from_raw_os_error(step * 1000 + errno());
            if let Some(u) = as_uid
                && (libc::setgroups(0, std::ptr::null()) < 0
                    || libc::setresgid(u, u, u) < 0
                    || libc::setresuid(u, u, u) < 0)
            {
                return Err(fail(1));
            }
            if libc::unshare(NAMESPACE_FLAGS) < 0 {
                return Err(fail(2));
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) < 0
            {
                return Err(fail(3));
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                std::ptr::null(),
            ) < 0
            {
                return Err(fail(4));
            }
            let attr = MountAttr {
                attr_set: MOUNT_ATTR_RDONLY,
                attr_clr: 0,
                propagation: 0,
                userns_fd: 0,
            };
            if libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                c"/tmp".as_ptr(),
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) < 0
            {
                return Err(fail(5));
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
                _ => "starting the probe",
            };
            Err(format!(
                "{step}: {}",
                std::io::Error::from_raw_os_error(code % 1000)
            ))
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
