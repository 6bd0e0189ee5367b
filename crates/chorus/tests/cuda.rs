//! Device memory through `Comm` (the `cuda` feature), ranks as threads of one process over
//! the real runtime: without CUDA every member gets a prompt `[chorus:device]` error; with
//! a GPU, all-reduce on device buffers ordered on the caller's stream at 2 and 4 ranks, and
//! an abort while a member waits on a peer that never joins the operation, after which the
//! stream drains at once and a fresh communicator on the same context is correct. Without a
//! GPU the GPU tests print one line saying what they skipped and why.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::thread;
use std::time::{Duration, Instant};

use chorus::cuda::{CudaComm, CudaOptions, Stream};
use chorus::{Buffer, Comm, Config, DType, ErrorKind, Reduction, RootHost};
use chorus_cuda::CudaDevice;
use chorus_cuda::testing::gpu_or_skip;
use futures::executor::block_on;

const T: Duration = Duration::from_secs(20);

fn config() -> Config {
    let mut config = Config::default();
    config.init_timeout = Duration::from_secs(30);
    config
}

fn run_ranks<T: Send>(world: u32, f: impl Fn(Comm) -> T + Sync) -> Vec<T> {
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &config()).unwrap();
    let id = root.unique_id().clone();
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (id, f) = (id.clone(), &f);
                s.spawn(move || f(Comm::init_blocking(&id, r, world, config()).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The legacy default stream: every test here orders on it.
fn default_stream() -> Stream {
    // SAFETY: 0 is the legacy default stream, valid in every context.
    unsafe { Stream::from_raw(0) }
}

#[test]
fn without_a_usable_device_every_member_gets_a_device_error_promptly() {
    if CudaDevice::new(0).is_ok() {
        eprintln!("skipped: the no-device answer of Comm::cuda: this machine has a GPU");
        return;
    }
    let started = Instant::now();
    let out = run_ranks(2, |comm| {
        let err = block_on(comm.cuda(0)).unwrap_err();
        // With device links asked for too: the same answer, and no rendezvous left waiting.
        let linked = CudaOptions {
            device_links: true,
            ..CudaOptions::default()
        };
        let again = block_on(comm.cuda_with(0, &linked)).unwrap_err();
        assert_eq!(again.kind(), ErrorKind::Device, "{again}");
        // The host communicator is still usable: only the device split failed.
        let mut x = [1.0f32; 4];
        comm.blocking()
            .all_reduce_in_place(&mut x, Reduction::Sum)
            .unwrap();
        comm.destroy_blocking().unwrap();
        (err, x[0])
    });
    for (err, sum) in out {
        assert_eq!(err.kind(), ErrorKind::Device, "{err}");
        let text = err.to_string();
        assert!(text.starts_with("[chorus:device]"), "{text}");
        assert!(text.contains("device unavailable"), "{text}");
        assert_eq!(sum, 2.0);
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// Rank `r`'s device communicator on GPU 0, and that device for staging test data.
fn on_gpu(comm: &Comm) -> (CudaComm, CudaDevice) {
    on_gpu_with(comm, &CudaOptions::default())
}

fn on_gpu_with(comm: &Comm, options: &CudaOptions) -> (CudaComm, CudaDevice) {
    (
        block_on(comm.cuda_with(0, options)).unwrap(),
        CudaDevice::new(0).unwrap(),
    )
}

fn all_reduce_on_the_callers_stream(world: u32) {
    all_reduce_with(world, &CudaOptions::default());
}

fn all_reduce_with(world: u32, options: &CudaOptions) {
    if gpu_or_skip("Comm::cuda GPU tests").is_none() {
        return;
    }
    let n = 1 << 18;
    let sums = run_ranks(world, |comm| {
        let (cuda, dev) = on_gpu_with(&comm, options);
        let r = comm.rank() as f32;
        let data: Vec<u8> = (0..n).flat_map(|i| (r + i as f32).to_le_bytes()).collect();
        let mut buf = dev.buffer(data.len()).unwrap();
        dev.upload(&mut buf, 0, &data, T).unwrap();
        let stream = default_stream();
        block_on(cuda.all_reduce(
            Buffer::InPlace(&mut buf),
            n,
            DType::F32,
            Reduction::Sum,
            &stream,
        ))
        .unwrap();
        let out = dev.download(&buf, 0, data.len(), T).unwrap();
        block_on(cuda.destroy()).unwrap();
        comm.destroy_blocking().unwrap();
        out
    });
    let ranks: f32 = (0..world).map(|r| r as f32).sum();
    for out in sums {
        for (i, c) in out.chunks_exact(4).enumerate().step_by(997) {
            let got = f32::from_le_bytes(c.try_into().unwrap());
            assert_eq!(got, ranks + world as f32 * i as f32, "element {i}");
        }
    }
}

#[test]
fn all_reduce_on_device_memory_at_2_ranks() {
    all_reduce_on_the_callers_stream(2);
}

#[test]
fn all_reduce_on_device_memory_at_4_ranks() {
    all_reduce_on_the_callers_stream(4);
}

#[test]
fn all_reduce_over_device_links_between_members_on_one_gpu_at_4_ranks() {
    let options = CudaOptions {
        device_links: true,
        ..CudaOptions::default()
    };
    all_reduce_with(4, &options);
}

#[test]
fn an_abort_ends_a_device_operation_the_stream_drains_and_a_fresh_communicator_works() {
    if gpu_or_skip("Comm::cuda GPU tests").is_none() {
        return;
    }
    // Rank 1 stays until rank 0 has aborted: its leaving would end rank 0's wait first.
    let aborted = std::sync::Barrier::new(2);
    let out = run_ranks(2, |comm| {
        let (cuda, dev) = on_gpu(&comm);
        let stream = default_stream();
        let mut buf = dev.buffer(4 << 20).unwrap();
        let mut took = Duration::ZERO;
        if comm.rank() == 0 {
            // Rank 1 never joins this all-reduce: rank 0 waits on it until its abort.
            thread::scope(|s| {
                let op = s.spawn(|| {
                    let r = block_on(cuda.all_reduce(
                        Buffer::InPlace(&mut buf),
                        1 << 20,
                        DType::F32,
                        Reduction::Sum,
                        &stream,
                    ));
                    (r, Instant::now())
                });
                thread::sleep(Duration::from_millis(200));
                assert!(!op.is_finished(), "finished without its peer");
                let at = Instant::now();
                cuda.abort("test abort");
                let (r, done) = op.join().unwrap();
                let err = r.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Aborted, "{err}");
                took = done.saturating_duration_since(at);
            });
            // Everything the communicator queued (what the caller's stream waits on) has
            // run within 10 ms of the abort's return.
            let drained = Instant::now();
            cuda.synchronize(Duration::from_millis(10)).unwrap();
            eprintln!(
                "stream drained {:?} after the abort returned",
                drained.elapsed()
            );
            dev.synchronize(T).unwrap();
        }
        aborted.wait();
        drop(buf);
        drop(cuda);
        comm.abort("test over");
        took
    });
    eprintln!("abort to return: {:?}", out[0]);
    assert!(out[0] < Duration::from_millis(100), "{:?}", out[0]);
    // The same device context, a fresh communicator: correct again.
    all_reduce_on_the_callers_stream(2);
}
