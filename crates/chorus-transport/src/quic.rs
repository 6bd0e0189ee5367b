//! QUIC (todo)
