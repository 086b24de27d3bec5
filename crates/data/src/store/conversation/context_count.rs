//! How many messages a conversation's context holds, counted from
//! `context.json` without keeping its ids.

use std::path::PathBuf;

use serde::Deserialize;

use crate::agentfs::Dir;
use crate::paths::{AgentPaths, CONTEXT_FILE_NAME};

use super::dir::{MAX_JSON_BYTES, open_dir, read_optional};
use super::error::ConversationError;
use super::log_read::parse_failure;

/// How many messages of conversation `id` are in the model's context:
/// the ids its context file lists, else `messages` (every message, as
/// [`Conversation::context_ids`](super::Conversation::context_ids) has it).
pub fn in_context_count(
    agent: &AgentPaths,
    id: &str,
    messages: usize,
) -> Result<usize, ConversationError> {
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(messages);
    };
    let counted = count_context_ids(&dir, agent.conversation(id)?.context_json())?;
    Ok(counted.unwrap_or(messages))
}

/// How many ids `context.json` lists (`None` without one), counted as
/// they are parsed: a file of many tiny ids never becomes many strings.
fn count_context_ids(dir: &Dir, path: PathBuf) -> Result<Option<usize>, ConversationError> {
    struct Count(usize);
    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_seq(Count(0))
        }
    }
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = Count;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of message ids")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
            let mut n = 0;
            while seq.next_element::<IdStr>()?.is_some() {
                n += 1;
            }
            Ok(Count(n))
        }
    }
    /// A string, looked at and dropped.
    struct IdStr;
    impl<'de> Deserialize<'de> for IdStr {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(IdStr)
        }
    }
    impl serde::de::Visitor<'_> for IdStr {
        type Value = IdStr;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a message id")
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<IdStr, E> {
            Ok(IdStr)
        }
    }
    #[derive(Deserialize)]
    struct Counted {
        in_context_message_ids: Count,
    }
    let Some(bytes) = read_optional(dir, CONTEXT_FILE_NAME, MAX_JSON_BYTES)? else {
        return Ok(None);
    };
    serde_json::from_slice::<Counted>(&bytes)
        .map(|c| Some(c.in_context_message_ids.0))
        .map_err(|e| ConversationError::Corrupt {
            path,
            message: parse_failure(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::Home;
    use crate::store::conversation::Conversation;
    use crate::store::conversation::tests::msg;

    #[test]
    fn context_ids_are_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "c").unwrap();
        for t in ["a", "b", "c"] {
            let m = msg(&mut c, t);
            c.append(m).unwrap();
        }
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 3);
        c.remove_from_context("msg-000002").unwrap();
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 2);
        c.write_file(CONTEXT_FILE_NAME, br#"{"in_context_message_ids": [1]}"#)
            .unwrap();
        assert!(in_context_count(&agent, "c", 3).is_err());
        let d = agent
            .conversation("c")
            .unwrap()
            .dir()
            .join(CONTEXT_FILE_NAME);
        std::fs::remove_file(d).unwrap();
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 3);
    }
}
