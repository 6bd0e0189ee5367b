//! Joiner admission (sans-IO): the processes asking to join a grow, and when the grow's
//! coordinator proposes to admit them.

use chorus_protocol::message::PeerInfo;

/// The joiners that asked, each with the stream its `Welcome` goes to, and how many the
/// members' grow wants.
#[derive(Default)]
pub(super) struct Admission {
    joiners: Vec<(PeerInfo, u64)>,
    wanted: Option<u32>,
    proposed: bool,
}

impl Admission {
    /// This member coordinates a grow of `joiners`: propose once that many have asked.
    pub(super) fn want(&mut self, joiners: u32) {
        self.wanted = Some(joiners);
        self.proposed = false;
    }

    /// A process asked to join on stream `chan` (a repeat of an incarnation replaces it).
    pub(super) fn asked(&mut self, peer: PeerInfo, chan: u64) {
        self.joiners
            .retain(|(p, _)| p.incarnation != peer.incarnation);
        self.joiners.push((peer, chan));
    }

    /// The joiners to propose, once, when as many as wanted have asked.
    pub(super) fn proposal(&mut self) -> Option<Vec<PeerInfo>> {
        let wanted = self.wanted?;
        if self.proposed || (self.joiners.len() as u32) < wanted {
            return None;
        }
        self.proposed = true;
        Some(
            self.joiners
                .iter()
                .take(wanted as usize)
                .map(|(p, _)| p.clone())
                .collect(),
        )
    }

    /// An agreement admitted `admitted`: the streams of those that asked here get the
    /// welcome, and the admission starts over.
    pub(super) fn admitted(&mut self, admitted: &[PeerInfo]) -> Vec<u64> {
        let chans = self
            .joiners
            .iter()
            .filter(|(p, _)| admitted.iter().any(|j| j.incarnation == p.incarnation))
            .map(|(_, chan)| *chan)
            .collect();
        self.joiners.clear();
        self.wanted = None;
        chans
    }
}
