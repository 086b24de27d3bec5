//! A tiny HTTP/1.1 server on 127.0.0.1 for provider wire tests: it answers
//! each request with the next canned response and records what it got.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// A canned response.
#[derive(Clone)]
pub struct Canned {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Canned {
    pub fn sse(events: &[String]) -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream",
            body: events.concat(),
        }
    }
    pub fn status(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.to_string(),
        }
    }
}

/// One request the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
}

pub struct Server {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    /// Serve `responses` in order (the last one repeats).
    pub fn start(responses: Vec<Canned>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut headers = Vec::new();
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end().to_string();
                    if h.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                        headers.push((k.to_lowercase(), v.trim().to_string()));
                    }
                }
                let mut body = vec![0u8; len];
                reader.read_exact(&mut body).unwrap();
                s2.lock().unwrap().push(Seen {
                    path,
                    headers,
                    body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
                });
                let r = responses[i.min(responses.len() - 1)].clone();
                i += 1;
                let reason = if r.status == 200 { "OK" } else { "Error" };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                    r.status,
                    r.content_type,
                    r.body.len(),
                    r.body
                );
                let _ = stream.flush();
            }
        });
        Self { port, seen }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// `data: <json>\n\n`
pub fn data(v: serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

/// `event: <name>\ndata: <json>\n\n`
pub fn event(name: &str, v: serde_json::Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}
