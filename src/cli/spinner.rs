//! A spinner on stderr while the model thinks, with the seconds waited:
//! shown only on a terminal, and only once a wait has lasted a second (a
//! fast answer never flickers).

use std::io::IsTerminal;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a wait lasts before the spinner shows.
const DELAY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Inner {
    /// When the current wait began (`None`: not waiting).
    since: Option<Instant>,
    bar: Option<indicatif::ProgressBar>,
    closed: bool,
}

/// The spinner; does nothing when stderr is not a terminal.
pub struct Spinner {
    shared: Option<Arc<(Mutex<Inner>, Condvar)>>,
}

impl Spinner {
    pub fn new() -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { shared: None };
        }
        let shared = Arc::new((Mutex::new(Inner::default()), Condvar::new()));
        let s = shared.clone();
        let _ = std::thread::Builder::new()
            .name("spinner".into())
            .spawn(move || watch(&s));
        Self {
            shared: Some(shared),
        }
    }

    /// A wait begins (a model request went out).
    pub fn waiting(&self) {
        if let Some(s) = &self.shared {
            let mut inner = s.0.lock().unwrap_or_else(|p| p.into_inner());
            if inner.since.is_none() {
                inner.since = Some(Instant::now());
                s.1.notify_all();
            }
        }
    }

    /// Something arrived: the spinner goes, its line cleared.
    pub fn done(&self) {
        if let Some(s) = &self.shared {
            let mut inner = s.0.lock().unwrap_or_else(|p| p.into_inner());
            inner.since = None;
            if let Some(bar) = inner.bar.take() {
                bar.finish_and_clear();
            }
        }
    }
}

impl Default for Spinner {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.done();
        if let Some(s) = &self.shared {
            s.0.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
            s.1.notify_all();
        }
    }
}

fn watch(shared: &(Mutex<Inner>, Condvar)) {
    let (lock, cv) = shared;
    let mut inner = lock.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if inner.closed {
            return;
        }
        match inner.since {
            Some(since) if inner.bar.is_none() => {
                let left = DELAY.saturating_sub(since.elapsed());
                if left.is_zero() {
                    // Seconds counted from the request, not from when
                    // the spinner showed: the user waited all of them.
                    let bar = indicatif::ProgressBar::new_spinner().with_elapsed(since.elapsed());
                    if let Ok(style) =
                        indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                    {
                        bar.set_style(style);
                    }
                    bar.set_message("waiting for the model…");
                    bar.enable_steady_tick(Duration::from_millis(100));
                    inner.bar = Some(bar);
                } else {
                    inner = cv
                        .wait_timeout(inner, left)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            }
            _ => {
                inner = cv.wait(inner).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
