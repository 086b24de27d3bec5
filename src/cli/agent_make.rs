//! Making an agent, as `agent create` and letta-code's `--new-agent` both
//! do: everything another host or an import would refuse is refused before
//! anything is made.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::paths::Home;
use crate::store::{self, record::ModelSource};

/// The model a new agent gets, and why: `--model`, else `[model] default`
/// of `config.toml` (a broken file is an error, not a silent `mock`), else
/// `None` (the built-in default).
pub(crate) fn chosen_model(
    home: &crate::paths::Home,
    flag: Option<&str>,
) -> anyhow::Result<Option<(String, ModelSource)>> {
    if let Some(m) = flag {
        return Ok(Some((model_handle(m)?, ModelSource::Flag)));
    }
    let cfg = crate::model::ProviderConfig::load(home)
        .context("the agent was not created: config.toml")?;
    match cfg.default_model.as_deref() {
        Some(m) => {
            let handle = model_handle(m)
                .with_context(|| format!("[model] default = {m:?} in config.toml"))?;
            Ok(Some((handle, ModelSource::Config)))
        }
        None => Ok(None),
    }
}

/// A model handle checked for form (`mock`, `mock/scripted`,
/// `openai/<model>`, `anthropic/<model>`), trimmed.
pub(crate) fn model_handle(model: &str) -> anyhow::Result<String> {
    crate::model::factory::parse_handle(model)?;
    Ok(model.trim().to_string())
}

/// What `agent create` was asked for, its flags as given.
pub(crate) struct CreateArgs<'a> {
    pub(crate) name: &'a str,
    pub(crate) model: Option<&'a str>,
    pub(crate) system_file: Option<&'a Path>,
    pub(crate) disk_mb: Option<u64>,
    pub(crate) inodes: Option<u64>,
    pub(crate) context_window: Option<u64>,
}

/// An agent named `name` with `model` (or the home's default), made as
/// `agent create` makes one (letta-code's `--new-agent`).
pub(crate) fn create_record(
    home: &Home,
    name: &str,
    model: Option<&str>,
) -> anyhow::Result<crate::store::record::AgentRecord> {
    make(
        home,
        &CreateArgs {
            name,
            model,
            system_file: None,
            disk_mb: None,
            inodes: None,
            context_window: None,
        },
    )
}

/// What `agent create` makes, without printing.
pub(crate) fn make(
    home: &Home,
    asked: &CreateArgs,
) -> anyhow::Result<crate::store::record::AgentRecord> {
    let model = chosen_model(home, asked.model)?;
    // Checked before anything is made: a typo in [network] must not
    // leave an agent with a list nobody chose.
    let network = crate::egress::config::NetworkConfig::load(home)
        .context("the agent was not created: config.toml")?;
    // Read-only: a refused create leaves nothing behind.
    if crate::remote::root_from_env().is_some()
        && !store::list_all(home)?.name_taken(asked.name, None)
    {
        check_remote_name(home, asked.name)?;
    }
    let mut model_settings = serde_json::Map::new();
    if let Some(w) = asked.context_window {
        model_settings.insert(
            crate::agent::context::window::WINDOW_SETTING.into(),
            json!(w),
        );
    }
    let system = match asked.system_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read system prompt file {}", f.display()))?,
        ),
        None => None,
    };
    // What another host or an import would refuse is refused here.
    if let (Some(text), Some(f)) = (&system, asked.system_file) {
        crate::store::record::check_system(text)
            .map_err(|why| anyhow::anyhow!("{}: {why}", f.display()))?;
    }
    let quota = chosen_quota(home, asked.disk_mb, asked.inodes)?;
    let record = store::create_choosing(
        home,
        asked.name,
        system,
        quota,
        model.as_ref().map(|(m, source)| (m.as_str(), *source)),
        model_settings,
    )?;
    crate::egress::policy::apply_default(home, &record.id, &network)?;
    Ok(record)
}

/// The volume quota of a new agent: the flags, each falling back to the
/// home's default, or none when neither is set.
fn chosen_quota(
    home: &Home,
    disk_mb: Option<u64>,
    inodes: Option<u64>,
) -> anyhow::Result<Option<crate::sandbox::volume::Quota>> {
    let default = crate::sandbox::volume::default_quota(home)?;
    Ok(match (disk_mb, inodes, default) {
        (None, None, d) => d,
        (disk, inodes, d) => {
            let disk_mb = disk.or(d.map(|q| q.disk_mb)).unwrap_or(1024);
            Some(crate::sandbox::volume::Quota {
                disk_mb,
                inodes: inodes
                    .or(d.map(|q| q.inodes))
                    .unwrap_or(disk_mb.saturating_mul(64)),
            })
        }
    })
}

/// Refuse to create an agent whose name an agent on the remote already
/// has (a directory root; a URL root cannot be searched): the user most
/// likely wants that agent, which `chat -a NAME` clones.
fn check_remote_name(home: &crate::paths::Home, name: &str) -> anyhow::Result<()> {
    let Some(root) = crate::remote::root_from_env() else {
        return Ok(());
    };
    // A network root cannot be searched; a refused one is said by `list`.
    if let Ok(crate::memfs::sync::RemoteRoot::Network(_)) =
        crate::memfs::sync::RemoteRoot::parse(&root)
    {
        return Ok(());
    }
    if let Some(a) = crate::remote::list(home, &root)?
        .into_iter()
        .find(|a| a.name.as_deref() == Some(name))
    {
        anyhow::bail!(
            "an agent named {name:?} already exists on the remote {root} ({}); \
`mini-letta chat -a {name}` clones it to this host",
            a.id
        );
    }
    Ok(())
}
