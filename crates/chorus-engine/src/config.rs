//! Engine configuration (plain data: the runtime parses environment and files into it) and
//! the algorithm names.

use std::fmt;

use chorus_protocol::Collective;

use crate::error::EngineError;

/// A collective algorithm.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Algorithm {
    /// Pipelined ring: reduce-scatter + all-gather for all-reduce, one ring pass for
    /// reduce-scatter and all-gather, a pipelined chain for broadcast and reduce.
    /// Bandwidth-optimal; `2(n-1)` (or `n-1`) latency terms.
    Ring,
    /// Recursive doubling all-reduce: `log2 n` exchanges of the whole buffer (plus one fold
    /// before and one after when `n` is not a power of two). Latency-optimal.
    RecursiveDoubling,
    /// Recursive halving then doubling (Rabenseifner) all-reduce, and recursive halving
    /// reduce-scatter: `2 log2 n` steps moving the bandwidth-optimal volume, with the same
    /// fold for non-powers of two.
    HalvingDoubling,
    /// Binomial tree broadcast and reduce: `ceil(log2 n)` rounds, chunk-pipelined.
    BinomialTree,
    /// Bruck all-gather: `ceil(log2 n)` rounds for any `n`.
    Bruck,
    /// All-to-all by pairwise exchange: `n-1` steps, one peer each.
    Pairwise,
    /// Gather and scatter: the root exchanges with every other rank directly.
    Linear,
    /// Dissemination barrier: `ceil(log2 n)` rounds of empty messages.
    Dissemination,
    /// Point-to-point send and receive.
    Direct,
    /// A world of one: local copies only.
    Local,
}

impl Algorithm {
    /// Short name for logs, errors and the flight recorder.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive-doubling",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::BinomialTree => "binomial-tree",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Linear => "linear",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Direct => "direct",
            Algorithm::Local => "local",
        }
    }

    /// The algorithm for a name as [`Algorithm::name`] writes it.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Every algorithm.
    pub const ALL: [Algorithm; 10] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
        Algorithm::BinomialTree,
        Algorithm::Bruck,
        Algorithm::Pairwise,
        Algorithm::Linear,
        Algorithm::Dissemination,
        Algorithm::Direct,
        Algorithm::Local,
    ];

    /// The algorithms that implement `collective` in a world of more than one rank.
    pub const fn for_collective(collective: Collective) -> &'static [Algorithm] {
        match collective {
            Collective::AllReduce => &[
                Algorithm::Ring,
                Algorithm::RecursiveDoubling,
                Algorithm::HalvingDoubling,
            ],
            Collective::Reduce | Collective::Broadcast => {
                &[Algorithm::Ring, Algorithm::BinomialTree]
            }
            Collective::AllGather => &[Algorithm::Ring, Algorithm::Bruck],
            Collective::ReduceScatter => &[Algorithm::Ring, Algorithm::HalvingDoubling],
            Collective::AllToAll => &[Algorithm::Pairwise],
            Collective::Gather | Collective::Scatter => &[Algorithm::Linear],
            Collective::Barrier => &[Algorithm::Dissemination],
            Collective::SendRecv => &[Algorithm::Direct],
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the engine runs: chunking, pipelining and algorithm choice.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EngineConfig {
    /// Largest payload the engine hands a link, in bytes (rounded down to whole elements,
    /// at least one element). Operations are cut into chunks of this size so that
    /// transfers, reductions and the next hop overlap.
    pub chunk_bytes: usize,
    /// Most chunks an operation keeps in flight towards one peer ahead of its own progress.
    /// A link's held-data bound must be at least `pipeline_depth * chunk_bytes`.
    pub pipeline_depth: usize,
    /// Forced algorithms (`None`: choose by size and world with [`Thresholds`]).
    pub overrides: Overrides,
    /// Size crossovers for the automatic choice.
    pub thresholds: Thresholds,
}

/// Algorithm overrides per collective; each must be one of
/// [`Algorithm::for_collective`].
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct Overrides {
    /// All-reduce's algorithm, whatever the size (`None`: chosen by size and world).
    pub all_reduce: Option<Algorithm>,
    /// Reduce's algorithm, whatever the size.
    pub reduce: Option<Algorithm>,
    /// Broadcast's algorithm, whatever the size.
    pub broadcast: Option<Algorithm>,
    /// All-gather's algorithm, whatever the size.
    pub all_gather: Option<Algorithm>,
    /// Reduce-scatter's algorithm, whatever the size.
    pub reduce_scatter: Option<Algorithm>,
}

/// Byte sizes below which the latency-optimal algorithm is chosen. Sizes are the per-rank
/// buffer of the operation: `count * size` for all-reduce, broadcast and reduce, the whole
/// `world * count * size` buffer for all-gather and reduce-scatter. See
/// [`crate::select`] for the measurements behind the defaults.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Thresholds {
    /// All-reduce: recursive doubling below this size (worlds of more than two).
    pub all_reduce_doubling_below: usize,
    /// All-reduce in a world of two: recursive doubling (one exchange of the whole buffer,
    /// pipelined) below this size, the ring (two dependent phases per chunk, half the
    /// reduction work) at or above it.
    pub all_reduce_pair_doubling_below: usize,
    /// All-reduce: halving-doubling below this size (and at or above the doubling bound),
    /// in worlds of more than two.
    pub all_reduce_halving_below: usize,
    /// Broadcast and reduce: binomial tree below this size, pipelined chain at or above.
    pub tree_below: usize,
    /// All-gather: Bruck below this size.
    pub all_gather_bruck_below: usize,
    /// Reduce-scatter: recursive halving below this size.
    pub reduce_scatter_halving_below: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            chunk_bytes: 256 << 10,
            pipeline_depth: 8,
            overrides: Overrides::default(),
            thresholds: Thresholds::default(),
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            all_reduce_doubling_below: 64 << 10,
            all_reduce_pair_doubling_below: 256 << 10,
            all_reduce_halving_below: 8 << 20,
            tree_below: 256 << 10,
            all_gather_bruck_below: 64 << 10,
            reduce_scatter_halving_below: 1 << 20,
        }
    }
}

impl Thresholds {
    /// The crossovers for a world whose every link shares memory with its peer (the shm
    /// transport): all-reduce takes the ring from 256 KiB in worlds of more than two, not
    /// halving-doubling up to 8 MiB. With no network under it a step costs a copy and a
    /// wake-up rather than a round trip, so the ring's `2(n-1)` steps lose less to latency
    /// and its one neighbour per rank keeps each copy streaming; see [`crate::select`] for
    /// the measurement. The other crossovers are the network's.
    pub fn shared_memory(self) -> Self {
        Thresholds {
            all_reduce_halving_below: self.all_reduce_halving_below.min(256 << 10),
            ..self
        }
    }
}

/// The chunk of a pair of ranks on two hosts ([`EngineConfig::network`]).
pub const NETWORK_CHUNK_BYTES: usize = 128 << 10;

impl EngineConfig {
    /// The configuration for a pair of ranks on two hosts, joined by a network: chunks of at
    /// most [`NETWORK_CHUNK_BYTES`], so that a chunk's reduction and its next hop start
    /// while the wire still carries the one behind it (a pair's ring has only its two
    /// steps, so the chunks are all its pipelining). Where a chunk crosses the wire in well
    /// under the time it takes to reduce and forward (loopback, shared memory), the larger
    /// default wins instead, its per-chunk costs spread over more bytes.
    ///
    /// Measured 2026-12-05 on a 2-core VM, all-reduce, in-place and out-of-place µs pooled,
    /// medians of 6 interleaved rounds (Open MPI's TCP in the same rounds), 2 ranks in two
    /// network namespaces joined by a veth pair:
    ///
    /// | size | 128 KiB chunks | 256 KiB chunks | Open MPI |
    /// |---|---|---|---|
    /// | 128 KiB | **53** | 73 | 105 |
    /// | 512 KiB | **215** | 283 | 218 |
    /// | 2 MiB | **864** | 1350 | 1362 |
    /// | 8 MiB | **4101** | 5454 | 6331 |
    ///
    /// (64 KiB chunks fell between: 211 against 255 µs at 512 KiB, 932 against 1180 at
    /// 2 MiB, 6 rounds.) On loopback 128 KiB lost (2 ranks, 2 MiB: 640 against 521 µs; 8 MiB:
    /// 2929 against 2455), and over shared memory 128 KiB to 1 MiB measured alike. Four
    /// ranks in four namespaces on a bridge lost too (2 MiB: 3960 against 3605 µs; 8 MiB:
    /// 20.5 against 17.0 ms; 4 rounds), but there four ranks shared two cores, where each
    /// chunk more is a scheduling round more: measure larger worlds on real hosts before
    /// widening the rule.
    pub fn network(self) -> Self {
        EngineConfig {
            chunk_bytes: self.chunk_bytes.min(NETWORK_CHUNK_BYTES),
            ..self
        }
    }

    /// Check that the configuration can be used.
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.chunk_bytes == 0 {
            return Err(EngineError::Config("chunk_bytes must be positive".into()));
        }
        if self.pipeline_depth == 0 {
            return Err(EngineError::Config(
                "pipeline_depth must be positive".into(),
            ));
        }
        let o = &self.overrides;
        for (collective, choice) in [
            (Collective::AllReduce, o.all_reduce),
            (Collective::Reduce, o.reduce),
            (Collective::Broadcast, o.broadcast),
            (Collective::AllGather, o.all_gather),
            (Collective::ReduceScatter, o.reduce_scatter),
        ] {
            if let Some(a) = choice
                && !Algorithm::for_collective(collective).contains(&a)
            {
                return Err(EngineError::Config(format!(
                    "{a} does not implement {collective}"
                )));
            }
        }
        Ok(())
    }
}
