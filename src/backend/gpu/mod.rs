//! GPU backends (CUDA and HIP through one code path). Vendor runtimes are loaded at run time
//! (`driver`): a missing library or symbol is BACKEND_UNAVAILABLE with a message, never a
//! crash. Kernels (`kernels/*.cu`) are compiled for the device's arch and cached (`cache`).

pub mod cache;
pub mod compile_check;
pub mod driver;
pub mod heuristics;
pub mod hip;
pub mod kernel_configs;
pub mod launch;
#[cfg(test)]
pub(crate) mod mirror;
pub mod pointer;
pub mod prep;
pub mod selftest;
pub mod selftest_run;
pub mod spec;
pub mod tma;

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use once_cell::sync::Lazy;

use super::{Backend, Caps};
use crate::error::{Error, Result};
use crate::moe::{MoeConfig, MoeLaunch};
use crate::types::{feature, ActDtype, Activation, BackendKind, WeightFormat};
use driver::{Api, Handle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The driver library that must load for this vendor (HIP: the first of
    /// [`hip::RUNTIME_NAMES`] that opens).
    pub fn driver_library(self) -> &'static str {
        match self {
            Vendor::Cuda => "libcuda.so.1",
            Vendor::Hip => hip::RUNTIME_NAMES[0],
        }
    }
    pub fn backend_kind(self) -> BackendKind {
        match self {
            Vendor::Cuda => BackendKind::Cuda,
            Vendor::Hip => BackendKind::Hip,
        }
    }
    /// The device memory kind of this vendor's tensors.
    pub fn device_kind(self) -> crate::tensor::DeviceKind {
        match self {
            Vendor::Cuda => crate::tensor::DeviceKind::Cuda,
            Vendor::Hip => crate::tensor::DeviceKind::Rocm,
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

/// The loaded runtime of each vendor, or why it could not be loaded (tried once).
static CUDA_API: Lazy<Result<Api>> = Lazy::new(|| {
    let api = driver::load(Vendor::Cuda)?;
    // SAFETY: cuInit(0) is the documented first call; it may be repeated.
    let rc = unsafe { (api.cuInit)(0) };
    if rc != 0 {
        return Err(Error::unavailable(format!(
            "cuInit failed: {} (no usable NVIDIA GPU or driver)",
            api.error_name(rc)
        )));
    }
    Ok(api)
});
static HIP_API: Lazy<Result<Api>> = Lazy::new(|| {
    let api = driver::load(Vendor::Hip)?;
    // SAFETY: hipInit(0) is the documented first call of the module API; it may be repeated.
    let rc = unsafe { (api.cuInit)(0) };
    if rc != 0 {
        return Err(Error::unavailable(format!(
            "hipInit failed: {} (no usable AMD GPU or driver; {})",
            api.error_name(rc),
            api.driver_library
        )));
    }
    Ok(api)
});

/// One backend per (vendor, device), opened on first use.
type DeviceTable = HashMap<(Vendor, i32), Arc<GpuBackend>>;
static DEVICES: Lazy<Mutex<DeviceTable>> = Lazy::new(|| Mutex::new(HashMap::new()));

pub fn backend(vendor: Vendor, device_id: i32) -> Result<Arc<dyn Backend>> {
    if device_id < 0 {
        return Err(Error::invalid(format!(
            "device_id: expected >= 0, got {device_id}"
        )));
    }
    let api = match vendor {
        Vendor::Cuda => &*CUDA_API,
        Vendor::Hip => &*HIP_API,
    };
    let api: &'static Api = api.as_ref().map_err(|e| e.clone())?;
    let mut devices = DEVICES
        .lock()
        .map_err(|_| Error::internal("device table poisoned"))?;
    if let Some(b) = devices.get(&(vendor, device_id)) {
        return Ok(b.clone());
    }
    let b = Arc::new(GpuBackend::open(api, device_id)?);
    devices.insert((vendor, device_id), b.clone());
    Ok(b)
}

/// The kernels of one compiled configuration.
#[derive(Clone, Copy)]
struct Kernels {
    route: Handle,
    stage1: Handle,
    stage2: Handle,
    reduce: Handle,
    amax1: Handle,
    amax2: Handle,
    quant1: Handle,
    quant2: Handle,
    /// Pre-quantized hidden_states into the stage-1 workspace.
    import1: Handle,
    /// Dynamic shared memory of this module's GEMM blocks (`KernelSpec::dynamic_shared_bytes`
    /// of its spec): what stage 1 / stage 2 were set up for at load and are launched with.
    gemm_shared: u32,
}
// Function handles are process-wide driver objects, usable from any thread.
unsafe impl Send for Kernels {}

pub struct GpuBackend {
    api: &'static Api,
    device_id: i32,
    ctx: Handle,
    arch: String,
    name: String,
    runtime_version: String,
    kernels: Mutex<HashMap<Vec<String>, Kernels>>,
    /// What the self-test before first use accepted (`selftest_run`).
    selftest: selftest_run::SelfTest,
    /// "gfx942:sramecc+:xnack-, 304 CUs, wave64, 64 KiB LDS per block" (for `info`).
    details: String,
    /// Multiprocessors: the grid of persistent kernels.
    compute_units: u32,
    /// Device tensors are checked against the driver before launches and device prep
    /// (`pointer`): the driver has the query and it passed its probe on this device.
    check_pointers: bool,
}
// The primary context handle is shared by the driver across threads.
unsafe impl Send for GpuBackend {}
unsafe impl Sync for GpuBackend {}

/// Pushes the device's primary context for the scope of a call, pops it on drop.
struct CtxGuard<'a>(&'a Api);
impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        let mut old: Handle = std::ptr::null_mut();
        // SAFETY: pops what `GpuBackend::enter` pushed on this thread.
        unsafe { (self.0.cuCtxPopCurrent)(&mut old) };
    }
}

const CC_MAJOR: i32 = 75; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR (CUDA only)
const CC_MINOR: i32 = 76;
const CU_MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
const CU_WARP_SIZE: i32 = 10;
const CU_MULTIPROCESSOR_COUNT: i32 = 16;

/// What a device is, read without touching its context.
struct Device {
    /// The driver's device handle.
    handle: i32,
    name: String,
    /// Compile target: "sm_90" / "gfx942".
    arch: String,
    /// HIP's full target id ("gfx942:sramecc+:xnack-"); the arch on CUDA.
    target_id: String,
    compute_units: i32,
    lds_bytes_per_block: i64,
    wave_size: i32,
    runtime_version: String,
}

impl Device {
    fn describe(api: &Api, device_id: i32) -> Result<Device> {
        let mut dev = 0;
        // SAFETY: plain driver queries with valid out-pointers.
        unsafe {
            let rc = (api.cuDeviceGet)(&mut dev, device_id);
            if rc != 0 {
                return Err(Error::invalid(format!(
                    "device_id: no {} device {device_id} ({})",
                    api.vendor.name(),
                    api.error_name(rc)
                )));
            }
            let mut drv = 0;
            api.check((api.cuDriverGetVersion)(&mut drv), "cuDriverGetVersion")?;
            let mut name = [0 as std::ffi::c_char; 256];
            api.check(
                (api.cuDeviceGetName)(name.as_mut_ptr(), 256, dev),
                "cuDeviceGetName",
            )?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let rtc = api.rtc_version()?;
            match api.vendor {
                Vendor::Cuda => {
                    let (mut major, mut minor) = (0, 0);
                    api.check(
                        (api.cuDeviceGetAttribute)(&mut major, CC_MAJOR, dev),
                        "cuDeviceGetAttribute(compute capability major)",
                    )?;
                    api.check(
                        (api.cuDeviceGetAttribute)(&mut minor, CC_MINOR, dev),
                        "cuDeviceGetAttribute(compute capability minor)",
                    )?;
                    let (mut sms, mut smem, mut warp) = (0, 0, 0);
                    api.check(
                        (api.cuDeviceGetAttribute)(&mut sms, CU_MULTIPROCESSOR_COUNT, dev),
                        "cuDeviceGetAttribute(multiprocessor count)",
                    )?;
                    api.check(
                        (api.cuDeviceGetAttribute)(&mut smem, CU_MAX_SHARED_MEMORY_PER_BLOCK, dev),
                        "cuDeviceGetAttribute(shared memory per block)",
                    )?;
                    api.check(
                        (api.cuDeviceGetAttribute)(&mut warp, CU_WARP_SIZE, dev),
                        "cuDeviceGetAttribute(warp size)",
                    )?;
                    let arch = format!("sm_{major}{minor}");
                    Ok(Device {
                        handle: dev,
                        name,
                        target_id: arch.clone(),
                        arch,
                        compute_units: sms,
                        lds_bytes_per_block: smem as i64,
                        wave_size: warp,
                        runtime_version: format!(
                            "CUDA driver {}.{} / NVRTC {}.{}",
                            drv / 1000,
                            (drv % 1000) / 10,
                            rtc.0,
                            rtc.1
                        ),
                    })
                }
                Vendor::Hip => {
                    let attr = |id: i32, what: &str| -> Result<i32> {
                        let mut v = 0;
                        api.check(
                            (api.cuDeviceGetAttribute)(&mut v, id, dev),
                            &format!("hipDeviceGetAttribute({what})"),
                        )?;
                        Ok(v)
                    };
                    let cus = attr(hip::ATTR_MULTIPROCESSOR_COUNT, "multiprocessor count")?;
                    let lds = attr(hip::ATTR_MAX_SHARED_MEMORY_PER_BLOCK, "shared memory")?;
                    let wave = attr(hip::ATTR_WARP_SIZE, "warp size")?;
                    let get_props = api.hipGetDevicePropertiesR0600.ok_or_else(|| {
                        Error::internal("HIP table without hipGetDevicePropertiesR0600")
                    })?;
                    let mut props = hip::DevicePropR0600::zeroed();
                    api.check(
                        get_props(&mut *props as *mut hip::DevicePropR0600 as *mut c_void, dev),
                        "hipGetDevicePropertiesR0600",
                    )?;
                    let info = hip::device_info(&props, &name, cus, lds as i64, wave)
                        .map_err(|e| Error::unavailable(format!("rocm:{device_id}: {e}")))?;
                    Ok(Device {
                        handle: dev,
                        name,
                        arch: info.arch,
                        target_id: info.target_id,
                        compute_units: info.compute_units,
                        lds_bytes_per_block: info.lds_bytes_per_block,
                        wave_size: info.wave_size,
                        runtime_version: hip::runtime_version(drv, rtc),
                    })
                }
            }
        }
    }
}

impl GpuBackend {
    fn open(api: &'static Api, device_id: i32) -> Result<GpuBackend> {
        let d = Device::describe(api, device_id)?;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: retains the primary context of a device handle the driver gave us.
        api.check(
            unsafe { (api.cuDevicePrimaryCtxRetain)(&mut ctx, d.handle) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let mut b = GpuBackend {
            api,
            device_id,
            ctx,
            arch: d.arch,
            name: d.name,
            runtime_version: d.runtime_version,
            kernels: Mutex::new(HashMap::new()),
            selftest: selftest_run::SelfTest::unproven("not run yet"),
            compute_units: d.compute_units.max(1) as u32,
            check_pointers: false,
            details: format!(
                "{}, {} CUs, wave{}, {} KiB LDS per block",
                d.target_id,
                d.compute_units,
                d.wave_size,
                d.lds_bytes_per_block / 1024
            ),
        };
        b.check_pointers = {
            let _ctx = b.enter()?;
            pointer::probe(api, device_id).unwrap_or_else(|why| {
                crate::runtime::log::emit(crate::runtime::log::Level::Warn, || {
                    format!(
                        "{}: device tensors will not be checked: the pointer query's answer \
                         for a fresh allocation did not read as expected ({why})",
                        b.label()
                    )
                });
                false
            })
        };
        // The first open of a device proves its kernels before anyone can launch them (HIP
        // included: an unvalidated backend either passes here or refuses).
        b.selftest = selftest_run::run(&b).map_err(|e| {
            let mut message = if e.status == crate::error::Status::BackendUnavailable {
                e.message
            } else {
                format!(
                    "{}: the self-test before first use could not run: {}",
                    b.label(),
                    e.message
                )
            };
            if message.contains("STREAM_CAPTURE") {
                message.push_str(
                    " (the device was first opened while a stream was capturing a graph: \
                     call moeplug_get_caps for it before capturing)",
                );
            }
            Error::unavailable(message)
        })?;
        Ok(b)
    }

    /// "cuda:0 (sm_90)" / "rocm:0 (gfx942)", for messages.
    fn label(&self) -> String {
        let prefix = match self.api.vendor {
            Vendor::Cuda => "cuda",
            Vendor::Hip => "rocm",
        };
        format!("{prefix}:{} ({})", self.device_id, self.arch)
    }

    /// What the self-test before first use concluded on this device.
    pub fn selftest(&self) -> &selftest_run::SelfTest {
        &self.selftest
    }

    fn enter(&self) -> Result<CtxGuard<'_>> {
        // SAFETY: the primary context was retained in `open` and is never released.
        self.api.check(
            unsafe { (self.api.cuCtxPushCurrent)(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(CtxGuard(self.api))
    }

    /// The kernels for `defines`, compiled (or read from the disk cache) and loaded once
    /// per device and configuration.
    fn kernels(&self, spec: &spec::KernelSpec) -> Result<Kernels> {
        let defines = spec.defines();
        let mut map = self
            .kernels
            .lock()
            .map_err(|_| Error::internal("kernel table poisoned"))?;
        if let Some(k) = map.get(&defines) {
            return Ok(*k);
        }
        let compiled = cache::compile(self.api, &spec.compile_arch(&self.arch), &defines)?;
        record_compile(&compiled);
        let module = self.api.load_module(&compiled.binary, "fused_moe")?;
        let get = |name: &CStr| self.api.function(module, name);
        let k = Kernels {
            route: get(c"moe_route")?,
            stage1: get(c"moe_stage1")?,
            stage2: get(c"moe_stage2")?,
            reduce: get(c"moe_reduce")?,
            amax1: get(c"moe_amax1")?,
            amax2: get(c"moe_amax2")?,
            quant1: get(c"moe_quant1")?,
            quant2: get(c"moe_quant2")?,
            import1: get(c"moe_import1")?,
            gemm_shared: spec.dynamic_shared_bytes() as u32,
        };
        if k.gemm_shared > 48 * 1024 {
            for f in [k.stage1, k.stage2] {
                self.api.set_max_dynamic_shared(f, k.gemm_shared as usize)?;
            }
        }
        map.insert(defines, k);
        Ok(k)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        f: Handle,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        stream: Handle,
        params: &launch::KernelParams,
        map: Option<&tma::TensorMap>,
        pdl: bool,
        what: &str,
    ) -> Result<()> {
        let mut args = [
            params as *const launch::KernelParams as *mut c_void,
            map.map_or(std::ptr::null_mut(), |m| {
                m as *const tma::TensorMap as *mut c_void
            }),
        ];
        if pdl {
            let Some(launch_ex) = self.api.cuLaunchKernelEx else {
                return Err(Error::internal(
                    "a PDL kernel without cuLaunchKernelEx (for_driver clears PDL)",
                ));
            };
            let mut attr = driver::LaunchAttribute {
                id: driver::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: 0,
                value: [0; 64],
            };
            attr.value[..4].copy_from_slice(&1i32.to_ne_bytes()); // allowed = 1
            let config = driver::LaunchConfig {
                grid: [grid.0, grid.1, 1],
                block: [block, 1, 1],
                shared_bytes: shared,
                stream,
                attrs: &mut attr,
                num_attrs: 1,
            };
            // SAFETY: as below; `config` and its one attribute outlive the call.
            let rc = unsafe { launch_ex(&config, f, args.as_mut_ptr(), std::ptr::null_mut()) };
            return self
                .api
                .check(rc, &format!("cuLaunchKernelEx({what}, PDL)"));
        }
        // SAFETY: by-value parameters matching the kernel's: `Params`, then (wgmma with
        // WG_TMA) its weights' tensor map; the driver reads as many as the kernel declares.
        let rc = unsafe {
            (self.api.cuLaunchKernel)(
                f,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                shared,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.api.check(rc, &format!("cuLaunchKernel({what})"))
    }
}

/// What the kernels can run on CUDA, exactly what tests/gpu proves on an H200.
pub fn gpu_caps(arch: &str, runtime_version: &str) -> Caps {
    vendor_caps(Vendor::Cuda, arch, runtime_version)
}

/// What the kernels can run: the CPU backend's masks (every format, activation dtype, gate
/// mode, activation, layout and feature) plus graph capture and device prep, with the
/// vendor's backend kind. A separate stage-2 act dtype and the activation NONE run on the
/// families that cover them (heuristics: fp32, tile32, stream), so every launch has one.
pub fn vendor_caps(vendor: Vendor, arch: &str, runtime_version: &str) -> Caps {
    let mut caps = Caps::full_fused_moe(
        vendor.backend_kind(),
        arch.to_string(),
        runtime_version.to_string(),
    );
    // Device tensors in every prep call (gpu::prep, tests/gpu/test_prep_device.py).
    caps.features |= feature::GRAPH_CAPTURE | feature::DEVICE_PREP;
    // Proven on the H200 for every format and family (tests/gpu/test_fused_moe.py
    // test_deterministic, docs/determinism.md); no HIP run yet.
    if vendor == Vendor::Cuda {
        caps.features |= feature::DETERMINISTIC;
    }
    caps.activations = Activation::mask_of(GPU_ACTIVATIONS);
    caps
}

/// The activations the GPU kernels implement: all of them (NONE on the families that map a
/// non-gated stage 1, heuristics::family_unsupported).
pub const GPU_ACTIVATIONS: &[Activation] = Activation::ALL;

impl Backend for GpuBackend {
    fn kind(&self) -> BackendKind {
        self.api.vendor.backend_kind()
    }

    /// The vendor's caps, without DEVICE_PREP where the self-test refused device prep.
    fn caps(&self) -> Caps {
        let mut caps = vendor_caps(self.api.vendor, &self.arch, &self.runtime_version);
        if self.selftest.prep_refused.is_some() {
            caps.features &= !feature::DEVICE_PREP;
        }
        caps
    }

    /// The masks, the format's allowed activation dtypes, and a record every reader can
    /// index (as the CPU backend).
    fn check(&self, config: &MoeConfig) -> Result<()> {
        super::check_against_caps(&self.caps(), config)?;
        crate::moe::check::check_record(&config.layout)
    }

    fn workspace_size(&self, launch: &MoeLaunch) -> Result<usize> {
        let accepted = self.selftest.accepted;
        Ok(launch::validate_among(&self.caps(), launch, accepted)?.workspace_bytes)
    }

    fn fused_moe(&self, l: &MoeLaunch) -> Result<()> {
        let plan = launch::validate_among(&self.caps(), l, self.selftest.accepted)?;
        self.run_plan(l, &plan)
    }

    /// The prep steps as kernels on the caller's stream (`prep`): no allocation, no sync.
    unsafe fn run_prep(&self, job: &crate::prep::request::PrepJob, stream: usize) -> Result<()> {
        if let Some(why) = &self.selftest.prep_refused {
            return Err(Error::unsupported(format!(
                "device prep on {} was refused by the self-test before first use ({why}); \
                 prepare on the host",
                self.label()
            )));
        }
        prep::run_job(
            self.api.vendor,
            self.device_id,
            stream as *mut std::ffi::c_void,
            job,
        )
    }
}

impl GpuBackend {
    /// `spec` as this driver can run it: without the TMA encoder the wgmma family copies its
    /// weight tiles per thread (and so without its warp-specialised kernel, which needs TMA
    /// except for MXFP4's packs).
    fn for_driver(&self, spec: &spec::KernelSpec) -> spec::KernelSpec {
        let mut s = spec.clone();
        s.wgmma_tma &= self.api.cuTensorMapEncodeTiled.is_some();
        s.wgmma_ws &= s.wgmma_tma || s.weight_format == WeightFormat::Mxfp4;
        // What only the warp-specialised kernel has goes with it.
        s.wgmma_ksplit &= s.wgmma_ws;
        if !s.wgmma_ws {
            s.wgmma_decoders = 0;
        }
        if self.api.cuLaunchKernelEx.is_none() {
            s.pdl = spec::Pdl::Off;
        }
        s
    }

    /// The kernels of a planned launch on the launch's stream (the plan's family, chosen by the
    /// heuristics or forced by the self-test).
    fn run_plan(&self, l: &MoeLaunch, plan: &launch::Plan) -> Result<()> {
        if plan.m == 0 {
            return Ok(());
        }
        let ws = launch::workspace_ptr(l, plan)?;
        let _ctx = self.enter()?;
        // Every tensor the kernels may touch is memory of this device (one query each).
        if self.check_pointers {
            pointer::check_tensors(self.api, self.device_id, l.tensors())?;
        }
        let (spec, spec2) = (self.for_driver(&plan.spec), self.for_driver(&plan.spec2));
        let k = self.kernels(&spec)?;
        // Stage 2 from the module of its own act dtype (the same module when it is the same).
        let k2 = self.kernels(&spec2)?;
        // A kernel launched as a programmatic dependent must wait on its predecessor: only
        // modules compiled with PDL do (a PDL module launched plainly waits on nothing).
        let pdl = spec.pdl.on() && spec2.pdl.on();
        let p = launch::params(l, plan, ws);
        let maps = if spec.wgmma_tma {
            let [w13, w2] = launch::tma_weights(l, &spec);
            Some([
                tma::weight_map(self.api, &w13)?,
                tma::weight_map(self.api, &w2)?,
            ])
        } else {
            None
        };
        let stream = l.stream as Handle;
        let tiles = plan.max_tiles as u32;
        let (n1, _) = spec.block_columns();
        let c = &l.config.layout;
        let (act, act2) = (l.config.act_dtype, l.config.stage2_act_dtype);
        let rows = |n: usize| (n as u32, 1);
        let pairs = plan.m * plan.topk;
        let gemm =
            |f, grid, what| self.launch(f, grid, launch::THREADS, 0, stream, &p, None, pdl, what);
        let threads = spec.gemm_threads();
        // A persistent GEMM walks every (tile, column block) from one block per SM; its kernel
        // also runs from one block per work item (w = blockIdx.x). Decided once per launch.
        let walk = heuristics::persistent_grid(&spec, l);
        let persistent = |grid: (u32, u32)| match (spec.persistent(), walk) {
            (false, _) => grid,
            (true, true) => ((grid.0 * grid.1).min(self.compute_units), 1),
            (true, false) => (grid.0 * grid.1, 1),
        };
        // Each stage from its module with that module's shared size (stage 2's module is
        // another where the stage-2 act dtype differs).
        let stage = |f, shared, grid, map: Option<&tma::TensorMap>, what| {
            self.launch(
                f,
                persistent(grid),
                threads,
                shared,
                stream,
                &p,
                map,
                pdl,
                what,
            )
        };
        // Blocks 1 .. M of the route kernel quantize the hidden_states rows (QUANT1_IN_ROUTE).
        let route_quant1 = spec.route_quant1 && !l.config.prequantized_input;
        let route_blocks = 1 + if route_quant1 { plan.m as u32 } else { 0 };
        self.launch(
            k.route,
            (route_blocks, 1),
            launch::ROUTE_THREADS,
            plan.route_shared_bytes as u32,
            stream,
            &p,
            None,
            pdl,
            "moe_route",
        )?;
        // A static scale replaces the amax (quant_rows reads it).
        let [static1, static2] = l.config.static_act_scale;
        if act == ActDtype::Fp8PerTensor && !static1 {
            gemm(k.amax1, rows(plan.m), "moe_amax1")?;
        }
        if l.config.prequantized_input {
            gemm(k.import1, rows(plan.m), "moe_import1")?;
        } else if act.is_quantized() && !route_quant1 {
            gemm(k.quant1, rows(plan.m), "moe_quant1")?;
        }
        stage(
            k.stage1,
            k.gemm_shared,
            (tiles, c.intermediate_size.div_ceil(n1) as u32),
            maps.as_ref().map(|m| &m[0]),
            "moe_stage1",
        )?;
        if act2 == ActDtype::Fp8PerTensor && !static2 {
            gemm(k2.amax2, rows(pairs), "moe_amax2")?;
        }
        if act2.is_quantized() && !spec.fused_quant2 {
            gemm(k2.quant2, rows(pairs), "moe_quant2")?;
        }
        stage(
            k2.stage2,
            k2.gemm_shared,
            (
                tiles + plan.combine_zero_blocks as u32,
                plan.stage2_column_blocks as u32,
            ),
            maps.as_ref().map(|m| &m[1]),
            "moe_stage2",
        )?;
        if spec2.fused_combine {
            return Ok(()); // stage 2 wrote the output
        }
        gemm(
            k2.reduce,
            (
                plan.m as u32,
                (plan.out_cols as u32).div_ceil(launch::THREADS),
            ),
            "moe_reduce",
        )
    }
}

/// Cold compile statistics for `describe`.
static COMPILES: Lazy<Mutex<(usize, usize, f64)>> = Lazy::new(|| Mutex::new((0, 0, 0.0)));

fn record_compile(c: &cache::Compiled) {
    if let Ok(mut s) = COMPILES.lock() {
        if c.from_disk {
            s.1 += 1;
        } else {
            s.0 += 1;
            s.2 += c.seconds;
        }
    }
}

/// A few lines for `moeplug info`: the runtime, the device, the kernel cache directory and
/// the cold compile time of the fused MoE kernels (measured now, bypassing the disk cache).
pub fn describe() -> String {
    let mut out = String::new();
    let dir = cache::cache_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|| "(none: set MOEPLUG_CACHE_DIR or HOME)".into());
    out.push_str(&format!("kernel cache: {dir}\n"));
    // An AMD device that opened (its self-test passed): what it is and what the test said.
    if let Some(g) = open_device(Vendor::Hip, 0) {
        out.push_str(&format!(
            "rocm:0: {} ({}), {}\n",
            g.name, g.details, g.runtime_version
        ));
        out.push_str(&format!("rocm:0 {}\n", g.selftest.line()));
    }
    let b = match backend(Vendor::Cuda, 0) {
        Ok(b) => b,
        Err(e) => {
            out.push_str(&format!("cuda: unavailable: {}\n", e.message));
            return out;
        }
    };
    let caps = b.caps();
    out.push_str(&format!(
        "cuda:0: {} ({}), {}\n",
        DEVICES
            .lock()
            .ok()
            .and_then(|d| d.get(&(Vendor::Cuda, 0)).map(|g| g.name.clone()))
            .unwrap_or_default(),
        caps.arch,
        caps.runtime_version
    ));
    if let Some(g) = open_device(Vendor::Cuda, 0) {
        out.push_str(&format!("cuda:0 {}\n", g.selftest.line()));
    }
    if let Ok(api) = CUDA_API.as_ref() {
        let probed = open_device(Vendor::Cuda, 0).map(|g| g.check_pointers);
        out.push_str(&pointer::describe(api, probed));
        // A cold compile of the default configuration, not read from or written to the cache.
        let defines = default_spec().defines();
        let start = std::time::Instant::now();
        match cache::compile_uncached(api, &caps.arch, &defines) {
            Ok(bin) => out.push_str(&format!(
                "fused_moe kernels: cold compile {:.2} s ({} KiB cubin)\n",
                start.elapsed().as_secs_f64(),
                bin.len() / 1024
            )),
            Err(e) => out.push_str(&format!("fused_moe kernels: compile failed: {}\n", e)),
        }
    }
    if let Ok(s) = COMPILES.lock() {
        out.push_str(&format!(
            "this process: {} configurations compiled ({:.2} s), {} read from the cache\n",
            s.0, s.2, s.1
        ));
    }
    out
}

/// The backend of a device, if it opens.
fn open_device(vendor: Vendor, device_id: i32) -> Option<Arc<GpuBackend>> {
    backend(vendor, device_id).ok()?;
    DEVICES.lock().ok()?.get(&(vendor, device_id)).cloned()
}

/// The configuration `describe` compiles cold: bf16 weights in the AITER layout, separated
/// gate/up, SiLU, bf16 everywhere, on the decode family.
fn default_spec() -> spec::KernelSpec {
    use crate::types::*;
    spec::KernelSpec {
        family: spec::Family::Stream,
        weight_format: WeightFormat::Bf16,
        weight_layout: WeightLayout::Aiter16x16,
        scale_layout: None,
        gate_mode: GateMode::Separated,
        activation: Activation::Silu,
        act_dtype: ActDtype::Bf16,
        stage2_act_dtype: ActDtype::Bf16,
        in_f16: false,
        out_f16: false,
        has_bias: false,
        router_weight_on_input: false,
        has_mask: false,
        fp8_fnuz: false,
        split_k: [8, 8],
        stream_bm: 16,
        stream_prefetch: spec::StreamPrefetch::Off,
        stream_ahead: 1,
        stream_x_shared: false,
        stream_bias_prefetch: false,
        pdl: spec::Pdl::Off,
        wgmma_n: 128,
        wgmma_bm: 128,
        wgmma_blocks: 1,
        wgmma_tma: false,
        wgmma_ws: false,
        wgmma_rs: false,
        wgmma_group: 0,
        wgmma_ksplit: false,
        wgmma_decoders: 0,
        wgmma_pack_copies: false,
        wgmma_bulk_packs: false,
        fused_combine: false,
        fused_quant2: false,
        route_quant1: false,
        partials_16: false,
    }
}

impl GpuBackend {
    pub fn device_id(&self) -> i32 {
        self.device_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    #[test]
    fn cuda_without_a_driver_is_unavailable_not_a_crash() {
        // On machines without libcuda (CI, the dev box) the answer is BACKEND_UNAVAILABLE
        // with the loader's reason; where a driver exists it must open device 0 or say why.
        match (probe_library("libcuda.so.1"), backend(Vendor::Cuda, 0)) {
            (Err(_), Err(e)) => {
                assert_eq!(e.status, Status::BackendUnavailable);
                assert!(e.message.contains("libcuda.so.1"), "{}", e.message);
            }
            (Err(_), Ok(_)) => panic!("a CUDA backend without libcuda.so.1"),
            (Ok(_), r) => {
                if let Err(e) = r {
                    assert!(
                        matches!(e.status, Status::BackendUnavailable | Status::DeviceError),
                        "{e}"
                    );
                }
            }
        }
        let e = backend(Vendor::Cuda, -1).err().expect("negative device id");
        assert_eq!(e.status, Status::InvalidArgument);
    }

    #[test]
    fn hip_is_unavailable_here() {
        let e = backend(Vendor::Hip, 0)
            .err()
            .expect("no validated HIP backend");
        assert_eq!(e.status, Status::BackendUnavailable);
        if hip::RUNTIME_NAMES.iter().all(|n| probe_library(n).is_err()) {
            // Without ROCm the loader names every ROCm 6/7 runtime it tried.
            assert!(
                e.message.starts_with(
                    "the HIP runtime (libamdhip64.so, libamdhip64.so.7, libamdhip64.so.6) could not be loaded: "
                ),
                "{}",
                e.message
            );
            for n in hip::RUNTIME_NAMES {
                assert!(e.message.contains(&format!("{n}: ")), "{}", e.message);
            }
        } else {
            // With ROCm but no AMD GPU here, the runtime or the device says why.
            assert!(
                e.message.contains("self-test before first use")
                    || e.message.contains("hipInit failed")
                    || e.message.contains("hipRTC")
                    || e.message.contains("run-time compiler"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn hip_caps_say_hip() {
        let caps = vendor_caps(Vendor::Hip, "gfx942", "HIP 6.4 / hipRTC 6.4");
        assert_eq!(caps.backend, Some(BackendKind::Hip));
        assert_eq!(caps.arch, "gfx942");
        assert_eq!(caps.runtime_version, "HIP 6.4 / hipRTC 6.4");
        assert_eq!(gpu_caps("sm_90", "x").backend, Some(BackendKind::Cuda));
        assert_eq!(Vendor::Hip.backend_kind().label(), "hip");
        // Same masks on both vendors: one set of kernels; determinism proven on CUDA only.
        let cuda = gpu_caps("gfx942", "HIP 6.4 / hipRTC 6.4");
        assert_eq!(
            Caps {
                backend: cuda.backend,
                features: caps.features | feature::DETERMINISTIC,
                ..caps
            },
            cuda
        );
    }

    #[test]
    fn describe_names_the_cache_dir() {
        assert!(describe().contains("kernel cache:"));
    }
}
