//! Local channels to the host and to other agents: the supervisor's control
//! socket, abstract Unix sockets, SysV and POSIX shared memory (§d rows 22,
//! 24, 45).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::PathBuf;

use super::context::ProbeContext;
use super::util::{io_name, last_errno};
use super::verdict::Verdict;

/// Row 22: `connect` to the supervisor's control socket (the CLI endpoint,
/// which carries full authority; per-agent sockets do not exist — children
/// get a socketpair), and where it can be reached, greet it as a CLI would
/// (with the control key, if the probe can read it). Escaped if the
/// supervisor greets back: the child would then be its operator.
pub fn control_socket(ctx: &ProbeContext) -> Verdict {
    let path = ctx.control_socket.display();
    let stream = match UnixStream::connect(&ctx.control_socket) {
        Ok(s) => s,
        Err(e) => return Verdict::blocked(format!("connect {path}: {}", io_name(&e))),
    };
    let key_file = crate::paths::control_key_beside(&ctx.control_socket);
    let key = std::fs::read_to_string(&key_file)
        .ok()
        .map(|k| k.trim().to_string());
    let key_note = match &key {
        Some(_) => format!("read {}", key_file.display()),
        None => format!("could not read {}", key_file.display()),
    };
    match greet(stream, key) {
        Ok(reply) if reply["type"] == "hello" => Verdict::escaped(format!(
            "connected to {path} and the supervisor greeted back ({key_note})"
        )),
        Ok(reply) => Verdict::blocked(format!(
            "connected to {path}, refused at hello ({key_note}): {}",
            reply["message"].as_str().unwrap_or("no message")
        )),
        Err(e) => Verdict::blocked(format!(
            "connected to {path}, no greeting ({key_note}): {e}"
        )),
    }
}

/// Send a CLI's hello and read the first frame back.
fn greet(stream: UnixStream, key: Option<String>) -> Result<serde_json::Value, String> {
    use crate::protocol::{ClientFrame, PROTOCOL_VERSION, PeerKind, encode};
    use std::io::{BufRead, BufReader, Read, Write};
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(|e| io_name(&e))?;
    let mut w = stream.try_clone().map_err(|e| io_name(&e))?;
    w.write_all(&encode(&ClientFrame::Hello {
        version: PROTOCOL_VERSION,
        peer: PeerKind::Cli,
        key,
    }))
    .map_err(|e| io_name(&e))?;
    let mut line = String::new();
    let n = BufReader::new(stream)
        .take(64 * 1024)
        .read_line(&mut line)
        .map_err(|e| io_name(&e))?;
    if n == 0 {
        return Err("closed".into());
    }
    serde_json::from_str(&line).map_err(|e| format!("unreadable reply: {e}"))
}

/// Row 24: `connect` to an abstract Unix socket created outside the
/// sandbox. Escaped if the connection is made.
pub(crate) fn abstract_socket(ctx: &ProbeContext) -> Verdict {
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
pub(crate) fn shared_ipc(ctx: &ProbeContext) -> Verdict {
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
