//! The job secret: 32 random bytes every member of a job knows and strangers do not.

use std::fmt;

/// Proven (never sent) in every handshake. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; 32]);

impl JobSecret {
    /// Length in bytes.
    pub const LEN: usize = 32;

    /// A fresh secret from the operating system's generator.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// A secret received from the launcher or the unique id.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw bytes, for the unique id and for keying the handshake MAC.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(..)")
    }
}
