//! The `.memfs.config.json` glob language, matched by hand (no regex crate).
//!
//! Semantics follow the regex letta-code builds from a pattern:
//! `*` = any run of non-`/`, `?` = one non-`/`, `**/` = zero or more whole
//! directories, `**` elsewhere = anything, every other character literal,
//! anchored at both ends. Like a JavaScript `.` without the `s` flag, the
//! "anything" forms do not cross line terminators; `*` and `?` do.

/// Why a pattern is not acceptable in the config (the text after `<label>: `).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternError {
    /// Empty, absolute, backslash or `..` segment.
    NotRepoRelative,
    /// `**` mixed with other characters inside one segment.
    PartialGlobstar,
}

impl PatternError {
    pub fn message(self) -> &'static str {
        match self {
            PatternError::NotRepoRelative => {
                "pattern must be a non-empty repo-relative glob using '/'"
            }
            PatternError::PartialGlobstar => "'**' must be a complete path segment",
        }
    }
}

/// Check a pattern the way the config parser does; the first problem wins.
pub fn check_pattern(pattern: &str) -> Result<(), PatternError> {
    if pattern.is_empty()
        || pattern.starts_with('/')
        || pattern.contains('\\')
        || pattern.split('/').any(|segment| segment == "..")
    {
        return Err(PatternError::NotRepoRelative);
    }
    if pattern
        .split('/')
        .any(|segment| segment.contains("**") && segment != "**")
    {
        return Err(PatternError::PartialGlobstar);
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `*`: any run of characters other than `/`.
    Star,
    /// `?`: exactly one character other than `/`.
    Question,
    /// `**/`: nothing, or any run (no line terminators) ending in `/`.
    AnyDirs,
    /// `**` not followed by `/`: any run without line terminators.
    Anything,
}

/// A compiled glob. Compilation never fails; validity is `check_pattern`'s job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    tokens: Vec<Token>,
}

impl Glob {
    pub fn new(pattern: &str) -> Self {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' if chars.get(i + 1) == Some(&'*') => {
                    if chars.get(i + 2) == Some(&'/') {
                        tokens.push(Token::AnyDirs);
                        i += 3;
                    } else {
                        tokens.push(Token::Anything);
                        i += 2;
                    }
                }
                '*' => {
                    tokens.push(Token::Star);
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::Question);
                    i += 1;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        Glob {
            source: pattern.to_string(),
            tokens,
        }
    }

    /// The pattern as written in the config (used in messages).
    pub fn as_str(&self) -> &str {
        &self.source
    }

    pub fn is_match(&self, path: &str) -> bool {
        let chars: Vec<char> = path.chars().collect();
        // Memo of (token, position) pairs already known to fail: keeps the
        // backtracking linear-ish for patterns with several wildcards.
        let mut failed = vec![false; (self.tokens.len() + 1) * (chars.len() + 1)];
        self.match_from(0, 0, &chars, &mut failed)
    }

    fn match_from(&self, t: usize, p: usize, chars: &[char], failed: &mut [bool]) -> bool {
        let key = t * (chars.len() + 1) + p;
        if failed[key] {
            return false;
        }
        let ok = match self.tokens.get(t) {
            None => p == chars.len(),
            Some(Token::Literal(c)) => {
                chars.get(p) == Some(c) && self.match_from(t + 1, p + 1, chars, failed)
            }
            Some(Token::Question) => {
                chars.get(p).is_some_and(|c| *c != '/')
                    && self.match_from(t + 1, p + 1, chars, failed)
            }
            Some(Token::Star) => {
                let mut end = p;
                loop {
                    if self.match_from(t + 1, end, chars, failed) {
                        break true;
                    }
                    match chars.get(end) {
                        Some(c) if *c != '/' => end += 1,
                        _ => break false,
                    }
                }
            }
            Some(Token::Anything) => {
                let mut end = p;
                loop {
                    if self.match_from(t + 1, end, chars, failed) {
                        break true;
                    }
                    match chars.get(end) {
                        Some(c) if !is_line_terminator(*c) => end += 1,
                        _ => break false,
                    }
                }
            }
            Some(Token::AnyDirs) => {
                if self.match_from(t + 1, p, chars, failed) {
                    true
                } else {
                    // Any run ending in '/', with no line terminator inside.
                    let mut end = p;
                    loop {
                        match chars.get(end) {
                            Some('/') => {
                                if self.match_from(t + 1, end + 1, chars, failed) {
                                    break true;
                                }
                                end += 1;
                            }
                            Some(c) if !is_line_terminator(*c) => end += 1,
                            _ => break false,
                        }
                    }
                }
            }
        };
        if !ok {
            failed[key] = true;
        }
        ok
    }
}

fn is_line_terminator(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_stays_in_segment() {
        let g = Glob::new("*.md");
        assert!(g.is_match("persona.md"));
        assert!(!g.is_match("a/persona.md"));
    }

    #[test]
    fn globstar_slash_matches_zero_or_more_dirs() {
        let g = Glob::new("**/notes.md");
        assert!(g.is_match("notes.md"));
        assert!(g.is_match("a/b/notes.md"));
        assert!(!g.is_match("a/xnotes.md"));
        let g = Glob::new("projects/**");
        assert!(g.is_match("projects/a/b.md"));
        assert!(!g.is_match("other/a.md"));
    }

    #[test]
    fn question_and_literals() {
        assert!(Glob::new("a?.md").is_match("ab.md"));
        assert!(!Glob::new("a?.md").is_match("a/.md"));
        assert!(Glob::new("a+(b).md").is_match("a+(b).md"));
        assert!(!Glob::new("a.md").is_match("aXmd"));
    }

    #[test]
    fn pattern_checks() {
        assert_eq!(check_pattern(""), Err(PatternError::NotRepoRelative));
        assert_eq!(check_pattern("/a"), Err(PatternError::NotRepoRelative));
        assert_eq!(check_pattern("a\\b"), Err(PatternError::NotRepoRelative));
        assert_eq!(check_pattern("a/../b"), Err(PatternError::NotRepoRelative));
        assert_eq!(check_pattern("a/**b"), Err(PatternError::PartialGlobstar));
        assert_eq!(check_pattern("a/**/b"), Ok(()));
    }
}
