//! Byte counts as nccl-tests takes them on the command line (`8`, `64K`, `128M`, `1G`, powers
//! of 1024) and as people read them (`8 B`, `64 KiB`, `1.5 MiB`).

use std::fmt;
use std::str::FromStr;

/// A number of bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ByteSize(pub(crate) u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a size (e.g. 8, 64K, 128M, 1G)");
        let t = text.trim();
        let t = t
            .strip_suffix("iB")
            .or_else(|| t.strip_suffix('B').filter(|s| !s.is_empty()))
            .unwrap_or(t);
        let (digits, shift) = match t.as_bytes().last() {
            Some(b'K' | b'k') => (&t[..t.len() - 1], 10),
            Some(b'M' | b'm') => (&t[..t.len() - 1], 20),
            Some(b'G' | b'g') => (&t[..t.len() - 1], 30),
            _ => (t, 0),
        };
        let value: u64 = digits.trim().parse().map_err(|_| bad())?;
        value.checked_mul(1 << shift).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    /// `8 B`, `64 KiB`, `1.5 MiB`: exact where the unit divides, else one decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if self.0 >= 1 << shift {
                return if self.0.is_multiple_of(1 << shift) {
                    write!(f, "{} {unit}", self.0 >> shift)
                } else {
                    write!(f, "{:.1} {unit}", self.0 as f64 / (1u64 << shift) as f64)
                };
            }
        }
        write!(f, "{} B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_nccl_tests_takes_them() {
        assert_eq!("8".parse(), Ok(ByteSize(8)));
        assert_eq!("64K".parse(), Ok(ByteSize(64 << 10)));
        assert_eq!("128M".parse(), Ok(ByteSize(128 << 20)));
        assert_eq!("1G".parse(), Ok(ByteSize(1 << 30)));
        assert_eq!("2MiB".parse(), Ok(ByteSize(2 << 20)));
        assert_eq!("16B".parse(), Ok(ByteSize(16)));
        assert!("".parse::<ByteSize>().is_err());
        assert!("K".parse::<ByteSize>().is_err());
        assert!("-8".parse::<ByteSize>().is_err());
        assert!("9999999999999G".parse::<ByteSize>().is_err());
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(ByteSize(8).to_string(), "8 B");
        assert_eq!(ByteSize(64 << 10).to_string(), "64 KiB");
        assert_eq!(ByteSize(3 << 19).to_string(), "1.5 MiB");
    }
}
