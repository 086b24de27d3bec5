//! Rules for paths that name files inside a memory repository (chapter 4):
//! relative, `/`-separated, no empty, `.` or `..` segments, no NUL or
//! backslash, and none of the characters [`crate::names`] refuses in a name
//! (a control sequence in a file name reaches every terminal that lists the
//! memory, and `agent import` refuses such a tree). Symlink and
//! case-collision checks need the filesystem or the tree and live with the
//! writers.

/// Errors for a memory path that breaks the rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathRuleError {
    #[error("{0:?}: memory paths must not be empty")]
    Empty(String),
    #[error("{0:?}: memory paths must be relative to the memory root")]
    Absolute(String),
    #[error("{0:?}: memory paths must not contain '.' or '..' segments")]
    DotSegment(String),
    #[error("{0:?}: memory paths must not contain empty segments")]
    EmptySegment(String),
    #[error("{0:?}: memory paths use '/' and must not contain '\\\\' or NUL")]
    BadCharacter(String),
    #[error("{path:?}: memory paths must not hold control or bidirectional characters: it {why}")]
    UnsafeCharacter { path: String, why: String },
}

/// Check a repository-relative path and return it unchanged when valid.
pub fn check_relative(path: &str) -> Result<String, PathRuleError> {
    let owned = || path.to_string();
    if path.is_empty() {
        return Err(PathRuleError::Empty(owned()));
    }
    if path.starts_with('/') {
        return Err(PathRuleError::Absolute(owned()));
    }
    if path.contains('\\') || path.contains('\0') {
        return Err(PathRuleError::BadCharacter(owned()));
    }
    if let Err(why) = crate::names::check(path) {
        return Err(PathRuleError::UnsafeCharacter { path: owned(), why });
    }
    for seg in path.split('/') {
        match seg {
            "." | ".." => return Err(PathRuleError::DotSegment(owned())),
            "" => return Err(PathRuleError::EmptySegment(owned())),
            _ => {}
        }
    }
    Ok(owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escapes() {
        assert!(matches!(
            check_relative("../x.md"),
            Err(PathRuleError::DotSegment(_))
        ));
        assert!(matches!(
            check_relative("a/./b.md"),
            Err(PathRuleError::DotSegment(_))
        ));
        assert!(matches!(
            check_relative("/etc/passwd"),
            Err(PathRuleError::Absolute(_))
        ));
        assert!(matches!(
            check_relative("a//b.md"),
            Err(PathRuleError::EmptySegment(_))
        ));
        assert!(matches!(
            check_relative("a\\b.md"),
            Err(PathRuleError::BadCharacter(_))
        ));
        assert!(matches!(check_relative(""), Err(PathRuleError::Empty(_))));
        assert_eq!(
            check_relative("projects/MEMORY.md"),
            Ok("projects/MEMORY.md".into())
        );
        assert_eq!(check_relative("日本/メモ.md"), Ok("日本/メモ.md".into()));
    }

    #[test]
    fn rejects_control_and_bidirectional_characters() {
        for bad in [
            "notes-\u{1b}]0;t\u{7}.md",
            "a/b\nc.md",
            "evil\u{202e}dm.txt",
        ] {
            let err = check_relative(bad).unwrap_err();
            assert!(
                matches!(err, PathRuleError::UnsafeCharacter { .. }),
                "{bad:?}: {err}"
            );
            // The message quotes the path escaped.
            assert!(crate::names::first_unsafe(&err.to_string()).is_none());
        }
        assert!(
            check_relative("a\u{1b}b")
                .unwrap_err()
                .to_string()
                .contains("U+001B")
        );
    }
}
