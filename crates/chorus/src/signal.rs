//! Departure on signals (opt-in; `chorus run` turns it on): when SIGTERM or SIGINT arrives,
//! every live communicator of the process sends its departures (principle 1: every way
//! out is a message), bounded by its teardown budget, and then the signal's default action
//! happens as if chorus were not there.
//!
//! Signal handlers may do almost nothing, so the handler only wakes a dedicated thread
//! (signal-hook's self-pipe); that thread runs the departures and then re-raises the
//! signal with its default disposition.

use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Something that can announce its departure before the process goes.
pub(crate) trait Departer: Send + Sync {
    /// Send departures with `reason`, returning by `deadline` whatever happens.
    fn depart_now(&self, reason: &str, deadline: Instant);
}

/// Keeps a departer registered; dropping it unregisters.
#[derive(Debug)]
pub(crate) struct Registration {
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        registry().hooks.lock().retain(|(id, _)| *id != self.id);
    }
}

struct Registry {
    hooks: Mutex<Vec<(u64, Weak<dyn Departer>)>>,
    next: Mutex<u64>,
    installed: OnceLock<Result<(), String>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        hooks: Mutex::new(Vec::new()),
        next: Mutex::new(0),
        installed: OnceLock::new(),
    })
}

/// Installs the SIGTERM/SIGINT handling thread (once per process; later calls are no-ops).
/// `budget` bounds the departures of all communicators together.
pub(crate) fn install(budget: Duration) -> Result<(), String> {
    registry()
        .installed
        .get_or_init(|| {
            let mut signals = Signals::new([SIGTERM, SIGINT])
                .map_err(|e| format!("cannot install signal handlers: {e}"))?;
            thread::Builder::new()
                .name("chorus-signal".into())
                .spawn(move || {
                    if let Some(signal) = signals.forever().next() {
                        depart_all(signal, budget);
                        // Default action now (terminate for SIGTERM/SIGINT), exactly as if
                        // the handler had never been installed.
                        let _ = signal_hook::low_level::emulate_default_handler(signal);
                    }
                })
                .map(|_| ())
                .map_err(|e| format!("cannot start the signal thread: {e}"))
        })
        .clone()
}

/// Registers `departer` to run when a handled signal arrives.
pub(crate) fn register(departer: &Arc<dyn Departer>) -> Registration {
    let r = registry();
    let id = {
        let mut next = r.next.lock();
        *next += 1;
        *next
    };
    r.hooks.lock().push((id, Arc::downgrade(departer)));
    Registration { id }
}

/// Runs every live departer, each on its own thread so one slow communicator cannot use up
/// the others' budget, and returns by the deadline whatever they do.
fn depart_all(signal: i32, budget: Duration) {
    let deadline = Instant::now() + budget;
    let hooks: Vec<Arc<dyn Departer>> = registry()
        .hooks
        .lock()
        .iter()
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    let reason = format!("caught signal {signal}");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let count = hooks.len();
    for hook in hooks {
        let (reason, done) = (reason.clone(), done_tx.clone());
        let spawned = thread::Builder::new()
            .name("chorus-depart".into())
            .spawn(move || {
                hook.depart_now(&reason, deadline);
                let _ = done.send(());
            });
        if spawned.is_err() {
            let _ = done_tx.send(());
        }
    }
    for _ in 0..count {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            tracing::warn!("departures did not finish within the {budget:?} budget");
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);

    impl Departer for Counter {
        fn depart_now(&self, _reason: &str, _deadline: Instant) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Stuck;

    impl Departer for Stuck {
        fn depart_now(&self, _reason: &str, _deadline: Instant) {
            thread::sleep(Duration::from_secs(30));
        }
    }

    #[test]
    fn registered_departers_run_and_a_stuck_one_cannot_block() {
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let dropped = Arc::new(Counter(AtomicUsize::new(0)));
        let a: Arc<dyn Departer> = counter.clone();
        let b: Arc<dyn Departer> = dropped.clone();
        let stuck: Arc<dyn Departer> = Arc::new(Stuck);
        let _keep = register(&a);
        let _stuck = register(&stuck);
        drop(register(&b));
        let start = Instant::now();
        depart_all(SIGTERM, Duration::from_millis(200));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "bounded by the budget"
        );
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            dropped.0.load(Ordering::SeqCst),
            0,
            "unregistered departers do not run"
        );
    }
}
