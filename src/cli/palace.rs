//! `mini-letta palace`: a read-only web view of agents' memory, served on
//! loopback or exported as static pages.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::globals::Globals;
use crate::palace::data::Site;
use crate::store;

#[derive(Debug, Subcommand)]
pub enum PalaceCommand {
    /// Serve Palace over HTTP (read-only; 127.0.0.1 unless --listen).
    #[command(after_help = "\
Pages: the agents; an agent's memory (system and deferred files, sizes against
limits); any file at any revision (?sha=<40 hex>); history (newest 500 commits)
with diffs; each conversation (messages with summaries and evicted ones marked,
the system prompt it uses, context usage, compactions, reflection state); a
recall search box. Only GET and HEAD are answered; Ctrl-C stops it.

Examples:
  mini-letta palace serve                     # serves until Ctrl-C
  mini-letta palace serve -a owl --port 0     # serves until Ctrl-C")]
    Serve {
        /// Agent id or name to show alone (default: the only agent, or every
        /// agent when there are several).
        #[arg(short = 'a', long = "agent", value_name = "AGENT")]
        agent: Option<String>,
        /// Port to listen on (0: any free port, printed at start).
        #[arg(long, default_value_t = 8283)]
        port: u16,
        /// Address to listen on. Anything but loopback exposes every
        /// agent's memory to the network, and Palace has no login.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
        listen: IpAddr,
    },
    /// Write the same pages as static HTML that opens from file://.
    #[command(after_help = "\
DIR is replaced as a whole (the pages are written beside it first), so a
reader never sees half an export. Search needs `palace serve`.

Examples:
  mini-letta palace export ~/palace
  mini-letta palace export site -a owl --json")]
    Export {
        /// The directory to write (replaced if it exists).
        dir: PathBuf,
        /// Agent id or name to show alone (default: the only agent, or every
        /// agent when there are several).
        #[arg(short = 'a', long = "agent", value_name = "AGENT")]
        agent: Option<String>,
        /// Print {"dir", "agents", "pages"} as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// How long `palace serve` waits at exit for pages still rendering on the
/// blocking threads, after its connections are gone.
const RENDER_WAIT_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(1);

/// SIGTERM or SIGINT (Ctrl-C), whichever comes first; both handlers are
/// installed now, not when the future is first polled.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

pub fn run(cli: &Globals, cmd: &PalaceCommand) -> anyhow::Result<ExitCode> {
    let home = cli.home()?;
    let only = |agent: &Option<String>| -> anyhow::Result<Option<String>> {
        Ok(match agent {
            Some(sel) => Some(store::find(&home, Some(sel))?.0.id),
            None => None,
        })
    };
    match cmd {
        PalaceCommand::Serve {
            agent,
            port,
            listen,
        } => {
            let site = Site::new(home.clone(), only(agent)?, true);
            if !listen.is_loopback() {
                eprintln!(
                    "warning: listening on {listen}: every agent's memory and conversations are \
readable by anyone who can reach this address, without a login"
                );
            }
            let addr = SocketAddr::new(*listen, *port);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let served = rt.block_on(async {
                // Caught from before the address is printed: a SIGTERM
                // any time after is a clean stop, never a kill.
                let stop = stop_signal()?;
                crate::palace::serve::serve(site, addr, stop, |bound| {
                    if bound.ip().is_unspecified() {
                        // Say what it listens on; this machine's own URL
                        // is the loopback one.
                        let here = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port());
                        println!(
                            "Palace: listening on {bound} (every address of this machine); \
                             here: http://{here}/ (read-only; Ctrl-C stops it)"
                        );
                    } else {
                        println!("Palace: http://{bound}/ (read-only; Ctrl-C stops it)");
                    }
                })
                .await
            });
            // A page still rendering (git reads) is not waited for long.
            rt.shutdown_timeout(RENDER_WAIT_AT_EXIT);
            served.map_err(|e| anyhow::anyhow!("cannot serve on {addr}: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        PalaceCommand::Export { dir, agent, json } => {
            let site = Site::new(home.clone(), only(agent)?, false);
            let out = crate::palace::export::export(&site, dir)?;
            if *json {
                crate::console::output::json(&out)?;
            } else {
                println!(
                    "wrote {} page(s) for {} agent(s) to {}; open {}/index.html",
                    out.pages,
                    out.agents,
                    out.dir.display(),
                    out.dir.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
