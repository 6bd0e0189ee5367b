//! Ordering a rank's work against a stream the caller owns (a framework's current stream,
//! NCCL's `stream` argument): [`CallerStream`], and the two event edges between it and the
//! device's main stream. Neither waits on the host nor synchronises the device.

use cudarc::driver::{result, sys};

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::sync;

/// A CUDA stream the caller owns, by its raw handle (`cudaStream_t`, torch's
/// `torch.cuda.current_stream().cuda_stream`); `0` is the legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerStream(usize);

impl CallerStream {
    /// The stream whose handle is `handle`.
    ///
    /// # Safety
    /// `handle` must be `0` or a stream of the device's primary context (the one frameworks
    /// use), not destroyed while any call given it runs.
    pub unsafe fn from_raw(handle: usize) -> CallerStream {
        CallerStream(handle)
    }

    /// The raw handle.
    pub fn raw(&self) -> usize {
        self.0
    }

    fn cu(&self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

impl CudaDevice {
    /// Work this rank queues from now on runs after everything already queued on `stream`:
    /// an event recorded on `stream` that the main stream waits on.
    pub fn order_after(&self, stream: &CallerStream) -> Result<(), CudaError> {
        let gpu = self.gpu();
        gpu.bind()?;
        let event = gpu
            .ctx
            .new_event(None)
            .map_err(|e| CudaError::driver("cuEventCreate", e))?;
        // SAFETY: the event is live; `stream` is a stream of this context (`from_raw`'s
        // contract).
        unsafe { result::event::record(event.cu_event(), stream.cu()) }
            .map_err(|e| CudaError::driver("cuEventRecord", e))?;
        self.inner
            .stream
            .wait(&event)
            .map_err(|e| CudaError::driver("cuStreamWaitEvent", e))
    }

    /// Work queued on `stream` from now on runs after everything this rank has queued on
    /// its main stream so far: the completion of an operation, recorded on the caller's
    /// stream.
    pub fn complete_on(&self, stream: &CallerStream) -> Result<(), CudaError> {
        self.gpu().bind()?;
        let done = sync::mark(&self.inner.stream)?;
        // SAFETY: the event is live until after the call (the driver keeps what the wait
        // needs); `stream` is a stream of this context.
        unsafe {
            result::stream::wait_event(
                stream.cu(),
                done.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| CudaError::driver("cuStreamWaitEvent", e))
    }
}
