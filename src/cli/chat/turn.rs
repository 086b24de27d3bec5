//! A turn as the CLI runs it: the checks before any runs, and the runner
//! that asks the supervisor (embedded if none runs) for a confined agent
//! child, hands it the turn on stdin and reads the turn's events from it.

use std::io::{BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::args::{ChatArgs, workspace_of};
use crate::cli::interrupt;
use crate::cli::terminal::clean;
use crate::paths::{AgentPaths, Home};
use crate::protocol::client::{Client, ClientError};
use crate::protocol::events::ChildEnd;
use crate::protocol::timings;
use crate::protocol::turn::{TurnEvent, TurnInput};
use crate::protocol::{Call, ErrorCode, TurnParams, replies};
use crate::store::conversation::lines::{Line, LinePos, LogLines};
use crate::supervisor::Session;

/// Check what a turn needs before any runs: the conversation id's form and
/// the model (known form, key, valid `config.toml`). The supervisor checks
/// again; this makes an interactive chat fail at its start, not at its
/// first message.
pub(crate) fn precheck(
    home: &Home,
    agent: &AgentPaths,
    model: &str,
    conversation: &str,
) -> anyhow::Result<()> {
    agent.conversation(conversation)?;
    let cfg = crate::model::ProviderConfig::load(home)?;
    crate::model::open_model(model, &cfg)?;
    Ok(())
}

/// The turns of `agent` (an id) in `conversation`, as `args` asks.
pub(crate) fn runner_for(
    home: &Home,
    args: &ChatArgs,
    agent: &str,
    conversation: &str,
) -> anyhow::Result<TurnRunner> {
    Ok(TurnRunner::new(
        home.clone(),
        agent.to_string(),
        args.isolation.clone(),
        workspace_of(args)?,
        conversation.to_string(),
    )
    .wait_owner(args.wait_owner))
}

/// Runs turns of one agent's conversation through the home's supervisor,
/// opening (or re-opening) the session as needed.
pub struct TurnRunner {
    home: Home,
    session: Option<Session>,
    agent: String,
    isolation: String,
    workspace: Option<PathBuf>,
    conversation: String,
    /// `chat --wait-owner`.
    wait_owner: Option<u64>,
}

/// A turn the supervisor never read (it went away first): safe to send
/// again to the next one.
#[derive(Debug, thiserror::Error)]
#[error("the supervisor went away before taking the turn")]
struct NotTaken;

impl TurnRunner {
    /// Turns of `agent` (an id) in `conversation`.
    pub(crate) fn new(
        home: Home,
        agent: String,
        isolation: String,
        workspace: Option<PathBuf>,
        conversation: String,
    ) -> Self {
        Self {
            home,
            session: None,
            agent,
            isolation,
            workspace,
            conversation,
            wait_owner: None,
        }
    }

    /// In a cluster, wait up to `secs` for another owner (`--wait-owner`).
    pub(crate) fn wait_owner(mut self, secs: Option<u64>) -> Self {
        self.wait_owner = secs;
        self
    }

    fn session(&mut self) -> anyhow::Result<&mut Session> {
        if self.session.is_none() {
            let session = Session::open(&self.home)?;
            timings::mark("cli.connected");
            interrupt::set_stopper(session.stopper());
            self.session = Some(session);
        }
        self.session
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("no supervisor session"))
    }

    /// Run one turn; returns its `done` event (a cancelled turn's is
    /// made here, with stop reason `cancelled`).
    pub fn run(
        &mut self,
        input: &TurnInput,
        on_event: &mut dyn FnMut(&TurnEvent),
    ) -> anyhow::Result<TurnEvent> {
        let _guard = interrupt::begin_turn(&self.home, Some(&self.agent), &self.conversation);
        let once = || {
            let agent = self.agent.clone();
            let (isolation, workspace) = (self.isolation.clone(), self.workspace.clone());
            let conversation = self.conversation.clone();
            let wait_owner = self.wait_owner;
            let session = self.session()?;
            let place = TurnPlace {
                agent: &agent,
                isolation: &isolation,
                wait_owner,
                workspace: workspace.as_deref(),
                conversation: &conversation,
            };
            let done = turn(session, &place, input, on_event);
            // Its supervisor went away: the next try opens a new session.
            if done.as_ref().is_err_and(|e| e.is::<NotTaken>())
                && let Some(s) = self.session.take()
            {
                s.close();
            }
            done
        };
        let not_taken = |e: &anyhow::Error| {
            let again = e.is::<NotTaken>();
            if again {
                tracing::debug!("{e}; sending the turn again");
            }
            again
        };
        crate::supervisor::RESEND_NOT_TAKEN
            .run(not_taken, once)
            .map_err(|e| supervisor_env_hint(&self.home, e))
    }

    /// Stop the embedded supervisor, if this command ran one (after the
    /// turns other commands run on it).
    pub fn close(&mut self) {
        interrupt::set_stopper(None);
        if let Some(s) = self.session.take() {
            s.close();
        }
    }
}

/// A key missing from the supervisor's environment that this command's
/// environment has: the advice to set it would be wrong (it is set — for
/// this command, not for the supervisor, which reads its own environment
/// when it starts). Say which supervisor and how to restart it.
fn supervisor_env_hint(home: &Home, e: anyhow::Error) -> anyhow::Error {
    let text = e.to_string();
    let Some(var) = text
        .contains("no API key for")
        .then(|| text.split("set ").nth(1))
        .flatten()
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        .map(str::to_string)
    else {
        return e;
    };
    let pid = crate::supervisor::connect(home)
        .map(|c| c.server_pid.to_string())
        .unwrap_or_else(|_| "?".into());
    e.context(format!(
        "{var} is set for this command, but the running supervisor (pid {pid}) reads the \
         environment it was started with: restart it with the key set (`mini-letta supervisor \
         stop`, then `{var}=… mini-letta supervisor start`), or name it in config.toml \
         (api_key_env / api_key)"
    ))
}

/// The longest line of a turn child's stderr relayed to the operator.
const CHILD_ERR_LINE: usize = 64 * 1024;

/// Where one turn runs: the agent (an id), its child's confinement and
/// workspace, the conversation, and how long to wait for another host's
/// ownership to end (`--wait-owner`).
struct TurnPlace<'a> {
    agent: &'a str,
    isolation: &'a str,
    wait_owner: Option<u64>,
    workspace: Option<&'a Path>,
    conversation: &'a str,
}

/// Run one turn in a confined agent child; returns its `done` event.
///
/// One request (`turn.run`): the supervisor finds the agent and starts its
/// child on our pipes; we feed the turn's input, read its events, then read
/// the response, which comes when the child has exited.
fn turn(
    session: &mut Session,
    place: &TurnPlace<'_>,
    input: &TurnInput,
    on_event: &mut dyn FnMut(&TurnEvent),
) -> anyhow::Result<TurnEvent> {
    let (stdio, relay) = ChildStdio::open()?;
    let ChildStdio {
        passed,
        input: mut in_w,
        events: out_r,
    } = stdio;
    let client = &mut session.client;
    let sent = send_turn(client, place, input, &passed);
    drop(passed);
    let req = sent?;
    // A refused turn (no such agent) closes the pipes unread: not an error
    // of ours, the response says why. The input goes on its own thread: a
    // large one fills the pipe until the child reads it, and a waiting
    // turn's child has not started yet.
    let text = serde_json::to_vec(input)?;
    let feeder = std::thread::spawn(move || in_w.write_all(&text));
    let (done, seen) = read_events(out_r, on_event)?;
    let ended = wait_ended(client, req, seen)?;
    timings::mark("cli.answered");
    timings::extend(ended.started.timings.clone().unwrap_or_default());
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("input thread panicked")));
    let exit = Some(ended.exit);
    let launched = ended.reflection.as_ref().filter(|r| r.launched);
    let reflection = launched.map(|r| TurnEvent::Reflection {
        trigger: r.trigger.clone().unwrap_or_else(|| "automatic".into()),
        waits: session.is_embedded(),
    });
    wait_briefly(relay.thread, relay.ended);
    if ended.cancelled {
        let done = TurnEvent::Done {
            stop_reason: "cancelled".into(),
            text: String::new(),
            steps: 0,
            usage: Default::default(),
        };
        on_event(&done);
        return Ok(done);
    }
    if done.is_none() {
        fed.context("cannot hand the turn to the agent process")?;
    }
    if let Some(r) = &reflection {
        on_event(r);
    }
    done.with_context(|| {
        format!(
            "the agent process ended without finishing the turn (exit {}); the conversation is intact",
            match exit {
                Some(ChildEnd::Exited { code }) => code.to_string(),
                Some(ChildEnd::Killed { signal }) => format!("signal {signal}"),
                None => "unknown".into(),
            }
        )
    })
}

/// A turn child's stdio: the ends handed to the supervisor with the
/// request, and the ends this process keeps.
struct ChildStdio {
    /// The child's stdin, stdout and stderr.
    passed: [OwnedFd; 3],
    /// The turn's input goes in here.
    input: std::io::PipeWriter,
    /// The turn's events come out here.
    events: std::io::PipeReader,
}

/// The thread relaying a turn child's stderr, and its signal that it ended.
struct ErrRelay {
    thread: std::thread::JoinHandle<()>,
    ended: std::sync::mpsc::Receiver<()>,
}

impl ChildStdio {
    /// Pipes for a turn child's stdio, its stderr relayed from now on.
    fn open() -> anyhow::Result<(Self, ErrRelay)> {
        let (in_r, in_w) = std::io::pipe()?;
        let (out_r, out_w) = std::io::pipe()?;
        // Not our stderr: the child's errors are relayed, cleaned of control
        // sequences, so the operator's terminal is never the child's.
        let (err_r, err_w) = std::io::pipe()?;
        let in_r = OwnedFd::from(in_r);
        let out_w = OwnedFd::from(out_w);
        let err_w = OwnedFd::from(err_w);
        let (relayed, relay_err) = std::sync::mpsc::channel::<()>();
        let relay = std::thread::spawn(move || {
            relay_child_errors(err_r);
            let _ = relayed.send(());
        });
        let stdio = Self {
            passed: [in_r, out_w, err_w],
            input: in_w,
            events: out_r,
        };
        let relay = ErrRelay {
            thread: relay,
            ended: relay_err,
        };
        Ok((stdio, relay))
    }
}

/// Send the `turn.run` request with the child's stdio attached; its id.
/// A supervisor that went away before reading it has not taken the turn.
fn send_turn(
    client: &mut Client,
    place: &TurnPlace<'_>,
    input: &TurnInput,
    passed: &[OwnedFd; 3],
) -> anyhow::Result<u64> {
    // Marked as the request is handed to the socket: the supervisor may
    // read it before this thread runs again.
    timings::mark("cli.sent");
    let sent = client.send_request_with_fds(
        Call::TurnRun(TurnParams {
            agent: Some(place.agent.to_string()),
            workspace: place.workspace.map(|w| w.display().to_string()),
            isolation: Some(place.isolation.to_string()),
            model: input.model.clone(),
            conversation: place.conversation.to_string(),
            context_window: input.context_window_override,
            reflection_context_window: input.reflection_context_window,
            wait_owner_secs: place.wait_owner,
            timings: input.timings,
        }),
        &passed.each_ref().map(|fd| fd.as_raw_fd()),
    );
    match sent {
        Ok(r) => Ok(r),
        Err(ClientError::Io(_) | ClientError::Closed) => Err(NotTaken.into()),
        Err(e) => Err(e.into()),
    }
}

/// The response to `turn.run` (`req`), which comes when the child has
/// exited; `seen` event lines came before it. A supervisor that went away
/// before any came, or a draining one, has not taken the turn.
fn wait_ended(client: &mut Client, req: u64, seen: usize) -> anyhow::Result<replies::TurnEnded> {
    match client.wait_reply_with(req, "turn.run", |_| {}) {
        Ok(v) => Ok(v),
        Err(ClientError::Io(_) | ClientError::Closed) if seen == 0 => Err(NotTaken.into()),
        // A draining supervisor read it and said so.
        Err(e) if e.code() == Some(ErrorCode::NotTaken) => Err(NotTaken.into()),
        Err(e) => Err(e.into()),
    }
}

/// The child's stderr, relayed cleaned of control sequences, so the
/// operator's terminal is never the child's. Capped lines: an endless line
/// from the child must not grow the operator's process.
fn relay_child_errors(err_r: std::io::PipeReader) {
    for line in LogLines::resuming(BufReader::new(err_r), LinePos::default(), CHILD_ERR_LINE) {
        match line {
            Ok(Line::Text { bytes, .. }) => {
                eprintln!("{}", clean(&String::from_utf8_lossy(&bytes)));
            }
            Ok(Line::TooLong { len, .. }) => {
                eprintln!("(a line of {len} bytes from the agent was not shown)");
            }
            Err(_) => break,
        }
    }
}

/// The turn's events as they come, each handed to `on_event`: the `done`
/// event, and how many lines came at all (none means the turn never
/// started). Events are capped as log lines are: a message the turn may
/// store fits, an endless line is skipped without being held.
fn read_events(
    out_r: std::io::PipeReader,
    on_event: &mut dyn FnMut(&TurnEvent),
) -> anyhow::Result<(Option<TurnEvent>, usize)> {
    let mut done = None;
    let mut seen = 0usize;
    for line in LogLines::new(BufReader::new(out_r)) {
        let line = match line? {
            Line::Text { bytes, .. } => String::from_utf8_lossy(&bytes).into_owned(),
            Line::TooLong { len, .. } => {
                seen += 1;
                eprintln!("(an event of {len} bytes from the agent was not shown)");
                continue;
            }
        };
        seen += 1;
        match serde_json::from_str::<TurnEvent>(&line) {
            // The child's marks join this command's (checked there).
            Ok(TurnEvent::Timings { marks }) => timings::extend(marks),
            Ok(e) => {
                on_event(&e);
                if matches!(e, TurnEvent::Done { .. }) {
                    timings::mark("cli.done_event");
                    done = Some(e);
                }
            }
            Err(_) => eprintln!("{}", clean(&line)),
        }
    }
    Ok((done, seen))
}

/// The child's stderr closes with it; a lingering descendant could keep it
/// open, so wait only briefly — but do wait: the error that ended it is there.
/// Woken by the relay's own signal when it ends (a poll would add its
/// interval to every turn).
fn wait_briefly(relay: std::thread::JoinHandle<()>, relayed: std::sync::mpsc::Receiver<()>) {
    if relayed
        .recv_timeout(std::time::Duration::from_secs(2))
        .is_ok()
    {
        let _ = relay.join();
    }
}
