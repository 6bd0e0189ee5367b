//! What a sweep measures, as nccl-tests' options say it (`-b -e -f -d -o -r -w -i -c`), plus
//! `--inject`. Parsed once by `chorus bench`, checked against the rank count, and handed to
//! every rank as the same arguments.

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

use chorus::DType;
use chorus_protocol::ReduceOp;
use clap::{Args, ValueEnum};

use crate::size::ByteSize;

/// The largest buffer a sweep may ask for, per rank and buffer.
const MAX_BYTES: u64 = 2 << 30;
/// The most sizes one sweep may have.
const MAX_SIZES: usize = 256;

/// The collectives `chorus bench` measures, by nccl-tests' names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Coll {
    #[value(name = "all-reduce", alias = "all_reduce", alias = "allreduce")]
    AllReduce,
    #[value(name = "all-gather", alias = "all_gather", alias = "allgather")]
    AllGather,
    #[value(
        name = "reduce-scatter",
        alias = "reduce_scatter",
        alias = "reducescatter"
    )]
    ReduceScatter,
    #[value(name = "broadcast")]
    Broadcast,
    #[value(name = "reduce")]
    Reduce,
    #[value(name = "all-to-all", alias = "alltoall", alias = "all_to_all")]
    AllToAll,
    #[value(name = "send-recv", alias = "sendrecv", alias = "send_recv")]
    SendRecv,
}

impl Coll {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all-reduce",
            Coll::AllGather => "all-gather",
            Coll::ReduceScatter => "reduce-scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all-to-all",
            Coll::SendRecv => "send-recv",
        }
    }

    /// Whether the reduction operator matters (nccl-tests prints `none` otherwise).
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce | Coll::SendRecv
        )
    }

    /// Whether `-r` applies (nccl-tests prints -1 otherwise).
    pub(crate) fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The sweep's options, shared by `chorus bench` and its ranks.
#[derive(Args, Debug, Clone, PartialEq)]
pub(crate) struct SweepArgs {
    /// Smallest size, in bytes per rank as nccl-tests counts them (K, M, G suffixes).
    #[arg(
        short = 'b',
        long = "minbytes",
        value_name = "SIZE",
        default_value = "8"
    )]
    pub(crate) min: ByteSize,
    /// Largest size.
    #[arg(
        short = 'e',
        long = "maxbytes",
        value_name = "SIZE",
        default_value = "64M"
    )]
    pub(crate) max: ByteSize,
    /// Multiply the size by this much each step.
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "F",
        default_value_t = 2
    )]
    pub(crate) factor: u64,
    /// Element type: float, double, half, bfloat16, int8, uint8, int32, uint32, int64,
    /// uint64, f8e4m3, f8e5m2.
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", value_parser = dtype, default_value = "float")]
    pub(crate) dtype: DType,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", value_name = "OP", value_parser = reduce_op, default_value = "sum")]
    pub(crate) op: ReduceOp,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub(crate) root: u32,
    /// Untimed calls before each size's timed ones.
    #[arg(
        short = 'w',
        long = "warmup_iters",
        value_name = "N",
        default_value_t = 5
    )]
    pub(crate) warmup: u32,
    /// Timed calls per size and mode.
    #[arg(short = 'i', long = "iters", value_name = "N", default_value_t = 20)]
    pub(crate) iters: u32,
    /// Checked calls per size and mode (0: no check, #wrong shows N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    pub(crate) check: u32,
    /// Kill (SIGKILL) or freeze (SIGSTOP) a rank right before its ITER-th timed call
    /// (counted from 0 over the whole sweep); the others detect it, shrink and go on.
    /// Repeatable.
    #[arg(long = "inject", value_name = "kill|stop:RANK@ITER")]
    pub(crate) inject: Vec<Inject>,
}

impl SweepArgs {
    /// The sizes of the sweep, after checking every option against `ranks`.
    pub(crate) fn sizes(&self, ranks: u32) -> Result<Vec<u64>, String> {
        let (min, max) = (self.min.0, self.max.0);
        if min == 0 {
            return Err("-b must be at least 1 byte".into());
        }
        if max < min {
            return Err(format!("-e {} is below -b {}", self.max, self.min));
        }
        if max > MAX_BYTES {
            return Err(format!(
                "-e {} is above the limit of {}",
                self.max,
                ByteSize(MAX_BYTES)
            ));
        }
        if self.factor < 2 {
            return Err("-f must be at least 2".into());
        }
        if self.iters == 0 {
            return Err("-i must be at least 1".into());
        }
        if self.op == ReduceOp::PreMulSum {
            return Err("-o premulsum needs a scalar; use sum, prod, min, max or avg".into());
        }
        if self.root >= ranks {
            return Err(format!("-r {} is not a rank of {ranks}", self.root));
        }
        for (i, j) in self.inject.iter().enumerate() {
            if j.rank >= ranks {
                return Err(format!(
                    "--inject {j}: there is no rank {} of {ranks}",
                    j.rank
                ));
            }
            if self.inject[..i].iter().any(|k| k.rank == j.rank) {
                return Err(format!("--inject {j}: rank {} is already injected", j.rank));
            }
        }
        if !self.inject.is_empty() && self.inject.len() as u32 >= ranks {
            return Err("--inject must leave at least one rank running".into());
        }
        let mut sizes = Vec::new();
        let mut size = min;
        while size <= max {
            sizes.push(size);
            if sizes.len() > MAX_SIZES {
                return Err(format!(
                    "more than {MAX_SIZES} sizes; raise -f or narrow -b/-e"
                ));
            }
            match size.checked_mul(self.factor) {
                Some(next) => size = next,
                None => break,
            }
        }
        Ok(sizes)
    }

    /// The same options as arguments, for a rank.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<String> = vec![
            "-b".into(),
            self.min.0.to_string(),
            "-e".into(),
            self.max.0.to_string(),
            "-f".into(),
            self.factor.to_string(),
            "-d".into(),
            self.dtype.name().into(),
            "-o".into(),
            self.op.name().into(),
            "-r".into(),
            self.root.to_string(),
            "-w".into(),
            self.warmup.to_string(),
            "-i".into(),
            self.iters.to_string(),
            "-c".into(),
            self.check.to_string(),
        ];
        for j in &self.inject {
            args.push("--inject".into());
            args.push(j.to_string());
        }
        args.into_iter().map(OsString::from).collect()
    }
}

/// A fault to inject: which rank, how, and before which timed call.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inject {
    pub(crate) kind: InjectKind,
    pub(crate) rank: u32,
    pub(crate) iter: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum InjectKind {
    /// SIGKILL: the process is gone.
    Kill,
    /// SIGSTOP: the process is frozen, its sockets open (only silence gives it away).
    Stop,
}

impl InjectKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            InjectKind::Kill => "kill",
            InjectKind::Stop => "stop",
        }
    }
}

impl FromStr for Inject {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not kill:RANK@ITER or stop:RANK@ITER");
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        let kind = match kind {
            "kill" => InjectKind::Kill,
            "stop" => InjectKind::Stop,
            _ => return Err(bad()),
        };
        let (rank, iter) = rest.split_once('@').ok_or_else(bad)?;
        Ok(Inject {
            kind,
            rank: rank.parse().map_err(|_| bad())?,
            iter: iter.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for Inject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}", self.kind.name(), self.rank, self.iter)
    }
}

/// A dtype by nccl-tests' name (or a common alias).
fn dtype(s: &str) -> Result<DType, String> {
    let name = match s {
        "f32" | "float32" => "float",
        "f64" | "float64" => "double",
        "f16" | "float16" => "half",
        "bf16" => "bfloat16",
        "int" => "int32",
        "fp8_e4m3" | "e4m3" => "f8e4m3",
        "fp8_e5m2" | "e5m2" => "f8e5m2",
        other => other,
    };
    DType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("{s:?} is not a type ({})", names.join(", "))
        })
}

fn reduce_op(s: &str) -> Result<ReduceOp, String> {
    [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ]
    .into_iter()
    .find(|o| o.name() == s)
    .ok_or_else(|| format!("{s:?} is not a reduction (sum, prod, min, max, avg)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        s: SweepArgs,
    }

    fn parse(args: &[&str]) -> SweepArgs {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .unwrap()
            .s
    }

    #[test]
    fn nccl_tests_options_parse_and_round_trip() {
        let s = parse(&[
            "-b", "1K", "-e", "1M", "-f", "4", "-d", "half", "-o", "max", "-w", "1", "-i", "3",
            "-c", "0", "--inject", "kill:2@7", "--inject", "stop:1@0",
        ]);
        assert_eq!(
            s.sizes(4).unwrap(),
            vec![1024, 4096, 16384, 65536, 262144, 1048576]
        );
        assert_eq!(s.dtype, DType::F16);
        assert_eq!(s.op, ReduceOp::Max);
        let args: Vec<String> = s
            .to_args()
            .iter()
            .map(|a| a.to_string_lossy().into())
            .collect();
        let again = parse(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(again, s);
    }

    #[test]
    fn bad_sweeps_say_what_is_wrong() {
        let err = |a: &[&str], n| parse(a).sizes(n).unwrap_err();
        assert!(err(&["-b", "1M", "-e", "1K"], 4).contains("below"));
        assert!(err(&["-f", "1"], 4).contains("-f"));
        assert!(err(&["-r", "4"], 4).contains("not a rank"));
        assert!(err(&["--inject", "kill:5@1"], 4).contains("no rank 5"));
        assert!(err(&["--inject", "kill:1@1", "--inject", "stop:1@2"], 4).contains("already"));
        assert!(err(&["--inject", "kill:0@1"], 1).contains("at least one"));
        assert!(err(&["-e", "4G"], 4).contains("limit"));
        assert!(T::try_parse_from(["t", "-d", "quad"]).is_err());
        assert!(T::try_parse_from(["t", "--inject", "kill:1"]).is_err());
        assert!(T::try_parse_from(["t", "-o", "premulsum"]).is_err());
    }
}
