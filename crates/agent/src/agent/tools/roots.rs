//! Where the file tools may act: absolute paths without `..` that resolve
//! below the memory directory, the workspace or (for `Read`) the extra
//! read roots.

use std::path::{Path, PathBuf};

use super::kit::{ToolContext, ToolOutput};

/// File tools act only in the workspace and the own memory directory.
pub(super) fn allowed_path(ctx: &ToolContext, p: &str) -> Result<PathBuf, ToolOutput> {
    let roots: Vec<PathBuf> = [Some(ctx.memory_dir()), ctx.workspace.clone()]
        .into_iter()
        .flatten()
        .collect();
    inside_roots(p, &roots)
}

/// What `Read` may read: [`allowed_path`]'s directories and the context's
/// `read_roots`.
pub(super) fn readable_path(ctx: &ToolContext, p: &str) -> Result<PathBuf, ToolOutput> {
    let mut roots: Vec<PathBuf> = [Some(ctx.memory_dir()), ctx.workspace.clone()]
        .into_iter()
        .flatten()
        .collect();
    roots.extend(ctx.read_roots.iter().cloned());
    inside_roots(p, &roots)
}

/// `p`, when it is absolute, has no `..` and resolves below one of `roots`.
fn inside_roots(p: &str, roots: &[PathBuf]) -> Result<PathBuf, ToolOutput> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(ToolOutput::err(format!("{p}: file_path must be absolute")));
    }
    if path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(ToolOutput::err(format!("{p}: '..' is not allowed")));
    }
    // Resolve symlinks of the existing part so a link cannot lead outside.
    let existing = path.ancestors().find(|a| a.exists()).unwrap_or(path);
    let real = existing
        .canonicalize()
        .unwrap_or_else(|_| existing.to_path_buf());
    let inside = roots.iter().any(|r| {
        let r = r.canonicalize().unwrap_or_else(|_| r.clone());
        real.starts_with(&r)
    });
    if !inside {
        return Err(ToolOutput::err(format!(
            "{p}: outside your workspace and memory directory"
        )));
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reflection is told to read its payload files: `Read` reaches its
    /// extra roots, and nothing beside them.
    #[test]
    fn read_roots_are_readable_and_only_they() {
        let t = tempfile::tempdir().expect("tmp");
        let payloads = t.path().join("reflections/payloads");
        std::fs::create_dir_all(payloads.join("l1")).expect("mkdir");
        std::fs::write(payloads.join("l1/c.json"), "[]").expect("write");
        std::fs::write(t.path().join("secret"), "x").expect("write");
        let file = payloads.join("l1/c.json");
        let file = file.to_str().expect("utf-8");
        assert!(inside_roots(file, std::slice::from_ref(&payloads)).is_ok());
        assert!(inside_roots(file, &[t.path().join("memory")]).is_err());
        let outside = t.path().join("reflections/payloads/../../secret");
        assert!(inside_roots(outside.to_str().expect("utf-8"), &[payloads]).is_err());
    }
}
