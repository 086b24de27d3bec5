//! Palace against slow clients and at shutdown, and root's readers of a
//! conversation log in which the agent wrote one 200 MB line: a client
//! that never finishes its header must not keep a descriptor for ever,
//! SIGTERM must stop Palace however many such clients there are, and what
//! an agent writes must not decide how much memory root's readers take.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mini_letta::protocol::messages::{Part, Role};
use mini_letta::store::conversation::StoredMessage;

use crate::common::*;

/// The peak resident memory the readers may reach, in KiB.
const RSS_LIMIT_KIB: u64 = 64 * 1024;
/// The agent's line: larger than any cap, far smaller than the disk.
const BIG_LINE_BYTES: usize = 200 * 1024 * 1024;

/// `palace serve --port 0` under `home`; killed on drop.
struct Palace {
    child: Child,
    addr: String,
}

impl Palace {
    fn start(home: &Path) -> Self {
        let mut child = Command::new(bin())
            .args(["palace", "serve", "--port", "0"])
            .env("MINI_LETTA_HOME", home)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Self { child, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A connection that sent a request line and one header, never the
    /// blank line that ends the header.
    fn partial_header(&self) -> TcpStream {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
        s
    }

    /// One complete `GET path`; (status, body).
    fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }
}

impl Drop for Palace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long until the server closes `s` (reading whatever it sends
/// first), or `None` when it is still open after `limit`.
fn closed_within(mut s: TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            // A reset is a close too.
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

#[test]
fn palace_closes_a_connection_whose_header_never_ends() {
    let home = open_home();
    create_agent(home.path(), &["owl"]);
    let palace = Palace::start(home.path());
    let s = palace.partial_header();
    let took = closed_within(s, Duration::from_secs(15));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(10)),
        "a partial header held the connection open for {took:?} (want < 10 s)"
    );
    // Palace still serves.
    assert_eq!(palace.get("/").0, 200);
}

#[test]
fn palace_exits_promptly_on_sigterm_with_connections_open() {
    let home = open_home();
    create_agent(home.path(), &["owl"]);
    let mut palace = Palace::start(home.path());
    let held: Vec<TcpStream> = (0..3).map(|_| palace.partial_header()).collect();
    // Served and idle, kept alive: the other kind of open connection.
    let mut idle = TcpStream::connect(&palace.addr).unwrap();
    idle.write_all(b"GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 64];
    idle.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(palace.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    while start.elapsed() < Duration::from_secs(5) && status.is_none() {
        status = palace.child.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    drop(held);
    let status = status.unwrap_or_else(|| {
        panic!("palace serve still running {took:?} after SIGTERM with connections open")
    });
    assert!(status.success(), "palace serve exited with {status}");
}

/// `messages.jsonl` of the default conversation of `agent`: a message,
/// a 200 MB message line, a message. Returns the log's path.
fn plant_big_line(home: &Path, agent: &str) -> PathBuf {
    let dir = home
        .join("agents")
        .join(agent)
        .join("conversations")
        .join("default");
    std::fs::create_dir_all(&dir).unwrap();
    let line = |id: &str, text: &str, ts: &str| {
        let mut m = StoredMessage::new(
            id.to_string(),
            Role::User,
            vec![Part::Text { text: text.into() }],
        );
        m.ts = ts.to_string();
        serde_json::to_string(&m).unwrap()
    };
    let path = dir.join("messages.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(
        f,
        "{}",
        line("msg-000001", "first words", "2026-01-01T00:00:00Z")
    )
    .unwrap();
    // A well-formed message: a reader without a cap would hold and show it.
    let big = line("msg-000002", "@BIG@", "2026-01-02T00:00:00Z");
    let (head, tail) = big.split_once("@BIG@").unwrap();
    f.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..BIG_LINE_BYTES / chunk.len() {
        f.write_all(&chunk).unwrap();
    }
    writeln!(f, "{tail}").unwrap();
    writeln!(
        f,
        "{}",
        line("msg-000003", "last words", "2026-01-03T00:00:00Z")
    )
    .unwrap();
    f.flush().unwrap();
    path
}

/// Run the CLI under `home` with `args`; (stdout, stderr, success, peak
/// resident memory in KiB).
fn run_measured(home: &Path, args: &[&str]) -> (String, String, bool, u64) {
    run_measured_program(&bin(), home, args)
}

/// [`run_measured`] with another copy of the CLI (`program`).
///
/// The peak is GNU time's (`%M`): it forks the command from its own small
/// process and reports that child's `maxrss`. Read straight from `wait4`
/// here, it was this test binary's: at `exec`, Linux gives the new program
/// the high-water mark of the address space it leaves (`exec_mmap`), and a
/// child spawned with `posix_spawn` leaves this process's, which other
/// tests running beside it make large (the three tests failed at ~136 MiB
/// under the whole suite, passed alone).
fn run_measured_program(program: &Path, home: &Path, args: &[&str]) -> (String, String, bool, u64) {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        crate::common::skip_or_fail(
            "GNU time is not installed (apt-get install time): no peak to read",
        );
    }
    let report = tempfile::NamedTempFile::new().unwrap();
    let o = Command::new(time)
        .args(["-f", "%M", "-o"])
        .arg(report.path())
        .arg(program)
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // A command killed by a signal gets a line of its own before `%M`.
    let written = std::fs::read_to_string(report.path()).unwrap();
    let peak = written
        .lines()
        .rev()
        .find_map(|l| l.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no peak in GNU time's report: {written:?}"));
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        o.status.success(),
        peak,
    )
}

#[test]
fn conversations_over_a_200mb_line_stays_small_and_says_what_it_skipped() {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    plant_big_line(home.path(), &id);
    let (out, err, ok, rss) = run_measured(home.path(), &["conversations", "--json"]);
    assert!(ok, "conversations failed: {err}");
    assert!(
        rss < RSS_LIMIT_KIB,
        "conversations peaked at {} MiB over a 200 MB line (limit 64 MiB)",
        rss / 1024
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let convs = v["conversations"].as_array().unwrap();
    let default = convs.iter().find(|c| c["id"] == "default").unwrap();
    assert_eq!(default["messages"], 2, "{default}");
    assert_eq!(default["in_context"], 2, "{default}");
    assert_eq!(default["last_message_at"], "2026-01-03T00:00:00Z");
    assert!(
        err.contains("default") && err.contains("line 2"),
        "the skipped line is not reported: {err:?}"
    );
    assert_eq!(
        err.matches("line 2").count(),
        1,
        "reported more than once: {err:?}"
    );
}

#[test]
fn attach_history_over_a_200mb_line_stays_small_and_says_what_it_skipped() {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    plant_big_line(home.path(), &id);
    let (out, err, ok, rss) = run_measured(home.path(), &["attach", "--no-follow", "--json"]);
    assert!(ok, "attach failed: {err}");
    assert!(
        rss < RSS_LIMIT_KIB,
        "attach --no-follow peaked at {} MiB over a 200 MB line (limit 64 MiB)",
        rss / 1024
    );
    let ids: Vec<String> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids, ["msg-000001", "msg-000003"]);
    assert!(
        err.contains("default") && err.contains("line 2"),
        "the skipped line is not reported: {err:?}"
    );
    assert_eq!(
        err.matches("line 2").count(),
        1,
        "reported more than once: {err:?}"
    );
}

/// VmHWM (peak resident memory) of `pid`, in KiB.
fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn palace_pages_over_a_200mb_line_stay_small() {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    plant_big_line(home.path(), &id);
    let palace = Palace::start(home.path());
    // The agents page counts each conversation's messages; the
    // conversation page shows them.
    let (status, body) = palace.get("/");
    assert_eq!(status, 200, "{body}");
    let (status, body) = palace.get(&format!("/a/{id}/c/default.html"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("first words") && body.contains("last words"));
    let rss = peak_kib(palace.pid());
    assert!(
        rss < RSS_LIMIT_KIB,
        "palace peaked at {} MiB over a 200 MB line (limit 64 MiB)",
        rss / 1024
    );
}

#[test]
fn attach_following_a_log_with_a_200mb_line_reads_only_what_is_appended() {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    let log = plant_big_line(home.path(), &id);
    // No supervisor: attach follows the log itself.
    let mut attach = Command::new(bin())
        .args(["attach", "--json", "--last", "1"])
        .env("MINI_LETTA_HOME", home.path())
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = attach.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = attach.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_id = || {
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["id"].as_str().unwrap().to_string()
    };
    assert_eq!(next_id(), "msg-000003");
    // Several polls over the whole log, then a message appended.
    std::thread::sleep(Duration::from_secs(1));
    let mut m = StoredMessage::new(
        "msg-000004".into(),
        Role::User,
        vec![Part::Text {
            text: "appended".into(),
        }],
    );
    m.ts = "2026-01-04T00:00:00Z".into();
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writeln!(f, "{}", serde_json::to_string(&m).unwrap()).unwrap();
    assert_eq!(next_id(), "msg-000004");
    let rss = peak_kib(pid);
    let _ = attach.kill();
    let _ = attach.wait();
    assert!(
        rss < RSS_LIMIT_KIB,
        "attach (following) peaked at {} MiB over a 200 MB line (limit 64 MiB)",
        rss / 1024
    );
}

/// An agent program (the confined child of a turn) that writes a 200 MB
/// line on its stderr and another as its event stream: the operator's
/// `chat`, which relays both, must hold neither.
#[test]
fn chat_over_an_agent_program_writing_200mb_lines_stays_small() {
    let home = open_home();
    create_agent(home.path(), &["demo"]);
    // mini-letta's programs are installed side by side: a copy of the CLI
    // and the child stage beside a hostile agent program.
    let dir = tempfile::tempdir().unwrap();
    let cli = crate::common::install_with_agent_program(
        dir.path(),
        &format!(
            "#!/bin/sh\nhead -c {BIG_LINE_BYTES} /dev/zero | tr '\\0' x >&2\necho >&2\n\
             head -c {BIG_LINE_BYTES} /dev/zero | tr '\\0' y\necho\nexit 3\n"
        ),
    );
    let (_, err, ok, peak) =
        run_measured_program(&cli, home.path(), &["chat", "-a", "demo", "-p", "hi"]);
    assert!(!ok, "the hostile agent program cannot finish a turn");
    assert!(
        err.contains("(a line of") && err.contains("bytes from the agent was not shown"),
        "the skipped stderr line is reported: {}",
        &err[..err.len().min(2000)]
    );
    assert!(
        err.contains("(an event of"),
        "the skipped event line is reported: {}",
        &err[..err.len().min(2000)]
    );
    assert!(
        err.len() < 64 * 1024,
        "nothing of the lines reached the terminal ({} bytes)",
        err.len()
    );
    assert!(
        peak < RSS_LIMIT_KIB,
        "chat peaked at {peak} KiB over two 200 MB lines"
    );
}
