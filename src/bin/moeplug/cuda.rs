//! Device memory for `moeplug demo --device cuda:N`, owned by the demo as an engine owns its
//! tensors: the library never allocates, so the caller brings device memory. Only the CUDA
//! driver calls the demo needs, loaded at run time like the library does (no link to
//! libcuda), on the device's primary context, which the library's CUDA backend also uses.

use std::ffi::{c_int, c_uint, c_void, CStr};

use moeplug::capi::types::moeplug_tensor;

type Handle = *mut c_void;
type DevicePtr = u64;

#[allow(non_snake_case)]
struct Driver {
    cuInit: unsafe extern "C" fn(c_uint) -> c_int,
    cuDeviceGet: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut Handle, c_int) -> c_int,
    cuCtxSetCurrent: unsafe extern "C" fn(Handle) -> c_int,
    cuCtxSynchronize: unsafe extern "C" fn() -> c_int,
    cuMemAlloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> c_int,
    cuMemFree: unsafe extern "C" fn(DevicePtr) -> c_int,
    cuMemcpyHtoD: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> c_int,
    cuMemcpyDtoH: unsafe extern "C" fn(*mut c_void, DevicePtr, usize) -> c_int,
}

/// One CUDA device, its primary context current on this thread.
pub struct Cuda {
    drv: Driver,
    device_id: i32,
}

fn check(code: c_int, call: &str) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed with CUDA error {code}"))
    }
}

/// Resolve `name` in `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the symbol's C function type.
unsafe fn symbol<F: Copy>(lib: *mut c_void, name: &CStr) -> Result<F, String> {
    let p = libc::dlsym(lib, name.as_ptr());
    if p.is_null() {
        return Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()));
    }
    Ok(std::mem::transmute_copy::<*mut c_void, F>(&p))
}

impl Cuda {
    pub fn open(device_id: i32) -> Result<Cuda, String> {
        // SAFETY: a C string literal; the handle stays open for the process (the library
        // holds its own).
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err("libcuda.so.1 could not be loaded".into());
        }
        // SAFETY: each type is the documented signature of the driver entry point (the `_v2`
        // names are those cuda.h maps the plain names to).
        let drv = unsafe {
            Driver {
                cuInit: symbol(lib, c"cuInit")?,
                cuDeviceGet: symbol(lib, c"cuDeviceGet")?,
                cuDevicePrimaryCtxRetain: symbol(lib, c"cuDevicePrimaryCtxRetain")?,
                cuCtxSetCurrent: symbol(lib, c"cuCtxSetCurrent")?,
                cuCtxSynchronize: symbol(lib, c"cuCtxSynchronize")?,
                cuMemAlloc: symbol(lib, c"cuMemAlloc_v2")?,
                cuMemFree: symbol(lib, c"cuMemFree_v2")?,
                cuMemcpyHtoD: symbol(lib, c"cuMemcpyHtoD_v2")?,
                cuMemcpyDtoH: symbol(lib, c"cuMemcpyDtoH_v2")?,
            }
        };
        let mut dev = 0;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the primary context is retained for the process.
        unsafe {
            check((drv.cuInit)(0), "cuInit")?;
            check((drv.cuDeviceGet)(&mut dev, device_id), "cuDeviceGet")?;
            check(
                (drv.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            check((drv.cuCtxSetCurrent)(ctx), "cuCtxSetCurrent")?;
        }
        Ok(Cuda { drv, device_id })
    }

    /// A device copy of `data` described as a `shape` tensor of (`code`, `bits`).
    pub fn upload<T: Copy>(
        &self,
        data: &[T],
        shape: &[usize],
        code: u8,
        bits: u8,
    ) -> Result<DeviceTensor<'_>, String> {
        let bytes = std::mem::size_of_val(data);
        let mut ptr: DevicePtr = 0;
        // SAFETY: out-pointer to a local; the copy reads exactly `bytes` of `data`.
        unsafe {
            check((self.drv.cuMemAlloc)(&mut ptr, bytes.max(1)), "cuMemAlloc")?;
            check(
                (self.drv.cuMemcpyHtoD)(ptr, data.as_ptr() as *const c_void, bytes),
                "cuMemcpyHtoD",
            )?;
        }
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        // The tensor points into `shape`'s heap buffer, which moves with the Vec unchanged.
        let mut t = moeplug_tensor::host(ptr as *mut c_void, &shape, code, bits);
        t.device.device_type = 2;
        t.device.device_id = self.device_id;
        Ok(DeviceTensor {
            cuda: self,
            ptr,
            bytes,
            _shape: shape,
            t,
        })
    }

    /// Wait for the work queued on the default stream.
    pub fn synchronize(&self) -> Result<(), String> {
        // SAFETY: no arguments; the primary context is current.
        check(unsafe { (self.drv.cuCtxSynchronize)() }, "cuCtxSynchronize")
    }
}

/// Device memory with its tensor description; freed on drop.
pub struct DeviceTensor<'a> {
    cuda: &'a Cuda,
    ptr: DevicePtr,
    bytes: usize,
    _shape: Vec<i64>,
    t: moeplug_tensor,
}

impl DeviceTensor<'_> {
    pub fn ptr(&self) -> *const moeplug_tensor {
        &self.t
    }

    /// Copy the whole tensor back into `out` (same byte size).
    pub fn download<T: Copy>(&self, out: &mut [T]) -> Result<(), String> {
        assert_eq!(std::mem::size_of_val(out), self.bytes);
        // SAFETY: `out` has exactly `bytes` writable bytes.
        check(
            unsafe {
                (self.cuda.drv.cuMemcpyDtoH)(out.as_mut_ptr() as *mut c_void, self.ptr, self.bytes)
            },
            "cuMemcpyDtoH",
        )
    }
}

impl Drop for DeviceTensor<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc and is freed once.
        unsafe { (self.cuda.drv.cuMemFree)(self.ptr) };
    }
}
