//! The agent-side program (see `mini_letta::agent::program`).

fn main() -> std::process::ExitCode {
    mini_letta_agent_program::agent::program::agent_main()
}
