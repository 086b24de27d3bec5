//! One attack: its probe run in a confined child of the attacker, started
//! through the supervisor's `child.spawn` like any child, and its verdict
//! checked again from outside.

use std::io::{PipeReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::protocol::client::Client;
use crate::protocol::events::ChildExit;
use crate::protocol::{Call, ErrorCode, SpawnParams, StdioMode};
use crate::sandbox::probes::Verdict;

/// Run probe `id` in a confined child of `agent` and read its verdict.
/// `refusal_blocks`: the attack is what the attacker's tree holds, so the
/// supervisor refusing the child for it (`forbidden`) stops the attack.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    client: &mut Client,
    agent: &str,
    role: &str,
    iso: &str,
    exe: &Path,
    id: &str,
    ctx: &str,
    refusal_blocks: bool,
) -> Verdict {
    let (req, mut out_r) = match start(client, agent, role, iso, exe, id, ctx) {
        Ok(started) => started,
        Err(skipped) => return skipped,
    };
    let mut exits = Vec::new();
    let started = client.wait_reply_keeping_exits::<crate::protocol::replies::Started>(
        req,
        "child.spawn",
        &mut exits,
    );
    let child = match started {
        Ok(started) => started.child,
        // Refused for what the attacker's tree holds: the attack's own
        // doing, so the attack stopped before any process could run.
        Err(e) if refusal_blocks && e.code() == Some(ErrorCode::Forbidden) => {
            return Verdict::blocked(format!("the supervisor refused to start the child: {e}"));
        }
        Err(e) => return Verdict::skipped(format!("the supervisor refused the probe: {e}")),
    };
    let mut output = String::new();
    let _ = out_r.read_to_string(&mut output);
    let exit = match client.wait_exit(child, &mut exits) {
        Ok(e) => e,
        Err(e) => return Verdict::skipped(format!("lost the supervisor: {e}")),
    };
    verdict_of(&output, &exit)
}

/// Ask the supervisor for the probe's child, its context written to the
/// child's stdin: the request's id and the read end of the child's
/// stdout, or the skip verdict saying why it could not start.
fn start(
    client: &mut Client,
    agent: &str,
    role: &str,
    iso: &str,
    exe: &Path,
    id: &str,
    ctx: &str,
) -> Result<(u64, PipeReader), Verdict> {
    let (out_r, out_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Err(Verdict::skipped(format!("cannot create a pipe: {e}"))),
    };
    let null = match std::fs::File::open("/dev/null") {
        Ok(f) => OwnedFd::from(f),
        Err(e) => return Err(Verdict::skipped(format!("cannot open /dev/null: {e}"))),
    };
    // The context (with the decoy values the probes look for) goes in on
    // stdin, never in argv or the environment, where a probe would find it
    // and report a false escape.
    let (in_r, mut in_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Err(Verdict::skipped(format!("cannot create a pipe: {e}"))),
    };
    let in_r = OwnedFd::from(in_r);
    let out_w = OwnedFd::from(out_w);
    let fds = [in_r.as_raw_fd(), out_w.as_raw_fd(), null.as_raw_fd()];
    let spawn = Call::Spawn(SpawnParams {
        agent: agent.into(),
        role: role.into(),
        argv: vec![
            exe.display().to_string(),
            "probe".into(),
            id.into(),
            "--context".into(),
            "-".into(),
        ],
        stdio: StdioMode::Passed,
        workspace: None,
        isolation: Some(iso.into()),
        model: None,
    });
    let req = match client.send_request_with_fds(spawn, &fds) {
        Ok(id) => id,
        Err(e) => return Err(Verdict::skipped(format!("cannot start the probe: {e}"))),
    };
    drop(out_w);
    drop(null);
    drop(in_r);
    let _ = in_w.write_all(ctx.as_bytes());
    drop(in_w);
    Ok((req, out_r))
}

/// What must not change whatever a probe says: B's secret, the sibling
/// child, the attacker's git hooks.
pub(super) struct Witness {
    pub secret: PathBuf,
    pub marker: String,
    /// Host pid of the sibling child (0: none to watch).
    pub sibling: u32,
    pub hooks_dir: PathBuf,
    pub hooks_before: Vec<PathBuf>,
}

impl Witness {
    /// Watch `hooks_dir` from its present content on.
    pub fn new(secret: PathBuf, marker: String, sibling: u32, hooks_dir: PathBuf) -> Self {
        let hooks_before = list_dir(&hooks_dir);
        Self {
            secret,
            marker,
            sibling,
            hooks_dir,
            hooks_before,
        }
    }

    /// Look from outside: a probe that says "blocked" while the secret
    /// changed, the sibling died or a hook appeared is an escape all the
    /// same.
    pub fn judge(&self, verdict: Verdict) -> Verdict {
        if verdict.is_escaped() {
            return verdict;
        }
        if std::fs::read_to_string(&self.secret)
            .map(|s| s.trim() != self.marker)
            .unwrap_or(true)
        {
            return Verdict::escaped("the decoy agent's secret file was changed or removed");
        }
        if self.sibling != 0
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.sibling as i32), None)
                .is_err()
        {
            return Verdict::escaped("the sibling child is gone");
        }
        if list_dir(&self.hooks_dir) != self.hooks_before {
            return Verdict::escaped("a file appeared in the memory git directory's hooks/");
        }
        verdict
    }
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The verdict the probe printed last (a JSON line), or, without one,
/// what its exit says.
fn verdict_of(output: &str, exit: &ChildExit) -> Verdict {
    let last = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    if let Some(line) = last
        && let Ok(v) = serde_json::from_str::<Value>(line)
        && let Ok(verdict) = serde_json::from_value::<Verdict>(v.clone())
    {
        return verdict;
    }
    match (exit.signal(), exit.code()) {
        (Some(sig), _) => Verdict::blocked(format!("the probe process was killed by signal {sig}")),
        (_, code) => Verdict::skipped(format!(
            "the probe gave no verdict (exit {}): {}",
            code.unwrap_or(-1),
            output.trim()
        )),
    }
}
