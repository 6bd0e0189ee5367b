//! The launcher's signal intake: SIGINT, SIGTERM and SIGHUP are caught (signal-hook's
//! self-pipe; the handler does nothing but note the signal) and read by the launcher's loop,
//! which forwards them to the ranks. The ranks run in their own process groups, so a
//! terminal's Ctrl-C reaches only the launcher and each rank gets the signal exactly once.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Signals caught since the last look.
pub(crate) struct Intake {
    signals: Signals,
}

impl Intake {
    /// Starts catching; the ranks spawned afterwards still get default dispositions (exec
    /// resets caught signals).
    pub(crate) fn install() -> std::io::Result<Intake> {
        Ok(Intake {
            signals: Signals::new([SIGINT, SIGTERM, SIGHUP])?,
        })
    }

    /// The signals that arrived since the last call, oldest first; never blocks.
    pub(crate) fn pending(&mut self) -> Vec<i32> {
        self.signals.pending().collect()
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        self.signals.handle().close();
    }
}
