//! Ctrl-C and SIGTERM for the command line. During a turn the first signal
//! cancels that turn (through the supervisor, which stops its child and
//! records the interruption) and the command goes on; a second one, or a
//! signal outside a turn, ends the command — after stopping the embedded
//! supervisor it may run, so no child, pid file or socket is left behind.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::paths::Home;
use crate::protocol::Call;
use crate::supervisor::Stopper;

/// The turn a signal would cancel.
#[derive(Clone)]
struct TurnRef {
    home: Home,
    agent: Option<String>,
    conversation: String,
}

#[derive(Default)]
struct Shared {
    turn: Mutex<Option<TurnRef>>,
    /// A cancel was asked for the current turn.
    cancelling: AtomicBool,
    /// The signal that asked the command to end after its turn (SIGTERM).
    end_after_turn: AtomicI32,
    stopper: Mutex<Option<Stopper>>,
}

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

fn shared() -> &'static Arc<Shared> {
    SHARED.get_or_init(Default::default)
}

/// Take over SIGINT and SIGTERM for this process (once). Without it the
/// defaults apply (the process dies where it stands).
pub fn install() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
            crate::console::style::eprint_warning(
                "cannot handle SIGINT/SIGTERM; Ctrl-C ends the command at once",
            );
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    on_signal(sig);
                }
            });
        if let Err(e) = spawned {
            crate::console::style::eprint_warning(&format!("cannot start the signal thread: {e}"));
        }
    });
}

fn on_signal(sig: i32) {
    let s = shared();
    let turn = s.turn.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(turn) = turn
        && !s.cancelling.swap(true, Ordering::SeqCst)
    {
        if sig == signal_hook::consts::SIGTERM {
            s.end_after_turn.store(sig, Ordering::SeqCst);
        }
        eprintln!("\n· cancelling the turn (press Ctrl-C again to quit)");
        std::thread::spawn(move || cancel(&turn));
        return;
    }
    end_now(sig);
}

/// Cancel the running turn as Ctrl-C does (a headless client's
/// `interrupt`); false when no turn has begun.
pub(crate) fn cancel_current_turn() -> bool {
    let s = shared();
    let turn = s.turn.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(turn) = turn else {
        return false;
    };
    if !s.cancelling.swap(true, Ordering::SeqCst) {
        std::thread::spawn(move || cancel(&turn));
    }
    true
}

/// Ask the supervisor to cancel the turn, on a connection of our own (the
/// command's is busy with the turn).
fn cancel(turn: &TurnRef) {
    let result = crate::supervisor::connect(&turn.home).and_then(|mut c| {
        c.call_as::<crate::protocol::replies::TurnCancelled>(Call::TurnCancel {
            agent: turn.agent.clone(),
            conversation: turn.conversation.clone(),
        })
    });
    if let Err(e) = result {
        eprintln!(
            "mini-letta: cannot cancel the turn: {}",
            crate::console::output::text(&e.to_string())
        );
    }
}

/// The signal ending the command, once [`end_now`] has begun.
static ENDING: AtomicI32 = AtomicI32::new(0);

/// End the command: stop the embedded supervisor first, then exit with
/// 128 + the signal's number, as a shell reports it.
pub(crate) fn end_now(sig: i32) -> ! {
    ENDING.store(sig, Ordering::SeqCst);
    let stopper = shared()
        .stopper
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(stopper) = stopper
        && !stopper.stop_and_wait(Duration::from_secs(8))
    {
        eprintln!("mini-letta: the embedded supervisor did not stop in time");
    }
    std::process::exit(128 + sig);
}

/// Called as the command returns: while a signal is ending it, the main
/// thread must not exit first (stopping the embedded supervisor ends the
/// command's child, and with it the command's own wait) — the status is
/// the signal's.
pub(crate) fn hold_if_ending() {
    let sig = ENDING.load(Ordering::SeqCst);
    if sig == 0 {
        return;
    }
    // `end_now` exits the process; this is only its fallback.
    std::thread::sleep(Duration::from_secs(15));
    std::process::exit(128 + sig);
}

/// The embedded supervisor a signal must stop before the command ends.
pub(crate) fn set_stopper(stopper: Option<Stopper>) {
    *shared().stopper.lock().unwrap_or_else(|p| p.into_inner()) = stopper;
}

/// A turn in progress: signals cancel it until this is dropped.
pub struct TurnGuard(());

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let s = shared();
        *s.turn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        s.cancelling.store(false, Ordering::SeqCst);
    }
}

/// Mark a turn as running.
pub(crate) fn begin_turn(home: &Home, agent: Option<&str>, conversation: &str) -> TurnGuard {
    let s = shared();
    s.cancelling.store(false, Ordering::SeqCst);
    *s.turn.lock().unwrap_or_else(|p| p.into_inner()) = Some(TurnRef {
        home: home.clone(),
        agent: agent.map(str::to_string),
        conversation: conversation.to_string(),
    });
    TurnGuard(())
}

/// The signal that asked the command to end once its turn was cancelled
/// (SIGTERM during a turn), if any.
pub(crate) fn end_requested() -> Option<i32> {
    match shared().end_after_turn.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
