//! The query language: whitespace-separated terms and `"quoted phrases"`.
//! A phrase must occur in a message (at word boundaries where it starts or
//! ends with a word character, anywhere for CJK) and adds a bonus; its
//! tokens also score as terms. An unclosed quote is plain terms.

use super::tokenize::{normalize, tokens_normalized};

/// A parsed query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Every token to score, without repeats, in first-seen order.
    pub terms: Vec<String>,
    /// Normalised phrases that must occur, with their tokens.
    pub phrases: Vec<Phrase>,
}

/// One quoted phrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phrase {
    /// The normalised phrase text (inner whitespace collapsed to one space).
    pub text: String,
    pub tokens: Vec<String>,
}

impl Query {
    /// Parse `input`.
    pub fn parse(input: &str) -> Self {
        let norm = normalize(input);
        let mut q = Query::default();
        let quotes = norm.matches('"').count();
        // With an odd number of quotes the last one is unclosed: it and
        // everything after it are plain terms.
        let closed_end = if quotes % 2 == 1 {
            norm.rfind('"').unwrap_or(norm.len())
        } else {
            norm.len()
        };
        let (paired, rest) = norm.split_at(closed_end);
        for (i, piece) in paired.split('"').enumerate() {
            if i % 2 == 1 {
                let text = piece.split_whitespace().collect::<Vec<_>>().join(" ");
                let mut toks = Vec::new();
                tokens_normalized(&text, |t| toks.push(t.to_string()));
                if toks.is_empty() {
                    continue;
                }
                for t in &toks {
                    q.add_term(t);
                }
                toks.sort();
                toks.dedup();
                q.phrases.push(Phrase { text, tokens: toks });
            } else {
                tokens_normalized(piece, |t| q.add_term(t));
            }
        }
        tokens_normalized(rest, |t| q.add_term(t));
        q
    }

    fn add_term(&mut self, t: &str) {
        if !self.terms.iter().any(|x| x == t) {
            self.terms.push(t.to_string());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// How many times `phrase` occurs in normalised `text`, honouring word
/// boundaries for word characters at its ends. A count, not offsets: the
/// text is compared with its whitespace collapsed, so positions in it would
/// not be positions in `text`.
pub fn phrase_count(text: &str, phrase: &str) -> usize {
    use super::tokenize::is_word;
    let starts_word = phrase.chars().next().is_some_and(is_word);
    let ends_word = phrase.chars().next_back().is_some_and(is_word);
    let norm_ws;
    // Whitespace in the text is compared collapsed, like the phrase's.
    let hay: &str = if text.contains(['\n', '\t', '\r']) || text.contains("  ") {
        norm_ws = text.split_whitespace().collect::<Vec<_>>().join(" ");
        &norm_ws
    } else {
        text
    };
    hay.match_indices(phrase)
        .filter(|(i, _)| {
            let before_ok = !starts_word || !hay[..*i].chars().next_back().is_some_and(is_word);
            let after_ok =
                !ends_word || !hay[*i + phrase.len()..].chars().next().is_some_and(is_word);
            before_ok && after_ok
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phrases_and_terms() {
        let q = Query::parse(r#"tea "Green Apple"  pie"#);
        assert_eq!(q.terms, ["tea", "green", "apple", "pie"]);
        assert_eq!(q.phrases.len(), 1);
        assert_eq!(q.phrases[0].text, "green apple");
    }

    #[test]
    fn unclosed_quote_is_plain_terms() {
        let q = Query::parse(r#"tea "green apple"#);
        assert_eq!(q.terms, ["tea", "green", "apple"]);
        assert!(q.phrases.is_empty());
        let q = Query::parse(r#""a b" c "d"#);
        assert_eq!(q.phrases.len(), 1);
        assert_eq!(q.terms, ["a", "b", "c", "d"]);
    }

    #[test]
    fn phrase_word_boundaries_latin_only() {
        assert_eq!(
            phrase_count("green apples and green apple", "green apple"),
            1
        );
        assert_eq!(phrase_count("evergreen apple", "green apple"), 0);
        assert_eq!(phrase_count("我喜欢绿茶", "绿茶"), 1);
        assert_eq!(phrase_count("green\n  apple", "green apple"), 1);
        // Found in collapsed whitespace (the fuzzer's case): counted, and
        // nothing indexes the original text with its offsets.
        assert_eq!(phrase_count("\"\" xq  \"x\"  x", "x"), 2);
    }
}
