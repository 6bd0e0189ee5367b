//! The job token on disk: node 0's launcher writes it (it holds the job secret), the other
//! nodes' launchers read it from a shared filesystem, as Slurm jobs have one.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use chorus::UniqueId;

/// How often a waiting reader looks at the file again.
const POLL: Duration = Duration::from_millis(100);

/// Writes `token` to `path`: readable by its owner only, written whole under a temporary
/// name and renamed, so a reader never sees half a token.
pub(crate) fn write(path: &Path, token: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // `mode` applies only when the file is created; a leftover keeps its own.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(token.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Why no token could be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenWaitError {
    #[error("no token in {path} after {waited:?} (is node 0 started, on a shared filesystem?)")]
    Missing { path: String, waited: Duration },
    #[error("{path} is readable by others (mode {mode:o}); it holds the job secret: chmod 600")]
    Exposed { path: String, mode: u32 },
    #[error("{path} holds no job token: {why}")]
    Invalid { path: String, why: String },
    #[error("the token in {path} names the root {found}, not the master {master} (a stale file?)")]
    Elsewhere {
        path: String,
        found: SocketAddr,
        master: SocketAddr,
    },
}

/// Reads the token node 0 writes to `path`, waiting for it until `deadline`. A file that
/// is there but names another root is waited past too (node 0 may not have replaced a
/// stale one yet); at the deadline the last reason is the error.
pub(crate) fn wait_for(
    path: &Path,
    master: SocketAddr,
    deadline: Instant,
) -> Result<UniqueId, TokenWaitError> {
    let started = Instant::now();
    loop {
        let last = match read(path, master) {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => TokenWaitError::Missing {
                path: path.display().to_string(),
                waited: started.elapsed(),
            },
            Err(e @ TokenWaitError::Elsewhere { .. }) => e,
            Err(e) => return Err(e),
        };
        if Instant::now() + POLL > deadline {
            return Err(last);
        }
        std::thread::sleep(POLL);
    }
}

/// One look at the file: `None` while it is not there (or empty: being replaced).
fn read(path: &Path, master: SocketAddr) -> Result<Option<UniqueId>, TokenWaitError> {
    let shown = || path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) => return Ok(None),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenWaitError::Exposed {
            path: shown(),
            mode,
        });
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let id = UniqueId::parse(text.trim()).map_err(|e| TokenWaitError::Invalid {
        path: shown(),
        why: e.to_string(),
    })?;
    if id.root != master {
        return Err(TokenWaitError::Elsewhere {
            path: shown(),
            found: id.root,
            master,
        });
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("chorus-token-{}-{name}", std::process::id()))
    }

    fn token(root: &str) -> UniqueId {
        let addr: SocketAddr = root.parse().unwrap();
        let config = chorus::Config::default();
        let host = chorus::RootHost::start(addr, 1, &config).unwrap();
        host.unique_id().clone()
    }

    #[test]
    fn a_written_token_is_private_and_read_back_whole() {
        let path = temp("roundtrip");
        let id = token("127.0.0.1:0");
        write(&path, &id.to_token()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let deadline = Instant::now() + Duration::from_secs(1);
        let back = wait_for(&path, id.root, deadline).unwrap();
        assert_eq!(back.to_token(), id.to_token());
        // A token for another root is a stale file, named as such at the deadline.
        let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let err = wait_for(&path, other, Instant::now()).unwrap_err();
        assert!(matches!(err, TokenWaitError::Elsewhere { .. }), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = wait_for(&path, id.root, deadline).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_reader_waits_for_the_file_but_not_past_its_deadline() {
        let path = temp("late");
        let id = token("127.0.0.1:0");
        let started = Instant::now();
        let err = wait_for(&path, id.root, started + Duration::from_millis(300)).unwrap_err();
        assert!(matches!(err, TokenWaitError::Missing { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let (writer_path, text) = (path.clone(), id.to_token());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            write(&writer_path, &text).unwrap();
        });
        let back = wait_for(&path, id.root, Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(back.root, id.root);
        writer.join().unwrap();
        std::fs::write(&path, "not a token").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = wait_for(&path, id.root, Instant::now()).unwrap_err();
        assert!(matches!(err, TokenWaitError::Invalid { .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
