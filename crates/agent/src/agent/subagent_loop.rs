//! A sub-agent's run, inside its confined child (`mini-letta-agent
//! subagent`): ask the supervisor for the task it recorded at launch, run
//! model steps with the task's tools in the task's memory directory (the
//! child's worktree), and leave the final text as the report. The
//! supervisor merges (or discards) the worktree when the child exits; the
//! exit status says whether the run completed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::tools::{self, ToolContext};
use crate::paths::AgentPaths;
use crate::protocol::Call;
use crate::protocol::client::{Client, ClientError};
use crate::protocol::messages::{Message, ModelFailure, ModelRequest, Part, Purpose, Role};
use crate::protocol::task::{SubagentTask, clip_report};

#[derive(Debug, thiserror::Error)]
pub enum SubagentError {
    #[error("cannot get this sub-agent's task from the supervisor: {0}")]
    Task(String),
    #[error("the model failed: {0}")]
    Model(ModelFailure),
    #[error("the sub-agent stopped after {0} steps without finishing")]
    MaxSteps(u32),
    #[error("its last memory edit failed: {0}")]
    MemoryEdit(String),
    /// A worker's uncommitted files are not merged: the run did not
    /// finish its job, whatever its last words say.
    #[error("it left {count} uncommitted file(s) in its worktree ({}); they are not merged", .named.join(", "))]
    Uncommitted { count: usize, named: Vec<String> },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub steps: u32,
    pub report: String,
}

/// Fetch the task and run it; the report is left with the supervisor.
pub fn run(agent: &AgentPaths, channel: Arc<Mutex<Client>>) -> Result<Finished, SubagentError> {
    let task = fetch_task(&channel)?;
    let result = run_task(agent, &task, channel.clone());
    let report = match &result {
        Ok(f) => f.report.clone(),
        Err(e) => format!("error: {e}"),
    };
    let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
    let _ = client.call_as::<crate::protocol::replies::Kept>(Call::TaskFinish {
        report: clip_report(&report),
    });
    result
}

fn fetch_task(channel: &Arc<Mutex<Client>>) -> Result<SubagentTask, SubagentError> {
    let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
    client.call_as(Call::TaskGet {}).map_err(|e| match e {
        ClientError::Remote(body) => SubagentError::Task(body.message),
        other => SubagentError::Task(other.to_string()),
    })
}

/// What a sub-agent's `Read` may read besides its memory: a reflection's
/// payload files (its prompt names them; its profile grants them
/// read-only).
fn read_roots(agent: &AgentPaths, task: &SubagentTask) -> Vec<PathBuf> {
    if task.kind == crate::protocol::task::KIND_REFLECTION {
        vec![agent.reflection_payloads_dir()]
    } else {
        Vec::new()
    }
}

/// The step loop: one model request per step; tool calls run and their
/// results go back; a response without tool calls ends the run.
pub(crate) fn run_task(
    agent: &AgentPaths,
    task: &SubagentTask,
    channel: Arc<Mutex<Client>>,
) -> Result<Finished, SubagentError> {
    let ctx = ToolContext {
        agent: agent.clone(),
        agent_id: String::new(),
        conversation_id: task.fork_conversation.clone().unwrap_or_default(),
        workspace: None,
        channel: channel.clone(),
        worktree: (!task.memory_dir.is_empty()).then(|| PathBuf::from(&task.memory_dir)),
        read_only: task.memory_dir.is_empty(),
        read_roots: read_roots(agent, task),
    };
    let specs = tools::specs_named(&task.tools, task.context_window);
    // A forked sub-agent starts from its parent conversation's context
    // (read as it is on disk; nothing is written to it).
    let mut messages = match &task.fork_conversation {
        Some(id) => forked_context(agent, id)?,
        None => Vec::new(),
    };
    messages.push(Message {
        role: Role::User,
        parts: vec![Part::Text {
            text: task.prompt.clone(),
        }],
    });
    let mut last_text = String::new();
    // A memory edit that failed and was not followed by one that worked:
    // the run did not do its job, whatever its last words say.
    let mut failed_edit: Option<String> = None;
    for step in 1..=task.max_steps.max(1) {
        let request = ModelRequest {
            model: String::new(),
            system: task.system.clone(),
            messages: messages.clone(),
            tools: specs.clone(),
            max_tokens: None,
            purpose: Purpose::Reflection,
            context_window: task.context_window,
        };
        let response = {
            let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
            client.model_complete(&request, |_| {})
        }
        .map_err(SubagentError::Model)?;
        let text = response.text();
        if !text.is_empty() {
            last_text = text;
        }
        let calls = response.tool_calls();
        messages.push(Message {
            role: Role::Assistant,
            parts: response.parts.clone(),
        });
        if calls.is_empty() {
            if let Some(e) = failed_edit {
                return Err(SubagentError::MemoryEdit(e));
            }
            if task.kind == crate::protocol::task::KIND_MEMORY_WORKER {
                check_committed(&channel)?;
            }
            return Ok(Finished {
                steps: step,
                report: last_text,
            });
        }
        let mut results = Vec::new();
        for (call_id, name, arguments) in calls {
            // Only the task's tools run, whatever the model asks for.
            let out = if task.tools.contains(&name) {
                tools::execute(&ctx, &name, &arguments)
            } else {
                tools::ToolOutput {
                    text: format!("{name} is not available to this sub-agent"),
                    is_error: true,
                }
            };
            if name == "memory" {
                failed_edit = out.is_error.then(|| out.text.clone());
            }
            results.push(Part::ToolResult {
                call_id,
                name,
                text: out.text,
                is_error: out.is_error,
            });
        }
        messages.push(Message {
            role: Role::Tool,
            parts: results,
        });
    }
    Err(SubagentError::MaxSteps(task.max_steps))
}

/// A memory worker ends with everything committed: the supervisor merges
/// its branch and throws the rest of its worktree away. `memory.status`
/// answers for this child's own worktree (the supervisor's record of it).
fn check_committed(channel: &Arc<Mutex<Client>>) -> Result<(), SubagentError> {
    let mut client = channel.lock().unwrap_or_else(|p| p.into_inner());
    let status: crate::protocol::replies::MemoryStatus = client
        .call_as(Call::MemoryStatus { agent: None })
        .map_err(|e| SubagentError::Task(format!("cannot read its worktree's status: {e}")))?;
    let dirty = status.dirty;
    // Named up to a few: the report is a short record, not a listing.
    const NAMED: usize = 10;
    match dirty.len() {
        0 => Ok(()),
        count => Err(SubagentError::Uncommitted {
            count,
            named: dirty.into_iter().take(NAMED).collect(),
        }),
    }
}

/// The context of conversation `id`, as model messages. A context that
/// ends on a request waiting for its tool results (the parent is in the
/// middle of the tool call that started this sub-agent) gets them as
/// "pending", so the model sees a well-formed conversation.
fn forked_context(agent: &AgentPaths, id: &str) -> Result<Vec<Message>, SubagentError> {
    let conv = crate::store::conversation::Conversation::open_existing(agent, id)
        .map_err(|e| SubagentError::Task(format!("cannot read conversation {id}: {e}")))?
        .ok_or_else(|| SubagentError::Task(format!("no conversation {id}")))?;
    let mut messages: Vec<Message> = conv
        .context()
        .map_err(|e| SubagentError::Task(format!("cannot read conversation {id}: {e}")))?
        .iter()
        .map(|m| m.to_message())
        .collect();
    if let Some(last) = messages.last()
        && last.role == Role::Assistant
    {
        let pending: Vec<Part> = last
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall { id, name, .. } => Some(Part::ToolResult {
                    call_id: id.clone(),
                    name: name.clone(),
                    text: "(pending: this sub-agent is answering it)".into(),
                    is_error: false,
                }),
                _ => None,
            })
            .collect();
        if !pending.is_empty() {
            messages.push(Message {
                role: Role::Tool,
                parts: pending,
            });
        }
    }
    Ok(messages)
}
