//! The run: rounds that each measure the machine's limits, then every system's sweep at
//! every rank count, in an order that rotates from round to round so that neither a slow
//! stretch of the machine nor a position in the round favours one system.

use std::fs::{self, File};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use crate::peer::PeerError;
use crate::peer::bench_doc::BenchDoc;
use crate::peer::loopback::TcpLimit;
use crate::peer::memcpy::MemcpyPoint;
use crate::peer::record::{RawDir, Record, RunOutcome, RunRecord};
use crate::peer::session::{Ending, Outcome, run_in_session};
use crate::peer::stop;
use crate::peer::sweep::Sweep;
use crate::peer::system::{System, Tools};

/// How long each limit measurement may take, start-up included.
const LIMIT_DEADLINE: Duration = Duration::from_secs(60);

/// What to run, and within which bounds.
#[derive(Clone, Debug)]
pub struct Plan {
    pub sweep: Sweep,
    pub rounds: u32,
    pub ranks: Vec<u32>,
    pub systems: Vec<System>,
    /// The deadline of one system's sweep at one rank count.
    pub case_limit: Duration,
    /// Once the run has taken this long, the cases not yet started are skipped.
    pub budget: Duration,
}

impl Plan {
    /// The order of one round: rank counts alternate direction and systems rotate by one
    /// place each round.
    pub fn order(&self, round: u32) -> Vec<(u32, System)> {
        let mut ranks = self.ranks.clone();
        if round.is_multiple_of(2) {
            ranks.reverse();
        }
        let n = self.systems.len().max(1);
        let shift = (round as usize).saturating_sub(1) % n;
        let mut systems = self.systems.clone();
        systems.rotate_left(shift);
        ranks
            .into_iter()
            .flat_map(|r| systems.iter().map(move |&s| (r, s)))
            .collect()
    }
}

/// Where the machine-limit programs are.
#[derive(Clone, Debug)]
pub struct LimitTools {
    /// `memcpy-bw`, given the sweep's sizes.
    pub memcpy: PathBuf,
    /// `tcp-stream`.
    pub tcp: PathBuf,
}

/// Runs a plan, appending every result to `raw` as it comes, and telling `progress` (a
/// person watching stderr) what it is doing.
pub struct Runner<'a> {
    pub plan: &'a Plan,
    pub tools: &'a Tools,
    pub limits: &'a LimitTools,
    pub raw: &'a RawDir,
    pub progress: &'a mut dyn std::io::Write,
}

impl Runner<'_> {
    pub fn run(&mut self) -> Result<(), PeerError> {
        let started = Instant::now();
        // (system, ranks) pairs that failed or could not start: not tried again.
        let mut given_up: Vec<(System, u32)> = Vec::new();
        'rounds: for round in 1..=self.plan.rounds {
            if stop::requested() {
                break;
            }
            self.say(&format!(
                "round {round}/{}: machine limits",
                self.plan.rounds
            ));
            self.measure_limits(round)?;
            for (ranks, system) in self.plan.order(round) {
                if stop::requested() {
                    self.say("interrupted: stopping, and writing the report of what was measured");
                    break 'rounds;
                }
                if given_up.contains(&(system, ranks)) {
                    continue;
                }
                let (outcome, elapsed) = if started.elapsed() >= self.plan.budget {
                    let reason = format!(
                        "the run's time budget of {} s was spent",
                        self.plan.budget.as_secs()
                    );
                    (RunOutcome::Skipped { reason }, Duration::ZERO)
                } else {
                    self.say(&format!(
                        "round {round}/{}: {} ranks, {} …",
                        self.plan.rounds,
                        ranks,
                        system.label()
                    ));
                    self.case(round, ranks, system)?
                };
                let elapsed_s = elapsed.as_secs_f64();
                match &outcome {
                    RunOutcome::Measured { doc } => self.say(&format!(
                        "    measured in {elapsed_s:.1} s, average bus bandwidth {:.3} GB/s",
                        doc.avg_busbw_gbs
                    )),
                    RunOutcome::Failed { reason } | RunOutcome::Unavailable { reason } => {
                        given_up.push((system, ranks));
                        self.say(&format!("    not measured: {reason}"));
                    }
                    RunOutcome::Skipped { .. } => {}
                }
                self.raw.append(&Record::Run(RunRecord {
                    round,
                    system,
                    ranks,
                    elapsed_s,
                    outcome,
                }))?;
            }
        }
        Ok(())
    }

    fn say(&mut self, line: &str) {
        // Progress is a courtesy; a closed stderr must not stop the measurements.
        let _ = writeln!(self.progress, "peer-run: {line}");
    }

    fn measure_limits(&mut self, round: u32) -> Result<(), PeerError> {
        let sizes: Vec<String> = self.plan.sweep.sizes().iter().map(|s| s.arg()).collect();
        let mut memcpy = Command::new(&self.limits.memcpy);
        memcpy.args(&sizes);
        let record = match self.run_json::<Vec<MemcpyPoint>>(&mut memcpy, round, "memcpy") {
            Ok(points) => Record::Memcpy { round, points },
            Err(reason) => Record::LimitFailed {
                round,
                which: "memcpy".to_owned(),
                reason,
            },
        };
        self.raw.append(&record)?;
        let record =
            match self.run_json::<TcpLimit>(&mut Command::new(&self.limits.tcp), round, "tcp") {
                Ok(limit) => Record::Tcp { round, limit },
                Err(reason) => Record::LimitFailed {
                    round,
                    which: "tcp".to_owned(),
                    reason,
                },
            };
        if let Record::LimitFailed { reason, .. } = &record {
            self.say(&format!("    a limit was not measured: {reason}"));
        }
        self.raw.append(&record)
    }

    /// Runs a limit program and parses the JSON value it prints.
    fn run_json<T: DeserializeOwned>(
        &mut self,
        cmd: &mut Command,
        round: u32,
        name: &str,
    ) -> Result<T, String> {
        let (out, err) = self.raw.log_paths(round, name, 1);
        let outcome = supervise(cmd, &out, &err, LIMIT_DEADLINE).map_err(|e| e.to_string())?;
        let stdout = fs::read_to_string(&out).unwrap_or_default();
        if outcome.ending != Ending::Exited(0) {
            return Err(failure_reason(&outcome, LIMIT_DEADLINE, &err));
        }
        serde_json::from_str(stdout.trim()).map_err(|e| format!("{name} printed no result ({e})"))
    }

    /// One system's sweep at one rank count: its legs run one after the other (see
    /// [`Sweep::legs`]) under the case's one deadline, their rows joined into one document.
    fn case(
        &mut self,
        round: u32,
        ranks: u32,
        system: System,
    ) -> Result<(RunOutcome, Duration), PeerError> {
        let started = Instant::now();
        let mut joined: Option<BenchDoc> = None;
        for (i, leg) in self.plan.sweep.legs().iter().enumerate() {
            let left = self.plan.case_limit.saturating_sub(started.elapsed());
            let doc = match self.leg(round, ranks, system, leg, i, left)? {
                Ok(doc) => doc,
                Err(outcome) => return Ok((outcome, started.elapsed())),
            };
            match &mut joined {
                None => joined = Some(doc),
                Some(all) => {
                    if let Err(e) = all.extend(doc) {
                        let reason = e.to_string();
                        return Ok((RunOutcome::Failed { reason }, started.elapsed()));
                    }
                }
            }
        }
        let outcome = match joined {
            Some(doc) => RunOutcome::Measured { doc },
            None => RunOutcome::Failed {
                reason: "the sweep has no sizes".to_owned(),
            },
        };
        Ok((outcome, started.elapsed()))
    }

    /// One leg of a case, under `limit`: its document, or the outcome that ends the case.
    fn leg(
        &mut self,
        round: u32,
        ranks: u32,
        system: System,
        leg: &Sweep,
        index: usize,
        limit: Duration,
    ) -> Result<Result<BenchDoc, RunOutcome>, PeerError> {
        let mut cmd = match self.tools.command(system, ranks, leg, limit.as_secs()) {
            Ok(cmd) => cmd,
            Err(reason) => return Ok(Err(RunOutcome::Unavailable { reason })),
        };
        // The first leg's logs keep the names they always had.
        let key = if index == 0 {
            system.key().to_owned()
        } else {
            format!("{}-leg{}", system.key(), index + 1)
        };
        let (out, err) = self.raw.log_paths(round, &key, ranks);
        let outcome = match supervise(&mut cmd, &out, &err, limit) {
            Ok(outcome) => outcome,
            // The program could not be started at all (missing, not executable).
            Err(e) => {
                return Ok(Err(RunOutcome::Unavailable {
                    reason: e.to_string(),
                }));
            }
        };
        if outcome.ending != Ending::Exited(0) {
            return Ok(Err(RunOutcome::Failed {
                reason: failure_reason(&outcome, limit, &err),
            }));
        }
        let stdout = fs::read_to_string(&out).unwrap_or_default();
        Ok(match BenchDoc::from_stdout(&stdout, ranks) {
            Ok(doc) if doc.transport != system.transport() => Err(RunOutcome::Failed {
                reason: format!(
                    "document says transport {:?}, expected {:?}",
                    doc.transport,
                    system.transport()
                ),
            }),
            Ok(doc) => Ok(doc),
            Err(e) => Err(RunOutcome::Failed {
                reason: with_stderr(format!("exited 0, but {e}"), &err),
            }),
        })
    }
}

/// Runs `cmd` with its output in the two files, under `limit`.
fn supervise(
    cmd: &mut Command,
    out: &PathBuf,
    err: &PathBuf,
    limit: Duration,
) -> Result<Outcome, PeerError> {
    let stdout =
        File::create(out).map_err(|e| PeerError::io(format!("create {}", out.display()), e))?;
    let stderr =
        File::create(err).map_err(|e| PeerError::io(format!("create {}", err.display()), e))?;
    cmd.stdout(stdout).stderr(stderr);
    run_in_session(cmd, limit)
}

/// Why a program that did not exit 0 failed, with the end of what it said on stderr.
fn failure_reason(outcome: &Outcome, limit: Duration, err: &PathBuf) -> String {
    let mut why = match outcome.ending {
        Ending::TimedOut => format!("timed out after {} s and was killed", limit.as_secs()),
        Ending::Exited(code) => format!("exited with status {code}"),
        Ending::Signaled(signal) => format!("was killed by signal {signal}"),
        Ending::Interrupted => "was stopped: the run was interrupted".to_owned(),
    };
    if outcome.stragglers > 0 {
        why.push_str(&format!(
            "; {} leftover processes were killed",
            outcome.stragglers
        ));
    }
    if !outcome.unkillable.is_empty() {
        why.push_str(&format!("; pids {:?} survived SIGKILL", outcome.unkillable));
    }
    with_stderr(why, err)
}

/// Appends the last few lines of a stderr log, where programs say what went wrong.
fn with_stderr(why: String, err: &PathBuf) -> String {
    let text = fs::read_to_string(err).unwrap_or_default();
    let tail: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let tail = tail[tail.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        return why;
    }
    let mut tail = tail;
    if tail.len() > 400 {
        let cut = (0..=400)
            .rev()
            .find(|&i| tail.is_char_boundary(i))
            .unwrap_or(0);
        tail.truncate(cut);
        tail.push('…');
    }
    format!("{why} (stderr: {tail})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::record::tests::{meta, temp_dir};
    use crate::peer::sweep::Bytes;
    use crate::peer::system::OpenMpi;

    fn plan(systems: Vec<System>) -> Plan {
        Plan {
            sweep: Sweep::QUICK,
            rounds: 2,
            ranks: vec![2, 4],
            systems,
            case_limit: Duration::from_secs(5),
            budget: Duration::from_secs(600),
        }
    }

    #[test]
    fn rounds_rotate_systems_and_alternate_rank_counts() {
        let p = plan(System::ALL.to_vec());
        let one = p.order(1);
        let n = System::ALL.len();
        assert_eq!(one.len(), 2 * n);
        assert_eq!(one[0], (2, System::ChorusTcp));
        assert_eq!(one[n], (4, System::ChorusTcp));
        let two = p.order(2);
        assert_eq!(two[0], (4, System::GlooTcp));
        assert_eq!(two[n - 1], (4, System::ChorusTcp));
        // n systems rotating and two directions alternating: the order repeats every
        // lcm(n, 2) rounds, and not before
        let period = if n.is_multiple_of(2) { n } else { 2 * n } as u32;
        assert_eq!(p.order(period + 1), p.order(1));
        assert_ne!(p.order(period), p.order(1));
    }

    /// A fake "system": a shell script standing in for mpirun, so the runner's handling of
    /// exits, hangs, garbage and good documents is tested without any peer installed.
    fn tools_with_fake_mpirun(dir: &std::path::Path, script: &str) -> Tools {
        let fake = dir.join("fake-mpirun");
        fs::write(&fake, format!("#!/bin/sh\n{script}\n")).unwrap();
        let mut perms = fs::metadata(&fake).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        fs::set_permissions(&fake, perms).unwrap();
        Tools {
            chorus: dir.join("no-chorus-here"),
            python: Err("torch is not installed".to_owned()),
            gloo_script: PathBuf::from("gloo_allreduce.py"),
            chorus_python: Err("the chorus package is not installed".to_owned()),
            chorus_py_script: PathBuf::from("chorus_py_allreduce.py"),
            open_mpi: Ok(OpenMpi {
                mpirun: fake,
                major: 4,
                version: "4.1.4".to_owned(),
            }),
            mpi_program: Ok(PathBuf::from("mpi_allreduce")),
            as_root: false,
        }
    }

    fn run_fake(name: &str, script: &str, limit: Duration) -> Vec<Record> {
        let mut p = plan(vec![System::ChorusTcp, System::GlooTcp, System::OpenMpiTcp]);
        p.case_limit = limit;
        run_plan(name, script, &p).0
    }

    /// Runs `p` with the fake mpirun `script` and no limit programs; the records, and the
    /// names of the log files the run wrote.
    fn run_plan(name: &str, script: &str, p: &Plan) -> (Vec<Record>, Vec<String>) {
        let dir = temp_dir(name);
        fs::create_dir_all(&dir).unwrap();
        let raw = RawDir::new(dir.join("raw"));
        raw.start(&meta()).unwrap();
        let tools = tools_with_fake_mpirun(&dir, script);
        let limits = LimitTools {
            memcpy: dir.join("no-memcpy"),
            tcp: PathBuf::from("false"),
        };
        let mut progress = Vec::new();
        Runner {
            plan: p,
            tools: &tools,
            limits: &limits,
            raw: &raw,
            progress: &mut progress,
        }
        .run()
        .unwrap();
        let (_, records) = raw.read().unwrap();
        let logs = fs::read_dir(dir.join("raw").join("logs"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let _ = fs::remove_dir_all(&dir);
        (records, logs)
    }

    fn runs(records: &[Record]) -> Vec<&RunRecord> {
        records
            .iter()
            .filter_map(|r| {
                if let Record::Run(x) = r {
                    Some(x)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn a_good_document_is_measured_in_every_round() {
        // Prints a valid document for whatever -n it was given ($2).
        let script = r#"printf '{"chorus_bench":1,"collective":"all-reduce","ranks":%s,"transport":"tcp","dtype":"float","op":"sum","warmup":2,"iters":5,"rows":[{"size":8,"count":2,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{"time_us":5.0,"algbw_gbs":0.0016,"busbw_gbs":0.0016,"wrong":0}}],"avg_busbw_gbs":0.0016}\n' "$2""#;
        let records = run_fake("good", script, Duration::from_secs(30));
        let mpi: Vec<_> = runs(&records)
            .into_iter()
            .filter(|r| r.system == System::OpenMpiTcp)
            .collect();
        assert_eq!(mpi.len(), 4, "2 rounds × 2 rank counts");
        assert!(
            mpi.iter()
                .all(|r| matches!(r.outcome, RunOutcome::Measured { .. })),
            "{mpi:?}"
        );
        assert!(mpi.iter().all(|r| r.elapsed_s > 0.0));
    }

    #[test]
    fn unavailable_systems_are_recorded_once_with_their_reason() {
        let records = run_fake("unavailable", "exit 0", Duration::from_secs(30));
        let chorus: Vec<_> = runs(&records)
            .into_iter()
            .filter(|r| r.system == System::ChorusTcp)
            .collect();
        assert_eq!(chorus.len(), 2, "once per rank count, not again in round 2");
        assert!(
            matches!(&chorus[0].outcome, RunOutcome::Unavailable { reason } if reason.contains("cargo build --release -p chorus-cli"))
        );
        let gloo = runs(&records)
            .into_iter()
            .find(|r| r.system == System::GlooTcp)
            .unwrap();
        assert!(
            matches!(&gloo.outcome, RunOutcome::Unavailable { reason } if reason == "torch is not installed")
        );
    }

    #[test]
    fn a_scaled_sweep_runs_each_leg_and_joins_their_rows() {
        // Prints a one-row document at the size it was given with -b, with the calls it
        // was given with -i as the time, so the joined rows show which leg made which.
        let script = r#"prev=; for a in "$@"; do [ "$prev" = "-b" ] && b=$a; [ "$prev" = "-i" ] && i=$a; prev=$a; done
case $b in *M) s=$(( ${b%M} * 1048576 ));; *K) s=$(( ${b%K} * 1024 ));; *) s=$b;; esac
printf '{"chorus_bench":1,"collective":"all-reduce","ranks":%s,"transport":"tcp","dtype":"float","op":"sum","warmup":1,"iters":%s,"rows":[{"size":%s,"count":%s,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{"time_us":%s,"algbw_gbs":1.0,"busbw_gbs":1.0,"wrong":0}}],"avg_busbw_gbs":1.0}\n' "$2" "$i" "$s" $((s / 4)) "$i""#;
        let mut p = plan(vec![System::OpenMpiTcp]);
        p.rounds = 1;
        p.ranks = vec![2];
        p.sweep = Sweep::new(Bytes(512 << 10), Bytes(2 << 20), 4, 1, 4)
            .unwrap()
            .scaled(true);
        let (records, logs) = run_plan("legs", script, &p);
        let second_leg_logged = logs.iter().any(|l| l == "r1-openmpi-tcp-leg2-n2.out");
        let run = runs(&records).into_iter().next().unwrap().clone();
        let RunOutcome::Measured { doc } = run.outcome else {
            panic!("{:?}", run.outcome);
        };
        let rows: Vec<(Bytes, f64)> = doc
            .rows
            .iter()
            .map(|r| (r.size, r.in_place.unwrap().time_us))
            .collect();
        let small = f64::from(4 * crate::peer::sweep::SMALL_CALLS);
        assert_eq!(rows, vec![(Bytes(512 << 10), small), (Bytes(2 << 20), 4.0)]);
        assert!(second_leg_logged);
    }

    #[test]
    fn a_silent_success_is_a_failure_not_a_result() {
        let records = run_fake(
            "silent",
            "echo 'all good' >&2; exit 0",
            Duration::from_secs(30),
        );
        let mpi = runs(&records)
            .into_iter()
            .find(|r| r.system == System::OpenMpiTcp)
            .unwrap();
        match &mpi.outcome {
            RunOutcome::Failed { reason } => {
                assert!(reason.contains("printed nothing on stdout"), "{reason}");
                assert!(reason.contains("stderr: all good"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_hung_peer_is_killed_reported_and_not_tried_again() {
        let started = Instant::now();
        let records = run_fake("hung", "sleep 600 & sleep 600", Duration::from_millis(300));
        let mpi: Vec<_> = runs(&records)
            .into_iter()
            .filter(|r| r.system == System::OpenMpiTcp)
            .collect();
        assert_eq!(mpi.len(), 2, "one per rank count, none in round 2");
        assert!(
            matches!(&mpi[0].outcome, RunOutcome::Failed { reason } if reason.contains("timed out after 0 s"))
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_crashing_peer_reports_its_status_and_stderr() {
        let records = run_fake(
            "crash",
            "echo 'mpirun noticed that process rank 1 exited on signal 11' >&2; exit 139",
            Duration::from_secs(30),
        );
        let mpi = runs(&records)
            .into_iter()
            .find(|r| r.system == System::OpenMpiTcp)
            .unwrap();
        assert!(
            matches!(&mpi.outcome, RunOutcome::Failed { reason } if reason.starts_with("exited with status 139") && reason.contains("signal 11")),
            "{:?}",
            mpi.outcome
        );
    }

    #[test]
    fn limits_that_cannot_run_are_recorded_as_failed() {
        let records = run_fake("limits", "exit 0", Duration::from_secs(30));
        let failed: Vec<_> = records
            .iter()
            .filter(|r| matches!(r, Record::LimitFailed { .. }))
            .collect();
        assert_eq!(failed.len(), 4, "memcpy and tcp, two rounds: {failed:?}");
    }

    #[test]
    fn a_spent_budget_skips_what_is_left() {
        let mut p = plan(vec![System::OpenMpiTcp]);
        p.budget = Duration::ZERO;
        let (records, _) = run_plan("budget", "exit 0", &p);
        let skipped = runs(&records)
            .into_iter()
            .filter(|r| matches!(r.outcome, RunOutcome::Skipped { .. }))
            .count();
        assert_eq!(skipped, 4);
    }
}
