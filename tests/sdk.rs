#![allow(clippy::unwrap_used, clippy::expect_used)]
//! letta-ai's own SDK (`@letta-ai/letta-code-sdk`, npm) drives mini-letta
//! through `scripts/letta-code-cli.mjs` as `LETTA_CLI_PATH`, as a program
//! written for letta-code would (issue 47). The package is fetched with
//! `npm pack` into `target/` once, never committed; `tests/sdk/drive.mjs`
//! runs one scenario per call and prints what the SDK saw. Without node or
//! npm the tests skip loudly, and fail under `MINI_LETTA_REQUIRE_SDK=1`
//! (as CI sets).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

const SDK: &str = "@letta-ai/letta-code-sdk@0.1.14";
const REQUIRE_ENV: &str = "MINI_LETTA_REQUIRE_SDK";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Say loudly that the SDK could not be had; fail where it must be.
fn skip_sdk(reason: &str) {
    eprintln!("SKIPPED letta-code SDK tests: {reason}");
    if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
        panic!("{REQUIRE_ENV}=1 but the SDK tests were skipped: {reason}");
    }
}

/// The unpacked SDK package (fetched once into target/), or why not.
fn sdk() -> Result<PathBuf, String> {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = repo().join("target/letta-code-sdk-0.1.14");
    let package = cache.join("package");
    if package.join("dist/index.js").is_file() {
        return Ok(package);
    }
    for tool in ["node", "npm"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!(
                "{tool} not found (Debian: apt-get install -y nodejs npm)"
            ));
        }
    }
    std::fs::create_dir_all(&cache).map_err(|e| e.to_string())?;
    let o = Command::new("npm")
        .args(["pack", SDK, "--silent", "--pack-destination"])
        .arg(&cache)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "npm pack {SDK} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let tgz = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = Command::new("tar")
        .arg("xzf")
        .arg(cache.join(&tgz))
        .arg("-C")
        .arg(&cache)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() || !package.join("dist/index.js").is_file() {
        return Err(format!(
            "cannot unpack {tgz}: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(package)
}

/// Run `scenario` of tests/sdk/drive.mjs against the home at `home`.
fn drive(sdk: &Path, home: &Path, scenario: &str, arg: Option<&str>) -> Value {
    let mut cmd = Command::new("node");
    cmd.arg(repo().join("tests/sdk/drive.mjs"))
        .arg(scenario)
        .args(arg)
        .env("MINI_LETTA_SDK", sdk)
        .env("LETTA_CLI_PATH", repo().join("scripts/letta-code-cli.mjs"))
        .env("MINI_LETTA_BIN", bin())
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    let o = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{scenario}: {e}: {text}\n{}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert!(
        v.get("thrown").is_none(),
        "{scenario}: {v}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    v
}

macro_rules! sdk_or_skip {
    () => {
        match sdk() {
            Ok(p) => p,
            Err(why) => return skip_sdk(&why),
        }
    };
}

/// `createAgent({memfs: true, persona})`, then `resumeSession(id)` with two
/// turns in one process: the memory tool's call and result arrive as
/// `tool_call`/`tool_result` with one id, and the fact is at memory HEAD.
#[test]
fn the_sdk_creates_an_agent_and_resumes_it_for_two_turns() {
    let sdk = sdk_or_skip!();
    let home = open_home();
    let h = home.path();
    let v = drive(&sdk, h, "create-and-resume", None);
    let id = v["agentId"].as_str().unwrap();
    assert!(id.starts_with("agent-"), "{v}");
    assert_eq!(v["init"]["agentId"], id);
    assert_eq!(v["init"]["memfsEnabled"], true);
    assert!(
        v["init"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "memory"),
        "{v}"
    );
    let seen = v["first"]["seen"].as_array().unwrap();
    let call = seen
        .iter()
        .find(|m| m["type"] == "tool_call")
        .expect("a tool_call");
    assert_eq!(call["toolName"], "memory");
    let result = seen
        .iter()
        .find(|m| m["type"] == "tool_result")
        .expect("a tool_result");
    assert_eq!(result["toolCallId"], call["toolCallId"]);
    assert_eq!(result["isError"], false);
    assert_eq!(v["first"]["result"]["success"], true, "{v}");
    assert_eq!(v["second"]["result"]["success"], true, "{v}");
    // Two turns, two runs.
    assert_ne!(
        v["first"]["result"]["runIds"],
        v["second"]["result"]["runIds"]
    );
    let o = run(h, &["memory", "show", "-a", id, "human.md"]);
    assert!(stdout(&o).contains("I live in Hangzhou"), "{}", stdout(&o));
    let o = run(h, &["memory", "show", "-a", id, "persona.md"]);
    assert!(
        stdout(&o).contains("I am a careful archivist."),
        "{}",
        stdout(&o)
    );
}

/// `prompt(text, id)`; `createSession(id)` in a new `conv-…` conversation,
/// then `resumeSession(convId)` with `listMessages()` (paging with
/// `before`) and `bootstrapState()`.
#[test]
fn prompt_and_new_conversations_resume_by_their_conv_id() {
    let sdk = sdk_or_skip!();
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let v = drive(&sdk, h, "prompt", Some(&id));
    assert_eq!(v["result"]["success"], true, "{v}");
    assert!(
        v["result"]["conversationId"]
            .as_str()
            .unwrap()
            .starts_with("conv-"),
        "{v}"
    );
    let v = drive(&sdk, h, "new-conversation", Some(&id));
    let conv = v["conversationId"].as_str().unwrap();
    assert!(conv.starts_with("conv-"), "{v}");
    assert_eq!(v["turn"]["result"]["success"], true, "{v}");
    assert_eq!(v["resumedConversationId"], conv);
    assert_eq!(v["resumedAgentId"], id.as_str());
    let messages = v["list"]["messages"].as_array().unwrap();
    assert!(
        messages.iter().any(|m| m["message_type"] == "user_message"
            && m["content"] == "remember: my cat is called Mochi"),
        "{v}"
    );
    // Newest first, and the older page starts after the cursor.
    assert_eq!(messages[0]["message_type"], "assistant_message", "{v}");
    let older = v["older"]["messages"].as_array().unwrap();
    assert!(
        !older.is_empty() && older[0]["id"] == messages[2]["id"],
        "{v}"
    );
    assert_eq!(v["bootstrap"]["conversationId"], conv, "{v}");
    assert!(
        !v["bootstrap"]["messages"].as_array().unwrap().is_empty(),
        "{v}"
    );
}

/// `session.abort()` while a command runs: the turn ends at once with an
/// `interrupted` result, the conversation records the interruption, and the
/// session takes the next message.
#[test]
fn abort_interrupts_the_running_turn() {
    let sdk = sdk_or_skip!();
    if !confinement_or_skip("sdk abort") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let v = drive(&sdk, h, "abort", Some(&id));
    assert_eq!(v["result"]["success"], false, "{v}");
    assert_eq!(v["result"]["errorCode"], "interrupted", "{v}");
    assert!(
        v["seconds"].as_f64().unwrap() < 15.0,
        "the turn ran on: {v}"
    );
    let list = v["list"]["messages"].as_array().unwrap();
    assert!(
        list.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.contains("Interrupted"))),
        "{v}"
    );
    assert_eq!(v["after"]["result"]["success"], true, "{v}");
}

/// An unknown agent id is refused within seconds, with the reason.
#[test]
fn an_unknown_agent_is_rejected_within_seconds() {
    let sdk = sdk_or_skip!();
    let home = open_home();
    let v = drive(&sdk, home.path(), "unknown-agent", None);
    assert!(v.get("initialized").is_none(), "{v}");
    assert!(v["error"].as_str().unwrap().contains("not found"), "{v}");
    assert!(v["seconds"].as_f64().unwrap() < 10.0, "{v}");
}
