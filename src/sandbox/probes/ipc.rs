//! Local channels to the host and to other agents: the supervisor's control
//! socket, abstract Unix sockets, SysV and POSIX shared memory (§d rows 22,
//! 24, 45).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::PathBuf;

use super::util::{io_name, last_errno};
use super::{ProbeContext, Verdict};

/// Row 22: `connect` to the supervisor's control socket (the CLI endpoint,
/// which carries full authority; per-agent sockets do not exist — children
/// get a socketpair). Escaped if the connection is made.
pub fn control_socket(ctx: &ProbeContext) -> Verdict {
    match UnixStream::connect(&ctx.control_socket) {
        Ok(_) => Verdict::escaped(format!("connected to {}", ctx.control_socket.display())),
        Err(e) => Verdict::blocked(format!(
            "connect {}: {}",
            ctx.control_socket.display(),
            io_name(&e)
        )),
    }
}

/// Row 24: `connect` to an abstract Unix socket created outside the
/// sandbox. Escaped if the connection is made.
pub fn abstract_socket(ctx: &ProbeContext) -> Verdict {
    let name = &ctx.host_abstract_socket;
    if name.is_empty() {
        return Verdict::skipped("no host abstract socket in the context");
    }
    let addr = match SocketAddr::from_abstract_name(name.as_bytes()) {
        Ok(a) => a,
        Err(e) => return Verdict::skipped(format!("bad abstract name @{name}: {e}")),
    };
    match UnixStream::connect_addr(&addr) {
        Ok(_) => Verdict::escaped(format!("connected to @{name}")),
        Err(e) => Verdict::blocked(format!("connect @{name}: {}", io_name(&e))),
    }
}

/// A SysV key given as decimal or `0x` hex.
fn sysv_key(s: &str) -> Option<libc::key_t> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok().map(|v| v as libc::key_t),
        None => s.parse::<libc::key_t>().ok(),
    }
}

/// Row 45: look up the IPC object the verifier created on the host — a SysV
/// segment by key (`shmget(key, 0, 0)`) or a POSIX segment by name (open
/// `/dev/shm/<name>`). Escaped if visible (a shared IPC namespace or
/// `/dev/shm`: a documented residual of the no-namespace fallback).
pub fn shared_ipc(ctx: &ProbeContext) -> Verdict {
    let Some(name) = ctx.host_shm_name.as_deref().filter(|n| !n.is_empty()) else {
        return Verdict::skipped("no host IPC object in the context (host_shm_name is null)");
    };
    if let Some(key) = sysv_key(name) {
        // SAFETY: shmget with size 0 and no flags only looks the key up.
        let id = unsafe { libc::shmget(key, 0, 0) };
        return if id >= 0 {
            Verdict::escaped(format!(
                "SysV segment with key {name} is visible (shmid {id}): the IPC namespace is shared"
            ))
        } else {
            Verdict::blocked(format!("shmget({name}): {}", last_errno()))
        };
    }
    let clean = name.trim_start_matches('/');
    if clean.contains('/') {
        return Verdict::skipped(format!("POSIX shm name {name:?} contains '/'"));
    }
    let path = PathBuf::from("/dev/shm").join(clean);
    match std::fs::File::open(&path) {
        Ok(_) => Verdict::escaped(format!(
            "{} is visible and readable: /dev/shm is shared with the host",
            path.display()
        )),
        Err(e) => Verdict::blocked(format!("open {}: {}", path.display(), io_name(&e))),
    }
}
