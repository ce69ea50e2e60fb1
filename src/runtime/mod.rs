//! Process-wide settings of the host side, set through the C API (docs/abi.md §11): how many
//! worker threads host work uses, where log messages go, where progress of long host calls
//! goes. Each is one definition that the prep steps, quantization and the CPU backend read.

pub mod log;
pub mod progress;
pub mod threads;

/// Set while this thread runs a caller's callback: the callback may call moeplug, but its
/// calls neither log nor report progress (no recursion into the caller), and the setters
/// refuse (they would wait on the callback that is calling them).
mod in_callback {
    use std::cell::Cell;

    thread_local! {
        static ACTIVE: Cell<bool> = const { Cell::new(false) };
    }

    pub fn active() -> bool {
        ACTIVE.with(|a| a.get())
    }

    /// Run `f` with the flag set (restored on unwind too).
    pub fn run<R>(f: impl FnOnce() -> R) -> R {
        struct Reset(bool);
        impl Drop for Reset {
            fn drop(&mut self) {
                ACTIVE.with(|a| a.set(self.0));
            }
        }
        let _reset = Reset(ACTIVE.with(|a| a.replace(true)));
        f()
    }
}

pub use in_callback::active as in_callback;
