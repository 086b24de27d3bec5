//! `mini-letta sandbox verify`: prove the escapes of the catalogue are
//! blocked on this host, through the production launch path.
//!
//! It builds a throw-away home with the attacker (agent A), a decoy agent B
//! holding a secret file, a decoy API key in the supervisor's environment,
//! a sibling child of B, host listeners (TCP on loopback, an abstract Unix
//! socket), a host SysV shared-memory segment, and links planted in A's
//! directory before confinement ([`decoys`]). Then every attack runs in its
//! own confined child of A (`mini-letta-agent probe ID`, started through the
//! supervisor's `child.spawn`), and its verdict is checked again from
//! outside: the secret unchanged, the sibling alive, no hook written
//! ([`attack`]).
//!
//! This module is the orchestration only: the attacks themselves are the
//! probes of [`crate::sandbox::probes`], which know nothing of agents or
//! the supervisor; the tally is [`report`].
//!
//! Strict mode fails on any escape and when fewer than [`MIN_ATTEMPTED`]
//! attacks were actually attempted (skips are reported with their reason).

mod attack;
mod decoys;
mod error;
pub mod report;

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use error::VerifyError;
use error::setup;
pub use report::{AttackResult, MIN_ATTEMPTED, VerifyReport};

use crate::paths::{AgentPaths, Home};
use crate::protocol::client::Client;
use crate::protocol::{Call, SpawnParams, StdioMode};
use crate::sandbox::probes::{self, ProbeContext};
use crate::sandbox::report::{Isolation, SandboxReport};
use crate::sandbox::{identity, profile};
use crate::store;
use crate::supervisor::Session;

/// The decoy key placed in the supervisor's environment.
pub const DECOY_ENV: &str = "OPENAI_API_KEY";

/// Run the catalogue. `on_result` sees each result as it arrives.
pub fn run(
    isolation: Isolation,
    role: &str,
    mut on_result: impl FnMut(&AttackResult),
) -> Result<VerifyReport, VerifyError> {
    let report = SandboxReport::probe();
    // Removed when dropped, whatever happens below.
    let root = tempfile::Builder::new()
        .prefix("mini-letta-verify-")
        .tempdir()
        .map_err(setup("a temporary home"))?;
    run_in(root.path(), &report, isolation, role, &mut on_result)
}

/// The attack reading a hard link planted in the attacker's tree.
const PLANTED_HARDLINK_ATTACK: &str = "08-planted-hardlink";

fn run_in(
    root: &Path,
    report: &SandboxReport,
    isolation: Isolation,
    role: &str,
    on_result: &mut dyn FnMut(&AttackResult),
) -> Result<VerifyReport, VerifyError> {
    let home = temporary_home(root)?;
    let exe = crate::paths::Programs::installed()
        .map_err(setup("mini-letta's programs"))?
        .agent;
    let decoys = Decoys::plant(&home, report, isolation, role)?;

    let mut session = Session::open(&home)?;
    let iso = match isolation {
        Isolation::Strict => "strict",
        Isolation::Degraded => "degraded",
        Isolation::Off => "off",
    };
    session
        .client
        .call_as::<crate::protocol::replies::Subscribed>(Call::Subscribe {})?;
    let (sibling_pid, sibling_child) = spawn_sibling(&mut session.client, &decoys.b, iso)?;
    let profile = profile::load(&home, role).map_err(setup("profile"))?;
    let listed = decoys::ListedHost::start().map_err(setup("listed host"))?;
    let egress = egress_rows(&home, &decoys.a, &profile, report, isolation, &listed)?;
    let ctx = probe_context(&home, &decoys, sibling_pid, report, &profile, role, egress);
    let ctx_json = serde_json::to_string(&ctx).map_err(setup("context"))?;
    let witness = attack::Witness::new(
        decoys.secret.clone(),
        decoys.marker.clone(),
        sibling_pid,
        decoys.a_paths.memory_git_dir().join("hooks"),
    );
    let mut results = Vec::new();
    for attack in probes::catalogue() {
        let link = attack.id == PLANTED_HARDLINK_ATTACK;
        let planted = decoys.planted.hardlink.as_deref().filter(|_| link);
        let verdict = decoys::with_hardlink(&decoys.secret, planted, || {
            attack::run(
                &mut session.client,
                &decoys.a,
                role,
                iso,
                &exe,
                attack.id,
                &ctx_json,
                link,
            )
        });
        let r = AttackResult {
            id: attack.id.to_string(),
            number: attack.number,
            title: attack.title.to_string(),
            verdict: witness.judge(verdict),
        };
        on_result(&r);
        results.push(r);
    }
    let _ = session
        .client
        .call_as::<crate::protocol::replies::Signalled>(Call::Kill {
            child: sibling_child,
            signal: Some(nix::sys::signal::Signal::SIGKILL as i32),
        });
    session.close();
    drop(decoys);
    drop(listed);
    Ok(VerifyReport::new(report.level, isolation, role, results))
}

/// `root`, made private, as the throw-away home.
fn temporary_home(root: &Path) -> Result<Home, VerifyError> {
    std::fs::create_dir_all(root).map_err(setup("temporary home"))?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
        .map_err(setup("temporary home"))?;
    Ok(Home::at(root))
}

/// What the attacker (agent A) is set against: the decoy values, agent B
/// and its secret, the links planted in A's directory, the host's
/// listeners and shared memory (closed and removed when dropped).
struct Decoys {
    marker: String,
    env_value: String,
    /// Agent A's id.
    a: String,
    /// Agent B's id.
    b: String,
    a_paths: AgentPaths,
    b_paths: AgentPaths,
    secret: PathBuf,
    planted: decoys::Planted,
    shm: Option<decoys::HostShm>,
    /// Held open for the probes to try: a TCP listener on loopback and an
    /// abstract Unix socket.
    _tcp: std::net::TcpListener,
    tcp_port: u16,
    abstract_name: String,
    _abstract: OwnedFd,
}

impl Decoys {
    /// Plant everything in `home`, and tighten `role`'s limits.
    fn plant(
        home: &Home,
        report: &SandboxReport,
        isolation: Isolation,
        role: &str,
    ) -> Result<Self, VerifyError> {
        let marker = format!("MINI-LETTA-DECOY-SECRET-{:016x}", rand::random::<u64>());
        let env_value = format!("sk-decoy{:032x}", rand::random::<u128>());
        // The supervisor (embedded in this process) holds the decoy key. Set
        // before any thread exists: the CLI calls us single-threaded.
        // SAFETY: no other thread reads the environment yet.
        unsafe { std::env::set_var(DECOY_ENV, &env_value) };

        let a = store::create(home, "attacker", None).map_err(setup("agent A"))?;
        let b = store::create(home, "decoy", None).map_err(setup("agent B"))?;
        let a_paths = home.agent(&a.id).map_err(setup("agent A"))?;
        let b_paths = home.agent(&b.id).map_err(setup("agent B"))?;
        let secret = b_paths.memory_dir().join("secret.md");
        std::fs::write(&secret, format!("{marker}\n")).map_err(setup("decoy secret"))?;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))
            .map_err(setup("decoy secret"))?;
        let is_root = nix::unistd::geteuid().is_root();
        if isolation != Isolation::Off && report.uid_switch.available {
            let mut b_rec = b.clone();
            let uid = store::ensure_sandbox_uid(home, &mut b_rec, &b_paths)
                .map_err(setup("agent B uid"))?;
            identity::own_agent_dir(&b_paths, uid).map_err(setup("agent B ownership"))?;
        }
        let planted = decoys::plant(&a_paths, &secret, is_root)?;
        std::fs::create_dir_all(a_paths.tmp_dir()).map_err(setup("scratch dir"))?;
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").map_err(setup("TCP listener"))?;
        let tcp_port = tcp.local_addr().map_err(setup("TCP listener"))?.port();
        let abstract_name = format!("mini-letta-verify-{}", rand::random::<u32>());
        let _abstract =
            decoys::abstract_listener(&abstract_name).map_err(setup("abstract socket"))?;
        let shm = decoys::HostShm::create();
        decoys::tighten_profile(home, role)?;
        Ok(Decoys {
            marker,
            env_value,
            a: a.id,
            b: b.id,
            a_paths,
            b_paths,
            secret,
            planted,
            shm,
            _tcp: tcp,
            tcp_port,
            abstract_name,
            _abstract,
        })
    }
}

/// A child of agent B sleeping beside the attacker's (a sibling no probe
/// may signal): its host pid and its child id.
fn spawn_sibling(client: &mut Client, agent: &str, iso: &str) -> Result<(u32, u64), VerifyError> {
    let sibling: crate::protocol::replies::Started = client.call_as(Call::Spawn(SpawnParams {
        agent: agent.to_string(),
        role: "tool".into(),
        argv: vec!["sleep".into(), "3600".into()],
        stdio: StdioMode::Null,
        workspace: None,
        isolation: Some(iso.into()),
        model: None,
    }))?;
    Ok((sibling.pid, sibling.child))
}

/// What every probe is told: where the decoys are and what they hold.
fn probe_context(
    home: &Home,
    decoys: &Decoys,
    sibling_pid: u32,
    report: &SandboxReport,
    profile: &profile::Profile,
    role: &str,
    egress: Option<probes::EgressContext>,
) -> ProbeContext {
    let Decoys {
        a_paths, b_paths, ..
    } = decoys;
    ProbeContext {
        own_agent_dir: a_paths.dir().to_path_buf(),
        own_memory_git_dir: a_paths.memory_git_dir(),
        other_agent_dir: b_paths.dir().to_path_buf(),
        other_secret_file: decoys.secret.clone(),
        secret_marker: decoys.marker.clone(),
        agents_dir: home.agents_dir(),
        supervisor_pid: std::process::id(),
        sibling_pid,
        env_secret_name: DECOY_ENV.into(),
        env_secret_value: decoys.env_value.clone(),
        control_socket: home.supervisor_socket(),
        host_tcp_port: decoys.tcp_port,
        host_abstract_socket: decoys.abstract_name.clone(),
        planted_symlink: Some(decoys.planted.symlink.clone()),
        planted_hardlink: decoys.planted.hardlink.clone(),
        planted_setuid: decoys.planted.setuid.clone(),
        host_shm_name: decoys.shm.as_ref().map(|s| format!("{:#x}", s.key)),
        pids_limit: pids_limited(report).then_some(profile.limits.pids),
        fsize_limit: Some(profile.limits.file_size_mb.saturating_mul(1024 * 1024)),
        scratch_dir: a_paths.tmp_dir(),
        read_only_checkout: ["reflection", "memory-worker", "recall"]
            .contains(&role)
            .then(|| a_paths.memory_dir()),
        egress,
        by_design: by_design(report),
    }
}

/// What the host's level leaves out by design (see [`probes::ByDesign`]).
fn by_design(report: &SandboxReport) -> Option<probes::ByDesign> {
    let missing = |l: &crate::sandbox::report::Layer, what: &str| {
        (!l.available).then(|| format!("{what}: {}", l.detail))
    };
    // Children running as the user, with no user namespace of their own
    // to count or drop capabilities in.
    let bare_user = !report.uid_switch.available
        && !nix::unistd::geteuid().is_root()
        && !report.namespaces.available;
    let d = probes::ByDesign {
        level: format!("{:?}", report.level),
        no_pid_namespace: missing(&report.namespaces, "no pid namespace"),
        no_cgroup: missing(&report.cgroup, "no cgroup"),
        keeps_bounding_set: bare_user.then(|| {
            "an unprivileged process with no user namespace of its own cannot empty its \
             capability bounding set (that takes CAP_SETPCAP)"
                .to_string()
        }),
        shared_process_limit: (bare_user && !report.cgroup.available).then(|| {
            "without a cgroup or a user namespace of its own, RLIMIT_NPROC counts every \
             process of the user: the limit is the user's count at launch plus the role's, \
             and others ending make room"
                .to_string()
        }),
    };
    let all = d.no_pid_namespace.is_none() && d.no_cgroup.is_none();
    (!all || bare_user).then_some(d)
}

/// Whether the attacker's processes are counted against the role's pids
/// limit: by its cgroup, or by `RLIMIT_NPROC`, which binds any host uid
/// but 0 (an agent uid, or the user's own in the child's user namespace).
fn pids_limited(report: &SandboxReport) -> bool {
    report.cgroup.available || report.uid_switch.available || !nix::unistd::geteuid().is_root()
}

/// When the attacked role's children get the egress proxy: the
/// attacker's allow-list names the listed host (and nothing else), and
/// the egress rows learn where both are.
fn egress_rows(
    home: &Home,
    attacker: &str,
    profile: &profile::Profile,
    report: &SandboxReport,
    isolation: Isolation,
    listed: &decoys::ListedHost,
) -> Result<Option<probes::EgressContext>, VerifyError> {
    let proxied = profile.network == profile::Network::Proxy
        && isolation != Isolation::Off
        && crate::sandbox::plan::egress_possible(report);
    if !proxied {
        return Ok(None);
    }
    let list = crate::egress::allow::AllowList::parse(&[format!("localhost:{}", listed.port)])
        .map_err(VerifyError::Setup)?;
    crate::egress::policy::write(home, attacker, &list).map_err(setup("allow-list"))?;
    Ok(Some(probes::EgressContext {
        proxy_port: crate::egress::PORT,
        listed_port: listed.port,
        marker: listed.marker.clone(),
    }))
}
