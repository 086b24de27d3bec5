//! The agent-side program (see `mini_letta::agent::program`).

fn main() -> std::process::ExitCode {
    mini_letta::agent::program::agent_main()
}
