//! Whether a member's own view can still form a quorum, and the verdict when it cannot.
//!
//! A member's absent set only grows at an epoch ("absent" means declared dead or departed,
//! never suspect), so once its view holds fewer live members than [`Quorum`] needs, no
//! agreement it takes part in can gather the votes: a strict majority of the epoch's members
//! must promise and accept, and only present members are asked. Such a member gives up at
//! once with [`NoQuorum`] instead of waiting out a timeout, and coordinates no round, so it
//! never decides a membership of its own (the partition safety of the majority rule holds:
//! the side holding a majority agrees and goes on).

use std::collections::BTreeSet;
use std::fmt;

use chorus_protocol::Rank;

use crate::config::Quorum;

/// How many absent ranks a [`NoQuorum`] names; the count is always complete.
const NAMED: usize = 8;

/// A member's view holds fewer live members than the quorum needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoQuorum {
    /// Members of the epoch.
    pub world: u32,
    /// Members this member holds absent (dead or departed), lowest first, at most eight
    /// named (`absent_count` is the full count).
    pub absent: Vec<Rank>,
    pub absent_count: u32,
    /// Members this view still counts live, itself included.
    pub live: u32,
    /// Live members the rule needs.
    pub needed: u32,
    pub rule: Quorum,
}

/// `Ok` when a member whose view holds `absent` (out of `world`) can still win an agreement
/// under `rule`.
pub(crate) fn reach(world: u32, absent: &BTreeSet<Rank>, rule: Quorum) -> Result<(), NoQuorum> {
    let absent_count = u32::try_from(absent.len()).unwrap_or(u32::MAX).min(world);
    let live = world - absent_count;
    let needed = match rule {
        Quorum::Majority => world / 2 + 1,
        // Every member not known absent votes: whoever is left is enough.
        Quorum::Survivors => return Ok(()),
    };
    if live >= needed {
        return Ok(());
    }
    Err(NoQuorum {
        world,
        absent: absent.iter().copied().take(NAMED).collect(),
        absent_count,
        live,
        needed,
        rule,
    })
}

impl fmt::Display for NoQuorum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} members silent or gone in this member's view (",
            self.absent_count, self.world
        )?;
        for (i, r) in self.absent.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{r}")?;
        }
        if self.absent_count as usize > self.absent.len() {
            f.write_str(" ...")?;
        }
        let rule = match self.rule {
            Quorum::Majority => "majority",
            Quorum::Survivors => "survivors",
        };
        write!(
            f,
            "), {} live; quorum {rule} needs {} of {}",
            self.live, self.needed, self.world
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranks: &[u32]) -> BTreeSet<Rank> {
        ranks.iter().copied().map(Rank).collect()
    }

    #[test]
    fn a_lone_member_of_four_cannot_reach_a_majority_and_says_why() {
        let e = reach(4, &set(&[0, 1, 3]), Quorum::Majority).unwrap_err();
        assert_eq!((e.live, e.needed, e.absent_count), (1, 3, 3));
        assert_eq!(
            e.to_string(),
            "3 of 4 members silent or gone in this member's view (r0 r1 r3), 1 live; quorum \
             majority needs 3 of 4"
        );
        // Two of four live is half, not a majority.
        assert!(reach(4, &set(&[0, 1]), Quorum::Majority).is_err());
        assert!(reach(4, &set(&[1]), Quorum::Majority).is_ok());
    }

    #[test]
    fn the_majority_side_of_a_five_way_split_keeps_its_quorum() {
        assert!(reach(5, &set(&[3, 4]), Quorum::Majority).is_ok());
        assert!(reach(5, &set(&[0, 1, 2]), Quorum::Majority).is_err());
    }

    #[test]
    fn survivors_always_reach_and_long_lists_are_cut() {
        assert!(reach(4, &set(&[0, 1, 3]), Quorum::Survivors).is_ok());
        let absent: Vec<u32> = (1..100).collect();
        let e = reach(100, &set(&absent), Quorum::Majority).unwrap_err();
        assert_eq!(e.absent.len(), NAMED);
        assert!(e.to_string().contains("r8 ...), 1 live"), "{e}");
    }
}
