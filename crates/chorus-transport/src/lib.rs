//! chorus-transport: implementations of the engine's `Link` port.
//!
//! Floor 3 of the house (`DESIGN.md`): `tcp` over io_uring (with an epoll fallback) and
//! `quic` over quinn + rustls, each with connection-level cancellation that no duplicated
//! descriptor can defeat: a departure frame, then `shutdown(SHUT_RDWR)` before `close` (TCP)
//! or `CONNECTION_CLOSE` with an application code (QUIC).
//!
//! It may depend on `chorus-protocol` and `chorus-engine`; never on `chorus-control`,
//! `chorus-cuda`, `chorus` or the CLI.
