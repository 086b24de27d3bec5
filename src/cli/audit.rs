//! `mini-letta audit …`, `mini-letta usage` and `agent set-budget`: reading
//! and checking the audit log, usage per agent, and token budgets.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::globals::Globals;
use crate::audit::{self, budget, read, verify};
use crate::console::output::{self, Table, field as f};
use crate::paths::Home;
use crate::store;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute the hash chain over every record (and rolled-over file):
    /// exit 0 with the record count and the head, exit 1 naming the first
    /// record edited, removed, reordered or torn.
    #[command(after_help = "Examples:
  mini-letta audit verify
  mini-letta audit verify --head \"$(cat saved-head)\" --json
  mini-letta audit verify --against ~/audit-heads")]
    Verify {
        /// A head saved earlier (`audit head`, `HEX`; or `SEQ:HEX` from
        /// `audit head --seq`, which also tells a rewritten record from a
        /// cut tail): it must be on the chain. Keep it where the agents'
        /// tenants cannot write.
        #[arg(long, value_name = "[SEQ:]HEX", conflicts_with = "against")]
        head: Option<String>,
        /// A file of published heads (`[audit] publish` in config.toml,
        /// or `audit head --publish FILE`): the log must still hold the
        /// latest of them, unaltered.
        #[arg(long, value_name = "FILE")]
        against: Option<std::path::PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the current head: the sha256 of the last record's line.
    #[command(after_help = "Examples:
  mini-letta audit head > saved-head
  mini-letta audit head --publish ~/audit-heads
  mini-letta audit head --json")]
    Head {
        /// Print {"seq", "head"} as JSON.
        #[arg(long)]
        json: bool,
        /// Print `SEQ:HEX` (the record's number with its hash), for
        /// `audit verify --head`.
        #[arg(long)]
        seq: bool,
        /// Also append `SEQ:HEX TIME` to FILE (created 0600; a symlink is
        /// refused): keep it where the agents' tenants cannot write, and
        /// check with `audit verify --against FILE`. The supervisor does
        /// this itself when `[audit] publish` names a file.
        #[arg(long, value_name = "FILE")]
        publish: Option<std::path::PathBuf>,
    },
    /// Print records, oldest first.
    #[command(after_help = "Examples:
  mini-letta audit log -a owl --kind model --since 1d
  mini-letta audit log --json | jq .kind")]
    Log {
        /// Only this agent's records (id or name; default: every agent).
        #[arg(short = 'a', long = "agent", value_name = "A")]
        agent: Option<String>,
        /// Only records of this kind (spawn, exit, tool, commit, merge,
        /// sync, model, denied, budget, config, start, torn, owner).
        #[arg(long, value_name = "K")]
        kind: Option<String>,
        /// Only records since T: an RFC 3339 time, a date, or an age (30m, 12h, 7d).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Print each record's line exactly as stored.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  mini-letta usage
  mini-letta usage -a owl --since 2025-01-01 --json")]
pub struct UsageArgs {
    /// Only this agent (id or name; default: every agent).
    #[arg(short = 'a', long = "agent", value_name = "A")]
    agent: Option<String>,
    /// Only usage since T: an RFC 3339 time, a date, or an age (30m, 12h, 7d).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Print {"agents": [...]} as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cli: &Globals, cmd: &AuditCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    match cmd {
        AuditCommand::Verify {
            head,
            against,
            json,
        } => verify_cmd(&home, head.as_deref(), against.as_deref(), *json),
        AuditCommand::Head { json, seq, publish } => {
            let head = verify::head(&home)?;
            if let (Some(to), Some((n, h))) = (publish, &head) {
                crate::audit::publish::append(to, *n, h)?;
            } else if publish.is_some() {
                anyhow::bail!("the audit log is empty: no head to publish");
            }
            if *json {
                let (seq, head) = head.map_or((0, None), |(s, h)| (s, Some(h)));
                output::json(&json!({ "seq": seq, "head": head }))?;
            } else {
                match head {
                    Some((n, h)) if *seq => println!("{n}:{h}"),
                    Some((_, h)) => println!("{h}"),
                    None => println!("the audit log is empty"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Log {
            agent,
            kind,
            since,
            json,
        } => log_cmd(
            &home,
            agent.as_deref(),
            kind.clone(),
            since.as_deref(),
            *json,
        ),
    }
}

fn verify_cmd(
    home: &Home,
    head: Option<&str>,
    against: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let want = match (head, against) {
        (Some(h), _) => Some(verify::SavedHead::parse(h).with_context(|| {
            format!(
                "--head {:?} is not a sha256 in lowercase hex (64 digits), optionally after its record's number (SEQ:HEX)",
                h
            )
        })?),
        (None, Some(file)) => Some(
            crate::audit::publish::latest(file)
                .with_context(|| format!("--against {}", file.display()))?
                .0,
        ),
        (None, None) => None,
    };
    let report = verify::verify_against(home, want)?;
    let disk = crate::audit::reserve::of_home(home);
    let at_reserve = disk.is_some_and(|(free, reserve)| free < reserve);
    if json {
        let mut v = serde_json::to_value(&report)?;
        if let (Some(o), Some((free, reserve))) = (v.as_object_mut(), disk) {
            o.insert(
                "disk".into(),
                json!({ "free_bytes": free, "reserve_bytes": reserve, "at_reserve": at_reserve }),
            );
        }
        if let (Some(o), Some(p)) = (v.as_object_mut(), &report.problem) {
            o.insert("ok".into(), json!(false));
            o.insert("bad_seq".into(), json!(p.seq()));
            o.insert("message".into(), json!(p.to_string()));
        } else if let Some(o) = v.as_object_mut() {
            o.insert("ok".into(), json!(true));
        }
        output::json(&v)?;
    } else if let Some(p) = &report.problem {
        eprintln!("{}", output::text(&format!("audit verify: FAILED: {p}")));
    } else {
        let head = report.head.clone().unwrap_or_else(|| "(empty log)".into());
        println!(
            "ok: {} records in {} file(s), chain intact; head {}",
            report.records,
            report.files,
            f(&head)
        );
        for t in &report.torn {
            println!(
                "note: a torn line after seq {} (a crash while appending) is kept and noted by seq {}",
                t.after, t.noted_by
            );
        }
    }
    if let Some((free, reserve)) = disk.filter(|_| at_reserve) {
        // The chain is intact; what the log can still take is not.
        eprintln!(
            "audit verify: warning: the log's disk is down to its reserve ({free} bytes free, \
             {reserve} kept for records of what already happened): every child's action is \
             refused until space is freed"
        );
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// An agent selector as the id records carry.
fn agent_id(home: &Home, agent: Option<&str>) -> anyhow::Result<Option<String>> {
    agent
        .map(|a| match store::find(home, Some(a)) {
            Ok((r, _)) => Ok(r.id),
            // A deleted agent's records stay: its id still selects them.
            Err(_) if crate::paths::is_valid_agent_id(a) => Ok(a.to_string()),
            Err(e) => Err(e.into()),
        })
        .transpose()
}

fn filter(
    home: &Home,
    agent: Option<&str>,
    kind: Option<String>,
    since: Option<&str>,
) -> anyhow::Result<read::Filter> {
    Ok(read::Filter {
        agent: agent_id(home, agent)?,
        kind,
        since: since
            .map(read::parse_since)
            .transpose()
            .map_err(anyhow::Error::msg)?,
    })
}

fn log_cmd(
    home: &Home,
    agent: Option<&str>,
    kind: Option<String>,
    since: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let filter = filter(home, agent, kind, since)?;
    let names = agent_names(home);
    let mut table = Table::new(&["SEQ", "TIME", "KIND", "AGENT", "ROLE", "DETAILS"]).right(0);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed = None;
    read::for_each(home, |line, v| {
        if !filter.matches(v) {
            return std::ops::ControlFlow::Continue(());
        }
        if json {
            use std::io::Write;
            if let Err(e) = out.write_all(line).and_then(|()| out.write_all(b"\n")) {
                failed = Some(e);
                return std::ops::ControlFlow::Break(());
            }
        } else {
            table.row(vec![
                v.seq.to_string(),
                output::display_stored_time(&v.time),
                v.kind.clone(),
                // The name a person knows, where the agent still exists.
                match &v.agent {
                    Some(id) => names.get(id).cloned().unwrap_or_else(|| id.clone()),
                    None => "-".into(),
                },
                v.role.clone().unwrap_or_else(|| "-".into()),
                details(line),
            ]);
        }
        std::ops::ControlFlow::Continue(())
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    drop(out);
    if !json {
        table.print()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The home's agents' names by id (a deleted agent's records keep its id).
fn agent_names(home: &Home) -> std::collections::BTreeMap<String, String> {
    store::list(home)
        .map(|l| l.into_iter().map(|r| (r.id, r.name)).collect())
        .unwrap_or_default()
}

/// The fields a record has beyond the common ones, as `key=value`.
fn details(line: &[u8]) -> String {
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(line) else {
        return String::new();
    };
    m.iter()
        .filter(|(k, v)| {
            !matches!(
                k.as_str(),
                "seq" | "prev" | "time" | "kind" | "agent" | "role"
            ) && !v.is_null()
        })
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn usage(cli: &Globals, args: &UsageArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let filter = filter(&home, args.agent.as_deref(), None, args.since.as_deref())?;
    let mut by_agent = read::usage(&home, &filter)?;
    // An agent named but without records yet still gets its (zero) line.
    if let Some(a) = &filter.agent {
        by_agent.entry(a.clone()).or_insert_with(|| read::Usage {
            agent: a.clone(),
            ..read::Usage::default()
        });
    }
    // Bytes through the egress proxy come from the audit log's `egress`
    // records (the network log rotates; a tenant could make it forget).
    let names = agent_names(&home);
    if args.json {
        let agents: Vec<Value> = by_agent
            .values()
            .map(|u| {
                let mut v = serde_json::to_value(u).unwrap_or_default();
                v["name"] = json!(names.get(&u.agent));
                v
            })
            .collect();
        output::json(&json!({ "since": filter.since, "agents": agents }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if by_agent.is_empty() {
        println!("no usage recorded");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&[
        "AGENT",
        "NAME",
        "TURNS",
        "MODEL CALLS",
        "IN TOKENS",
        "OUT TOKENS",
        "TOOL CALLS",
        "CPU MS",
        "PEAK MEMORY",
        "EGRESS BYTES",
    ]);
    for u in by_agent.values() {
        table.row(vec![
            u.agent.clone(),
            names.get(&u.agent).cloned().unwrap_or_else(|| "-".into()),
            u.turns.to_string(),
            u.model_calls.to_string(),
            u.input_tokens.to_string(),
            u.output_tokens.to_string(),
            u.tool_calls.to_string(),
            u.cpu_ms.to_string(),
            u.peak_memory_bytes.to_string(),
            u.egress_bytes.to_string(),
        ]);
    }
    table.print()?;
    Ok(ExitCode::SUCCESS)
}

/// `agent set-budget`: set or clear, then a `config` record.
pub(crate) fn set_budget(
    home: &Home,
    agent: &str,
    tokens: Option<u64>,
    period: budget::Period,
    clear: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (record, _) = store::find(home, Some(agent))?;
    let new = match (tokens, clear) {
        (_, true) => None,
        (Some(n), false) => Some(budget::Budget { tokens: n, period }),
        (None, false) => anyhow::bail!("give --tokens N, or --clear to remove the budget"),
    };
    budget::set(home, &record.id, new)?;
    let mut fields = Map::new();
    fields.insert("setting".into(), json!("budget"));
    fields.insert("value".into(), json!(new));
    audit::append(
        home,
        audit::kind::CONFIG,
        Some(&record.id),
        Some("cli"),
        fields,
    )?;
    if json {
        output::json(&json!({ "agent": record.id, "name": record.name, "budget": new }))?;
    } else {
        match new {
            Some(b) => println!(
                "agent {} ({}): budget {} tokens per {}",
                f(&record.name),
                f(&record.id),
                b.tokens,
                b.period.as_str()
            ),
            None => println!("agent {} ({}): no budget", f(&record.name), f(&record.id)),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A `config` record for a policy change made from the command line.
pub(crate) fn record_config(
    home: &Home,
    agent: &str,
    setting: &str,
    value: Value,
) -> anyhow::Result<()> {
    let mut fields = Map::new();
    fields.insert("setting".into(), json!(setting));
    fields.insert("value".into(), value);
    audit::append(home, audit::kind::CONFIG, Some(agent), Some("cli"), fields)?;
    Ok(())
}
