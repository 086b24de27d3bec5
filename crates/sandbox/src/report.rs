//! Which confinement layers this host offers, probed once at supervisor start,
//! and the isolation level they add up to (spec sandbox.md §c.9).
//!
//! | level | layers |
//! |---|---|
//! | L0 | per-agent uid + namespaces (bwrap) + landlock ≥ V6 + seccomp + cgroup |
//! | L2 | no namespaces: uid + landlock ≥ V6 + seccomp (+ cgroup) |
//! | L3 | as L2 with landlock V4/V5 (no signal/abstract-socket scopes) |
//! | L4 | no landlock and no namespaces: uid + seccomp only |
//!
//! `strict` accepts L0 and L2; `degraded` accepts anything but nothing at all;
//! `off` runs unconfined. (L1, a refused `/proc` mount, does not occur with
//! our bwrap invocation and is not distinguished.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// Landlock ABI below which signal and abstract-socket scopes are missing.
pub const LANDLOCK_SCOPES_ABI: i32 = 6;

pub use super::subids::DISABLE_ENV;

/// The isolation level reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Level {
    L0,
    L2,
    L3,
    L4,
    /// No confinement layer at all.
    None,
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    Strict,
    Degraded,
    Off,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strict" => Ok(Self::Strict),
            "degraded" => Ok(Self::Degraded),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "unknown isolation level {other:?} (strict, degraded, off)"
            )),
        }
    }
}

impl Isolation {
    /// Whether `level` is enough for this mode.
    pub fn accepts(self, level: Level) -> bool {
        match self {
            Self::Strict => matches!(level, Level::L0 | Level::L2),
            Self::Degraded => level != Level::None,
            Self::Off => true,
        }
    }
}

/// One layer's probe result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Layer {
    pub available: bool,
    /// Why it is missing, or what was found.
    pub detail: String,
}

impl Layer {
    fn yes(detail: impl Into<String>) -> Self {
        Self {
            available: true,
            detail: detail.into(),
        }
    }
    fn no(detail: impl Into<String>) -> Self {
        Self {
            available: false,
            detail: detail.into(),
        }
    }
}

/// Cgroup facts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CgroupInfo {
    /// `"v2"`, `"v1"` or `"none"`.
    pub version: String,
    /// Directories where per-agent groups are made (v1: one per controller).
    pub roots: Vec<PathBuf>,
}

/// The host's confinement capabilities.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxReport {
    pub level: Level,
    pub backend: String,
    pub bwrap: Option<PathBuf>,
    /// How namespaces are made, when they are.
    pub ns_backend: Option<NsBackend>,
    pub namespaces: Layer,
    pub landlock: Layer,
    pub landlock_abi: i32,
    pub seccomp: Layer,
    pub cgroup: Layer,
    pub cgroup_info: CgroupInfo,
    pub uid_switch: Layer,
    pub no_new_privs: Layer,
    /// Layers switched off by the operator.
    pub disabled: Vec<String>,
    /// One line per missing layer.
    pub missing: Vec<String>,
}

impl SandboxReport {
    /// Probe this host.
    pub fn probe() -> Self {
        let disabled = disabled_layers();
        let off = |name: &str| disabled.iter().any(|d| d == name);

        let landlock_abi = landlock_abi();
        let landlock = if off("landlock") {
            Layer::no(format!("disabled by {DISABLE_ENV}"))
        } else if landlock_abi <= 0 {
            Layer::no("the kernel has no landlock (landlock_create_ruleset failed)")
        } else {
            Layer::yes(format!("ABI {landlock_abi}"))
        };
        let seccomp = if off("seccomp") {
            Layer::no(format!("disabled by {DISABLE_ENV}"))
        } else {
            match std::fs::read_to_string("/proc/self/status") {
                Ok(s) if s.contains("Seccomp:") => seccomp_layer(),
                _ => Layer::no("/proc/self/status has no Seccomp field"),
            }
        };
        let is_root = nix::unistd::geteuid().is_root();
        let uid_switch = uid_switch_layer(off("uid"));
        let bwrap = find_bwrap();
        let (namespaces, ns_backend) = if off("namespaces") {
            (Layer::no(format!("disabled by {DISABLE_ENV}")), None)
        } else {
            probe_namespaces(bwrap.as_deref(), is_root)
        };
        let (cgroup_info, cgroup) = cgroup_layer(off("cgroup"));
        let no_new_privs = Layer::yes("prctl(PR_SET_NO_NEW_PRIVS) before exec");

        let level = compute_level(
            namespaces.available,
            landlock.available,
            landlock_abi,
            seccomp.available,
        );
        let mut report = Self {
            level,
            // Both summed up below, from the layers.
            backend: String::new(),
            bwrap,
            ns_backend,
            namespaces,
            landlock,
            landlock_abi,
            seccomp,
            cgroup,
            cgroup_info,
            uid_switch,
            no_new_privs,
            disabled,
            missing: Vec::new(),
        };
        report.missing = report.missing_layers();
        report.backend = report.backend_name();
        report
    }

    /// One line per layer this host lacks, and for landlock without the
    /// signal and abstract-socket scopes.
    fn missing_layers(&self) -> Vec<String> {
        let mut missing = Vec::new();
        for (name, l) in [
            ("namespaces", &self.namespaces),
            ("landlock", &self.landlock),
            ("seccomp", &self.seccomp),
            ("cgroup", &self.cgroup),
            ("uid", &self.uid_switch),
        ] {
            if !l.available {
                missing.push(format!("{name}: {}", l.detail));
            }
        }
        let landlock_abi = self.landlock_abi;
        if self.landlock.available && landlock_abi < LANDLOCK_SCOPES_ABI {
            missing.push(format!(
                "landlock scopes: ABI {landlock_abi} < {LANDLOCK_SCOPES_ABI} (signals and abstract sockets unscoped)"
            ));
        }
        missing
    }

    /// The layers this host has, joined with `+` (`bwrap+landlock+…`).
    fn backend_name(&self) -> String {
        [
            (
                self.namespaces.available,
                match self.ns_backend {
                    Some(NsBackend::Bwrap) => "bwrap",
                    _ => "namespaces",
                },
            ),
            (self.landlock.available, "landlock"),
            (self.seccomp.available, "seccomp"),
            (self.cgroup.available, "cgroup"),
            (self.uid_switch.available, "uid"),
        ]
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join("+")
    }
}

/// The layers the operator switched off: `DISABLE_ENV`'s comma-separated
/// names.
fn disabled_layers() -> Vec<String> {
    std::env::var(DISABLE_ENV)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The per-agent uid layer: how children get a uid of their own (host
/// root, or this user's subordinate range), or why they keep this user's.
/// The subordinate ids are looked at even when the layer is `off`.
fn uid_switch_layer(off: bool) -> Layer {
    match super::subids::status() {
        _ if off => Layer::no(format!("disabled by {DISABLE_ENV}")),
        super::subids::Status::HostRoot => probe_uid_switch(),
        super::subids::Status::Mapped { uids, .. } => match probe_uid_switch() {
            l if l.available => Layer::yes(format!(
                "each agent runs as its own uid from this user's subordinate range \
                 {}..{} (mapped with newuidmap)",
                uids.start,
                uids.start + uids.count
            )),
            l => l,
        },
        super::subids::Status::Shared(why) => Layer::no(format!(
            "children keep this user's uid ({why}); agents are kept apart by their own \
             namespaces and landlock rules, by refusing memory files with a second link \
             or another owner, and by a process limit per sandbox"
        )),
    }
}

/// The cgroup facts (none when `off`) and the layer they make.
fn cgroup_layer(off: bool) -> (CgroupInfo, Layer) {
    let cgroup_info = if off {
        CgroupInfo {
            version: "none".into(),
            roots: Vec::new(),
        }
    } else {
        probe_cgroup()
    };
    let cgroup = if off {
        Layer::no(format!("disabled by {DISABLE_ENV}"))
    } else if cgroup_info.roots.is_empty() {
        Layer::no("no writable pids/memory cgroup hierarchy")
    } else {
        Layer::yes(format!(
            "cgroup {} at {:?}",
            cgroup_info.version, cgroup_info.roots
        ))
    };
    (cgroup_info, cgroup)
}

/// Whether root here can really become an agent uid: a user namespace
/// (a rootless container engine, say) may map uid 0 and nothing of the
/// agent range, and then every switch fails. One short-lived `true` run as
/// [`super::identity::probe_uid`] tells.
fn probe_uid_switch() -> Layer {
    use std::os::unix::process::CommandExt;
    let uid = super::identity::probe_uid();
    let Some(program) = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        return Layer::yes(
            "supervisor is root: each agent runs as its own uid (not probed: no true)",
        );
    };
    match Command::new(program)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Layer::yes("supervisor is root: each agent runs as its own uid"),
        Ok(s) => Layer::no(format!(
            "a process switched to agent uid {uid} did not run ({s})"
        )),
        Err(e) => Layer::no(format!(
            "root cannot switch to agent uid {uid} ({e}): a user namespace that does not map \
the agent uid range {}..{}?",
            super::identity::UID_BASE,
            super::identity::UID_BASE + super::subids::agent_uid_count()
        )),
    }
}

/// The level the available layers add up to.
/// The seccomp layer on a kernel that has filter mode: available when our
/// filter exists for this architecture (the stage refuses to run without
/// it), with the size of each role's allow-list.
fn seccomp_layer() -> Layer {
    use super::seccomp::{Options, Role, allowed, checked, program};
    let opts = Options {
        no_network: true,
        private_ipc: true,
        egress: false,
    };
    if let Err(e) = program(Role::Agent, opts) {
        return Layer::no(e.to_string());
    }
    let sizes: Vec<String> = Role::ALL
        .iter()
        .map(|r| format!("{r} {}", allowed(*r, opts).len() + checked(true).len()))
        .collect();
    Layer::yes(format!(
        "filter mode available; allow-list per role at L0 ({} calls), ENOSYS for the rest",
        sizes.join(", ")
    ))
}

pub(crate) fn compute_level(namespaces: bool, landlock: bool, abi: i32, seccomp: bool) -> Level {
    match (namespaces, landlock, seccomp) {
        (true, true, true) if abi >= LANDLOCK_SCOPES_ABI => Level::L0,
        (_, true, true) if abi >= LANDLOCK_SCOPES_ABI => Level::L2,
        (_, true, true) => Level::L3,
        (_, false, true) | (_, true, false) => Level::L4,
        (true, false, false) => Level::L4,
        (false, false, false) => Level::None,
    }
}

/// The kernel's landlock ABI version (0 when unavailable).
pub fn landlock_abi() -> i32 {
    super::sys::landlock_abi_version().unwrap_or(0)
}

/// Which namespace backend to use: `MINI_LETTA_NAMESPACES=native` (the
/// default: the child stage makes its own) or `bwrap` (the Debian
/// bubblewrap binary), read by the supervisor at start.
pub const NAMESPACES_ENV: &str = "MINI_LETTA_NAMESPACES";

/// How a child's namespaces are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NsBackend {
    Native,
    Bwrap,
}

/// Native namespaces unless bubblewrap is asked for; bubblewrap when the
/// native probe fails (and it works).
fn probe_namespaces(bwrap: Option<&Path>, is_root: bool) -> (Layer, Option<NsBackend>) {
    let via_bwrap = || match bwrap {
        None => Err("bwrap (bubblewrap) not found".to_string()),
        Some(b) => try_bwrap(b, is_root)
            .map(|()| format!("{} works unprivileged", b.display()))
            .map_err(|e| format!("{} cannot create namespaces: {e}", b.display())),
    };
    let want_bwrap = std::env::var(NAMESPACES_ENV).is_ok_and(|v| v == "bwrap");
    if want_bwrap {
        return match via_bwrap() {
            Ok(d) => (Layer::yes(d), Some(NsBackend::Bwrap)),
            Err(e) => (Layer::no(e), None),
        };
    }
    let uid = is_root.then_some(crate::identity::probe_uid());
    match super::namespaces::probe(uid) {
        Ok(()) => (
            Layer::yes(
                "native: user, mount, pid, net, ipc, uts and cgroup namespaces made unprivileged by the child stage",
            ),
            Some(NsBackend::Native),
        ),
        Err(native) => match via_bwrap() {
            Ok(d) => (
                Layer::yes(format!("{d} (native namespaces unavailable: {native})")),
                Some(NsBackend::Bwrap),
            ),
            Err(e) => (Layer::no(format!("native: {native}; {e}")), None),
        },
    }
}

fn find_bwrap() -> Option<PathBuf> {
    // Fixed locations first: the supervisor's PATH may name writable dirs.
    for p in ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"] {
        if Path::new(p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// Run `bwrap … true` the way children are run (unprivileged) and report
/// whether it could create its namespaces.
fn try_bwrap(bwrap: &Path, as_root: bool) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bwrap);
    cmd.args(super::namespaces::BWRAP_BASE_ARGS)
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if as_root {
        // Probe as an unprivileged uid, as the children will run.
        cmd.uid(crate::identity::probe_uid())
            .gid(crate::identity::probe_uid());
    }
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether this process may make groups under `root` (issue 44: a
/// directory a root supervisor made is there for an ordinary user too, who
/// may not write it — `status` said "cgroup yes", and the turn failed).
/// A probe group is made and removed again.
fn can_make_groups(root: &Path) -> bool {
    let probe = root.join(format!("probe-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            true
        }
        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
    }
}

/// The subtree of the v2 hierarchy at `base` delegated to this process's
/// user (systemd's `user@UID.service`, say): the highest group on the way
/// from the root to this process's own (`self_cgroup`, the text of
/// `/proc/self/cgroup`) whose `cgroup.procs` and `cgroup.subtree_control`
/// belong to `me`. Never a group someone else owns: a root-owned
/// directory is root's, even where it happens to be writable.
pub(crate) fn delegated_root(base: &Path, self_cgroup: &str, me: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let own = self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim()
        .trim_start_matches('/');
    let mut at = base.to_path_buf();
    for part in Path::new(own).components() {
        let std::path::Component::Normal(name) = part else {
            return None;
        };
        at.push(name);
        let mine = |f: &str| std::fs::metadata(at.join(f)).is_ok_and(|m| m.uid() == me);
        if mine("cgroup.procs") && mine("cgroup.subtree_control") {
            return Some(at);
        }
    }
    None
}

/// `root` made (or found) under `parent`, with `pids` and `memory` (and
/// `cpu` where it can be had) enabled for the groups made below it.
fn groups_root(parent: &Path) -> Option<PathBuf> {
    let root = parent.join("mini-letta");
    if std::fs::create_dir_all(&root).is_err() || !can_make_groups(&root) {
        return None;
    }
    let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+pids +memory");
    let _ = std::fs::write(root.join("cgroup.subtree_control"), "+pids +memory");
    // The CPU limit where the controller can be had (optional).
    let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpu");
    let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
    let has_pids = std::fs::read_to_string(root.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "pids"));
    has_pids.then_some(root)
}

fn probe_cgroup() -> CgroupInfo {
    let base = Path::new("/sys/fs/cgroup");
    // v2: a unified hierarchy with the controllers we need enabled — its
    // root's, or the subtree delegated to this user.
    if let Ok(ctrl) = std::fs::read_to_string(base.join("cgroup.controllers"))
        && ctrl.split_whitespace().any(|c| c == "pids")
    {
        let delegated = || {
            let me = nix::unistd::geteuid().as_raw();
            let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
            groups_root(&delegated_root(base, &own, me)?)
        };
        if let Some(root) = groups_root(base).or_else(delegated) {
            return CgroupInfo {
                version: "v2".into(),
                roots: vec![root],
            };
        }
    }
    // v1: separate pids and memory hierarchies (and cpu where mounted).
    let mut roots = Vec::new();
    for ctrl in ["pids", "memory", "cpu"] {
        let dir = base.join(ctrl);
        if dir.join("cgroup.procs").exists() {
            let root = dir.join("mini-letta");
            if std::fs::create_dir_all(&root).is_ok() && can_make_groups(&root) {
                roots.push(root);
            }
        }
    }
    CgroupInfo {
        version: if roots.is_empty() {
            "none".into()
        } else {
            "v1".into()
        },
        roots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delegated_subtree_is_the_highest_group_the_user_owns() {
        let t = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let own = "user.slice/user-1000.slice/user@1000.service/app.slice/term.scope";
        let mut at = t.path().to_path_buf();
        for (i, part) in own.split('/').enumerate() {
            at.push(part);
            std::fs::create_dir(&at).unwrap();
            // Above the delegation the files are not the user's (absent
            // here; root's on a real host).
            if i >= 2 {
                for f in ["cgroup.procs", "cgroup.subtree_control"] {
                    std::fs::write(at.join(f), "").unwrap();
                }
            }
        }
        let text = format!("0::/{own}\n");
        assert_eq!(
            delegated_root(t.path(), &text, me),
            Some(
                t.path()
                    .join("user.slice/user-1000.slice/user@1000.service")
            )
        );
        assert_eq!(
            delegated_root(t.path(), &text, me + 1),
            None,
            "not the user's"
        );
        assert_eq!(delegated_root(t.path(), "1:pids:/x\n", me), None, "v1 only");
        assert_eq!(
            delegated_root(t.path(), "0::/../../etc\n", me),
            None,
            "a path out of the hierarchy"
        );
    }

    #[test]
    fn levels() {
        assert_eq!(compute_level(true, true, 7, true), Level::L0);
        assert_eq!(compute_level(false, true, 7, true), Level::L2);
        assert_eq!(compute_level(false, true, 5, true), Level::L3);
        assert_eq!(compute_level(true, true, 5, true), Level::L3);
        assert_eq!(compute_level(false, false, 0, true), Level::L4);
        assert_eq!(compute_level(false, false, 0, false), Level::None);
        assert!(Isolation::Strict.accepts(Level::L2));
        assert!(!Isolation::Strict.accepts(Level::L3));
        assert!(Isolation::Degraded.accepts(Level::L4));
        assert!(!Isolation::Degraded.accepts(Level::None));
    }
}
