//! Device tensors are checked against the driver before anything is launched on them: a
//! tensor labelled CUDA/ROCm whose bytes are not device (or managed) memory of the launch's
//! device, or that run past the end of their allocation, would otherwise reach a kernel as a
//! memory fault or silent corruption.
//!
//! One `cuPointerGetAttributes` / `hipDrvPointerGetAttributes` call per tensor asks for the
//! memory type, whether it is managed, the device ordinal and the allocation's address range.
//! It is a host-side query, neither a stream operation nor a synchronization (what stream
//! capture forbids); the graph-capture tests of tests/gpu run through it.
//!
//! What the range can prove: the driver reports the range it allocated or reserved (a
//! `cuMemAlloc` allocation, a memory-pool or VMM reservation), not the caller's sub-allocation,
//! so an extent that stays inside a caching allocator's segment but past the caller's block is
//! not detected. Everything past the driver's range is.

use std::ffi::{c_int, c_uint, c_void};

use super::driver::{Api, DevicePtr};
use super::Vendor;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `CUpointer_attribute` / `hipPointer_attribute` (the same values in both headers).
const ATTR_MEMORY_TYPE: c_int = 2;
const ATTR_IS_MANAGED: c_int = 8;
const ATTR_DEVICE_ORDINAL: c_int = 9;
const ATTR_RANGE_START_ADDR: c_int = 11;
const ATTR_RANGE_SIZE: c_int = 12;

/// Result codes that mean "this address is not in any allocation the driver knows":
/// INVALID_VALUE (both vendors; HIP answers so for an unknown pointer) and INVALID_CONTEXT
/// (CUDA: not allocated in a unified-addressing context).
const NOT_KNOWN_CODES: [c_int; 2] = [1, 201];

/// What the driver says about one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PointerAttrs {
    /// `CUmemorytype` / `hipMemoryType`, 0 where the driver knows no allocation.
    pub memory_type: u32,
    pub is_managed: bool,
    pub device_ordinal: i32,
    pub range_start: u64,
    pub range_size: u64,
}

/// The memory kinds the check tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// No allocation at that address (freed, never allocated, or pageable host memory).
    Unknown,
    /// Page-locked host memory (cuMemHostAlloc / cudaHostAlloc / registered).
    Host,
    Device,
    Managed,
    /// Anything else the driver reports (arrays): not linear memory a kernel may index.
    Other(u32),
}

/// The memory kind of `a` on `vendor`. CUDA's `CUmemorytype`: 1 host, 2 device, 3 array,
/// 4 unified; HIP's `hipMemoryType` (ROCm 6 and later): 1 host, 2 device, 3 managed, 10
/// array, 11 unified. The managed flag wins on both.
pub fn classify(vendor: Vendor, a: &PointerAttrs) -> MemoryKind {
    if a.is_managed {
        return MemoryKind::Managed;
    }
    match (vendor, a.memory_type) {
        (_, 0) => MemoryKind::Unknown,
        (_, 1) => MemoryKind::Host,
        (_, 2) => MemoryKind::Device,
        (Vendor::Hip, 3) => MemoryKind::Managed,
        (_, t) => MemoryKind::Other(t),
    }
}

fn device_label(vendor: Vendor, id: i32) -> String {
    match vendor {
        Vendor::Cuda => format!("cuda:{id}"),
        Vendor::Hip => format!("rocm:{id}"),
    }
}

/// The query's name, as messages give it.
pub fn query_name(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Cuda => "cuPointerGetAttributes",
        Vendor::Hip => "hipDrvPointerGetAttributes",
    }
}

/// Whether `bytes` bytes from `start` of tensor `name` may be used by a launch on device
/// `device_id`, given what the driver said about `start` (`None`: the driver knows no
/// allocation there). The pure decision, unit-tested with made-up answers.
pub fn judge(
    vendor: Vendor,
    name: &str,
    start: u64,
    bytes: u64,
    device_id: i32,
    attrs: Option<&PointerAttrs>,
) -> Result<()> {
    let query = query_name(vendor);
    let here = device_label(vendor, device_id);
    let kind = attrs.map_or(MemoryKind::Unknown, |a| classify(vendor, a));
    let refuse = |why: String| Err(Error::invalid(format!("{name}: {why}")));
    let a = match (kind, attrs) {
        (MemoryKind::Device | MemoryKind::Managed, Some(a)) => a,
        (MemoryKind::Unknown, _) | (_, None) => {
            return refuse(format!(
                "address {start:#x} is not in any {} allocation ({query} knows none there: \
                 freed, never allocated, or pageable host memory), but the tensor is labelled \
                 {here}",
                vendor.name()
            ))
        }
        (MemoryKind::Host, _) => {
            return refuse(format!(
                "address {start:#x} is page-locked host memory ({query}), not device or managed \
                 memory of {here}"
            ))
        }
        (MemoryKind::Other(t), _) => {
            return refuse(format!(
                "address {start:#x} is {} memory of type {t} ({query}), not device or managed \
                 memory of {here}",
                vendor.name()
            ))
        }
    };
    // Managed memory is reachable from every device; device memory only from its own.
    if kind == MemoryKind::Device && a.device_ordinal != device_id {
        return refuse(format!(
            "address {start:#x} is device memory of {} ({query}), but the call runs on {here}",
            device_label(vendor, a.device_ordinal)
        ));
    }
    // In u128: no sum of two u64 wraps.
    let range_end = a.range_start as u128 + a.range_size as u128;
    let end = start as u128 + bytes as u128;
    if start < a.range_start || end > range_end {
        let (how, by) = if start < a.range_start {
            ("start before", (a.range_start - start) as u128)
        } else {
            ("run past the end of", end - range_end)
        };
        return refuse(format!(
            "{bytes} bytes from {start:#x} {how} their allocation ({} bytes from {:#x}, \
             {query}) by {by} bytes",
            a.range_size, a.range_start
        ));
    }
    Ok(())
}

/// What the driver says about `ptr`: `Ok(None)` where it knows no allocation, `Err` for any
/// other failure of the query (DEVICE_ERROR naming it). The caller's context is current.
fn query(
    api: &Api,
    f: unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, DevicePtr) -> c_int,
    ptr: u64,
) -> Result<Option<PointerAttrs>> {
    let mut attrs = [
        ATTR_MEMORY_TYPE,
        ATTR_IS_MANAGED,
        ATTR_DEVICE_ORDINAL,
        ATTR_RANGE_START_ADDR,
        ATTR_RANGE_SIZE,
    ];
    // The attribute types: unsigned int, bool as unsigned int, int, CUdeviceptr, size_t.
    let (mut memory_type, mut is_managed, mut ordinal) = (0u32, 0u32, -1i32);
    let (mut range_start, mut range_size) = (0u64, 0usize);
    let mut data: [*mut c_void; 5] = [
        &mut memory_type as *mut u32 as *mut c_void,
        &mut is_managed as *mut u32 as *mut c_void,
        &mut ordinal as *mut i32 as *mut c_void,
        &mut range_start as *mut u64 as *mut c_void,
        &mut range_size as *mut usize as *mut c_void,
    ];
    // SAFETY: five attributes and five out-pointers of the types the driver writes for them.
    let rc = unsafe { f(5, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    if NOT_KNOWN_CODES.contains(&rc) {
        return Ok(None);
    }
    api.check(rc, query_name(api.vendor))?;
    Ok(Some(PointerAttrs {
        memory_type,
        is_managed: is_managed != 0,
        device_ordinal: ordinal,
        range_start,
        range_size: range_size as u64,
    }))
}

/// Whether the driver's answers read on this device as [`judge`] expects: a buffer just
/// allocated with the vendor's allocator must pass. `Err(why)` when it does not (a driver or
/// ROCm numbering this module was not tested with): the caller then leaves device tensors
/// unchecked on the device, with a warning, rather than refusing every launch. `Ok(false)`:
/// the driver has no query. The device's context is current.
pub fn probe(api: &Api, device_id: i32) -> std::result::Result<bool, String> {
    let Some(f) = api.cuPointerGetAttributes else {
        return Ok(false);
    };
    const BYTES: u64 = 4096;
    let mut ptr: DevicePtr = 0;
    // SAFETY: the allocator writes the address; freed below.
    if unsafe { (api.cuMemAlloc)(&mut ptr, BYTES as usize) } != 0 {
        return Ok(true); // nothing to probe with: keep the check (the launches will fail anyway)
    }
    let verdict = query(api, f, ptr)
        .and_then(|a| {
            judge(
                api.vendor,
                "probe buffer",
                ptr,
                BYTES,
                device_id,
                a.as_ref(),
            )
        })
        .map_err(|e| e.message);
    // SAFETY: `ptr` came from the allocator above.
    unsafe { (api.cuMemFree)(ptr) };
    verdict.map(|()| true)
}

/// One line for `moeplug info`: whether device tensors are checked (`probed`: the device's
/// verdict from [`probe`], when it was opened).
pub fn describe(api: &Api, probed: Option<bool>) -> String {
    let query = query_name(api.vendor);
    match (api.cuPointerGetAttributes, probed) {
        (None, _) => format!(
            "device tensors: NOT checked ({} has no {query})\n",
            api.driver_library
        ),
        (Some(_), Some(false)) => format!(
            "device tensors: NOT checked ({query} did not pass its probe on this device: see \
             the warning logged at open)\n"
        ),
        (Some(_), _) => {
            format!("device tensors: checked before every launch ({query}, one per tensor)\n")
        }
    }
}

/// Check every non-empty tensor of a call on device `device_id` (one driver query each).
/// Without the query in the driver (older than CUDA 10 / ROCm 6) nothing can be checked and
/// nothing is refused.
pub fn check_tensors<'a>(
    api: &Api,
    device_id: i32,
    tensors: impl IntoIterator<Item = &'a Tensor>,
) -> Result<()> {
    let Some(f) = api.cuPointerGetAttributes else {
        return Ok(());
    };
    for t in tensors {
        let bytes = t.nbytes() as u64;
        if bytes == 0 {
            continue; // nothing of it is read or written
        }
        let start = t.ptr as u64;
        let attrs = query(api, f, start)?;
        judge(api.vendor, t.name, start, bytes, device_id, attrs.as_ref())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    const MIB: u64 = 1 << 20;

    fn device(ordinal: i32, start: u64, size: u64) -> PointerAttrs {
        PointerAttrs {
            memory_type: 2,
            is_managed: false,
            device_ordinal: ordinal,
            range_start: start,
            range_size: size,
        }
    }

    fn message(r: Result<()>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        e.message
    }

    #[test]
    fn device_memory_inside_its_allocation_is_accepted() {
        let base = 0x7f00_0000_0000;
        let a = device(0, base, 2 * MIB);
        // The whole allocation, a piece at its end, one byte at its start.
        judge(Vendor::Cuda, "w13", base, 2 * MIB, 0, Some(&a)).unwrap();
        judge(Vendor::Cuda, "w13", base + MIB, MIB, 0, Some(&a)).unwrap();
        judge(Vendor::Cuda, "w13", base, 1, 0, Some(&a)).unwrap();
        judge(Vendor::Hip, "w13", base, 2 * MIB, 0, Some(&a)).unwrap();
    }

    #[test]
    fn an_extent_past_the_allocation_is_refused_by_how_much() {
        let base = 0x7f00_0000_0000;
        let a = device(0, base, 2 * MIB);
        let m = message(judge(Vendor::Cuda, "w2", base + MIB, MIB + 16, 0, Some(&a)));
        assert_eq!(
            m,
            "w2: 1048592 bytes from 0x7f0000100000 run past the end of their allocation \
             (2097152 bytes from 0x7f0000000000, cuPointerGetAttributes) by 16 bytes"
        );
        // A start before the reported range (an inconsistent answer) is refused too.
        let m = message(judge(Vendor::Cuda, "w2", base - 4, 8, 0, Some(&a)));
        assert_eq!(
            m,
            "w2: 8 bytes from 0x7efffffffffc start before their allocation (2097152 bytes from \
             0x7f0000000000, cuPointerGetAttributes) by 4 bytes"
        );
        // No wrap near the top of the address space.
        let top = device(0, u64::MAX - 15, 16);
        judge(Vendor::Cuda, "x", u64::MAX - 15, 16, 0, Some(&top)).unwrap();
        message(judge(Vendor::Cuda, "x", u64::MAX - 15, 17, 0, Some(&top)));
    }

    #[test]
    fn unknown_host_and_array_memory_are_refused() {
        let m = message(judge(Vendor::Cuda, "hidden_states", 0x1000, 64, 0, None));
        assert_eq!(
            m,
            "hidden_states: address 0x1000 is not in any CUDA allocation (cuPointerGetAttributes \
             knows none there: freed, never allocated, or pageable host memory), but the tensor \
             is labelled cuda:0"
        );
        // A successful query that found nothing (type 0, CUDA's answer for a freed block).
        let nothing = PointerAttrs::default();
        assert_eq!(
            message(judge(
                Vendor::Cuda,
                "hidden_states",
                0x1000,
                64,
                0,
                Some(&nothing)
            )),
            m
        );
        let host = PointerAttrs {
            memory_type: 1,
            ..device(0, 0x1000, 4096)
        };
        assert_eq!(
            message(judge(Vendor::Cuda, "topk_ids", 0x1000, 64, 0, Some(&host))),
            "topk_ids: address 0x1000 is page-locked host memory (cuPointerGetAttributes), not \
             device or managed memory of cuda:0"
        );
        let array = PointerAttrs {
            memory_type: 3,
            ..device(0, 0x1000, 4096)
        };
        assert_eq!(
            message(judge(Vendor::Cuda, "w13", 0x1000, 64, 0, Some(&array))),
            "w13: address 0x1000 is CUDA memory of type 3 (cuPointerGetAttributes), not device \
             or managed memory of cuda:0"
        );
        let m = message(judge(Vendor::Hip, "w13", 0x1000, 64, 1, None));
        assert!(
            m.contains("any HIP allocation (hipDrvPointerGetAttributes knows none")
                && m.ends_with("labelled rocm:1"),
            "{m}"
        );
    }

    #[test]
    fn device_memory_of_another_device_is_refused_managed_memory_is_not() {
        let a = device(1, 0x10000, 4096);
        assert_eq!(
            message(judge(Vendor::Cuda, "output", 0x10000, 64, 0, Some(&a))),
            "output: address 0x10000 is device memory of cuda:1 (cuPointerGetAttributes), but \
             the call runs on cuda:0"
        );
        judge(Vendor::Cuda, "output", 0x10000, 64, 1, Some(&a)).unwrap();
        // Managed memory (the flag, whatever the type says) is used from any device, within
        // its range.
        let managed = PointerAttrs {
            is_managed: true,
            ..a
        };
        judge(Vendor::Cuda, "output", 0x10000, 64, 0, Some(&managed)).unwrap();
        message(judge(
            Vendor::Cuda,
            "output",
            0x10000,
            4097,
            0,
            Some(&managed),
        ));
        // HIP's managed memory type without the flag.
        let hip_managed = PointerAttrs {
            memory_type: 3,
            ..a
        };
        assert_eq!(classify(Vendor::Hip, &hip_managed), MemoryKind::Managed);
        assert_eq!(classify(Vendor::Cuda, &hip_managed), MemoryKind::Other(3));
        judge(Vendor::Hip, "output", 0x10000, 64, 0, Some(&hip_managed)).unwrap();
    }
}
