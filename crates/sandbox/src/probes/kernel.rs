//! Kernel surfaces: tunables, the cgroup tree, io_uring, keyrings, bpf and
//! perf (§d rows 35, 36, 46, 47).
//!
//! Writes to kernel files are tested by opening them for writing — the
//! read-only mount (`EROFS`), landlock (`EACCES`) and file modes are all
//! checked at `open` — and never writing, so an unconfined run changes
//! nothing on the host.

use std::path::Path;

use super::context::ProbeContext;
use super::util::{close, io_name, join, last_errno};
use super::verdict::Verdict;

/// Open every existing path in `paths` for writing; returns (opened, refused).
fn open_each_for_write(paths: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut got = Vec::new();
    let mut refused = Vec::new();
    for p in paths {
        if !Path::new(p).exists() {
            refused.push(format!("{p}: absent"));
            continue;
        }
        match std::fs::OpenOptions::new().write(true).open(p) {
            Ok(_) => got.push(format!("opened {p} for writing (nothing written)")),
            Err(e) => refused.push(format!("{p}: {}", io_name(&e))),
        }
    }
    (got, refused)
}

/// Row 35: open kernel tunables under `/proc/sys` and `/sys` for writing.
/// Escaped if any opens. Conservative: a capability a handler checks only
/// at `write` time (e.g. `core_pattern`) is not exercised, so uid 0 of a
/// user namespace mapped to host root counts as escaped here.
pub(crate) fn tunables(_ctx: &ProbeContext) -> Verdict {
    let (got, refused) = open_each_for_write(&[
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/swappiness",
        "/proc/sys/kernel/core_pattern",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/uevent_helper",
    ]);
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 36: open the root `cgroup.procs` of the v2 tree and of the v1 `pids`
/// and `memory` hierarchies for writing (the step before writing the own
/// pid into it; nothing is written, so nothing moves). Escaped if any opens.
pub(crate) fn cgroup_escape(_ctx: &ProbeContext) -> Verdict {
    let (got, refused) = open_each_for_write(&[
        "/sys/fs/cgroup/cgroup.procs",
        "/sys/fs/cgroup/unified/cgroup.procs",
        "/sys/fs/cgroup/pids/cgroup.procs",
        "/sys/fs/cgroup/memory/cgroup.procs",
    ]);
    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}

/// Row 46: `io_uring_setup(1, …)`. Escaped if a ring is created (closed).
pub(crate) fn io_uring(_ctx: &ProbeContext) -> Verdict {
    // struct io_uring_params is 120 bytes; all-zero asks for defaults.
    let mut params = [0u8; 120];
    // SAFETY: the kernel writes at most sizeof(io_uring_params) into it.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) } as i32;
    if fd >= 0 {
        close(fd);
        Verdict::escaped("io_uring_setup created a ring")
    } else {
        let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|s| format!(" (kernel.io_uring_disabled {})", s.trim()))
            .unwrap_or_default();
        Verdict::blocked(format!("io_uring_setup: {}{disabled}", last_errno()))
    }
}

/// Row 47: `keyctl(KEYCTL_GET_KEYRING_ID, user keyring)`, `bpf(BPF_MAP_CREATE)`
/// of a one-entry array, `perf_event_open` of a software clock on itself.
/// Escaped if any call succeeds (descriptors closed at once).
pub(crate) fn keyring_bpf_perf(_ctx: &ProbeContext) -> Verdict {
    let mut got = Vec::new();
    let mut refused = Vec::new();

    const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
    const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
    // SAFETY: keyctl with integer arguments only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_GET_KEYRING_ID,
            KEY_SPEC_USER_KEYRING,
            0 as libc::c_long,
        )
    };
    if r >= 0 {
        got.push(format!("keyctl reached the user keyring (id {r})"));
    } else {
        refused.push(format!("keyctl: {}", last_errno()));
    }

    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size,
    // max_entries (u32 each), the rest zero.
    let mut attr = [0u32; 30];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    const BPF_MAP_CREATE: libc::c_long = 0;
    // SAFETY: the kernel reads `size` bytes of the zero-padded attribute.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    } as i32;
    if fd >= 0 {
        close(fd);
        got.push("bpf(BPF_MAP_CREATE) made a map".into());
    } else {
        refused.push(format!("bpf: {}", last_errno()));
    }

    // struct perf_event_attr, version 0 layout (64 bytes): type u32, size
    // u32, config u64, sample_period u64, sample_type u64, read_format
    // u64, flag bits u64 (disabled=bit0, exclude_kernel=bit5, exclude_hv=bit6).
    let mut pattr = [0u64; 16];
    const PERF_TYPE_SOFTWARE: u64 = 1;
    pattr[0] = PERF_TYPE_SOFTWARE | (64u64 << 32);
    pattr[1] = 0; // PERF_COUNT_SW_CPU_CLOCK
    pattr[5] = 1 | (1 << 5) | (1 << 6);
    // SAFETY: the kernel reads `size` (64) bytes of the attribute.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            pattr.as_mut_ptr(),
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            0 as libc::c_ulong,
        )
    } as i32;
    if fd >= 0 {
        close(fd);
        got.push("perf_event_open opened a software counter".into());
    } else {
        refused.push(format!("perf_event_open: {}", last_errno()));
    }

    if got.is_empty() {
        Verdict::blocked(join(&refused))
    } else {
        Verdict::escaped(join(&got))
    }
}
