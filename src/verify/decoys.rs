//! What the attacks aim at besides agent B: listeners and an IPC object of
//! the host, links planted in the attacker's directory before confinement,
//! and tight limits for the attacked role.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::error::{VerifyError, setup};
use crate::paths::{AgentPaths, Home};
use crate::sandbox::{profile, sys};

/// An abstract Unix socket listening in the host's network namespace.
pub(super) fn abstract_listener(name: &str) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new_abstract(name.as_bytes())?;
    bind(fd.as_raw_fd(), &addr)?;
    listen(&fd, Backlog::new(8).unwrap_or(Backlog::MAXCONN))?;
    Ok(fd)
}

/// A SysV shared-memory segment in the host's IPC namespace, removed on
/// drop.
pub(super) struct HostShm {
    pub key: i32,
    id: i32,
}

impl HostShm {
    /// A fresh segment under a random key; `None` where SysV IPC is not
    /// available (the probe then looks for nothing).
    pub fn create() -> Option<Self> {
        let key = 0x4d4c_0000 | i32::from(rand::random::<u16>());
        let id = sys::shm_create(key, 4096).ok()?;
        Some(Self { key, id })
    }
}

impl Drop for HostShm {
    fn drop(&mut self) {
        let _ = sys::shm_remove(self.id);
    }
}

/// Links planted in the attacker's directory before confinement.
pub(super) struct Planted {
    /// A symlink to B's secret, in A's writable memory directory.
    pub symlink: PathBuf,
    /// A hard link to B's secret there, where the filesystem allows one.
    pub hardlink: Option<PathBuf>,
    /// A setuid-root copy of `id` (as root only).
    pub setuid: Option<PathBuf>,
}

pub(super) fn plant(a: &AgentPaths, secret: &Path, is_root: bool) -> Result<Planted, VerifyError> {
    let mem = a.memory_dir();
    let symlink = mem.join("planted-symlink.md");
    std::os::unix::fs::symlink(secret, &symlink).map_err(setup("planted symlink"))?;
    // Planted only while its own attack runs ([`with_hardlink`]): where
    // agents share a uid the supervisor refuses any child of a tree that
    // holds one, which would stop every other attack too.
    let hardlink = mem.join("planted-hardlink.md");
    let hardlink = std::fs::hard_link(secret, &hardlink)
        .and_then(|()| std::fs::remove_file(&hardlink))
        .ok()
        .map(|()| hardlink);
    // In the agent directory itself, which stays root's (a setuid file in
    // an agent-owned directory would be handed to the agent and lose its bit).
    let setuid = if is_root {
        let p = a.dir().join("id-setuid");
        std::fs::copy("/usr/bin/id", &p)
            .and_then(|_| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)))
            .ok()
            .map(|()| p)
    } else {
        None
    };
    Ok(Planted {
        symlink,
        hardlink,
        setuid,
    })
}

/// Run `attack` with the hard link to `secret` planted at `link` (when the
/// filesystem allows one), removed again afterwards.
pub(super) fn with_hardlink<T>(
    secret: &Path,
    link: Option<&Path>,
    attack: impl FnOnce() -> T,
) -> T {
    let planted = link.filter(|l| std::fs::hard_link(secret, l).is_ok());
    let out = attack();
    if let Some(l) = planted {
        let _ = std::fs::remove_file(l);
    }
    out
}

/// Tight limits for the attacked role (a profile override in the home), so
/// that the memory bomb and the disk fill meet a limit within the probes'
/// bounds.
pub(super) fn tighten_profile(home: &Home, role: &str) -> Result<(), VerifyError> {
    let mut tight = profile::load(home, role).map_err(setup("profile"))?;
    tight.limits.memory_mb = tight.limits.memory_mb.min(192);
    tight.limits.file_size_mb = tight.limits.file_size_mb.min(16);
    tight.limits.pids = tight.limits.pids.min(64);
    let dir = home.sandbox_profiles_dir();
    std::fs::create_dir_all(&dir).map_err(setup("profile override"))?;
    let text = toml::to_string(&tight).map_err(setup("profile override"))?;
    std::fs::write(dir.join(format!("{role}.toml")), text).map_err(setup("profile override"))
}

/// An HTTP server on the host's loopback that the attacker's allow-list
/// names: it answers every request with its marker. Stopped on drop.
pub(super) struct ListedHost {
    pub port: u16,
    pub marker: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ListedHost {
    pub fn start() -> std::io::Result<Self> {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let marker = format!("MINI-LETTA-EGRESS-LISTED-{:016x}", rand::random::<u64>());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, body) = (stop.clone(), marker.clone());
        std::thread::Builder::new()
            .name("verify-listed-host".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let Ok((mut s, _)) = listener.accept() else {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        continue;
                    };
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                    let mut head = [0u8; 4096];
                    let _ = s.read(&mut head);
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            })?;
        Ok(Self { port, marker, stop })
    }
}

impl Drop for ListedHost {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
