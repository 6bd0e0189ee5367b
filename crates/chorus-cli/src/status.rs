//! `chorus status [TOKEN]`: what each rank of a running job is doing — its state as the
//! others see it, when they last heard from it, its epoch, its operation in flight — and
//! the rank the job is waiting on. The query is `chorus::status::query`; this file prints it.
//!
//! Exit codes: 0 the job answered (stalled or not); 1 its root did not answer or refused;
//! 2 bad command line or token. With `--watch`, a job that ends while watched exits 0.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use chorus::UniqueId;
use chorus::status::{Answer, JobStatus, Stall};
use chorus_protocol::message::{OpRecord, OpState, PeerState};
use chorus_protocol::{Collective, Rank};
use clap::Args;
use serde::Serialize;

use crate::exit::Verdict;
use crate::launcher::note;
use crate::size::ByteSize;

const LABEL: &str = "chorus status";

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The job's token (`chorus run` prints it); default: --token-file, then $CHORUS_UNIQUE_ID.
    pub(crate) token: Option<String>,
    /// Read the token from this file (`chorus run --token-file`).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Print JSON (one document per look) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Look again every INTERVAL (default 1s) until the job ends.
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "1s",
          value_parser = crate::duration)]
    pub(crate) watch: Option<Duration>,
    /// How long the job's processes have to answer; a rank silent that long is unreachable.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::duration)]
    pub(crate) timeout: Duration,
}

pub(crate) fn run(args: StatusArgs) -> Verdict {
    let id = match token(&args) {
        Ok(id) => id,
        Err(e) => return crate::fail(LABEL, &e, Verdict::Usage),
    };
    let mut looks = 0u64;
    loop {
        match chorus::status::query(&id, args.timeout) {
            Ok(status) => {
                looks += 1;
                let text = if args.json {
                    serde_json::to_string(&JsonStatus::from(&status)).unwrap_or_default()
                } else {
                    render(&status)
                };
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
            Err(e) if looks > 0 => {
                note(
                    LABEL,
                    &format!("the job no longer answers; it has ended ({e})"),
                );
                return Verdict::Ok;
            }
            Err(e) => return crate::fail(LABEL, &e.to_string(), Verdict::RankFailed),
        }
        match args.watch {
            Some(interval) => std::thread::sleep(interval),
            None => return Verdict::Ok,
        }
    }
}

fn token(args: &StatusArgs) -> Result<UniqueId, String> {
    let text = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token from {}: {e}", path.display()))?,
        (None, None) => std::env::var("CHORUS_UNIQUE_ID").map_err(|_| {
            "no token: give it as an argument, with --token-file, or in CHORUS_UNIQUE_ID".to_owned()
        })?,
    };
    UniqueId::parse(text.trim()).map_err(|e| format!("bad token: {e}"))
}

/// The table a person reads.
fn render(s: &JobStatus) -> String {
    let mut out = String::new();
    let answered = s
        .ranks
        .iter()
        .filter(|r| matches!(r.answer, Answer::Replied(_)))
        .count();
    let _ = writeln!(
        out,
        "job {} (root {}): {} ranks, {answered} answered in {:.2}s",
        s.comm,
        s.root,
        s.world,
        s.elapsed.as_secs_f64()
    );
    if s.members.is_empty() {
        let _ = write!(
            out,
            "the root answers, but not every rank has joined yet: there is no peer table to ask"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{:>5} {:>8}  {:<12} {:<9} {:>9}  {:<6} in flight",
        "rank", "pid", "answer", "seen as", "heard", "epoch"
    );
    for r in &s.ranks {
        let (seen, heard) = match s.seen(r.rank) {
            Some((state, heard)) => (state_name(state), heard.map_or("never".into(), age)),
            None => ("-", "-".into()),
        };
        let (answer, epoch, flight) = match &r.answer {
            Answer::Replied(reply) => {
                let flight = s
                    .in_flight(r.rank)
                    .map(|op| op_text(s, r.rank, op))
                    .unwrap_or_else(|| "-".into());
                let flight = match &reply.async_error {
                    Some(e) => format!("{flight}; first error: {e}"),
                    None => flight,
                };
                ("ok", reply.epoch.to_string(), flight)
            }
            Answer::Unreachable(why) => ("unreachable", "-".into(), format!("({why})")),
        };
        let _ = writeln!(
            out,
            "{:>5} {:>8}  {:<12} {:<9} {:>9}  {:<6} {flight}",
            r.rank.get(),
            r.info.pid,
            answer,
            seen,
            heard,
            epoch
        );
    }
    let _ = write!(out, "{}", verdict_line(s, s.waiting_on().as_ref()));
    out
}

fn verdict_line(s: &JobStatus, stall: Option<&Stall>) -> String {
    let Some(stall) = stall else {
        return "no rank is waiting on another".into();
    };
    let who = s.ranks.get(stall.rank.index());
    let pid = who.map_or(0, |r| r.info.pid);
    let list = |ranks: &[Rank]| {
        ranks
            .iter()
            .map(|r| r.get().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let why = if !stall.answered {
        "it does not answer (frozen, or gone)"
    } else if !stall.in_operation {
        "it answers but is not inside any operation (its program is elsewhere)"
    } else {
        "it is inside an operation but waits on nobody"
    };
    format!(
        "=> the job is waiting on rank {} (pid {pid}): rank(s) {} wait on it; {why}",
        stall.rank.get(),
        list(&stall.waiters)
    )
}

fn op_text(s: &JobStatus, rank: Rank, op: &OpRecord) -> String {
    let name = Collective::from_code(op.collective).map_or("?", |c| c.name());
    let mut t = format!(
        "{name} {} ({}, {}) {} step {} for {}",
        op.seq,
        ByteSize(op.bytes),
        op.algorithm,
        op_state(op.state),
        op.step,
        age(Duration::from_millis(op.elapsed_ms))
    );
    if let Some(peer) = s.waits_on(rank) {
        let _ = write!(t, ", waiting on rank {}", peer.get());
    }
    t
}

fn age(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn state_name(state: PeerState) -> &'static str {
    match state {
        PeerState::Joining => "joining",
        PeerState::Alive => "alive",
        PeerState::Suspect => "suspect",
        PeerState::Dead => "dead",
        PeerState::Departed => "departed",
    }
}

fn op_state(state: OpState) -> &'static str {
    match state {
        OpState::Queued => "queued",
        OpState::Running => "running",
        OpState::Done => "done",
        OpState::Failed => "failed",
        OpState::Aborted => "aborted",
    }
}

/// `--json`: the same, machine-readable.
#[derive(Serialize, Debug)]
struct JsonStatus {
    comm: String,
    root: String,
    world: u32,
    elapsed_ms: f64,
    /// False while the ranks are still joining (no peer table yet).
    bootstrapped: bool,
    waiting_on: Option<JsonStall>,
    ranks: Vec<JsonRank>,
}

#[derive(Serialize, Debug)]
struct JsonStall {
    rank: u32,
    waiters: Vec<u32>,
    direct: Vec<u32>,
    answered: bool,
    in_operation: bool,
}

#[derive(Serialize, Debug)]
struct JsonRank {
    rank: u32,
    pid: u32,
    host: String,
    answered: bool,
    unreachable: Option<String>,
    /// How the other members see it, and their freshest word from it.
    seen_as: Option<&'static str>,
    last_heard_ms: Option<u64>,
    epoch: Option<u64>,
    /// Its rank and world at its current epoch.
    current_rank: Option<u32>,
    current_world: Option<u32>,
    waits_on: Option<u32>,
    in_flight: Option<JsonOp>,
    async_error: Option<String>,
}

#[derive(Serialize, Debug)]
struct JsonOp {
    collective: String,
    seq: u64,
    bytes: u64,
    algorithm: String,
    state: &'static str,
    step: u32,
    age_ms: u64,
    elapsed_ms: u64,
}

impl From<&JobStatus> for JsonStatus {
    fn from(s: &JobStatus) -> JsonStatus {
        let ranks = s
            .ranks
            .iter()
            .map(|r| {
                let seen = s.seen(r.rank);
                let reply = s.reply(r.rank);
                JsonRank {
                    rank: r.rank.get(),
                    pid: r.info.pid,
                    host: r.info.host.clone(),
                    answered: reply.is_some(),
                    unreachable: match &r.answer {
                        Answer::Unreachable(why) => Some(why.clone()),
                        Answer::Replied(_) => None,
                    },
                    seen_as: seen.map(|(state, _)| state_name(state)),
                    last_heard_ms: seen
                        .and_then(|(_, heard)| heard)
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    epoch: reply.map(|x| x.epoch.get()),
                    current_rank: reply.map(|x| x.rank.get()),
                    current_world: reply.map(|x| x.world),
                    waits_on: s.waits_on(r.rank).map(|w| w.get()),
                    in_flight: s.in_flight(r.rank).map(|op| JsonOp {
                        collective: Collective::from_code(op.collective)
                            .map_or("?".into(), |c| c.name().into()),
                        seq: op.seq.get(),
                        bytes: op.bytes,
                        algorithm: op.algorithm.clone(),
                        state: op_state(op.state),
                        step: op.step,
                        age_ms: op.age_ms,
                        elapsed_ms: op.elapsed_ms,
                    }),
                    async_error: reply.and_then(|x| x.async_error.clone()),
                }
            })
            .collect();
        JsonStatus {
            comm: s.comm.to_string(),
            root: s.root.to_string(),
            world: s.world,
            elapsed_ms: s.elapsed.as_secs_f64() * 1e3,
            bootstrapped: !s.members.is_empty(),
            waiting_on: s.waiting_on().map(|w| JsonStall {
                rank: w.rank.get(),
                waiters: w.waiters.iter().map(|r| r.get()).collect(),
                direct: w.direct.iter().map(|r| r.get()).collect(),
                answered: w.answered,
                in_operation: w.in_operation,
            }),
            ranks,
        }
    }
}
