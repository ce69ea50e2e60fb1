//! Splitting a large output buffer over the CPU cores. Each worker gets a disjoint, whole
//! number of `unit`-byte pieces of the output, so writers never share a cache line of work
//! and nothing is allocated per element. The worker count and progress reports come from
//! `crate::runtime`.

use crate::runtime::{progress, threads};

/// Below this many output bytes a single thread is faster than starting workers.
const MIN_PARALLEL_BYTES: usize = 1 << 20;

/// Call `body(first_unit, chunk)` over `out` cut into contiguous chunks of whole `unit`-byte
/// pieces (`out.len()` must be a multiple of `unit`), on all cores when `out` is large.
/// `first_unit` is the index of the chunk's first piece within `out`.
pub fn parallel_chunks<F>(out: &mut [u8], unit: usize, body: F)
where
    F: Fn(usize, &mut [u8]) + Sync,
{
    assert!(
        unit > 0 && out.len() % unit == 0,
        "output is not whole units"
    );
    let units = out.len() / unit;
    let threads = threads::count().min(units.max(1));
    if threads <= 1 || out.len() < MIN_PARALLEL_BYTES {
        let bytes = out.len();
        body(0, out);
        progress::advance(bytes as u64);
        return;
    }
    // A few chunks per thread, dealt round-robin, even out the load without a work queue.
    let chunks = threads * 4;
    let per_chunk = units.div_ceil(chunks).max(1);
    let mut groups: Vec<Vec<(usize, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, chunk) in out.chunks_mut(per_chunk * unit).enumerate() {
        groups[i % threads].push((i * per_chunk, chunk));
    }
    let body = &body;
    let workers = progress::Workers::new();
    let workers = &workers;
    std::thread::scope(|s| {
        let jobs = groups.into_iter().map(|group| {
            let running = workers.enter();
            move || {
                let _running = running;
                for (first, chunk) in group {
                    let bytes = chunk.len();
                    body(first, chunk);
                    workers.finished(bytes);
                }
            }
        });
        threads::run_jobs(s, jobs);
        workers.report_until_done();
    });
}
