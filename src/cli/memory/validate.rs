//! `mini-letta memory validate`: the memory validator on the staged index
//! (as git's pre-commit hook runs it) or on a committed revision.

use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use super::args::ValidateArgs;
use crate::cli::globals::Globals;
use crate::console::output;
use crate::memfs::hook::{self, EnsureMode};
use crate::memfs::repo;
use crate::memfs::validate::{
    TreeSnapshot, ValidateError, ValidateOptions, audit_revision,
    constraints_update_approved_from_env, validate,
};
use crate::store;

/// Exit code of `memory validate` when the repository cannot be judged.
const EXIT_CANNOT_VALIDATE: u8 = 2;

pub(crate) fn validate_cmd(cli: &Globals, args: &ValidateArgs) -> ExitCode {
    match validate_inner(cli, args) {
        Ok(code) => code,
        Err(e) => {
            crate::console::style::eprint_error(&crate::console::one_line(&e));
            ExitCode::from(EXIT_CANNOT_VALIDATE)
        }
    }
}

#[derive(Serialize)]
struct ViolationJson<'a> {
    path: Option<&'a str>,
    message: &'a str,
    rule: &'static str,
}

fn validate_inner(cli: &Globals, args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let memory_dir = match &args.memory_dir {
        Some(d) => d.clone(),
        None => store::find(&cli.home()?, args.agent.as_deref())?
            .1
            .memory_dir(),
    };
    let repo = repo::open(&memory_dir)?;
    let git_dir = hook::common_git_dir(&repo).to_path_buf();
    // Keep an installed hook of ours pointing at this binary; never plant
    // one in a repository that has none.
    if let Some(bin) = hook::self_binary()
        && let Err(e) = hook::ensure(&git_dir, &bin, EnsureMode::RefreshOnly)
    {
        crate::console::style::eprint_warning(&e.to_string());
    }
    let opts = ValidateOptions::new(hook::read_layout_policy(&git_dir))
        .with_approval(constraints_update_approved_from_env());
    let (mode, report, block) = match &args.rev {
        Some(rev) => {
            let report = audit_revision(&repo, rev, &opts).map_err(validate_error)?;
            let block = report.render_audit();
            ("rev", report, block)
        }
        None => {
            // Git runs the hook with GIT_INDEX_FILE naming the index to
            // commit (a temporary one for `git commit -- paths` or `-a`).
            let index = match std::env::var_os("GIT_INDEX_FILE").filter(|v| !v.is_empty()) {
                Some(f) => git2::Index::open(std::path::Path::new(&f))
                    .with_context(|| format!("cannot read the index {}", f.to_string_lossy()))?,
                None => repo.index().context("cannot read the index")?,
            };
            let candidate = TreeSnapshot::from_index(&index).map_err(validate_error)?;
            let head = TreeSnapshot::from_head(&repo).map_err(validate_error)?;
            let report =
                validate(&repo, &candidate, head.as_ref(), &opts).map_err(validate_error)?;
            let block = report.render_block();
            ("staged", report, block)
        }
    };
    if args.json {
        let violations: Vec<ViolationJson<'_>> = report
            .violations
            .iter()
            .map(|v| ViolationJson {
                path: v.path.as_deref(),
                message: &v.message,
                rule: v.rule.as_str(),
            })
            .collect();
        output::json(&serde_json::json!({
            "ok": report.is_ok(),
            "mode": mode,
            "policy": report.policy.as_str(),
            "block": block,
            "violations": violations,
        }))?;
    } else if !report.is_ok() {
        eprint!("{}", output::text_block(&block));
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn validate_error(e: ValidateError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.render().trim_end())
}
