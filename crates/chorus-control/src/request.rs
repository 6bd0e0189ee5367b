//! The local application's wait for the agreement it asked for (`Command::Shrink`): one
//! deadline per request, set when it is asked and never restarted by rounds, retransmits or
//! takeovers (principle 3: every wait ends by its bound, whatever the network does), and an
//! answer at once when this member's view cannot reach a quorum.

use std::time::Duration;

use chorus_protocol::Epoch;

use crate::event::{AgreementFailure, Event};
use crate::quorum::NoQuorum;
use crate::time::Instant;

/// The pending request of one member at its current epoch, if any.
#[derive(Debug, Default)]
pub(crate) struct Request {
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    asked: Instant,
    deadline: Instant,
}

impl Request {
    /// The application asked at `now`. A request already pending keeps its deadline: one
    /// agreement, one bound, however many times it is asked for.
    pub(crate) fn ask(&mut self, now: Instant, timeout: Duration) {
        self.pending.get_or_insert(Pending {
            asked: now,
            deadline: now + timeout,
        });
    }

    /// The view cannot reach a quorum: the request (or the one just made) fails now.
    pub(crate) fn no_quorum(&mut self, epoch: Epoch, verdict: NoQuorum) -> Event {
        self.pending = None;
        Event::AgreementFailed {
            epoch,
            failure: AgreementFailure::NoQuorum(verdict),
        }
    }

    /// Whether a request is waiting.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The timeout event once the deadline passed; the request is then answered.
    pub(crate) fn expired(&mut self, epoch: Epoch, now: Instant) -> Option<Event> {
        let p = self.pending.as_ref().filter(|p| now >= p.deadline)?;
        let waited = p.deadline.saturating_since(p.asked);
        self.pending = None;
        Some(Event::AgreementFailed {
            epoch,
            failure: AgreementFailure::Timeout { waited },
        })
    }

    /// The agreement decided: nothing is waiting any more.
    pub(crate) fn answered(&mut self) {
        self.pending = None;
    }

    /// When the pending request times out.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_again_does_not_restart_the_deadline() {
        let mut r = Request::default();
        let t = Instant::from_micros(1_000_000);
        r.ask(t, Duration::from_secs(30));
        r.ask(t + Duration::from_secs(20), Duration::from_secs(30));
        assert_eq!(r.deadline(), Some(t + Duration::from_secs(30)));
        assert_eq!(r.expired(Epoch(0), t + Duration::from_secs(29)), None);
        let ev = r.expired(Epoch(0), t + Duration::from_secs(30));
        assert_eq!(
            ev,
            Some(Event::AgreementFailed {
                epoch: Epoch(0),
                failure: AgreementFailure::Timeout {
                    waited: Duration::from_secs(30)
                }
            })
        );
        assert!(!r.is_pending());
        // Answered once; a new request is a new wait.
        r.ask(t + Duration::from_secs(31), Duration::from_secs(30));
        assert_eq!(r.deadline(), Some(t + Duration::from_secs(61)));
    }
}
