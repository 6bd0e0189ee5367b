//! The blocking twins of [`Comm`]'s calls, for code without an executor: each runs its
//! async call to completion on the calling thread. Every wait stays bounded: the async
//! calls' deadlines are kept by the control thread's clock, not the caller's executor.

use chorus_engine::{Op, Reduction};

use super::Comm;
use crate::config::Config;
use crate::element::Element;
use crate::error::Result;
use crate::unique_id::UniqueId;

/// Blocking twins of [`Comm`]'s calls, for code without an executor.
#[derive(Debug, Clone, Copy)]
pub struct Blocking<'a>(pub(super) &'a Comm);

/// Writes `Blocking::$name`, the blocking twin of `Comm::$name`, for each signature.
macro_rules! twins {
    ($( fn $name:ident $(<$t:ident: $bound:ident>)? ($($arg:ident: $ty:ty),*) -> $out:ty; )*) => {
        impl Blocking<'_> {
            $(
                #[doc = concat!("The blocking twin of [`Comm::", stringify!($name), "`].")]
                pub fn $name $(<$t: $bound>)? (&self, $($arg: $ty),*) -> $out {
                    block_on(std::pin::pin!(self.0.$name($($arg),*)))
                }
            )*
        }
    };
}

twins! {
    fn all_reduce<T: Element>(send: &[T], recv: &mut [T], op: Reduction) -> Result<()>;
    fn all_reduce_in_place<T: Element>(buf: &mut [T], op: Reduction) -> Result<()>;
    fn reduce<T: Element>(send: &[T], recv: &mut [T], op: Reduction, root: u32) -> Result<()>;
    fn broadcast<T: Element>(buf: &mut [T], root: u32) -> Result<()>;
    fn all_gather<T: Element>(send: &[T], recv: &mut [T]) -> Result<()>;
    fn reduce_scatter<T: Element>(send: &[T], recv: &mut [T], op: Reduction) -> Result<()>;
    fn all_to_all<T: Element>(send: &[T], recv: &mut [T]) -> Result<()>;
    fn gather<T: Element>(send: &[T], recv: &mut [T], root: u32) -> Result<()>;
    fn scatter<T: Element>(send: &[T], recv: &mut [T], root: u32) -> Result<()>;
    fn send<T: Element>(buf: &[T], peer: u32) -> Result<()>;
    fn recv<T: Element>(buf: &mut [T], peer: u32) -> Result<()>;
    fn barrier() -> Result<()>;
    fn run(op: Op<'_, [u8]>) -> Result<()>;
    fn group(ops: Vec<Op<'_, [u8]>>) -> Result<()>;
    fn revoke() -> Result<()>;
    fn shrink() -> Result<Comm>;
    fn grow(joiners: u32) -> Result<Comm>;
    fn split(color: Option<u32>, key: u32) -> Result<Option<Comm>>;
}

/// Blocking constructors and teardown (they own or consume the communicator).
impl Comm {
    /// The blocking twin of [`Comm::init`].
    pub fn init_blocking(id: &UniqueId, rank: u32, world: u32, config: Config) -> Result<Comm> {
        block_on(Comm::init(id, rank, world, config))
    }

    /// The blocking twin of [`Comm::from_env`].
    pub fn from_env_blocking(config: Config) -> Result<Comm> {
        block_on(Comm::from_env(config))
    }

    /// The blocking twin of [`Comm::join`].
    pub fn join_blocking(token: &UniqueId, config: Config) -> Result<Comm> {
        block_on(Comm::join(token, config))
    }

    /// The blocking twin of [`Comm::destroy`].
    pub fn destroy_blocking(self) -> Result<()> {
        block_on(self.destroy())
    }
}

/// Runs `f` to its end on this thread. The twins pin their future where it was made and
/// hand over only the pointer: a collective's future is a few kilobytes, and moving it into
/// the executor was a measurable share of a small call.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}
