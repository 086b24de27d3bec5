//! The real providers against a hand-written HTTP/1.1 server on 127.0.0.1
//! that checks each request and answers in the provider's exact wire format
//! (SSE over chunked or plain bodies), plus configuration and the factory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mini_letta::model::{
    Message, Model, ModelError, ModelEvent, ModelRequest, ModelResponse, Part, ProviderConfig,
    Purpose, Role, StopKind, ToolSpec, default_model, open_model,
};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// A tiny HTTP server

#[derive(Debug)]
struct Received {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Value,
}

struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<String>,
    chunked: bool,
}

impl Reply {
    fn sse(pieces: Vec<String>) -> Self {
        Reply {
            status: 200,
            headers: vec![("Content-Type", "text/event-stream".into())],
            body: pieces,
            chunked: true,
        }
    }

    fn status(status: u16, body: &str) -> Self {
        Reply {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            body: vec![body.to_string()],
            chunked: false,
        }
    }
}

type Handler = Box<dyn FnOnce(&Received) -> Reply + Send>;

/// Serves one connection per handler, in order; returns the base URL and a
/// handle yielding what was received.
fn serve(handlers: Vec<Handler>) -> (String, JoinHandle<Vec<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for h in handlers {
            let deadline = Instant::now() + Duration::from_secs(20);
            let stream = loop {
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        assert!(Instant::now() < deadline, "no request arrived");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            };
            stream.set_nonblocking(false).unwrap();
            let req = read_request(&stream);
            let reply = h(&req);
            write_reply(stream, reply);
            seen.push(req);
        }
        seen
    });
    (format!("http://{addr}"), handle)
}

fn read_request(stream: &TcpStream) -> Received {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut it = line.split_whitespace();
    let method = it.next().unwrap().to_string();
    let path = it.next().unwrap().to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.insert(k.trim().to_lowercase(), v.trim().to_string());
    }
    let mut body = Vec::new();
    if let Some(n) = headers.get("content-length") {
        body.resize(n.parse().unwrap(), 0);
        r.read_exact(&mut body).unwrap();
    } else if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Received {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap(),
    }
}

/// Writes the reply. Write errors are ignored: a client may hang up as soon
/// as it has read the stream's terminator (`[DONE]`, `message_stop`).
fn write_reply(stream: TcpStream, reply: Reply) {
    let _ = try_write_reply(stream, reply);
}

fn try_write_reply(mut stream: TcpStream, reply: Reply) -> std::io::Result<()> {
    let reason = match reply.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nConnection: close\r\n",
        reply.status
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if reply.chunked {
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
        stream.write_all(head.as_bytes())?;
        for piece in &reply.body {
            write!(stream, "{:x}\r\n{piece}\r\n", piece.len())?;
            stream.flush()?;
            std::thread::sleep(Duration::from_millis(2));
        }
        stream.write_all(b"0\r\n\r\n")?;
    } else {
        let body = reply.body.concat();
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes())?;
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

// ---------------------------------------------------------------------------
// Helpers

/// A configuration whose endpoints point at `base` with test keys.
fn config(env: &[(&str, &str)]) -> ProviderConfig {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ProviderConfig::load_from(std::path::Path::new("/nonexistent/config.toml"), &|k| {
        env.get(k).cloned()
    })
    .unwrap()
}

fn openai_cfg(base: &str) -> ProviderConfig {
    config(&[
        ("OPENAI_BASE_URL", &format!("{base}/v1")),
        ("OPENAI_API_KEY", "sk-test"),
    ])
}

fn anthropic_cfg(base: &str) -> ProviderConfig {
    config(&[
        ("ANTHROPIC_BASE_URL", base),
        ("ANTHROPIC_API_KEY", "ak-test"),
    ])
}

fn bash_tool() -> ToolSpec {
    ToolSpec {
        name: "Bash".into(),
        description: "Run a shell command".into(),
        parameters: json!({"type":"object","properties":{"command":{"type":"string"}},
                           "required":["command"]}),
    }
}

fn request(handle: &str, messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: handle.into(),
        system: "You are helpful.".into(),
        messages,
        tools: vec![bash_tool()],
        max_tokens: Some(256),
        purpose: Purpose::Turn,
        context_window: None,
    }
}

fn run(
    model: &dyn Model,
    req: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<ModelEvent>) {
    let mut events = Vec::new();
    let r = model.complete(req, &mut |e| events.push(e));
    (r, events)
}

fn deltas(events: &[ModelEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::TextDelta { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// The history after the model asked for `Bash echo hi` and got `hi\n`.
fn tool_round_trip(call_id: &str) -> Vec<Message> {
    vec![
        Message::user("say hi with bash"),
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: call_id.into(),
                name: "Bash".into(),
                arguments: json!({"command":"echo hi"}),
            }],
        },
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: call_id.into(),
                name: "Bash".into(),
                text: "hi\n".into(),
                is_error: false,
            }],
        },
    ]
}

// ---------------------------------------------------------------------------
// OpenAI

fn openai_text_chunks(pieces: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pieces {
        out.push(data(
            json!({"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-test",
            "choices":[{"index":0,"delta":{"content":p},"finish_reason":null}]}),
        ));
    }
    out.push(data(json!({"id":"chatcmpl-1","model":"gpt-test",
        "choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})));
    out.push(data(
        json!({"id":"chatcmpl-1","model":"gpt-test","choices":[],
        "usage":{"prompt_tokens":42,"completion_tokens":5,"total_tokens":47,
                 "prompt_tokens_details":{"cached_tokens":32}}}),
    ));
    out.push("data: [DONE]\n\n".into());
    out
}

#[test]
fn openai_streams_text() {
    let (base, server) = serve(vec![Box::new(|_| {
        Reply::sse(openai_text_chunks(&["Hel", "lo", "!"]))
    })]);
    let model = open_model("openai/gpt-test", &openai_cfg(&base)).unwrap();
    let (r, events) = run(
        &*model,
        &request("openai/gpt-test", vec![Message::user("hi")]),
    );
    let r = r.unwrap();
    assert_eq!(deltas(&events), vec!["Hel", "lo", "!"]);
    assert_eq!(r.parts, vec![Part::text("Hello!")]);
    assert_eq!(r.stop, StopKind::EndTurn);
    assert_eq!(r.response_id, "chatcmpl-1");
    assert_eq!(r.model, "openai/gpt-test");
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens
        ),
        (42, 5, 32)
    );

    let seen = server.join().unwrap();
    let req = &seen[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.headers.get("authorization").map(String::as_str),
        Some("Bearer sk-test")
    );
    assert!(req.headers["content-type"].starts_with("application/json"));
    let b = &req.body;
    assert_eq!(b["model"], "gpt-test");
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"], json!({"include_usage": true}));
    assert_eq!(b["max_tokens"], 256);
    assert_eq!(
        b["messages"],
        json!([
            {"role":"system","content":"You are helpful."},
            {"role":"user","content":"hi"}
        ])
    );
    assert_eq!(b["tools"][0]["type"], "function");
    assert_eq!(b["tools"][0]["function"]["name"], "Bash");
    assert_eq!(
        b["tools"][0]["function"]["parameters"]["required"],
        json!(["command"])
    );
}

#[test]
fn openai_streamed_tool_call_then_tool_result_round_trip() {
    let first: Handler = Box::new(|_| {
        let frag = |args: &str| {
            data(
                json!({"id":"chatcmpl-2","model":"gpt-test","choices":[{"index":0,
                "delta":{"tool_calls":[{"index":0,"function":{"arguments":args}}]},"finish_reason":null}]}),
            )
        };
        Reply::sse(vec![
            data(
                json!({"id":"chatcmpl-2","model":"gpt-test","choices":[{"index":0,
                "delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_abc",
                "type":"function","function":{"name":"Bash","arguments":""}}]},"finish_reason":null}]}),
            ),
            frag("{\"comm"),
            frag("and\": \"ec"),
            frag("ho hi\"}"),
            data(
                json!({"id":"chatcmpl-2","model":"gpt-test","choices":[{"index":0,"delta":{},
                "finish_reason":"tool_calls"}]}),
            ),
            data(
                json!({"id":"chatcmpl-2","choices":[],"usage":{"prompt_tokens":60,"completion_tokens":12}}),
            ),
            "data: [DONE]\n\n".into(),
        ])
    });
    let second: Handler = Box::new(|req| {
        let msgs = req.body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap();
        let assistant = &msgs[msgs.len() - 2];
        let ok = last == &json!({"role":"tool","tool_call_id":"call_abc","content":"hi\n"})
            && assistant["role"] == "assistant"
            && assistant["tool_calls"][0]["id"] == "call_abc"
            && assistant["tool_calls"][0]["type"] == "function"
            && assistant["tool_calls"][0]["function"]["arguments"] == "{\"command\":\"echo hi\"}";
        if ok {
            Reply::sse(openai_text_chunks(&["The command printed hi."]))
        } else {
            Reply::status(400, r#"{"error":{"message":"bad tool round trip"}}"#)
        }
    });
    let (base, server) = serve(vec![first, second]);
    let model = open_model("openai/gpt-test", &openai_cfg(&base)).unwrap();

    let (r, events) = run(
        &*model,
        &request("openai/gpt-test", vec![Message::user("say hi with bash")]),
    );
    let r = r.unwrap();
    assert_eq!(r.stop, StopKind::ToolUse);
    let call = Part::ToolCall {
        id: "call_abc".into(),
        name: "Bash".into(),
        arguments: json!({"command":"echo hi"}),
    };
    assert_eq!(r.parts, vec![call]);
    assert_eq!(
        events,
        vec![ModelEvent::ToolCall {
            id: "call_abc".into(),
            name: "Bash".into(),
            arguments: json!({"command":"echo hi"})
        }]
    );
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (60, 12));

    let (r2, _) = run(
        &*model,
        &request("openai/gpt-test", tool_round_trip("call_abc")),
    );
    let r2 = r2.unwrap();
    assert_eq!(r2.parts, vec![Part::text("The command printed hi.")]);
    assert_eq!(r2.stop, StopKind::EndTurn);
    assert_eq!(server.join().unwrap().len(), 2);
}

#[test]
fn openai_invalid_tool_arguments_are_kept_as_a_string() {
    let (base, server) = serve(vec![Box::new(|_| {
        Reply::sse(vec![
            data(
                json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",
                "function":{"name":"Bash","arguments":"{\"command\": "}}]},"finish_reason":"tool_calls"}]}),
            ),
            "data: [DONE]\n\n".into(),
        ])
    })]);
    let model = open_model("openai/gpt-test", &openai_cfg(&base)).unwrap();
    let (r, _) = run(
        &*model,
        &request("openai/gpt-test", vec![Message::user("x")]),
    );
    let r = r.unwrap();
    assert!(
        matches!(&r.parts[..], [Part::ToolCall { arguments: Value::String(s), .. }] if s == "{\"command\": "),
        "{r:?}"
    );
    server.join().unwrap();
}

fn openai_error(
    status: u16,
    body: &'static str,
    headers: Vec<(&'static str, String)>,
) -> ModelError {
    let (base, server) = serve(vec![Box::new(move |_| {
        let mut r = Reply::status(status, body);
        r.headers.extend(headers);
        r
    })]);
    let model = open_model("openai/gpt-test", &openai_cfg(&base)).unwrap();
    let (r, events) = run(
        &*model,
        &request("openai/gpt-test", vec![Message::user("x")]),
    );
    server.join().unwrap();
    assert!(events.is_empty());
    r.unwrap_err()
}

#[test]
fn openai_500_is_transient_with_retry_after() {
    let e = openai_error(
        500,
        r#"{"error":{"message":"upstream exploded"}}"#,
        vec![("Retry-After", "2".into())],
    );
    assert_eq!(
        e,
        ModelError::Transient {
            status: Some(500),
            message: "upstream exploded".into(),
            retry_after_ms: Some(2000),
            hint: None,
        }
    );
    let e = openai_error(429, r#"{"error":{"message":"slow down"}}"#, vec![]);
    assert!(
        matches!(
            e,
            ModelError::Transient {
                status: Some(429),
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn openai_400_context_message_is_overflow() {
    let e = openai_error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        vec![],
    );
    assert!(
        matches!(&e, ModelError::ContextOverflow { message } if message.contains("maximum context length")),
        "{e:?}"
    );
}

#[test]
fn openai_401_is_fatal_with_the_server_message() {
    let e = openai_error(
        401,
        r#"{"error":{"message":"Incorrect API key provided"}}"#,
        vec![],
    );
    assert_eq!(
        e,
        ModelError::Fatal {
            status: Some(401),
            message: "Incorrect API key provided".into()
        }
    );
}

// ---------------------------------------------------------------------------
// Anthropic

fn event(name: &str, v: Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

fn anthropic_text_stream(text_pieces: &[&str]) -> Vec<String> {
    let mut out = vec![
        event(
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_1","type":"message",
            "role":"assistant","model":"claude-test","content":[],"stop_reason":null,
            "usage":{"input_tokens":30,"output_tokens":1,"cache_read_input_tokens":20}}}),
        ),
        event(
            "content_block_start",
            json!({"type":"content_block_start","index":0,
            "content_block":{"type":"text","text":""}}),
        ),
        event("ping", json!({"type":"ping"})),
    ];
    for p in text_pieces {
        out.push(event(
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,
            "delta":{"type":"text_delta","text":p}}),
        ));
    }
    out.push(event(
        "content_block_stop",
        json!({"type":"content_block_stop","index":0}),
    ));
    out.push(event(
        "message_delta",
        json!({"type":"message_delta",
        "delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}),
    ));
    out.push(event("message_stop", json!({"type":"message_stop"})));
    out
}

#[test]
fn anthropic_streams_text() {
    let (base, server) = serve(vec![Box::new(|_| {
        Reply::sse(anthropic_text_stream(&["Hi", " there"]))
    })]);
    let model = open_model("anthropic/claude-test", &anthropic_cfg(&base)).unwrap();
    let (r, events) = run(
        &*model,
        &request("anthropic/claude-test", vec![Message::user("hello")]),
    );
    let r = r.unwrap();
    assert_eq!(deltas(&events), vec!["Hi", " there"]);
    assert_eq!(r.parts, vec![Part::text("Hi there")]);
    assert_eq!(r.stop, StopKind::EndTurn);
    assert_eq!(r.response_id, "msg_1");
    assert_eq!(r.model, "anthropic/claude-test");
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens
        ),
        (30, 9, 20)
    );

    let seen = server.join().unwrap();
    let req = &seen[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(
        req.headers.get("x-api-key").map(String::as_str),
        Some("ak-test")
    );
    assert_eq!(
        req.headers.get("anthropic-version").map(String::as_str),
        Some("2023-06-01")
    );
    assert!(!req.headers.contains_key("authorization"));
    let b = &req.body;
    assert_eq!(b["model"], "claude-test");
    assert_eq!(b["stream"], true);
    assert_eq!(b["max_tokens"], 256);
    assert_eq!(b["system"], "You are helpful.");
    assert_eq!(
        b["messages"],
        json!([{"role":"user","content":[{"type":"text","text":"hello"}]}])
    );
    assert_eq!(b["tools"][0]["name"], "Bash");
    assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
}

#[test]
fn anthropic_streamed_tool_use_then_tool_result_round_trip() {
    let first: Handler = Box::new(|_| {
        let piece = |s: &str| {
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,
                "delta":{"type":"input_json_delta","partial_json":s}}),
            )
        };
        Reply::sse(vec![
            event(
                "message_start",
                json!({"type":"message_start","message":{"id":"msg_2",
                "model":"claude-test","usage":{"input_tokens":50,"output_tokens":1}}}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,
                "content_block":{"type":"text","text":""}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,
                "delta":{"type":"text_delta","text":"Running it."}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":1,
                "content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}),
            ),
            piece(""),
            piece("{\"comm"),
            piece("and\": \"echo"),
            piece(" hi\"}"),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":1}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},
                "usage":{"output_tokens":20}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ])
    });
    let second: Handler = Box::new(|req| {
        let msgs = req.body["messages"].as_array().unwrap();
        let ok = msgs.len() == 3
            && msgs[1]
                == json!({"role":"assistant","content":[{"type":"tool_use","id":"toolu_1",
                "name":"Bash","input":{"command":"echo hi"}}]})
            && msgs[2]
                == json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",
                "content":"hi\n","is_error":false}]});
        if ok {
            Reply::sse(anthropic_text_stream(&["It printed hi."]))
        } else {
            Reply::status(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad round trip"}}"#,
            )
        }
    });
    let (base, server) = serve(vec![first, second]);
    let model = open_model("anthropic/claude-test", &anthropic_cfg(&base)).unwrap();

    let (r, events) = run(
        &*model,
        &request(
            "anthropic/claude-test",
            vec![Message::user("say hi with bash")],
        ),
    );
    let r = r.unwrap();
    assert_eq!(r.stop, StopKind::ToolUse);
    let args = json!({"command":"echo hi"});
    assert_eq!(
        r.parts,
        vec![
            Part::text("Running it."),
            Part::ToolCall {
                id: "toolu_1".into(),
                name: "Bash".into(),
                arguments: args.clone()
            },
        ]
    );
    assert_eq!(
        events,
        vec![
            ModelEvent::TextDelta {
                text: "Running it.".into()
            },
            ModelEvent::ToolCall {
                id: "toolu_1".into(),
                name: "Bash".into(),
                arguments: args
            },
        ]
    );
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (50, 20));

    let (r2, _) = run(
        &*model,
        &request("anthropic/claude-test", tool_round_trip("toolu_1")),
    );
    let r2 = r2.unwrap();
    assert_eq!(r2.parts, vec![Part::text("It printed hi.")]);
    assert_eq!(server.join().unwrap().len(), 2);
}

fn anthropic_error(reply: Reply) -> ModelError {
    let (base, server) = serve(vec![Box::new(move |_| reply)]);
    let model = open_model("anthropic/claude-test", &anthropic_cfg(&base)).unwrap();
    let (r, _) = run(
        &*model,
        &request("anthropic/claude-test", vec![Message::user("x")]),
    );
    server.join().unwrap();
    r.unwrap_err()
}

#[test]
fn anthropic_error_statuses_and_events() {
    let overloaded = anthropic_error(Reply::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    assert_eq!(
        overloaded,
        ModelError::Transient {
            status: Some(529),
            message: "Overloaded".into(),
            retry_after_ms: None,
            hint: None,
        }
    );
    let too_long = anthropic_error(Reply::status(
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
    ));
    assert!(
        matches!(too_long, ModelError::ContextOverflow { .. }),
        "{too_long:?}"
    );
    let bad_key = anthropic_error(Reply::status(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
    ));
    assert_eq!(
        bad_key,
        ModelError::Fatal {
            status: Some(401),
            message: "invalid x-api-key".into()
        }
    );
    let mid_stream = anthropic_error(Reply::sse(vec![
        event(
            "message_start",
            json!({"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}),
        ),
        event(
            "error",
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        ),
    ]));
    assert!(
        matches!(mid_stream, ModelError::Transient { status: None, .. }),
        "{mid_stream:?}"
    );
}

// ---------------------------------------------------------------------------
// Configuration and the factory

#[test]
fn config_defaults_and_file() {
    let cfg = config(&[]);
    assert_eq!(default_model(&cfg), "mock");
    assert_eq!(cfg.openai.base_url, "https://api.openai.com/v1");
    assert_eq!(cfg.anthropic.base_url, "https://api.anthropic.com");
    assert_eq!(cfg.openai.api_key, None);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "[model]\ndefault = \"openai/llama3\"\ncontext_window = 32000\n\n\
         [providers.openai]\nbase_url = \"http://localhost:11434/v1/\"\napi_key_env = \"MY_KEY\"\n\n\
         [providers.mock]\ncontext_window = 900\n\n[network]\nmax_connections = 8\n",
    )
    .unwrap();
    let cfg =
        ProviderConfig::load_from(&path, &|k| (k == "MY_KEY").then(|| "k1".to_string())).unwrap();
    assert_eq!(default_model(&cfg), "openai/llama3");
    assert_eq!(cfg.openai.base_url, "http://localhost:11434/v1");
    assert_eq!(cfg.openai.api_key.as_deref(), Some("k1"));
    assert_eq!(cfg.context_window_for("mock"), Some(900));
    assert_eq!(cfg.context_window_for("openai/llama3"), Some(32000));
    assert_eq!(cfg.source.as_deref(), Some(path.as_path()));
}

#[test]
fn config_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[providers.openai]\nbase_ulr = \"x\"\n").unwrap();
    let e = ProviderConfig::load_from(&path, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("base_ulr"),
        "{e}"
    );
    std::fs::write(&path, "[providers.anthropic]\nbase_url = \"ftp://x\"\n").unwrap();
    let e = ProviderConfig::load_from(&path, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[providers.anthropic]") && e.contains("http://"),
        "{e}"
    );
    std::fs::write(&path, "not toml [").unwrap();
    assert!(ProviderConfig::load_from(&path, &|_| None).is_err());
    // Issue 48 (9): a misspelt table was ignored by every reader.
    std::fs::write(
        &path,
        "[providers.openai]\napi_key = \"k\"\n\n[modle]\ndefault = \"mock\"\n",
    )
    .unwrap();
    let e = ProviderConfig::load_from(&path, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("line 4")
            && e.contains("\"modle\"")
            && e.contains("did you mean [model]?")
            && e.contains("[network]"),
        "{e}"
    );
    std::fs::write(&path, "defualt_model = \"mock\"\n[sandbox]\nanything = 1\n").unwrap();
    let e = ProviderConfig::load_from(&path, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1") && e.contains("defualt_model"), "{e}");
}

#[test]
fn factory_forms_and_keys() {
    let none = config(&[]);
    let e = open_model("openai/gpt-4o", &none).err().unwrap();
    assert!(e.to_string().contains("set OPENAI_API_KEY"), "{e}");
    let e = open_model("anthropic/claude", &none).err().unwrap();
    assert!(e.to_string().contains("set ANTHROPIC_API_KEY"), "{e}");
    let e = open_model("gemini/pro", &none).err().unwrap();
    assert!(
        matches!(&e, ModelError::Fatal { message, .. } if message.contains("openai/<model>") && message.contains("MINI_LETTA_SCRIPTED_MODEL")),
        "{e:?}"
    );
    assert!(open_model("openai/", &config(&[("OPENAI_API_KEY", "k")])).is_err());
    // Keyless is fine for a server on this machine.
    let local = config(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")]);
    assert!(open_model("openai/llama", &local).is_ok());
    assert!(open_model("mock", &none).is_ok());
}

#[test]
fn keyless_local_server_gets_no_auth_header() {
    let (base, server) = serve(vec![Box::new(|_| Reply::sse(openai_text_chunks(&["ok"])))]);
    let cfg = config(&[("OPENAI_BASE_URL", &format!("{base}/v1"))]);
    let model = open_model("openai/llama", &cfg).unwrap();
    let (r, _) = run(&*model, &request("openai/llama", vec![Message::user("x")]));
    assert_eq!(r.unwrap().parts, vec![Part::text("ok")]);
    let seen = server.join().unwrap();
    assert!(!seen[0].headers.contains_key("authorization"));
}

// ---------------------------------------------------------------------------
// Unreachable and silent servers (issue 31 §4)

/// A port on this machine nobody listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A refused connection said `io: Connection refused` with a hint that
/// blamed overload. It names the URL tried, says it refused, and hints at
/// `base_url` (and the variable that sets it), for both providers.
#[test]
fn a_refused_connection_names_the_url_and_hints_at_base_url() {
    let port = closed_port();
    let cases = [
        (
            "openai/x",
            openai_cfg(&format!("http://127.0.0.1:{port}")),
            "[providers.openai]",
            "OPENAI_BASE_URL",
        ),
        (
            "anthropic/x",
            anthropic_cfg(&format!("http://127.0.0.1:{port}")),
            "[providers.anthropic]",
            "ANTHROPIC_BASE_URL",
        ),
    ];
    for (handle, cfg, table, var) in cases {
        let model = open_model(handle, &cfg).unwrap();
        let (r, _) = run(&*model, &request(handle, vec![Message::user("x")]));
        let e = r.unwrap_err();
        let ModelError::Transient { message, hint, .. } = &e else {
            panic!("{handle}: {e:?}")
        };
        assert!(
            message.contains(&format!("http://127.0.0.1:{port}")) && message.contains("refused"),
            "{handle}: {message}"
        );
        let hint = hint.as_deref().unwrap_or_default();
        assert!(
            hint.contains("base_url") && hint.contains(table) && hint.contains(var),
            "{handle}: {hint}"
        );
        assert!(!hint.contains("overloaded"), "{hint}");
    }
}

/// A server that accepts the connection and never answers; the sockets it
/// accepted are kept open for the test's life.
fn silent_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    format!("http://{addr}")
}

/// `timeout_secs` in a `[providers.*]` table (an unknown field before) is
/// how long a request may take: a server that never answers fails the
/// request after it, saying it timed out and naming the setting.
#[test]
fn a_request_that_never_answers_times_out_after_timeout_secs() {
    let base = silent_server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[providers.openai]\nbase_url = \"{base}/v1\"\napi_key = \"k\"\ntimeout_secs = 1\n\n\
             [providers.anthropic]\nbase_url = \"{base}\"\napi_key = \"k\"\ntimeout_secs = 2\n"
        ),
    )
    .unwrap();
    let cfg = ProviderConfig::load_from(&path, &|_| None).unwrap();
    assert_eq!(cfg.openai.timeout_secs, 1);
    assert_eq!(cfg.anthropic.timeout_secs, 2);
    assert_eq!(config(&[]).openai.timeout_secs, 300, "the default");
    for (handle, secs) in [("openai/x", 1u64), ("anthropic/x", 2)] {
        let model = open_model(handle, &cfg).unwrap();
        let began = Instant::now();
        let (r, _) = run(&*model, &request(handle, vec![Message::user("x")]));
        let took = began.elapsed();
        assert!(
            took >= Duration::from_secs(secs) && took < Duration::from_secs(secs + 5),
            "{handle}: {took:?}"
        );
        let e = r.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("timed out") && text.contains(&format!("{secs} s")),
            "{handle}: {text}"
        );
        let ModelError::Transient { hint, .. } = &e else {
            unreachable!()
        };
        assert!(
            hint.as_deref().unwrap_or_default().contains("timeout_secs"),
            "{hint:?}"
        );
    }
    std::fs::write(&path, "[providers.openai]\ntimeout_secs = 0\n").unwrap();
    let e = ProviderConfig::load_from(&path, &|_| None).unwrap_err();
    assert!(e.to_string().contains("timeout_secs"), "{e}");
}

// ---------------------------------------------------------------------------
// How a streamed answer stopped, and errors inside a stream (both readers)

/// What a reader made of a stream: the stop kind, the tool calls kept and
/// those announced; or whether the error is transient, whether it is an
/// overflow, and its text.
type ReadOutcome = Result<(StopKind, usize, usize), (bool, bool, String)>;

fn cut_short() -> ReadOutcome {
    let m = "transient model error: the provider stream ended without a stop reason";
    Err((true, false, m.into()))
}

/// `openai::read_stream` or `anthropic::read_stream`.
type StreamReader = fn(
    &str,
    std::io::Cursor<Vec<u8>>,
    &mut dyn FnMut(ModelEvent),
) -> Result<ModelResponse, ModelError>;

fn read_with(read: StreamReader, stream: &[String]) -> ReadOutcome {
    let body = std::io::Cursor::new(stream.concat().into_bytes());
    let mut announced = 0;
    let r = read("m", body, &mut |e| {
        announced += usize::from(matches!(e, ModelEvent::ToolCall { .. }));
    });
    match r {
        Ok(r) => {
            let calls = r
                .parts
                .iter()
                .filter(|p| matches!(p, Part::ToolCall { .. }));
            Ok((r.stop, calls.count(), announced))
        }
        Err(e) => Err((
            e.is_transient(),
            matches!(e, ModelError::ContextOverflow { .. }),
            e.to_string(),
        )),
    }
}

#[test]
fn openai_stop_kinds_and_stream_errors() {
    use mini_letta::model::openai::read_stream;
    let chunk = |delta: Value, finish: Value| {
        data(json!({"id":"c1","choices":[{"index":0,"delta":delta,"finish_reason":finish}]}))
    };
    let call =
        json!({"tool_calls":[{"index":0,"id":"k","function":{"name":"Bash","arguments":"{}"}}]});
    let done = "data: [DONE]\n\n".to_string();
    let text = chunk(json!({"content":"x"}), Value::Null);
    let cases: Vec<(Vec<String>, ReadOutcome)> = vec![
        (
            vec![
                text.clone(),
                chunk(json!({}), json!("length")),
                done.clone(),
            ],
            Ok((StopKind::MaxTokens, 0, 0)),
        ),
        (
            vec![chunk(call.clone(), json!("tool_calls"))],
            Ok((StopKind::ToolUse, 1, 1)),
        ),
        (
            vec![chunk(call.clone(), json!("stop"))],
            Ok((StopKind::ToolUse, 1, 1)),
        ),
        (
            vec![text.clone(), chunk(json!({}), json!("odd"))],
            Ok((StopKind::EndTurn, 0, 0)),
        ),
        (
            vec![text.clone(), done.clone()],
            Ok((StopKind::EndTurn, 0, 0)),
        ),
        (
            vec![chunk(call.clone(), Value::Null)],
            Ok((StopKind::ToolUse, 1, 1)),
        ),
        (vec![text.clone()], cut_short()),
    ];
    for (stream, want) in cases {
        assert_eq!(read_with(read_stream, &stream), want, "{stream:?}");
    }
    let error = |message: &str| data(json!({"error":{"message":message,"type":"x"}}));
    let got = read_with(
        read_stream,
        &[text.clone(), error("maximum context length is 8k")],
    );
    assert_eq!(got.map_err(|e| (e.0, e.1)), Err((false, true)));
    let got = read_with(read_stream, &[error("server melted")]);
    assert!(
        matches!(got, Err((true, false, ref m)) if m.contains("server melted")),
        "{got:?}"
    );
}

#[test]
fn anthropic_stop_kinds_and_stream_errors() {
    use mini_letta::model::anthropic::read_stream;
    let start = event(
        "message_start",
        json!({"type":"message_start","message":{"id":"m1"}}),
    );
    let tool = event(
        "content_block_start",
        json!({"type":"content_block_start","index":0,
               "content_block":{"type":"tool_use","id":"t","name":"Bash","input":{}}}),
    );
    let close = event(
        "content_block_stop",
        json!({"type":"content_block_stop","index":0}),
    );
    let stop = |r: &str| {
        event(
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":r}}),
        )
    };
    let end = event("message_stop", json!({"type":"message_stop"}));
    let cases: Vec<(Vec<String>, ReadOutcome)> = vec![
        (
            vec![start.clone(), stop("max_tokens"), end.clone()],
            Ok((StopKind::MaxTokens, 0, 0)),
        ),
        (
            vec![start.clone(), tool.clone(), close.clone(), stop("tool_use")],
            Ok((StopKind::ToolUse, 1, 1)),
        ),
        (
            vec![start.clone(), tool.clone(), close.clone(), stop("end_turn")],
            Ok((StopKind::ToolUse, 1, 1)),
        ),
        (
            vec![start.clone(), stop("end_turn"), end.clone()],
            Ok((StopKind::EndTurn, 0, 0)),
        ),
        (
            vec![start.clone(), end.clone()],
            Ok((StopKind::EndTurn, 0, 0)),
        ),
        // A block never closed is kept, not announced.
        (
            vec![start.clone(), tool.clone()],
            Ok((StopKind::ToolUse, 1, 0)),
        ),
        (vec![start.clone()], cut_short()),
    ];
    for (stream, want) in cases {
        assert_eq!(read_with(read_stream, &stream), want, "{stream:?}");
    }
    let error = |kind: &str, message: &str| {
        event(
            "error",
            json!({"type":"error","error":{"type":kind,"message":message}}),
        )
    };
    let errors = [
        (
            ("overloaded_error", "busy"),
            (true, false),
            "transient model error: overloaded_error: busy",
        ),
        (
            ("invalid_request_error", "no"),
            (false, false),
            "model error: invalid_request_error: no",
        ),
        (
            ("invalid_request_error", "prompt is too long"),
            (false, true),
            "context window exceeded: prompt is too long",
        ),
    ];
    for ((kind, message), (transient, overflow), shown) in errors {
        let got = read_with(read_stream, &[start.clone(), error(kind, message)]);
        assert_eq!(got, Err((transient, overflow, shown.to_string())));
    }
}
