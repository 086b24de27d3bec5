//! The child stage as a small program of its own: what every confined
//! child runs first (capability check, landlock, seccomp, hello on the
//! channel, exec of the real program). Small, so it starts fast on every
//! launch; it must be installed beside `mini-letta` (the supervisor
//! refuses to launch without it, naming the missing file).
//!
//! Usage (by the supervisor only): `mini-letta-stage2 ROLE --agent ID
//! [--policy JSON] -- PROGRAM ARGS…`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(split) = args.iter().position(|a| a == "--") else {
        eprintln!("mini-letta-stage2: usage: ROLE --agent ID [--policy JSON] -- PROGRAM ARGS…");
        return ExitCode::from(mini_letta_sandbox::child::STAGE_FAILURE as u8);
    };
    let (head, argv) = (&args[..split], &args[split + 1..]);
    let role = head.first().map(String::as_str).unwrap_or("");
    let value = |flag: &str| {
        head.iter()
            .position(|a| a == flag)
            .and_then(|i| head.get(i + 1))
            .map(String::as_str)
    };
    let agent = value("--agent").unwrap_or("");
    let failure = mini_letta_sandbox::child::run(role, agent, value("--policy"), argv);
    eprintln!("mini-letta: {failure}");
    ExitCode::from(u8::try_from(failure.exit_code()).unwrap_or(1))
}
