//! `palace export DIR`: the pages as static files that work from `file://`
//! (relative links), written into a fresh directory beside `DIR` and put in
//! place by one rename, so `DIR` is never half written.

use std::fs;
use std::path::{Path, PathBuf};

use super::PalaceError;
use super::data::Site;
use super::pages::{self, Page};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PalaceError + '_ {
    move |source| PalaceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an export wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exported {
    pub dir: PathBuf,
    pub agents: usize,
    pub pages: usize,
}

/// Write the site for `site`'s agents to `dir` (replacing what was there).
pub fn export(site: &Site, dir: &Path) -> Result<Exported, PalaceError> {
    let dir = std::path::absolute(dir).map_err(io(dir))?;
    let parent = dir.parent().ok_or_else(|| {
        PalaceError::BadRequest(format!("{}: no parent directory", dir.display()))
    })?;
    fs::create_dir_all(parent).map_err(io(parent))?;
    let staging = tempfile::Builder::new()
        .prefix(".palace-export-")
        .tempdir_in(parent)
        .map_err(io(parent))?;
    let root = staging.path();
    let write = |rel: &str, body: &[u8]| -> Result<(), PalaceError> {
        let path = root.join(rel);
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).map_err(io(p))?;
        }
        fs::write(&path, body).map_err(io(&path))
    };
    let agents = site.agents()?;
    write(
        "index.html",
        pages::agents(&Page::at_depth(0, false), &agents).as_bytes(),
    )?;
    write("style.css", pages::STYLE.as_bytes())?;
    let mut count = 2;
    for a in &agents {
        for (rel, body) in pages::agent_site(site, &a.id)? {
            write(&rel, body.as_bytes())?;
            count += 1;
        }
    }
    // Readable by whoever opens it in a browser.
    fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(io(root))?;
    let staged = staging.keep();
    let placed = if dir.exists() {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &staged,
            nix::fcntl::AT_FDCWD,
            &dir,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(|e| io(&dir)(e.into()))
        .map(|()| {
            // `staged` now holds the old export.
            let _ = fs::remove_dir_all(&staged);
        })
    } else {
        fs::rename(&staged, &dir).map_err(io(&dir))
    };
    if placed.is_err() {
        let _ = fs::remove_dir_all(&staged);
    }
    placed?;
    Ok(Exported {
        dir,
        agents: agents.len(),
        pages: count,
    })
}
