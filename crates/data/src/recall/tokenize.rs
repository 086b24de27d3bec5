//! Tokens for recall (spec agent-loop.md §6): NFKC, lower-case; a run of
//! Latin letters, digits and `_` is one token; each Han, Kana or Hangul
//! character is a unigram, and each pair of adjacent ones a bigram, so
//! Chinese or Japanese text needs no spaces.

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::is_nfkc_quick;

/// `text` in NFKC, lower-cased: the form tokens, phrases and snippets use.
pub fn normalize(text: &str) -> String {
    let nfkc: std::borrow::Cow<'_, str> =
        if is_nfkc_quick(text.chars()) == unicode_normalization::IsNormalized::Yes {
            std::borrow::Cow::Borrowed(text)
        } else {
            std::borrow::Cow::Owned(text.nfkc().collect())
        };
    if nfkc
        .bytes()
        .all(|b| !b.is_ascii_uppercase() && b.is_ascii())
    {
        return nfkc.into_owned();
    }
    nfkc.to_lowercase()
}

/// A Han, Kana or Hangul character: a token on its own.
pub(crate) fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x31F0..=0x31FF    // Katakana extensions
        | 0x3400..=0x4DBF    // Han extension A
        | 0x4E00..=0x9FFF    // Han
        | 0xF900..=0xFAFF    // Han compatibility
        | 0x1100..=0x11FF    // Hangul Jamo
        | 0x3130..=0x318F    // Hangul compatibility Jamo
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xFF66..=0xFF9F    // half-width Katakana (NFKC maps most)
        | 0x20000..=0x3134F  // Han extensions B–H
    )
}

/// A character of a word token (letters and digits of any script but the
/// CJK ones, and `_`).
pub(crate) fn is_word(c: char) -> bool {
    c == '_' || (c.is_alphanumeric() && !is_cjk(c))
}

/// The tokens of already normalised text, in order (repeats kept): words,
/// then for CJK runs each character followed by the bigram it starts.
pub(crate) fn tokens_normalized(text: &str, mut emit: impl FnMut(&str)) {
    let mut word_start: Option<usize> = None;
    let mut prev_cjk: Option<(usize, char)> = None;
    for (i, c) in text.char_indices() {
        if is_word(c) {
            if word_start.is_none() {
                word_start = Some(i);
            }
            prev_cjk = None;
            continue;
        }
        if let Some(s) = word_start.take() {
            emit(&text[s..i]);
        }
        if is_cjk(c) {
            if let Some((p, _)) = prev_cjk {
                emit(&text[p..i + c.len_utf8()]);
            }
            emit(&text[i..i + c.len_utf8()]);
            prev_cjk = Some((i, c));
        } else {
            prev_cjk = None;
        }
    }
    if let Some(s) = word_start {
        emit(&text[s..]);
    }
}

/// The tokens of raw text (normalised first).
pub fn tokens(text: &str) -> Vec<String> {
    let norm = normalize(text);
    let mut out = Vec::new();
    tokens_normalized(&norm, |t| out.push(t.to_string()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin_runs_are_one_token_lowercased() {
        assert_eq!(tokens("Hello, World_2 café!"), ["hello", "world_2", "café"]);
    }

    #[test]
    fn nfkc_folds_full_width_and_ligatures() {
        assert_eq!(tokens("ＡＢＣ ﬁle"), ["abc", "file"]);
    }

    #[test]
    fn cjk_gives_unigrams_and_bigrams() {
        assert_eq!(tokens("我喜欢"), ["我", "我喜", "喜", "喜欢", "欢"]);
        assert_eq!(tokens("用Rust写"), ["用", "rust", "写"]);
        assert_eq!(
            tokens("カタカナ"),
            ["カ", "カタ", "タ", "タカ", "カ", "カナ", "ナ"]
        );
    }
}
