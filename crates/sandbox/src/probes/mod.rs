//! The escape-attack catalogue (spec `sandbox.md` §d) as probes that run
//! *inside* a confined child and report, per attack, whether it was
//! `blocked`, `escaped` or `skipped` (with a precise reason), always with
//! evidence: the errno of the refusal or what was read, created or reached.
//!
//! Every probe makes the attack for real with plain system calls, but is
//! safe to run unconfined on a host (the unconfined run is the control column
//! that proves each probe can see an escape):
//! * signals are signal 0, ptrace is `PTRACE_SEIZE` from a throwaway process
//!   (detached by its exit), descriptors are opened for writing but never
//!   written when the target is a system or supervisor file;
//! * files created outside the own directory have unique names and are
//!   deleted at once; a renamed file is renamed back;
//! * mounts happen in a throwaway process, in a private mount namespace when
//!   it can make one, and are undone at once otherwise;
//! * the fork bomb, memory bomb and disk fill are bounded and cleaned up;
//! * network probes only reach loopback, the given abstract socket, and the
//!   TEST-NET address 192.0.2.1 — the latter only when no route covers it.
//!
//! Rows 1–49 are §d's; rows 50–63 (`syscalls.rs`) are regression rows for
//! the seccomp allow-list: calls the kernel mostly refuses anyway, checked
//! to be refused by the filter first; rows 68–71 (`egress.rs`) the egress
//! proxy's path.
//!
//! The probes issue their system calls raw (`libc`, often `libc::syscall`
//! with a bare number) on purpose: they are the attacks, passing numbers,
//! flags and arguments no wrapper would (x32 numbers, `int 0x80`, invalid
//! flags, made-up handles), and each reads the errno itself as evidence.
//! They do not go through `nix` or [`super::sys`], which the confinement
//! code uses; each `unsafe` block still says why the call is harmless.
//!
//! The agent-side program's `mini-letta-agent probe ID --context JSON` calls
//! [`run_one`] and prints its result.

mod channel;
mod context;
mod egress;
mod fs;
mod git;
mod ipc;
mod kernel;
mod mount;
mod net;
mod privilege;
mod proc;
mod resources;
mod syscalls;
mod util;
mod verdict;

use std::time::Instant;

use serde_json::{Value, json};

pub use context::{ByDesign, EgressContext, ProbeContext};
pub use verdict::Verdict;

/// One row of the catalogue.
pub struct Attack {
    /// Stable id, e.g. `01-read-other-agent`.
    pub id: &'static str,
    /// The §d row it covers.
    pub number: u32,
    pub title: &'static str,
    pub run: fn(&ProbeContext) -> Verdict,
}

impl std::fmt::Debug for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attack")
            .field("id", &self.id)
            .field("number", &self.number)
            .field("title", &self.title)
            .finish()
    }
}

const fn attack(
    id: &'static str,
    number: u32,
    title: &'static str,
    run: fn(&ProbeContext) -> Verdict,
) -> Attack {
    Attack {
        id,
        number,
        title,
        run,
    }
}

#[rustfmt::skip]
static CATALOGUE: &[Attack] = &[
    attack("01-read-other-agent", 1, "Read B's memory", fs::read_other_agent),
    attack("02-enumerate-agents", 2, "Enumerate agents", fs::enumerate_agents),
    attack("03-write-outside", 3, "Write outside own dir", fs::write_outside),
    attack("04-symlink-to-other", 4, "Symlink to B", fs::symlink_to_other),
    attack("05-planted-symlink", 5, "Pre-existing symlink planted in A", fs::planted_symlink),
    attack("06-hardlink-other-in", 6, "Hard link B's file into A", fs::hardlink_other_in),
    attack("07-hardlink-system-file", 7, "Hard link a system file into A", fs::hardlink_system_file),
    attack("08-planted-hardlink", 8, "Pre-existing hard link to B's file inside A", fs::planted_hardlink),
    attack("09-rename-across", 9, "Rename across directories", fs::rename_across),
    attack("10-proc-self-root", 10, "/proc/self/root walk", fs::proc_self_root),
    attack("11-supervisor-root-cwd", 11, "Supervisor root/cwd", proc::supervisor_root_cwd),
    attack("12-supervisor-environ", 12, "Supervisor environment", proc::supervisor_environ),
    attack("13-supervisor-memory", 13, "Supervisor memory", proc::supervisor_memory),
    attack("14-supervisor-exe-write", 14, "Overwrite supervisor binary", proc::supervisor_exe_write),
    attack("15-visible-pids", 15, "Count visible pids", proc::visible_pids),
    attack("16-signal-supervisor", 16, "Kill supervisor", proc::signal_supervisor),
    attack("17-signal-sibling", 17, "Kill a sibling", proc::signal_sibling),
    attack("18-ptrace", 18, "ptrace supervisor / sibling / parent agent", proc::ptrace_attach),
    attack("19-pidfd-getfd", 19, "Steal fds", proc::pidfd_getfd),
    attack("20-env-secrets", 20, "Parent's env secrets", proc::env_secrets),
    attack("21-leaked-fds", 21, "Leaked descriptor", proc::leaked_fds),
    attack("22-control-socket", 22, "Supervisor control socket", ipc::control_socket),
    attack("23-channel-privileged-rpc", 23, "Own control socket abuse", channel::privileged_rpc),
    attack("24-abstract-socket", 24, "Abstract Unix socket of the host", ipc::abstract_socket),
    attack("25-tcp-localhost", 25, "TCP to supervisor/localhost services", net::tcp_localhost),
    attack("26-tcp-egress", 26, "TCP egress", net::tcp_egress),
    attack("27-udp-egress", 27, "UDP / DNS egress", net::udp_egress),
    attack("28-raw-sockets", 28, "Raw/packet/vsock sockets", net::raw_sockets),
    attack("29-mount-unmask", 29, "Mount / unmount the mask", mount::mount_unmask),
    attack("30-remount-root-rw", 30, "Remount / read-write", mount::remount_root),
    attack("31-new-user-namespace", 31, "New user namespace", privilege::new_user_namespace),
    attack("32-setuid-binary", 32, "Setuid binary", privilege::setuid_binary),
    attack("33-capabilities", 33, "Capabilities", privilege::capabilities),
    attack("34-device-nodes", 34, "Device nodes", privilege::device_nodes),
    attack("35-kernel-tunables", 35, "Kernel tunables", kernel::tunables),
    attack("36-cgroup-escape", 36, "Cgroup escape", kernel::cgroup_escape),
    attack("37-fork-bomb", 37, "Fork bomb", resources::fork_bomb),
    attack("38-memory-bomb", 38, "Memory bomb", resources::memory_bomb),
    attack("39-disk-fill", 39, "Disk fill", resources::disk_fill),
    attack("40-orphan-survival", 40, "Orphan survival", resources::orphan_survival),
    attack("41-terminal-injection", 41, "Terminal injection", privilege::terminal_injection),
    attack("42-git-hook", 42, "Git hook for the unconfined side", git::hook_write),
    attack("43-git-config", 43, "Git config for the unconfined side", git::config_write),
    attack("44-rc-poisoning", 44, "Shell rc / tool config poisoning", git::rc_poisoning),
    attack("45-ipc-namespace", 45, "SysV / POSIX IPC channel to other agents", ipc::shared_ipc),
    attack("46-io-uring", 46, "io_uring side door", kernel::io_uring),
    attack("47-keyring-bpf-perf", 47, "Keyring / bpf / perf", kernel::keyring_bpf_perf),
    attack("48-sandbox-off-switches", 48, "Sandbox-off switches", channel::env_switches),
    attack("49-secret-commit", 49, "Secret committed to memory", channel::secret_commit),
    // Regression rows for the seccomp allow-list (beyond §d).
    attack("50-int80-32bit-entry", 50, "32-bit syscall entry (int 0x80)", syscalls::int80),
    attack("51-mount-api", 51, "fspick / open_tree_attr / mount_setattr / pivot_root / chroot", syscalls::mount_api),
    attack("52-namespace-calls", 52, "unshare(NEWTIME) / setns / clone(NEWUSER) / clone3", syscalls::namespaces),
    attack("53-ptrace-kcmp-init", 53, "ptrace / kcmp on pid 1", syscalls::ptrace_kcmp_init),
    attack("54-kernel-objects", 54, "keyctl / add_key / bpf / perf / userfaultfd / io_uring", syscalls::kernel_objects),
    attack("55-file-handles", 55, "name_to_handle_at / open_by_handle_at", syscalls::file_handles),
    attack("56-kernel-log-and-boot", 56, "syslog / reboot / kexec_load / init_module", syscalls::kernel_log_and_boot),
    attack("57-clock-and-hostname", 57, "clock_settime / sethostname", syscalls::clock_and_hostname),
    attack("58-mknodat-devices", 58, "mknodat of device nodes", syscalls::mknodat_devices),
    attack("59-socket-families", 59, "Every non-AF_UNIX socket family", syscalls::socket_families),
    attack("60-dev-shm-write", 60, "/dev/shm writable", syscalls::dev_shm_write),
    attack("61-proc-kmsg", 61, "/proc/kmsg readable", syscalls::proc_kmsg),
    attack("62-x32-syscall-bit", 62, "x32 syscall numbers", syscalls::x32_bit),
    attack("63-unknown-syscall", 63, "Unknown syscalls answer ENOSYS", syscalls::unknown_syscalls),
    // Regression rows for the supervisor's trust boundary.
    attack("64-channel-model-choice", 64, "Child names its model (scripted path, other provider)", channel::model_choice),
    attack("65-channel-descriptors", 65, "Child passes descriptors to the supervisor", channel::pass_descriptors),
    attack("66-sub-agent-writes-checkout", 66, "Sub-agent writes the agent's main checkout", git::main_checkout_write),
    attack("67-git-object-store-plant", 67, "Alternates / grafts / shallow / replace ref planted in the own memory.git", git::object_store_plant),
    // The egress path (issue 34).
    attack("68-egress-no-route", 68, "No route out without the proxy", egress::no_route),
    attack("69-egress-listed-host", 69, "A listed host reached only through the proxy", egress::listed_host),
    attack("70-egress-refused-host", 70, "Hosts the list does not name, through the proxy", egress::refused_host),
    attack("71-egress-dns", 71, "DNS from inside the namespace", egress::dns),
    attack("72-stream-protocols", 72, "MPTCP / SCTP stream sockets", net::stream_protocols),
];

/// Every attack, in §d order, then the seccomp regression rows.
pub fn catalogue() -> &'static [Attack] {
    CATALOGUE
}

/// The attack with this id (or with this §d number, given as digits).
pub fn find(id: &str) -> Option<&'static Attack> {
    CATALOGUE.iter().find(|a| a.id == id).or_else(|| {
        let n: u32 = id.parse().ok()?;
        CATALOGUE.iter().find(|a| a.number == n)
    })
}

/// Run one attack; a panicking probe is reported as skipped, never fatal.
pub fn run(attack: &Attack, ctx: &ProbeContext) -> Verdict {
    let run = attack.run;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(ctx))) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Verdict::skipped(format!("probe failed: {msg}"))
        }
    }
}

/// Entry used by `mini-letta-agent probe ID --context JSON`:
/// runs one attack and returns the JSON line to print:
/// `{"id","number","title","verdict","evidence"|"reason","elapsed_ms"}`.
pub fn run_one(id: &str, ctx: &ProbeContext) -> Value {
    let Some(attack) = find(id) else {
        return json!({
            "id": id,
            "number": null,
            "title": null,
            "verdict": "skipped",
            "reason": format!("unknown probe id {id:?}"),
            "elapsed_ms": 0,
        });
    };
    let started = Instant::now();
    let verdict = run(attack, ctx);
    let mut out = json!({
        "id": attack.id,
        "number": attack.number,
        "title": attack.title,
    });
    if let (Some(o), Ok(Value::Object(v))) = (out.as_object_mut(), serde_json::to_value(&verdict)) {
        o.extend(v);
    }
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "elapsed_ms".into(),
            json!(started.elapsed().as_millis() as u64),
        );
    }
    out
}
