//! Filesystem attacks on another agent's directory and on paths outside the
//! own writable set (§d rows 1–10).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::context::ProbeContext;
use super::util::{below, io_name, join, private_tmpfs, read_for_marker, unique};
use super::verdict::Verdict;

/// Row 1: `open` + `read` B's secret file. Escaped if it is readable (the
/// evidence says whether the marker was in it); blocked with the errno.
pub(crate) fn read_other_agent(ctx: &ProbeContext) -> Verdict {
    read_for_marker(&ctx.other_secret_file, &ctx.secret_marker, "B's file")
}

/// Row 2: `readdir` of the agents directory. Escaped if any entry other than
/// the own agent directory is listed; blocked if refused or only A is seen.
pub(crate) fn enumerate_agents(ctx: &ProbeContext) -> Verdict {
    let own = ctx.own_agent_dir.file_name();
    match std::fs::read_dir(&ctx.agents_dir) {
        Err(e) => Verdict::blocked(format!(
            "readdir {}: {}",
            ctx.agents_dir.display(),
            io_name(&e)
        )),
        Ok(entries) => {
            let names: Vec<String> = entries
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .filter(|n| Some(n.as_os_str()) != own)
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            if names.is_empty() {
                Verdict::blocked(format!(
                    "readdir {} lists only the own agent",
                    ctx.agents_dir.display()
                ))
            } else {
                let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
                Verdict::escaped(format!(
                    "readdir {} lists {} other entries: {}",
                    ctx.agents_dir.display(),
                    names.len(),
                    shown.join(", ")
                ))
            }
        }
    }
}

/// Create a new, uniquely named file in `dir`; on success delete it again.
fn try_create_in(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join(unique("w"));
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            Ok(path)
        }
        Err(e) => Err(format!("{}: {}", dir.display(), io_name(&e))),
    }
}

/// Row 3: create a file in directories outside the own writable set — the
/// agents directory, B's directory, the home directory, `/etc`, `/usr`.
/// Escaped if any creation succeeds (the file is deleted at once), except in
/// a tmpfs mask private to the sandbox, which never reaches the host.
pub(crate) fn write_outside(ctx: &ProbeContext) -> Verdict {
    let mut dirs: Vec<PathBuf> = vec![ctx.agents_dir.clone(), ctx.other_agent_dir.clone()];
    if let Some(home) = ctx.agents_dir.parent() {
        dirs.push(home.to_path_buf());
    }
    dirs.push("/etc".into());
    dirs.push("/usr".into());
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for d in &dirs {
        match try_create_in(d) {
            Ok(p) if private_tmpfs(d, ctx.supervisor_pid) => refused.push(format!(
                "created {} in a tmpfs mask private to this sandbox (never reaches the host)",
                p.display()
            )),
            Ok(p) => created.push(format!("created (and removed) {}", p.display())),
            Err(e) => refused.push(e),
        }
    }
    if created.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&created))
    }
}

/// Row 4: make a new symlink in the scratch dir pointing at B's secret and
/// read through it. Escaped if the read works; blocked with the errno of
/// the symlink or of the read.
pub(crate) fn symlink_to_other(ctx: &ProbeContext) -> Verdict {
    let link = ctx.scratch_dir.join(unique("symlink"));
    if let Err(e) = std::os::unix::fs::symlink(&ctx.other_secret_file, &link) {
        return Verdict::blocked(format!("symlink {}: {}", link.display(), io_name(&e)));
    }
    let v = read_for_marker(&link, &ctx.secret_marker, "read through a new symlink");
    let _ = std::fs::remove_file(&link);
    v
}

/// Row 5: read the symlink to B's secret planted in A before confinement.
/// Escaped if readable; skipped if the verifier planted none.
pub fn planted_symlink(ctx: &ProbeContext) -> Verdict {
    match &ctx.planted_symlink {
        Some(p) => read_for_marker(p, &ctx.secret_marker, "planted symlink"),
        None => Verdict::skipped("no planted symlink in the context (planted_symlink is null)"),
    }
}

/// Row 6: `link(B/secret, A/x)`. Escaped if the link is made (it is removed).
pub(crate) fn hardlink_other_in(ctx: &ProbeContext) -> Verdict {
    let dst = ctx.scratch_dir.join(unique("hardlink"));
    match std::fs::hard_link(&ctx.other_secret_file, &dst) {
        Ok(()) => {
            let _ = std::fs::remove_file(&dst);
            Verdict::escaped(format!(
                "linked {} to {} (removed)",
                ctx.other_secret_file.display(),
                dst.display()
            ))
        }
        Err(e) => Verdict::blocked(format!(
            "link {}: {}",
            ctx.other_secret_file.display(),
            io_name(&e)
        )),
    }
}

/// Row 7: hard link system files (`/etc/passwd`, `/etc/shadow`,
/// `/usr/bin/id`) into A. Escaped if any link is made (removed at once).
pub(crate) fn hardlink_system_file(ctx: &ProbeContext) -> Verdict {
    let mut made = Vec::new();
    let mut refused = Vec::new();
    for src in ["/etc/passwd", "/etc/shadow", "/usr/bin/id"] {
        let dst = ctx.scratch_dir.join(unique("syslink"));
        match std::fs::hard_link(src, &dst) {
            Ok(()) => {
                let _ = std::fs::remove_file(&dst);
                made.push(format!("linked {src} into the own dir (removed)"));
            }
            Err(e) => refused.push(format!("{src}: {}", io_name(&e))),
        }
    }
    if made.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&made))
    }
}

/// Row 8: read the hard link to B's secret planted in A before confinement.
/// Path-based layers cannot stop this (documented residual); only DAC with
/// per-agent uids can. Escaped if readable; skipped if none was planted.
pub fn planted_hardlink(ctx: &ProbeContext) -> Verdict {
    match &ctx.planted_hardlink {
        Some(p) => read_for_marker(p, &ctx.secret_marker, "planted hard link"),
        None => Verdict::skipped("no planted hard link in the context (planted_hardlink is null)"),
    }
}

/// Row 9: `rename(A/f, agents/f)` and `rename(B/secret, A/x)`. Escaped if
/// either works; the moved file is moved back (or removed) at once.
pub(crate) fn rename_across(ctx: &ProbeContext) -> Verdict {
    let mut moved = Vec::new();
    let mut refused = Vec::new();

    let own = ctx.scratch_dir.join(unique("rename-src"));
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&own)
    {
        Err(e) => refused.push(format!(
            "cannot create {} to rename: {}",
            own.display(),
            io_name(&e)
        )),
        Ok(_) => {
            let outside = ctx.agents_dir.join(unique("renamed"));
            match std::fs::rename(&own, &outside) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&outside);
                    if private_tmpfs(&ctx.agents_dir, ctx.supervisor_pid) {
                        refused.push(format!(
                            "renamed an own file into {}, a tmpfs mask private to this sandbox",
                            ctx.agents_dir.display()
                        ));
                    } else {
                        moved.push(format!(
                            "renamed an own file to {} (removed)",
                            outside.display()
                        ));
                    }
                }
                Err(e) => refused.push(format!("rename A→{}: {}", outside.display(), io_name(&e))),
            }
            let _ = std::fs::remove_file(&own);
        }
    }

    let into_a = ctx.scratch_dir.join(unique("stolen"));
    match std::fs::rename(&ctx.other_secret_file, &into_a) {
        Ok(()) => {
            let back = match std::fs::rename(&into_a, &ctx.other_secret_file) {
                Ok(()) => "moved back".to_string(),
                Err(e) => format!(
                    "COULD NOT MOVE IT BACK from {}: {}",
                    into_a.display(),
                    io_name(&e)
                ),
            };
            moved.push(format!(
                "renamed {} into the own dir ({back})",
                ctx.other_secret_file.display()
            ));
        }
        Err(e) => refused.push(format!("rename B/secret→A: {}", io_name(&e))),
    }

    if moved.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&moved))
    }
}

/// Row 10: open B's secret through `/proc/self/root`. Escaped if readable.
pub(crate) fn proc_self_root(ctx: &ProbeContext) -> Verdict {
    let path = below(Path::new("/proc/self/root"), &ctx.other_secret_file);
    read_for_marker(&path, &ctx.secret_marker, "/proc/self/root walk")
}
