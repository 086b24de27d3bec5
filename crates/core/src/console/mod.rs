//! What this crate's programs write on their standard streams for a
//! person: data made terminal-safe (`output`), a program's own error and
//! warning lines in colour (`style`), and log records written whole
//! (`logging`). The user's CLI, the agent program and an embedded
//! supervisor's notices all go through it; it sits below all three.

pub mod logging;
pub mod output;
pub mod style;

/// Set up log records on stderr for a program: `verbose` (`-v` count)
/// chooses the level unless `RUST_LOG` does.
pub fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    let level = match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let quiet = verbose == 0 && std::env::var_os(EnvFilter::DEFAULT_ENV).is_none();
    let fmt = tracing_subscriber::fmt()
        // One write(2) per record: the daemon's log is shared.
        .with_writer(logging::WholeRecords)
        // No colour escapes in log files (the daemon's supervisor.log, where
        // a quiet process's records go) or when NO_COLOR asks for none.
        .with_ansi(style::enabled() && !quiet);
    // A plain level unless RUST_LOG asks for more: building an EnvFilter
    // compiles its directive regexes, a noticeable part of a one-shot run.
    let from_env = (verbose == 0)
        .then(|| std::env::var_os(EnvFilter::DEFAULT_ENV))
        .flatten()
        .and_then(|_| EnvFilter::try_from_default_env().ok());
    logging::set_quiet(quiet);
    let _ = match from_env {
        Some(filter) => fmt.with_env_filter(filter).try_init(),
        None => fmt.with_max_level(level).try_init(),
    };
}

/// The error and its causes on one line, without repeating a cause that the
/// message already contains.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}
