//! Splitting a large output buffer over the CPU cores. Each worker gets a disjoint, whole
//! number of `unit`-byte pieces of the output, so writers never share a cache line of work
//! and nothing is allocated per element.

/// Below this many output bytes a single thread is faster than starting workers.
const MIN_PARALLEL_BYTES: usize = 1 << 20;

/// Worker threads to use: the machine's parallelism (1 if unknown).
pub fn num_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

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
    let threads = num_threads().min(units.max(1));
    if threads <= 1 || out.len() < MIN_PARALLEL_BYTES {
        body(0, out);
        return;
    }
    // A few chunks per thread evens out the load without much scheduling.
    let chunks = threads * 4;
    let per_chunk = units.div_ceil(chunks).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let pieces: Vec<(usize, &mut [u8])> = out
        .chunks_mut(per_chunk * unit)
        .enumerate()
        .map(|(i, c)| (i * per_chunk, c))
        .collect();
    let pieces: Vec<std::sync::Mutex<Option<(usize, &mut [u8])>>> = pieces
        .into_iter()
        .map(|p| std::sync::Mutex::new(Some(p)))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(slot) = pieces.get(i) else { break };
                let taken = slot.lock().map(|mut g| g.take()).unwrap_or(None);
                if let Some((first, chunk)) = taken {
                    body(first, chunk);
                }
            });
        }
    });
}
