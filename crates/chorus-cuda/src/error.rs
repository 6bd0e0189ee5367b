//! `CudaError`: what can go wrong on this floor, and how it reaches the engine.

use std::time::Duration;

use chorus_engine::device::DeviceError;
use chorus_protocol::Rank;

/// Why a GPU operation failed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable driver, NVRTC or device on this machine. Detected before cudarc is asked to
    /// load anything, because cudarc panics on a missing library.
    #[error("device unavailable: {0}")]
    DeviceUnavailable(String),
    /// A driver call returned an error.
    #[error("{call} failed: {detail}")]
    Driver { call: &'static str, detail: String },
    /// NVRTC rejected the kernel sources.
    #[error("nvrtc could not compile the kernels for {target}: {log}")]
    Compile { target: String, log: String },
    /// A bounded wait on the device passed its deadline; the work is still queued.
    #[error("{what} did not finish within {waited:?}")]
    Timeout { what: String, waited: Duration },
    /// A bounded wait on the device was given up because the operation it served was
    /// aborted; the work is still queued (aborting the links retires it).
    #[error("{what} abandoned: the operation was aborted")]
    Abandoned { what: String },
    /// Work since the last synchronisation included waits retired by an abort: the output
    /// holds partial data.
    #[error("{what} aborted: a wait for {peer} was retired before the peer's data arrived")]
    Aborted { what: String, peer: Rank },
    /// An argument is outside what the device accepts.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Setting up a device link failed.
    #[error("link to {peer}: {detail}")]
    Link { peer: Rank, detail: String },
    /// Allocation failed.
    #[error("cannot allocate {bytes} bytes: {detail}")]
    OutOfMemory { bytes: usize, detail: String },
}

impl CudaError {
    /// Wrap a driver error from cudarc with the call that returned it.
    pub(crate) fn driver(call: &'static str, err: cudarc::driver::DriverError) -> Self {
        let name = err
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", err.0));
        CudaError::Driver { call, detail: name }
    }
}

impl From<CudaError> for DeviceError {
    fn from(err: CudaError) -> Self {
        match err {
            CudaError::DeviceUnavailable(detail) => DeviceError::Unavailable(detail),
            CudaError::OutOfMemory { bytes, detail } => DeviceError::OutOfMemory { bytes, detail },
            e @ (CudaError::Timeout { .. }
            | CudaError::Aborted { .. }
            | CudaError::Abandoned { .. }) => DeviceError::Wait(e.to_string()),
            other => DeviceError::Unavailable(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_maps_to_the_engine_unavailable_error() {
        let e = CudaError::DeviceUnavailable("no libcuda".into());
        assert_eq!(e.to_string(), "device unavailable: no libcuda");
        assert_eq!(
            DeviceError::from(e),
            DeviceError::Unavailable("no libcuda".into())
        );
    }

    #[test]
    fn waits_map_to_the_engine_wait_error_and_name_the_wait() {
        let e = CudaError::Timeout {
            what: "stream synchronize on cuda:0".into(),
            waited: Duration::from_millis(5),
        };
        let DeviceError::Wait(text) = DeviceError::from(e) else {
            panic!("not a wait error");
        };
        assert!(text.contains("stream synchronize on cuda:0"), "{text}");
        let e = CudaError::Aborted {
            what: "stream synchronize".into(),
            peer: Rank(3),
        };
        assert!(e.to_string().contains("r3"), "{e}");
    }
}
