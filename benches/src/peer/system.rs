//! The systems compared, and the command line that runs each one's sweep.

use std::path::PathBuf;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::peer::sweep::Sweep;

/// One column of the comparison: a library over one transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum System {
    /// `chorus bench all-reduce --transport tcp --json`.
    #[serde(rename = "chorus-tcp")]
    ChorusTcp,
    /// `chorus bench all-reduce --transport shm --json`: the same ranks through shared memory.
    #[serde(rename = "chorus-shm")]
    ChorusShm,
    /// The same sweep through chorus's Python package on numpy arrays
    /// (`benches/peer/chorus_py_allreduce.py`): chorus bench plus the Python call.
    #[serde(rename = "chorus-py")]
    ChorusPy,
    /// The gloo sweep through torch.distributed with the backend changed to chorus
    /// (`benches/peer/gloo_allreduce.py --backend chorus`, `chorus.torch`).
    #[serde(rename = "chorus-torch")]
    ChorusTorch,
    /// torch.distributed's gloo backend on 127.0.0.1.
    #[serde(rename = "gloo-tcp")]
    GlooTcp,
    /// Open MPI's `MPI_Allreduce` with `--mca btl tcp,self` on `lo`.
    #[serde(rename = "openmpi-tcp")]
    OpenMpiTcp,
    /// Open MPI's `MPI_Allreduce` with its shared-memory BTL (`vader`, `sm` from 5.0).
    #[serde(rename = "openmpi-shm")]
    OpenMpiShm,
}

impl System {
    /// Every system, in the order the tables show them (chorus (shm) beside Open MPI's shared
    /// memory; chorus (python) last: it is chorus again, plus the Python call).
    pub const ALL: [Self; 7] = [
        Self::ChorusTcp,
        Self::GlooTcp,
        Self::OpenMpiTcp,
        Self::OpenMpiShm,
        Self::ChorusShm,
        Self::ChorusPy,
        Self::ChorusTorch,
    ];

    /// The peers chorus is compared against.
    pub const PEERS: [Self; 3] = [Self::GlooTcp, Self::OpenMpiTcp, Self::OpenMpiShm];

    /// The pairs the ratio columns show, (chorus column, peer): chorus over TCP against
    /// every peer, chorus over shared memory against Open MPI's shared memory.
    pub const PAIRS: [(Self, Self); 4] = [
        (Self::ChorusTcp, Self::GlooTcp),
        (Self::ChorusTcp, Self::OpenMpiTcp),
        (Self::ChorusTcp, Self::OpenMpiShm),
        (Self::ChorusShm, Self::OpenMpiShm),
    ];

    /// Stable name used in file names and JSON.
    pub fn key(self) -> &'static str {
        match self {
            Self::ChorusTcp => "chorus-tcp",
            Self::ChorusShm => "chorus-shm",
            Self::ChorusPy => "chorus-py",
            Self::ChorusTorch => "chorus-torch",
            Self::GlooTcp => "gloo-tcp",
            Self::OpenMpiTcp => "openmpi-tcp",
            Self::OpenMpiShm => "openmpi-shm",
        }
    }

    /// Name in tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Self::ChorusTcp => "chorus (tcp)",
            Self::ChorusShm => "chorus (shm)",
            Self::ChorusPy => "chorus (python)",
            Self::ChorusTorch => "chorus (torch)",
            Self::GlooTcp => "Gloo (tcp)",
            Self::OpenMpiTcp => "Open MPI (tcp)",
            Self::OpenMpiShm => "Open MPI (shm)",
        }
    }

    /// The `transport` its documents must carry.
    pub fn transport(self) -> &'static str {
        match self {
            Self::OpenMpiShm | Self::ChorusShm => "shm",
            _ => "tcp",
        }
    }
}

/// Where the programs the systems run from are, as found on this machine. A `None` or a
/// missing file makes that system unavailable, with the reason given here.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `target/release/chorus`.
    pub chorus: PathBuf,
    /// The virtual environment's python with torch, or why there is none.
    pub python: Result<PathBuf, String>,
    /// `benches/peer/gloo_allreduce.py`.
    pub gloo_script: PathBuf,
    /// The virtual environment's python with the chorus package installed, or why there is
    /// none.
    pub chorus_python: Result<PathBuf, String>,
    /// `benches/peer/chorus_py_allreduce.py`.
    pub chorus_py_script: PathBuf,
    /// `mpirun` and what `mpirun --version` said, or why Open MPI cannot be used.
    pub open_mpi: Result<OpenMpi, String>,
    /// The compiled `benches/peer/mpi_allreduce.c`, or why there is none.
    pub mpi_program: Result<PathBuf, String>,
    /// mpirun refuses to run as root without `--allow-run-as-root`.
    pub as_root: bool,
}

/// An installed Open MPI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenMpi {
    pub mpirun: PathBuf,
    /// The major version: the shared-memory BTL is `vader` before 5 and `sm` from 5 on.
    pub major: u32,
    pub version: String,
}

impl OpenMpi {
    /// Reads `mpirun --version`'s first line, e.g. `mpirun (Open MPI) 4.1.4`.
    pub fn from_version_output(mpirun: PathBuf, output: &str) -> Option<Self> {
        let line = output.lines().find(|l| l.contains("Open MPI"))?;
        let version = line.rsplit(' ').next()?.trim().to_owned();
        let major = version.split('.').next()?.parse().ok()?;
        Some(Self {
            mpirun,
            major,
            version,
        })
    }

    fn shm_btl(&self) -> &'static str {
        if self.major >= 5 { "sm" } else { "vader" }
    }
}

impl Tools {
    /// The command that runs `system`'s whole sweep on `ranks` ranks, or why it cannot run.
    /// `limit_s` is the deadline the caller enforces; programs that can stop themselves
    /// earlier are told a little less, so they fail with their own message first.
    pub fn command(
        &self,
        system: System,
        ranks: u32,
        sweep: &Sweep,
        limit_s: u64,
    ) -> Result<Command, String> {
        let sizes = [
            "-b".to_owned(),
            sweep.min().arg(),
            "-e".to_owned(),
            sweep.max().arg(),
            "-f".to_owned(),
            sweep.factor().to_string(),
            "-w".to_owned(),
            sweep.warmup().to_string(),
            "-i".to_owned(),
            sweep.iters().to_string(),
        ];
        match system {
            System::ChorusTcp | System::ChorusShm => {
                if !self.chorus.is_file() {
                    return Err(format!(
                        "{} not found (build it: cargo build --release -p chorus-cli)",
                        self.chorus.display()
                    ));
                }
                let mut cmd = Command::new(&self.chorus);
                cmd.args(["bench", "all-reduce", "-n", &ranks.to_string()])
                    .args(&sizes)
                    .args(["--transport", system.transport(), "--json"]);
                Ok(cmd)
            }
            System::GlooTcp | System::ChorusPy | System::ChorusTorch => {
                let (python, script) = match system {
                    System::GlooTcp => (&self.python, &self.gloo_script),
                    System::ChorusPy => (&self.chorus_python, &self.chorus_py_script),
                    // torch and the chorus package, in the venv that has both.
                    _ => (&self.chorus_python, &self.gloo_script),
                };
                let python = python.as_ref().map_err(Clone::clone)?;
                let mut cmd = Command::new(python);
                // The Python columns measure the call's cost over `chorus bench`'s TCP
                // column (their targets compare the two), not the default transport.
                if system != System::GlooTcp {
                    cmd.env("CHORUS_TRANSPORT", "tcp");
                }
                cmd.arg(script);
                if system == System::ChorusTorch {
                    cmd.args(["--backend", "chorus"]);
                }
                cmd.args(["-n", &ranks.to_string()])
                    .args(&sizes)
                    .args(["--timeout", &limit_s.saturating_sub(10).max(10).to_string()]);
                Ok(cmd)
            }
            System::OpenMpiTcp | System::OpenMpiShm => {
                let mpi = self.open_mpi.as_ref().map_err(Clone::clone)?;
                let program = self.mpi_program.as_ref().map_err(Clone::clone)?;
                let mut cmd = Command::new(&mpi.mpirun);
                cmd.args([
                    "-n",
                    &ranks.to_string(),
                    "--oversubscribe",
                    "--bind-to",
                    "none",
                ]);
                if self.as_root {
                    cmd.arg("--allow-run-as-root");
                }
                // ob1 is the PML that uses the BTLs named here; left to itself Open MPI may
                // pick UCX and ignore them.
                cmd.args(["--mca", "pml", "ob1"]);
                if system == System::OpenMpiTcp {
                    cmd.args([
                        "--mca",
                        "btl",
                        "tcp,self",
                        "--mca",
                        "btl_tcp_if_include",
                        "lo",
                    ]);
                } else {
                    cmd.args(["--mca", "btl", &format!("self,{}", mpi.shm_btl())]);
                }
                cmd.arg(program)
                    .args(&sizes)
                    .args(["-t", system.transport()]);
                Ok(cmd)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Tools {
        Tools {
            chorus: PathBuf::from("/nonexistent/chorus"),
            python: Ok(PathBuf::from("/venv/bin/python")),
            gloo_script: PathBuf::from("benches/peer/gloo_allreduce.py"),
            chorus_python: Ok(PathBuf::from("/venv/bin/python")),
            chorus_py_script: PathBuf::from("benches/peer/chorus_py_allreduce.py"),
            open_mpi: OpenMpi::from_version_output(
                PathBuf::from("/usr/bin/mpirun"),
                "mpirun (Open MPI) 4.1.4\n\nReport bugs",
            )
            .ok_or_else(String::new),
            mpi_program: Ok(PathBuf::from("/out/mpi_allreduce")),
            as_root: true,
        }
    }

    fn argv(cmd: &Command) -> String {
        let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
        words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
        words.join(" ")
    }

    #[test]
    fn open_mpi_tcp_runs_on_loopback_with_the_tcp_btl_only() {
        let cmd = tools()
            .command(System::OpenMpiTcp, 4, &Sweep::QUICK, 120)
            .unwrap();
        assert_eq!(
            argv(&cmd),
            "/usr/bin/mpirun -n 4 --oversubscribe --bind-to none --allow-run-as-root --mca pml ob1 \
             --mca btl tcp,self --mca btl_tcp_if_include lo /out/mpi_allreduce -b 8 -e 16M -f 8 -w 2 -i 5 -t tcp"
        );
    }

    #[test]
    fn open_mpi_shm_names_the_btl_of_the_installed_version() {
        let mut t = tools();
        assert!(
            argv(&t.command(System::OpenMpiShm, 2, &Sweep::FULL, 300).unwrap())
                .contains("--mca btl self,vader ")
        );
        t.open_mpi =
            OpenMpi::from_version_output(PathBuf::from("mpirun"), "mpirun (Open MPI) 5.0.3")
                .ok_or_else(String::new);
        t.as_root = false;
        let line = argv(&t.command(System::OpenMpiShm, 2, &Sweep::FULL, 300).unwrap());
        assert!(line.contains("--mca btl self,sm "), "{line}");
        assert!(!line.contains("allow-run-as-root"), "{line}");
    }

    #[test]
    fn gloo_is_told_a_deadline_shorter_than_the_supervisors() {
        let line = argv(
            &tools()
                .command(System::GlooTcp, 2, &Sweep::FULL, 300)
                .unwrap(),
        );
        assert_eq!(
            line,
            "/venv/bin/python benches/peer/gloo_allreduce.py -n 2 -b 8 -e 128M -f 4 -w 5 -i 20 --timeout 290"
        );
    }

    #[test]
    fn chorus_python_runs_the_same_sweep_from_its_script() {
        let line = argv(
            &tools()
                .command(System::ChorusPy, 4, &Sweep::QUICK, 120)
                .unwrap(),
        );
        assert_eq!(
            line,
            "/venv/bin/python benches/peer/chorus_py_allreduce.py -n 4 -b 8 -e 16M -f 8 -w 2 -i 5 --timeout 110"
        );
        let mut t = tools();
        t.chorus_python = Err("the chorus package is not installed".to_owned());
        assert_eq!(
            t.command(System::ChorusPy, 2, &Sweep::QUICK, 60)
                .unwrap_err(),
            "the chorus package is not installed"
        );
    }

    #[test]
    fn chorus_gets_the_agreed_bench_command_once_built() {
        let err = tools()
            .command(System::ChorusTcp, 2, &Sweep::FULL, 300)
            .unwrap_err();
        assert!(err.contains("cargo build --release -p chorus-cli"), "{err}");
        let mut t = tools();
        t.chorus = std::env::current_exe().unwrap();
        let line = argv(&t.command(System::ChorusTcp, 4, &Sweep::QUICK, 120).unwrap());
        assert!(
            line.ends_with(
                " bench all-reduce -n 4 -b 8 -e 16M -f 8 -w 2 -i 5 --transport tcp --json"
            ),
            "{line}"
        );
        let line = argv(&t.command(System::ChorusShm, 2, &Sweep::QUICK, 120).unwrap());
        assert!(
            line.ends_with(
                " bench all-reduce -n 2 -b 8 -e 16M -f 8 -w 2 -i 5 --transport shm --json"
            ),
            "{line}"
        );
    }

    #[test]
    fn the_python_columns_stay_on_tcp_whatever_the_default() {
        for system in [System::ChorusPy, System::ChorusTorch] {
            let cmd = tools().command(system, 2, &Sweep::QUICK, 60).unwrap();
            let transport = cmd
                .get_envs()
                .find(|(k, _)| *k == "CHORUS_TRANSPORT")
                .and_then(|(_, v)| v);
            assert_eq!(transport, Some(std::ffi::OsStr::new("tcp")), "{system:?}");
        }
        let gloo = tools()
            .command(System::GlooTcp, 2, &Sweep::QUICK, 60)
            .unwrap();
        assert_eq!(gloo.get_envs().count(), 0);
    }

    #[test]
    fn missing_peers_carry_the_reason_found_when_looking_for_them() {
        let mut t = tools();
        t.python = Err("torch is not installed".to_owned());
        t.mpi_program = Err("mpicc failed".to_owned());
        assert_eq!(
            t.command(System::GlooTcp, 2, &Sweep::QUICK, 60)
                .unwrap_err(),
            "torch is not installed"
        );
        assert_eq!(
            t.command(System::OpenMpiShm, 2, &Sweep::QUICK, 60)
                .unwrap_err(),
            "mpicc failed"
        );
    }

    #[test]
    fn open_mpi_versions_parse() {
        let mpi =
            OpenMpi::from_version_output(PathBuf::from("m"), "mpirun (Open MPI) 4.1.4\n").unwrap();
        assert_eq!((mpi.major, mpi.version.as_str()), (4, "4.1.4"));
        assert_eq!(
            OpenMpi::from_version_output(PathBuf::from("m"), "HYDRA build details:"),
            None
        );
    }
}
