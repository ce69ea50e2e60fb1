//! The host worker-thread count: one setting per process (`moeplug_set_num_threads`), read by
//! every parallel host loop (prep steps, MX quantization, the CPU backend). No environment
//! variable: an engine sets it through the API, next to its own thread pool settings.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Scope;

use crate::error::{Error, Result};
use crate::runtime::log::{self, Level};

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

/// Whether a refused worker thread was logged at WARN yet.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Run every job of `jobs` on a worker thread of its own in `scope`. A thread the OS refuses
/// (address space, memory or a thread limit: where `Scope::spawn` would panic) is no error:
/// the calling thread runs that job itself once the rest have started, so every job runs
/// exactly once either way. Callers split work by job, never by thread, so the result does
/// not depend on how many threads started. The one place host work starts threads.
pub fn run_jobs<'scope, 'env, F>(
    scope: &'scope Scope<'scope, 'env>,
    jobs: impl IntoIterator<Item = F>,
) where
    F: FnOnce() + Send + 'scope,
{
    let mut refused = Vec::new();
    let mut started = 0usize;
    let mut error = None;
    for job in jobs {
        // The job waits in a slot both sides can reach: a refused spawn drops its closure,
        // and the job comes back out of the slot.
        let slot = Arc::new(Mutex::new(Some(job)));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new().spawn_scoped(scope, move || {
            if let Some(job) = take(&theirs) {
                job();
            }
        });
        match spawned {
            Ok(_) => started += 1,
            Err(e) => {
                error.get_or_insert(e);
                refused.push(slot);
            }
        }
    }
    if let Some(e) = error {
        // WARN once a process, DEBUG after: one launch runs hundreds of parallel loops.
        let level = if WARNED.swap(true, Ordering::Relaxed) {
            Level::Debug
        } else {
            Level::Warn
        };
        log::emit(level, || {
            format!(
                "could not start {} of {} worker threads ({e}); the calling thread does their work",
                refused.len(),
                refused.len() + started
            )
        });
    }
    for slot in refused {
        if let Some(job) = take(&slot) {
            job();
        }
    }
}

/// The job in `slot`, leaving it empty (a poisoned lock still holds the job).
fn take<F>(slot: &Mutex<Option<F>>) -> Option<F> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}
