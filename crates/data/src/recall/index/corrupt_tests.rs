//! A damaged or forged snapshot: whatever byte is wrong, the index is
//! rebuilt (in memory when read-only) and answers as before, never
//! panicking.

use super::snapshot::{FOOTER_LEN, Footer};
use super::tests::{QUERIES, TEXTS, agent_with, found};
use super::*;
use crate::recall::{Filters, Query};

fn found_repairing(index: &mut Index, q: &str) -> Vec<(String, f64)> {
    index
        .search_repairing(&Query::parse(q), &Filters::default(), 20)
        .unwrap()
        .into_iter()
        .map(|h| (h.message_id, h.score))
        .collect()
}

/// An index of `TEXTS` compacted, its answers, and its recall directory.
fn compacted() -> (tempfile::TempDir, AgentPaths, Vec<Vec<(String, f64)>>) {
    let (d, agent) = agent_with(TEXTS);
    let mut index = Index::open(&agent).unwrap();
    index.compact().unwrap();
    let before = QUERIES.iter().map(|q| found(&index, q)).collect();
    (d, agent, before)
}

fn footer(bytes: &[u8]) -> Footer {
    Footer::decode(&bytes[bytes.len() - FOOTER_LEN..]).unwrap()
}

/// Where the postings table entry of `term` is.
fn table_entry(bytes: &[u8], term: &str) -> usize {
    let f = footer(bytes);
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
    let i = (0..f.n_terms as usize)
        .find(|&i| {
            let (s, e) = (
                u32_at(f.term_offs as usize + i * 4),
                u32_at(f.term_offs as usize + i * 4 + 4),
            );
            &bytes[f.term_blob as usize + s..f.term_blob as usize + e] == term.as_bytes()
        })
        .unwrap();
    f.post_table as usize + i * 8
}

/// Both views answer as before with `snapshot` in place of the good one.
fn answers_as_before(agent: &AgentPaths, snapshot: &[u8], before: &[Vec<(String, f64)>]) {
    let recall = agent.recall_dir();
    let path = recall.join(SNAPSHOT_FILE_NAME);
    std::fs::write(&path, snapshot).unwrap();
    let mut ro = Index::open_read_only(agent).unwrap();
    let got: Vec<_> = QUERIES
        .iter()
        .map(|q| found_repairing(&mut ro, q))
        .collect();
    assert_eq!(got, before);
    drop(ro);
    let mut rw = Index::open(agent).unwrap();
    let got: Vec<_> = QUERIES
        .iter()
        .map(|q| found_repairing(&mut rw, q))
        .collect();
    assert_eq!(got, before);
    // Rebuilt: a plain search finds nothing wrong now.
    for q in QUERIES {
        rw.search(&Query::parse(q), &Filters::default(), 20)
            .unwrap();
    }
    rw.compact().unwrap();
}

#[test]
fn a_posting_list_failing_its_crc_or_forged_past_the_file_is_rebuilt() {
    let (_d, agent, before) = compacted();
    let path = agent.recall_dir().join(SNAPSHOT_FILE_NAME);
    let good = std::fs::read(&path).unwrap();
    // A flipped byte inside the postings of "tea".
    let at = table_entry(&good, "tea");
    let start = u64::from_le_bytes(good[at..at + 8].try_into().unwrap()) as usize;
    let mut bad = good.clone();
    bad[start + 5] ^= 0x10;
    answers_as_before(&agent, &bad, &before);
    // Its table entry forged to end past the file.
    let good = std::fs::read(&path).unwrap();
    let at = table_entry(&good, "tea");
    let mut bad = good.clone();
    bad[at + 8..at + 16].copy_from_slice(&(good.len() as u64 * 4).to_le_bytes());
    answers_as_before(&agent, &bad, &before);
    // A section of the footer forged past the file.
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    let f = good.len() - FOOTER_LEN;
    bad[f + 8 + 4 * 8..f + 8 + 5 * 8].copy_from_slice(&u64::MAX.to_le_bytes());
    answers_as_before(&agent, &bad, &before);
    // Truncated.
    let good = std::fs::read(&path).unwrap();
    answers_as_before(&agent, &good[..good.len() / 2], &before);
    // A message column's byte flipped (the token counts).
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad[footer(&good).cols[2] as usize] ^= 0x01;
    answers_as_before(&agent, &bad, &before);
}

#[test]
fn any_byte_of_a_snapshot_flipped_changes_no_answer() {
    let (_d, agent, before) = compacted();
    let path = agent.recall_dir().join(SNAPSHOT_FILE_NAME);
    let good = std::fs::read(&path).unwrap();
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        std::fs::write(&path, &bad).unwrap();
        let mut ro = Index::open_read_only(&agent).unwrap();
        let got: Vec<_> = QUERIES
            .iter()
            .map(|q| found_repairing(&mut ro, q))
            .collect();
        assert_eq!(got, before, "byte {i}");
    }
}

/// The agent's child may write its recall directory: a snapshot cut short
/// in place while a reader has it open must not kill the reader (a mapped
/// file would: SIGBUS on the next page read); it answers as before.
#[test]
fn a_snapshot_truncated_under_an_open_reader_does_not_crash_it() {
    let (_d, agent, before) = compacted();
    let path = agent.recall_dir().join(SNAPSHOT_FILE_NAME);
    for cut in [0u64, 1, 100] {
        let mut ro = Index::open_read_only(&agent).unwrap();
        let mut rw = Index::open(&agent).unwrap();
        // In place, as a hostile child would: same file, shorter.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        for index in [&mut ro, &mut rw] {
            let got: Vec<_> = QUERIES.iter().map(|q| found_repairing(index, q)).collect();
            assert_eq!(got, before, "cut to {cut} bytes");
        }
        drop((ro, rw));
        // The next writer rebuilds a whole snapshot.
        let mut fresh = Index::open(&agent).unwrap();
        fresh.compact().unwrap();
    }
}
