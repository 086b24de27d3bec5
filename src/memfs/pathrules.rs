//! Rules for paths that name files inside a memory repository (chapter 4):
//! relative, `/`-separated, no empty, `.` or `..` segments, no NUL or
//! backslash. Symlink and case-collision checks need the filesystem or the
//! tree and live with the writers.

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
}
