//! Identifier newtypes shared by every layer: ranks, epochs, communicator ids, operation
//! sequence numbers. Bare integers never cross a crate boundary.

use std::fmt;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
            rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
        )]
        #[rkyv(derive(Debug, PartialEq, Eq))]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value, for encoding and indexing.
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }
    };
}

id!(
    /// A member's position in a communicator at one epoch: `0..world`.
    Rank(u32),
    "r"
);
id!(
    /// A communicator's membership generation. Bumped by every agreed change (shrink, grow);
    /// frames from an older epoch are rejected (principle 6).
    Epoch(u64),
    "e"
);
id!(
    /// Identifies one communicator within a job; split and shrink derive new ids.
    CommId(u64),
    "c"
);
id!(
    /// The per-communicator sequence number of a collective operation; every rank numbers
    /// its operations identically, so a mismatch means the ranks called different things.
    OpSeq(u64),
    "op"
);

impl Rank {
    /// "No rank": the sender field of a process that is not (yet) a member — a grow joiner,
    /// a status client, the launcher — and `Join::peer.rank` of a grow joiner.
    pub const NONE: Rank = Rank(u32::MAX);

    /// The rank as an index into per-rank tables.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl Epoch {
    /// The epoch after this one.
    pub const fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}
