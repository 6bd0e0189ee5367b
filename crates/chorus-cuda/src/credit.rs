//! Slot credit, kept on the host: the accounts two ends of a device link keep of their slot
//! messages, so that no device wait is queued before the work that ends it.
//!
//! A payload is cut into slot messages (parts) of at most one slot each, numbered from 0 on
//! each direction of the link. The sender may queue part `n` (wait for the slot, copy in,
//! raise `ready`) only once the receiver has queued taking part `n - slots` out (`Credit`);
//! the receiver queues taking part `n` out (wait for `ready`, copy out, raise `consumed`)
//! only once the sender has queued it (`Queued`). Each device wait then waits for work
//! already queued on some stream, so waits can share hardware queues (more streams than
//! `CUDA_DEVICE_MAX_CONNECTIONS`) without a wait blocking the work it waits for; a wait that
//! cannot end is one whose peer died with its work, and aborting the link retires it.
//!
//! No IO here: numbers in, decisions out, checked against what a well-behaved peer could
//! send ([`CreditError`] is a protocol violation).

use std::collections::VecDeque;

/// A peer's account that no well-behaved peer would send.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub(crate) enum CreditError {
    #[error("credit moved back from {was} to {upto}")]
    CreditBackwards { was: u64, upto: u64 },
    #[error("credit for {upto} slot messages but only {queued} were queued")]
    CreditAhead { upto: u64, queued: u64 },
    #[error("queued count moved back from {was} to {upto}")]
    QueuedBackwards { was: u64, upto: u64 },
    #[error("{upto} slot messages queued but only {announced} were announced")]
    QueuedAhead { upto: u64, announced: u64 },
}

/// How many slot messages a payload of `len` bytes is cut into.
pub(crate) fn parts(len: u64, slot_bytes: u64) -> u64 {
    len.div_ceil(slot_bytes.max(1))
}

/// How many more slot messages the sender may queue, having queued `queued` and been told
/// the receiver has queued taking out `taken`, with `slots` slots.
pub(crate) fn room(slots: u64, queued: u64, taken: u64) -> u64 {
    (taken + slots).saturating_sub(queued)
}

/// Check a `Credit { upto }` against the credit `was` already granted and the `queued`
/// slot messages this end has announced as queued.
pub(crate) fn check_credit(was: u64, upto: u64, queued: u64) -> Result<(), CreditError> {
    if upto < was {
        return Err(CreditError::CreditBackwards { was, upto });
    }
    if upto > queued {
        return Err(CreditError::CreditAhead { upto, queued });
    }
    Ok(())
}

/// What the receiving end queues next.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Step {
    /// Take slot message `seq` out: `len` bytes at `offset` of announced payload `msg`.
    Part {
        msg: u64,
        seq: u64,
        offset: u64,
        len: u64,
    },
    /// Payload `msg` is whole (every part's take-out is queued): file it for `recv`.
    Done { msg: u64 },
}

/// The receiving end's account: payloads announced (`Sent`), how far the sender has queued
/// (`Queued`), and how far this end has queued taking parts out (what its `Credit` says).
#[derive(Debug)]
pub(crate) struct Intake {
    slot_bytes: u64,
    /// Announced payloads not yet whole, oldest first.
    open: VecDeque<Open>,
    /// Number of the next payload announced.
    next_msg: u64,
    /// Slot messages the announced payloads make, in all.
    announced: u64,
    /// The sender's latest `Queued`.
    queued: u64,
    /// Slot messages whose take-out this end has queued.
    taken: u64,
}

#[derive(Debug)]
struct Open {
    msg: u64,
    len: u64,
    /// Its first part's number.
    first: u64,
    parts: u64,
}

impl Intake {
    pub(crate) fn new(slot_bytes: u64) -> Intake {
        Intake {
            slot_bytes: slot_bytes.max(1),
            open: VecDeque::new(),
            next_msg: 0,
            announced: 0,
            queued: 0,
            taken: 0,
        }
    }

    /// A payload of `len` bytes was announced: its number, and what to do now (an empty
    /// payload behind no open one is whole at once).
    pub(crate) fn announce(&mut self, len: u64) -> (u64, Vec<Step>) {
        let msg = self.next_msg;
        self.next_msg += 1;
        let parts = parts(len, self.slot_bytes);
        self.open.push_back(Open {
            msg,
            len,
            first: self.announced,
            parts,
        });
        self.announced = self.announced.saturating_add(parts);
        let mut steps = Vec::new();
        self.advance(&mut steps);
        (msg, steps)
    }

    /// The sender says its first `upto` slot messages are queued: the take-outs to queue
    /// and the payloads that become whole, in order.
    pub(crate) fn queued(&mut self, upto: u64) -> Result<Vec<Step>, CreditError> {
        if upto < self.queued {
            return Err(CreditError::QueuedBackwards {
                was: self.queued,
                upto,
            });
        }
        if upto > self.announced {
            return Err(CreditError::QueuedAhead {
                upto,
                announced: self.announced,
            });
        }
        self.queued = upto;
        let mut steps = Vec::new();
        self.advance(&mut steps);
        Ok(steps)
    }

    /// Slot messages whose take-out is queued: the next `Credit`.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    fn advance(&mut self, steps: &mut Vec<Step>) {
        while let Some(open) = self.open.front() {
            let end = open.first + open.parts;
            while self.taken < end && self.taken < self.queued {
                let index = self.taken - open.first;
                let offset = index * self.slot_bytes;
                steps.push(Step::Part {
                    msg: open.msg,
                    seq: self.taken,
                    offset,
                    len: (open.len - offset).min(self.slot_bytes),
                });
                self.taken += 1;
            }
            if self.taken < end {
                return;
            }
            steps.push(Step::Done { msg: open.msg });
            self.open.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_cut_into_slot_messages() {
        assert_eq!(parts(0, 64), 0);
        assert_eq!(parts(1, 64), 1);
        assert_eq!(parts(64, 64), 1);
        assert_eq!(parts(65, 64), 2);
        assert_eq!(parts(u64::MAX, 1 << 20), u64::MAX.div_ceil(1 << 20));
    }

    #[test]
    fn the_sender_queues_only_into_slots_the_receiver_has_freed() {
        assert_eq!(room(4, 0, 0), 4);
        assert_eq!(
            room(4, 4, 0),
            0,
            "every slot holds a message not yet taken out"
        );
        assert_eq!(room(4, 4, 1), 1);
        assert_eq!(room(2, 7, 5), 0);
        assert_eq!(room(2, 5, 5), 2);
    }

    #[test]
    fn credit_is_monotonic_and_never_ahead_of_what_was_queued() {
        assert_eq!(check_credit(0, 0, 0), Ok(()));
        assert_eq!(check_credit(2, 5, 5), Ok(()));
        assert_eq!(
            check_credit(3, 2, 5),
            Err(CreditError::CreditBackwards { was: 3, upto: 2 })
        );
        assert_eq!(
            check_credit(3, 6, 5),
            Err(CreditError::CreditAhead { upto: 6, queued: 5 })
        );
    }

    #[test]
    fn parts_are_taken_out_only_once_queued_and_payloads_filed_whole_in_order() {
        let mut intake = Intake::new(100);
        let (a, steps) = intake.announce(250);
        assert!(
            steps.is_empty(),
            "nothing queued yet: no wait may be queued"
        );
        let (b, _) = intake.announce(50);
        assert_eq!(
            intake.queued(2).unwrap(),
            vec![
                Step::Part {
                    msg: a,
                    seq: 0,
                    offset: 0,
                    len: 100
                },
                Step::Part {
                    msg: a,
                    seq: 1,
                    offset: 100,
                    len: 100
                },
            ]
        );
        assert_eq!(intake.taken(), 2);
        assert_eq!(
            intake.queued(4).unwrap(),
            vec![
                Step::Part {
                    msg: a,
                    seq: 2,
                    offset: 200,
                    len: 50
                },
                Step::Done { msg: a },
                Step::Part {
                    msg: b,
                    seq: 3,
                    offset: 0,
                    len: 50
                },
                Step::Done { msg: b },
            ]
        );
        assert_eq!(intake.taken(), 4);
        assert_eq!(intake.queued(4).unwrap(), vec![], "a repeat is harmless");
    }

    #[test]
    fn an_empty_payload_is_whole_at_once_but_not_before_the_ones_ahead_of_it() {
        let mut intake = Intake::new(100);
        let (e, steps) = intake.announce(0);
        assert_eq!(steps, vec![Step::Done { msg: e }]);
        let (a, _) = intake.announce(10);
        let (z, steps) = intake.announce(0);
        assert!(steps.is_empty(), "behind an open payload");
        assert_eq!(
            intake.queued(1).unwrap(),
            vec![
                Step::Part {
                    msg: a,
                    seq: 0,
                    offset: 0,
                    len: 10
                },
                Step::Done { msg: a },
                Step::Done { msg: z },
            ]
        );
    }

    #[test]
    fn a_queued_count_no_sender_could_send_is_refused() {
        let mut intake = Intake::new(100);
        intake.announce(150);
        assert_eq!(
            intake.queued(3),
            Err(CreditError::QueuedAhead {
                upto: 3,
                announced: 2
            })
        );
        intake.queued(2).unwrap();
        assert_eq!(
            intake.queued(1),
            Err(CreditError::QueuedBackwards { was: 2, upto: 1 })
        );
    }

    #[test]
    fn a_long_exchange_never_queues_a_wait_ahead_of_its_work() {
        // A sender and a receiver trading frames: every take-out the receiver queues is of
        // a part the sender had queued, and the sender never has more than `slots` parts
        // queued but not taken out.
        let (slots, slot) = (3u64, 64u64);
        let mut intake = Intake::new(slot);
        let (mut queued, mut credit) = (0u64, 0u64);
        let mut to_queue = 0u64;
        for (i, len) in (0..200u64).map(|i| (i, (i * 37) % 500)).collect::<Vec<_>>() {
            intake.announce(len);
            to_queue += parts(len, slot);
            while queued < to_queue {
                let n = room(slots, queued, credit).min(to_queue - queued);
                assert!(n > 0 || queued - credit == slots, "stuck at {i}");
                queued += n;
                assert!(queued - credit <= slots);
                for step in intake.queued(queued).unwrap() {
                    if let Step::Part { seq, .. } = step {
                        assert!(seq < queued, "take-out of part {seq} before it was queued");
                    }
                }
                let upto = intake.taken();
                check_credit(credit, upto, queued).unwrap();
                credit = upto;
            }
        }
        assert_eq!(credit, to_queue);
    }
}
