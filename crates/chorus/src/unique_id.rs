//! `UniqueId`: the printable token that lets processes find and trust each other.
//!
//! It names the bootstrap root's address, the root certificate's fingerprint, the job
//! secret and the communicator id. One process creates it and hands it to the others (an
//! environment variable, a file, the launcher). Anyone holding it can join the job, so it
//! is as sensitive as a password: `Debug` never prints the secret.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chorus_protocol::{CommId, JobSecret};
use sha2::{Digest, Sha256};

const PREFIX: &str = "chorus1-";
const BODY_LEN: usize = 8 + 16 + 2 + 32 + 32;
const CHECK_LEN: usize = 4;

/// A fresh job secret from the operating system's random source.
pub fn random_secret() -> JobSecret {
    JobSecret::new(rand::random())
}

/// The job secret from 64 hexadecimal digits (`CHORUS_SECRET`).
pub fn secret_from_hex(s: &str) -> Result<JobSecret, String> {
    let bytes = hex::decode(s.trim()).map_err(|e| format!("not hexadecimal ({e})"))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("{} bytes, expected 32", b.len()))?;
    Ok(JobSecret::new(bytes))
}

/// The communicator id of a job's first communicator when only the secret is shared (a
/// launch environment without a token): every rank derives the same one.
pub fn derived_comm(secret: &JobSecret) -> CommId {
    let digest = Sha256::new()
        .chain_update(b"chorus comm id\0")
        .chain_update(secret.to_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    CommId(u64::from_le_bytes(id))
}

/// Where the bootstrap root listens, whom to trust, and how to prove membership.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    /// The communicator it founds.
    pub comm: CommId,
    /// The bootstrap root's control endpoint.
    pub root: SocketAddr,
    /// SHA-256 of the root's certificate (DER), pinned by every joiner.
    pub fingerprint: [u8; 32],
    /// The job secret every member proves it holds.
    pub secret: JobSecret,
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("comm", &self.comm)
            .field("root", &self.root)
            .field("fingerprint", &hex::encode(&self.fingerprint[..8]))
            .field("secret", &self.secret)
            .finish()
    }
}

/// Why a token could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// It does not start like a token.
    #[error("not a chorus token (expected it to start with {PREFIX:?})")]
    Prefix,
    /// It is not base64url.
    #[error("token is not base64url ({0})")]
    Encoding(String),
    /// It has the wrong length.
    #[error("token has {got} bytes, expected {expected}")]
    Length {
        /// Its length.
        got: usize,
        /// A token's length.
        expected: usize,
    },
    /// Its checksum does not match.
    #[error("token checksum does not match: it was altered or truncated")]
    Checksum,
    /// It names port 0.
    #[error("token names port 0, which nobody can connect to")]
    Port,
}

impl UniqueId {
    /// The printable token: `chorus1-` then base64url of the fields and a checksum.
    pub fn to_token(&self) -> String {
        let mut bytes = Vec::with_capacity(BODY_LEN + CHECK_LEN);
        bytes.extend_from_slice(&self.comm.get().to_le_bytes());
        let ip = match self.root.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        bytes.extend_from_slice(&ip.octets());
        bytes.extend_from_slice(&self.root.port().to_le_bytes());
        bytes.extend_from_slice(&self.fingerprint);
        bytes.extend_from_slice(&self.secret.to_bytes());
        let check = checksum(&bytes);
        bytes.extend_from_slice(&check);
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Reads a token made by [`UniqueId::to_token`].
    pub fn parse(token: &str) -> Result<Self, TokenError> {
        let body = token
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(TokenError::Prefix)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|e| TokenError::Encoding(e.to_string()))?;
        if bytes.len() != BODY_LEN + CHECK_LEN {
            return Err(TokenError::Length {
                got: bytes.len(),
                expected: BODY_LEN + CHECK_LEN,
            });
        }
        let (fields, check) = bytes.split_at(BODY_LEN);
        if checksum(fields) != check {
            return Err(TokenError::Checksum);
        }
        let mut r = Reader(fields);
        let comm = CommId(u64::from_le_bytes(r.take()));
        let ip = Ipv6Addr::from(r.take::<16>());
        let port = u16::from_le_bytes(r.take());
        let fingerprint = r.take();
        let secret = JobSecret::new(r.take());
        if port == 0 {
            return Err(TokenError::Port);
        }
        let ip = ip
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(ip));
        Ok(UniqueId {
            comm,
            root: SocketAddr::new(ip, port),
            fingerprint,
            secret,
        })
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_token())
    }
}

impl FromStr for UniqueId {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UniqueId::parse(s)
    }
}

fn checksum(bytes: &[u8]) -> [u8; CHECK_LEN] {
    let digest = Sha256::digest(bytes);
    let mut out = [0u8; CHECK_LEN];
    out.copy_from_slice(&digest[..CHECK_LEN]);
    out
}

/// Takes fixed-size fields off the front of a slice whose length was checked beforehand.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // Invariant: `parse` checked the total length against the sum of all field sizes.
        let (head, rest) = self.0.split_at(N.min(self.0.len()));
        out[..head.len()].copy_from_slice(head);
        self.0 = rest;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(root: &str) -> UniqueId {
        UniqueId {
            comm: CommId(0x0123_4567_89ab_cdef),
            root: root.parse().unwrap(),
            fingerprint: [7; 32],
            secret: JobSecret::new([9; 32]),
        }
    }

    #[test]
    fn round_trips_v4_and_v6() {
        for root in ["127.0.0.1:29500", "[::1]:7", "[fe80::1]:65535"] {
            let id = sample(root);
            let token = id.to_token();
            assert!(token.starts_with("chorus1-"));
            assert!(
                token.bytes().all(|b| b.is_ascii_graphic()),
                "printable: {token}"
            );
            assert_eq!(UniqueId::parse(&token).unwrap(), id);
            assert_eq!(token.parse::<UniqueId>().unwrap(), id);
        }
    }

    #[test]
    fn debug_hides_the_secret() {
        let shown = format!("{:?}", sample("127.0.0.1:1"));
        assert!(shown.contains("JobSecret(..)"));
        assert!(!shown.contains("9, 9"));
    }

    #[test]
    fn damaged_tokens_are_named() {
        let token = sample("127.0.0.1:29500").to_token();
        assert_eq!(UniqueId::parse("hello"), Err(TokenError::Prefix));
        assert!(matches!(
            UniqueId::parse("chorus1-@@@"),
            Err(TokenError::Encoding(_))
        ));
        assert!(matches!(
            UniqueId::parse(&token[..token.len() - 4]),
            Err(TokenError::Length { .. }) | Err(TokenError::Encoding(_))
        ));
        // Flip one character in the middle: the checksum catches it.
        let mut chars: Vec<char> = token.chars().collect();
        let i = chars.len() / 2;
        chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
        let altered: String = chars.into_iter().collect();
        assert_eq!(UniqueId::parse(&altered), Err(TokenError::Checksum));
        let zero_port = UniqueId {
            root: "127.0.0.1:0".parse().unwrap(),
            ..sample("1.2.3.4:5")
        };
        assert_eq!(
            UniqueId::parse(&zero_port.to_token()),
            Err(TokenError::Port)
        );
    }

    #[test]
    fn secrets_from_hex() {
        let s = secret_from_hex(&"ab".repeat(32)).unwrap();
        assert_eq!(s.to_bytes(), [0xab; 32]);
        assert!(secret_from_hex("abc").is_err());
        let short = secret_from_hex(&"ab".repeat(31)).unwrap_err();
        assert!(short.contains("31 bytes"), "{short}");
        assert_eq!(derived_comm(&s), derived_comm(&JobSecret::new([0xab; 32])));
        assert_ne!(derived_comm(&s), derived_comm(&JobSecret::new([0xac; 32])));
        assert_ne!(random_secret(), random_secret());
    }
}
