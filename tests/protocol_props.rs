//! Property tests of the wire protocol's decoder (`LineSplitter` +
//! `decode_client`): arbitrary bytes, arbitrary chunking, truncated and
//! over-size frames never panic, yield only frames or `FrameError`s, and never
//! stop a following valid frame from decoding. Plus one property against a
//! real supervisor: garbage on a connection never kills it or the connection.
//! See `docs/protocol.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use mini_letta::protocol::events::{
    ChildEnd, ChildExit, ChildStart, Lagged, ModelDelta, Shutdown, TurnDelta, TurnNotice,
};
use mini_letta::protocol::{
    Call, ClientFrame, ErrorBody, ErrorCode, Event, Line, LineSplitter, LogLevel, MAX_FRAME_BYTES,
    Outcome, PeerKind, ServerFrame, SpawnParams, StdioMode, decode_client, encode,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// JSON values without floats (serde_json does not promise bit-exact float
/// round trips without its `float_roundtrip` feature).
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_opt_string() -> impl Strategy<Value = Option<String>> {
    prop::option::of(any::<String>())
}

fn arb_call() -> impl Strategy<Value = Call> {
    let level = prop::sample::select(vec![
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ]);
    let spawn = (
        any::<String>(),
        any::<String>(),
        prop::collection::vec(any::<String>(), 0..4),
        prop::bool::ANY,
        arb_opt_string(),
        arb_opt_string(),
        arb_opt_string(),
    )
        .prop_map(|(agent, role, argv, passed, workspace, isolation, model)| {
            Call::Spawn(SpawnParams {
                agent,
                role,
                argv,
                stdio: if passed {
                    StdioMode::Passed
                } else {
                    StdioMode::Null
                },
                workspace,
                isolation,
                model,
            })
        });
    prop_oneof![
        Just(Call::Ping {}),
        Just(Call::Status {}),
        Just(Call::Stop {}),
        Just(Call::Ps {}),
        Just(Call::Subscribe {}),
        spawn,
        (any::<u64>(), prop::option::of(any::<i32>()))
            .prop_map(|(child, signal)| Call::Kill { child, signal }),
        (
            prop::collection::vec(any::<String>(), 0..4),
            any::<String>(),
            arb_opt_string()
        )
            .prop_map(|(paths, message, agent)| Call::MemoryCommit {
                paths,
                message,
                agent
            }),
        arb_opt_string().prop_map(|agent| Call::MemoryStatus { agent }),
        arb_json().prop_map(|request| Call::ModelComplete { request }),
        (level, any::<String>()).prop_map(|(level, message)| Call::Log { level, message }),
    ]
}

fn arb_client_frame() -> impl Strategy<Value = ClientFrame> {
    prop_oneof![
        1 => (any::<u32>(), prop::bool::ANY, prop::option::of("[0-9a-f]{1,64}")).prop_map(
            |(version, child, key)| ClientFrame::Hello {
                version,
                peer: if child { PeerKind::Child } else { PeerKind::Cli },
                key,
            }
        ),
        4 => (any::<u64>(), arb_call()).prop_map(|(id, call)| ClientFrame::Request { id, call }),
    ]
}

fn arb_error_code() -> impl Strategy<Value = ErrorCode> {
    prop::sample::select(vec![
        ErrorCode::InvalidJson,
        ErrorCode::InvalidFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownMethod,
        ErrorCode::InvalidParams,
        ErrorCode::VersionMismatch,
        ErrorCode::HelloRequired,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::ValidationFailed,
        ErrorCode::Unavailable,
        ErrorCode::NotTaken,
        ErrorCode::NotImplemented,
        ErrorCode::Internal,
    ])
}

/// Every typed event, and arbitrary names and data (read as the client
/// reads them: unknown names, and known ones with unreadable data, become
/// `Event::Other`).
fn arb_event() -> impl Strategy<Value = Event> {
    let end = prop_oneof![
        any::<i32>().prop_map(|code| ChildEnd::Exited { code }),
        any::<i32>().prop_map(|signal| ChildEnd::Killed { signal }),
    ];
    prop_oneof![
        (any::<u64>(), any::<String>(), any::<String>(), any::<u32>()).prop_map(
            |(child, agent, role, pid)| Event::ChildStart(ChildStart {
                child,
                agent,
                role,
                pid
            })
        ),
        (
            any::<u64>(),
            any::<String>(),
            any::<String>(),
            any::<u32>(),
            end
        )
            .prop_map(
                |(child, agent, role, pid, end)| Event::ChildExit(ChildExit {
                    child,
                    agent,
                    role,
                    pid,
                    end
                })
            ),
        (any::<u64>(), any::<String>())
            .prop_map(|(request, text)| Event::ModelDelta(ModelDelta { request, text })),
        (
            arb_opt_string(),
            prop::option::of(any::<u64>()),
            any::<String>()
        )
            .prop_map(|(agent, child, text)| Event::TurnDelta(TurnDelta {
                agent,
                child,
                text
            })),
        (any::<String>(), any::<u64>(), any::<String>(), arb_json()).prop_map(
            |(agent, child, conversation, event)| Event::TurnEvent(TurnNotice {
                agent,
                child,
                conversation,
                event
            })
        ),
        any::<u64>().prop_map(|grace_ms| Event::SupervisorShutdown(Shutdown { grace_ms })),
        any::<u64>().prop_map(|missed| Event::EventsLagged(Lagged { missed })),
        (any::<String>(), arb_json()).prop_map(|(event, data)| Event::from_wire(event, data)),
        (
            prop::sample::select(vec![
                "child.start",
                "child.exit",
                "model.delta",
                "turn.delta",
                "turn.event",
                "supervisor.shutdown",
                "events.lagged",
            ]),
            arb_json()
        )
            .prop_map(|(event, data)| Event::from_wire(event.to_string(), data)),
    ]
}

/// The event frame as it was before events were typed.
#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum UntypedFrame {
    Event { event: String, data: Value },
}

fn arb_server_frame() -> impl Strategy<Value = ServerFrame> {
    prop_oneof![
        (any::<u32>(), any::<String>(), any::<u32>()).prop_map(|(version, server, pid)| {
            ServerFrame::Hello {
                version,
                server,
                pid,
            }
        }),
        (any::<u64>(), arb_json()).prop_map(|(id, v)| ServerFrame::Response {
            id,
            outcome: Outcome::Result(v)
        }),
        (
            any::<u64>(),
            arb_error_code(),
            any::<String>(),
            // `Some(null)` reads back as `None` (`"data":null`); the server never sends it.
            prop::option::of(arb_json().prop_filter("not null", |v| !v.is_null()))
        )
            .prop_map(|(id, code, message, data)| ServerFrame::Response {
                id,
                outcome: Outcome::Error(ErrorBody {
                    code,
                    message,
                    data
                })
            }),
        arb_event().prop_map(ServerFrame::Event),
        (
            prop::option::of(any::<u64>()),
            arb_error_code(),
            any::<String>()
        )
            .prop_map(|(id, code, message)| ServerFrame::Error { id, code, message }),
    ]
}

/// Byte soup: raw bytes mixed with JSON-ish tokens and newlines, so some
/// lines get deep into the decoder instead of failing at the first byte.
fn arb_garbage(max_tokens: usize) -> impl Strategy<Value = Vec<u8>> {
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "\n",
        "\n",
        "\r\n",
        " ",
        "\t",
        "\"type\"",
        "\"request\"",
        "\"hello\"",
        "\"response\"",
        "\"id\"",
        "\"method\"",
        "\"params\"",
        "\"ping\"",
        "\"child.spawn\"",
        "\"memory.commit\"",
        "\"version\"",
        "\"peer\"",
        "\"cli\"",
        "1",
        "-1",
        "1.5",
        "18446744073709551616",
        "null",
        "true",
        "\\u0000",
        "\\ud800",
        "\u{00e9}",
        "\u{1f600}",
    ];
    let token = prop_oneof![
        2 => prop::sample::select(TOKENS).prop_map(|t| t.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 1..16),
    ];
    prop::collection::vec(token, 0..max_tokens).prop_map(|v| v.concat())
}

/// Cut points (fractions of the stream length) for random chunking.
fn arb_cuts() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.0f64..=1.0, 0..12)
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Split `bytes` at the given fractional cut points.
fn chunk<'a>(bytes: &'a [u8], cuts: &[f64]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|f| ((bytes.len() as f64) * f) as usize)
        .map(|i| i.min(bytes.len()))
        .collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}

/// Feed `chunks` through one splitter.
fn split(chunks: &[&[u8]]) -> Vec<Line> {
    let mut s = LineSplitter::new();
    chunks.iter().flat_map(|c| s.push(c)).collect()
}

/// What the splitter must produce for a stream whose lines are all within
/// the limit: every newline-terminated, non-blank line, in order.
fn model_lines(bytes: &[u8]) -> Vec<Line> {
    let mut parts: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    parts.pop(); // the unterminated tail stays buffered
    parts
        .into_iter()
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| Line::Frame(l.to_vec()))
        .collect()
}

/// Decode one line and check the error classification rules.
fn check_decode(line: &[u8]) -> Result<Option<ClientFrame>, TestCaseError> {
    match decode_client(line) {
        Ok(f) => Ok(Some(f)),
        Err(e) => {
            match e.code {
                ErrorCode::InvalidJson => prop_assert_eq!(e.id, None),
                ErrorCode::UnknownMethod | ErrorCode::InvalidParams => {
                    prop_assert!(e.id.is_some(), "{e:?}")
                }
                ErrorCode::InvalidFrame => {}
                other => prop_assert!(false, "decoder produced {other:?}"),
            }
            // The error frame answering it is itself one valid line.
            let frame = encode(&e.to_frame());
            prop_assert_eq!(frame.iter().filter(|&&b| b == b'\n').count(), 1);
            let back: ServerFrame = serde_json::from_slice(&frame).unwrap();
            prop_assert_eq!(back, e.to_frame());
            Ok(None)
        }
    }
}

fn strip_nl(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap()
}

// ---------------------------------------------------------------------------
// Decoder properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary bytes in arbitrary chunks: no panic, the same lines as a
    /// one-shot split, only frames or errors out of the decoder.
    #[test]
    fn garbage_in_any_chunks_never_panics(bytes in arb_garbage(64), cuts in arb_cuts()) {
        let lines = split(&chunk(&bytes, &cuts));
        prop_assert_eq!(&lines, &split(&[&bytes]));
        prop_assert_eq!(&lines, &model_lines(&bytes));
        for line in &lines {
            let Line::Frame(l) = line else {
                prop_assert!(false, "small input produced TooLarge");
                unreachable!()
            };
            prop_assert!(!l.contains(&b'\n'));
            check_decode(l)?;
        }
    }

    /// Pure random bytes (no token bias) straight into the decoder.
    #[test]
    fn decoder_never_panics_on_raw_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_decode(&bytes)?;
    }

    /// `encode` then decode is the identity, and the encoding is one line.
    #[test]
    fn client_frames_round_trip(frame in arb_client_frame()) {
        let line = encode(&frame);
        prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        prop_assert_eq!(line.last(), Some(&b'\n'));
        prop_assert_eq!(decode_client(strip_nl(&line)), Ok(frame));
    }

    /// The client side: server frames survive `encode` + serde.
    #[test]
    fn server_frames_round_trip(frame in arb_server_frame()) {
        let line = encode(&frame);
        prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let back: ServerFrame = serde_json::from_slice(&line).unwrap();
        prop_assert_eq!(back, frame);
    }

    /// Typed events are the same bytes as the untyped event frame
    /// (`{"type":"event","event":NAME,"data":DATA}`) they replaced.
    #[test]
    fn event_frames_keep_the_untyped_bytes(event in arb_event()) {
        let untyped = UntypedFrame::Event {
            event: event.name().to_string(),
            data: event.data(),
        };
        prop_assert_eq!(encode(&ServerFrame::Event(event)), encode(&untyped));
    }

    /// Any untyped event frame decodes (nothing a newer supervisor sends can
    /// break a reader), under its own name; unknown ones keep their data.
    #[test]
    fn any_event_frame_decodes(event in any::<String>(), data in arb_json()) {
        let line = encode(&UntypedFrame::Event { event: event.clone(), data: data.clone() });
        let back: ServerFrame = serde_json::from_slice(&line).unwrap();
        let ServerFrame::Event(back) = back else {
            prop_assert!(false, "not an event: {back:?}");
            unreachable!()
        };
        prop_assert_eq!(back.name(), event.as_str());
        if let Event::Other { data: kept, .. } = &back {
            prop_assert_eq!(kept, &data);
        }
    }

    /// Whatever garbage came before, a valid frame on its own line decodes to
    /// exactly what was sent, however the stream is chunked.
    #[test]
    fn valid_frame_after_garbage_decodes(
        garbage in arb_garbage(48),
        frame in arb_client_frame(),
        cuts in arb_cuts(),
    ) {
        let mut stream = garbage.clone();
        stream.push(b'\n');
        stream.extend_from_slice(&encode(&frame));
        let lines = split(&chunk(&stream, &cuts));
        let Some((Line::Frame(last), before)) = lines.split_last() else {
            prop_assert!(false, "no frame at the end: {lines:?}");
            unreachable!()
        };
        for l in before {
            let Line::Frame(l) = l else { unreachable!() };
            check_decode(l)?;
        }
        prop_assert_eq!(decode_client(last), Ok(frame));
    }

    /// A frame cut short (then a newline) is an `invalid_json` error or, when
    /// only blanks were left, nothing; the next frame is unharmed.
    #[test]
    fn truncated_frames_are_errors(
        frame in arb_client_frame(),
        next in arb_client_frame(),
        cut in 0.0f64..1.0,
        cuts in arb_cuts(),
    ) {
        let full = encode(&frame);
        let k = ((full.len() - 1) as f64 * cut) as usize; // strictly before the last '}'
        let mut stream = full[..k].to_vec();
        stream.push(b'\n');
        stream.extend_from_slice(&encode(&next));
        let lines = split(&chunk(&stream, &cuts));
        match lines.as_slice() {
            [Line::Frame(only)] => {
                prop_assert!(full[..k].iter().all(u8::is_ascii_whitespace));
                prop_assert_eq!(decode_client(only), Ok(next));
            }
            [Line::Frame(cut_line), Line::Frame(last)] => {
                let err = decode_client(cut_line).unwrap_err();
                prop_assert_eq!(err.code, ErrorCode::InvalidJson);
                prop_assert_eq!(decode_client(last), Ok(next));
            }
            other => prop_assert!(false, "unexpected lines {other:?}"),
        }
    }
}

proptest! {
    // Each case moves several MiB; keep it small.
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Lines around and far over the limit: each over-size line yields exactly
    /// one `TooLarge` and no frame, one at the limit is a frame, and the next
    /// valid frame decodes — whatever the chunking and whether the giant had
    /// reached its newline before the next bytes came.
    #[test]
    fn oversize_lines_yield_exactly_one_too_large(
        sizes in prop::collection::vec(
            prop_oneof![
                (0usize..=3).prop_map(|d| MAX_FRAME_BYTES - 1 + d), // MAX-1 ..= MAX+2
                (1usize..200_000).prop_map(|d| MAX_FRAME_BYTES + d),
                Just(2 * MAX_FRAME_BYTES + 7),
            ],
            1..3,
        ),
        fill in prop::sample::select(b"x{\"0 ".to_vec()),
        frame in arb_client_frame(),
        cuts in arb_cuts(),
    ) {
        let mut stream = Vec::new();
        for n in &sizes {
            let mut line = vec![fill; *n];
            line[0] = b'{'; // never an all-blank line
            stream.extend_from_slice(&line);
            stream.push(b'\n');
        }
        stream.extend_from_slice(&encode(&frame));
        let lines = split(&chunk(&stream, &cuts));
        prop_assert_eq!(lines.len(), sizes.len() + 1);
        for (line, n) in lines.iter().zip(&sizes) {
            if *n > MAX_FRAME_BYTES {
                prop_assert_eq!(line, &Line::TooLarge { id: None }, "line of {} bytes", n);
            } else {
                let Line::Frame(l) = line else {
                    prop_assert!(false, "a {n}-byte line (within the limit) was refused");
                    unreachable!()
                };
                prop_assert_eq!(l.len(), *n);
                check_decode(l)?;
            }
        }
        let Some(Line::Frame(last)) = lines.last() else { unreachable!() };
        prop_assert_eq!(decode_client(last), Ok(frame));
    }
}

/// An over-size line still being received reports `TooLarge` once, however
/// many more chunks of it arrive before its newline.
#[test]
fn endless_line_reports_once() {
    let mut s = LineSplitter::new();
    let chunk = vec![b'a'; 1 << 20];
    let mut out = Vec::new();
    for _ in 0..12 {
        out.extend(s.push(&chunk));
    }
    assert_eq!(out, vec![Line::TooLarge { id: None }]);
    out = s.push(b"still the same line\n{\"type\":\"hello\",\"version\":1,\"peer\":\"cli\"}\n");
    assert_eq!(out.len(), 1);
    let Line::Frame(l) = &out[0] else { panic!() };
    assert!(decode_client(l).is_ok());
}

// ---------------------------------------------------------------------------
// Against a real supervisor
// ---------------------------------------------------------------------------

/// One write in a hostile session.
#[derive(Debug, Clone)]
enum Junk {
    Bytes(Vec<u8>),
    /// A `ping` request (id below 1000) cut short, no newline.
    Truncated(u64, f64),
    /// A line over the limit (`MAX_FRAME_BYTES + n`), newline-terminated or not.
    Oversize(usize, bool),
}

fn arb_junk() -> impl Strategy<Value = Junk> {
    prop_oneof![
        6 => arb_garbage(24).prop_map(Junk::Bytes),
        3 => (0u64..1000, 0.0f64..1.0).prop_map(|(id, f)| Junk::Truncated(id, f)),
        1 => (1usize..70_000, any::<bool>()).prop_map(|(n, nl)| Junk::Oversize(n, nl)),
    ]
}

const KNOWN_ID: u64 = 987_654_321;

#[test]
fn supervisor_survives_garbage() {
    let d = common::Daemon::start(&["a"]);
    let pid = d.pid();
    let socket = d.path().join("run/supervisor.sock");
    let started = Instant::now();
    let mut runner = TestRunner::new(Config {
        cases: 16,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(
                prop::collection::vec(arb_junk(), 0..12),
                (1usize..70_000, any::<bool>()),
                any::<prop::sample::Index>(),
            ),
            |(mut writes, (n, nl), at)| {
                // Every session carries at least one over-size frame.
                let at = at.index(writes.len() + 1);
                writes.insert(at, Junk::Oversize(n, nl));
                let mut s = UnixStream::connect(&socket).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                s.write_all(&encode(&ClientFrame::Hello {
                    version: 1,
                    peer: PeerKind::Cli,
                    key: None,
                }))
                .unwrap();
                let mut hello = String::new();
                r.read_line(&mut hello).unwrap();
                let v: Value = serde_json::from_str(&hello).unwrap();
                prop_assert_eq!(&v["type"], "hello");

                for w in &writes {
                    let bytes = match w {
                        Junk::Bytes(b) => b.clone(),
                        Junk::Truncated(id, f) => {
                            let full = encode(&ClientFrame::Request {
                                id: *id,
                                call: Call::Ping {},
                            });
                            let k = ((full.len() - 1) as f64 * f) as usize;
                            full[..k].to_vec()
                        }
                        Junk::Oversize(n, nl) => {
                            let mut b = vec![b'z'; MAX_FRAME_BYTES + n];
                            if *nl {
                                b.push(b'\n');
                            }
                            b
                        }
                    };
                    s.write_all(&bytes).unwrap();
                }
                // End whatever line the junk left open, then a real request.
                s.write_all(b"\n").unwrap();
                s.write_all(&encode(&ClientFrame::Request {
                    id: KNOWN_ID,
                    call: Call::Ping {},
                }))
                .unwrap();

                loop {
                    let mut line = String::new();
                    let n = r.read_line(&mut line).unwrap();
                    prop_assert!(n > 0, "the supervisor closed the connection");
                    let v: Value = serde_json::from_str(&line)
                        .map_err(|e| TestCaseError::fail(format!("{e}: {line:?}")))?;
                    let ty = v["type"].as_str().unwrap_or("");
                    prop_assert!(ty == "error" || ty == "response", "{}", line);
                    if ty == "response" && v["id"].as_u64() == Some(KNOWN_ID) {
                        prop_assert_eq!(&v["result"]["pong"], &Value::Bool(true));
                        break;
                    }
                }
                prop_assert!(!common::process_gone(pid), "the supervisor died");
                Ok(())
            },
        )
        .unwrap();
    // The supervisor still answers new connections.
    assert!(d.client().call_json(Call::Ping {}).is_ok());
    assert_eq!(d.pid(), pid);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}
