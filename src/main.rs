fn main() -> std::process::ExitCode {
    mini_letta::cli::main()
}
