//! Fresh randomness the sans-IO codec asks its caller for: handshake nonces and job secrets.

use chorus_protocol::{JobSecret, Nonce};

/// Fresh random bytes for one handshake, never reused (the operating system's generator).
pub fn nonce() -> Nonce {
    Nonce(rand::random())
}

/// A fresh per-job secret from the operating system's generator, for whoever creates a job
/// (the runtime writes it into the `UniqueId`; tests and tools use it directly).
pub fn job_secret() -> JobSecret {
    JobSecret::new(rand::random())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_and_secrets_are_fresh_each_time() {
        assert_ne!(nonce(), nonce());
        assert_ne!(job_secret(), job_secret());
    }
}
