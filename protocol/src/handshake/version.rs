//! Version negotiation: both sides advertise a range; they speak the highest version in
//! both (SPEC.md, "Version negotiation").

use crate::header::{BASE_VERSION, VERSION};

/// An inclusive range of protocol versions.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct VersionRange {
    /// The lowest version, at least 1.
    pub min: u16,
    /// The highest version, at least `min`.
    pub max: u16,
}

impl VersionRange {
    /// The versions this implementation speaks.
    pub const SUPPORTED: VersionRange = VersionRange {
        min: BASE_VERSION as u16,
        max: VERSION as u16,
    };

    /// True if `version` is in the range.
    pub const fn contains(self, version: u16) -> bool {
        self.min <= version && version <= self.max
    }

    /// The highest version in both ranges, or `None` if they do not overlap.
    pub fn negotiate(self, theirs: VersionRange) -> Option<u16> {
        let high = self.max.min(theirs.max);
        let low = self.min.max(theirs.min);
        (low <= high && low >= 1).then_some(high)
    }
}

impl Default for VersionRange {
    fn default() -> Self {
        VersionRange::SUPPORTED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(min: u16, max: u16) -> VersionRange {
        VersionRange { min, max }
    }

    #[test]
    fn the_highest_common_version_wins() {
        assert_eq!(r(1, 3).negotiate(r(2, 5)), Some(3));
        assert_eq!(r(2, 5).negotiate(r(1, 3)), Some(3));
        assert_eq!(r(1, 1).negotiate(r(1, 9)), Some(1));
    }

    #[test]
    fn disjoint_ranges_have_no_version() {
        assert_eq!(r(1, 2).negotiate(r(3, 4)), None);
        assert_eq!(r(0, 0).negotiate(r(0, 0)), None);
    }

    #[test]
    fn this_build_speaks_version_one() {
        assert!(VersionRange::SUPPORTED.contains(1));
    }
}
