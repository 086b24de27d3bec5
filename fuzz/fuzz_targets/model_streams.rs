//! Both providers' event-stream readers take whatever a server sends: they
//! answer or fail, never panic, and every text delta shown to the user
//! while streaming is in the answer they return.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mini_letta::model::{ModelEvent, anthropic, openai};

fuzz_target!(|data: &[u8]| {
    for read in [anthropic::read_stream, openai::read_stream] {
        let mut deltas = Vec::new();
        let got = read("fuzz-model", data, &mut |ev| {
            if let ModelEvent::TextDelta { text } = ev {
                deltas.push(text);
            }
        });
        if let Ok(response) = got {
            let text = response.text();
            for d in &deltas {
                assert!(text.contains(d.as_str()), "delta {d:?} not in {text:?}");
            }
        }
    }
});
