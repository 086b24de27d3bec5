//! `mini-letta config`: where the configuration file is, what each
//! setting is in effect and where that came from, and whether every
//! reader accepts the file.
//!
//! Why here: each subsystem reads its own table of `config.toml` (and its
//! own variables), so no one place knew the whole; this command asks each
//! reader, and names the source of every value — a flag, the environment,
//! the file or the built-in default.

use std::process::ExitCode;

use clap::Subcommand;
use serde::Serialize;

use super::globals::Globals;
use crate::console::output::{self, Table, field as f};
use crate::paths::Home;

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the path of the home's config.toml (whether or not it exists).
    #[command(
        after_help = "Examples:\n  mini-letta config path\n  mini-letta --home /srv/agents config path"
    )]
    Path,
    /// Show every setting in effect, its value and where it came from
    /// (flag, environment, file, default). Keys are never printed.
    #[command(after_help = "Examples:\n  mini-letta config show\n  mini-letta config show --json")]
    Show {
        /// Print [{"key", "value", "source"}] instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check config.toml with every reader (model, providers, network,
    /// quota, cluster, audit); exit 1 naming each problem.
    #[command(
        after_help = "Examples:\n  mini-letta config check\n  mini-letta config check --json"
    )]
    Check {
        /// Print {"path", "exists", "ok", "problems": [...]}.
        #[arg(long)]
        json: bool,
    },
}

/// One setting in effect.
#[derive(Debug, Serialize)]
struct Setting {
    key: String,
    /// `None`: unset (nothing configured, no default).
    value: Option<String>,
    /// `flag`, `environment (NAME)`, `file`, `default` or `unset`.
    source: String,
}

pub fn run(cli: &Globals, cmd: &ConfigCommand) -> anyhow::Result<ExitCode> {
    let home = Home::resolve(cli.home_flag())?;
    match cmd {
        ConfigCommand::Path => {
            println!("{}", f(&home.config_file().display().to_string()));
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Show { json } => show(cli, &home, *json),
        ConfigCommand::Check { json } => check(&home, *json),
    }
}

/// The file's value at a dotted `key`, as TOML writes it.
fn file_value(file: &toml::Table, key: &str) -> Option<String> {
    let mut parts = key.split('.');
    let mut at = file.get(parts.next()?)?;
    for p in parts {
        at = at.as_table()?.get(p)?;
    }
    Some(match at {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// How a setting is resolved: its key, the variable that can give it, and
/// whether that variable wins over the file (else the file wins).
struct Rule {
    key: &'static str,
    env: Option<&'static str>,
    env_wins: bool,
    default: Option<String>,
}

const fn rule(key: &'static str, env: Option<&'static str>, env_wins: bool) -> Rule {
    Rule {
        key,
        env,
        env_wins,
        default: None,
    }
}

fn resolve(file: &toml::Table, r: &Rule) -> Setting {
    let from_file = file_value(file, r.key).map(|v| (v, "file".to_string()));
    let from_env = r
        .env
        .and_then(|name| env_value(name).map(|v| (v, format!("environment ({name})"))));
    let found = if r.env_wins {
        from_env.or(from_file)
    } else {
        from_file.or(from_env)
    };
    let (value, source) = match (found, &r.default) {
        (Some((v, s)), _) => (Some(v), s),
        (None, Some(d)) => (Some(d.clone()), "default".to_string()),
        (None, None) => (None, "unset".to_string()),
    };
    Setting {
        key: r.key.to_string(),
        value,
        source,
    }
}

/// A provider's key: whether one is set and where, never its value.
fn key_setting(file: &toml::Table, provider: &str, default_env: &str) -> Setting {
    let key_env = file_value(file, &format!("providers.{provider}.api_key_env"))
        .unwrap_or_else(|| default_env.to_string());
    let (value, source) = if file_value(file, &format!("providers.{provider}.api_key")).is_some() {
        (Some("(set)".to_string()), "file".to_string())
    } else if env_value(&key_env).is_some() {
        (
            Some("(set)".to_string()),
            format!("environment ({key_env})"),
        )
    } else {
        (None, "unset".to_string())
    };
    Setting {
        key: format!("providers.{provider}.api_key"),
        value,
        source,
    }
}

/// Every setting `config show` reports, with its variable and default
/// (`providers.*.api_key` are added beside their provider's address).
fn rules() -> Vec<Rule> {
    use crate::egress::config as net;
    use crate::model::config as model;
    let with_default = |mut r: Rule, d: &str| {
        r.default = Some(d.to_string());
        r
    };
    vec![
        with_default(rule("model.default", None, false), model::DEFAULT_MODEL),
        rule(
            "model.context_window",
            Some("MINI_LETTA_CONTEXT_WINDOW"),
            true,
        ),
        rule(
            "reflection.context_window",
            Some("MINI_LETTA_REFLECTION_CONTEXT_WINDOW"),
            true,
        ),
        with_default(
            rule("providers.openai.base_url", Some("OPENAI_BASE_URL"), false),
            model::OPENAI_DEFAULT_BASE_URL,
        ),
        with_default(
            rule("providers.openai.timeout_secs", None, false),
            &model::DEFAULT_TIMEOUT_SECS.to_string(),
        ),
        with_default(
            rule(
                "providers.anthropic.base_url",
                Some("ANTHROPIC_BASE_URL"),
                false,
            ),
            model::ANTHROPIC_DEFAULT_BASE_URL,
        ),
        with_default(
            rule("providers.anthropic.timeout_secs", None, false),
            &model::DEFAULT_TIMEOUT_SECS.to_string(),
        ),
        rule("providers.mock.context_window", None, false),
        with_default(rule("network.allow", None, false), "[]"),
        with_default(
            rule("network.deny_cidrs", None, false),
            "(the built-in private, link-local and metadata ranges)",
        ),
        with_default(
            rule("network.max_connections", None, false),
            &net::DEFAULT_MAX_CONNECTIONS.to_string(),
        ),
        with_default(
            rule("network.max_bytes", None, false),
            &net::DEFAULT_MAX_BYTES.to_string(),
        ),
        with_default(
            rule("network.idle_timeout_secs", None, false),
            &net::DEFAULT_IDLE_SECS.to_string(),
        ),
        with_default(
            rule("network.request_timeout_secs", None, false),
            &net::DEFAULT_REQUEST_SECS.to_string(),
        ),
        rule("quota.disk_mb", None, false),
        rule("quota.inodes", None, false),
        rule("cluster.etcd", Some("MINI_LETTA_ETCD"), true),
        with_default(
            rule("cluster.host_id", Some("MINI_LETTA_HOST_ID"), true),
            "(this machine's host name)",
        ),
        with_default(
            rule("cluster.lease_secs", Some("MINI_LETTA_LEASE_SECS"), true),
            &crate::cluster::config::DEFAULT_LEASE_SECS.to_string(),
        ),
        rule("audit.publish", None, false),
    ]
}

fn settings(cli: &Globals, home: &Home, file: &toml::Table) -> Vec<Setting> {
    let home_source = if cli.home_flag().is_some() {
        "flag (--home)".to_string()
    } else if env_value("MINI_LETTA_HOME").is_some() {
        "environment (MINI_LETTA_HOME)".to_string()
    } else {
        "default".to_string()
    };
    let mut out = vec![Setting {
        key: "home".into(),
        value: Some(home.root().display().to_string()),
        source: home_source,
    }];
    let rules = rules();
    for (i, r) in rules.iter().enumerate() {
        out.push(resolve(file, r));
        // Each provider's key right after its address.
        match i {
            3 => out.push(key_setting(file, "openai", "OPENAI_API_KEY")),
            5 => out.push(key_setting(file, "anthropic", "ANTHROPIC_API_KEY")),
            _ => {}
        }
    }
    // Per-model windows: whatever the file lists.
    if let Some(toml::Value::Table(windows)) = file
        .get("model")
        .and_then(|m| m.as_table())
        .and_then(|m| m.get("context_windows"))
    {
        for (handle, w) in windows {
            out.push(Setting {
                key: format!("model.context_windows.{handle:?}"),
                value: Some(w.to_string()),
                source: "file".into(),
            });
        }
    }
    out
}

fn show(cli: &Globals, home: &Home, json: bool) -> anyhow::Result<ExitCode> {
    let path = home.config_file();
    let file = read_table(&path)?;
    let rows = settings(cli, home, &file);
    if json {
        output::json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    let exists = path.exists();
    println!(
        "config file: {}{}",
        f(&path.display().to_string()),
        if exists { "" } else { " (absent: defaults)" }
    );
    let mut table = Table::new(&["KEY", "VALUE", "SOURCE"]);
    for s in rows {
        table.row(vec![s.key, s.value.unwrap_or_else(|| "-".into()), s.source]);
    }
    table.print()?;
    Ok(ExitCode::SUCCESS)
}

/// The file as a TOML table (empty when absent); a parse error names the
/// file, as every reader's does.
fn read_table(path: &std::path::Path) -> anyhow::Result<toml::Table> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.parse::<toml::Table>().map_err(|e| {
            anyhow::anyhow!(
                "invalid configuration in {}: {}",
                path.display(),
                e.message().trim()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(toml::Table::new()),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

fn check(home: &Home, json: bool) -> anyhow::Result<ExitCode> {
    let path = home.config_file();
    let mut problems: Vec<String> = Vec::new();
    let mut note = |r: Result<(), String>| {
        if let Err(e) = r
            && !problems.contains(&e)
        {
            problems.push(e);
        }
    };
    note(
        crate::model::ProviderConfig::load(home)
            .map(drop)
            .map_err(|e| e.to_string()),
    );
    note(
        crate::egress::config::NetworkConfig::load(home)
            .map(drop)
            .map_err(|e| e.to_string()),
    );
    note(
        crate::sandbox::volume::default_quota(home)
            .map(drop)
            .map_err(|e| e.to_string()),
    );
    note(
        crate::cluster::config::ClusterConfig::load(home)
            .map(drop)
            .map_err(|e| e.to_string()),
    );
    note(
        crate::audit::publish::target(home)
            .map(drop)
            .map_err(|e| e.to_string()),
    );
    let exists = path.exists();
    if json {
        output::json(&serde_json::json!({
            "path": path,
            "exists": exists,
            "ok": problems.is_empty(),
            "problems": problems,
        }))?;
    } else if problems.is_empty() {
        println!(
            "ok: {}{}",
            f(&path.display().to_string()),
            if exists { "" } else { " (absent: defaults)" }
        );
    } else {
        for p in &problems {
            crate::console::style::eprint_error(p);
        }
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
