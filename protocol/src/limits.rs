//! Size limits: the fixed bounds every implementation shares (string lengths), and the
//! configurable ones a receiver applies before it buffers a body (SPEC.md, "Limits").
//!
//! A receiver checks a frame's claimed body length against [`Limits`] as soon as the header
//! is complete, before it reserves memory for the body; a length over the limit closes the
//! connection. The defaults fit a 1 Mi-rank peer table and 64 MiB data chunks.

/// Longest `detail` of a `Reject` or `Depart`, in bytes of UTF-8.
pub const MAX_DETAIL: usize = 512;
/// Longest `PeerInfo::host`, in bytes (a DNS name is at most 253).
pub const MAX_HOST: usize = 255;
/// Longest `OpRecord::algorithm`, in bytes.
pub const MAX_ALGORITHM: usize = 64;
/// Longest `StatusReply::async_error`, in bytes.
pub const MAX_ASYNC_ERROR: usize = 4096;

/// Bounds a receiver enforces on what a peer may make it hold. Both sides of a connection
/// should use the same values; an encoder refuses to produce a frame its own limits reject.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Limits {
    /// Largest body of a small variable-size message (`Reject`, `Join`, `Depart`).
    pub max_small_body: u32,
    /// Largest body of a message that carries a peer table or rank list (`Welcome`,
    /// `Promise`, `Propose`, `Accept`, `Commit`, `StatusReply`).
    pub max_table_body: u32,
    /// Largest payload of one data chunk (the chunk header is not counted).
    pub max_chunk_payload: u32,
    /// Most members of a peer table, and most ranks in a rank list.
    pub max_members: u32,
    /// Most flight-recorder entries in a `StatusReply`.
    pub max_ops: u32,
}

impl Limits {
    /// The defaults SPEC.md documents.
    pub const DEFAULT: Limits = Limits {
        max_small_body: 4 * 1024,
        max_table_body: 256 * 1024 * 1024,
        max_chunk_payload: 64 * 1024 * 1024,
        max_members: 1 << 20,
        max_ops: 4096,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}
