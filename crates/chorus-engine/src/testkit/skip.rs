//! The line a test prints when it cannot run here.

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::{Mutex, PoisonError};

/// Says `skipped: {line}` on the process's stderr, once per process for each distinct line.
///
/// A test that needs something this machine may lack (io_uring, a GPU, Open MPI, a Python
/// with torch) checks for it and, when it is absent, calls this and returns: the person
/// running the tests must see that the test did not run, and why. The line goes straight
/// to the stderr handle, not through `eprintln!`, which the test harness captures and
/// shows only for failing tests; and only once, because many tests share one reason.
pub fn skip(line: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    // A poisoned set is still a set: the worst outcome is saying a line twice.
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said
        .get_or_insert_with(HashSet::new)
        .insert(line.to_owned())
    {
        // One write, so lines of tests running in parallel do not interleave.
        let _ = std::io::stderr().write_all(format!("skipped: {line}\n").as_bytes());
    }
}
