//! The state one shm link's callers and its pump thread share: the segment, which side of
//! it we are, the matcher, and the two halves of the byte stream (our ring out, the peer's
//! ring in), each behind its own lock.
//!
//! The rings carry the same frames a TCP stream does (the handshake's encoder and decoder
//! continue on them), so everything above the bytes — matching, departures, the codec's
//! limits and validation — is the code every link shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use chorus_protocol::message::Depart;
use chorus_protocol::{Decoder, Envelope};
use parking_lot::Mutex;

use super::futex;
use super::mailbox::MailOut;
use super::process::PeerProcess;
use super::ring::{Consumer, Producer, SLOTS, Side};
use super::segment::Segment;
use crate::config::TransportConfig;
use crate::matcher::Matcher;
use crate::outbound::{self, Outbound};

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) seg: Segment,
    pub(super) me: Side,
    pub(super) matcher: Arc<Matcher>,
    /// The peer's envelope: the epoch its frames must carry.
    pub(super) peer: Envelope,
    pub(super) reader: Mutex<ReadState>,
    pub(super) outbound: Arc<Mutex<Outbound>>,
    /// Our ring's tail. Taken by whoever holds the wire (see `Outbound::is_idle`).
    pub(super) producer: Mutex<Producer>,
    /// Our mailbox's counts (`mailbox.rs`).
    pub(super) mail_out: Mutex<MailOut>,
    pub(super) process: PeerProcess,
    pub(super) depart_timeout: Duration,
    /// The pump sleeps with `sleeping` set: the peer wakes it on progress, so a parked
    /// `recv` need not.
    pub(super) watching: AtomicBool,
}

/// The consuming half: our head in the peer's ring and the stream's decoder.
#[derive(Debug)]
pub(super) struct ReadState {
    pub(super) consumer: Consumer,
    pub(super) decoder: Decoder,
    /// The stream ended or was refused; every later pass answers with the same close.
    pub(super) ended: Option<Option<Depart>>,
    /// Where a reducing placement stages each block of ring bytes for the kernel
    /// (`reader::BOUNCE` bytes, 8-byte aligned for every element type), made on first use.
    pub(super) bounce: Vec<u64>,
    /// Payloads taken from each slot of the peer's mailbox (`mailbox.rs`).
    pub(super) took: [u32; SLOTS],
}

impl Shared {
    /// The state of a link of `cfg` whose handshake left `decoder` and `outbound`.
    pub(super) fn new(
        seg: Segment,
        me: Side,
        peer: Envelope,
        decoder: Decoder,
        outbound: Outbound,
        process: PeerProcess,
        cfg: &TransportConfig,
    ) -> Shared {
        let layout = *seg.layout();
        Shared {
            seg,
            me,
            matcher: Arc::new(Matcher::new(peer.sender, cfg.held_limit, cfg.send_window)),
            peer,
            reader: Mutex::new(ReadState {
                consumer: Consumer::new(&layout),
                decoder,
                ended: None,
                bounce: Vec::new(),
                took: [0; SLOTS],
            }),
            outbound: Arc::new(Mutex::new(outbound)),
            producer: Mutex::new(Producer::new(&layout)),
            mail_out: Mutex::new(MailOut::default()),
            process,
            depart_timeout: cfg.depart_timeout,
            watching: AtomicBool::new(false),
        }
    }

    pub(super) fn closed(&self, s: Side) -> &AtomicU32 {
        self.seg.word32(self.seg.layout().closed(s))
    }

    pub(super) fn bell(&self, s: Side) -> &AtomicU32 {
        self.seg.word32(self.seg.layout().bell(s))
    }

    pub(super) fn sleeping(&self, s: Side) -> &AtomicU32 {
        self.seg.word32(self.seg.layout().sleeping(s))
    }

    /// The tail of the ring side `s` writes.
    pub(super) fn tail(&self, s: Side) -> &AtomicU64 {
        self.seg.word64(self.seg.layout().tail(s))
    }

    /// The head of the ring side `s` writes.
    pub(super) fn head(&self, s: Side) -> &AtomicU64 {
        self.seg.word64(self.seg.layout().head(s))
    }

    /// Rings side `s`'s bell: its pump looks again at once.
    pub(super) fn ring(&self, s: Side) {
        let bell = self.bell(s);
        bell.fetch_add(1, Ordering::SeqCst);
        futex::wake(bell);
    }

    /// After publishing an index: wakes the peer's pump if it sleeps wanting progress. The
    /// index store and this load are both `SeqCst`, so either the peer's re-check after
    /// setting `sleeping` sees our index, or we see its `sleeping`.
    pub(super) fn notify_peer(&self) {
        let peer = self.me.peer();
        if self.sleeping(peer).load(Ordering::SeqCst) != 0 {
            self.ring(peer);
        }
    }

    /// Wakes our own pump: frames are queued, a close was requested, a `recv` parked.
    pub(super) fn kick(&self) {
        self.ring(self.me);
    }

    /// Requests the link's close (first request wins) and wakes the pump to carry it out.
    pub(super) fn close(&self, depart: Option<Depart>) {
        if outbound::request_close(&self.outbound, &self.matcher, depart) {
            self.kick();
        }
    }

    /// Sets our one-way closed word and wakes the peer whatever it sleeps for: the
    /// connection-level close, seen by the peer whoever else maps the segment.
    pub(super) fn set_closed(&self) {
        self.seg.close(self.me);
    }

    pub(super) fn peer_closed(&self) -> bool {
        self.closed(self.me.peer()).load(Ordering::SeqCst) != 0
    }
}
