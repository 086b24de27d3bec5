//! Resource exhaustion and lifetime: fork bomb, memory bomb, disk fill,
//! orphan survival (§d rows 37–40). Every attack is bounded and cleaned up:
//! at most 512 processes (all reaped), 256 MiB of memory in a throwaway
//! process, 257 MiB of disk in the scratch dir (deleted), one orphan that
//! exits as soon as it has seen its new parent.

use std::time::Duration;

use super::context::ProbeContext;
use super::util::{
    ChildEnd, in_child, io_name, last_errno, pid_view, raw_errno, read_limited, slot_result,
    unique, wait_child,
};
use super::verdict::Verdict;

const MIB: u64 = 1 << 20;

fn pipe() -> Result<(i32, i32), String> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", last_errno()));
    }
    Ok((fds[0], fds[1]))
}

/// Row 37: fork until failure, bounded at `pids_limit + 50` (300 without a
/// limit, never more than 512); the children wait on a pipe and exit when
/// it closes (or after 10 s), and are all reaped. Escaped if the bound is
/// reached or more forks succeed than the limit allows.
pub(crate) fn fork_bomb(ctx: &ProbeContext) -> Verdict {
    let target = ctx
        .pids_limit
        .map(|l| l.saturating_add(50))
        .unwrap_or(300)
        .min(512) as usize;
    let (r, w) = match pipe() {
        Ok(p) => p,
        Err(e) => return Verdict::skipped(e),
    };
    let mut pids = Vec::with_capacity(target);
    let mut stopped = None;
    for _ in 0..target {
        // SAFETY: the child only closes, polls and exits (async-signal-safe).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: raw calls in the child, then _exit.
            unsafe {
                libc::close(w);
                let mut p = libc::pollfd {
                    fd: r,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&mut p, 1, 10_000);
                libc::_exit(0);
            }
        }
        if pid < 0 {
            stopped = Some(last_errno());
            break;
        }
        pids.push(pid);
    }
    // SAFETY: closing our write end releases every child.
    unsafe { libc::close(w) };
    for pid in &pids {
        wait_child(*pid, Duration::from_secs(15));
    }
    // SAFETY: closing our read end.
    unsafe { libc::close(r) };
    let n = pids.len();
    let limit = ctx
        .pids_limit
        .map(|l| format!("pids limit {l}"))
        .unwrap_or_else(|| "no pids limit given".into());
    let v = fork_verdict(ctx, stopped, n, &limit);
    match &ctx.by_design {
        Some(d) => d.judge(v, &[&d.shared_process_limit]),
        None => v,
    }
}

fn fork_verdict(ctx: &ProbeContext, stopped: Option<String>, n: usize, limit: &str) -> Verdict {
    match stopped {
        None => Verdict::escaped(format!("all {n} forks succeeded ({limit}); all reaped")),
        Some(e) => match ctx.pids_limit {
            Some(l) if n as u64 >= l => Verdict::escaped(format!(
                "{n} forks succeeded before {e}, beyond the {limit}; all reaped"
            )),
            _ => Verdict::blocked(format!(
                "fork failed with {e} after {n} forks ({limit}); all reaped"
            )),
        },
    }
}

/// The memory limit of this process's cgroup, if one is set: (file, bytes).
fn cgroup_memory_limit() -> Option<(String, u64)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut candidates = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if ctrl.is_empty() {
            candidates.push(format!("/sys/fs/cgroup/{path}/memory.max"));
            candidates.push(format!("/sys/fs/cgroup/unified/{path}/memory.max"));
        } else if ctrl.split(',').any(|c| c == "memory") {
            candidates.push(format!(
                "/sys/fs/cgroup/memory/{path}/memory.limit_in_bytes"
            ));
        }
    }
    candidates.into_iter().find_map(|file| {
        let v = std::fs::read_to_string(&file).ok()?;
        let v: u64 = v.trim().parse().ok()?;
        (v < (1 << 60)).then_some((file, v))
    })
}

fn rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(resource, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(rl.rlim_cur)
}

/// Row 38: allocate and touch up to 256 MiB in a throwaway process (16 MiB
/// at a time). Blocked if the allocation fails (`RLIMIT_AS`) or the process
/// is OOM-killed first; escaped if 256 MiB were reached although a limit at
/// or below that is configured; skipped if no such limit is configured.
pub(crate) fn memory_bomb(_ctx: &ProbeContext) -> Verdict {
    const BOUND_MIB: i64 = 256;
    const CHUNK: usize = 16 << 20;
    // A shared page for progress, readable even if the child is killed.
    // SAFETY: anonymous shared mapping of one page, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Verdict::skipped(format!("mmap of a progress page: {}", last_errno()));
    }
    let progress = page.cast::<i64>();
    let result = in_child(Duration::from_secs(30), |slots| {
        let mut done: i64 = 0;
        while done < BOUND_MIB {
            // SAFETY: raw mmap in the child; pages are touched to be charged.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    CHUNK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    slots[0] = raw_errno();
                    slots[1] = done;
                    return;
                }
                let bytes = p.cast::<u8>();
                let mut off = 0;
                while off < CHUNK {
                    std::ptr::write_volatile(bytes.add(off), 1);
                    off += 4096;
                }
                done += (CHUNK >> 20) as i64;
                std::ptr::write_volatile(progress, done);
            }
        }
        slots[0] = 0;
        slots[1] = done;
    });
    // SAFETY: reading the shared page, then unmapping it.
    let reached = unsafe {
        let v = std::ptr::read_volatile(progress);
        libc::munmap(page, 4096);
        v
    };
    let (slots, end) = match result {
        Ok(r) => r,
        Err(e) => return Verdict::skipped(format!("cannot start the allocating process: {e}")),
    };
    let rl_as = rlimit(libc::RLIMIT_AS);
    let cg = cgroup_memory_limit();
    let limits = format!(
        "RLIMIT_AS {}, cgroup {}",
        rl_as
            .map(|v| format!("{} MiB", v / MIB))
            .unwrap_or_else(|| "unlimited".into()),
        cg.as_ref()
            .map(|(f, v)| format!("{} MiB ({f})", v / MIB))
            .unwrap_or_else(|| "no limit seen".into())
    );
    match (end, slots[0]) {
        (ChildEnd::Code(0), 0) => {
            let bound = (BOUND_MIB as u64) * MIB;
            let limited =
                rl_as.is_some_and(|v| v <= bound) || cg.as_ref().is_some_and(|c| c.1 <= bound);
            if limited {
                Verdict::escaped(format!(
                    "allocated {BOUND_MIB} MiB despite a smaller limit ({limits})"
                ))
            } else {
                Verdict::skipped(format!(
                    "no memory limit of {BOUND_MIB} MiB or less configured ({limits}); {BOUND_MIB} MiB were allocated unimpeded"
                ))
            }
        }
        (ChildEnd::Code(0), e) if e > 0 => Verdict::blocked(format!(
            "allocation failed with {} after {} MiB ({limits})",
            slot_result(e),
            slots[1]
        )),
        (ChildEnd::Signal(sig), _) => Verdict::blocked(format!(
            "the allocating process was killed by signal {sig} after {reached} MiB (OOM kill inside its cgroup; {limits})"
        )),
        (end, _) => Verdict::skipped(format!(
            "allocating process ended oddly: {end} after {reached} MiB ({limits})"
        )),
    }
}

/// Row 39: write zeros to a scratch file until `EFBIG`/`ENOSPC`, bounded at
/// the file-size limit + 1 MiB (`SIGXFSZ` ignored in the writing process;
/// the file is deleted). Escaped if more than the limit was written;
/// skipped without a limit (or one above 256 MiB, beyond the bound).
pub(crate) fn disk_fill(ctx: &ProbeContext) -> Verdict {
    let Some(limit) = ctx.fsize_limit.or_else(|| rlimit(libc::RLIMIT_FSIZE)) else {
        return Verdict::skipped(
            "no file-size limit configured (fsize_limit null, RLIMIT_FSIZE unlimited)",
        );
    };
    if limit > 256 * MIB {
        return Verdict::skipped(format!(
            "the file-size limit ({} MiB) is beyond the probe's 256 MiB bound",
            limit / MIB
        ));
    }
    let bound = limit + MIB;
    let path = ctx.scratch_dir.join(unique("fill"));
    let Some(c) = super::util::cpath(&path) else {
        return Verdict::skipped("scratch path contains a NUL byte");
    };
    static ZEROS: [u8; 65536] = [0; 65536];
    let result = in_child(Duration::from_secs(60), |slots| {
        // SAFETY: raw calls in the child on a prepared path.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let fd = libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                slots[0] = -1;
                slots[1] = raw_errno();
                return;
            }
            let mut total: u64 = 0;
            slots[1] = 0;
            while total < bound {
                let n = libc::write(fd, ZEROS.as_ptr().cast(), ZEROS.len());
                if n < 0 {
                    slots[1] = raw_errno();
                    break;
                }
                total += n as u64;
            }
            libc::close(fd);
            slots[0] = total as i64;
        }
    });
    let size = std::fs::metadata(&path).map(|m| m.len()).ok();
    let _ = std::fs::remove_file(&path);
    let (slots, end) = match result {
        Ok(r) => r,
        Err(e) => return Verdict::skipped(format!("cannot start the writing process: {e}")),
    };
    if slots[0] == -1 {
        return Verdict::skipped(format!(
            "cannot create {}: {}",
            path.display(),
            slot_result(slots[1])
        ));
    }
    let written = size.unwrap_or(u64::try_from(slots[0]).unwrap_or(0));
    let stop = match (slots[1], end) {
        (0, _) => format!("no error up to the {} MiB bound", bound / MIB),
        (i64::MIN, end) => format!("writer {end}"),
        (e, _) => slot_result(e),
    };
    if written > limit {
        Verdict::escaped(format!(
            "wrote {written} bytes, beyond the {limit}-byte limit ({stop}); file removed"
        ))
    } else {
        Verdict::blocked(format!(
            "writing stopped at {written} bytes with {stop} (limit {limit}); file removed"
        ))
    }
}

fn cgroup_of(pid: &str) -> Result<String, String> {
    read_limited(
        std::path::Path::new(&format!("/proc/{pid}/cgroup")),
        1 << 16,
    )
    .map(|b| String::from_utf8_lossy(&b).trim().to_string())
    .map_err(|e| format!("/proc/{pid}/cgroup: {}", io_name(&e)))
}

/// Row 40: double-fork an orphan and see who adopts it (it reports its new
/// parent and exits at once). The launcher cannot be killed from inside, so
/// the verdict is about what ties the orphan to the sandbox: blocked if it
/// is adopted by pid 1 of the sandbox's own pid namespace (which dies with
/// the launcher) or stays in a cgroup other than the supervisor's (killed
/// with it); escaped if it lands outside both; skipped if undecidable.
pub(crate) fn orphan_survival(ctx: &ProbeContext) -> Verdict {
    let (r, w) = match pipe() {
        Ok(p) => p,
        Err(e) => return Verdict::skipped(e),
    };
    // SAFETY: the children use raw, async-signal-safe calls only.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: raw calls in the intermediate child and the orphan.
        unsafe {
            let me = libc::getpid();
            let gc = libc::fork();
            if gc == 0 {
                let mut i = 0;
                while libc::getppid() == me && i < 3000 {
                    let ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    libc::nanosleep(&ts, std::ptr::null_mut());
                    i += 1;
                }
                let report: i64 = i64::from(libc::getppid());
                libc::write(w, (&report as *const i64).cast(), 8);
                libc::_exit(0);
            }
            if gc < 0 {
                let report: i64 = -raw_errno();
                libc::write(w, (&report as *const i64).cast(), 8);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our copy of the write end is not needed.
    unsafe { libc::close(w) };
    if child < 0 {
        // SAFETY: closing our read end.
        unsafe { libc::close(r) };
        return Verdict::skipped(format!("fork: {}", last_errno()));
    }
    wait_child(child, Duration::from_secs(5));
    let mut report: i64 = i64::MIN;
    // SAFETY: poll then read 8 bytes into our variable.
    unsafe {
        let mut p = libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut p, 1, 5000) > 0 {
            libc::read(r, (&mut report as *mut i64).cast(), 8);
        }
        libc::close(r);
    }
    if report == i64::MIN {
        return Verdict::skipped("the orphan never reported its new parent");
    }
    if report < 0 {
        return Verdict::skipped(format!("second fork failed: {}", slot_result(-report)));
    }
    let adopter = report;
    let view = pid_view(ctx.supervisor_pid);
    if view.nested && adopter == 1 {
        return Verdict::blocked(
            "the orphan was adopted by pid 1 of the sandbox's own pid namespace: it dies with the sandbox",
        );
    }
    let ours = cgroup_of("self");
    let sup = if view.proc_is_host {
        cgroup_of(&ctx.supervisor_pid.to_string())
    } else {
        Err("supervisor not visible".into())
    };
    match (ours, sup) {
        (Ok(a), Ok(s)) if a != s => Verdict::blocked(format!(
            "the orphan (adopted by pid {adopter}) stays in this cgroup ({}), not the supervisor's ({}): killed with the agent cgroup",
            a.replace('\n', " "),
            s.replace('\n', " ")
        )),
        (Ok(a), Ok(_)) => {
            let v = Verdict::escaped(format!(
                "the orphan was adopted by pid {adopter} outside any sandbox pid namespace and shares the supervisor's cgroup ({}): nothing ties it to the launcher",
                a.replace('\n', " ")
            ));
            match &ctx.by_design {
                Some(d) => d.judge(v, &[&d.no_pid_namespace, &d.no_cgroup]),
                None => v,
            }
        }
        (a, s) => Verdict::skipped(format!(
            "cannot decide from inside: no own pid namespace (orphan adopted by pid {adopter}); own cgroup {}, supervisor cgroup {}",
            a.unwrap_or_else(|e| e).replace('\n', " "),
            s.unwrap_or_else(|e| e).replace('\n', " ")
        )),
    }
}
