#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Palace in a real browser (Debian's headless Chromium): every page kind
//! renders what it should, served (`palace serve --port 0`) and exported
//! (`palace export`, opened from `file://`); hostile memory shows as text
//! and runs nothing; and over raw HTTP bad requests are refused (400/404),
//! symlinks are never followed and anything but GET/HEAD is 405.
//!
//! Without Chromium the browser test says so loudly and returns, unless
//! `MINI_LETTA_REQUIRE_BROWSER=1` (CI), where it fails.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const FACT: &str = "the owl hunts voles at dusk";
const HOSTILE: &str = "<script>alert(1)</script>\n<script>document.title='PWNED'</script>\n<img src=x onerror=\"document.body.dataset.pwned=1\">\n";

fn git(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new("git")
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@x",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    o
}

/// An agent `owl` under a fresh home.
struct Owl {
    home: tempfile::TempDir,
    id: String,
}

impl Owl {
    fn new() -> Self {
        let home = open_home();
        let id = create_agent(home.path(), &["owl"]);
        Self { home, id }
    }
    fn h(&self) -> &Path {
        self.home.path()
    }
    fn memory(&self) -> PathBuf {
        self.h().join("agents").join(&self.id).join("memory")
    }
    /// Commit `notes.md` (valid frontmatter, hostile body) through the
    /// pre-commit hook.
    fn commit_hostile_notes(&self) {
        let body = format!("---\nname: notes\ndescription: hostile notes\n---\n{HOSTILE}");
        std::fs::write(self.memory().join("notes.md"), body).unwrap();
        git(&self.memory(), &["add", "notes.md"]);
        git(&self.memory(), &["commit", "-qm", "add hostile notes"]);
    }
    /// Commit a symlink to /etc/passwd, bypassing the hook.
    fn commit_symlink(&self) {
        std::os::unix::fs::symlink("/etc/passwd", self.memory().join("leak.md")).unwrap();
        git(&self.memory(), &["add", "leak.md"]);
        git(
            &self.memory(),
            &["commit", "--no-verify", "-qm", "plant a symlink"],
        );
    }
    /// The id of the commit whose subject starts with `subject`.
    fn commit_with_subject(&self, subject: &str) -> String {
        let o = git(&self.memory(), &["log", "--format=%H %s"]);
        stdout(&o)
            .lines()
            .find_map(|l| {
                let (sha, s) = l.split_once(' ')?;
                s.starts_with(subject).then(|| sha.to_string())
            })
            .unwrap_or_else(|| panic!("no commit {subject:?}"))
    }
}

/// `palace serve --port 0`, killed on drop.
struct Server {
    child: Child,
    base: String,
    addr: String,
}

impl Server {
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
        let base = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        let addr = base
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        Self { child, base, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One raw HTTP/1.1 request, the path sent byte for byte; (status, body).
fn http(addr: &str, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
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
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Whether Chromium is here; when not, say so loudly (and fail under
/// `MINI_LETTA_REQUIRE_BROWSER=1`).
fn chromium_or_skip() -> bool {
    if Path::new(CHROMIUM).is_file() {
        return true;
    }
    eprintln!("SKIPPED palace browser test: chromium not installed");
    if std::env::var("MINI_LETTA_REQUIRE_BROWSER").as_deref() == Ok("1") {
        panic!("MINI_LETTA_REQUIRE_BROWSER=1 but chromium is not installed ({CHROMIUM})");
    }
    false
}

/// Run headless Chromium with `args` then `url` (bounded: killed, with
/// everything it started, after 45 s); its stdout.
fn chromium(args: &[&str], url: &str) -> String {
    use std::os::unix::process::CommandExt;
    let profile = tempfile::tempdir().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(45);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    // Whatever is left of the group (renderers, the zygote) goes too.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    assert!(status.is_some(), "chromium timed out on {url}");
    std::fs::read_to_string(out.path()).unwrap()
}

fn dump_dom(url: &str) -> String {
    chromium(&["--dump-dom"], url)
}

fn screenshot(url: &str, png: &Path) {
    let arg = format!("--screenshot={}", png.display());
    chromium(&[&arg, "--window-size=1280,900"], url);
}

fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/palace-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One page to look at: its kind, its path under the site root, and the
/// strings its rendered DOM must hold.
struct PageCheck {
    kind: &'static str,
    path: String,
    expect: Vec<String>,
    served_only: bool,
}

/// The hostile memory file rendered as text, nothing run.
fn assert_inert(kind: &str, dom: &str) {
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{kind}: the script should show as text:\n{dom}"
    );
    assert!(
        dom.contains("&lt;script&gt;document.title='PWNED'&lt;/script&gt;"),
        "{kind}: {dom}"
    );
    assert!(
        dom.contains("&lt;img src=x onerror=\"document.body.dataset.pwned=1\"&gt;")
            || dom.contains("&lt;img src=x onerror=&quot;document.body.dataset.pwned=1&quot;&gt;"),
        "{kind}: the img should show as text:\n{dom}"
    );
    let title = dom
        .split_once("<title>")
        .and_then(|(_, t)| t.split_once("</title>"))
        .map(|(t, _)| t)
        .unwrap_or_default();
    assert!(!title.contains("PWNED"), "{kind}: a script ran: {title}");
    assert!(!dom.contains("data-pwned"), "{kind}: an onerror ran");
    assert!(!dom.contains("<script"), "{kind}: a script element: {dom}");
    assert!(!dom.contains("<img"), "{kind}: an img element: {dom}");
}

#[test]
fn palace_pages_render_in_a_browser_served_and_exported() {
    if !chromium_or_skip() || !confinement_or_skip("palace browser test") {
        return;
    }
    let started = Instant::now();
    let owl = Owl::new();
    let o = run(
        owl.h(),
        &["chat", "-a", "owl", "-p", &format!("记住: {FACT}")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    owl.commit_hostile_notes();
    let fact_commit = owl.commit_with_subject("memory insert");
    let conv_dir = owl.h().join("agents").join(&owl.id).join("conversations");
    let conv = std::fs::read_dir(&conv_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .next()
        .expect("a conversation");

    let export = tempfile::tempdir().unwrap();
    let site = export.path().join("site");
    let o = run(
        owl.h(),
        &["palace", "export", site.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let server = Server::start(owl.h());

    let id = &owl.id;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let pages = vec![
        PageCheck {
            kind: "index",
            path: "index.html".into(),
            expect: s(&["owl", id, "Agents"]),
            served_only: false,
        },
        PageCheck {
            kind: "memory",
            path: format!("a/{id}/index.html"),
            expect: s(&[
                "human.md",
                "persona.md",
                "notes.md",
                "system",
                "What I know about the user.",
                "Conversations",
            ]),
            served_only: false,
        },
        PageCheck {
            kind: "file",
            path: format!("a/{id}/files/human.md.html"),
            expect: vec![format!("- {FACT}")],
            served_only: false,
        },
        PageCheck {
            kind: "file-at-revision",
            path: format!("a/{id}/files/human.md.html?sha={fact_commit}"),
            expect: vec![format!("- {FACT}"), fact_commit[..8].to_string()],
            served_only: true,
        },
        PageCheck {
            kind: "hostile-file",
            path: format!("a/{id}/files/notes.md.html"),
            expect: s(&["hostile notes"]),
            served_only: false,
        },
        PageCheck {
            kind: "history",
            path: format!("a/{id}/history.html"),
            expect: s(&[
                "chore: initialize memory",
                "memory insert: human.md",
                "add hostile notes",
            ]),
            served_only: false,
        },
        PageCheck {
            kind: "commit",
            path: format!("a/{id}/commits/{fact_commit}.html"),
            expect: vec![
                format!("<span class=\"add\">+- {FACT}</span>"),
                "memory insert: human.md".into(),
                "human.md".into(),
            ],
            served_only: false,
        },
        PageCheck {
            kind: "conversation",
            path: format!("a/{id}/c/{conv}.html"),
            expect: vec![
                "System prompt in use".into(),
                format!("记住: {FACT}"),
                "Messages (".into(),
                "Steps since reflection".into(),
                "assistant".into(),
                "user".into(),
            ],
            served_only: false,
        },
        PageCheck {
            kind: "search",
            path: format!("a/{id}/search.html?q=voles"),
            expect: s(&["result(s)", "voles", &format!("c/{conv}.html")]),
            served_only: true,
        },
    ];

    let shots = screenshot_dir();
    std::thread::scope(|scope| {
        let mut jobs = Vec::new();
        for p in &pages {
            let served_url = format!("{}{}", server.base, p.path);
            let shot = shots.join(format!("{}.png", p.kind));
            jobs.push(scope.spawn(move || {
                let dom = dump_dom(&served_url);
                screenshot(&served_url, &shot);
                ("served", p, dom)
            }));
            if !p.served_only {
                let file_url = format!("file://{}/{}", site.display(), p.path);
                jobs.push(scope.spawn(move || ("file://", p, dump_dom(&file_url))));
            }
        }
        for j in jobs {
            let (mode, p, dom) = j.join().unwrap();
            assert!(
                dom.contains("<title>") && dom.contains("Palace"),
                "{mode} {}: nothing rendered:\n{dom}",
                p.kind
            );
            for e in &p.expect {
                assert!(
                    dom.contains(e.as_str()),
                    "{mode} {}: {e:?} not in the page:\n{dom}",
                    p.kind
                );
            }
            assert!(!dom.contains("<script"), "{mode} {}: a script", p.kind);
            if p.kind == "hostile-file" {
                assert_inert(&format!("{mode} {}", p.kind), &dom);
            }
        }
    });
    for p in &pages {
        let png = shots.join(format!("{}.png", p.kind));
        let len = std::fs::metadata(&png)
            .unwrap_or_else(|e| panic!("{}: {e}", png.display()))
            .len();
        assert!(len > 5 * 1024, "{}: only {len} bytes", png.display());
    }
    eprintln!(
        "palace browser test: {} page kinds, screenshots in {}, {:.1} s",
        pages.len(),
        shots.display(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn palace_refuses_bad_requests_over_raw_http() {
    let owl = Owl::new();
    owl.commit_hostile_notes();
    owl.commit_symlink();
    let head = owl.commit_with_subject("plant a symlink");
    let server = Server::start(owl.h());
    let id = &owl.id;
    let get = |path: &str| http(&server.addr, "GET", path);

    // A sane baseline: the pages answer.
    assert_eq!(get("/").0, 200);
    assert_eq!(get(&format!("/a/{id}/files/notes.md.html")).0, 200);
    let (st, body) = get(&format!("/a/{id}/commits/{head}.html"));
    assert_eq!(st, 200, "{body}");
    // The history page is the same from the summary cache as computed.
    let history = format!("/a/{id}/history.html");
    let (st, first) = get(&history);
    assert_eq!(st, 200);
    assert!(first.contains("plant a symlink") && first.contains("add hostile notes"));
    assert_eq!(get(&history), (200, first));

    // Bad shas: 400.
    for bad in [
        format!("/a/{id}/commits/{}.html", "g".repeat(40)),
        format!("/a/{id}/commits/{}.html", &head[..39]),
        format!("/a/{id}/commits/{head}0.html"),
        format!("/a/{id}/commits/HEAD.html"),
        format!("/a/{id}/files/human.md.html?sha=HEAD"),
        format!("/a/{id}/files/human.md.html?sha={}", &head[..20]),
        format!("/a/{id}/files/human.md.html?sha={}..", &head[..38]),
    ] {
        assert_eq!(get(&bad).0, 400, "{bad}");
    }

    // Paths leaving the memory tree: 400 or 404, never a file's content.
    for bad in [
        format!("/a/{id}/files/../../../../etc/passwd.html"),
        format!("/a/{id}/files/..%2f..%2f..%2f..%2fetc%2fpasswd.html"),
        format!("/a/{id}/files/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd.html"),
        format!("/a/{id}/files/%2E%2E/agent.json.html"),
        format!("/a/{id}/files//etc/passwd.html"),
        format!("/a/{id}/files/%2fetc%2fpasswd.html"),
        format!("/a/{id}/files/human.md.html/../../../agent.json"),
        "/../../../../etc/passwd".to_string(),
        format!("/a/{id}/../../etc/passwd"),
    ] {
        let (st, body) = get(&bad);
        assert!(st == 400 || st == 404, "{bad}: {st}");
        assert!(!body.contains("root:x:0:0"), "{bad}: leaked /etc/passwd");
    }

    // The committed symlink is not a file, and its target is never read.
    for path in [
        format!("/a/{id}/files/leak.md.html"),
        format!("/a/{id}/files/leak.md.html?sha={head}"),
    ] {
        let (st, body) = get(&path);
        assert_eq!(st, 404, "{path}: {body}");
        assert!(!body.contains("root:x:0:0"), "{path}: followed the symlink");
    }
    for path in [
        "/".to_string(),
        format!("/a/{id}/"),
        format!("/a/{id}/history.html"),
        format!("/a/{id}/commits/{head}.html"),
    ] {
        let (_, body) = get(&path);
        assert!(!body.contains("root:x:0:0"), "{path}: followed the symlink");
    }

    // Unknown or malformed agents.
    for path in [
        "/a/agent-00000000-0000-0000-0000-000000000000/".to_string(),
        "/a/agent-00000000-0000-0000-0000-000000000000/history.html".to_string(),
        format!("/a/agent-00000000-0000-0000-0000-000000000000/commits/{head}.html"),
        "/a/nobody/files/human.md.html".to_string(),
    ] {
        assert_eq!(get(&path).0, 404, "{path}");
    }
    assert_eq!(get("/no/such/page").0, 404);

    // Read-only: anything but GET and HEAD is 405, wherever it is sent.
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in [
            "/".to_string(),
            format!("/a/{id}/"),
            format!("/a/{id}/files/human.md.html"),
            "/no/such/page".to_string(),
        ] {
            assert_eq!(http(&server.addr, method, &path).0, 405, "{method} {path}");
        }
    }
    assert_eq!(http(&server.addr, "HEAD", "/").0, 200);
}
