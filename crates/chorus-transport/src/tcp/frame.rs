//! A frame queued for the wire: header (and chunk prefix) in its own small buffer, payload
//! in the caller's buffer, so payloads are never copied on the way out.

use bytes::{Bytes, BytesMut};

use crate::matcher::Credit;

#[derive(Debug)]
pub(crate) struct OutFrame {
    /// Frame header plus chunk prefix; the writer stamps the sequence number into it.
    pub(crate) head: BytesMut,
    pub(crate) payload: Bytes,
    /// Send-window credit to return once the frame is on the wire (none for departures).
    pub(crate) credit: Option<Credit>,
}

impl OutFrame {
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Stamps the per-connection sequence number (header bytes 32..40), in wire order.
    pub(crate) fn stamp(&mut self, seq: u64) {
        if let Some(field) = self.head.get_mut(32..40) {
            field.copy_from_slice(&seq.to_le_bytes());
        }
    }
}
