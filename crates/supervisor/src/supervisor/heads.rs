//! The supervisor's side of published audit heads
//! ([`crate::audit::publish`]): the head every [`PUBLISH_EVERY`] while the
//! log grows, and the last one at stop (the head found at start is
//! published by [`super::accounting::Accounting::start`]).

use std::sync::Arc;

use crate::audit::publish::{PUBLISH_EVERY, publish_if_moved};
use crate::paths::Home;

use super::state::State;

/// Publish the head whenever it moved, every [`PUBLISH_EVERY`].
pub(crate) fn spawn_publisher(state: &Arc<State>) {
    let home = state.home.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            tokio::time::sleep(PUBLISH_EVERY).await;
            last = publish(&home, last).await;
        }
    });
}

/// Publish once more (at stop: the records of the shutdown included).
pub async fn at_stop(home: &Home) {
    publish(home, None).await;
}

async fn publish(home: &Home, last: Option<(u64, String)>) -> Option<(u64, String)> {
    let h = home.clone();
    let prev = last.clone();
    match tokio::task::spawn_blocking(move || publish_if_moved(&h, prev.as_ref())).await {
        Ok(Ok(now)) => now,
        Ok(Err(e)) => {
            tracing::error!("audit: cannot publish the head: {e}");
            last
        }
        Err(e) => {
            tracing::error!("audit: cannot publish the head: {e}");
            last
        }
    }
}
