//! Reading what C passes: argument structs with `struct_size`, tensors, enum integers. Every
//! check lives here once, so each export is "read, convert, call the core".

use std::mem::size_of;

use super::types::*;
use crate::error::{Error, Result};
use crate::tensor::{checked_start, elem_type_from_dlpack, DeviceKind, ElemType, Tensor};

/// Largest tensor rank accepted.
const MAX_NDIM: i32 = 8;

/// Non-NULL pointer or INVALID_ARGUMENT naming `name`.
pub fn non_null<T>(ptr: *const T, name: &str) -> Result<*const T> {
    if ptr.is_null() {
        return Err(Error::invalid(format!("{name}: must not be NULL")));
    }
    Ok(ptr)
}

/// An ABI struct that begins with `uint32_t struct_size` and grows only by appending fields
/// after its previous version's size (docs/abi.md, "Versioning").
///
/// # Safety
/// Implementors are `repr(C)`, start with a `u32` `struct_size`, and the all-zero byte pattern
/// is a valid value of them (it means "every field at its default").
pub unsafe trait Extensible: Copy {
    /// The C name, for messages.
    const NAME: &'static str;
    /// The size of the struct in the ABI version that introduced it (1.0 for most): the
    /// smallest `struct_size` a caller may pass.
    const MIN_SIZE: u32;
    /// That version, for messages.
    const SINCE: &'static str = "1.0";
}

macro_rules! extensible {
    ($($t:ident = $v1:ident $(since $since:literal)?),+ $(,)?) => {
        $(
            unsafe impl Extensible for $t {
                const NAME: &'static str = stringify!($t);
                const MIN_SIZE: u32 = $v1;
                $(const SINCE: &'static str = $since;)?
            }
            // A frozen size can never exceed the struct it describes.
            const _: () = assert!($v1 as usize <= size_of::<$t>());
        )+
    };
}

extensible!(
    moeplug_caps = MOEPLUG_CAPS_SIZE_V1_0,
    moeplug_layout = MOEPLUG_LAYOUT_SIZE_V1_0,
    moeplug_fused_moe_args = MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0,
    moeplug_shuffle_weight_args = MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0,
    moeplug_shuffle_scale_args = MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0,
    moeplug_pad_weights_args = MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0,
    moeplug_swizzle_scale_args = MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0,
    moeplug_quantize_mx_args = MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0,
    moeplug_prepare_moe_args = MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0,
    moeplug_prepare_moe_sizes_out = MOEPLUG_PREPARE_MOE_SIZES_OUT_SIZE_V1_0,
    // New in 1.1: the smallest size is the 1.1 one.
    moeplug_aiter_args_out = MOEPLUG_AITER_ARGS_OUT_SIZE_V1_1 since "1.1",
    moeplug_resolved_config = MOEPLUG_RESOLVED_CONFIG_SIZE_V1_1 since "1.1",
    moeplug_layout_fragment = MOEPLUG_LAYOUT_FRAGMENT_SIZE_V1_1 since "1.1",
);

// `out_fragment` (1.1) is appended at the 1.0 size of each primitive's arguments, and ends
// at the 1.1 size: a 1.0 caller's struct reads it as NULL.
macro_rules! appended_at_v1_0 {
    ($($t:ident: $v1_0:ident, $v1_1:ident;)+) => {
        $(
            const _: () = assert!(std::mem::offset_of!($t, out_fragment) == $v1_0 as usize);
            const _: () = assert!(size_of::<$t>() == $v1_1 as usize);
        )+
    };
}
appended_at_v1_0!(
    moeplug_shuffle_weight_args: MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0, MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_1;
    moeplug_shuffle_scale_args: MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0, MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_1;
    moeplug_pad_weights_args: MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0, MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_1;
    moeplug_swizzle_scale_args: MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0, MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_1;
    moeplug_quantize_mx_args: MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0, MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_1;
);

/// The caller's `struct_size`, refused below the 1.0 size.
///
/// # Safety
/// `ptr` is non-NULL and points to at least 4 readable bytes.
unsafe fn caller_size<T: Extensible>(ptr: *const T, name: &str) -> Result<usize> {
    let size = std::ptr::read_unaligned(ptr as *const u32);
    if size < T::MIN_SIZE {
        return Err(Error::invalid(format!(
            "{name}.struct_size: expected at least {} (the {} size of {}), got {size}",
            T::MIN_SIZE,
            T::SINCE,
            T::NAME
        )));
    }
    Ok(size as usize)
}

/// Copy an input struct that begins with `uint32_t struct_size` (the rule of Linux `openat2`):
/// below the 1.0 size → INVALID_ARGUMENT; up to this library's size → the caller's bytes, the
/// fields it does not know zero (their defaults); larger → accepted only if every byte past
/// this library's size is zero (fields of a newer ABI left at their defaults), else
/// UNSUPPORTED naming the first non-zero byte. There is no upper bound: the caller promises
/// `struct_size` readable bytes, and the scan stops at the first non-zero one.
///
/// # Safety
/// `ptr` is NULL or points to at least `struct_size` readable bytes (the caller's promise).
pub unsafe fn read_struct<T: Extensible>(ptr: *const T, name: &str) -> Result<T> {
    let ptr = non_null(ptr, name)?;
    let size = caller_size(ptr, name)?;
    let known = size_of::<T>();
    if size > known {
        let tail = std::slice::from_raw_parts((ptr as *const u8).add(known), size - known);
        if let Some(pos) = tail.iter().position(|&b| b != 0) {
            return Err(Error::unsupported(format!(
                "{name}: byte {} is non-zero but lies past the {known} bytes of {} this \
                 library knows (struct_size {size}): a field of a newer ABI that this version \
                 cannot honour",
                known + pos,
                T::NAME
            )));
        }
    }
    let mut value = std::mem::MaybeUninit::<T>::zeroed();
    std::ptr::copy_nonoverlapping(
        ptr as *const u8,
        value.as_mut_ptr() as *mut u8,
        size.min(known),
    );
    // Every byte is the caller's or zero, and zero is a valid value of every field.
    Ok(value.assume_init())
}

/// An ABI struct the library writes. Every byte of it is a field (padding a C compiler would
/// insert is a `reserved*` field instead), so a value built field by field has no
/// indeterminate bytes for [`write_struct`] to copy out: the bytes a caller receives are a
/// function of the call's inputs (docs/abi.md §5, "Output structs").
///
/// # Safety
/// Implementors have no implicit padding: [`output!`] proves it at compile time.
pub unsafe trait Output: Extensible {}

/// Size of the field that `project` selects, for the padding proof of [`output!`].
const fn field_size<T, F>(_project: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `output!(S { f1, f2, ... })` implements [`Output`] for `S` after proving, at compile time,
/// that the listed fields tile `S` exactly: each starts where the previous one ends and the
/// last ends at `size_of::<S>()`. So the list is every field in declaration order, and `S`
/// has no padding between or after them. A nested struct field must itself be [`Output`].
macro_rules! output {
    ($($t:ident { $($f:ident),+ $(,)? })+) => {
        $(
            unsafe impl Output for $t {}
            const _: () = {
                let mut end = 0;
                $(
                    assert!(
                        std::mem::offset_of!($t, $f) == end,
                        concat!(
                            stringify!($t), ".", stringify!($f),
                            ": not where the previous field ends (implicit padding, or a \
                             field missing from the list): add a reserved field"
                        )
                    );
                    end += field_size(|s: &$t| &s.$f);
                )+
                assert!(
                    end == size_of::<$t>(),
                    concat!(stringify!($t), ": implicit tail padding: add a reserved field")
                );
            };
        )+
    };
}

output!(
    moeplug_caps {
        struct_size, abi_version, device_type, device_id, backend, arch, runtime_version,
        weight_formats, act_dtypes, gate_modes, activations, weight_layouts, scale_layouts,
        features, max_tokens, max_topk,
    }
    moeplug_layout {
        struct_size, weight_format, gate_mode, weight_layout, scale_layout, num_experts,
        hidden_size, intermediate_size, hidden_padded, intermediate_padded, flags, reserved0,
        act_dtype, reserved1, prep_fingerprint,
    }
    moeplug_layout_fragment {
        struct_size, weight_format, gate_mode, weight_layout, scale_layout, act_dtype,
        num_experts, hidden_size, intermediate_size, hidden_padded, intermediate_padded,
        has_bias, reserved0,
    }
    moeplug_prepare_moe_sizes_out {
        struct_size,
        w13_ndim, w13_shape,
        w13_scale_ndim, reserved0, w13_scale_shape,
        w13_bias_ndim, reserved1, w13_bias_shape,
        w2_ndim, reserved2, w2_shape,
        w2_scale_ndim, reserved3, w2_scale_shape,
        w2_bias_ndim, reserved4, w2_bias_shape,
        w13_bytes, w13_scale_bytes, w13_bias_bytes, w2_bytes, w2_scale_bytes, w2_bias_bytes,
        layout,
    }
    moeplug_aiter_args_out {
        struct_size, is_shuffled, scale_swizzled, reserved0, hidden_pad, intermediate_pad,
        gate_mode, quant_type, quant_type_a, quant_dtype_a, quant_dtype_a2, activation,
    }
    moeplug_resolved_config {
        struct_size, backend, act_dtype, act_dtype_stage2, activation, alpha, limit,
        reserved0, weight_format, gate_mode, weight_layout, scale_layout,
    }
);

/// The caller's size of an output struct the library will fill, checked as for inputs
/// (at least the 1.0 size). Call it before doing any work, so a bad size writes nothing.
///
/// # Safety
/// `ptr` is NULL or points to a struct of at least `struct_size` bytes.
pub unsafe fn out_struct_size<T: Output>(ptr: *mut T, name: &str) -> Result<usize> {
    let ptr = non_null(ptr as *const T, name)?;
    caller_size(ptr, name)
}

/// Write `value` into a caller's output struct of `caller_size` bytes (from
/// [`out_struct_size`]): the first `min(caller_size, sizeof)` bytes are this library's, with
/// `struct_size` set to that count so a newer caller learns which fields were filled; the
/// caller's bytes past this library's size are zeroed; nothing past `caller_size` is touched.
/// `T: Output` makes the copy deterministic: `value` has no padding bytes.
///
/// # Safety
/// `ptr` is non-NULL and points to `caller_size` writable bytes.
pub unsafe fn write_struct<T: Output>(ptr: *mut T, value: &T, caller_size: usize) {
    let written = caller_size.min(size_of::<T>());
    let dst = ptr as *mut u8;
    std::ptr::copy_nonoverlapping(value as *const T as *const u8, dst, written);
    std::ptr::write_unaligned(dst as *mut u32, written as u32);
    std::ptr::write_bytes(dst.add(written), 0, caller_size - written);
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

pub use crate::types::enum_or;

/// A non-zero-means-true flag field.
pub fn flag(raw: i32) -> bool {
    raw != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A struct that grew after 1.0: `added` is a 1.1 field past the 1.0 size.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Grown {
        struct_size: u32,
        old: u32,
        added: u64,
    }
    unsafe impl Extensible for Grown {
        const NAME: &'static str = "grown";
        const MIN_SIZE: u32 = 8;
    }
    output!(Grown {
        struct_size,
        old,
        added
    });

    /// A caller's bytes: the struct, then guard bytes.
    fn caller(size: u32, fill: u8) -> [u64; 4] {
        let mut b = [u64::from_ne_bytes([fill; 8]); 4];
        b[0] = (size as u64) | (7u64 << 32); // struct_size, old = 7 (little endian)
        b
    }

    #[test]
    fn an_older_input_reads_the_new_fields_as_zero() {
        let b = caller(8, 0xEE);
        let g = unsafe { read_struct(b.as_ptr() as *const Grown, "args") }.unwrap();
        assert_eq!(
            g,
            Grown {
                struct_size: 8,
                old: 7,
                added: 0
            }
        );
        let b = caller(7, 0);
        let e = unsafe { read_struct(b.as_ptr() as *const Grown, "args") }.unwrap_err();
        assert_eq!(e.status, crate::error::Status::InvalidArgument);
        assert_eq!(
            e.message,
            "args.struct_size: expected at least 8 (the 1.0 size of grown), got 7"
        );
    }

    #[test]
    fn an_older_output_gets_only_its_own_bytes() {
        let mut b = caller(8, 0xEE);
        let v = Grown {
            struct_size: 0,
            old: 9,
            added: 5,
        };
        unsafe {
            let size = out_struct_size(b.as_mut_ptr() as *mut Grown, "out").unwrap();
            write_struct(b.as_mut_ptr() as *mut Grown, &v, size);
        }
        assert_eq!(b[0], 8 | (9u64 << 32));
        assert_eq!(
            b[1],
            u64::from_ne_bytes([0xEE; 8]),
            "written past struct_size"
        );
    }
}
