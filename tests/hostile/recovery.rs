//! Recovery a person does not wait for (issue 31 §8): after a fault, the
//! next command works at once — without any check weakened (a live
//! holder's turn, lock or lease is never taken from it).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::common::*;
use mini_letta::protocol::Call;

/// The running agent-role child of a daemon: (id, pid).
fn agent_child(d: &Daemon) -> Option<(u64, i32)> {
    let ps = d.client().call_json(Call::Ps {}).ok()?;
    ps["children"].as_array()?.iter().find_map(|r| {
        (r["role"] == "agent" && r["state"] == "running")
            .then(|| Some((r["id"].as_u64()?, r["pid"].as_i64()? as i32)))?
    })
}

/// A turn child stopped (SIGSTOP to its process group, as a frozen or
/// debugged process is) held its conversation until its client gave up:
/// the next turn of the conversation waited for that client's deadline
/// (20 s in the fault soak), or for ever. The waiting turn now resumes the
/// stopped holder; both turns answer, neither is killed.
#[test]
fn a_turn_waiting_behind_a_stopped_turn_resumes_it() {
    if !confinement_or_skip("a_turn_waiting_behind_a_stopped_turn_resumes_it") {
        return;
    }
    let d = Daemon::start(&["a"]);
    let first = Command::new(bin())
        .args(["chat", "-a", "a", "-p", "run: sleep 1; echo slept"])
        .env("MINI_LETTA_HOME", d.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut found = None;
    assert!(wait_until(20, || {
        found = agent_child(&d);
        found.is_some()
    }));
    let (_, pid) = found.unwrap();
    let group = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The next turn of the same conversation, with a deadline of its own.
    let t0 = Instant::now();
    let mut second = Command::new(bin())
        .args(["chat", "-a", "a", "-p", "你好"])
        .env("MINI_LETTA_HOME", d.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answered = wait_until(15, || matches!(second.try_wait(), Ok(Some(_))));
    let waited = t0.elapsed();
    // Whatever happened, nothing stays stopped or running after the test.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT);
    if !answered {
        let _ = second.kill();
    }
    let second = second.wait_with_output().unwrap();
    let first = first.wait_with_output().unwrap();
    assert!(answered, "the next turn still waited after {waited:?}");
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        String::from_utf8_lossy(&second.stdout).contains("mock: 你好"),
        "{}",
        String::from_utf8_lossy(&second.stdout)
    );
    // The stopped turn was resumed, not taken over: it finished its work.
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        String::from_utf8_lossy(&first.stdout).contains("slept"),
        "{}",
        String::from_utf8_lossy(&first.stdout)
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}
