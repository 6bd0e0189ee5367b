//! Hedged connects: a fresh QUIC handshake every so often while none has answered.
//!
//! A QUIC client resends a lost `Initial` at its probe timeout, and doubles that timeout at
//! every loss (RFC 9002, 6.2). A connect opened into a cut backs off for as long as the
//! cut lasts: after a two-second partition its next resend may be a second or more away,
//! so a healed member waits that long to be heard, whatever the heartbeats say. A fresh
//! attempt starts with the first, short timeout. So while no attempt has answered, the
//! connect starts a new one every `every`, keeps the newest `keep` of them alive, and takes
//! the first to finish.
//!
//! Only the QUIC handshake is hedged, never chorus's `Hello`: an attempt that loses is
//! dropped before its first stream, which the acceptor discards as a connection that
//! never spoke (`greet`), so no member ever sees two streams for one open.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// Attempts kept alive at once: the newest, and the two before it, whose resends may
/// still land first.
pub(super) const KEEP: usize = 3;

/// Runs attempts made by `start` until one succeeds: the first at once, then one more
/// every `every` while none has finished, the oldest dropped once more than `keep` are
/// alive. An attempt that fails is forgotten while others are alive; when the last alive
/// one fails, its error is returned (so an error that every attempt would meet, a wrong
/// certificate, ends the connect as it would end one attempt). `start` failing ends it
/// too. Unbounded by itself: the caller's deadline bounds it.
pub(super) async fn race<F, T, E>(
    every: Duration,
    keep: usize,
    mut start: impl FnMut() -> Result<F, E>,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let keep = keep.max(1);
    let mut live: VecDeque<Pin<Box<F>>> = VecDeque::with_capacity(keep);
    live.push_back(Box::pin(start()?));
    let mut next = tokio::time::Instant::now() + every;
    loop {
        let finished = poll_fn(|cx| {
            for i in 0..live.len() {
                if let Poll::Ready(result) = live[i].as_mut().poll(cx) {
                    drop(live.remove(i));
                    return Poll::Ready(result);
                }
            }
            Poll::Pending
        });
        tokio::select! {
            biased;
            result = finished => match result {
                Ok(value) => return Ok(value),
                Err(e) if live.is_empty() => return Err(e),
                Err(_) => {}
            },
            () = tokio::time::sleep_until(next) => {
                if live.len() >= keep {
                    live.pop_front();
                }
                live.push_back(Box::pin(start()?));
                next += every;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    const EVERY: Duration = Duration::from_millis(100);

    /// A fake attempt: succeeds (`Ok(n)`, its start index) or fails after `after`, and
    /// marks itself dropped in `dropped` whenever it goes, finished or not.
    struct Attempt {
        n: usize,
        dropped: Rc<RefCell<Vec<usize>>>,
    }

    impl Drop for Attempt {
        fn drop(&mut self) {
            self.dropped.borrow_mut().push(self.n);
        }
    }

    fn attempt(
        n: usize,
        after: Option<Duration>,
        ok: bool,
        dropped: &Rc<RefCell<Vec<usize>>>,
    ) -> impl Future<Output = Result<usize, String>> + use<> {
        let guard = Attempt {
            n,
            dropped: dropped.clone(),
        };
        async move {
            let _guard = guard;
            match after {
                None => std::future::pending().await,
                Some(d) => tokio::time::sleep(d).await,
            }
            if ok {
                Ok(n)
            } else {
                Err(format!("attempt {n} failed"))
            }
        }
    }

    /// Races attempts whose fate `plan(n)` gives (`n` from 1): when each ends, if ever,
    /// and whether it succeeds. The result, how many started, and the order they went in.
    async fn race_planned(
        plan: impl Fn(usize) -> (Option<Duration>, bool),
    ) -> (Result<usize, String>, usize, Vec<usize>) {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut started = 0;
        let got = race(EVERY, KEEP, || {
            started += 1;
            let (after, ok) = plan(started);
            Ok::<_, String>(attempt(started, after, ok, &dropped))
        })
        .await;
        let order = dropped.borrow().clone();
        (got, started, order)
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_needs_no_second_attempt() {
        let (got, started, _) = race_planned(|_| (Some(Duration::from_millis(30)), true)).await;
        assert_eq!(got, Ok(1));
        assert_eq!(started, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_path_gets_a_fresh_attempt_every_interval_and_keeps_the_newest() {
        // Attempts 1–4 never answer (opened into a cut); the fifth answers at once.
        let t0 = tokio::time::Instant::now();
        let (got, _, mut order) =
            race_planned(|n| ((n == 5).then_some(Duration::ZERO), true)).await;
        assert_eq!(got, Ok(5));
        assert_eq!(t0.elapsed(), 4 * EVERY, "one start per interval");
        // With three kept, starting the fourth dropped the first, the fifth the second;
        // the winner's end dropped it, and the race's end the two left.
        assert_eq!(&order[..3], &[1, 2, 5]);
        order.sort_unstable();
        assert_eq!(order, vec![1, 2, 3, 4, 5], "every attempt is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_attempt_that_answers_first_wins() {
        // The first answers at 250 ms (a resend got through); the later ones never do.
        let (got, started, _) =
            race_planned(|n| ((n == 1).then_some(Duration::from_millis(250)), true)).await;
        assert_eq!(got, Ok(1));
        assert_eq!(started, 3, "starts at 0, 100 and 200 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_while_others_live_is_forgotten_and_the_last_failure_returned() {
        // The first fails at 150 ms while the second lives; the second answers at 260 ms.
        let (got, _, _) = race_planned(|n| match n {
            1 => (Some(Duration::from_millis(150)), false),
            2 => (Some(Duration::from_millis(160)), true),
            _ => (None, true),
        })
        .await;
        assert_eq!(got, Ok(2));
        // A lone attempt that fails ends the race with its error, starting nothing more.
        let (got, started, _) = race_planned(|_| (Some(Duration::from_millis(10)), false)).await;
        assert_eq!(got, Err("attempt 1 failed".to_owned()));
        assert_eq!(started, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_fails_ends_the_race_with_its_error() {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut started = 0;
        let got = race(EVERY, KEEP, || {
            started += 1;
            if started == 2 {
                return Err("no route".to_owned());
            }
            Ok(attempt(started, None, true, &dropped))
        })
        .await;
        assert_eq!(got, Err("no route".to_owned()));
        assert_eq!(
            dropped.borrow().as_slice(),
            &[1],
            "the live attempt went too"
        );
    }
}
