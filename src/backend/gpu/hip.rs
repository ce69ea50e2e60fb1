//! What only the HIP backend needs on the host, kept pure where it can be so it is tested
//! without AMD hardware: the arch from `hipDeviceProp_t.gcnArchName`, the ROCm 6/7 library
//! names and the order they are probed in, hipRTC's compile options and the runtime string.
//!
//! HIP's `hipDeviceGetAttribute` numbers its attributes its own way (CUDA's compute-capability
//! ids 75/76 are shared-memory sizes there), so the HIP attribute ids are listed here.

use std::ffi::{c_char, c_int, c_uint};

/// `hipDeviceAttributeMultiprocessorCount` (compute units).
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipDeviceAttributeMaxSharedMemoryPerBlock` (LDS bytes a workgroup may use).
pub const ATTR_MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
/// `hipDeviceAttributeWarpSize` (wave size: 64 on CDNA).
pub const ATTR_WARP_SIZE: c_int = 87;

/// The HIP runtime, newest first after the unversioned name (what the ROCm install points
/// at). ROCm 7 and pip-installed ROCm ship only the versioned names.
pub const RUNTIME_NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"];

/// hipRTC names to try: the one matching the runtime's major version first (hipRTC and the
/// runtime of one ROCm release belong together), then the same order as the runtime.
pub fn hiprtc_names(runtime_major: Option<i32>) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(major) = runtime_major.filter(|m| *m > 0) {
        names.push(format!("libhiprtc.so.{major}"));
    }
    for n in ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"] {
        if !names.iter().any(|have| have == n) {
            names.push(n.to_string());
        }
    }
    names
}

/// How one name is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `dlopen(RTLD_NOLOAD)`: only a copy the process already has (e.g. loaded by torch from
    /// its wheel). Two HIP runtimes in one process do not work, so an existing one wins.
    AlreadyLoaded,
    /// A normal `dlopen` through the loader's search path.
    Load,
}

/// Every name as already loaded, in order, then every name loaded, in order.
pub fn probe_plan<S: AsRef<str>>(names: &[S]) -> Vec<(String, Probe)> {
    let each = |p| names.iter().map(move |n| (n.as_ref().to_string(), p));
    each(Probe::AlreadyLoaded)
        .chain(each(Probe::Load))
        .collect()
}

/// The major version in a HIP version number (`HIP_VERSION`: major * 10^7 + minor * 10^5 +
/// patch, as `hipDriverGetVersion` reports it), if it is one.
pub fn version_major_minor(version: i32) -> Option<(i32, i32)> {
    (version >= 10_000_000).then_some((version / 10_000_000, (version / 100_000) % 100))
}

/// The processor of a target id: "gfx942:sramecc+:xnack-" → "gfx942", "gfx90a" → "gfx90a".
/// `None` unless it is "gfx" and at least one lower-case hex digit (a garbage arch must not
/// reach hipRTC's `--offload-arch`).
pub fn parse_gcn_arch(target_id: &str) -> Option<&str> {
    let processor = target_id.trim_end_matches('\0').trim().split(':').next()?;
    let digits = processor.strip_prefix("gfx")?;
    let ok = !digits.is_empty()
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(processor)
}

/// hipRTC options for `arch` ("gfx942"): the processor only (code for "xnack any, sramecc
/// any" loads whatever the device's setting), C++17, -O3 as hipRTC's default spelled out,
/// then the configuration's defines.
pub fn hiprtc_options(arch: &str, defines: &[String]) -> Vec<String> {
    let mut options = vec![
        format!("--offload-arch={arch}"),
        "-std=c++17".to_string(),
        "-O3".to_string(),
    ];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    options
}

/// `runtime_version` of the caps (at most 31 bytes): "HIP 6.4 / hipRTC 6.4".
pub fn runtime_version(hip_version: i32, rtc: (i32, i32)) -> String {
    let hip = version_major_minor(hip_version)
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|| hip_version.to_string());
    format!("HIP {hip} / hipRTC {}.{}", rtc.0, rtc.1)
}

/// `hipDeviceProp_tR0600`, the struct `hipGetDevicePropertiesR0600` fills in ROCm 6 and 7
/// (`hipGetDeviceProperties` is a macro for it in their headers; the plain symbol is the
/// ROCm 5 layout). Runs of fields moeplug does not read are kept as arrays of the same size;
/// the offsets are checked against a C compiler's layout of hip_runtime_api.h in the tests.
#[repr(C)]
pub struct DevicePropR0600 {
    pub name: [c_char; 256],
    pub uuid: [u8; 16],
    pub luid: [c_char; 8],
    pub luid_device_node_mask: c_uint,
    pub total_global_mem: usize,
    pub shared_mem_per_block: usize,
    pub regs_per_block: c_int,
    pub warp_size: c_int,
    pub mem_pitch: usize,
    pub max_threads_per_block: c_int,
    pub max_threads_dim: [c_int; 3],
    pub max_grid_size: [c_int; 3],
    pub clock_rate: c_int,
    pub total_const_mem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub texture_alignment: usize,
    pub texture_pitch_alignment: usize,
    pub device_overlap: c_int,
    pub multi_processor_count: c_int,
    /// kernelExecTimeoutEnabled .. maxSurfaceCubemapLayered.
    pub _limits: [c_int; 44],
    pub surface_alignment: usize,
    /// concurrentKernels .. localL1CacheSupported.
    pub _flags1: [c_int; 16],
    pub shared_mem_per_multiprocessor: usize,
    /// regsPerMultiprocessor .. cooperativeMultiDeviceLaunch.
    pub _flags2: [c_int; 12],
    pub shared_mem_per_block_optin: usize,
    /// pageableMemoryAccessUsesHostPageTables .. accessPolicyMaxWindowSize.
    pub _flags3: [c_int; 4],
    pub reserved_shared_mem_per_block: usize,
    /// hostRegisterSupported .. unifiedFunctionPointers, reserved[63], hipReserved[32].
    pub _flags4: [c_int; 108],
    pub gcn_arch_name: [c_char; 256],
    pub max_shared_memory_per_multiprocessor: usize,
    pub clock_instruction_rate: c_int,
    pub arch_flags: c_uint,
    pub hdp_mem_flush_cntl: *mut c_uint,
    pub hdp_reg_flush_cntl: *mut c_uint,
    /// cooperativeMultiDeviceUnmatched{Func,GridDim,BlockDim,SharedMem}, isLargeBar,
    /// asicRevision.
    pub _tail: [c_int; 6],
}

impl DevicePropR0600 {
    pub fn zeroed() -> Box<DevicePropR0600> {
        // SAFETY: every field is an integer, array of integers or raw pointer: all-zero is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }
}

/// A NUL-terminated C string in a fixed array (the whole array if it has no NUL).
pub fn c_array_str(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What the HIP backend knows of its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// The processor ("gfx942"): the caps' arch and hipRTC's `--offload-arch`.
    pub arch: String,
    /// The full target id ("gfx942:sramecc+:xnack-").
    pub target_id: String,
    pub compute_units: i32,
    pub lds_bytes_per_block: i64,
    pub wave_size: i32,
}

/// The device info from the properties, checked against what `hipDeviceGetName` and
/// `hipDeviceGetAttribute` said: a struct read at the wrong layout is refused, never used.
pub fn device_info(
    props: &DevicePropR0600,
    name: &str,
    compute_units: i32,
    lds_bytes_per_block: i64,
    wave_size: i32,
) -> Result<DeviceInfo, String> {
    let target_id = c_array_str(&props.gcn_arch_name);
    let prop_name = c_array_str(&props.name);
    let same = prop_name == name
        && props.multi_processor_count == compute_units
        && props.warp_size == wave_size
        && props.shared_mem_per_block as i64 == lds_bytes_per_block;
    if !same {
        return Err(format!(
            "hipGetDevicePropertiesR0600 disagrees with hipDeviceGetName/hipDeviceGetAttribute \
             (name '{prop_name}' vs '{name}', CUs {} vs {compute_units}, wave {} vs {wave_size}, \
             LDS {} vs {lds_bytes_per_block}): this ROCm's hipDeviceProp_t layout is not the one \
             moeplug knows",
            props.multi_processor_count, props.warp_size, props.shared_mem_per_block
        ));
    }
    let arch = parse_gcn_arch(&target_id).ok_or_else(|| {
        format!("gcnArchName '{target_id}' is not an AMD GPU target id (expected gfx...)")
    })?;
    if !matches!(wave_size, 32 | 64) {
        return Err(format!("wave size {wave_size} (expected 32 or 64)"));
    }
    Ok(DeviceInfo {
        name: name.to_string(),
        arch: arch.to_string(),
        target_id,
        compute_units,
        lds_bytes_per_block,
        wave_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn arch_is_the_processor_of_the_target_id() {
        assert_eq!(parse_gcn_arch("gfx942:sramecc+:xnack-"), Some("gfx942"));
        assert_eq!(parse_gcn_arch("gfx950:sramecc+:xnack-"), Some("gfx950"));
        assert_eq!(parse_gcn_arch("gfx90a:xnack+"), Some("gfx90a"));
        assert_eq!(parse_gcn_arch("gfx1100"), Some("gfx1100"));
        assert_eq!(parse_gcn_arch("gfx942\0\0\0"), Some("gfx942"));
        for bad in [
            "",
            "gfx",
            "sm_90",
            "gfx9x2",
            "GFX942",
            ":gfx942",
            "gfx942 junk",
            "\u{1}\u{2}",
        ] {
            assert_eq!(parse_gcn_arch(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn device_prop_layout_is_hip_runtime_api_h() {
        // Offsets printed by gcc (x86_64) for hipDeviceProp_tR0600 of ROCm's
        // include/hip/hip_runtime_api.h (HIP 6.x and the 7.x rocm-systems header agree).
        assert_eq!(offset_of!(DevicePropR0600, shared_mem_per_block), 296);
        assert_eq!(offset_of!(DevicePropR0600, warp_size), 308);
        assert_eq!(offset_of!(DevicePropR0600, major), 360);
        assert_eq!(offset_of!(DevicePropR0600, multi_processor_count), 388);
        assert_eq!(offset_of!(DevicePropR0600, surface_alignment), 568);
        assert_eq!(
            offset_of!(DevicePropR0600, shared_mem_per_multiprocessor),
            640
        );
        assert_eq!(offset_of!(DevicePropR0600, shared_mem_per_block_optin), 696);
        assert_eq!(
            offset_of!(DevicePropR0600, reserved_shared_mem_per_block),
            720
        );
        assert_eq!(offset_of!(DevicePropR0600, gcn_arch_name), 1160);
        assert_eq!(
            offset_of!(DevicePropR0600, max_shared_memory_per_multiprocessor),
            1416
        );
        assert_eq!(offset_of!(DevicePropR0600, clock_instruction_rate), 1424);
        assert_eq!(size_of::<DevicePropR0600>(), 1472);
    }

    fn fake_props(name: &str, target_id: &str) -> Box<DevicePropR0600> {
        let mut p = DevicePropR0600::zeroed();
        for (d, s) in p.name.iter_mut().zip(name.bytes()) {
            *d = s as c_char;
        }
        for (d, s) in p.gcn_arch_name.iter_mut().zip(target_id.bytes()) {
            *d = s as c_char;
        }
        p.multi_processor_count = 304;
        p.warp_size = 64;
        p.shared_mem_per_block = 65536;
        p
    }

    #[test]
    fn device_info_reads_the_arch_and_checks_the_layout() {
        let p = fake_props("AMD Instinct MI300X", "gfx942:sramecc+:xnack-");
        let info = device_info(&p, "AMD Instinct MI300X", 304, 65536, 64).unwrap();
        assert_eq!(
            info,
            DeviceInfo {
                name: "AMD Instinct MI300X".into(),
                arch: "gfx942".into(),
                target_id: "gfx942:sramecc+:xnack-".into(),
                compute_units: 304,
                lds_bytes_per_block: 65536,
                wave_size: 64,
            }
        );
        // A struct that does not agree with the attribute queries is refused.
        let e = device_info(&p, "AMD Instinct MI300X", 228, 65536, 64).unwrap_err();
        assert!(e.contains("CUs 304 vs 228"), "{e}");
        assert!(e.contains("layout is not the one moeplug knows"), "{e}");
        let e = device_info(&p, "other", 304, 65536, 64).unwrap_err();
        assert!(e.contains("name 'AMD Instinct MI300X' vs 'other'"), "{e}");
        // An arch string that is not a target id never reaches hipRTC.
        let p = fake_props("X", "sm_90");
        let e = device_info(&p, "X", 304, 65536, 64).unwrap_err();
        assert_eq!(
            e,
            "gcnArchName 'sm_90' is not an AMD GPU target id (expected gfx...)"
        );
    }

    #[test]
    fn libraries_are_probed_already_loaded_first_then_newest() {
        assert_eq!(
            RUNTIME_NAMES,
            ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"]
        );
        let plan = probe_plan(&RUNTIME_NAMES);
        let expect: Vec<(String, Probe)> = [Probe::AlreadyLoaded, Probe::Load]
            .iter()
            .flat_map(|&p| RUNTIME_NAMES.iter().map(move |n| (n.to_string(), p)))
            .collect();
        assert_eq!(plan, expect);
        assert_eq!(
            hiprtc_names(Some(6)),
            ["libhiprtc.so.6", "libhiprtc.so", "libhiprtc.so.7"]
        );
        assert_eq!(
            hiprtc_names(Some(7)),
            ["libhiprtc.so.7", "libhiprtc.so", "libhiprtc.so.6"]
        );
        assert_eq!(
            hiprtc_names(None),
            ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"]
        );
        assert_eq!(
            hiprtc_names(Some(8)),
            [
                "libhiprtc.so.8",
                "libhiprtc.so",
                "libhiprtc.so.7",
                "libhiprtc.so.6"
            ]
        );
    }

    #[test]
    fn versions_and_options() {
        assert_eq!(version_major_minor(60_342_134), Some((6, 3)));
        assert_eq!(version_major_minor(70_051_831), Some((7, 0)));
        assert_eq!(version_major_minor(12080), None); // a CUDA-style number is not HIP's
        assert_eq!(runtime_version(60_342_134, (6, 3)), "HIP 6.3 / hipRTC 6.3");
        assert!(runtime_version(70_251_831, (7, 2)).len() < 32);
        assert_eq!(
            hiprtc_options("gfx950", &["FAMILY=0".into(), "WFMT=6".into()]),
            [
                "--offload-arch=gfx950",
                "-std=c++17",
                "-O3",
                "-DFAMILY=0",
                "-DWFMT=6"
            ]
        );
    }
}
