//! The recall query parser and tokeniser take whatever a model or a user
//! types: any text parses, without panicking, into distinct non-empty
//! terms whose phrases' tokens are among them, and a phrase search over any
//! text counts without panicking, and never more than fit in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mini_letta::recall::query::{Query, phrase_count};
use mini_letta::recall::tokenize::{normalize, tokens};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (query, hay) = text.split_at(text.char_indices().nth(text.chars().count() / 2).map_or(text.len(), |(i, _)| i));
    let q = Query::parse(query);
    for (i, t) in q.terms.iter().enumerate() {
        assert!(!t.is_empty());
        assert!(!q.terms[..i].contains(t), "repeated term {t:?}");
    }
    for p in &q.phrases {
        for t in &p.tokens {
            assert!(q.terms.contains(t), "phrase token {t:?} not a term");
        }
        // Never more occurrences than the text has room for.
        let norm = normalize(hay);
        assert!(phrase_count(&norm, &p.text) <= norm.len() / p.text.len().max(1) + 1);
    }
    assert!(tokens(hay).iter().all(|t| !t.is_empty()));
});
