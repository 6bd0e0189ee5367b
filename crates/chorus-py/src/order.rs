//! Who may run the communicator's next operation: the decision that keeps operations in
//! call order while a blocking call runs on its caller's thread (no IO here; the queue
//! carries it out under a lock).
//!
//! Operations reach the engine along two paths. An operation submitted with
//! `async_op=True`, or a blocking call made while anything is still unfinished, is queued
//! for the submission thread, which runs its jobs one after another. A blocking call made
//! when nothing is queued or running runs *inline*, on the caller's thread with the GIL
//! released, which saves two thread wake-ups per call. Order holds because:
//! - a call runs inline only when no queued job is unfinished, so it cannot overtake one;
//! - while it runs, the submission thread starts no job, so nothing queued after it (from
//!   another Python thread) can overtake it;
//! - only one call runs inline at a time; a second blocking call meanwhile is queued.

/// The state behind the decision.
#[derive(Debug, Default)]
pub(crate) struct Order {
    /// Jobs handed to the submission thread and not yet finished.
    queued: usize,
    /// A blocking call is running on its caller's thread.
    inline: bool,
}

impl Order {
    /// A blocking call asks to run on its own thread: granted (and then held until
    /// [`Order::inline_done`]) when nothing submitted before it is unfinished.
    pub(crate) fn try_inline(&mut self) -> bool {
        let granted = self.queued == 0 && !self.inline;
        if granted {
            self.inline = true;
        }
        granted
    }

    /// The inline call has finished.
    pub(crate) fn inline_done(&mut self) {
        self.inline = false;
    }

    /// A job was handed to the submission thread.
    pub(crate) fn queued(&mut self) {
        self.queued += 1;
    }

    /// Whether the submission thread may start its next job now.
    pub(crate) fn may_start(&self) -> bool {
        !self.inline
    }

    /// Whether a caller waiting for a queued job may take it and run it on its own thread:
    /// only when it is the one unfinished job (jobs finish in order, so an unfinished
    /// job alone in the count is the head of the queue) and no blocking call runs inline.
    /// The job still counts as queued until it has finished, so nothing overtakes it.
    pub(crate) fn may_steal(&self) -> bool {
        self.queued == 1 && !self.inline
    }

    /// A queued job has finished (or was never handed over).
    pub(crate) fn job_done(&mut self) {
        self.queued = self.queued.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_communicator_runs_a_blocking_call_inline() {
        let mut o = Order::default();
        assert!(o.try_inline());
        o.inline_done();
        assert!(o.try_inline(), "the turn is given back");
    }

    #[test]
    fn a_blocking_call_never_overtakes_an_unfinished_job() {
        let mut o = Order::default();
        o.queued();
        assert!(
            !o.try_inline(),
            "a job is queued: the call must queue behind it"
        );
        assert!(o.may_start());
        o.job_done();
        assert!(o.try_inline(), "the queue has drained");
    }

    #[test]
    fn a_job_queued_during_an_inline_call_waits_for_it() {
        let mut o = Order::default();
        assert!(o.try_inline());
        o.queued(); // another thread submits meanwhile
        assert!(!o.may_start(), "the job would overtake the inline call");
        assert!(!o.try_inline(), "a second blocking call queues too");
        o.inline_done();
        assert!(o.may_start());
        assert!(
            !o.try_inline(),
            "and a later blocking call waits for that job"
        );
        o.job_done();
        assert!(o.try_inline());
    }

    #[test]
    fn only_the_one_unfinished_job_may_be_stolen() {
        let mut o = Order::default();
        assert!(!o.may_steal(), "nothing queued");
        o.queued();
        assert!(o.may_steal(), "the head of the queue, nothing before it");
        o.queued();
        assert!(
            !o.may_steal(),
            "two unfinished: the waited one may not be the head"
        );
        o.job_done();
        assert!(o.may_steal());
        assert!(
            !o.try_inline(),
            "a blocking call still queues behind a stolen job"
        );
    }

    #[test]
    fn no_steal_while_a_call_runs_inline() {
        let mut o = Order::default();
        assert!(o.try_inline());
        o.queued();
        assert!(!o.may_steal(), "it would run beside the inline call");
        o.inline_done();
        assert!(o.may_steal());
    }

    #[test]
    fn only_one_inline_call_at_a_time() {
        let mut o = Order::default();
        assert!(o.try_inline());
        assert!(!o.try_inline());
    }

    #[test]
    fn a_job_done_without_a_job_keeps_the_count_sane() {
        let mut o = Order::default();
        o.job_done();
        assert!(o.try_inline());
    }
}
