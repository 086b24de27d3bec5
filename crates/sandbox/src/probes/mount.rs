//! Mount attacks: mount over / unmount the agents mask, remount `/`
//! read-write (§d rows 29, 30).
//!
//! Both run in a throwaway process that first tries to enter a private
//! mount namespace (`unshare(CLONE_NEWNS)` + `MS_REC|MS_PRIVATE`), so that a
//! success on an unconfined host changes only a copy that dies with it. Only
//! when that is refused does the attempt happen in the current namespace,
//! and then: the tmpfs is unmounted at once, the agents directory is
//! unmounted only if it is itself a tmpfs mount (the sandbox's mask), and the
//! remount keeps every current flag of `/` (read-only is restored).

use std::ffi::CString;
use std::time::Duration;

use super::context::ProbeContext;
use super::util::{contains, cpath, in_child, mount_at, raw_errno, slot_result, unique};
use super::verdict::Verdict;

/// In the child: try to enter a private mount namespace. Slot 0 = unshare,
/// slot 1 = make-private. Returns `None` when unshare worked but the copy
/// could not be made private (then nothing may be mounted), else whether
/// the namespace is private.
fn enter_private_ns(slots: &mut [i64; super::util::SLOTS]) -> Option<bool> {
    let root = c"/";
    // SAFETY: raw system calls in a throwaway child.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            slots[0] = raw_errno();
            return Some(false);
        }
        slots[0] = 0;
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            slots[1] = raw_errno();
            return None;
        }
        slots[1] = 0;
    }
    Some(true)
}

fn ns_note(slots: &[i64]) -> String {
    match slots[0] {
        0 => "in a private mount namespace (unshare(CLONE_NEWNS) succeeded)".to_string(),
        v => format!(
            "in the current mount namespace (unshare(CLONE_NEWNS): {})",
            slot_result(v)
        ),
    }
}

/// What the row-29 child works on, prepared before the fork (the child
/// may not allocate).
struct UnmaskTarget<'a> {
    /// The scratch mount point.
    mnt: CString,
    /// The agents directory (the mask).
    agents: CString,
    /// B's secret file, read once the mask is off.
    secret: CString,
    marker: &'a [u8],
    /// Whether the agents directory is itself a tmpfs mount (only then is
    /// it unmounted outside a private namespace).
    agents_is_mask: bool,
}

/// Row 29: `mount tmpfs` on a scratch directory, then `umount2(agents,
/// MNT_DETACH)` and read B's secret. Escaped if the mount works (it is
/// unmounted at once) or the mask comes off.
pub(crate) fn mount_unmask(ctx: &ProbeContext) -> Verdict {
    let mnt = ctx.scratch_dir.join(unique("mnt"));
    if let Err(e) = std::fs::create_dir(&mnt) {
        return Verdict::skipped(format!(
            "cannot create a mount point in the scratch dir: {}",
            super::util::io_name(&e)
        ));
    }
    let mask_fs = mount_at(&ctx.agents_dir);
    let agents_is_mask = mask_fs.as_deref() == Some("tmpfs");
    let (Some(c_mnt), Some(c_agents), Some(c_secret)) = (
        cpath(&mnt),
        cpath(&ctx.agents_dir),
        cpath(&ctx.other_secret_file),
    ) else {
        let _ = std::fs::remove_dir(&mnt);
        return Verdict::skipped("a path contains a NUL byte");
    };
    let target = UnmaskTarget {
        mnt: c_mnt,
        agents: c_agents,
        secret: c_secret,
        marker: ctx.secret_marker.as_bytes(),
        agents_is_mask,
    };
    let result = in_child(Duration::from_secs(5), |slots| {
        attempt_unmask(slots, &target);
    });
    let _ = std::fs::remove_dir(&mnt);
    let (slots, end) = match result {
        Ok(r) => r,
        Err(e) => return Verdict::skipped(format!("cannot start the mount process: {e}")),
    };
    if slots[0] == 0 && slots[1] != 0 {
        return Verdict::skipped(format!(
            "unshare(CLONE_NEWNS) worked but the copy could not be made private ({}); refusing to mount",
            slot_result(slots[1])
        ));
    }
    let private = slots[0] == 0 && slots[1] == 0;
    let mut parts = vec![ns_note(&slots)];
    parts.push(format!(
        "mount tmpfs on {}: {}",
        mnt.display(),
        slot_result(slots[2])
    ));
    if slots[2] == 0 {
        parts.push(format!("unmounted again: {}", slot_result(slots[3])));
    }
    let unmasked = slots[4] == 0;
    if private || agents_is_mask {
        parts.push(format!(
            "umount2({}, MNT_DETACH): {}",
            ctx.agents_dir.display(),
            slot_result(slots[4])
        ));
        if unmasked {
            parts.push(match slots[5] {
                0 => "then read B's secret: MARKER READ".to_string(),
                -1 => "then read B's secret: readable, marker absent".to_string(),
                v => format!("then read B's secret: {}", slot_result(v)),
            });
        }
    } else {
        parts.push(format!(
            "{} is not a tmpfs mask here ({}); not unmounted",
            ctx.agents_dir.display(),
            mask_fs.as_deref().unwrap_or("not a mount point")
        ));
    }
    if slots[2] == i64::MIN {
        parts.push(format!("mount process {end}"));
    }
    let evidence = parts.join("; ");
    if slots[2] == 0 || unmasked {
        Verdict::escaped(evidence)
    } else {
        Verdict::blocked(evidence)
    }
}

/// In the row-29 child: enter a private mount namespace if it can, mount
/// a tmpfs on the scratch point and take it off again (slots 2, 3), then,
/// in a private copy or when the agents directory is the mask, unmount it
/// and read B's secret (slots 4, 5).
fn attempt_unmask(slots: &mut [i64; super::util::SLOTS], target: &UnmaskTarget<'_>) {
    let tmpfs = c"tmpfs";
    let opts = c"size=64k";
    let Some(private) = enter_private_ns(slots) else {
        return;
    };
    // SAFETY: raw system calls in a throwaway child, on prepared strings.
    unsafe {
        let r = libc::mount(
            tmpfs.as_ptr(),
            target.mnt.as_ptr(),
            tmpfs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        );
        slots[2] = if r == 0 { 0 } else { raw_errno() };
        if r == 0 {
            slots[3] = if libc::umount2(target.mnt.as_ptr(), libc::MNT_DETACH) == 0 {
                0
            } else {
                raw_errno()
            };
        }
        if private || target.agents_is_mask {
            let r = libc::umount2(target.agents.as_ptr(), libc::MNT_DETACH);
            slots[4] = if r == 0 { 0 } else { raw_errno() };
            if r == 0 {
                let fd = libc::open(target.secret.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    slots[5] = raw_errno();
                } else {
                    let mut buf = [0u8; 4096];
                    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    let n = usize::try_from(n).unwrap_or(0).min(buf.len());
                    slots[5] = if contains(&buf[..n], target.marker) {
                        0
                    } else {
                        -1
                    };
                    libc::close(fd);
                }
            }
        }
    }
}

/// Current per-mount flags of `/` as `MS_*` bits, and whether it is read-only.
fn root_flags() -> Option<(libc::c_ulong, bool)> {
    // SAFETY: statvfs is a plain C struct; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let root = CString::new("/").ok()?;
    // SAFETY: statvfs fills the struct we own.
    if unsafe { libc::statvfs(root.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let f = st.f_flag;
    // ST_* → MS_* (they differ for relatime).
    let map: [(libc::c_ulong, libc::c_ulong); 7] = [
        (1, libc::MS_RDONLY),
        (2, libc::MS_NOSUID),
        (4, libc::MS_NODEV),
        (8, libc::MS_NOEXEC),
        (1024, libc::MS_NOATIME),
        (2048, libc::MS_NODIRATIME),
        (4096, libc::MS_RELATIME),
    ];
    let mut ms = 0;
    for (st_bit, ms_bit) in map {
        if f & st_bit != 0 {
            ms |= ms_bit;
        }
    }
    Some((ms, f & 1 != 0))
}

/// Row 30: `mount(NULL, "/", NULL, MS_REMOUNT|MS_BIND, NULL)` without
/// `MS_RDONLY`, keeping every other current flag. Escaped if permitted
/// (in the current namespace a read-only `/` is made read-only again).
pub(crate) fn remount_root(_ctx: &ProbeContext) -> Verdict {
    let Some((flags, was_ro)) = root_flags() else {
        return Verdict::skipped("statvfs(\"/\") failed");
    };
    let rw = (flags & !libc::MS_RDONLY) | libc::MS_REMOUNT | libc::MS_BIND;
    let restore = rw | libc::MS_RDONLY;
    let result = in_child(Duration::from_secs(5), |slots| {
        let Some(private) = enter_private_ns(slots) else {
            return;
        };
        let root = c"/";
        // SAFETY: raw system calls in a throwaway child.
        unsafe {
            let r = libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                rw,
                std::ptr::null(),
            );
            slots[2] = if r == 0 { 0 } else { raw_errno() };
            if r == 0 && was_ro && !private {
                slots[3] = if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    restore,
                    std::ptr::null(),
                ) == 0
                {
                    0
                } else {
                    raw_errno()
                };
            }
        }
    });
    let (slots, end) = match result {
        Ok(r) => r,
        Err(e) => return Verdict::skipped(format!("cannot start the remount process: {e}")),
    };
    if slots[0] == 0 && slots[1] != 0 {
        return Verdict::skipped(format!(
            "unshare(CLONE_NEWNS) worked but the copy could not be made private ({}); refusing to remount",
            slot_result(slots[1])
        ));
    }
    let mut parts = vec![ns_note(&slots)];
    parts.push(format!(
        "/ was {}; remount read-write: {}",
        if was_ro { "read-only" } else { "read-write" },
        slot_result(slots[2])
    ));
    if slots[3] != i64::MIN {
        parts.push(format!("restored read-only: {}", slot_result(slots[3])));
    }
    if slots[2] == i64::MIN {
        parts.push(format!("remount process {end}"));
    }
    if slots[2] == 0 {
        Verdict::escaped(parts.join("; "))
    } else {
        Verdict::blocked(parts.join("; "))
    }
}
