//! `Gpu`: one CUDA device as this process uses it — its primary context, its properties and
//! the loaded kernels. Opened once per ordinal and shared by every rank (thread) on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use parking_lot::Mutex;

use crate::cache::{self, Key};
use crate::compile;
use crate::error::CudaError;
use crate::kernels::Kernels;
use crate::pool::MemPool;
use crate::probe;
use crate::source;

/// One CUDA device, opened.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    ordinal: usize,
    name: String,
    uuid: [u8; 16],
    capability: (u32, u32),
    sm_count: u32,
    nvrtc: (u32, u32),
    pub(crate) kernels: Kernels,
    /// Where every stream-ordered allocation comes from.
    pub(crate) pool: MemPool,
    /// Streams this process has made on the device (each rank: one main stream, two per
    /// device link), against the hardware queues they map onto.
    streams: AtomicUsize,
    queues: usize,
}

/// The hardware queues streams map onto unless `CUDA_DEVICE_MAX_CONNECTIONS` says otherwise.
pub const DEFAULT_HARDWARE_QUEUES: usize = 8;

/// The hardware queues the driver gives a context, from `CUDA_DEVICE_MAX_CONNECTIONS` as
/// the driver reads it (1 to 32; 8 when unset or unreadable).
pub fn hardware_queues(var: Option<&str>) -> usize {
    var.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=32).contains(n))
        .unwrap_or(DEFAULT_HARDWARE_QUEUES)
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("capability", &self.capability)
            .field("sm_count", &self.sm_count)
            .finish()
    }
}

impl Gpu {
    /// The device `ordinal`, opened once per process (later calls share it). Fails with
    /// [`CudaError::DeviceUnavailable`] when there is no driver, no NVRTC or no such device.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let open = OPEN.get_or_init(Default::default);
        let mut map = open.lock();
        if let Some(gpu) = map.get(&ordinal) {
            return Ok(gpu.clone());
        }
        let gpu = Arc::new(Self::open_uncached(ordinal)?);
        map.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    /// How many CUDA devices there are (0 without a driver).
    pub fn count() -> Result<usize, CudaError> {
        probe::libraries()?;
        match result::init() {
            Ok(()) => {}
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
            Err(e) => return Err(unavailable("cuInit", e)),
        }
        let n =
            result::device::get_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
        Ok(n.max(0) as usize)
    }

    fn open_uncached(ordinal: usize) -> Result<Gpu, CudaError> {
        let count = Self::count()?;
        if ordinal >= count {
            return Err(CudaError::DeviceUnavailable(format!(
                "no CUDA device {ordinal} (this machine has {count})"
            )));
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: this crate never uses cudarc's CudaSlice; it orders every buffer itself
        // with streams and events, so cudarc's per-slice event tracking would only cost.
        unsafe { ctx.disable_event_tracking() };
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))
                .map(|v| v.max(0) as u32)
        };
        use sys::CUdevice_attribute_enum as A;
        let capability = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1);
        if attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? == 0 {
            return Err(CudaError::DeviceUnavailable(format!(
                "cuda:{ordinal} cannot map host memory, which aborting device waits needs"
            )));
        }
        if attr(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? == 0 {
            return Err(CudaError::DeviceUnavailable(format!(
                "cuda:{ordinal} has no unified addressing"
            )));
        }
        let name = ctx
            .name()
            .map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
        let uuid = ctx
            .uuid()
            .map_err(|e| CudaError::driver("cuDeviceGetUuid", e))?;
        let uuid: [u8; 16] = uuid.bytes.map(|b| b as u8);
        let pool = MemPool::new(&ctx)?;

        let nvrtc = compile::nvrtc_version()?;
        let target =
            compile::choose_target(capability.0, capability.1, &compile::supported_archs()?)?;
        let key = Key::new(source::hash(), target, nvrtc, compile::fp8_hardware(target));
        let (image, fp8_hw) = cache::get_or_compile(&key, &source::unit())?;
        let kernels = Kernels::load(&ctx, &image, sm_count)?;
        tracing::debug!(ordinal, %name, %target, fp8_hw, "opened gpu");
        Ok(Gpu {
            ctx,
            ordinal,
            name,
            uuid,
            capability,
            sm_count,
            nvrtc,
            kernels,
            pool,
            streams: AtomicUsize::new(0),
            queues: hardware_queues(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().as_deref()),
        })
    }

    /// A new stream on this device. Past the hardware queues, streams share queues and a
    /// kernel can wait behind another stream's: harmless for correctness, since no device
    /// wait is queued before the work that ends it (`credit.rs`), but the links' copies may
    /// then run one after another; said once, with the variable that sizes the queues.
    pub(crate) fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
        if self.streams.fetch_add(1, Ordering::Relaxed) == self.queues {
            tracing::info!(
                ordinal = self.ordinal,
                queues = self.queues,
                "more streams than hardware queues; CUDA_DEVICE_MAX_CONNECTIONS=32 (set before \
                 the process starts) gives each rank's links queues of their own"
            );
        }
        Ok(stream)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Compute capability `(major, minor)`.
    pub fn capability(&self) -> (u32, u32) {
        self.capability
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// NVRTC's version.
    pub fn nvrtc_version(&self) -> (u32, u32) {
        self.nvrtc
    }

    /// Make this device's context current on the calling thread. An error a destructor
    /// stored earlier is logged first (see [`Gpu::take_stored_error`]), so it never fails
    /// this call, which has nothing to do with it.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.take_stored_error("an earlier CUDA destructor");
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }

    /// cudarc's destructors (streams, events) cannot return their errors: they store them in
    /// the context, and the next cudarc call that checks (`bind_to_thread` among them) would
    /// fail with an error that is not its own. Take any stored error and log it as `what`'s:
    /// called right after dropping such objects, it names them; from `bind`, it says only
    /// that some earlier destructor failed.
    pub(crate) fn take_stored_error(&self, what: &str) {
        if let Err(e) = self.ctx.check_err() {
            tracing::warn!(ordinal = self.ordinal, error = %e, "{what} failed");
        }
    }
}

fn unavailable(call: &str, e: cudarc::driver::DriverError) -> CudaError {
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    CudaError::DeviceUnavailable(format!("{call} failed: {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_a_destructor_stored_does_not_fail_the_next_call() {
        let Some(gpu) = crate::testing::gpu_or_skip("GPU tests") else {
            return;
        };
        gpu.ctx.record_err::<()>(Err(cudarc::driver::DriverError(
            sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
        )));
        gpu.bind().unwrap();
        assert!(gpu.ctx.check_err().is_ok(), "the stored error was taken");
    }

    #[test]
    fn the_hardware_queues_follow_the_variable_as_the_driver_reads_it() {
        assert_eq!(hardware_queues(None), 8);
        assert_eq!(hardware_queues(Some("32")), 32);
        assert_eq!(hardware_queues(Some(" 4 ")), 4);
        assert_eq!(hardware_queues(Some("0")), 8, "out of the driver's range");
        assert_eq!(hardware_queues(Some("64")), 8);
        assert_eq!(hardware_queues(Some("many")), 8);
    }
}
