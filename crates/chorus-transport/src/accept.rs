//! The bounded wait for the next authenticated connection, shared by every listener.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::TransportError;

/// The next connection from `incoming`, waiting at most `timeout` (principle 3: an accept
/// is a wait like any other). `what` names the wait in the error, e.g. `"accept"`.
pub(crate) async fn next_within<T>(
    incoming: &mut mpsc::Receiver<T>,
    timeout: Duration,
    what: &'static str,
) -> Result<T, TransportError> {
    match tokio::time::timeout(timeout, incoming.recv()).await {
        Ok(Some(conn)) => Ok(conn),
        Ok(None) => Err(TransportError::Shutdown),
        Err(_) => Err(TransportError::Io {
            what,
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no authenticated connection within {timeout:?}"),
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_accept_ends_by_its_timeout_and_names_its_wait() {
        let (_tx, mut rx) = mpsc::channel::<u32>(1);
        let started = std::time::Instant::now();
        let err = next_within(&mut rx, Duration::from_millis(20), "accept")
            .await
            .expect_err("nothing was sent");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(err, TransportError::Io { what: "accept", .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_closed_listener_is_shutdown_and_a_queued_connection_is_taken() {
        let (tx, mut rx) = mpsc::channel::<u32>(1);
        tx.send(7).await.expect("room for one");
        assert_eq!(
            next_within(&mut rx, Duration::from_secs(1), "accept")
                .await
                .expect("queued"),
            7
        );
        drop(tx);
        assert!(matches!(
            next_within(&mut rx, Duration::from_secs(1), "accept").await,
            Err(TransportError::Shutdown)
        ));
    }
}
