//! [B] Secret scan (book chapter 19): credential shapes in staged files.
//!
//! Hand-written byte matchers rather than a regex dependency. Each shape
//! requires a token boundary in front, so words that merely contain a
//! prefix (`task-...`, `risky...`) do not match. The scan runs over a whole
//! file, so a key whose halves arrive in two commits is caught as soon as
//! the second commit completes it. The secret itself is never echoed.

/// The credential shapes we recognise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SecretKind {
    /// `-----BEGIN ... PRIVATE KEY-----` (RSA, EC, OPENSSH, PGP block, ...).
    PrivateKey,
    /// AWS access key id: `AKIA`/`ASIA` + 16 upper-case letters or digits.
    AwsAccessKey,
    /// Google API key: `AIza` + 35 URL-safe characters.
    GoogleApiKey,
    /// `sk-...` API keys (OpenAI, Anthropic and similar).
    SkApiKey,
    /// GitHub tokens: `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`.
    GitHubToken,
    /// Slack tokens: `xoxb-`, `xoxp-`, `xoxa-`, `xoxo-`, `xoxs-`, `xoxr-`.
    SlackToken,
    /// Three base64url segments, the first two JSON (`eyJ...`).
    Jwt,
}

impl SecretKind {
    /// The label used in messages.
    pub fn label(self) -> &'static str {
        match self {
            SecretKind::PrivateKey => "private key block",
            SecretKind::AwsAccessKey => "AWS access key ID",
            SecretKind::GoogleApiKey => "Google API key",
            SecretKind::SkApiKey => "sk- API key",
            SecretKind::GitHubToken => "GitHub token",
            SecretKind::SlackToken => "Slack token",
            SecretKind::Jwt => "JWT",
        }
    }
}

/// One finding: 1-based line number and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub line: usize,
    pub kind: SecretKind,
}

/// Scan raw file bytes. At most one finding per (line, kind), in line order.
pub fn scan(bytes: &[u8]) -> Vec<Finding> {
    let mut findings: Vec<Finding> = Vec::new();
    let mut line = 1;
    for i in 0..bytes.len() {
        if bytes[i] == b'\n' {
            line += 1;
            continue;
        }
        if let Some(kind) = match_at(bytes, i) {
            let finding = Finding { line, kind };
            if !findings.contains(&finding) {
                findings.push(finding);
            }
        }
    }
    findings.sort();
    findings
}

fn match_at(b: &[u8], i: usize) -> Option<SecretKind> {
    let prev = if i == 0 { None } else { Some(b[i - 1]) };
    let rest = &b[i..];
    match rest.first()? {
        b'-' if private_key(rest) => Some(SecretKind::PrivateKey),
        b'A' if !prev.is_some_and(is_alnum) && aws_key(rest) => Some(SecretKind::AwsAccessKey),
        b'A' if !prev.is_some_and(is_urlsafe) && google_key(rest) => Some(SecretKind::GoogleApiKey),
        b's' if !prev.is_some_and(is_urlsafe) && sk_key(rest) => Some(SecretKind::SkApiKey),
        b'g' if !prev.is_some_and(is_word) && github_token(rest) => Some(SecretKind::GitHubToken),
        b'x' if !prev.is_some_and(is_alnum) && slack_token(rest) => Some(SecretKind::SlackToken),
        b'e' if !prev.is_some_and(is_urlsafe) && jwt(rest) => Some(SecretKind::Jwt),
        _ => None,
    }
}

fn is_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}
fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}
fn is_urlsafe(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// Length of the leading run of bytes satisfying `pred`.
fn run(s: &[u8], pred: impl Fn(u8) -> bool) -> usize {
    s.iter().take_while(|c| pred(**c)).count()
}

fn private_key(s: &[u8]) -> bool {
    let Some(after) = s.strip_prefix(b"-----BEGIN ") else {
        return false;
    };
    // The label is short upper-case words on the same line.
    let label_len = run(&after[..after.len().min(64)], |c| {
        c.is_ascii_uppercase() || c.is_ascii_digit() || c == b' '
    });
    let label = &after[..label_len];
    after[label_len..].starts_with(b"-----")
        && (label.ends_with(b"PRIVATE KEY") || label.ends_with(b"PRIVATE KEY BLOCK"))
}

fn aws_key(s: &[u8]) -> bool {
    if !(s.starts_with(b"AKIA") || s.starts_with(b"ASIA")) {
        return false;
    }
    let body = run(&s[4..], |c| c.is_ascii_uppercase() || c.is_ascii_digit());
    // Exactly 16, and not glued to more alphanumerics.
    body == 16 && !s.get(20).copied().is_some_and(is_alnum)
}

fn google_key(s: &[u8]) -> bool {
    s.starts_with(b"AIza") && run(&s[4..], is_urlsafe) == 35
}

fn sk_key(s: &[u8]) -> bool {
    let Some(body) = s.strip_prefix(b"sk-") else {
        return false;
    };
    let n = run(body, is_urlsafe);
    // Digits and letters both present: keeps hyphenated prose such as
    // "sk-learn-compatible-estimators" from matching.
    n >= 20
        && body[..n].iter().any(u8::is_ascii_digit)
        && body[..n].iter().any(u8::is_ascii_alphabetic)
}

fn github_token(s: &[u8]) -> bool {
    for prefix in [&b"ghp_"[..], b"gho_", b"ghu_", b"ghs_", b"ghr_"] {
        if let Some(body) = s.strip_prefix(prefix) {
            return run(body, is_alnum) >= 36;
        }
    }
    match s.strip_prefix(b"github_pat_") {
        Some(body) => run(body, is_word) >= 22,
        None => false,
    }
}

fn slack_token(s: &[u8]) -> bool {
    if s.len() < 5 || !s.starts_with(b"xox") || !b"abposr".contains(&s[3]) || s[4] != b'-' {
        return false;
    }
    let body = &s[5..];
    let n = run(body, |c| c.is_ascii_alphanumeric() || c == b'-');
    n >= 10 && body[..n].iter().any(u8::is_ascii_digit)
}

fn jwt(s: &[u8]) -> bool {
    let b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    if !s.starts_with(b"eyJ") {
        return false;
    }
    let h = run(s, b64);
    if h < 10 || s.get(h) != Some(&b'.') {
        return false;
    }
    let payload = &s[h + 1..];
    let p = run(payload, b64);
    if p < 10 || !payload.starts_with(b"ey") || payload.get(p) != Some(&b'.') {
        return false;
    }
    run(&payload[p + 1..], b64) >= 10
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<SecretKind> {
        scan(text.as_bytes()).into_iter().map(|f| f.kind).collect()
    }

    #[test]
    fn prose_does_not_match() {
        assert!(
            kinds("task-force-for-the-sk-learn-compatible-estimator and risky words").is_empty()
        );
        assert!(kinds("AKIA is a prefix; eyJhbGciOi is half a header").is_empty());
        assert!(kinds("-----BEGIN PUBLIC KEY-----").is_empty());
    }

    #[test]
    fn line_numbers() {
        let text = format!("a\nb\nkey = {}{}\n", "AKIA", "ABCDEFGHIJKLMNOP");
        assert_eq!(
            scan(text.as_bytes()),
            vec![Finding {
                line: 3,
                kind: SecretKind::AwsAccessKey
            }]
        );
    }
}
