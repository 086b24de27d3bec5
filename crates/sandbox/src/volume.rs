//! Per-agent disk and inode quotas: an agent with a quota lives on a
//! filesystem of its own — an ext4 image (`<home>/volumes/<id>.ext4`) made
//! with exactly that many bytes and inodes, loop-mounted on its directory.
//! A child that fills it gets `ENOSPC` from the kernel at the write; the
//! host's filesystem, the supervisor and every other tenant are untouched.
//!
//! Why a volume and not project quotas: project quotas need a kernel built
//! with quota formats and a filesystem mounted with `prjquota`; a loop
//! mount needs neither, works on any host where root can mount, and bounds
//! the agent's git objects too. The mount does not survive a reboot: the
//! supervisor (and any command run as root) mounts what is missing.
//!
//! Sizes come from `[quota]` in `<home>/config.toml` (`disk_mb`, `inodes`:
//! the default for new agents; absent means no quota) or from
//! `agent create --disk-mb/--inodes`.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::paths::Home;

/// The smallest volume ext4 is made on here.
pub const MIN_DISK_MB: u64 = 8;
/// The fewest inodes (the agent's own files start at a few dozen).
pub const MIN_INODES: u64 = 256;

/// Tools are looked up only here: never on a PATH someone else set.
const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// A quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    pub disk_mb: u64,
    pub inodes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(
        "a disk quota needs at least {MIN_DISK_MB} MB and {MIN_INODES} inodes (asked: {disk_mb} MB, {inodes} inodes)"
    )]
    TooSmall { disk_mb: u64, inodes: u64 },
    #[error(
        "agent quotas mount a volume and need root; run as root or remove [quota] from config.toml (and --disk-mb/--inodes)"
    )]
    NotRoot,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{tool} failed for {path}: {message}")]
    Tool {
        tool: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error(transparent)]
    Paths(#[from] crate::paths::PathsError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    quota: Option<QuotaSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaSection {
    disk_mb: Option<u64>,
    inodes: Option<u64>,
}

/// The quota new agents get by default (`[quota]` in config.toml), if any.
pub fn default_quota(home: &Home) -> Result<Option<Quota>, VolumeError> {
    let path = home.config_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let file: ConfigFile = toml::from_str(&text).map_err(|e| VolumeError::Config {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let Some(q) = file.quota else {
        return Ok(None);
    };
    match (q.disk_mb, q.inodes) {
        (None, None) => Ok(None),
        (disk_mb, inodes) => Ok(Some(Quota {
            disk_mb: disk_mb.unwrap_or(1024),
            // About one inode per 16 KiB, as mke2fs would choose.
            inodes: inodes.unwrap_or(disk_mb.unwrap_or(1024).saturating_mul(64)),
        })),
    }
}

/// Make `agent_id`'s volume holding a copy of `content` (its directory as
/// built so far) and mount it on `dest` (created empty). On failure nothing
/// is left behind.
pub fn create(
    home: &Home,
    agent_id: &str,
    content: &Path,
    dest: &Path,
    quota: Quota,
) -> Result<(), VolumeError> {
    if quota.disk_mb < MIN_DISK_MB || quota.inodes < MIN_INODES {
        return Err(VolumeError::TooSmall {
            disk_mb: quota.disk_mb,
            inodes: quota.inodes,
        });
    }
    // Loop devices and mounts take the host's root, not a namespace's.
    if !super::subids::host_root() {
        return Err(VolumeError::NotRoot);
    }
    let dir = home.volumes_dir();
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(io(&dir))?;
    let image = home.volume_image(agent_id)?;
    let made = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&image)
            .map_err(io(&image))?;
        file.set_len(quota.disk_mb.saturating_mul(1024 * 1024))
            .map_err(io(&image))?;
        drop(file);
        // -d copies the directory in; -m 0: no blocks kept back for root,
        // the quota is the agent's to the byte.
        run(
            "mkfs.ext4",
            &image,
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-N"])
                .arg(quota.inodes.to_string())
                .arg("-d")
                .arg(content)
                .arg(&image),
        )?;
        std::fs::create_dir(dest).map_err(io(dest))?;
        mount(&image, dest)?;
        // The volume's root is the agent directory: private until the first
        // confined run gives it to the agent's group.
        std::fs::set_permissions(dest, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(io(dest))
    })();
    if made.is_err() {
        if is_mounted(dest) {
            let _ = run("umount", dest, Command::new("umount").arg(dest));
        }
        let _ = std::fs::remove_dir(dest);
        let _ = std::fs::remove_file(&image);
    }
    made
}

/// Mount every volume of `home` that is not mounted (after a reboot).
/// Returns how many were mounted. Only root can; others get 0.
pub fn ensure_mounted(home: &Home) -> Result<usize, VolumeError> {
    if !super::subids::host_root() {
        return Ok(0);
    }
    let dir = home.volumes_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut mounted = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".ext4")) else {
            continue;
        };
        let dest = home.agent(id)?.dir().to_path_buf();
        if is_mounted(&dest) {
            continue;
        }
        if !dest.exists() {
            std::fs::create_dir_all(&dest).map_err(io(&dest))?;
        }
        mount(&home.volume_image(id)?, &dest)?;
        mounted += 1;
    }
    Ok(mounted)
}

/// Whether `dir` is the root of a mount (its device differs from its
/// parent's).
pub fn is_mounted(dir: &Path) -> bool {
    let (Ok(here), Some(Ok(up))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    here.dev() != up.dev()
}

/// Unmount `agent_id`'s volume (its files stay in the image).
pub fn unmount(home: &Home, agent_id: &str) -> Result<(), VolumeError> {
    let dest = home.agent(agent_id)?.dir().to_path_buf();
    if !is_mounted(&dest) {
        return Ok(());
    }
    run("umount", &dest, Command::new("umount").arg(&dest))
}

/// Unmount and delete `agent_id`'s volume (for `agent delete`); false when
/// it had none.
pub fn remove(home: &Home, agent_id: &str) -> Result<bool, VolumeError> {
    let image = home.volume_image(agent_id)?;
    if !image.exists() {
        return Ok(false);
    }
    unmount(home, agent_id)?;
    std::fs::remove_file(&image).map_err(io(&image))?;
    Ok(true)
}

fn mount(image: &Path, dest: &Path) -> Result<(), VolumeError> {
    // nosuid, nodev: nothing on an agent's volume may gain privilege.
    run(
        "mount",
        dest,
        Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev"])
            .arg(image)
            .arg(dest),
    )?;
    // mke2fs leaves lost+found; the agent directory holds only its own.
    let _ = std::fs::remove_dir(dest.join("lost+found"));
    Ok(())
}

fn run(tool: &'static str, path: &Path, cmd: &mut Command) -> Result<(), VolumeError> {
    let out = cmd
        .env("PATH", TOOL_PATH)
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| VolumeError::Tool {
            tool,
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(VolumeError::Tool {
        tool,
        path: path.to_path_buf(),
        message: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}
