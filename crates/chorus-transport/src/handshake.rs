//! The handshake seam: proofs of the job secret in `Hello` / `HelloAck`.
//!
//! Like `wire.rs`, this is the one place to change when `chorus_protocol`'s sans-IO
//! handshake module lands. The exchange: the connector sends `Hello` (its version range,
//! role, a fresh nonce, and an HMAC-SHA256 under the job secret over those and the frame's
//! route); the acceptor checks it and answers `HelloAck` (the chosen version, its own nonce,
//! and a MAC over both nonces and its route) or `Reject` with a code, then closes.

use chorus_protocol::CloseCode;
use chorus_protocol::message::{Hello, HelloAck, PROOF_LEN, Role};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::JobSecret;
use crate::wire::Route;

/// Protocol versions this build speaks.
pub const VERSION_MIN: u16 = 1;
pub const VERSION_MAX: u16 = 1;

/// A refusal: the code and a lowercase detail for `Reject`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Refusal {
    pub code: CloseCode,
    pub detail: String,
}

impl Refusal {
    fn new(code: CloseCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }
}

/// The connector's first frame. Keep the returned `Hello` to check the acknowledgement.
pub fn hello(secret: &JobSecret, role: Role, route: Route) -> Hello {
    let nonce: [u8; PROOF_LEN] = rand::random();
    let proof = hello_mac(secret, VERSION_MIN, VERSION_MAX, role, route, &nonce);
    Hello {
        version_min: VERSION_MIN,
        version_max: VERSION_MAX,
        role,
        nonce,
        proof,
    }
}

/// The acceptor's check of a `Hello` that arrived under `route`; on success the answer.
pub fn accept(
    secret: &JobSecret,
    hello: &Hello,
    route: Route,
    me: Route,
) -> Result<HelloAck, Refusal> {
    let expected = hello_mac_state(
        secret,
        hello.version_min,
        hello.version_max,
        hello.role,
        route,
        &hello.nonce,
    );
    expected
        .verify_slice(&hello.proof)
        .map_err(|_| Refusal::new(CloseCode::AUTH_FAILED, "job secret proof does not verify"))?;
    let lo = hello.version_min.max(VERSION_MIN);
    let hi = hello.version_max.min(VERSION_MAX);
    if lo > hi {
        return Err(Refusal::new(
            CloseCode::VERSION_MISMATCH,
            format!(
                "peer speaks {}..={}, we speak {VERSION_MIN}..={VERSION_MAX}",
                hello.version_min, hello.version_max
            ),
        ));
    }
    let nonce: [u8; PROOF_LEN] = rand::random();
    let proof = ack_mac(secret, hi, &hello.nonce, &nonce, me)
        .finalize()
        .into_bytes()
        .into();
    Ok(HelloAck {
        version: hi,
        nonce,
        proof,
    })
}

/// The connector's check of the acknowledgement that arrived under `route`.
pub fn confirm(
    secret: &JobSecret,
    hello: &Hello,
    ack: &HelloAck,
    route: Route,
) -> Result<u16, Refusal> {
    ack_mac(secret, ack.version, &hello.nonce, &ack.nonce, route)
        .verify_slice(&ack.proof)
        .map_err(|_| {
            Refusal::new(
                CloseCode::AUTH_FAILED,
                "acceptor's secret proof does not verify",
            )
        })?;
    if !(hello.version_min..=hello.version_max).contains(&ack.version) {
        return Err(Refusal::new(
            CloseCode::VERSION_MISMATCH,
            format!("acceptor chose version {} we did not offer", ack.version),
        ));
    }
    Ok(ack.version)
}

type HmacSha256 = Hmac<Sha256>;

fn keyed(secret: &JobSecret, label: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; 32 bytes never fails.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("hmac accepts any key length"));
    mac.update(label);
    mac
}

fn put_route(mac: &mut HmacSha256, route: Route) {
    mac.update(&route.comm.get().to_le_bytes());
    mac.update(&route.epoch.get().to_le_bytes());
    mac.update(&route.sender.get().to_le_bytes());
}

fn hello_mac_state(
    secret: &JobSecret,
    min: u16,
    max: u16,
    role: Role,
    route: Route,
    nonce: &[u8; PROOF_LEN],
) -> HmacSha256 {
    let mut mac = keyed(secret, b"chorus hello v1");
    mac.update(&min.to_le_bytes());
    mac.update(&max.to_le_bytes());
    mac.update(&[role as u8]);
    put_route(&mut mac, route);
    mac.update(nonce);
    mac
}

fn hello_mac(
    secret: &JobSecret,
    min: u16,
    max: u16,
    role: Role,
    route: Route,
    nonce: &[u8; PROOF_LEN],
) -> [u8; PROOF_LEN] {
    hello_mac_state(secret, min, max, role, route, nonce)
        .finalize()
        .into_bytes()
        .into()
}

fn ack_mac(
    secret: &JobSecret,
    version: u16,
    hello_nonce: &[u8; PROOF_LEN],
    ack_nonce: &[u8; PROOF_LEN],
    route: Route,
) -> HmacSha256 {
    let mut mac = keyed(secret, b"chorus hello-ack v1");
    mac.update(&version.to_le_bytes());
    mac.update(hello_nonce);
    mac.update(ack_nonce);
    put_route(&mut mac, route);
    mac
}

#[cfg(test)]
mod tests {
    use chorus_protocol::{CommId, Epoch, Rank};

    use super::*;

    fn route(r: u32) -> Route {
        Route {
            comm: CommId(1),
            epoch: Epoch(0),
            sender: Rank(r),
        }
    }

    #[test]
    fn both_sides_prove_the_secret() {
        let s = JobSecret::generate();
        let h = hello(&s, Role::Data, route(1));
        let ack = accept(&s, &h, route(1), route(0)).unwrap();
        assert_eq!(confirm(&s, &h, &ack, route(0)), Ok(1));
    }

    #[test]
    fn a_wrong_secret_or_a_tampered_route_is_refused() {
        let s = JobSecret::generate();
        let h = hello(&JobSecret::generate(), Role::Data, route(1));
        assert_eq!(
            accept(&s, &h, route(1), route(0)).unwrap_err().code,
            CloseCode::AUTH_FAILED
        );
        let h = hello(&s, Role::Data, route(1));
        assert_eq!(
            accept(&s, &h, route(2), route(0)).unwrap_err().code,
            CloseCode::AUTH_FAILED
        );
        let ack = accept(&s, &h, route(1), route(0)).unwrap();
        let other = JobSecret::generate();
        assert_eq!(
            confirm(&other, &h, &ack, route(0)).unwrap_err().code,
            CloseCode::AUTH_FAILED
        );
    }

    #[test]
    fn disjoint_versions_are_refused() {
        let s = JobSecret::generate();
        let mut h = hello(&s, Role::Member, route(1));
        h.version_min = 7;
        h.version_max = 9;
        h.proof = hello_mac(&s, 7, 9, Role::Member, route(1), &h.nonce);
        assert_eq!(
            accept(&s, &h, route(1), route(0)).unwrap_err().code,
            CloseCode::VERSION_MISMATCH
        );
    }
}
