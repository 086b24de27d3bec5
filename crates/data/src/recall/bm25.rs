//! BM25 (k1 = 1.2, b = 0.75, idf = ln(1 + (N − df + 0.5)/(df + 0.5))).

pub const K1: f64 = 1.2;
pub const B: f64 = 0.75;

/// The inverse document frequency of a term in `df` of `n` messages.
pub(crate) fn idf(n: u64, df: u64) -> f64 {
    let (n, df) = (n as f64, df as f64);
    (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
}

/// One term's contribution to a message's score.
pub(crate) fn term_score(idf: f64, tf: f64, dl: f64, avgdl: f64) -> f64 {
    let norm = if avgdl > 0.0 {
        1.0 - B + B * dl / avgdl
    } else {
        1.0
    };
    idf * tf * (K1 + 1.0) / (tf + K1 * norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rarer_terms_and_shorter_messages_score_higher() {
        assert!(idf(100, 1) > idf(100, 50));
        assert!(idf(100, 100) > 0.0);
        let i = idf(10, 2);
        assert!(term_score(i, 1.0, 5.0, 10.0) > term_score(i, 1.0, 20.0, 10.0));
        assert!((idf(1, 1) - (1.0f64 + 0.5 / 1.5).ln()).abs() < 1e-12);
    }
}
