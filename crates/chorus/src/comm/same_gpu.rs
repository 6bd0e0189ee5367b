//! Device links between members on one GPU, for [`super::cuda`]: what each member
//! publishes ([`Card`]), which peers it joins by a `DeviceLink` ([`device_peers`]), the
//! rendezvous that gives each pair a connected Unix socket ([`Rendezvous`]), and the
//! agreement that keeps a pair on the staged path unless both ends connected
//! ([`agreed`]). The decisions are plain functions of the published values, tested here;
//! the rendezvous is the thin driver.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// What a member publishes when its device communicator is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Card {
    /// Its device opened.
    pub(super) ok: bool,
    /// The GPU's UUID (zero when the device did not open).
    pub(super) uuid: [u8; 16],
    /// Names its rendezvous socket (0: it offers none).
    pub(super) nonce: u64,
}

/// `u32` words per card on the wire (an all-gather of `u32`).
pub(super) const CARD_WORDS: usize = 7;

impl Card {
    pub(super) fn encode(&self) -> [u32; CARD_WORDS] {
        let mut w = [0u32; CARD_WORDS];
        w[0] = u32::from(self.ok);
        for (i, c) in self.uuid.chunks_exact(4).enumerate() {
            w[1 + i] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        w[5] = self.nonce as u32;
        w[6] = (self.nonce >> 32) as u32;
        w
    }

    /// The card in `w` (`CARD_WORDS` words; fewer read as a member whose device did not
    /// open).
    pub(super) fn decode(w: &[u32]) -> Card {
        let Some(w) = w.get(..CARD_WORDS) else {
            return Card {
                ok: false,
                uuid: [0; 16],
                nonce: 0,
            };
        };
        let mut uuid = [0u8; 16];
        for i in 0..4 {
            uuid[4 * i..4 * i + 4].copy_from_slice(&w[1 + i].to_le_bytes());
        }
        Card {
            ok: w[0] == 1,
            uuid,
            nonce: u64::from(w[5]) | (u64::from(w[6]) << 32),
        }
    }
}

/// The members `me` joins by a device link: every other member whose device opened on the
/// same GPU and that offers a rendezvous.
pub(super) fn device_peers(me: usize, cards: &[Card]) -> Vec<usize> {
    let Some(mine) = cards.get(me) else {
        return Vec::new();
    };
    if !mine.ok || mine.nonce == 0 {
        return Vec::new();
    }
    (0..cards.len())
        .filter(|&p| p != me)
        .filter(|&p| cards[p].ok && cards[p].nonce != 0 && cards[p].uuid == mine.uuid)
        .collect()
}

/// Whether `me` and `p` use their device link: both ends connected it (`connected[a *
/// world + b]` is 1 when `a` connected its link to `b`). Both ends read the same table, so
/// they decide the same.
pub(super) fn agreed(me: usize, p: usize, world: usize, connected: &[u32]) -> bool {
    let at = |a: usize, b: usize| connected.get(a * world + b).copied() == Some(1);
    at(me, p) && at(p, me)
}

/// A member's rendezvous socket, bound before its card is published so every peer that
/// reads the card can connect at once.
pub(super) struct Rendezvous {
    listener: UnixListener,
}

fn address(nonce: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("chorus-cuda-{nonce:016x}").as_bytes())
}

impl Rendezvous {
    /// A listener on an abstract socket named by `nonce` (network-namespace local: a peer
    /// in another namespace cannot reach it, and that pair stays staged).
    pub(super) fn bind(nonce: u64) -> std::io::Result<Rendezvous> {
        let listener = UnixListener::bind_addr(&address(nonce)?)?;
        listener.set_nonblocking(true)?;
        Ok(Rendezvous { listener })
    }

    /// A connected socket to each of `peers` (rank, nonce), by `deadline`: the lower rank
    /// of each pair connects and names itself, the higher accepts. The connects go first
    /// (a bound listener takes them into its backlog at once), then the accepts, so no two
    /// members wait on each other. A peer not reached by the deadline is left out.
    pub(super) fn pair(
        &self,
        me: usize,
        peers: &[(usize, u64)],
        deadline: Instant,
    ) -> Vec<(usize, UnixStream)> {
        let mut out = Vec::new();
        for &(p, nonce) in peers.iter().filter(|(p, _)| *p > me) {
            let connected = address(nonce)
                .and_then(|a| UnixStream::connect_addr(&a))
                .and_then(|mut s| {
                    s.write_all(&(me as u32).to_le_bytes())?;
                    Ok(s)
                });
            match connected {
                Ok(s) => out.push((p, s)),
                Err(e) => tracing::debug!(peer = p, error = %e, "no device-link rendezvous"),
            }
        }
        let mut waiting: Vec<usize> = peers.iter().map(|(p, _)| *p).filter(|p| *p < me).collect();
        while !waiting.is_empty() && Instant::now() < deadline {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if let Some(p) = identify(s.try_clone().ok(), deadline)
                        && let Some(at) = waiting.iter().position(|w| *w == p)
                    {
                        waiting.swap_remove(at);
                        out.push((p, s));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "device-link rendezvous accept failed");
                    break;
                }
            }
        }
        out
    }
}

/// The rank an accepted connection names, read by `deadline`.
fn identify(s: Option<UnixStream>, deadline: Instant) -> Option<usize> {
    let mut s = s?;
    s.set_nonblocking(false).ok()?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .ok()?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b).ok()?;
    s.set_read_timeout(None).ok()?;
    Some(u32::from_le_bytes(b) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(ok: bool, gpu: u8, nonce: u64) -> Card {
        Card {
            ok,
            uuid: [gpu; 16],
            nonce,
        }
    }

    #[test]
    fn cards_round_trip_and_short_ones_read_as_unusable() {
        let c = Card {
            ok: true,
            uuid: *b"0123456789abcdef",
            nonce: 0xdead_beef_1234_5678,
        };
        assert_eq!(Card::decode(&c.encode()), c);
        assert!(!Card::decode(&[1, 2, 3]).ok);
    }

    #[test]
    fn only_members_on_the_same_gpu_whose_device_opened_are_joined() {
        let cards = [
            card(true, 1, 10),
            card(true, 2, 11),
            card(true, 1, 12),
            card(false, 1, 13),
            card(true, 1, 0),
        ];
        assert_eq!(device_peers(0, &cards), vec![2]);
        assert_eq!(device_peers(2, &cards), vec![0]);
        assert_eq!(device_peers(1, &cards), Vec::<usize>::new());
        assert_eq!(
            device_peers(3, &cards),
            Vec::<usize>::new(),
            "its device did not open"
        );
        assert_eq!(
            device_peers(4, &cards),
            Vec::<usize>::new(),
            "it offers no rendezvous"
        );
        assert_eq!(device_peers(9, &cards), Vec::<usize>::new());
    }

    #[test]
    fn a_pair_uses_its_device_link_only_if_both_ends_connected_it() {
        // Three members: 0-1 both connected, 0-2 only 0 did.
        let world = 3;
        let mut t = vec![0u32; world * world];
        t[1] = 1; // 0 -> 1
        t[3] = 1; // 1 -> 0
        t[2] = 1; // 0 -> 2
        assert!(agreed(0, 1, world, &t));
        assert!(agreed(1, 0, world, &t));
        assert!(!agreed(0, 2, world, &t));
        assert!(!agreed(2, 0, world, &t), "both ends decide the same");
        assert!(!agreed(0, 5, world, &t));
    }

    #[test]
    fn members_pair_through_their_rendezvous_sockets() {
        let nonces: Vec<u64> = (0..3).map(|_| rand::random::<u64>() | 1).collect();
        let hosts: Vec<Rendezvous> = nonces
            .iter()
            .map(|n| Rendezvous::bind(*n).unwrap())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let paired: Vec<Vec<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|me| {
                    let (hosts, nonces) = (&hosts, &nonces);
                    s.spawn(move || {
                        let peers: Vec<(usize, u64)> = (0..3)
                            .filter(|p| *p != me)
                            .map(|p| (p, nonces[p]))
                            .collect();
                        let mut got: Vec<usize> = hosts[me]
                            .pair(me, &peers, deadline)
                            .into_iter()
                            .map(|(p, _)| p)
                            .collect();
                        got.sort();
                        got
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(paired, vec![vec![1, 2], vec![0, 2], vec![0, 1]]);
        // A peer that never connects is left out by the deadline, not waited for forever.
        let lonely = Rendezvous::bind(rand::random::<u64>() | 1).unwrap();
        let t = Instant::now();
        let got = lonely.pair(1, &[(0, 7)], Instant::now() + Duration::from_millis(50));
        assert!(got.is_empty());
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
