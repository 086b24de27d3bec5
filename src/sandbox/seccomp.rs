//! The seccomp deny-list (spec sandbox.md §c.6): calls that escape or widen a
//! sandbox fail with `EPERM` (`clone3` with `ENOSYS`, so libc falls back to
//! `clone`, whose namespace flags we can inspect). Built with seccompiler.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as ArgLen, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

/// Calls denied outright.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_userfaultfd,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_chroot,
];

/// `clone` flags that create namespaces.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn arch() -> Result<TargetArch, String> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err("unsupported architecture for the seccomp filter".into())
    }
}

fn cond(arg: u8, len: ArgLen, op: Op, value: u64) -> Result<Cond, String> {
    Cond::new(arg, len, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

/// The EPERM filter.
pub fn deny_filter(no_network: bool) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in DENIED {
        rules.insert(*nr, vec![]);
    }
    let mut clone_rules = Vec::new();
    for flag in CLONE_NS_FLAGS {
        clone_rules.push(rule(vec![cond(
            0,
            ArgLen::Qword,
            Op::MaskedEq(*flag),
            *flag,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, ArgLen::Dword, Op::Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, ArgLen::Dword, Op::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    if no_network {
        rules.insert(
            libc::SYS_socket,
            vec![rule(vec![cond(
                0,
                ArgLen::Dword,
                Op::Ne,
                libc::AF_UNIX as u64,
            )?])?],
        );
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

/// The ENOSYS filter for `clone3` (its flags live in memory, out of reach).
fn clone3_filter() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_clone3, vec![]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

/// Install both filters on this thread (no_new_privs must be set).
pub fn install(no_network: bool) -> Result<(), String> {
    let deny = deny_filter(no_network)?;
    let clone3 = clone3_filter()?;
    seccompiler::apply_filter(&clone3).map_err(|e| e.to_string())?;
    seccompiler::apply_filter(&deny).map_err(|e| e.to_string())?;
    Ok(())
}
