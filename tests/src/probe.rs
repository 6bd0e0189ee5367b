//! Bad input for a job's listening ports: raw bytes on a TCP data listener, raw bytes on a
//! QUIC stream (after a TLS handshake that trusts any certificate: the bytes, not TLS, are
//! what is tested), datagrams of garbage, and well-formed handshakes that the listener must
//! refuse (wrong secret, stale epoch, unknown communicator). Each returns what the listener
//! answered, for the test to compare with the spec's code (SPEC.md sections 5.2, 7, 14).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::message::{ChunkHeader, Message, Role};
use chorus_protocol::{
    ChannelBinding, CloseCode, Collective, Connector, ConnectorConfig, DType, Decoder, Envelope,
    JobSecret, Limits, OpSeq, Side,
};

/// How long a probe waits for the listener's answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// What a listener answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The code of the `Reject` or `Depart` it sent, if it sent one.
    pub refused: Option<CloseCode>,
    /// True when it sent a `HelloAck` (the handshake was admitted).
    pub admitted: bool,
    /// The connection-level close: the QUIC application code, or `Some(0)` for a TCP
    /// end-of-stream; `None` if the connection stayed open past [`ANSWER_WAIT`].
    pub closed: Option<u64>,
}

/// The bytes of a `Hello` from `envelope` in `role` under `secret` (`binding`: `None` on
/// TCP, the TLS exporter on QUIC), and the connector to continue with.
pub fn hello(
    secret: &JobSecret,
    envelope: Envelope,
    role: Role,
    binding: ChannelBinding,
) -> (Vec<u8>, Connector) {
    let mut config = ConnectorConfig::new(
        secret.clone(),
        envelope,
        role,
        chorus_transport::fresh::nonce(),
        Instant::now() + ANSWER_WAIT,
    );
    config.binding = binding;
    let mut out = BytesMut::new();
    let connector = match Connector::new(config, &mut out) {
        Ok(c) => c,
        Err(e) => panic!("cannot encode a hello: {e}"),
    };
    (out.to_vec(), connector)
}

/// `bytes` with the header's `body_len` set to `len`.
pub fn with_body_len(mut bytes: Vec<u8>, len: u32) -> Vec<u8> {
    bytes[28..32].copy_from_slice(&len.to_le_bytes());
    bytes
}

/// Bytes that are no frame at all.
pub fn garbage(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed) ^ 0x5a)
        .collect()
}

/// Opens a TCP connection to `addr`, writes `bytes`, and reads the answer.
pub fn tcp(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let mut s = match TcpStream::connect_timeout(&addr, ANSWER_WAIT) {
        Ok(s) => s,
        Err(e) => panic!("cannot connect to {addr}: {e}"),
    };
    let _ = s.set_read_timeout(Some(ANSWER_WAIT));
    // A listener may refuse before it read everything: a failed write is part of the answer.
    let _ = s.write_all(bytes);
    tcp_answer(&mut s)
}

/// A TCP `Hello` that the listener admits, then `after` frames encoded by `make` with the
/// stream's encoder: returns the answer to those frames.
pub fn tcp_after_handshake(
    addr: SocketAddr,
    secret: &JobSecret,
    envelope: Envelope,
    role: Role,
    make: impl FnOnce(&mut chorus_protocol::Encoder) -> Vec<u8>,
) -> Answer {
    let (bytes, mut connector) = hello(secret, envelope, role, ChannelBinding::None);
    let mut s = match TcpStream::connect_timeout(&addr, ANSWER_WAIT) {
        Ok(s) => s,
        Err(e) => panic!("cannot connect to {addr}: {e}"),
    };
    let _ = s.set_read_timeout(Some(ANSWER_WAIT));
    let _ = s.write_all(&bytes);
    let mut decoder = Decoder::new(Side::Connector, Limits::DEFAULT);
    let first = read_frame(&mut s, &mut decoder);
    let Some(first) = first else {
        return Answer {
            refused: None,
            admitted: false,
            closed: Some(0),
        };
    };
    if let Message::Reject(r) = &first.message {
        return Answer {
            refused: Some(r.code),
            admitted: false,
            closed: Some(0),
        };
    }
    let established = match connector.handle(&first) {
        Ok(e) => e,
        Err(e) => panic!("the listener's handshake answer does not verify: {e}"),
    };
    established.apply(&mut decoder);
    let mut encoder = connector.into_encoder();
    let more = make(&mut encoder);
    let _ = s.write_all(&more);
    let mut answer = read_answer(&mut s, &mut decoder);
    answer.admitted = true;
    answer
}

/// A chunk frame (header and `payload_len` zero bytes) as `envelope` on a data stream.
pub fn chunk(encoder: &mut chorus_protocol::Encoder, envelope: Envelope, len: usize) -> Vec<u8> {
    let header = ChunkHeader {
        collective: Collective::AllReduce.code(),
        dtype: DType::U8.code(),
        op: OpSeq(1 << 40),
        step: 0,
        offset: 0,
    };
    let mut out = BytesMut::new();
    if let Err(e) = encoder.encode_chunk_prefix(&envelope, &header, len, &mut out) {
        panic!("cannot encode a chunk: {e}");
    }
    out.resize(out.len() + len, 0);
    out.to_vec()
}

fn tcp_answer(s: &mut TcpStream) -> Answer {
    let mut decoder = Decoder::new(Side::Connector, Limits::DEFAULT);
    read_answer(s, &mut decoder)
}

/// Reads frames until a `Reject`/`Depart` or the end of the stream (bounded).
fn read_answer(s: &mut TcpStream, decoder: &mut Decoder) -> Answer {
    let mut answer = Answer {
        refused: None,
        admitted: false,
        closed: None,
    };
    let deadline = Instant::now() + ANSWER_WAIT;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        while let Ok(Some(frame)) = decoder.next() {
            match frame.message {
                Message::Reject(r) => answer.refused = Some(r.code),
                Message::Depart(d) => answer.refused = Some(d.code),
                Message::HelloAck(_) => answer.admitted = true,
                _ => {}
            }
        }
        match s.read(&mut buf) {
            Ok(0) => {
                answer.closed = Some(0);
                break;
            }
            Ok(n) => decoder.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                answer.closed = Some(0);
                break;
            }
            Err(_) => break,
        }
    }
    while let Ok(Some(frame)) = decoder.next() {
        if let Message::Reject(r) = frame.message {
            answer.refused = Some(r.code);
        } else if let Message::Depart(d) = frame.message {
            answer.refused = Some(d.code);
        }
    }
    answer
}

fn read_frame(s: &mut TcpStream, decoder: &mut Decoder) -> Option<chorus_protocol::Frame> {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + ANSWER_WAIT;
    while Instant::now() < deadline {
        if let Ok(Some(f)) = decoder.next() {
            return Some(f);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => decoder.push(&buf[..n]),
        }
    }
    None
}

/// Sends `count` datagrams of garbage to a QUIC port (nothing answers them).
pub fn udp_garbage(addr: SocketAddr, count: usize) {
    let Ok(sock) = UdpSocket::bind("127.0.0.1:0") else {
        return;
    };
    for i in 0..count {
        let len = 1 + (i * 97) % 1400;
        let _ = sock.send_to(&garbage(len, i as u8), addr);
    }
}

/// What to write on the probe's QUIC stream, given the TLS binding of its connection.
pub enum QuicBytes {
    /// These bytes as they are.
    Raw(Vec<u8>),
    /// A `Hello` from `envelope` in `role` under `secret`, bound to the TLS session (so it
    /// is valid unless the secret or the envelope is wrong).
    Hello {
        secret: JobSecret,
        envelope: Envelope,
        role: Role,
    },
}

/// Completes TLS with the QUIC endpoint at `addr` (trusting any certificate), opens a
/// stream, writes the bytes, and returns the answer and the connection's close code.
pub fn quic(addr: SocketAddr, bytes: QuicBytes) -> Answer {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot build a runtime for a QUIC probe: {e}"),
    };
    rt.block_on(async move {
        let conn = match tokio::time::timeout(ANSWER_WAIT, trusting_connect(addr)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!("QUIC probe cannot connect to {addr}: {e}"),
            Err(_) => panic!("QUIC probe: no TLS handshake with {addr} in {ANSWER_WAIT:?}"),
        };
        let mut answer = Answer {
            refused: None,
            admitted: false,
            closed: None,
        };
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => panic!("QUIC probe cannot open a stream: {e}"),
        };
        let payload = match bytes {
            QuicBytes::Raw(b) => b,
            QuicBytes::Hello {
                secret,
                envelope,
                role,
            } => {
                let mut b = [0u8; 32];
                if let Err(e) = conn.export_keying_material(&mut b, b"EXPORTER-chorus-hello", b"") {
                    panic!("no TLS exporter: {e:?}");
                }
                hello(&secret, envelope, role, ChannelBinding::Tls(b)).0
            }
        };
        let _ = send.write_all(&payload).await;
        let mut decoder = Decoder::new(Side::Connector, Limits::DEFAULT);
        let read = async {
            loop {
                while let Ok(Some(frame)) = decoder.next() {
                    match frame.message {
                        Message::Reject(r) => answer.refused = Some(r.code),
                        Message::Depart(d) => answer.refused = Some(d.code),
                        Message::HelloAck(_) => answer.admitted = true,
                        _ => {}
                    }
                    if answer.refused.is_some() || answer.admitted {
                        return;
                    }
                }
                match recv.read_chunk(1 << 16, true).await {
                    Ok(Some(c)) => decoder.push(&c.bytes),
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(ANSWER_WAIT, read).await;
        if answer.admitted {
            conn.close(quinn::VarInt::from_u32(0), b"probe done");
            answer.closed = Some(0);
            return answer;
        }
        answer.closed = match tokio::time::timeout(ANSWER_WAIT, conn.closed()).await {
            Ok(quinn::ConnectionError::ApplicationClosed(ac)) => Some(ac.error_code.into_inner()),
            Ok(_) => Some(u64::MAX),
            Err(_) => None,
        };
        answer
    })
}

/// A QUIC connection to `addr` that trusts any certificate.
async fn trusting_connect(addr: SocketAddr) -> Result<quinn::Connection, String> {
    trusting_endpoint()?
        .connect(addr, "chorus")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())
}

/// A client QUIC endpoint on loopback that trusts any certificate and speaks chorus's
/// ALPN (call it inside a tokio runtime).
pub fn trusting_endpoint() -> Result<quinn::Endpoint, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustAll(provider)))
        .with_no_client_auth();
    crypto.alpn_protocols = vec![b"chorus/1".to_vec()];
    let client = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).map_err(|e| e.to_string())?,
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().map_err(|_| "address")?)
        .map_err(|e| e.to_string())?;
    ep.set_default_client_config(client);
    Ok(ep)
}

/// Accepts any server certificate: the probes test what the endpoint does with bytes, not
/// certificate pinning (the transport's own tests cover that).
#[derive(Debug)]
struct TrustAll(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for TrustAll {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The envelope a probe claims: `comm`, `epoch`, `sender`.
pub fn envelope(comm: u64, epoch: u64, sender: u32) -> Envelope {
    Envelope::new(
        chorus_protocol::CommId(comm),
        chorus_protocol::Epoch(epoch),
        chorus_protocol::Rank(sender),
    )
}

/// A close code as the number a QUIC close carries.
pub fn code(c: CloseCode) -> u64 {
    u64::from(c.0)
}
