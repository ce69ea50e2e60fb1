//! Process-wide host settings (docs/abi.md §11, ABI 1.1, symbol version MOEPLUG_1.1): the
//! worker-thread count, the log callback and the progress callback. Each export validates,
//! then hands a safe closure to `crate::runtime`.

#![allow(non_camel_case_types)]

use std::ffi::CString;
use std::sync::Arc;

use libc::{c_char, c_void};

use super::panic::{guard, guard_value, symver};
use super::status;
use super::types::moeplug_status;
use crate::error::Result;
use crate::runtime::log::{self, Level};
use crate::runtime::{progress, threads};

/// Receives each log message: `level` a `moeplug_log_level`, `message` valid for the call
/// only, `user` as registered. Runs on the thread that logs; must not unwind or longjmp.
pub type moeplug_log_callback =
    Option<unsafe extern "C" fn(level: i32, message: *const c_char, user: *mut c_void)>;

/// Receives progress of a long host call: `operation` the export's name (valid for the call
/// only), `done` of `total` bytes written (non-decreasing; the first report of a call has
/// done 0, the last of a successful call done == total). Runs on the calling thread of the
/// reported call, never concurrently for one call; must not unwind or longjmp.
pub type moeplug_progress_callback = Option<
    unsafe extern "C" fn(operation: *const c_char, done: u64, total: u64, user: *mut c_void),
>;

/// The caller's `user` pointer, handed back untouched from whichever thread calls back:
/// what it points to is the caller's to make thread-safe.
#[derive(Clone, Copy)]
struct User(*mut c_void);
unsafe impl Send for User {}
unsafe impl Sync for User {}
impl User {
    fn get(self) -> *mut c_void {
        self.0
    }
}

fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// A NULL callback clears the setting and then takes no `user`.
fn user_for<F>(callback: &Option<F>, user: *mut c_void) -> Result<User> {
    if callback.is_none() && !user.is_null() {
        crate::bail!(
            invalid,
            "user: expected NULL when callback is NULL (clearing), got {user:p}"
        );
    }
    Ok(User(user))
}

/// Use `num_threads` host worker threads from now on for every host call in the process
/// (prep, quantization, the CPU fused_moe); 0 (the default) = every core the process may
/// use. Calls already running keep their count. INVALID_ARGUMENT above 4096. ABI 1.1.
#[no_mangle]
pub extern "C" fn moeplug_set_num_threads(num_threads: u32) -> moeplug_status {
    status(guard("moeplug_set_num_threads", || {
        threads::set(num_threads as usize)?;
        log::emit(Level::Info, || {
            format!(
                "host worker threads: {} ({})",
                threads::count(),
                if num_threads == 0 {
                    "every core"
                } else {
                    "set"
                }
            )
        });
        Ok(())
    }))
}

/// The number of host worker threads calls use now (at least 1). ABI 1.1.
#[no_mangle]
pub extern "C" fn moeplug_num_threads() -> u32 {
    guard_value(1, || threads::count().min(u32::MAX as usize) as u32)
}

/// Send the library's log messages to `callback` (with `user`) from now on; NULL (with a
/// NULL `user`) stops them. Levels: ERROR (a caught internal error), WARN, INFO (settings
/// changed), DEBUG (every failed call with its message, timings of long host calls).
/// Returns once no call to the previous callback is running. Refused (INVALID_ARGUMENT) from
/// inside a moeplug callback; calls into moeplug made by the callback do not log. ABI 1.1.
#[no_mangle]
pub extern "C" fn moeplug_set_log_callback(
    callback: moeplug_log_callback,
    user: *mut c_void,
) -> moeplug_status {
    status(guard("moeplug_set_log_callback", || {
        let user = user_for(&callback, user)?;
        log::set(callback.map(|f| -> log::Sink {
            Arc::new(move |level: Level, message: &str| {
                let text = c_text(message);
                unsafe { f(level as i32, text.as_ptr(), user.get()) }
            })
        }))
    }))
}

/// Report the progress of long host calls (`moeplug_prepare_moe`, `moeplug_quantize_mx` on
/// host tensors) to `callback` (with `user`) from now on; NULL (with a NULL `user`) stops.
/// Returns once no call to the previous callback is running. Refused (INVALID_ARGUMENT) from
/// inside a moeplug callback; calls into moeplug made by the callback do not report. ABI 1.1.
#[no_mangle]
pub extern "C" fn moeplug_set_progress_callback(
    callback: moeplug_progress_callback,
    user: *mut c_void,
) -> moeplug_status {
    status(guard("moeplug_set_progress_callback", || {
        let user = user_for(&callback, user)?;
        progress::set(callback.map(|f| -> progress::Sink {
            Arc::new(move |operation: &str, done: u64, total: u64| {
                let text = c_text(operation);
                unsafe { f(text.as_ptr(), done, total, user.get()) }
            })
        }))
    }))
}

symver!(
    "MOEPLUG_1.1":
    moeplug_set_num_threads,
    moeplug_num_threads,
    moeplug_set_log_callback,
    moeplug_set_progress_callback,
);
