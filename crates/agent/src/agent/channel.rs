//! `mini-letta-agent channel …`: speak to the supervisor from inside a
//! child, over the channel it was started with (`MINI_LETTA_CHANNEL_FD`).
//! Internal: it belongs to the agent-side program, not the user's command.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;
use serde_json::{Value, json};

use crate::console::output;
use crate::protocol::client::{Client, ClientError};
use crate::protocol::{Call, ClientFrame, decode_client};

#[derive(Debug, Subcommand)]
pub enum ChannelCommand {
    /// Send one request and print its result as JSON (exit 1 with the
    /// supervisor's message on stderr when refused).
    Call {
        /// e.g. memory.commit, memory.status, ping, log.
        method: String,
        /// Parameters as a JSON object, e.g. '{"paths":["human.md"],"message":"m"}'.
        params: Option<String>,
    },
    /// Measure request round trips on the channel; print {"count",
    /// "median_us", "p90_us"}.
    Ping {
        /// Round trips to measure.
        #[arg(long, default_value_t = 1000)]
        count: u32,
    },
}

pub fn run(cmd: &ChannelCommand) -> anyhow::Result<ExitCode> {
    let mut client = Client::from_channel_env()?;
    match cmd {
        ChannelCommand::Call { method, params } => {
            let params: Value = match params {
                Some(p) => serde_json::from_str(p).context("params must be a JSON object")?,
                None => json!({}),
            };
            let frame = json!({ "type": "request", "id": 0, "method": method, "params": params });
            let call = match decode_client(frame.to_string().as_bytes()) {
                Ok(ClientFrame::Request { call, .. }) => call,
                Ok(_) => anyhow::bail!("not a request"),
                Err(e) => anyhow::bail!("{e}"),
            };
            match client.call_json(call) {
                Ok(v) => {
                    output::json(&v)?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(ClientError::Remote(body)) => {
                    // The supervisor's refusal may quote the path asked for.
                    eprintln!("{}", output::text_block(body.message.trim_end()));
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => Err(e.into()),
            }
        }
        ChannelCommand::Ping { count } => {
            let mut times = Vec::with_capacity(*count as usize);
            for _ in 0..*count {
                let t = Instant::now();
                client.call_as::<crate::protocol::replies::Pong>(Call::Ping {})?;
                times.push(t.elapsed().as_micros() as u64);
            }
            times.sort_unstable();
            let pick = |q: f64| {
                times
                    .get(((times.len() as f64 - 1.0) * q) as usize)
                    .copied()
                    .unwrap_or(0)
            };
            output::json(&json!({ "count": count, "median_us": pick(0.5), "p90_us": pick(0.9) }))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
