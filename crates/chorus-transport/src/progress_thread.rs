//! A progress thread running a current-thread tokio runtime: the epoll backend's links,
//! connection set-up for both TCP backends, and QUIC run here, never on the caller's
//! executor, so user code (or an embedding interpreter) cannot starve them.

use std::future::Future;
use std::sync::mpsc;
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use crate::error::TransportError;

/// How long dropping the progress thread waits for it to finish before detaching it.
const STOP_BUDGET: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(crate) struct ProgressThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    done: parking_lot::Mutex<mpsc::Receiver<()>>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

impl ProgressThread {
    pub(crate) fn start(name: &str) -> Result<Self, TransportError> {
        let rt = Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(TransportError::io("tokio runtime"))?;
        let handle = rt.handle().clone();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                // Tasks still running (links whose owner leaked them) are dropped, which
                // drops their sockets; bounded so shutdown cannot hang.
                rt.shutdown_timeout(Duration::from_millis(500));
                let _ = done_tx.send(());
            })
            .map_err(TransportError::io("spawn progress thread"))?;
        Ok(Self {
            handle,
            stop: Some(stop),
            done: parking_lot::Mutex::new(done),
            thread_id: thread.thread().id(),
            thread: Some(thread),
        })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `f` on the progress thread and waits for it from any executor.
    pub(crate) async fn run<F>(&self, f: F) -> Result<F::Output, TransportError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle
            .spawn(f)
            .await
            .map_err(|_| TransportError::Shutdown)
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if thread::current().id() == self.thread_id {
            return; // dropped from one of our own tasks: the thread finishes on its own
        }
        if self.done.lock().recv_timeout(STOP_BUDGET).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        } else {
            tracing::warn!("progress thread did not stop within {STOP_BUDGET:?}; detached");
        }
    }
}
