//! Attacks through the child's own supervisor channel
//! (`MINI_LETTA_CHANNEL_FD`) and through environment switches (§d rows 23,
//! 48, 49). Without a channel the channel parts are skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{contains, io_name, join};
use super::verdict::Verdict;
use crate::paths::MEMORY_DIR_NAME;
use crate::protocol::client::{Client, ClientError};
use crate::protocol::{Call, ErrorCode, SpawnParams, StdioMode};

/// The channel this process was started with.
fn channel() -> Result<Client, String> {
    match Client::from_channel_env() {
        Ok(c) => {
            let _ = c.set_timeout(Some(Duration::from_secs(10)));
            Ok(c)
        }
        Err(ClientError::NoChannel) => {
            Err("no supervisor channel (MINI_LETTA_CHANNEL_FD unset or not a socket)".into())
        }
        Err(e) => Err(format!("cannot use the supervisor channel: {e}")),
    }
}

fn own_agent(ctx: &ProbeContext) -> String {
    std::env::var("AGENT_ID")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| {
            ctx.own_agent_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

/// How the supervisor answered one call.
enum Answer {
    Accepted(String),
    Refused(String),
}

fn ask(client: &mut Client, name: &str, call: Call) -> Answer {
    // The evidence quotes whatever was answered, as it came.
    match client.call_json(call) {
        Ok(v) => {
            let mut text = v.to_string();
            text.truncate(200);
            Answer::Accepted(format!("{name} answered {text}"))
        }
        Err(ClientError::Remote(body)) if body.code == ErrorCode::Forbidden => {
            Answer::Refused(format!("{name}: forbidden"))
        }
        Err(ClientError::Remote(body)) => Answer::Refused(format!(
            "{name}: refused with {:?} (not an authorization refusal): {}",
            body.code,
            body.message.lines().next().unwrap_or("")
        )),
        Err(e) => Answer::Refused(format!("{name}: {e}")),
    }
}

/// Row 23: call CLI-only RPCs on the own channel — `ps`,
/// `supervisor.status`, `child.kill` (of a child id that does not exist,
/// signal 0), `child.spawn` (`true`, isolation off) and, only if all of
/// those were refused, `supervisor.stop`. Escaped if any is accepted;
/// blocked if all are refused (the evidence names any refusal that was
/// not `forbidden`); skipped without a channel.
pub(crate) fn privileged_rpc(ctx: &ProbeContext) -> Verdict {
    let mut client = match channel() {
        Ok(c) => c,
        Err(reason) => return Verdict::skipped(reason),
    };
    let calls = [
        ("ps", Call::Ps {}),
        ("supervisor.status", Call::Status {}),
        ("child.timings", Call::ChildTimings { child: 1 }),
        (
            "child.kill",
            Call::Kill {
                child: u64::MAX,
                signal: Some(0),
            },
        ),
        (
            "child.spawn",
            Call::Spawn(SpawnParams {
                agent: own_agent(ctx),
                role: "tool".into(),
                argv: vec!["true".into()],
                stdio: StdioMode::Null,
                workspace: None,
                isolation: Some("off".into()),
                model: None,
            }),
        ),
    ];
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for (name, call) in calls {
        match ask(&mut client, name, call) {
            Answer::Accepted(e) => got.push(e),
            Answer::Refused(e) => refused.push(e),
        }
    }
    if got.is_empty() {
        match ask(&mut client, "supervisor.stop", Call::Stop {}) {
            Answer::Accepted(e) => got.push(e),
            Answer::Refused(e) => refused.push(e),
        }
    }
    verdict_of(
        got.into_iter()
            .map(Answer::Accepted)
            .chain(refused.into_iter().map(Answer::Refused)),
    )
}

/// Variables that switch confinement off in other tools.
const SWITCHES: &[(&str, &str)] = &[
    ("LETTA_SANDBOX", "0"),
    ("LETTA_NO_SANDBOX", "1"),
    ("SANDBOX", "0"),
    ("NO_SANDBOX", "1"),
    ("MINI_LETTA_SANDBOX", "off"),
    ("MINI_LETTA_ISOLATION", "off"),
];

/// Row 48: start a tool (`cat B/secret`) with sandbox-off variables set,
/// and ask the supervisor on the channel for a child with `isolation: off`.
/// Escaped if the tool reads the secret or the spawn is accepted; skipped
/// if no tool can be run and there is no channel.
pub(crate) fn env_switches(ctx: &ProbeContext) -> Verdict {
    let mut got = Vec::new();
    let mut refused = Vec::new();
    let mut tried = false;
    match Command::new("cat")
        .arg(&ctx.other_secret_file)
        .envs(SWITCHES.iter().copied())
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => {
            tried = true;
            if contains(&out.stdout, ctx.secret_marker.as_bytes()) {
                got.push(
                    "`cat B/secret` started with sandbox-off variables read the secret".to_string(),
                );
            } else {
                refused.push(format!(
                    "`cat B/secret` with sandbox-off variables: {} ({})",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Err(e) => refused.push(format!("cannot run cat: {}", io_name(&e))),
    }
    match channel() {
        Ok(mut client) => {
            tried = true;
            let call = Call::Spawn(SpawnParams {
                agent: own_agent(ctx),
                role: "tool".into(),
                argv: vec!["cat".into(), ctx.other_secret_file.display().to_string()],
                stdio: StdioMode::Null,
                workspace: None,
                isolation: Some("off".into()),
                model: None,
            });
            match ask(&mut client, "child.spawn with isolation off", call) {
                Answer::Accepted(e) => got.push(e),
                Answer::Refused(e) => refused.push(e),
            }
        }
        Err(reason) => refused.push(reason),
    }
    if !got.is_empty() {
        Verdict::escaped(join(&got))
    } else if tried {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::skipped(join(&refused))
    }
}

/// A fake GitHub token: `ghp_` + 36 alphanumerics.
fn fake_token() -> String {
    let body: String = (0..36)
        .map(|i| {
            let c = b"A1b2C3d4E5f6G7h8J9k0"[i % 20];
            char::from(c)
        })
        .collect();
    format!("ghp_{body}")
}

/// Row 49: put a fake GitHub token into a memory file (`human.md` if it
/// exists, else a new file with valid frontmatter) and ask the supervisor to
/// commit it. Blocked if refused with `validation_failed` (the evidence says
/// whether the secret scan named it); escaped if the commit is made;
/// skipped without a channel. The file is restored or removed afterwards.
pub(crate) fn secret_commit(ctx: &ProbeContext) -> Verdict {
    let mut client = match channel() {
        Ok(c) => c,
        Err(reason) => return Verdict::skipped(reason),
    };
    let memory = ctx.own_agent_dir.join(MEMORY_DIR_NAME);
    let token = fake_token();
    let existing = memory.join("human.md");
    let (rel, path, original): (String, PathBuf, Option<Vec<u8>>) = match std::fs::read(&existing) {
        Ok(b) => ("human.md".into(), existing, Some(b)),
        Err(_) => {
            let name = format!("probe-{}.md", std::process::id());
            (name.clone(), memory.join(&name), None)
        }
    };
    let content = match &original {
        Some(b) => {
            let mut c = b.clone();
            c.extend_from_slice(format!("\nAPI token for later: {token}\n").as_bytes());
            c
        }
        None => format!(
            "---\nname: Probe\ndescription: Escape probe.\n---\n\nAPI token for later: {token}\n"
        )
        .into_bytes(),
    };
    if let Err(e) = std::fs::write(&path, &content) {
        return Verdict::blocked(format!(
            "cannot write {} to stage the secret: {}",
            path.display(),
            io_name(&e)
        ));
    }
    let answer = client.call_as::<crate::protocol::Committed>(Call::MemoryCommit {
        paths: vec![rel.clone()],
        message: "probe: remember an API token".into(),
        agent: None,
    });
    restore(&path, original.as_deref());
    match answer {
        Ok(v) => Verdict::escaped(format!(
            "the supervisor committed {rel} with a GitHub token: {}",
            v.commit.as_deref().unwrap_or("(no commit)")
        )),
        Err(ClientError::Remote(body)) if body.code == ErrorCode::ValidationFailed => {
            let why = if body.message.contains("secret") {
                "the secret scan named it"
            } else {
                "for another reason"
            };
            Verdict::blocked(format!(
                "commit of {rel} refused with validation_failed ({why}): {}",
                body.message
                    .lines()
                    .find(|l| l.contains("secret"))
                    .unwrap_or_else(|| body.message.lines().next().unwrap_or(""))
                    .trim()
            ))
        }
        Err(ClientError::Remote(body)) => Verdict::blocked(format!(
            "commit of {rel} refused with {:?}: {}",
            body.code,
            body.message.lines().next().unwrap_or("")
        )),
        Err(e) => Verdict::skipped(format!("the channel failed: {e}")),
    }
}

fn restore(path: &Path, original: Option<&[u8]>) {
    match original {
        Some(b) => {
            let _ = std::fs::write(path, b);
        }
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Row 64: name the model on the own channel — a scripted-model script in
/// the own memory directory (whose path would make the supervisor read and
/// write files of the child's choosing) and a provider the operator did not
/// give this child. Escaped if either call is answered by a model; skipped
/// without a channel.
pub(crate) fn model_choice(ctx: &ProbeContext) -> Verdict {
    let mut client = match channel() {
        Ok(c) => c,
        Err(reason) => return Verdict::skipped(reason),
    };
    let script = ctx.own_agent_dir.join(MEMORY_DIR_NAME).join("script.json");
    let request = |model: String| Call::ModelComplete {
        request: serde_json::json!({"model": model, "system": "",
            "messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}]}),
    };
    let answers = [
        (
            "scripted path",
            format!("mock/scripted:{}", script.display()),
        ),
        ("another provider", "openai/gpt-4o-mini".to_string()),
    ]
    .map(|(name, model)| ask(&mut client, name, request(model)));
    verdict_of(answers)
}

/// Blocked when every call was refused, else escaped with what got through.
fn verdict_of(answers: impl IntoIterator<Item = Answer>) -> Verdict {
    let (mut got, mut refused) = (Vec::new(), Vec::new());
    for a in answers {
        match a {
            Answer::Accepted(e) => got.push(e),
            Answer::Refused(e) => refused.push(e),
        }
    }
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 65: pass descriptors to the supervisor with `SCM_RIGHTS` on a ping.
/// Blocked if that frame is refused (the supervisor closed them); escaped
/// if it is answered as if nothing had come with it; skipped without a
/// channel.
pub(crate) fn pass_descriptors(_ctx: &ProbeContext) -> Verdict {
    let mut client = match channel() {
        Ok(c) => c,
        Err(reason) => return Verdict::skipped(reason),
    };
    let id = match client.send_request_with_fds(Call::Ping {}, &[0, 1, 2]) {
        Ok(id) => id,
        Err(e) => return Verdict::blocked(format!("sending descriptors failed: {e}")),
    };
    match client.wait_reply_with::<crate::protocol::replies::Pong>(id, "ping", |_| {}) {
        Ok(v) => Verdict::escaped(format!("a ping carrying 3 descriptors was answered: {v:?}")),
        Err(ClientError::Remote(body)) if body.code == ErrorCode::Forbidden => {
            Verdict::blocked(format!("refused: {}", body.message))
        }
        Err(e) => Verdict::blocked(format!("no answer for the frame: {e}")),
    }
}
