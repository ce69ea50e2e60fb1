//! Tensors as the core sees them: a validated description of caller memory (DLPack-style) with
//! the element type resolved and the shape in storage elements. The C surface builds these
//! from `moeplug_tensor`; the core never sees a raw `DLTensor`.

use crate::error::{Error, Result};

/// Element types moeplug reads or writes. `Fp4x2` is one byte holding two e2m1 values
/// (low nibble = even element), so its storage shape has the last dimension halved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    U8,
    I8,
    I32,
    /// 1.1: INT4_PER_CHANNEL weights (AITER's uint32 words of eight int4 values).
    U32,
    I64,
    F32,
    F16,
    Bf16,
    Fp8E4m3fn,
    Fp8E4m3fnuz,
    E8m0,
    Fp4x2,
}

impl ElemType {
    /// Bytes of one storage element.
    pub fn size(self) -> usize {
        match self {
            ElemType::U8
            | ElemType::I8
            | ElemType::Fp8E4m3fn
            | ElemType::Fp8E4m3fnuz
            | ElemType::E8m0
            | ElemType::Fp4x2 => 1,
            ElemType::F16 | ElemType::Bf16 => 2,
            ElemType::I32 | ElemType::U32 | ElemType::F32 => 4,
            ElemType::I64 => 8,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ElemType::U8 => "uint8",
            ElemType::I8 => "int8",
            ElemType::I32 => "int32",
            ElemType::U32 => "uint32",
            ElemType::I64 => "int64",
            ElemType::F32 => "float32",
            ElemType::F16 => "float16",
            ElemType::Bf16 => "bfloat16",
            ElemType::Fp8E4m3fn => "float8_e4m3fn",
            ElemType::Fp8E4m3fnuz => "float8_e4m3fnuz",
            ElemType::E8m0 => "float8_e8m0fnu",
            ElemType::Fp4x2 => "float4_e2m1fn_x2",
        }
    }
    /// A one-byte type that may stand for raw bytes (fp4x2, e8m0 given as uint8).
    pub fn is_byte(self) -> bool {
        self.size() == 1
    }
}

/// DLPack device types (docs/abi.md §1).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu = T::Cpu as i32,
    Cuda = T::Cuda as i32,
    CudaHost = T::CudaHost as i32,
    Rocm = T::Rocm as i32,
    RocmHost = T::RocmHost as i32,
    CudaManaged = T::CudaManaged as i32,
}

use crate::vocab::moeplug_device_type as T;

impl DeviceKind {
    pub fn from_raw(field: &str, raw: i32) -> Result<DeviceKind> {
        const ALL: [DeviceKind; 6] = [
            DeviceKind::Cpu,
            DeviceKind::Cuda,
            DeviceKind::CudaHost,
            DeviceKind::Rocm,
            DeviceKind::RocmHost,
            DeviceKind::CudaManaged,
        ];
        // A device type added to `vocab` without a variant here does not compile.
        let _ = |t: T| match t {
            T::Cpu | T::Cuda | T::CudaHost | T::Rocm | T::RocmHost | T::CudaManaged => (),
        };
        match ALL.iter().find(|d| **d as i32 == raw) {
            Some(d) => Ok(*d),
            None => Err(Error::invalid(format!(
                "{field}: unknown device_type {raw} (valid: {})",
                ALL.iter()
                    .map(|d| format!("{} {}", *d as i32, d.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
    /// Memory the CPU may read and write directly.
    pub fn is_host(self) -> bool {
        matches!(
            self,
            DeviceKind::Cpu | DeviceKind::CudaHost | DeviceKind::RocmHost
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::CudaHost => "cuda_host",
            DeviceKind::Rocm => "rocm",
            DeviceKind::RocmHost => "rocm_host",
            DeviceKind::CudaManaged => "cuda_managed",
        }
    }
}

/// Resolve a DLPack dtype triple. Packed FP4 may come as `{17, 4, 1}` (logical shape) or
/// `{uint, 8, 1}` (bytes); e8m0 as `{14, 8, 1}` or `{uint, 8, 1}`.
pub fn elem_type_from_dlpack(field: &str, code: u8, bits: u8, lanes: u16) -> Result<ElemType> {
    if lanes != 1 {
        return Err(Error::unsupported(format!(
            "{field}: dtype lanes must be 1, got {lanes}"
        )));
    }
    let t = match (code, bits) {
        (0, 8) => ElemType::I8,
        (0, 32) => ElemType::I32,
        (0, 64) => ElemType::I64,
        (1, 8) => ElemType::U8,
        (1, 32) => ElemType::U32,
        (2, 16) => ElemType::F16,
        (2, 32) => ElemType::F32,
        (4, 16) => ElemType::Bf16,
        (10, 8) => ElemType::Fp8E4m3fn,
        (11, 8) => ElemType::Fp8E4m3fnuz,
        (14, 8) => ElemType::E8m0,
        (17, 4) => ElemType::Fp4x2,
        _ => {
            return Err(Error::unsupported(format!(
                "{field}: dtype {{code {code}, bits {bits}}} is not supported"
            )))
        }
    };
    Ok(t)
}

/// End of the addresses a tensor may occupy: the 57-bit user space of x86-64 (5-level
/// paging) and AArch64 (52-bit), which also holds CUDA/HIP unified addresses. A range that
/// reaches past it is no memory the caller can own.
pub const ADDRESS_LIMIT: u64 = 1 << 57;

/// The first byte of a tensor (`data + byte_offset`), checked so that the whole range of
/// `nbytes` lies below [`ADDRESS_LIMIT`] without wrapping.
pub fn checked_start(name: &str, data: u64, byte_offset: u64, nbytes: usize) -> Result<*mut u8> {
    let end = data
        .checked_add(byte_offset)
        .and_then(|start| start.checked_add(nbytes as u64));
    match end {
        Some(end) if end <= ADDRESS_LIMIT => Ok((data + byte_offset) as usize as *mut u8),
        _ => Err(Error::invalid(format!(
            "{name}: data {data:#x} + byte_offset {byte_offset:#x} + {nbytes} bytes reaches past \
             the user address space (2^57): no memory a caller can own"
        ))),
    }
}

/// A validated tensor: where its bytes are, on which device, of which type and storage shape
/// (compact row-major). The memory is the caller's; see the `unsafe` accessors.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: &'static str,
    pub ptr: *mut u8,
    pub device: DeviceKind,
    pub device_id: i32,
    pub elem: ElemType,
    /// Storage shape: for `Fp4x2` the last dimension counts bytes (logical / 2).
    pub shape: Vec<usize>,
}

// The descriptor is plain data; the memory it names is the caller's responsibility.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.elem.size()
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub fn dim(&self, i: usize) -> usize {
        self.shape[i]
    }
    /// Address range in bytes, for overlap checks (below [`ADDRESS_LIMIT`], see
    /// [`checked_start`]).
    pub fn byte_range(&self) -> std::ops::Range<usize> {
        let start = self.ptr as usize;
        start..start + self.nbytes()
    }
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.byte_range(), other.byte_range());
        a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
    }
    pub fn shape_str(&self) -> String {
        format_shape(&self.shape)
    }

    /// Error unless the shape is exactly `want`.
    pub fn expect_shape(&self, want: &[usize]) -> Result<()> {
        if self.shape != want {
            return Err(Error::invalid(format!(
                "{}: expected shape {}, got {}",
                self.name,
                format_shape(want),
                self.shape_str()
            )));
        }
        Ok(())
    }
    pub fn expect_ndim(&self, want: usize) -> Result<()> {
        if self.ndim() != want {
            return Err(Error::invalid(format!(
                "{}: expected {} dimensions, got shape {}",
                self.name,
                want,
                self.shape_str()
            )));
        }
        Ok(())
    }
    pub fn expect_elem(&self, allowed: &[ElemType]) -> Result<()> {
        if !allowed.contains(&self.elem) {
            let names: Vec<&str> = allowed.iter().map(|e| e.name()).collect();
            return Err(Error::invalid(format!(
                "{}: expected dtype {}, got {}",
                self.name,
                names.join(" or "),
                self.elem.name()
            )));
        }
        Ok(())
    }
    pub fn expect_host(&self) -> Result<()> {
        if !self.device.is_host() {
            return Err(Error::invalid(format!(
                "{}: expected host memory, got device {}:{}",
                self.name,
                self.device.name(),
                self.device_id
            )));
        }
        Ok(())
    }

    /// The bytes, for host tensors.
    ///
    /// # Safety
    /// The caller of the C function promised `ptr` names `nbytes()` readable bytes that stay
    /// alive and unmodified by others for the duration of the call; `expect_host` passed.
    pub unsafe fn host_bytes(&self) -> &[u8] {
        if self.nbytes() == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.ptr as *const u8, self.nbytes())
    }
    /// # Safety
    /// As [`Tensor::host_bytes`], writable, and not aliased by any other slice in use.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn host_bytes_mut(&self) -> &mut [u8] {
        if self.nbytes() == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.ptr, self.nbytes())
    }
    /// Typed view of host memory; errors if the address is misaligned for `T`.
    ///
    /// # Safety
    /// As [`Tensor::host_bytes`]; `T` must match the element type's size.
    pub unsafe fn host_slice<T: Copy>(&self) -> Result<&[T]> {
        self.check_align::<T>()?;
        if self.numel() == 0 {
            return Ok(&[]);
        }
        Ok(std::slice::from_raw_parts(
            self.ptr as *const T,
            self.nbytes() / std::mem::size_of::<T>(),
        ))
    }
    /// # Safety
    /// As [`Tensor::host_bytes_mut`]; `T` must match the element type's size.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn host_slice_mut<T: Copy>(&self) -> Result<&mut [T]> {
        self.check_align::<T>()?;
        if self.numel() == 0 {
            return Ok(&mut []);
        }
        Ok(std::slice::from_raw_parts_mut(
            self.ptr as *mut T,
            self.nbytes() / std::mem::size_of::<T>(),
        ))
    }
    fn check_align<T>(&self) -> Result<()> {
        if (self.ptr as usize) % std::mem::align_of::<T>() != 0 {
            return Err(Error::invalid(format!(
                "{}: data address {:p} is not aligned to {} bytes",
                self.name,
                self.ptr,
                std::mem::align_of::<T>()
            )));
        }
        Ok(())
    }
}

pub fn format_shape(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}
