//! The memory commands that commit: one write operation through the
//! agent's writer under its memory lease, `--block-value`'s blocks, and
//! `memory commit-loop`.

use std::process::ExitCode;

use anyhow::{Context, bail};

use super::args::AgentArg;
use crate::cli::globals::Globals;
use crate::console::output;
use crate::memfs::commit::{CommitOptions, CommitOutcome};
use crate::memfs::ops::{OpError, Writer};
use crate::memfs::{pathrules, repo};
use crate::protocol::timings;
use crate::store;

/// The agent's writer: its repository, its signature, policy and approval
/// from the repository and environment, and the hook kept current.
fn writer(cli: &Globals, target: &AgentArg) -> anyhow::Result<Writer> {
    let (record, paths) = store::find(&cli.home()?, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    writer_for(&record, &paths)
}

fn writer_for(
    record: &store::record::AgentRecord,
    paths: &crate::paths::AgentPaths,
) -> anyhow::Result<Writer> {
    let repo = repo::open_agent(paths)?;
    timings::mark("cli.repo_open");
    let author = store::agent_signature(record)?;
    let opts = CommitOptions::from_env(&repo);
    Ok(Writer::new(repo, author, opts)?)
}

/// With a supervisor running, its children may be editing this agent's
/// memory: take the agent's memory lease for the length of the edit and
/// commit (it ends with the returned connection).
fn lease(
    home: &crate::paths::Home,
    agent: &str,
) -> anyhow::Result<Option<crate::protocol::client::Client>> {
    let Ok(mut client) = crate::supervisor::connect(home) else {
        return Ok(None);
    };
    timings::mark("cli.connected");
    client
        .call_as::<crate::protocol::replies::Leased>(crate::protocol::Call::MemoryLease {
            agent: Some(agent.to_string()),
        })
        .context("cannot take the agent's memory lease from the supervisor")?;
    timings::mark("cli.lease_taken");
    Ok(Some(client))
}

/// Set block `label` (`LABEL.md`) of a new agent to `text`, committed
/// as the memory commands commit (letta-code's `--block-value`).
pub(crate) fn set_block(
    home: &crate::paths::Home,
    record: &store::record::AgentRecord,
    label: &str,
    text: &str,
) -> anyhow::Result<()> {
    let path = pathrules::check_relative(&format!("{label}.md"))?;
    let (record, paths) = store::find(home, Some(&record.id))?;
    let _lease = lease(home, &record.id)?;
    let w = writer_for(&record, &paths)?;
    let exists = paths.memory_dir().join(&path).is_file();
    let done = if exists {
        w.set_body(&path, text)
    } else {
        w.create(&path, label, text)
    };
    done.map_err(|e| anyhow::anyhow!("--block-value {label}: {e}"))?;
    Ok(())
}

/// The body `memory create --body-file F` names (`-`: standard input),
/// read up to one byte past what a memory file may hold so that an
/// oversized one is refused by the validator, not truncated.
pub(crate) fn read_body_file(f: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let limit = crate::memfs::validate::MAX_FILE_BYTES + 1;
    let mut bytes = Vec::new();
    let read = if f == std::path::Path::new("-") {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(f).and_then(|file| file.take(limit).read_to_end(&mut bytes))
    };
    read.with_context(|| format!("--body-file {}", f.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--body-file {}: not UTF-8 text", f.display()))
}

/// Run one write operation; a refusal prints the validator's block.
pub(crate) fn write_op(
    cli: &Globals,
    target: &AgentArg,
    json: bool,
    op: &str,
    f: impl FnOnce(&Writer) -> Result<CommitOutcome, OpError>,
) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let (record, paths) = store::find(&home, target.agent.as_deref())?;
    timings::mark("cli.agent_found");
    let _lease = lease(&home, &record.id)?;
    let w = writer_for(&record, &paths)?;
    timings::mark("cli.writer_open");
    let done = f(&w);
    timings::mark("cli.op_done");
    match done {
        Ok(outcome) if json => {
            output::json(&serde_json::json!({
                "agent": record.id,
                "name": record.name,
                "op": op,
                "commit": outcome.commit.map(|c| c.to_string()),
                "changed": outcome.changed,
            }))?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(outcome) => {
            match outcome.commit {
                Some(id) => {
                    let changed: Vec<_> =
                        outcome.changed.iter().map(|p| output::field(p)).collect();
                    println!("committed {id} ({})", changed.join(", "))
                }
                None => println!("nothing to commit: no changes"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.report() {
            Some(report) => {
                if json {
                    output::json(&serde_json::json!({
                        "agent": record.id,
                        "name": record.name,
                        "op": op,
                        "commit": null,
                        "refused": true,
                        "violations": report.messages(),
                    }))?;
                }
                eprint!("{}", output::text_block(&report.render_for_operator()));
                crate::console::style::eprint_error(&format!(
                    "memory {op}: refused by the memory validator; nothing was committed and the working tree is as before"
                ));
                Ok(ExitCode::FAILURE)
            }
            // Messages that already name the operation get no prefix.
            None if e.to_string().starts_with("memory ") => Err(e.into()),
            None => Err(anyhow::Error::new(e).context(format!("memory {op}"))),
        },
    }
}

pub(crate) fn commit_loop(
    cli: &Globals,
    target: &AgentArg,
    path: &str,
    count: usize,
    reject_every: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let w = writer(cli, target)?;
    let rel = pathrules::check_relative(path)?;
    // The working tree is the agent's: written from its parent directory's
    // descriptor, never through a path a swapped symlink could redirect.
    let root = crate::agentfs::Dir::open(w.work_tree())?;
    let (dir, leaf) = root.open_parent(std::ffi::OsStr::new(&rel))?;
    let name = crate::memfs::template::name_from_label(path);
    let pid = std::process::id();
    let paths = [path.to_string()];
    let (mut committed, mut rejected) = (0usize, 0usize);
    let start = std::time::Instant::now();
    for i in 0..count {
        if reject_every.is_some_and(|k| k > 0 && i % k == 0) {
            dir.replace_file(
                leaf,
                format!("no frontmatter, iteration {i}\n").as_bytes(),
                0o644,
            )?;
            match w.commit(&paths, &format!("memory commit-loop: {path} invalid #{i}")) {
                Err(e) if e.report().is_some() => rejected += 1,
                Err(e) => return Err(e.into()),
                Ok(_) => bail!("{path}: an invalid write was committed at iteration {i}"),
            }
        }
        let text = format!(
            "---\nname: {name}\ndescription: Stress file.\n---\niteration {i} of process {pid}\n"
        );
        dir.replace_file(leaf, text.as_bytes(), 0o644)?;
        let outcome = w.commit(&paths, &format!("memory commit-loop: {path} #{i}"))?;
        if outcome.commit.is_none() {
            bail!("{path}: iteration {i} changed nothing");
        }
        committed += 1;
    }
    output::json(&serde_json::json!({
        "committed": committed,
        "rejected": rejected,
        "millis": start.elapsed().as_secs_f64() * 1000.0,
    }))?;
    Ok(ExitCode::SUCCESS)
}
