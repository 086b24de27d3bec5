//! The agent-side program (see `mini_letta::entry`).

fn main() -> std::process::ExitCode {
    mini_letta::entry::agent_main()
}
