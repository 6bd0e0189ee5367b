//! The run's stop flag: set once by SIGINT, SIGTERM or SIGHUP, never cleared.
//!
//! The supervised programs run in sessions of their own, so a Ctrl-C at the terminal, or
//! `timeout` signalling `peer-run`, does not reach them. Instead the signal sets this flag;
//! the supervisor sees it within one poll, ends the running program's whole session as it
//! would at a deadline, and the run stops and writes the report of what it measured.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::peer::PeerError;

/// One-way: nothing ever stores `false` here.
static STOP: AtomicBool = AtomicBool::new(false);

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Asks for a stop, as the signals do (tests and callers use this directly).
pub fn request() {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT, SIGTERM and SIGHUP set the flag instead of ending the process.
pub fn on_signals() -> Result<(), PeerError> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `action` is fully initialised (zeroed, then the handler and an empty
        // mask set) before sigaction reads it, and the handler only stores to an atomic,
        // which is async-signal-safe.
        let failed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
        };
        if failed {
            return Err(PeerError::io(
                format!("handle signal {signal}"),
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

extern "C" fn on_signal(_signal: libc::c_int) {
    request();
}
