//! Turns in flight: one at a time per conversation, and how a running one
//! is cancelled. Keys are the agent's id (resolved by the supervisor, never
//! a name a caller typed) and the conversation id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

type Key = (String, String);

/// The registry of conversations with a turn running or waiting.
#[derive(Default)]
pub struct Turns {
    locks: Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>,
    /// The running turn of each busy conversation: its cancel token and
    /// its child.
    running: Mutex<HashMap<Key, (CancellationToken, u64)>>,
}

/// A conversation's turn slot, held while its turn runs. Dropping it lets
/// the next waiting turn of the conversation start.
pub struct TurnSlot {
    _guard: OwnedMutexGuard<()>,
}

impl Turns {
    fn lock_of(&self, agent: &str, conversation: &str) -> Arc<AsyncMutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Forget conversations nobody holds or waits for, so the map stays
        // as small as the set of busy conversations.
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks
            .entry((agent.to_string(), conversation.to_string()))
            .or_default()
            .clone()
    }

    /// The slot at once, or `None` when another turn holds it.
    pub fn try_acquire(&self, agent: &str, conversation: &str) -> Option<TurnSlot> {
        self.lock_of(agent, conversation)
            .try_lock_owned()
            .ok()
            .map(|g| TurnSlot { _guard: g })
    }

    /// Wait for the slot.
    pub async fn acquire(&self, agent: &str, conversation: &str) -> TurnSlot {
        let lock = self.lock_of(agent, conversation);
        TurnSlot {
            _guard: lock.lock_owned().await,
        }
    }

    /// Record the running turn's cancel token and child (while its slot is
    /// held).
    pub(crate) fn set_running(
        &self,
        agent: &str,
        conversation: &str,
        token: CancellationToken,
        child: u64,
    ) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.insert(
            (agent.to_string(), conversation.to_string()),
            (token, child),
        );
    }

    /// The child of a conversation's running turn, if one runs.
    pub(crate) fn running_child(&self, agent: &str, conversation: &str) -> Option<u64> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .get(&(agent.to_string(), conversation.to_string()))
            .map(|(_, child)| *child)
    }

    pub(crate) fn clear_running(&self, agent: &str, conversation: &str) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.remove(&(agent.to_string(), conversation.to_string()));
    }

    /// Cancel the running turn of a conversation; false when none runs.
    pub fn cancel(&self, agent: &str, conversation: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match running.get(&(agent.to_string(), conversation.to_string())) {
            Some((t, _)) => {
                t.cancel();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_turn_per_conversation_and_others_run_freely() {
        let turns = Turns::default();
        let a = turns.try_acquire("ag", "c1").unwrap();
        assert!(turns.try_acquire("ag", "c1").is_none());
        assert!(turns.try_acquire("ag", "c2").is_some());
        assert!(turns.try_acquire("other", "c1").is_some());
        drop(a);
        assert!(turns.try_acquire("ag", "c1").is_some());
    }

    #[tokio::test]
    async fn cancel_reaches_only_the_running_turn() {
        let turns = Turns::default();
        assert!(!turns.cancel("ag", "c1"));
        let t = CancellationToken::new();
        turns.set_running("ag", "c1", t.clone(), 7);
        assert_eq!(turns.running_child("ag", "c1"), Some(7));
        assert_eq!(turns.running_child("ag", "c2"), None);
        assert!(!turns.cancel("ag", "c2"));
        assert!(turns.cancel("ag", "c1"));
        assert!(t.is_cancelled());
        turns.clear_running("ag", "c1");
        assert!(!turns.cancel("ag", "c1"));
    }
}
