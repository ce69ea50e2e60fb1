//! Progress of long host calls (prepare, quantize) to the caller's sink
//! (`moeplug_set_progress_callback`). A call is one task: `(operation, done, total)` with
//! `done` in bytes written, non-decreasing, at most `total`; the first report has done = 0,
//! the last of a successful call done = total. Reports come on the thread that made the
//! call, never from worker threads, so a sink needs no locking of its own.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::in_callback;
use super::log::{self, Level};
use crate::error::{Error, Result};

pub type Sink = Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

static SINK: RwLock<Option<Sink>> = RwLock::new(None);
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Report to `sink` from now on (None: stop). Refused from inside a callback.
pub fn set(sink: Option<Sink>) -> Result<()> {
    if in_callback() {
        return Err(Error::invalid(
            "cannot replace the progress callback from inside a moeplug callback",
        ));
    }
    let mut slot = SINK.write().unwrap_or_else(|e| e.into_inner());
    ENABLED.store(sink.is_some(), Ordering::Release);
    *slot = sink;
    Ok(())
}

struct Task {
    operation: &'static str,
    done: u64,
    total: u64,
}

thread_local! {
    static TASK: RefCell<Option<Task>> = const { RefCell::new(None) };
}

fn report(operation: &str, done: u64, total: u64) {
    let slot = SINK.read().unwrap_or_else(|e| e.into_inner());
    if let Some(sink) = slot.as_ref() {
        super::in_callback::run(|| sink(operation, done, total));
    }
}

fn has_task() -> bool {
    TASK.with(|t| t.borrow().is_some())
}

/// Run `body` as the task `operation` writing `total` bytes, reporting as it advances. A
/// task inside a task is part of the outer one.
pub fn task<T>(operation: &'static str, total: u64, body: impl FnOnce() -> Result<T>) -> Result<T> {
    // Tracked while someone listens: the progress sink, or the log (for the timing line).
    let listened = ENABLED.load(Ordering::Acquire) || log::enabled();
    if !listened || in_callback() || has_task() {
        return body();
    }
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            TASK.with(|t| t.borrow_mut().take());
        }
    }
    TASK.with(|t| {
        *t.borrow_mut() = Some(Task {
            operation,
            done: 0,
            total,
        })
    });
    let clear = Clear;
    let started = Instant::now();
    report(operation, 0, total);
    let result = body();
    let reached = TASK.with(|t| t.borrow().as_ref().map_or(0, |t| t.done));
    drop(clear);
    if result.is_ok() {
        if reached != total {
            report(operation, total, total);
        }
        log::emit(Level::Debug, || {
            format!(
                "{operation}: {total} bytes in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            )
        });
    }
    result
}

/// `bytes` more of this thread's task are written (nothing without a task).
pub fn advance(bytes: u64) {
    if bytes == 0 || in_callback() {
        return;
    }
    let now = TASK.with(|t| {
        let mut t = t.borrow_mut();
        let task = t.as_mut()?;
        let done = (task.done + bytes).min(task.total);
        (done != task.done).then(|| {
            task.done = done;
            (task.operation, done, task.total)
        })
    });
    if let Some((operation, done, total)) = now {
        report(operation, done, total);
    }
}

/// How often the calling thread looks at its workers' progress at the latest.
const POLL: Duration = Duration::from_millis(50);

/// Bytes finished by worker threads, reported on the calling thread while they run: each
/// worker holds a [`Workers::enter`] guard and calls [`Workers::finished`]; the calling
/// thread runs [`Workers::report_until_done`] inside the same `thread::scope`.
pub struct Workers {
    reporting: bool,
    done: AtomicU64,
    running: AtomicUsize,
    caller: Thread,
}

/// A worker's presence; leaving (also by unwinding) wakes the calling thread.
pub struct Running<'a>(&'a Workers);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Release);
        self.0.caller.unpark();
    }
}

impl Workers {
    /// On the calling thread, before spawning.
    pub fn new() -> Self {
        Workers {
            reporting: has_task() && !in_callback(),
            done: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            caller: std::thread::current(),
        }
    }

    /// On the calling thread, once per worker before spawning it; move the guard into it.
    pub fn enter(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self)
    }

    /// On a worker: `bytes` more are written.
    pub fn finished(&self, bytes: usize) {
        if self.reporting {
            self.done.fetch_add(bytes as u64, Ordering::Release);
            self.caller.unpark();
        }
    }

    /// On the calling thread, after spawning: report until every worker has left.
    pub fn report_until_done(&self) {
        if !self.reporting {
            return;
        }
        let mut seen = 0;
        loop {
            // `running` first: once it reads 0, `done` holds every worker's bytes.
            let running = self.running.load(Ordering::Acquire);
            let done = self.done.load(Ordering::Acquire);
            advance(done - seen);
            seen = done;
            if running == 0 {
                return;
            }
            std::thread::park_timeout(POLL);
        }
    }
}

impl Default for Workers {
    fn default() -> Self {
        Self::new()
    }
}
