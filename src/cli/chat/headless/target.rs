//! Which agent and conversation a headless session works on, found (or
//! made) as letta-code finds them from its flags.

use anyhow::bail;

use crate::cli::chat::args::ChatArgs;
use crate::paths::{AgentPaths, Home};
use crate::store;
use crate::store::record::AgentRecord;

/// The agent and conversation a headless session works on.
pub(crate) struct Target {
    pub record: AgentRecord,
    pub agent: AgentPaths,
    pub conversation: String,
}

/// Which agent and conversation the flags name, as letta-code decides:
/// `--conversation conv-…` alone finds its agent, `--conversation agent-…`
/// is that agent's default conversation, `--new` a new `conv-…`,
/// `--new-agent` a new agent. An unknown agent or conversation is an error
/// at once (the SDK reports it as the session's failure to start).
pub(crate) fn target(home: &Home, args: &ChatArgs) -> anyhow::Result<Target> {
    let h = &args.headless;
    let mut selector = args.agent.clone();
    let mut conversation = args.conversation.clone();
    if conversation.starts_with("agent-") {
        if selector.is_some() {
            bail!(
                "--conversation {conversation} names an agent; with --agent, name a conversation"
            );
        }
        selector = Some(std::mem::replace(&mut conversation, "default".into()));
    }
    if h.new && conversation != "default" {
        bail!("--new starts a new conversation; it cannot be combined with --conversation");
    }
    let (record, agent) = if h.new_agent {
        new_agent(home, args)?
    } else if selector.is_none() && conversation != "default" {
        owner_of(home, &conversation)?
    } else {
        match store::find(home, selector.as_deref()) {
            Ok(found) => found,
            Err(store::StoreError::NotFound(s)) => bail!("Agent {s} not found"),
            Err(e) => return Err(e.into()),
        }
    };
    if conversation != "default" && !h.new {
        let known = store::conversation::list_ids(&agent)?;
        if !known.contains(&conversation) {
            bail!("Conversation {conversation} not found");
        }
    }
    if h.new {
        conversation = store::new_prefixed_id("conv");
    }
    Ok(Target {
        record,
        agent,
        conversation,
    })
}

/// The agent that has conversation `id`.
fn owner_of(home: &Home, id: &str) -> anyhow::Result<(AgentRecord, AgentPaths)> {
    for record in store::list(home)? {
        let Ok((record, agent)) = store::find(home, Some(&record.id)) else {
            continue;
        };
        if store::conversation::list_ids(&agent).is_ok_and(|ids| ids.iter().any(|c| c == id)) {
            return Ok((record, agent));
        }
    }
    bail!("Conversation {id} not found")
}

/// `--new-agent`: an agent made as `agent create` makes one (named after
/// its id), with the model asked for and the blocks given.
fn new_agent(home: &Home, args: &ChatArgs) -> anyhow::Result<(AgentRecord, AgentPaths)> {
    let name = format!("sdk-{}", &store::new_prefixed_id("x")[2..10]);
    let record = crate::cli::agent_make::create_record(home, &name, args.model.as_deref())?;
    let (record, agent) = store::find(home, Some(&record.id))?;
    for bv in &args.headless.block_value {
        let Some((label, text)) = bv.split_once('=') else {
            bail!("--block-value {bv:?}: expected LABEL=TEXT");
        };
        crate::cli::memory::write::set_block(home, &record, label, text)?;
    }
    Ok((record, agent))
}
