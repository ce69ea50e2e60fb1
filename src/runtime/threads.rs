//! The host worker-thread count: one setting per process (`moeplug_set_num_threads`), read by
//! every parallel host loop (prep steps, MX quantization, the CPU backend). No environment
//! variable: an engine sets it through the API, next to its own thread pool settings.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// More workers than this is a caller's mistake, not a machine (and keeps `u32` exact).
pub const MAX_THREADS: usize = 4096;

/// 0 = every core the process may use.
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// Worker threads host work uses now: the requested count, else the machine's parallelism
/// (1 if unknown).
pub fn count() -> usize {
    match REQUESTED.load(Ordering::Relaxed) {
        0 => available(),
        n => n,
    }
}

/// Cores the process may use.
pub fn available() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Use `n` workers from now on (0 = every core). Calls already running keep their count.
pub fn set(n: usize) -> Result<()> {
    if n > MAX_THREADS {
        return Err(Error::invalid(format!(
            "num_threads: expected 0 (every core) to {MAX_THREADS}, got {n}"
        )));
    }
    REQUESTED.store(n, Ordering::Relaxed);
    Ok(())
}
