//! `mini-letta sandbox verify`: prove the escapes of the catalogue are
//! blocked on this host, through the production launch path.
//!
//! It builds a throw-away home with the attacker (agent A), a decoy agent B
//! holding a secret file, a decoy API key in the supervisor's environment,
//! a sibling child of B, host listeners (TCP on loopback, an abstract Unix
//! socket), a host SysV shared-memory segment, and links planted in A's
//! directory before confinement. Then every attack runs in its own confined
//! child of A (`mini-letta __probe ID`), and its verdict is checked again
//! from outside (the secret unchanged, the sibling alive, no hook written).
//!
//! Strict mode fails on any escape and when fewer than [`MIN_ATTEMPTED`]
//! attacks were actually attempted (skips are reported with their reason).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::identity;
use super::probes::{self, ProbeContext, Verdict};
use super::report::{Isolation, SandboxReport};
use crate::agent::store;
use crate::paths::Home;
use crate::protocol::{Call, SpawnParams, StdioMode};
use crate::supervisor::Session;

/// Attacks that must actually run (not be skipped) for strict mode to pass.
pub const MIN_ATTEMPTED: usize = 40;

/// The decoy key placed in the supervisor's environment.
pub const DECOY_ENV: &str = "OPENAI_API_KEY";

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("verify setup: {0}")]
    Setup(String),
    #[error(transparent)]
    Supervisor(#[from] crate::supervisor::SupervisorError),
    #[error(transparent)]
    Client(#[from] crate::protocol::client::ClientError),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> VerifyError + '_ {
    move |e| VerifyError::Setup(format!("{what}: {e}"))
}

/// One attack's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct AttackResult {
    pub id: String,
    pub number: u32,
    pub title: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub level: super::report::Level,
    pub isolation: Isolation,
    pub role: String,
    pub results: Vec<AttackResult>,
    pub blocked: usize,
    pub escaped: usize,
    pub skipped: usize,
    /// Why the run fails, if it does.
    pub failures: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Run the catalogue. `on_result` sees each result as it arrives.
pub fn run(
    isolation: Isolation,
    role: &str,
    mut on_result: impl FnMut(&AttackResult),
) -> Result<VerifyReport, VerifyError> {
    let report = SandboxReport::probe();
    let root = std::env::temp_dir().join(format!(
        "mini-letta-verify-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let result = run_in(&root, &report, isolation, role, &mut on_result);
    let _ = std::fs::remove_dir_all(&root);
    result
}

fn run_in(
    root: &Path,
    report: &SandboxReport,
    isolation: Isolation,
    role: &str,
    on_result: &mut dyn FnMut(&AttackResult),
) -> Result<VerifyReport, VerifyError> {
    std::fs::create_dir_all(root).map_err(setup("temporary home"))?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
        .map_err(setup("temporary home"))?;
    let home = Home::at(root);
    let exe = std::env::current_exe().map_err(setup("own executable"))?;
    let marker = format!("MINI-LETTA-DECOY-SECRET-{:016x}", rand::random::<u64>());
    let env_value = format!("sk-decoy{:032x}", rand::random::<u128>());
    // The supervisor (embedded in this process) holds the decoy key. Set
    // before any thread exists: the CLI calls us single-threaded.
    // SAFETY: no other thread reads the environment yet.
    unsafe { std::env::set_var(DECOY_ENV, &env_value) };

    let a = store::create(&home, "attacker", None).map_err(setup("agent A"))?;
    let b = store::create(&home, "decoy", None).map_err(setup("agent B"))?;
    let a_paths = home.agent(&a.id).map_err(setup("agent A"))?;
    let b_paths = home.agent(&b.id).map_err(setup("agent B"))?;
    let secret = b_paths.memory_dir().join("secret.md");
    std::fs::write(&secret, format!("{marker}\n")).map_err(setup("decoy secret"))?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))
        .map_err(setup("decoy secret"))?;
    let is_root = nix::unistd::geteuid().is_root();
    if isolation != Isolation::Off && report.uid_switch.available {
        let mut b_rec = b.clone();
        let uid =
            identity::ensure_uid(&home, &mut b_rec, &b_paths).map_err(setup("agent B uid"))?;
        identity::own_agent_dir(&b_paths, uid).map_err(setup("agent B ownership"))?;
    }
    // Planted before confinement, in A's writable memory directory.
    let a_mem = a_paths.memory_dir();
    let planted_symlink = a_mem.join("planted-symlink.md");
    std::os::unix::fs::symlink(&secret, &planted_symlink).map_err(setup("planted symlink"))?;
    let planted_hardlink = a_mem.join("planted-hardlink.md");
    let planted_hardlink = std::fs::hard_link(&secret, &planted_hardlink)
        .ok()
        .map(|()| planted_hardlink);
    std::fs::create_dir_all(a_paths.tmp_dir()).map_err(setup("scratch dir"))?;
    // In the agent directory itself, which stays root's (a setuid file in
    // an agent-owned directory would be handed to the agent and lose its bit).
    let planted_setuid = if is_root {
        let p = a_paths.dir().join("id-setuid");
        std::fs::copy("/usr/bin/id", &p)
            .and_then(|_| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)))
            .ok()
            .map(|()| p)
    } else {
        None
    };
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").map_err(setup("TCP listener"))?;
    let tcp_port = tcp.local_addr().map_err(setup("TCP listener"))?.port();
    let abstract_name = format!("mini-letta-verify-{}", rand::random::<u32>());
    let _abstract = abstract_listener(&abstract_name).map_err(setup("abstract socket"))?;
    let shm = HostShm::create();

    // Tight limits for the attacked role, so that the memory bomb and the
    // disk fill meet a limit within the probes' bounds.
    let base = super::profile::load(&home, role).map_err(setup("profile"))?;
    let mut tight = base.clone();
    tight.limits.memory_mb = tight.limits.memory_mb.min(192);
    tight.limits.file_size_mb = tight.limits.file_size_mb.min(16);
    tight.limits.pids = tight.limits.pids.min(64);
    let dir = home.sandbox_profiles_dir();
    std::fs::create_dir_all(&dir).map_err(setup("profile override"))?;
    let text = toml::to_string(&tight).map_err(setup("profile override"))?;
    std::fs::write(dir.join(format!("{role}.toml")), text).map_err(setup("profile override"))?;

    let mut session = Session::open(&home)?;
    let iso = match isolation {
        Isolation::Strict => "strict",
        Isolation::Degraded => "degraded",
        Isolation::Off => "off",
    };
    session.client.call(Call::Subscribe {})?;
    let sibling = session.client.call(Call::Spawn(SpawnParams {
        agent: b.id.clone(),
        role: "tool".into(),
        argv: vec!["sleep".into(), "3600".into()],
        stdio: StdioMode::Null,
        workspace: None,
        isolation: Some(iso.into()),
        model: None,
    }))?;
    let sibling_pid = sibling["pid"].as_u64().unwrap_or(0) as u32;
    let sibling_child = sibling["child"].as_u64().unwrap_or(0);
    let profile = super::profile::load(&home, role).map_err(setup("profile"))?;
    let ctx = ProbeContext {
        own_agent_dir: a_paths.dir().to_path_buf(),
        own_memory_git_dir: a_paths.memory_git_dir(),
        other_agent_dir: b_paths.dir().to_path_buf(),
        other_secret_file: secret.clone(),
        secret_marker: marker.clone(),
        agents_dir: home.agents_dir(),
        supervisor_pid: std::process::id(),
        sibling_pid,
        env_secret_name: DECOY_ENV.into(),
        env_secret_value: env_value.clone(),
        control_socket: home.supervisor_socket(),
        host_tcp_port: tcp_port,
        host_abstract_socket: abstract_name.clone(),
        planted_symlink: Some(planted_symlink),
        planted_hardlink,
        planted_setuid,
        host_shm_name: shm.as_ref().map(|s| format!("{:#x}", s.key)),
        pids_limit: report.cgroup.available.then_some(profile.limits.pids),
        fsize_limit: Some(profile.limits.file_size_mb.saturating_mul(1024 * 1024)),
        scratch_dir: a_paths.tmp_dir(),
    };
    let ctx_json = serde_json::to_string(&ctx).map_err(setup("context"))?;
    let hooks_before = list_dir(&a_paths.memory_git_dir().join("hooks"));
    let mut results = Vec::new();
    for attack in probes::catalogue() {
        let verdict = run_attack(&mut session, &a.id, role, iso, &exe, attack.id, &ctx_json);
        let verdict = check_side_effects(
            verdict,
            &secret,
            &marker,
            sibling_pid,
            &a_paths,
            &hooks_before,
        );
        let r = AttackResult {
            id: attack.id.to_string(),
            number: attack.number,
            title: attack.title.to_string(),
            verdict,
        };
        on_result(&r);
        results.push(r);
    }
    let _ = session.client.call(Call::Kill {
        child: sibling_child,
        signal: Some(libc::SIGKILL),
    });
    session.close();
    drop(shm);
    drop(tcp);

    let count = |f: fn(&Verdict) -> bool| results.iter().filter(|r| f(&r.verdict)).count();
    let blocked = count(Verdict::is_blocked);
    let escaped = count(Verdict::is_escaped);
    let skipped = count(Verdict::is_skipped);
    let mut failures = Vec::new();
    if escaped > 0 {
        failures.push(format!("{escaped} attack(s) escaped"));
    }
    if isolation == Isolation::Strict && blocked + escaped < MIN_ATTEMPTED {
        failures.push(format!(
            "only {} attacks could be attempted; strict mode needs at least {MIN_ATTEMPTED}",
            blocked + escaped
        ));
    }
    Ok(VerifyReport {
        level: report.level,
        isolation,
        role: role.to_string(),
        results,
        blocked,
        escaped,
        skipped,
        failures,
    })
}

/// Run one probe in a confined child of A and read its verdict.
fn run_attack(
    session: &mut Session,
    agent: &str,
    role: &str,
    iso: &str,
    exe: &Path,
    id: &str,
    ctx: &str,
) -> Verdict {
    let (mut out_r, out_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Verdict::skipped(format!("cannot create a pipe: {e}")),
    };
    let null = match std::fs::File::open("/dev/null") {
        Ok(f) => OwnedFd::from(f),
        Err(e) => return Verdict::skipped(format!("cannot open /dev/null: {e}")),
    };
    // The context (with the decoy values the probes look for) goes in on
    // stdin, never in argv or the environment, where a probe would find it
    // and report a false escape.
    let (in_r, mut in_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Verdict::skipped(format!("cannot create a pipe: {e}")),
    };
    let in_r = OwnedFd::from(in_r);
    let out_w = OwnedFd::from(out_w);
    let fds = [in_r.as_raw_fd(), out_w.as_raw_fd(), null.as_raw_fd()];
    let spawn = Call::Spawn(SpawnParams {
        agent: agent.into(),
        role: role.into(),
        argv: vec![
            exe.display().to_string(),
            "__probe".into(),
            id.into(),
            "--context".into(),
            "-".into(),
        ],
        stdio: StdioMode::Passed,
        workspace: None,
        isolation: Some(iso.into()),
        model: None,
    });
    let client = &mut session.client;
    let req = match client.send_request_with_fds(spawn, &fds) {
        Ok(id) => id,
        Err(e) => return Verdict::skipped(format!("cannot start the probe: {e}")),
    };
    drop(out_w);
    drop(null);
    drop(in_r);
    {
        use std::io::Write;
        let _ = in_w.write_all(ctx.as_bytes());
    }
    drop(in_w);
    let mut exits: Vec<Value> = Vec::new();
    let child = match client.wait_response(req, |event, data| {
        if event == "child.exit" {
            exits.push(data.clone());
        }
    }) {
        Ok(v) => v["child"].as_u64().unwrap_or(0),
        Err(e) => return Verdict::skipped(format!("the supervisor refused the probe: {e}")),
    };
    let mut output = String::new();
    let _ = out_r.read_to_string(&mut output);
    let exit = match client.wait_child_exit(child, &mut exits) {
        Ok(e) => e,
        Err(e) => return Verdict::skipped(format!("lost the supervisor: {e}")),
    };
    let last = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    if let Some(line) = last
        && let Ok(v) = serde_json::from_str::<Value>(line)
        && let Ok(verdict) = serde_json::from_value::<Verdict>(v.clone())
    {
        return verdict;
    }
    match (exit["signal"].as_i64(), exit["code"].as_i64()) {
        (Some(sig), _) => Verdict::blocked(format!("the probe process was killed by signal {sig}")),
        (_, code) => Verdict::skipped(format!(
            "the probe gave no verdict (exit {}): {}",
            code.unwrap_or(-1),
            output.trim()
        )),
    }
}

/// Look from outside: a probe that says "blocked" while the secret changed,
/// the sibling died or a hook appeared is an escape all the same.
fn check_side_effects(
    verdict: Verdict,
    secret: &Path,
    marker: &str,
    sibling: u32,
    a: &crate::paths::AgentPaths,
    hooks_before: &[PathBuf],
) -> Verdict {
    if verdict.is_escaped() {
        return verdict;
    }
    if std::fs::read_to_string(secret)
        .map(|s| s.trim() != marker)
        .unwrap_or(true)
    {
        return Verdict::escaped("the decoy agent's secret file was changed or removed");
    }
    if sibling != 0
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(sibling as i32), None).is_err()
    {
        return Verdict::escaped("the sibling child is gone");
    }
    if list_dir(&a.memory_git_dir().join("hooks")) != hooks_before {
        return Verdict::escaped("a file appeared in the memory git directory's hooks/");
    }
    verdict
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn abstract_listener(name: &str) -> std::io::Result<OwnedFd> {
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

/// A SysV shared-memory segment in the host's IPC namespace.
struct HostShm {
    key: i32,
    id: i32,
}

impl HostShm {
    fn create() -> Option<Self> {
        let key = 0x4d4c_0000 | (rand::random::<u16>() as i32);
        // SAFETY: plain SysV IPC calls; the segment is removed on drop.
        let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o600) };
        (id >= 0).then_some(Self { key, id })
    }
}

impl Drop for HostShm {
    fn drop(&mut self) {
        // SAFETY: removing the segment we created.
        unsafe {
            libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}
