//! Log messages to the caller's sink (`moeplug_set_log_callback`; Python maps it onto
//! `logging`). Nothing is formatted while no sink is set. The sink runs on the thread that
//! logs, never re-entered from its own calls into moeplug.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::in_callback;
use crate::error::{Error, Result};
use crate::vocab::moeplug_log_level as raw;

/// Severity, most severe first (the C values of `moeplug_log_level`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = raw::Error as i32,
    Warn = raw::Warn as i32,
    Info = raw::Info as i32,
    Debug = raw::Debug as i32,
}

pub type Sink = Arc<dyn Fn(Level, &str) + Send + Sync>;

/// Held for reading while the sink runs, so that replacing it waits for running calls.
static SINK: RwLock<Option<Sink>> = RwLock::new(None);
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Send messages to `sink` from now on (None: drop them). Refused from inside a callback.
pub fn set(sink: Option<Sink>) -> Result<()> {
    if in_callback() {
        return Err(Error::invalid(
            "cannot replace the log callback from inside a moeplug callback",
        ));
    }
    let mut slot = SINK.write().unwrap_or_else(|e| e.into_inner());
    ENABLED.store(sink.is_some(), Ordering::Release);
    *slot = sink;
    Ok(())
}

/// Whether a message logged now would reach a sink.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire) && !in_callback()
}

/// Log `message()` at `level`; `message` is only called when a sink takes it.
pub fn emit(level: Level, message: impl FnOnce() -> String) {
    if !enabled() {
        return;
    }
    let slot = SINK.read().unwrap_or_else(|e| e.into_inner());
    if let Some(sink) = slot.as_ref() {
        let text = message();
        super::in_callback::run(|| sink(level, &text));
    }
}
