//! The boundary between C and the core: the thread's last error message, the panic guard that
//! every export runs inside, and the `.symver` directive that versions each export.

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Status};
use crate::runtime::log::{self, Level};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember `message` as this thread's last error (interior NULs become spaces).
pub fn set_last_error(message: &str) {
    let clean: Vec<u8> = message
        .bytes()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    let c = CString::new(clean).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

pub fn clear_last_error() {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
}

/// Pointer to the thread's last error; valid until the next moeplug call on this thread.
pub fn last_error_ptr() -> *const libc::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Run `body`, turning its error into a status plus last-error message, and a panic into
/// `INTERNAL`. Every export that returns a status goes through here.
pub fn guard(function: &str, body: impl FnOnce() -> Result<(), Error>) -> Status {
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(e)) => {
            let message = format!("{function}: {}", e.message);
            log::emit(Level::Debug, || format!("{}: {message}", e.status.name()));
            set_last_error(&message);
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let message = format!("{function}: internal error (caught panic: {what})");
            log::emit(Level::Error, || message.clone());
            set_last_error(&message);
            Status::Internal
        }
    }
}

/// Run a value-returning export that cannot fail; a panic yields `fallback`.
pub fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// Give exported functions their ELF symbol version (default version): `MOEPLUG_1.0` for
/// the 1.0 calls (never changes), `symver!("MOEPLUG_1.1": ...)` for later additions. The
/// version nodes themselves are declared by the version script that build.rs passes to the
/// linker.
macro_rules! symver {
    ($($name:ident),+ $(,)?) => {
        symver!("MOEPLUG_1.0": $($name),+);
    };
    ($version:literal: $($name:ident),+ $(,)?) => {
        $(
            #[cfg(all(target_os = "linux", not(test)))]
            std::arch::global_asm!(concat!(".symver ", stringify!($name), ", ", stringify!($name), "@@", $version));
        )+
    };
}
pub(crate) use symver;
