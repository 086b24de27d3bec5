//! `agent import`: the archive checked whole (pass one), then unpacked
//! into a staging directory beside the other agents (pass two), its
//! repository finished, and the agent renamed into place.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::OFlag;

use super::entries::{Place, check_head, filter_packed_refs};
use super::error::{ArchiveError, bad_repo, io_err};
use super::format::Limits;
use super::reader::{MAX_HEAD_BYTES, check_archive, read_small, walk};
use super::repository::finish_repository;
use crate::memfs::repo;
use crate::paths::{AgentPaths, Home, IMPORT_STAGING_PREFIX};
use crate::store::record::AgentRecord;
use crate::store::{self, StoreError};

/// `memory.git/packed-refs` (one line per ref).
const MAX_PACKED_REFS: u64 = 64 << 20;

/// Checks a record's model handle; the reason when it cannot be used.
pub type ModelCheck<'a> = &'a dyn Fn(&str) -> Result<(), String>;

/// How to import.
#[derive(Default)]
pub struct ImportOptions<'a> {
    /// The name the agent gets (its archived name when `None`).
    pub name: Option<String>,
    pub limits: Limits,
    /// Checks the record's model handle (the store knows no providers;
    /// the CLI passes `model::factory::parse_handle`).
    pub check_model: Option<ModelCheck<'a>>,
}

/// Import the agent archived in `file`. Returns its record as stored.
pub fn import(
    home: &Home,
    file: &Path,
    opts: &ImportOptions<'_>,
) -> Result<AgentRecord, ArchiveError> {
    let checked = check_archive(file, opts.limits)?;
    let mut record = checked.record;
    if !crate::paths::is_valid_agent_id(&record.id) {
        return Err(ArchiveError::BadRecord(format!(
            "invalid agent id {:?}",
            record.id
        )));
    }
    if record.id != checked.manifest.agent_id {
        return Err(ArchiveError::BadRecord(format!(
            "agent.json names agent {} but the manifest {}",
            record.id, checked.manifest.agent_id
        )));
    }
    if let Some(name) = &opts.name {
        record.name = name.clone();
    }
    store::check_name(&record.name)?;
    record.check_untrusted().map_err(ArchiveError::BadRecord)?;
    if let Some(check) = opts.check_model {
        check(&record.model).map_err(|why| ArchiveError::BadModel {
            model: record.model.clone(),
            why,
        })?;
    }
    // A uid belongs to a host: this one gets its own at first launch.
    record.sandbox_uid = None;

    // Refused early (nothing unpacked), and checked again under the names
    // lock just before the agent is put in place.
    check_free(home, &record)?;
    let agents = home.agents_dir();
    fs::create_dir_all(&agents).map_err(io_err(&agents))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{IMPORT_STAGING_PREFIX}{}-", record.id))
        .tempdir_in(&agents)
        .map_err(io_err(&agents))?;
    let paths = AgentPaths::from_dir(staging.path());
    unpack(file, opts.limits, &paths)?;
    finish_repository(&paths, checked.policy)?;
    store::save(&paths, &record)?;
    // Private, as a new agent's directory is (see `store::create`).
    fs::set_permissions(
        staging.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io_err(staging.path()))?;
    let _names = store::lock_names(home)?;
    check_free(home, &record)?;
    let staged = staging.keep();
    store::place_agent_dir(home, &record, &staged)?;
    store::reindex(home);
    Ok(record)
}

/// No agent here has `record`'s id or name.
fn check_free(home: &Home, record: &AgentRecord) -> Result<(), ArchiveError> {
    let listing = store::list_all(home)?;
    let dir_there = home
        .agent(&record.id)
        .map_err(StoreError::from)?
        .dir()
        .exists();
    if listing.has_id(&record.id) || dir_there {
        let name = listing
            .agents
            .iter()
            .find(|a| a.id == record.id)
            .map(|a| format!("named {:?}", a.name))
            .unwrap_or_else(|| "unreadable".into());
        return Err(ArchiveError::IdTaken {
            id: record.id.clone(),
            name,
        });
    }
    if listing.name_taken(&record.name, None) {
        return Err(ArchiveError::NameTaken(record.name.clone()));
    }
    Ok(())
}

/// Pass two: a fresh, linked repository, then the archive's files over it.
fn unpack(file: &Path, limits: Limits, paths: &AgentPaths) -> Result<(), ArchiveError> {
    repo::init_linked(&paths.memory_dir(), &paths.memory_git_dir())?;
    let root = paths.dir();
    walk(file, limits, |place, entry, size| {
        let rel = match place {
            Place::Keep(rel) => rel,
            Place::Head => {
                let bytes = read_small(entry, size, MAX_HEAD_BYTES, "memory.git/HEAD")?;
                check_head(&bytes)?;
                let path = paths.memory_git_dir().join("HEAD");
                return fs::write(&path, bytes).map_err(io_err(&path));
            }
            Place::PackedRefs => {
                let bytes = read_small(entry, size, MAX_PACKED_REFS, "memory.git/packed-refs")?;
                let text = std::str::from_utf8(&bytes)
                    .map_err(|_| bad_repo("memory.git/packed-refs is not text"))?;
                let path = paths.memory_git_dir().join("packed-refs");
                return fs::write(&path, filter_packed_refs(text)).map_err(io_err(&path));
            }
            Place::Manifest | Place::Record | Place::Skip => return Ok(()),
        };
        let path = root.join(&rel);
        if entry.header().entry_type().is_dir() {
            return fs::create_dir_all(&path).map_err(io_err(&path));
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let exec = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .mode(if exec { 0o755 } else { 0o644 })
            .open(&path)
            .map_err(io_err(&path))?;
        let copied = io::copy(&mut entry.take(size), &mut out).map_err(io_err(&path))?;
        if copied != size {
            return Err(ArchiveError::Corrupt {
                file: file.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} ends early", rel.display()),
                ),
            });
        }
        Ok(())
    })
}
