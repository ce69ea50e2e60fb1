//! GPU backends (CUDA and HIP through one code path). Vendor runtimes are loaded at run time:
//! a missing library or symbol is BACKEND_UNAVAILABLE with a message, never a crash.

use std::sync::Arc;

use super::Backend;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

impl Vendor {
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Cuda => "CUDA",
            Vendor::Hip => "HIP",
        }
    }
    /// The driver library that must load for this vendor.
    pub fn driver_library(self) -> &'static str {
        match self {
            Vendor::Cuda => "libcuda.so.1",
            Vendor::Hip => "libamdhip64.so",
        }
    }
}

/// Try to open a shared library; the error text is dlerror's.
pub fn probe_library(name: &str) -> std::result::Result<(), String> {
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a valid C string; the handle is closed right away.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            let err = libc::dlerror();
            let msg = if err.is_null() {
                "unknown dlopen error".to_string()
            } else {
                std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned()
            };
            return Err(msg);
        }
        libc::dlclose(h);
    }
    Ok(())
}

pub fn backend(vendor: Vendor, device_id: i32) -> Result<Arc<dyn Backend>> {
    if device_id < 0 {
        return Err(Error::invalid(format!(
            "device_id: expected >= 0, got {device_id}"
        )));
    }
    match probe_library(vendor.driver_library()) {
        Err(why) => Err(Error::unavailable(format!(
            "the {} runtime could not be loaded ({}): {why}",
            vendor.name(),
            vendor.driver_library()
        ))),
        Ok(()) => Err(Error::unavailable(format!(
            "{} found, but the {} backend is not built into moeplug {} yet",
            vendor.driver_library(),
            vendor.name(),
            env!("CARGO_PKG_VERSION")
        ))),
    }
}
