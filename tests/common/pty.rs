//! The binary run with a pty as its terminal (stdout and stderr both), and
//! what reached that terminal.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a run on a pty left on it.
pub struct PtyRun {
    pub code: Option<i32>,
    /// Every byte written to the terminal (the pty turns `\n` into `\r\n`).
    pub out: Vec<u8>,
}

impl PtyRun {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }
}

/// Run `mini-letta ARGS` under `home` with `env`, stdout and stderr on a
/// fresh pty (stdin empty), colour allowed; returns once it exited and its
/// output was read.
pub fn run(home: &Path, args: &[&str], env: &[(&str, &str)]) -> PtyRun {
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut cmd = Command::new(super::bin());
    cmd.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // The slave copies went into the Command: only the child holds it now.
    drop(cmd);
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        let master = std::fs::File::from(pty.master);
        // Read while it runs (a full pty would block it), and stop once it
        // exited and nothing more comes (a grandchild may keep the slave).
        std::thread::spawn(move || drain(master, &done))
    };
    let status = child.wait().unwrap();
    done.store(true, Ordering::SeqCst);
    PtyRun {
        code: status.code(),
        out: reader.join().unwrap(),
    }
}

fn drain(mut master: std::fs::File, done: &AtomicBool) -> Vec<u8> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let ready = {
            let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(100u16)).unwrap_or(0) > 0
        };
        if !ready {
            if done.load(Ordering::SeqCst) {
                return out;
            }
            continue;
        }
        match master.read(&mut buf) {
            // EIO once every holder of the slave is gone.
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Fail unless `out` is safe for a terminal: every ESC starts a plain
/// colour (SGR) sequence, and no other control character (BEL, C1) nor a
/// bidirectional override is there; `\r`, `\n`, `\t` are allowed.
pub fn assert_terminal_safe(what: &str, out: &[u8]) {
    let text = String::from_utf8_lossy(out);
    for (i, c) in text.char_indices() {
        if c == '\u{1b}' {
            let rest = &text[i + 1..];
            let sgr = rest.strip_prefix('[').and_then(|r| {
                let end = r.find(|c: char| !(c.is_ascii_digit() || c == ';'))?;
                (r.as_bytes()[end] == b'm').then_some(end)
            });
            assert!(
                sgr.is_some(),
                "{what}: an escape sequence that is not colour reached the terminal at {i}: {:?}",
                &text[i..text.len().min(i + 24)]
            );
            continue;
        }
        let allowed = matches!(c, '\r' | '\n' | '\t');
        assert!(
            allowed || !mini_letta::names::is_unsafe(c),
            "{what}: {c:?} reached the terminal in {text:?}"
        );
    }
}
