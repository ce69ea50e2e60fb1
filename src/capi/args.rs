//! Reading what C passes: argument structs with `struct_size`, tensors, enum integers. Every
//! check lives here once, so each export is "read, convert, call the core".

use std::mem::size_of;

use super::types::moeplug_tensor;
use crate::error::{Error, Result};
use crate::tensor::{checked_start, elem_type_from_dlpack, DeviceKind, ElemType, Tensor};

/// Largest `struct_size` accepted: the tail of a newer caller's struct is scanned for
/// non-zero bytes, and a size this large cannot be an argument struct.
const MAX_STRUCT_SIZE: u32 = 4096;
/// Largest tensor rank accepted.
const MAX_NDIM: i32 = 8;

/// Non-NULL pointer or INVALID_ARGUMENT naming `name`.
pub fn non_null<T>(ptr: *const T, name: &str) -> Result<*const T> {
    if ptr.is_null() {
        return Err(Error::invalid(format!("{name}: must not be NULL")));
    }
    Ok(ptr)
}

/// Copy an argument struct that begins with `uint32_t struct_size`.
/// Short → INVALID_ARGUMENT; longer with a non-zero tail → UNSUPPORTED; else the v1 fields.
///
/// # Safety
/// `ptr` is NULL or points to at least `struct_size` readable bytes (the caller's promise).
pub unsafe fn read_struct<T: Copy>(ptr: *const T, name: &str) -> Result<T> {
    let ptr = non_null(ptr, name)?;
    let size = std::ptr::read_unaligned(ptr as *const u32);
    let want = size_of::<T>() as u32;
    if size < want {
        return Err(Error::invalid(format!(
            "{name}.struct_size: expected at least {want} (sizeof v1), got {size}"
        )));
    }
    if size > MAX_STRUCT_SIZE {
        return Err(Error::invalid(format!(
            "{name}.struct_size: {size} is implausibly large (at most {MAX_STRUCT_SIZE})"
        )));
    }
    let tail = std::slice::from_raw_parts(
        (ptr as *const u8).add(want as usize),
        (size - want) as usize,
    );
    if let Some(pos) = tail.iter().position(|&b| b != 0) {
        return Err(Error::unsupported(format!(
            "{name}: byte {} is non-zero but lies past the {want} bytes this library knows \
             (struct_size {size}): a field of a newer ABI that this version cannot honour",
            want as usize + pos
        )));
    }
    Ok(std::ptr::read_unaligned(ptr))
}

/// Check the `struct_size` of an output struct the library will fill.
///
/// # Safety
/// `ptr` is NULL or points to a writable struct of at least `struct_size` bytes.
pub unsafe fn check_out_struct<T>(ptr: *mut T, name: &str) -> Result<()> {
    let ptr = non_null(ptr as *const T, name)?;
    let size = std::ptr::read_unaligned(ptr as *const u32);
    let want = size_of::<T>() as u32;
    if size < want {
        return Err(Error::invalid(format!(
            "{name}.struct_size: expected at least {want} (sizeof v1), got {size}"
        )));
    }
    Ok(())
}

/// A tensor argument, or None when NULL.
///
/// # Safety
/// `ptr` is NULL or points to a `moeplug_tensor` whose `shape`/`strides` arrays hold `ndim`
/// entries (the caller's promise; the data itself is only described here, not read).
pub unsafe fn optional_tensor(
    ptr: *const moeplug_tensor,
    name: &'static str,
) -> Result<Option<Tensor>> {
    if ptr.is_null() {
        return Ok(None);
    }
    let t = std::ptr::read_unaligned(ptr);
    if !(0..=MAX_NDIM).contains(&t.ndim) {
        return Err(Error::invalid(format!(
            "{name}.ndim: expected 0..={MAX_NDIM}, got {}",
            t.ndim
        )));
    }
    let ndim = t.ndim as usize;
    if ndim > 0 && t.shape.is_null() {
        return Err(Error::invalid(format!(
            "{name}.shape: must not be NULL when ndim is {ndim}"
        )));
    }
    let dims: Vec<i64> = (0..ndim)
        .map(|i| std::ptr::read_unaligned(t.shape.add(i)))
        .collect();
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(Error::invalid(format!(
            "{name}.shape: negative dimension {d} in {dims:?}"
        )));
    }
    let elem = elem_type_from_dlpack(name, t.dtype.code, t.dtype.bits, t.dtype.lanes)?;
    let device = DeviceKind::from_raw(&format!("{name}.device"), t.device.device_type)?;
    if !t.strides.is_null() {
        let mut expect = 1i64;
        for i in (0..ndim).rev() {
            let s = std::ptr::read_unaligned(t.strides.add(i));
            if dims[i] > 1 && s != expect {
                return Err(Error::unsupported(format!(
                    "{name}.strides: only compact row-major tensors are supported; dimension {i} \
                     has stride {s}, compact is {expect}"
                )));
            }
            expect = expect.saturating_mul(dims[i].max(1));
        }
    }
    let mut shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    if elem == ElemType::Fp4x2 {
        // {17, 4, 1} carries the logical shape: storage packs two values per byte along the
        // last dimension.
        match shape.last_mut() {
            Some(last) if *last % 2 == 0 => *last /= 2,
            Some(last) => {
                return Err(Error::invalid(format!(
                    "{name}: packed float4_e2m1fn needs an even last dimension, got {last}"
                )))
            }
            None => {
                return Err(Error::invalid(format!(
                    "{name}: packed fp4 cannot be 0-dimensional"
                )))
            }
        }
    }
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let nbytes = numel.and_then(|n| n.checked_mul(elem.size()));
    let nbytes = match nbytes {
        Some(n) if n <= isize::MAX as usize => n,
        _ => {
            return Err(Error::invalid(format!(
                "{name}.shape: {dims:?} overflows the address space"
            )))
        }
    };
    if nbytes > 0 && t.data.is_null() {
        return Err(Error::invalid(format!(
            "{name}.data: must not be NULL for a non-empty tensor"
        )));
    }
    let ptr = checked_start(name, t.data as u64, t.byte_offset, nbytes)?;
    Ok(Some(Tensor {
        name,
        ptr,
        device,
        device_id: t.device.device_id,
        elem,
        shape,
    }))
}

/// A required tensor argument.
///
/// # Safety
/// As [`optional_tensor`].
pub unsafe fn tensor(ptr: *const moeplug_tensor, name: &'static str) -> Result<Tensor> {
    optional_tensor(ptr, name)?.ok_or_else(|| Error::invalid(format!("{name}: must not be NULL")))
}

/// An enum field where 0 means `default`.
pub fn enum_or<T>(raw: i32, default: T, parse: impl FnOnce(i32) -> Result<T>) -> Result<T> {
    if raw == 0 {
        Ok(default)
    } else {
        parse(raw)
    }
}

/// A non-zero-means-true flag field.
pub fn flag(raw: i32) -> bool {
    raw != 0
}
