//! A query against the index: candidates are the messages holding any
//! query term and passing the filters (and holding every phrase token);
//! they are ranked by BM25 with avgdl over them, phrases are checked on
//! the re-read text of the best ones and add a bonus; ties go to the newer
//! message. Each hit carries a snippet around its best match and whether
//! compaction evicted it from its conversation's context.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::bm25::{idf, term_score};
use super::error::RecallError;
use super::index::{DocMeta, Docs, Index, Postings, may_be_consecutive, searchable_text};
use super::query::{Query, phrase_count};
use super::tokenize::{normalize, tokens_normalized};
use crate::paths::{AgentPaths, CONTEXT_FILE_NAME};
use crate::protocol::messages::Role;
use crate::store::conversation::MAX_JSON_BYTES;

/// A summary's share of its score: below the messages it quotes.
const SUMMARY_WEIGHT: f64 = 0.5;

/// Characters of a snippet before and after its match.
const SNIPPET_BEFORE: usize = 60;
const SNIPPET_AFTER: usize = 120;
/// A phrase's bonus: this share of its tokens' idf per occurrence (three
/// at most).
const PHRASE_BONUS: f64 = 0.5;

/// Most distinct query tokens scored.
const MAX_TERMS: usize = 1024;

/// What a search is limited to.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub conversation: Option<String>,
    /// Unix seconds, inclusive.
    pub since: Option<i64>,
    /// Unix seconds, inclusive.
    pub until: Option<i64>,
    pub role: Option<Role>,
}

impl Filters {
    /// A date (`2026-01-31`) or RFC 3339 time as Unix seconds: a date is
    /// its first second, or its last when `end` (so `--until` includes it).
    pub fn parse_date(s: &str, end: bool) -> Result<i64, RecallError> {
        if let Some(t) = crate::clock::parse_rfc3339(s) {
            return Ok(t.unix_timestamp());
        }
        let d = crate::clock::parse_day(s).ok_or_else(|| {
            RecallError::Invalid(format!(
                "{s:?} is not a date (YYYY-MM-DD) or an RFC 3339 time"
            ))
        })?;
        let start = d.midnight().assume_utc().unix_timestamp();
        Ok(if end { start + 86_399 } else { start })
    }

    fn pass(&self, d: &DocMeta, conv: Option<u32>) -> bool {
        conv.is_none_or(|c| d.conv == c)
            && self.role.is_none_or(|r| d.role == r)
            && self.since.is_none_or(|s| d.ts >= s)
            && self.until.is_none_or(|u| d.ts <= u)
    }

    /// [`Filters::pass`] for message `i`, reading only what is filtered on.
    fn pass_at(&self, docs: &Docs, i: usize, conv: Option<u32>) -> bool {
        conv.is_none_or(|c| docs.conv(i) == Some(c))
            && self.role.is_none_or(|r| docs.role(i) == Some(r))
            && (self.since.is_none() && self.until.is_none()
                || docs.ts(i).is_some_and(|t| {
                    self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t <= u)
                }))
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Hit {
    pub conversation_id: String,
    pub message_id: String,
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub created_at: String,
    pub score: f64,
    pub snippet: String,
    /// No longer in its conversation's `context.json`.
    pub evicted: bool,
}

/// Search `agent`'s conversations (the index is opened and caught up
/// first).
pub fn search(
    agent: &AgentPaths,
    query: &str,
    filters: &Filters,
    limit: usize,
) -> Result<Vec<Hit>, RecallError> {
    let q = parse_query(query)?;
    Index::open(agent)?.search_repairing(&q, filters, limit)
}

/// `query` parsed; one with no words is an error (before the index opens).
fn parse_query(query: &str) -> Result<Query, RecallError> {
    let q = Query::parse(query);
    if q.is_empty() {
        return Err(RecallError::Invalid(format!(
            "the query {query:?} has no words to search for"
        )));
    }
    Ok(q)
}

/// [`search`] for a view that cannot be written: the index is loaded as
/// it is and caught up in memory only ([`Index::open_read_only`]).
pub fn search_read_only(
    agent: &AgentPaths,
    query: &str,
    filters: &Filters,
    limit: usize,
) -> Result<Vec<Hit>, RecallError> {
    let q = parse_query(query)?;
    Index::open_read_only(agent)?.search_repairing(&q, filters, limit)
}

impl Index {
    /// [`Index::search`], rebuilding the index (in memory when read-only)
    /// and searching again when a piece of it fails its check.
    pub fn search_repairing(
        &mut self,
        q: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>, RecallError> {
        match self.search(q, filters, limit) {
            Err(RecallError::Corrupt) => {
                tracing::warn!("recall index: corrupt; rebuilding");
                self.rebuild()?;
                self.search(q, filters, limit)
            }
            r => r,
        }
    }

    /// The best `limit` messages for `q` under `filters`;
    /// [`RecallError::Corrupt`] when a piece of the index read for them
    /// failed its check.
    pub fn search(
        &self,
        q: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>, RecallError> {
        let hits = self.search_unchecked(q, filters, limit);
        if self.corrupt() {
            return Err(RecallError::Corrupt);
        }
        Ok(hits)
    }

    fn search_unchecked(&self, q: &Query, filters: &Filters, limit: usize) -> Vec<Hit> {
        let limit = limit.max(1);
        // At most this many candidates are looked at (see below).
        let most = limit.saturating_mul(10).saturating_add(100);
        let Some((ranked, sequences)) = self.candidates(q, filters, most) else {
            return Vec::new();
        };
        // Best first, lazily: phrases may reject some of the best.
        let mut ranked = std::collections::BinaryHeap::from(ranked);
        let check = self.check(q, sequences);
        let mut contexts: HashMap<u32, Option<HashSet<String>>> = HashMap::new();
        let mut hits: Vec<(f64, i64, u32, Hit)> = Vec::new();
        // A summary quotes what it summarises: it ranks below the
        // original. Weighing only lowers a score, so candidates are taken
        // until the `limit` best weighed scores beat the next one's raw
        // score (a bounded number re-read).
        let mut looked = 0usize;
        while looked < most {
            let Some(&Ranked(next, _, _)) = ranked.peek() else {
                break;
            };
            if hits.len() >= limit && kth_best(&hits, limit) >= f64::from(next) {
                break;
            }
            let Some(Ranked(s, ts, d)) = ranked.pop() else {
                break;
            };
            looked += 1;
            if let Some((bonus, hit)) = self.hit(d, &check, &mut contexts) {
                let summary = hit.kind.as_deref() == Some("summary");
                let factor = if summary { SUMMARY_WEIGHT } else { 1.0 };
                hits.push(((f64::from(s) + bonus) * factor, ts, d, hit));
            }
        }
        let mut best = best_first(hits);
        best.truncate(limit);
        best
    }

    /// The messages that may answer `q` under `filters`, scored by BM25,
    /// and each phrase's postings in order; `None` when none can.
    fn candidates(
        &self,
        q: &Query,
        filters: &Filters,
        keep: usize,
    ) -> Option<(Vec<Ranked>, Vec<Vec<&Postings>>)> {
        let n = self.docs.len();
        let conv = match &filters.conversation {
            Some(c) => match self.conversation_number(c) {
                Some(n) => Some(n),
                None => return None,
            },
            None => None,
        };
        let terms: Vec<(&Postings, f64)> = q
            .terms
            .iter()
            .filter_map(|t| self.postings_of(t))
            .take(MAX_TERMS)
            .map(|p| (p, idf(n as u64, p.docs.len() as u64)))
            .collect();
        if terms.is_empty() {
            return None;
        }
        let (req, sequences) = self.phrase_postings(q)?;
        let total: usize = terms.iter().map(|(p, _)| p.docs.len()).sum();
        let ranked = if total.saturating_mul(8) < n {
            self.rank_sparse(&terms, &req, filters, conv)
        } else {
            self.rank_dense(&terms, &req, filters, conv, keep)
        };
        Some((ranked, sequences))
    }

    /// The postings of every phrase token (a candidate holds them all) and
    /// each phrase's in order; `None` when a token is in no message.
    fn phrase_postings(&self, q: &Query) -> Option<(Vec<&Postings>, Vec<Vec<&Postings>>)> {
        // Every token of every phrase must be in a candidate.
        let mut required: Vec<&str> = q
            .phrases
            .iter()
            .flat_map(|p| p.tokens.iter().map(String::as_str))
            .collect();
        required.sort_unstable();
        required.dedup();
        let mut req: Vec<&Postings> = Vec::with_capacity(required.len());
        for t in &required {
            match self.postings_of(t) {
                Some(p) => req.push(p),
                None => return None,
            }
        }
        // Each phrase's tokens in order, to rule candidates out by their
        // positions before any text is read.
        let mut sequences: Vec<Vec<&Postings>> = Vec::with_capacity(q.phrases.len());
        for p in &q.phrases {
            let mut seq = Vec::new();
            let mut missing = false;
            tokens_normalized(&p.text, |t| match self.postings_of(t) {
                Some(x) => seq.push(x),
                None => missing = true,
            });
            if missing {
                return None;
            }
            sequences.push(seq);
        }
        Some((req, sequences))
    }

    /// What checking and showing a candidate needs of `q`.
    fn check<'a>(&'a self, q: &'a Query, sequences: Vec<Vec<&'a Postings>>) -> Check<'a> {
        let n = self.docs.len();
        let idf_of = |t: &str| {
            self.postings_of(t)
                .map_or(0.0, |p| idf(n as u64, p.docs.len() as u64))
        };
        let phrase_weight: Vec<f64> = q
            .phrases
            .iter()
            .map(|p| p.tokens.iter().map(|t| idf_of(t)).sum::<f64>() * PHRASE_BONUS)
            .collect();
        let best_term = {
            let mut t: Vec<(&str, f64)> = q.terms.iter().map(|t| (t.as_str(), idf_of(t))).collect();
            t.sort_by(|a, b| b.1.total_cmp(&a.1));
            t
        };
        Check {
            q,
            sequences,
            phrase_weight,
            best_term,
        }
    }

    /// Candidate `d` re-read and checked against the phrases: its phrase
    /// bonus and result row, or `None` when a phrase is not in its text.
    fn hit(
        &self,
        d: u32,
        check: &Check<'_>,
        contexts: &mut HashMap<u32, Option<HashSet<String>>>,
    ) -> Option<(f64, Hit)> {
        if !check.sequences.iter().all(|seq| may_be_consecutive(d, seq)) {
            return None; // the text check below would fail too
        }
        let msg = self.message(d)?;
        let original = searchable_text(&msg);
        let text = normalize(&original);
        let mut bonus = 0.0;
        let mut at: Option<(usize, usize)> = None;
        let mut all = true;
        for (p, w) in check.q.phrases.iter().zip(&check.phrase_weight) {
            let found = phrase_count(&text, &p.text);
            if found == 0 {
                all = false;
                break;
            }
            bonus += w * found.min(3) as f64;
            if at.is_none() {
                at = text.find(&p.text).map(|i| (i, p.text.len()));
            }
        }
        if !all {
            return None;
        }
        if at.is_none() {
            at = check
                .best_term
                .iter()
                .find_map(|(t, _)| text.find(t).map(|i| (i, t.len())));
        }
        let conv_no = self.docs.conv(d as usize).unwrap_or(0);
        let context = contexts
            .entry(conv_no)
            .or_insert_with(|| self.context_ids(conv_no));
        let evicted = context.as_ref().is_some_and(|ids| !ids.contains(&msg.id));
        // The snippet shows the original text (its case and width): the
        // match found in the normalised text is located in it.
        let (shown, at) = match at.map(|a| in_original(&original, &text, a)) {
            Some(Some(a)) => (&original, Some(a)),
            Some(None) => (&text, at),
            None => (&original, None),
        };
        Some((
            bonus,
            Hit {
                conversation_id: self.conversation_id(conv_no).to_string(),
                message_id: msg.id,
                role: msg.role,
                kind: msg.kind,
                created_at: msg.ts,
                score: 0.0,
                snippet: snippet(shown, at.unwrap_or((0, 0))),
                evicted,
            },
        ))
    }

    /// Candidates scored by accumulating into one slot per message (many
    /// postings).
    fn rank_dense(
        &self,
        terms: &[(&Postings, f64)],
        req: &[&Postings],
        filters: &Filters,
        conv: Option<u32>,
        keep: usize,
    ) -> Vec<Ranked> {
        let n = self.docs.len();
        let mut need: Option<Vec<u8>> = None;
        if !req.is_empty() {
            let mut counts = vec![0u8; n];
            for p in req {
                for &d in &p.docs {
                    if let Some(c) = counts.get_mut(d as usize) {
                        *c = c.saturating_add(1);
                    }
                }
            }
            need = Some(counts);
        }
        let want = req.len().min(255) as u8;
        // Without filters no message's metadata needs reading here.
        let unfiltered = conv.is_none()
            && filters.role.is_none()
            && filters.since.is_none()
            && filters.until.is_none();
        // Pass 1: the candidate set and its average length.
        const UNSEEN: f32 = -1.0;
        const REJECTED: f32 = -2.0;
        let mut score = vec![UNSEEN; n];
        let mut touched: Vec<u32> = Vec::new();
        let mut sum_dl = 0u64;
        for (p, _) in terms {
            for &d in &p.docs {
                let i = d as usize;
                if score.get(i) != Some(&UNSEEN) {
                    continue;
                }
                let Some(dl) = self.docs.dl(i) else {
                    continue;
                };
                let ok = need.as_ref().is_none_or(|c| c.get(i) == Some(&want))
                    && (unfiltered || filters.pass_at(&self.docs, i, conv));
                if ok {
                    score[i] = 0.0;
                    touched.push(d);
                    sum_dl += u64::from(dl);
                } else {
                    score[i] = REJECTED;
                }
            }
        }
        if touched.is_empty() {
            return Vec::new();
        }
        let avgdl = sum_dl as f64 / touched.len() as f64;
        // Pass 2: BM25.
        for (p, idf) in terms {
            for (&d, &tf) in p.docs.iter().zip(&p.tfs) {
                let i = d as usize;
                if score.get(i).is_some_and(|s| *s >= 0.0) {
                    let dl = self.docs.dl(i).map_or(0.0, f64::from);
                    score[i] += term_score(*idf, f64::from(tf), dl, avgdl) as f32;
                }
            }
        }
        let scored = touched.iter().map(|&d| (score[d as usize], d)).collect();
        drop(touched);
        drop(score);
        best_of(scored, keep)
            .into_iter()
            .map(|(s, d)| Ranked(s, self.docs.ts(d as usize).unwrap_or(0), d))
            .collect()
    }

    /// The same ranking from the postings merged by sorting (few
    /// postings: no slot per message to allocate).
    fn rank_sparse(
        &self,
        terms: &[(&Postings, f64)],
        req: &[&Postings],
        filters: &Filters,
        conv: Option<u32>,
    ) -> Vec<Ranked> {
        let mut entries: Vec<(u32, u16, u16)> = Vec::new();
        for (t, (p, _)) in terms.iter().enumerate() {
            for (&d, &tf) in p.docs.iter().zip(&p.tfs) {
                entries.push((d, t as u16, tf));
            }
        }
        entries.sort_unstable_by_key(|e| e.0);
        let mut groups: Vec<(usize, usize)> = Vec::new();
        let mut sum_dl = 0u64;
        let mut i = 0;
        while i < entries.len() {
            let d = entries[i].0;
            let mut j = i;
            while j < entries.len() && entries[j].0 == d {
                j += 1;
            }
            let ok = self.docs.get(d as usize).is_some_and(|m| {
                filters.pass(&m, conv) && req.iter().all(|p| p.docs.binary_search(&d).is_ok())
            });
            if ok {
                sum_dl += self.docs.dl(d as usize).map_or(0, u64::from);
                groups.push((i, j));
            }
            i = j;
        }
        if groups.is_empty() {
            return Vec::new();
        }
        let avgdl = sum_dl as f64 / groups.len() as f64;
        groups
            .iter()
            .map(|&(i, j)| {
                let d = entries[i].0;
                let m = self.docs.get(d as usize);
                let dl = m.map_or(0.0, |m| f64::from(m.dl));
                let s: f64 = entries[i..j]
                    .iter()
                    .map(|&(_, t, tf)| {
                        let idf = terms.get(t as usize).map_or(0.0, |x| x.1);
                        term_score(idf, f64::from(tf), dl, avgdl)
                    })
                    .sum();
                Ranked(s as f32, m.map_or(0, |m| m.ts), d)
            })
            .collect()
    }

    /// The ids in conversation `n`'s context, or `None` without a readable
    /// `context.json` (then nothing counts as evicted).
    fn context_ids(&self, n: u32) -> Option<HashSet<String>> {
        #[derive(serde::Deserialize)]
        struct ContextFile {
            in_context_message_ids: Vec<String>,
        }
        let bytes = self.read_conversation_file(n, CONTEXT_FILE_NAME, MAX_JSON_BYTES)?;
        serde_json::from_slice::<ContextFile>(&bytes)
            .ok()
            .map(|c| c.in_context_message_ids.into_iter().collect())
    }
}

/// What checking and showing a candidate needs of the query.
struct Check<'a> {
    q: &'a Query,
    /// Each phrase's postings, token after token.
    sequences: Vec<Vec<&'a Postings>>,
    /// Each phrase's bonus per occurrence.
    phrase_weight: Vec<f64>,
    /// The query's terms, highest idf first (a snippet without a phrase
    /// is centred on the first found).
    best_term: Vec<(&'a str, f64)>,
}

/// The candidates that can be among the `keep` best: every one scoring
/// at least the `keep`-th best score (ties kept whole: time decides
/// between them), so only those need their time read.
fn best_of(mut scored: Vec<(f32, u32)>, keep: usize) -> Vec<(f32, u32)> {
    if keep == 0 || scored.len() <= keep {
        return scored;
    }
    let (_, kth, _) = scored.select_nth_unstable_by(keep - 1, |a, b| b.0.total_cmp(&a.0));
    let cut = kth.0;
    scored.retain(|s| s.0.total_cmp(&cut).is_ge());
    scored
}

/// The hits best first (then newest), scores rounded to thousandths.
/// The `k`-th best score of `hits` (k ≥ 1, at most their number).
fn kth_best(hits: &[(f64, i64, u32, Hit)], k: usize) -> f64 {
    let mut scores: Vec<f64> = hits.iter().map(|h| h.0).collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    scores.get(k.saturating_sub(1)).copied().unwrap_or(f64::MIN)
}

fn best_first(mut hits: Vec<(f64, i64, u32, Hit)>) -> Vec<Hit> {
    hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    hits.into_iter()
        .map(|(s, _, _, mut h)| {
            h.score = (s * 1000.0).round() / 1000.0;
            h
        })
        .collect()
}

/// A candidate: score, time, doc id; ordered best (then newest) greatest.
#[derive(Debug, Clone, Copy)]
struct Ranked(f32, i64, u32);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0
            .total_cmp(&other.0)
            .then(self.1.cmp(&other.1))
            .then(self.2.cmp(&other.2))
    }
}

/// About `SNIPPET_BEFORE + SNIPPET_AFTER` characters of `text` around the
/// match at `(byte, len)`, whitespace collapsed, `…` where cut.
/// Where `(at, len)` of `normalised` (the [`normalize`]d `original`)
/// lies in `original`, normalising it a character at a time; `None` when
/// the two do not line up that way (a composition across characters).
fn in_original(
    original: &str,
    normalised: &str,
    (at, len): (usize, usize),
) -> Option<(usize, usize)> {
    if original.len() == normalised.len()
        && original.is_char_boundary(at)
        && original.is_char_boundary(at + len)
    {
        return Some((at, len));
    }
    let (mut from, mut to, mut n) = (None, None, 0usize);
    for (i, c) in original.char_indices() {
        if n == at {
            from = Some(i);
        }
        let mut buf = [0u8; 4];
        n += normalize(c.encode_utf8(&mut buf)).len();
        if from.is_some() && n >= at + len {
            to = Some(i + c.len_utf8());
            break;
        }
    }
    // The character-wise normalisation must reach the same text.
    let (from, to) = (from?, to?);
    (normalize(&original[from..to]) == normalised.get(at..at + len)?).then_some((from, to - from))
}

fn snippet(text: &str, (at, len): (usize, usize)) -> String {
    let at = (0..=at.min(text.len()))
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    let start = text[..at]
        .char_indices()
        .rev()
        .nth(SNIPPET_BEFORE - 1)
        .map_or(0, |(i, _)| i);
    let from_match = &text[at..];
    let end = at
        + from_match
            .char_indices()
            .nth(SNIPPET_AFTER.max(len))
            .map_or(from_match.len(), |(i, _)| i);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(
        &text[start..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    );
    if end < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_is_shown_in_the_original_case_and_width() {
        let original = "Ｍｙ Green TEA is here";
        let text = normalize(original);
        let at = text.find("tea").unwrap();
        let (i, l) = in_original(original, &text, (at, 3)).unwrap();
        assert_eq!(&original[i..i + l], "TEA");
        let at = text.find("my").unwrap();
        let (i, l) = in_original(original, &text, (at, 2)).unwrap();
        assert_eq!(&original[i..i + l], "Ｍｙ");
    }

    #[test]
    fn snippets_cut_on_characters() {
        let long = "a".repeat(100) + " 绿茶 " + &"b".repeat(300);
        let at = long.find("绿茶").unwrap();
        let s = snippet(&long, (at, "绿茶".len()));
        assert!(s.starts_with('…') && s.ends_with('…'));
        assert!(s.contains("绿茶"));
        assert_eq!(snippet("short text", (0, 5)), "short text");
    }

    #[test]
    fn sparse_and_dense_rankings_agree() {
        use crate::protocol::messages::Part;
        use crate::store::conversation::{Conversation, StoredMessage};
        let dir = tempfile::tempdir().unwrap();
        let agent = crate::paths::Home::at(dir.path()).agent("a").unwrap();
        for conv in ["one", "two"] {
            let mut c = Conversation::open(&agent, conv).unwrap();
            for i in 0..150 {
                let text = match i % 7 {
                    0 => format!("rare word number {i} 绿茶"),
                    3 => "rare rare and other filler words here".to_string(),
                    _ => format!("filler text {i}"),
                };
                let id = c.next_id();
                let m = StoredMessage::new(id, Role::User, vec![Part::Text { text }]);
                c.append(m).unwrap();
            }
        }
        let index = Index::open(&agent).unwrap();
        let q = Query::parse("rare 绿茶 other");
        let terms: Vec<(&Postings, f64)> = q
            .terms
            .iter()
            .filter_map(|t| index.postings_of(t))
            .map(|p| (p, idf(index.len() as u64, p.docs.len() as u64)))
            .collect();
        let f = Filters {
            role: Some(Role::User),
            ..Filters::default()
        };
        for conv in [None, Some(1)] {
            let mut a = index.rank_dense(&terms, &[], &f, conv, usize::MAX);
            let mut b = index.rank_sparse(&terms, &[], &f, conv);
            a.sort();
            b.sort();
            assert!(!a.is_empty());
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.2, y.2);
                assert!((x.0 - y.0).abs() < 1e-4);
            }
        }
        // Trimmed to the few that can be best, the best come in the same order.
        let mut full = index.rank_dense(&terms, &[], &Filters::default(), None, usize::MAX);
        let mut cut = index.rank_dense(&terms, &[], &Filters::default(), None, 5);
        assert!(cut.len() >= 5 && cut.len() < full.len());
        full.sort_by(|a, b| b.cmp(a));
        cut.sort_by(|a, b| b.cmp(a));
        assert_eq!(full[..5], cut[..5]);
        let req = [index.postings_of("other").unwrap()];
        let a = index.rank_dense(&terms, &req, &f, None, usize::MAX);
        let b = index.rank_sparse(&terms, &req, &f, None);
        assert_eq!(a.len(), 42);
        assert_eq!(b.len(), 42);
    }

    #[test]
    fn dates_are_inclusive_days() {
        let s = Filters::parse_date("2026-01-02", false).unwrap();
        let e = Filters::parse_date("2026-01-02", true).unwrap();
        assert_eq!(e - s, 86_399);
        assert_eq!(
            Filters::parse_date("2026-01-02T00:00:00Z", false).unwrap(),
            s
        );
        assert!(Filters::parse_date("yesterday", false).is_err());
    }
}
