//! Kernel compilation with the run-time compiler and an on-disk cache of the binaries.
//!
//! Key = hash of (source, header, options, arch, compiler version, moeplug version). The
//! directory is `MOEPLUG_CACHE_DIR`, else `$XDG_CACHE_HOME/moeplug`, else
//! `~/.cache/moeplug`. Files are written to a temporary name and renamed, so concurrent
//! processes never read a half-written binary. A cache that cannot be written warns once on
//! stderr and compilation still works.

use std::ffi::{c_char, CString};
use std::hash::Hasher;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result, Status};

use super::driver::{Api, Handle};

/// The kernel sources, embedded at build time.
pub const PORT_HEADER: &str = include_str!("../../../kernels/moeplug_port.h");
pub const FUSED_MOE_SOURCE: &str = include_str!("../../../kernels/fused_moe.cu");
pub const PREP_SOURCE: &str = include_str!("../../../kernels/prep.cu");
/// Every header a kernel source may include, by the name it is included as.
pub const KERNEL_HEADERS: [(&str, &str); 13] = [
    ("moeplug_port.h", PORT_HEADER),
    (
        "moe_common.cuh",
        include_str!("../../../kernels/moe_common.cuh"),
    ),
    (
        "mma_sm80.cuh",
        include_str!("../../../kernels/mma_sm80.cuh"),
    ),
    (
        "moe_gemm_fp32.cuh",
        include_str!("../../../kernels/moe_gemm_fp32.cuh"),
    ),
    (
        "moe_gemm_tile32.cuh",
        include_str!("../../../kernels/moe_gemm_tile32.cuh"),
    ),
    ("mx_bf16.cuh", include_str!("../../../kernels/mx_bf16.cuh")),
    (
        "cp_async.cuh",
        include_str!("../../../kernels/cp_async.cuh"),
    ),
    (
        "moe_gemm_wgmma_swap.cuh",
        include_str!("../../../kernels/moe_gemm_wgmma_swap.cuh"),
    ),
    (
        "moe_gemm_stream.cuh",
        include_str!("../../../kernels/moe_gemm_stream.cuh"),
    ),
    (
        "mma_sm90.cuh",
        include_str!("../../../kernels/mma_sm90.cuh"),
    ),
    (
        "moe_gemm_wgmma.cuh",
        include_str!("../../../kernels/moe_gemm_wgmma.cuh"),
    ),
    (
        "mma_cdna.cuh",
        include_str!("../../../kernels/mma_cdna.cuh"),
    ),
    (
        "moe_gemm_mfma.cuh",
        include_str!("../../../kernels/moe_gemm_mfma.cuh"),
    ),
];

/// The fused MoE translation unit: the ABI prelude, then kernels/fused_moe.cu.
pub fn fused_moe_source() -> String {
    format!("{}{}", super::spec::abi_prelude(), FUSED_MOE_SOURCE)
}

/// 64-bit FNV-1a: stable across Rust versions and processes (std's SipHash keys are not
/// guaranteed stable), which an on-disk key needs.
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Hash of everything that determines the compiled binary.
pub fn cache_key(parts: &[&str]) -> u64 {
    let mut h = Fnv1a::default();
    for p in parts {
        h.write(p.as_bytes());
        h.write(&[0xff]); // separator: ("ab","c") != ("a","bc")
    }
    h.finish()
}

/// Where binaries are cached, if any directory can be named.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MOEPLUG_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("moeplug"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("moeplug"))
}

static WARNED: AtomicBool = AtomicBool::new(false);

fn warn_once(msg: String) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("moeplug: warning: {msg} (kernels are compiled in memory only)");
    }
}

fn read_cached(path: &PathBuf) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    // A cubin/ELF code object starts with the ELF magic; anything else is a damaged file.
    (bytes.len() > 4 && &bytes[..4] == b"\x7fELF").then_some(bytes)
}

fn write_cached(dir: &PathBuf, path: &PathBuf, bytes: &[u8]) {
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("kernel"),
        std::process::id()
    ));
    let result = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        warn_once(format!(
            "cannot write the kernel cache {}: {e}",
            dir.display()
        ));
    }
}

/// What one compile produced and how long it took (for `describe`).
pub struct Compiled {
    pub binary: Vec<u8>,
    pub from_disk: bool,
    pub seconds: f64,
}

/// Compile the fused MoE kernels for `arch` ("sm_90") with `defines`, through the disk cache.
pub fn compile(api: &Api, arch: &str, defines: &[String]) -> Result<Compiled> {
    compile_source(api, arch, "fused_moe", &fused_moe_source(), defines)
}

/// Compile `source` (kernels/`stem`.cu) for `arch` with `defines`, through the disk cache.
pub fn compile_source(
    api: &Api,
    arch: &str,
    stem: &str,
    source: &str,
    defines: &[String],
) -> Result<Compiled> {
    let (maj, min) = api.rtc_version()?;
    let options = options(api.vendor, arch, defines);
    let rtc_version = format!("{}-{maj}.{min}", api.rtc.library);
    let joined = options.join(" ");
    let mut parts: Vec<&str> = vec![source];
    parts.extend(KERNEL_HEADERS.iter().map(|(_, text)| *text));
    parts.push(&joined);
    let key = cache_key(&[&parts.concat(), arch, &rtc_version, crate::version()]);
    let start = std::time::Instant::now();
    let dir = cache_dir();
    let path = dir
        .as_ref()
        .map(|d| d.join(format!("{stem}-{arch}-{key:016x}.bin")));
    if let Some(bytes) = path.as_ref().and_then(read_cached) {
        return Ok(Compiled {
            binary: bytes,
            from_disk: true,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    let binary = rtc_compile(api, stem, source, &options)?;
    match (&dir, &path) {
        (Some(d), Some(p)) => write_cached(d, p, &binary),
        _ => warn_once("no cache directory (set MOEPLUG_CACHE_DIR or HOME)".into()),
    }
    Ok(Compiled {
        binary,
        from_disk: false,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Compile without touching the disk cache (for measuring the cold compile time).
pub fn compile_uncached(api: &Api, arch: &str, defines: &[String]) -> Result<Vec<u8>> {
    rtc_compile(
        api,
        "fused_moe",
        &fused_moe_source(),
        &options(api.vendor, arch, defines),
    )
}

/// The run-time compiler's options for `arch` and a configuration's `defines` (HIP's:
/// [`super::hip::hiprtc_options`], which the offline HIP compile check uses too).
fn options(vendor: super::Vendor, arch: &str, defines: &[String]) -> Vec<String> {
    if vendor == super::Vendor::Hip {
        return super::hip::hiprtc_options(arch, defines);
    }
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    options
}

fn rtc_compile(api: &Api, stem: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
    rtc_compile_with_log(&api.rtc, stem, source, options).map(|(bin, _)| bin)
}

/// What the compile check sees of one configuration: the binary and the compiler's log
/// (with `--ptxas-options=-v`: registers, shared memory and spills per kernel).
pub struct CheckedCompile {
    pub binary: Vec<u8>,
    pub log: String,
}

/// Compile the fused MoE kernels for `arch` with `defines` and the ptxas report, with NVRTC
/// alone (no driver, no GPU, no cache).
pub fn compile_check(
    rtc: &super::driver::Rtc,
    arch: &str,
    defines: &[String],
) -> Result<CheckedCompile> {
    let mut opts = options(super::Vendor::Cuda, arch, defines);
    opts.push("--ptxas-options=-v".to_string());
    let (binary, log) = rtc_compile_with_log(rtc, "fused_moe", &fused_moe_source(), &opts)?;
    Ok(CheckedCompile { binary, log })
}

fn rtc_compile_with_log(
    r: &super::driver::Rtc,
    stem: &str,
    source: &str,
    options: &[String],
) -> Result<(Vec<u8>, String)> {
    let c = |s: &str| CString::new(s).map_err(|e| Error::internal(e.to_string()));
    let src = c(source)?;
    let name = c(&format!("{stem}.cu"))?;
    let headers: Vec<CString> = KERNEL_HEADERS
        .iter()
        .map(|(_, t)| c(t))
        .collect::<Result<_>>()?;
    let header_names: Vec<CString> = KERNEL_HEADERS
        .iter()
        .map(|(n, _)| c(n))
        .collect::<Result<_>>()?;
    let header_ptrs: Vec<*const c_char> = headers.iter().map(|h| h.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
    let opts: Vec<CString> = options.iter().map(|o| c(o)).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Handle = std::ptr::null_mut();
    // SAFETY: all strings outlive the program; the program is destroyed on every path.
    unsafe {
        r.check(
            (r.nvrtcCreateProgram)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                header_ptrs.len() as i32,
                header_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            ),
            "nvrtcCreateProgram",
        )?;
        let result = (|| {
            let rc = (r.nvrtcCompileProgram)(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
            let mut size = 0usize;
            (r.nvrtcGetProgramLogSize)(prog, &mut size);
            let mut log = vec![0u8; size.max(1)];
            (r.nvrtcGetProgramLog)(prog, log.as_mut_ptr() as *mut c_char);
            let log = String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .to_string();
            if rc != 0 {
                let why = r.check(rc, "nvrtcCompileProgram").unwrap_err();
                return Err(Error::new(
                    Status::CompileError,
                    format!(
                        "{} (options: {}); compiler log:\n{log}",
                        why.message,
                        options.join(" ")
                    ),
                ));
            }
            let mut size = 0usize;
            r.check((r.nvrtcGetCUBINSize)(prog, &mut size), "nvrtcGetCUBINSize")?;
            let mut bin = vec![0u8; size];
            r.check(
                (r.nvrtcGetCUBIN)(prog, bin.as_mut_ptr() as *mut c_char),
                "nvrtcGetCUBIN",
            )?;
            Ok((bin, log))
        })();
        (r.nvrtcDestroyProgram)(&mut prog);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_values() {
        // Published FNV-1a 64 test vectors.
        let h = |s: &str| {
            let mut f = Fnv1a::default();
            f.write(s.as_bytes());
            f.finish()
        };
        assert_eq!(h(""), 0xcbf29ce484222325);
        assert_eq!(h("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(h("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn key_separates_parts() {
        assert_ne!(cache_key(&["ab", "c"]), cache_key(&["a", "bc"]));
        assert_eq!(cache_key(&["x", "y"]), cache_key(&["x", "y"]));
    }

    #[test]
    fn unwritable_cache_dir_warns_and_does_not_fail() {
        let dir = PathBuf::from("/proc/moeplug-cannot-exist");
        write_cached(&dir, &dir.join("k.bin"), b"\x7fELFdata");
        assert!(WARNED.load(Ordering::Relaxed));
        assert!(read_cached(&dir.join("k.bin")).is_none());
    }
}
