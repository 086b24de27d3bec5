//! The name of the temporary file a replacing write makes beside its
//! target: `.<name>.tmp-<pid>-<16 hex digits>`. [`super::Dir`] writes under
//! it; the memory checkout reads it back to recognise (and clear) the
//! leftovers of writes a kill cut short. One module, so the two cannot
//! drift apart.

use std::ffi::{OsStr, OsString};

/// What stands between the target's name and the writer's tag.
const MARK: &str = ".tmp-";

/// A fresh temporary name for a write replacing `name` in the same
/// directory: hidden, tagged with this process and a random number, so
/// concurrent writers never share one.
pub fn temp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        "{MARK}{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    tmp
}

/// The name a file named `name` was to replace, when `name` has exactly
/// the shape [`temp_name`] gives; `None` for any other name.
pub fn is_temp_name(name: &str) -> Option<&str> {
    let (target, tag) = name.strip_prefix('.')?.rsplit_once(MARK)?;
    let (pid, hex) = tag.split_once('-')?;
    let well_formed = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    (well_formed && !target.is_empty()).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    /// Every name a write can target comes back from its temporary name,
    /// including names that look like temporary names themselves.
    #[test]
    fn a_temporary_name_gives_back_its_target() {
        for name in [
            "a.md",
            ".hidden",
            "x-1",
            "notes.tmp-3-x",
            "é ü.md",
            "a.tmp-1-00000000000000ff",
        ] {
            let tmp = temp_name(OsStr::new(name));
            let tmp = tmp.to_str().unwrap();
            assert!(tmp.starts_with('.') && tmp.len() > name.len() + 20, "{tmp}");
            assert_eq!(is_temp_name(tmp), Some(name), "{tmp}");
        }
        assert_ne!(temp_name(OsStr::new("a")), temp_name(OsStr::new("a")));
    }

    #[test]
    fn other_names_are_not_temporary() {
        for name in [
            "x.md",
            ".tmp-12-00000000000000ff",
            "..tmp-12-00000000000000ff",
            ".a.md.tmp-9-0f",
            ".a.md.tmp--00000000000000ff",
            ".a.md.tmp-x9-00000000000000ff",
            ".a.md.tmp-9-00000000000000fg",
            "a.md.tmp-9-00000000000000ff",
            ".a.md.tmp-9-00000000000000ff0",
            "",
        ] {
            assert_eq!(is_temp_name(name), None, "{name}");
        }
    }
}
