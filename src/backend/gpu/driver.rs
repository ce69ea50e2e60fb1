//! Run-time loading of the vendor driver and run-time compiler. Only the symbols moeplug uses
//! are resolved, on first use; a missing library or symbol becomes BACKEND_UNAVAILABLE with a
//! message (an eager, complete lookup crashes on older drivers). Result codes stay integers.
//!
//! CUDA and HIP fill the same table: their driver and RTC entry points used here have the
//! same C signatures (handles are opaque pointers, device pointers 64-bit).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use crate::error::{Error, Result};

use super::hip::{self, probe_plan, Probe};
use super::Vendor;

pub type Handle = *mut c_void;
pub type DevicePtr = u64;
/// `cuTensorMapEncodeTiled(map, dtype, rank, address, dims, strides, box, element_strides,
/// interleave, swizzle, l2_promotion, oob_fill)`.
pub type TensorMapEncodeTiled = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const c_uint,
    *const c_uint,
    c_int,
    c_int,
    c_int,
    c_int,
) -> c_int;

/// `CUlaunchAttribute`: an id, then a 64-byte value union at offset 8.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: c_uint,
    pub pad: c_uint,
    pub value: [u8; 64],
}

/// `CUlaunchConfig` of `cuLaunchKernelEx`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_bytes: c_uint,
    pub stream: Handle,
    pub attrs: *mut LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: the kernel may start before the
/// previous one of its stream completes (it waits with `griddepcontrol.wait`).
pub const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_uint = 6;

/// `cuLaunchKernelEx(config, f, kernelParams, extra)`.
pub type LaunchKernelEx =
    unsafe extern "C" fn(*const LaunchConfig, Handle, *mut *mut c_void, *mut *mut c_void) -> c_int;

/// Driver + RTC entry points. Field names follow the CUDA spelling; for HIP they hold the
/// hip*/hiprtc* equivalents.
#[allow(non_snake_case)]
pub struct Api {
    pub vendor: Vendor,
    pub cuInit: unsafe extern "C" fn(c_uint) -> c_int,
    pub cuDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> c_int,
    pub cuDeviceGet: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    pub cuDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    pub cuDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    pub cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut Handle, c_int) -> c_int,
    pub cuCtxPushCurrent: unsafe extern "C" fn(Handle) -> c_int,
    pub cuCtxPopCurrent: unsafe extern "C" fn(*mut Handle) -> c_int,
    pub cuModuleLoadData: unsafe extern "C" fn(*mut Handle, *const c_void) -> c_int,
    pub cuModuleGetFunction: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> c_int,
    #[allow(clippy::type_complexity)]
    /// `cuFuncSetAttribute` (CUDA only: raising a kernel's dynamic shared memory limit; the
    /// HIP families need none).
    pub cuFuncSetAttribute: Option<unsafe extern "C" fn(Handle, c_int, c_int) -> c_int>,
    /// `cuTensorMapEncodeTiled` (CUDA 12+, sm_90 TMA): the wgmma family's weight tiles.
    /// Absent on older drivers (the family then copies them per thread).
    pub cuTensorMapEncodeTiled: Option<TensorMapEncodeTiled>,
    /// `cuLaunchKernelEx` (CUDA 12+): launches with attributes, for the opt-in programmatic
    /// dependent launch (`MOEPLUG_PDL`). Absent on older drivers (the launches stay plain).
    pub cuLaunchKernelEx: Option<LaunchKernelEx>,
    pub cuLaunchKernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    /// Device memory for the self-test before first use (`selftest_run`); launches use the
    /// caller's memory only. `cuMemAlloc_v2` / `hipMalloc` and the matching free and copies.
    pub cuMemAlloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> c_int,
    pub cuMemFree: unsafe extern "C" fn(DevicePtr) -> c_int,
    pub cuMemcpyHtoD: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> c_int,
    pub cuMemcpyDtoH: unsafe extern "C" fn(*mut c_void, DevicePtr, usize) -> c_int,
    /// `cuCtxSynchronize` / `hipDeviceSynchronize`.
    pub cuCtxSynchronize: unsafe extern "C" fn() -> c_int,
    /// `cuGetErrorName` (CUDA) / `hipGetErrorName` (HIP): "CUDA_ERROR_INVALID_VALUE".
    pub cuGetErrorName: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int,
    /// `cuPointerGetAttributes` / `hipDrvPointerGetAttributes`: what the driver knows about a
    /// tensor's address before a launch (`pointer`). Optional: a driver without it still
    /// loads, and then device tensors are not checked.
    #[allow(clippy::type_complexity)]
    pub cuPointerGetAttributes:
        Option<unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, DevicePtr) -> c_int>,
    /// HIP only: `hipGetDevicePropertiesR0600` (fills [`super::hip::DevicePropR0600`]), the
    /// one source of the device's gcnArchName.
    pub hipGetDevicePropertiesR0600: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    /// The driver / runtime library that was opened.
    pub driver_library: String,
    pub rtc: Rtc,
}

/// NVRTC / hipRTC entry points.
#[allow(non_snake_case)]
pub struct Rtc {
    pub library: String,
    pub nvrtcVersion: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    pub nvrtcGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    pub nvrtcCreateProgram: unsafe extern "C" fn(
        *mut Handle,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    pub nvrtcCompileProgram: unsafe extern "C" fn(Handle, c_int, *const *const c_char) -> c_int,
    pub nvrtcGetProgramLogSize: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    pub nvrtcGetProgramLog: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    /// `nvrtcGetCUBINSize` / `hiprtcGetCodeSize`.
    pub nvrtcGetCUBINSize: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    /// `nvrtcGetCUBIN` / `hiprtcGetCode`.
    pub nvrtcGetCUBIN: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    pub nvrtcDestroyProgram: unsafe extern "C" fn(*mut Handle) -> c_int,
}

// The table holds plain function pointers into libraries that are never unloaded.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// A library opened with dlopen and kept for the life of the process.
struct Library {
    name: String,
    handle: *mut c_void,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a C string owned by libc, valid until the next dl call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Library {
    fn open(name: &str) -> std::result::Result<Library, String> {
        Library::open_with(name, Probe::Load)
    }

    fn open_with(name: &str, probe: Probe) -> std::result::Result<Library, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        let flags = match probe {
            Probe::Load => libc::RTLD_NOW | libc::RTLD_LOCAL,
            Probe::AlreadyLoaded => libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NOLOAD,
        };
        // SAFETY: valid C string; the handle is deliberately never closed (function pointers
        // taken from it live in a process-wide table).
        let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
        if handle.is_null() {
            return Err(match probe {
                Probe::Load => dlerror_text(),
                Probe::AlreadyLoaded => {
                    dlerror_text(); // clear it: "not loaded" is the expected answer
                    format!("{name}: not already loaded")
                }
            });
        }
        Ok(Library {
            name: name.to_string(),
            handle,
        })
    }

    /// The first entry of a probe plan that opens; the error lists every load attempt.
    fn open_plan(plan: &[(String, Probe)]) -> std::result::Result<Library, String> {
        let mut why = Vec::new();
        for (name, probe) in plan {
            match Library::open_with(name, *probe) {
                Ok(l) => return Ok(l),
                Err(e) if *probe == Probe::Load => why.push(e),
                Err(_) => {}
            }
        }
        Err(why.join("; "))
    }

    /// First of `names` that opens; the error lists every attempt.
    fn open_any(names: &[&str]) -> std::result::Result<Library, String> {
        let mut why = Vec::new();
        for n in names {
            match Library::open(n) {
                Ok(l) => return Ok(l),
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    }

    /// Resolve `symbol` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be the symbol's true C function type.
    unsafe fn get<F: Copy>(&self, symbol: &str) -> Result<F> {
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let c = CString::new(symbol).map_err(|e| Error::internal(e.to_string()))?;
        let p = libc::dlsym(self.handle, c.as_ptr());
        if p.is_null() {
            return Err(Error::unavailable(format!(
                "{} has no symbol {symbol} (driver too old?)",
                self.name
            )));
        }
        Ok(std::mem::transmute_copy::<*mut c_void, F>(&p))
    }
}

/// NVRTC libraries to try, newest first.
const NVRTC_NAMES: [&str; 4] = [
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so",
];

/// Load the driver and run-time compiler of `vendor` and resolve the table.
pub fn load(vendor: Vendor) -> Result<Api> {
    let unavailable = |what: &str, why: String| {
        Error::unavailable(format!(
            "the {} {what} could not be loaded: {why}",
            vendor.name()
        ))
    };
    match vendor {
        Vendor::Cuda => {
            let drv = Library::open(vendor.driver_library())
                .map_err(|e| unavailable("driver (libcuda.so.1)", e))?;
            let rtc = Library::open_any(&NVRTC_NAMES).map_err(|e| {
                unavailable(
                    "run-time compiler (libnvrtc.so.13/.12/.11.2/libnvrtc.so)",
                    e,
                )
            })?;
            // SAFETY: each type below is the documented signature of the CUDA driver / NVRTC
            // entry point named next to it (versioned `_v2` names where cuda.h redirects).
            unsafe {
                Ok(Api {
                    vendor,
                    cuInit: drv.get("cuInit")?,
                    cuDriverGetVersion: drv.get("cuDriverGetVersion")?,
                    cuDeviceGet: drv.get("cuDeviceGet")?,
                    cuDeviceGetAttribute: drv.get("cuDeviceGetAttribute")?,
                    cuDeviceGetName: drv.get("cuDeviceGetName")?,
                    cuDevicePrimaryCtxRetain: drv.get("cuDevicePrimaryCtxRetain")?,
                    cuCtxPushCurrent: drv.get("cuCtxPushCurrent_v2")?,
                    cuCtxPopCurrent: drv.get("cuCtxPopCurrent_v2")?,
                    cuModuleLoadData: drv.get("cuModuleLoadData")?,
                    cuModuleGetFunction: drv.get("cuModuleGetFunction")?,
                    cuFuncSetAttribute: Some(drv.get("cuFuncSetAttribute")?),
                    cuTensorMapEncodeTiled: drv.get("cuTensorMapEncodeTiled").ok(),
                    cuLaunchKernelEx: drv.get("cuLaunchKernelEx").ok(),
                    cuLaunchKernel: drv.get("cuLaunchKernel")?,
                    cuMemAlloc: drv.get("cuMemAlloc_v2")?,
                    cuMemFree: drv.get("cuMemFree_v2")?,
                    cuMemcpyHtoD: drv.get("cuMemcpyHtoD_v2")?,
                    cuMemcpyDtoH: drv.get("cuMemcpyDtoH_v2")?,
                    cuCtxSynchronize: drv.get("cuCtxSynchronize")?,
                    cuGetErrorName: drv.get("cuGetErrorName")?,
                    cuPointerGetAttributes: drv.get("cuPointerGetAttributes").ok(),
                    hipGetDevicePropertiesR0600: None,
                    driver_library: drv.name.clone(),
                    rtc: nv_rtc(&rtc)?,
                })
            }
        }
        Vendor::Hip => hip_driver(vendor),
    }
}

/// # Safety
/// The types are hipRTC's documented signatures (same shapes as NVRTC's).
unsafe fn hip_rtc(rtc: &Library) -> Result<Rtc> {
    Ok(Rtc {
        library: rtc.name.clone(),
        nvrtcVersion: rtc.get("hiprtcVersion")?,
        nvrtcGetErrorString: rtc.get("hiprtcGetErrorString")?,
        nvrtcCreateProgram: rtc.get("hiprtcCreateProgram")?,
        nvrtcCompileProgram: rtc.get("hiprtcCompileProgram")?,
        nvrtcGetProgramLogSize: rtc.get("hiprtcGetProgramLogSize")?,
        nvrtcGetProgramLog: rtc.get("hiprtcGetProgramLog")?,
        nvrtcGetCUBINSize: rtc.get("hiprtcGetCodeSize")?,
        nvrtcGetCUBIN: rtc.get("hiprtcGetCode")?,
        nvrtcDestroyProgram: rtc.get("hiprtcDestroyProgram")?,
    })
}

/// hipRTC of the ROCm release of the runtime whose `hipDriverGetVersion` is given (same
/// major version first, [`hip::hiprtc_names`]).
fn hip_rtc_for(get_version: unsafe extern "C" fn(*mut c_int) -> c_int) -> Result<Rtc> {
    let mut version = 0;
    // SAFETY: plain query with a valid out-pointer.
    let rc = unsafe { get_version(&mut version) };
    let major = (rc == 0)
        .then(|| hip::version_major_minor(version))
        .flatten()
        .map(|v| v.0);
    let names = hip::hiprtc_names(major);
    let rtc = Library::open_plan(&probe_plan(&names)).map_err(|e| {
        Error::unavailable(format!(
            "the HIP run-time compiler ({}) could not be loaded: {e}",
            names.join(", ")
        ))
    })?;
    // SAFETY: hipRTC's documented signatures.
    unsafe { hip_rtc(&rtc) }
}

/// HIP runtime symbols, opened at run time (default build): a copy the process already has
/// (e.g. torch's) first, then ROCm 6/7 names ([`hip::RUNTIME_NAMES`]).
#[cfg(not(feature = "hip-link"))]
fn hip_driver(vendor: Vendor) -> Result<Api> {
    let drv = Library::open_plan(&probe_plan(&hip::RUNTIME_NAMES)).map_err(|e| {
        Error::unavailable(format!(
            "the HIP runtime ({}) could not be loaded: {e}",
            hip::RUNTIME_NAMES.join(", ")
        ))
    })?;
    // SAFETY: the hip* entry points below have the same C signatures as the CUDA ones in the
    // table (hipModule_t/hipFunction_t/hipCtx_t/hipStream_t are opaque pointers, hipDevice_t
    // an int).
    unsafe {
        let get_version = drv.get("hipDriverGetVersion")?;
        Ok(Api {
            vendor,
            cuInit: drv.get("hipInit")?,
            cuDriverGetVersion: get_version,
            cuDeviceGet: drv.get("hipDeviceGet")?,
            cuDeviceGetAttribute: drv.get("hipDeviceGetAttribute")?,
            cuDeviceGetName: drv.get("hipDeviceGetName")?,
            cuDevicePrimaryCtxRetain: drv.get("hipDevicePrimaryCtxRetain")?,
            cuCtxPushCurrent: drv.get("hipCtxPushCurrent")?,
            cuCtxPopCurrent: drv.get("hipCtxPopCurrent")?,
            cuModuleLoadData: drv.get("hipModuleLoadData")?,
            cuModuleGetFunction: drv.get("hipModuleGetFunction")?,
            cuFuncSetAttribute: None,
            cuTensorMapEncodeTiled: None,
            cuLaunchKernelEx: None,
            cuLaunchKernel: drv.get("hipModuleLaunchKernel")?,
            cuMemAlloc: drv.get("hipMalloc")?,
            cuMemFree: drv.get("hipFree")?,
            cuMemcpyHtoD: drv.get("hipMemcpyHtoD")?,
            cuMemcpyDtoH: drv.get("hipMemcpyDtoH")?,
            cuCtxSynchronize: drv.get("hipDeviceSynchronize")?,
            cuGetErrorName: drv.get("hipDrvGetErrorName")?,
            cuPointerGetAttributes: drv.get("hipDrvPointerGetAttributes").ok(),
            hipGetDevicePropertiesR0600: Some(drv.get("hipGetDevicePropertiesR0600")?),
            driver_library: drv.name.clone(),
            rtc: hip_rtc_for(get_version)?,
        })
    }
}

/// With `hip-link`, the HIP driver symbols come from `hip-runtime-sys` (linked at build time);
/// hipRTC is still opened at run time. CI type-checks this path against a stub HIP_PATH; it is
/// not linked or run there (that needs ROCm).
#[cfg(feature = "hip-link")]
fn hip_driver(vendor: Vendor) -> Result<Api> {
    use hip_runtime_sys as h;
    extern "C" {
        // In libamdhip64 since ROCm 6 (hip-runtime-sys links the library).
        fn hipGetDevicePropertiesR0600(props: *mut c_void, device: c_int) -> c_int;
    }
    // SAFETY: reinterpreting the linked functions' pointers as the table's equivalent C types.
    unsafe {
        macro_rules! f {
            ($s:ident) => {
                std::mem::transmute::<*const (), _>(h::$s as *const ())
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = f!(hipDriverGetVersion);
        Ok(Api {
            vendor,
            cuInit: f!(hipInit),
            cuDriverGetVersion: get_version,
            cuDeviceGet: f!(hipDeviceGet),
            cuDeviceGetAttribute: f!(hipDeviceGetAttribute),
            cuDeviceGetName: f!(hipDeviceGetName),
            cuDevicePrimaryCtxRetain: f!(hipDevicePrimaryCtxRetain),
            cuCtxPushCurrent: f!(hipCtxPushCurrent),
            cuCtxPopCurrent: f!(hipCtxPopCurrent),
            cuModuleLoadData: f!(hipModuleLoadData),
            cuModuleGetFunction: f!(hipModuleGetFunction),
            cuFuncSetAttribute: None,
            cuTensorMapEncodeTiled: None,
            cuLaunchKernelEx: None,
            cuLaunchKernel: f!(hipModuleLaunchKernel),
            cuMemAlloc: f!(hipMalloc),
            cuMemFree: f!(hipFree),
            cuMemcpyHtoD: f!(hipMemcpyHtoD),
            cuMemcpyDtoH: f!(hipMemcpyDtoH),
            cuCtxSynchronize: f!(hipDeviceSynchronize),
            cuGetErrorName: f!(hipDrvGetErrorName),
            cuPointerGetAttributes: Some(f!(hipDrvPointerGetAttributes)),
            hipGetDevicePropertiesR0600: Some(hipGetDevicePropertiesR0600),
            driver_library: "libamdhip64 (linked)".to_string(),
            rtc: hip_rtc_for(get_version)?,
        })
    }
}

impl Api {
    /// Load a compiled code object (cubin / hsaco). The module is never unloaded: kernels
    /// are cached per device for the life of the process.
    pub fn load_module(&self, binary: &[u8], what: &str) -> Result<Handle> {
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `binary` is a complete code object produced by the run-time compiler.
        let code =
            unsafe { (self.cuModuleLoadData)(&mut module, binary.as_ptr() as *const c_void) };
        self.check(code, &format!("cuModuleLoadData({what})"))?;
        Ok(module)
    }

    /// The kernel `name` of a loaded module.
    pub fn function(&self, module: Handle, name: &CStr) -> Result<Handle> {
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: `module` came from `load_module`; `name` is NUL-terminated.
        let code = unsafe { (self.cuModuleGetFunction)(&mut f, module, name.as_ptr()) };
        self.check(
            code,
            &format!("cuModuleGetFunction({})", name.to_string_lossy()),
        )?;
        Ok(f)
    }

    /// Allow `f` up to `bytes` of dynamic shared memory (above the 48 KiB default), and ask
    /// for the largest shared-memory carveout so that several such blocks fit on an SM (the
    /// default carveout may hold only one).
    pub fn set_max_dynamic_shared(&self, f: Handle, bytes: usize) -> Result<()> {
        const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8; // CU_FUNC_ATTRIBUTE_*
        const PREFERRED_SHARED_MEMORY_CARVEOUT: c_int = 9;
        let Some(set) = self.cuFuncSetAttribute else {
            return Err(Error::unsupported(format!(
                "{} kernels cannot raise their shared memory limit here",
                self.vendor.name()
            )));
        };
        // SAFETY: `f` came from `function`; the attribute takes an int.
        let code = unsafe { set(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as c_int) };
        self.check(code, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
        // SAFETY: as above; 100 = percent of the unified L1/shared storage.
        let code = unsafe { set(f, PREFERRED_SHARED_MEMORY_CARVEOUT, 100) };
        self.check(code, "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")
    }

    /// "CUDA_ERROR_INVALID_VALUE (1)" for a driver result code.
    pub fn error_name(&self, code: c_int) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static string or leaves it NULL.
        let ok = unsafe { (self.cuGetErrorName)(code, &mut p) } == 0 && !p.is_null();
        if ok {
            let name = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            format!("{name} ({code})")
        } else {
            format!("error {code}")
        }
    }

    /// A driver result as `Result`: non-zero → DEVICE_ERROR naming the call.
    pub fn check(&self, code: c_int, call: &str) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(Error::device(format!(
                "{call} failed: {}",
                self.error_name(code)
            )))
        }
    }

    /// An RTC result: non-zero → COMPILE_ERROR with the compiler's error string.
    pub fn rtc_check(&self, code: c_int, call: &str) -> Result<()> {
        self.rtc.check(code, call)
    }

    /// (major, minor) of the run-time compiler.
    pub fn rtc_version(&self) -> Result<(i32, i32)> {
        self.rtc.version()
    }
}

impl Rtc {
    /// An RTC result: non-zero → COMPILE_ERROR with the compiler's error string.
    pub fn check(&self, code: c_int, call: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string (or NULL).
        let p = unsafe { (self.nvrtcGetErrorString)(code) };
        let s = if p.is_null() {
            format!("error {code}")
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(Error::new(
            crate::error::Status::CompileError,
            format!("{call} failed: {s}"),
        ))
    }

    /// (major, minor) of the run-time compiler.
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out-pointers.
        self.check(
            unsafe { (self.nvrtcVersion)(&mut a, &mut b) },
            "nvrtcVersion",
        )?;
        Ok((a, b))
    }
}

/// NVRTC alone, without a driver or a GPU: enough to compile and inspect the kernels (the
/// compile check of CI and `tests/kernel_compile.rs`).
pub fn load_nvrtc() -> Result<Rtc> {
    let rtc = Library::open_any(&NVRTC_NAMES).map_err(|e| {
        Error::unavailable(format!(
            "NVRTC (libnvrtc.so.13/.12/.11.2/libnvrtc.so) could not be loaded: {e}"
        ))
    })?;
    // SAFETY: NVRTC's documented signatures, as in `load`.
    unsafe { nv_rtc(&rtc) }
}

/// # Safety
/// The types are NVRTC's documented signatures.
unsafe fn nv_rtc(rtc: &Library) -> Result<Rtc> {
    Ok(Rtc {
        library: rtc.name.clone(),
        nvrtcVersion: rtc.get("nvrtcVersion")?,
        nvrtcGetErrorString: rtc.get("nvrtcGetErrorString")?,
        nvrtcCreateProgram: rtc.get("nvrtcCreateProgram")?,
        nvrtcCompileProgram: rtc.get("nvrtcCompileProgram")?,
        nvrtcGetProgramLogSize: rtc.get("nvrtcGetProgramLogSize")?,
        nvrtcGetProgramLog: rtc.get("nvrtcGetProgramLog")?,
        nvrtcGetCUBINSize: rtc.get("nvrtcGetCUBINSize")?,
        nvrtcGetCUBIN: rtc.get("nvrtcGetCUBIN")?,
        nvrtcDestroyProgram: rtc.get("nvrtcDestroyProgram")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_config_and_attribute_have_the_driver_layout() {
        // cuda.h (x86-64): CUlaunchAttribute { id; pad to 8; 64-byte value union },
        // CUlaunchConfig { 7 unsigned; CUstream at 32; attrs at 40; numAttrs at 48 }.
        assert_eq!(std::mem::size_of::<LaunchAttribute>(), 72);
        assert_eq!(std::mem::offset_of!(LaunchAttribute, value), 8);
        assert_eq!(std::mem::offset_of!(LaunchConfig, shared_bytes), 24);
        assert_eq!(std::mem::offset_of!(LaunchConfig, stream), 32);
        assert_eq!(std::mem::offset_of!(LaunchConfig, attrs), 40);
        assert_eq!(std::mem::offset_of!(LaunchConfig, num_attrs), 48);
        assert_eq!(std::mem::size_of::<LaunchConfig>(), 56);
    }

    #[test]
    fn already_loaded_probe_finds_only_what_the_process_has() {
        // libc is in every test process; a made-up name is in none.
        assert!(Library::open_with("libc.so.6", Probe::AlreadyLoaded).is_ok());
        let e = Library::open_with("libmoeplug-absent.so.9", Probe::AlreadyLoaded)
            .err()
            .unwrap();
        assert_eq!(e, "libmoeplug-absent.so.9: not already loaded");
        let names = ["libmoeplug-absent.so.9", "libmoeplug-absent.so.8"];
        let e = Library::open_plan(&probe_plan(&names)).err().unwrap();
        // Only the real load attempts are reported, in order.
        let attempts: Vec<&str> = e.split("; ").collect();
        assert_eq!(attempts.len(), 2, "{e}");
        assert!(attempts[0].starts_with("libmoeplug-absent.so.9: "), "{e}");
        assert!(attempts[1].starts_with("libmoeplug-absent.so.8: "), "{e}");
        let found = Library::open_plan(&probe_plan(&["libmoeplug-absent.so.9", "libc.so.6"]));
        assert_eq!(found.unwrap().name, "libc.so.6");
    }
}
