//! The fuzz harness of the C surface, shared by the libFuzzer target (fuzz/fuzz_targets) and
//! the corpus replay of the normal test suite (tests/fuzz_corpus.rs).
//!
//! One input drives a short sequence of calls. Every tensor gets a distinct host buffer of
//! exactly the bytes it describes, framed by guard bytes, so well-formed calls reach the
//! kernels; the input then bends one thing at a time: shapes, dtypes, strides, data /
//! byte_offset splits (equivalent or wild), misalignment, devices, aliasing between an
//! output and an input, struct_size (with a real tail buffer behind it), enum values and
//! flags. The full MoE path is prepare_moe_sizes → prepare_moe → check_fused_moe →
//! fused_moe_workspace_size → fused_moe on the prepared weights.
//!
//! After every call: the status is documented and never INTERNAL; a failure has a message
//! that begins with the function's name; on failure no byte of any buffer changed; on success
//! no input changed; guard bytes are intact everywhere; a successful fused_moe gives the same
//! bytes when run again (a quarter of the time: it doubles the cost).

#![allow(clippy::too_many_arguments)]

use std::ffi::CStr;
use std::ptr;
use std::sync::Mutex;

use moeplug::capi::types::*;
use moeplug::capi::*;

/// The input, read as a stream of choices; past its end every choice is 0 (the plain path).
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
    seed: u64,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        let seed = data.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
        });
        Input { data, pos: 0, seed }
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let v = (self.u8() as usize) | (self.u8() as usize) << 8;
        v % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    /// True one time in `n` (never past the end of the input).
    fn chance(&mut self, n: usize) -> bool {
        self.below(n) == 1
    }
    /// Buffer contents: a fast generator seeded by the whole input.
    fn noise(&mut self) -> u8 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        (self.seed >> 24) as u8
    }
}

const GUARD: usize = 32;
const GUARD_BYTE: u8 = 0xA5;
/// The largest struct_size the harness claims: argument structs live in buffers this long.
const STRUCT_BUF: usize = 8192;

/// A host buffer framed by guard bytes; `misalign` shifts the data off 8-byte alignment.
pub struct Buf {
    store: Vec<u64>,
    len: usize,
    misalign: usize,
    written: bool,
}

impl Buf {
    fn new(len: usize, misalign: usize, inp: &mut Input, fill: Fill) -> Buf {
        let total = 2 * GUARD + misalign + len;
        let mut b = Buf {
            store: vec![0; total.div_ceil(8)],
            len,
            misalign,
            written: false,
        };
        let all = b.all_mut();
        all.fill(GUARD_BYTE);
        for x in &mut all[GUARD + misalign..GUARD + misalign + len] {
            *x = match fill {
                Fill::Noise => inp.noise(),
                Fill::Zero => 0,
                Fill::Pattern => 0x3C,
            };
        }
        b
    }
    fn all_mut(&mut self) -> &mut [u8] {
        let n = self.store.len() * 8;
        // SAFETY: the store holds n bytes.
        unsafe { std::slice::from_raw_parts_mut(self.store.as_mut_ptr() as *mut u8, n) }
    }
    fn all(&self) -> &[u8] {
        // SAFETY: the store holds len * 8 bytes.
        unsafe {
            std::slice::from_raw_parts(self.store.as_ptr() as *const u8, self.store.len() * 8)
        }
    }
    pub fn ptr(&mut self) -> *mut u8 {
        let at = GUARD + self.misalign;
        self.all_mut()[at..].as_mut_ptr()
    }
    fn body(&self) -> &[u8] {
        &self.all()[GUARD + self.misalign..GUARD + self.misalign + self.len]
    }
    fn guards_intact(&self) -> bool {
        let a = self.all();
        let end = GUARD + self.misalign + self.len;
        a[..GUARD + self.misalign].iter().all(|&b| b == GUARD_BYTE)
            && a[end..].iter().all(|&b| b == GUARD_BYTE)
    }
}

#[derive(Clone, Copy)]
enum Fill {
    Noise,
    Zero,
    Pattern,
}

/// Device types a host buffer may be labelled with: mostly CPU, host-pinned kinds, invalid
/// ones. Never a GPU type: on a GPU machine that would hand host pointers to a kernel.
const DEVICES: [i32; 6] = [1, 3, 11, 0, 99, -1];
const DTYPES: [(u8, u8); 14] = [
    (0, 8),
    (0, 32),
    (0, 64),
    (1, 8),
    (2, 16),
    (2, 32),
    (4, 16),
    (10, 8),
    (11, 8),
    (14, 8),
    (17, 4),
    (2, 64),
    (5, 16),
    (1, 1),
];

const BF16: (u8, u8) = (4, 16);
const F16: (u8, u8) = (2, 16);
const F32: (u8, u8) = (2, 32);
const I32: (u8, u8) = (0, 32);
const U8: (u8, u8) = (1, 8);
const E8M0: (u8, u8) = (14, 8);
const FP8: (u8, u8) = (10, 8);
const FP8_FNUZ: (u8, u8) = (11, 8);

fn storage_bytes(shape: &[i64], dtype: (u8, u8)) -> usize {
    let n: i64 = shape.iter().product();
    let n = n.max(0) as usize;
    match dtype.1 {
        4 => n / 2,
        b => n * (b as usize).div_ceil(8),
    }
}

/// A descriptor over one buffer; owns its shape and stride arrays (8 entries, so a bent ndim
/// still reads initialized memory).
pub struct Desc {
    shape: [i64; 8],
    strides: [i64; 8],
    pub t: moeplug_tensor,
    /// Index of the buffer it names.
    buf: usize,
}

/// Every buffer of one call sequence.
pub struct Bufs(Vec<Buf>);

impl Bufs {
    /// A buffer for a tensor of `shape`/`dtype`, and a descriptor over it, bent by the input.
    fn tensor(&mut self, inp: &mut Input, shape: &[i64], dtype: (u8, u8), fill: Fill) -> Box<Desc> {
        let misalign = if inp.chance(24) { 1 + inp.below(7) } else { 0 };
        let mut buf = Buf::new(storage_bytes(shape, dtype), misalign, inp, fill);
        let data = buf.ptr();
        self.0.push(buf);
        let mut d = Box::new(Desc {
            shape: [0; 8],
            strides: [0; 8],
            t: moeplug_tensor::host(data as *mut libc::c_void, &[], dtype.0, dtype.1),
            buf: self.0.len() - 1,
        });
        d.shape[..shape.len()].copy_from_slice(shape);
        d.t.ndim = shape.len() as i32;
        let (shape0, dtype0) = (d.shape, d.t.dtype);
        bend(inp, &mut d);
        // A shape that claims more bytes than the buffer holds is the caller's memory error,
        // not a finding, unless no caller could own that much (past the 2^57 user space,
        // which the library must refuse): keep the others honest.
        let claimed = described(&d);
        let len = self.0[d.buf].len as u128;
        if matches!(claimed, Some(n) if n > len && n < 1 << 57) {
            d.shape = shape0;
            d.t.dtype = dtype0;
        }
        d.t.shape = d.shape.as_ptr();
        if d.t.strides == 1 as *const i64 {
            d.t.strides = d.strides.as_ptr();
        }
        d
    }
    fn tensor_opt(
        &mut self,
        inp: &mut Input,
        shape: Option<&[i64]>,
        dtype: (u8, u8),
        fill: Fill,
    ) -> Option<Box<Desc>> {
        shape.map(|s| self.tensor(inp, s, dtype, fill))
    }
    fn snapshot(&self) -> Vec<Vec<u8>> {
        self.0.iter().map(|b| b.body().to_vec()).collect()
    }
    /// The invariants after a call: guards intact; on failure nothing changed; on success
    /// only the buffers in `outputs` may have changed.
    fn verify(&mut self, what: &str, before: &[Vec<u8>], ok: bool, outputs: &[usize]) {
        for (i, (b, old)) in self.0.iter_mut().zip(before).enumerate() {
            assert!(
                b.guards_intact(),
                "{what}: guard bytes of buffer {i} overwritten"
            );
            let changed = b.body() != &old[..];
            if changed {
                assert!(ok, "{what}: failed but buffer {i} changed");
                assert!(outputs.contains(&i), "{what}: input buffer {i} changed");
                b.written = true;
            }
        }
    }
}

/// Bytes a descriptor claims (None: a negative dimension or an unknown dtype).
fn described(d: &Desc) -> Option<u128> {
    let nd = d.t.ndim.clamp(0, 8) as usize;
    let mut n: u128 = 1;
    for &v in &d.shape[..nd] {
        if v < 0 {
            return None;
        }
        n = n.saturating_mul(v as u128);
    }
    let bits = d.t.dtype.bits as u128;
    Some(n.saturating_mul(bits.max(1)).div_ceil(8))
}

/// Bend one descriptor as the input says (most inputs leave it as built).
fn bend(inp: &mut Input, d: &mut Desc) {
    let nd = d.t.ndim as usize;
    if inp.chance(20) && nd > 0 {
        let i = inp.below(nd);
        let v = d.shape[i];
        d.shape[i] = inp.pick(&[
            0,
            1,
            v.wrapping_add(1),
            v.wrapping_sub(1),
            v.wrapping_mul(2),
            -1,
            1 << 40,
            i64::MAX,
            1 << 31,
        ]);
    }
    if inp.chance(20) {
        let (c, b) = inp.pick(&DTYPES);
        d.t.dtype.code = c;
        d.t.dtype.bits = b;
    }
    if inp.chance(16) {
        // Compact strides (accepted), or one bent.
        let mut s = 1i64;
        for i in (0..nd).rev() {
            d.strides[i] = s;
            s = s.saturating_mul(d.shape[i].max(1));
        }
        if nd > 0 && inp.chance(2) {
            let i = inp.below(nd);
            d.strides[i] = inp.pick(&[0, 2, -1, d.strides[i].wrapping_add(1), 1 << 40]);
        }
        d.t.strides = 1 as *const i64; // filled in by the caller once boxed
    }
    if inp.chance(16) {
        // The same address split between data and byte_offset, or a wild offset.
        let off = inp.pick(&[1u64, 8, 64, 4096]);
        match inp.below(4) {
            0 | 1 => {
                d.t.data = (d.t.data as u64).wrapping_sub(off) as usize as *mut libc::c_void;
                d.t.byte_offset = off;
            }
            2 => {
                d.t.byte_offset =
                    inp.pick(&[1u64 << 62, u64::MAX, (1 << 57) - 1, 0u64.wrapping_sub(4096)])
            }
            _ => d.t.data = inp.pick(&[1u64 << 57, u64::MAX - 64, 0]) as usize as *mut libc::c_void,
        }
    }
    if inp.chance(24) {
        d.t.device.device_type = inp.pick(&DEVICES);
        d.t.device.device_id = inp.pick(&[0, 1, -1, i32::MAX]);
    }
    if inp.chance(32) {
        d.t.ndim = inp.pick(&[-1, 0, 9, nd as i32 + 1, nd as i32 - 1]);
    }
    if inp.chance(40) {
        d.t.dtype.lanes = 2;
    }
}

/// Point an output descriptor at an input's memory (the library must refuse the overlap).
/// Only onto a non-empty input whose buffer can hold what the output claims: the library
/// must refuse the overlap (an output over an empty input overlaps nothing, and over a
/// smaller buffer it would be the caller's lie).
fn maybe_alias(inp: &mut Input, b: &Bufs, out: &mut Desc, inputs: &[&Desc]) {
    if !inputs.is_empty() && inp.chance(24) {
        let src = inputs[inp.below(inputs.len())];
        let room = b.0[src.buf].len as u128;
        let src_bytes = described(src).unwrap_or(0);
        if src_bytes > 0 && described(out).is_some_and(|n| n <= room) {
            // `out.buf` stays: a write into the input's buffer is then flagged.
            out.t.data = src.t.data;
            out.t.byte_offset = src.t.byte_offset;
        }
    }
}

fn p(d: &Option<Box<Desc>>) -> *const moeplug_tensor {
    d.as_ref().map_or(ptr::null(), |d| &d.t)
}

fn last_error() -> String {
    // SAFETY: the library returns a valid C string.
    unsafe { CStr::from_ptr(moeplug_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Calls that succeeded, per export (shows the fuzzer reaches the work, not only the checks).
pub static OK_CALLS: Mutex<Vec<(&'static str, usize, usize)>> = Mutex::new(Vec::new());

fn count(what: &'static str, ok: bool) {
    let mut c = OK_CALLS.lock().unwrap_or_else(|e| e.into_inner());
    match c.iter_mut().find(|e| e.0 == what) {
        Some(e) => {
            e.1 += ok as usize;
            e.2 += 1;
        }
        None => c.push((what, ok as usize, 1)),
    }
}

/// (successful, all) calls of `what` so far.
#[allow(dead_code)] // the corpus replay reads it, the libFuzzer target does not
pub fn ok_calls(what: &str) -> (usize, usize) {
    let c = OK_CALLS.lock().unwrap_or_else(|e| e.into_inner());
    c.iter()
        .find(|e| e.0 == what)
        .map_or((0, 0), |e| (e.1, e.2))
}

/// The status is documented, never INTERNAL, and a failure says which call failed.
fn documented(what: &'static str, s: moeplug_status) -> bool {
    count(what, s == moeplug_status::MoeplugOk);
    let code = s as i32;
    assert!(
        (0..=9).contains(&code),
        "{what}: undocumented status {code}"
    );
    assert_ne!(
        s,
        moeplug_status::MoeplugInternal,
        "{what}: INTERNAL: {}",
        last_error()
    );
    if s != moeplug_status::MoeplugOk {
        let m = last_error();
        assert!(
            m.starts_with(&format!("{what}: ")),
            "{what}: status {s:?}, message {m:?}"
        );
        assert!(
            m.len() > what.len() + 2,
            "{what}: status {s:?} without a message"
        );
    }
    s == moeplug_status::MoeplugOk
}

/// An argument struct in a buffer of STRUCT_BUF bytes, its struct_size bent by the input
/// (smaller, larger with a zero or non-zero tail, the largest the rules know).
struct ArgBuf {
    store: Vec<u64>,
}

impl ArgBuf {
    fn new<T: Copy>(inp: &mut Input, args: &T) -> ArgBuf {
        let mut store = vec![0u64; STRUCT_BUF / 8];
        let size = std::mem::size_of::<T>();
        // SAFETY: the store holds STRUCT_BUF >= size bytes; T is plain data.
        unsafe {
            ptr::copy_nonoverlapping(
                args as *const T as *const u8,
                store.as_mut_ptr() as *mut u8,
                size,
            )
        };
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut u8, STRUCT_BUF) };
        if inp.chance(12) {
            let claimed = match inp.below(6) {
                0 => size - 4,
                1 => 0,
                2 => size + 8,
                3 => 4096,
                4 => 4097,
                _ => STRUCT_BUF,
            };
            bytes[..4].copy_from_slice(&(claimed as u32).to_le_bytes());
            if inp.chance(2) && claimed > size {
                bytes[size + inp.below(claimed - size)] = 1;
            }
        }
        ArgBuf { store }
    }
    fn ptr<T>(&self) -> *const T {
        self.store.as_ptr() as *const T
    }
}

fn enum_value(inp: &mut Input, valid: &[i32]) -> i32 {
    if inp.chance(10) {
        inp.pick(&[-1, 4, 8, 99, i32::MIN, i32::MAX])
    } else {
        inp.pick(valid)
    }
}

/// With MOEPLUG_FUZZ_TRACE set, each call's descriptors go to stderr (to triage a finding).
fn trace(what: &str, ts: &[&Desc]) {
    if std::env::var_os("MOEPLUG_FUZZ_TRACE").is_none() {
        return;
    }
    let show: Vec<String> = ts
        .iter()
        .map(|d| {
            let nd = d.t.ndim.clamp(0, 8) as usize;
            format!(
                "shape {:?} dtype {:?} dev {} off {:#x} strides {}",
                &d.shape[..nd],
                (d.t.dtype.code, d.t.dtype.bits, d.t.dtype.lanes),
                d.t.device.device_type,
                d.t.byte_offset,
                !d.t.strides.is_null()
            )
        })
        .collect();
    eprintln!("{what}: {show:#?}");
}

/// One input: a few calls.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let calls = 1 + inp.below(3);
    for _ in 0..calls {
        // Past the input's end (0) the full MoE path runs.
        match inp.below(9) {
            1 => caps(&mut inp),
            2 => shuffle_weight(&mut inp),
            3 => shuffle_scale(&mut inp),
            4 => pad_weights(&mut inp),
            5 => swizzle_scale(&mut inp),
            6 => quantize_mx(&mut inp),
            _ => moe(&mut inp),
        }
    }
}

fn caps(inp: &mut Input) {
    let mut out = vec![0xEEu8; STRUCT_BUF];
    let size = inp.pick(&[
        std::mem::size_of::<moeplug_caps>(),
        MOEPLUG_CAPS_SIZE_V1_0 as usize,
        MOEPLUG_CAPS_SIZE_V1_0 as usize - 4,
        0,
        std::mem::size_of::<moeplug_caps>() + 64,
        STRUCT_BUF,
    ]);
    out[..4].copy_from_slice(&(size as u32).to_le_bytes());
    let before = out.clone();
    let dev = inp.pick(&[1, 1, 1, 3, 11, 2, 10, 13, 0, 99, -1]);
    let id = inp.pick(&[0, 1, -1, i32::MAX]);
    // SAFETY: out holds STRUCT_BUF >= size bytes.
    let ok = documented("moeplug_get_caps", unsafe {
        moeplug_get_caps(dev, id, out.as_mut_ptr() as *mut moeplug_caps)
    });
    let written = std::mem::size_of::<moeplug_caps>().min(size);
    if ok {
        // This library's fields, then the caller's unknown tail zeroed, nothing past it.
        let reported = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(reported, written, "get_caps: struct_size written back");
        assert!(
            out[written..size].iter().all(|&b| b == 0),
            "get_caps left the unknown tail non-zero"
        );
        assert!(
            out[size..] == before[size..],
            "get_caps wrote past struct_size"
        );
    } else {
        assert!(out == before, "get_caps failed but wrote");
    }
    // The status names are static and total.
    for s in [-1, 0, 9, 10, inp.pick(&[i32::MIN, 5])] {
        // SAFETY: a static C string.
        let name = unsafe { CStr::from_ptr(moeplug_status_name(s)) };
        assert!(!name.to_bytes().is_empty());
    }
}

/// ⌈v / a⌉ for the (non-negative) shapes of this file.
fn cdiv(v: i64, a: i64) -> i64 {
    (v + a - 1) / a
}

fn small(inp: &mut Input, xs: &[i64]) -> i64 {
    inp.pick(xs)
}

fn shuffle_weight(inp: &mut Input) {
    let dtype = inp.pick(&[BF16, F16, U8, FP8, (0, 8)]);
    let n = small(inp, &[16, 32, 48, 17, 64]);
    let k = small(inp, &[32, 64, 16, 31, 128]);
    let lead: Vec<i64> = [vec![], vec![2], vec![1, 3]][inp.below(3)].clone();
    let pad = inp.pick(&[0i64, 0, 0, 64, 48, -1]);
    let kp = if pad > 0 { cdiv(k, pad) * pad } else { k };
    let shape_of = |kk: i64| [lead.clone(), vec![n, kk]].concat();
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &shape_of(k), dtype, Fill::Noise);
    let mut dst = b.tensor(inp, &shape_of(kp), dtype, Fill::Pattern);
    maybe_alias(inp, &b, &mut dst, &[&src]);
    let a = moeplug_shuffle_weight_args {
        struct_size: std::mem::size_of::<moeplug_shuffle_weight_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        layout_n: enum_value(inp, &[0, 16, 32]),
        layout_k: enum_value(inp, &[0, 16, 32]),
        use_int4: inp.chance(8) as i32,
        is_guinterleave: inp.chance(6) as i32,
        gate_up: inp.chance(6) as i32,
        pad_k_to: pad,
        out_fragment: std::ptr::null_mut(),
    };
    let ab = ArgBuf::new(inp, &a);
    let before = b.snapshot();
    // SAFETY: every pointer names memory of this frame, sized as described (or bent on purpose).
    let ok = documented("moeplug_shuffle_weight", unsafe {
        moeplug_shuffle_weight(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_shuffle_weight", &before, ok, &[dst.buf]);
}

fn shuffle_scale(inp: &mut Input) {
    let dtype = inp.pick(&[E8M0, U8, F32, BF16]);
    let e = small(inp, &[1, 2, 4]);
    let n = small(inp, &[32, 64, 16, 33]);
    let m = e * n;
    let kn = small(inp, &[1, 2, 8, 9]);
    let gui = inp.chance(3);
    let dshape = if dtype == F32 {
        vec![m, kn]
    } else if gui {
        vec![m, cdiv(kn, 8) * 8]
    } else {
        vec![cdiv(m, 256) * 256, cdiv(kn, 8) * 8]
    };
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &[m, kn], dtype, Fill::Noise);
    let mut dst = b.tensor(inp, &dshape, dtype, Fill::Pattern);
    maybe_alias(inp, &b, &mut dst, &[&src]);
    let a = moeplug_shuffle_scale_args {
        struct_size: std::mem::size_of::<moeplug_shuffle_scale_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        num_experts: if gui {
            e as i32
        } else {
            enum_value(inp, &[0, 1])
        },
        is_guinterleave: gui as i32,
        gate_up: inp.chance(3) as i32,
        out_fragment: std::ptr::null_mut(),
    };
    let ab = ArgBuf::new(inp, &a);
    let before = b.snapshot();
    // SAFETY: as in shuffle_weight.
    let ok = documented("moeplug_shuffle_scale", unsafe {
        moeplug_shuffle_scale(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_shuffle_scale", &before, ok, &[dst.buf]);
}

fn pad_weights(inp: &mut Input) {
    let dtype = inp.pick(&[BF16, F16, F32, U8, FP8, E8M0, I32]);
    let e = small(inp, &[1, 2]);
    let n = small(inp, &[4, 16, 30]);
    let k = small(inp, &[8, 32, 5]);
    let bias = inp.chance(4);
    let (np, kp) = (n + small(inp, &[0, 2, 16]), k + small(inp, &[0, 3, 32]));
    let (s, d) = if bias {
        (vec![e, n], vec![e, np])
    } else {
        (vec![e, n, k], vec![e, np, kp])
    };
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &s, dtype, Fill::Noise);
    let mut dst = b.tensor(inp, &d, dtype, Fill::Pattern);
    maybe_alias(inp, &b, &mut dst, &[&src]);
    let a = moeplug_pad_weights_args {
        struct_size: std::mem::size_of::<moeplug_pad_weights_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        gate_up: inp.chance(4) as i32,
        fill: inp.pick(&[
            0.0,
            0.0,
            1.0,
            -2.5,
            0.3,
            f64::NAN,
            1e300,
            2f64.powi(-127),
            127.0,
        ]),
        out_fragment: std::ptr::null_mut(),
    };
    let ab = ArgBuf::new(inp, &a);
    trace("moeplug_pad_weights", &[&src, &dst]);
    if std::env::var_os("MOEPLUG_FUZZ_TRACE").is_some() {
        eprintln!("gate_up {} fill {}", a.gate_up, a.fill);
    }
    let before = b.snapshot();
    // SAFETY: as in shuffle_weight.
    let ok = documented("moeplug_pad_weights", unsafe {
        moeplug_pad_weights(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_pad_weights", &before, ok, &[dst.buf]);
}

fn swizzle_scale(inp: &mut Input) {
    let e = small(inp, &[1, 2]);
    let n = small(inp, &[32, 64, 40]);
    let ks = small(inp, &[8, 4, 16, 9]);
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &[e, n, ks], E8M0, Fill::Noise);
    let dshape = [e, cdiv(n, 32), cdiv(ks, 8) * 8 * 32];
    let mut dst = b.tensor(inp, &dshape, E8M0, Fill::Pattern);
    maybe_alias(inp, &b, &mut dst, &[&src]);
    let a = moeplug_swizzle_scale_args {
        struct_size: std::mem::size_of::<moeplug_swizzle_scale_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        layout: enum_value(inp, &[0, 3, 1, 2]),
        out_fragment: std::ptr::null_mut(),
    };
    let ab = ArgBuf::new(inp, &a);
    let before = b.snapshot();
    // SAFETY: as in shuffle_weight.
    let ok = documented("moeplug_swizzle_scale", unsafe {
        moeplug_swizzle_scale(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_swizzle_scale", &before, ok, &[dst.buf]);
}

fn quantize_mx(inp: &mut Input) {
    let sdtype = inp.pick(&[BF16, F32]);
    let rows = small(inp, &[1, 3, 16, 256]);
    let k = small(inp, &[32, 64, 128, 33]);
    let fmt = inp.pick(&[6, 7]);
    let shuffle = inp.chance(3);
    let (qshape, qdtype) = if fmt == 6 {
        (vec![rows, k / 2], U8)
    } else {
        (vec![rows, k], inp.pick(&[FP8, FP8_FNUZ]))
    };
    let sshape = if shuffle {
        vec![cdiv(rows, 256) * 256, cdiv((k / 32).max(1), 8) * 8]
    } else {
        vec![rows, k / 32]
    };
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &[rows, k], sdtype, Fill::Noise);
    let mut q = b.tensor(inp, &qshape, qdtype, Fill::Pattern);
    let mut s = b.tensor(inp, &sshape, E8M0, Fill::Pattern);
    maybe_alias(inp, &b, &mut q, &[&src]);
    maybe_alias(inp, &b, &mut s, &[&src, &q]);
    let a = moeplug_quantize_mx_args {
        struct_size: std::mem::size_of::<moeplug_quantize_mx_args>() as u32,
        src: &src.t,
        dst_q: &q.t,
        dst_scale: &s.t,
        format: enum_value(inp, &[fmt]),
        round_mode: enum_value(inp, &[0, 1, 2, 3, 4]),
        shuffle_scale: shuffle as i32,
        out_fragment: std::ptr::null_mut(),
    };
    let ab = ArgBuf::new(inp, &a);
    let before = b.snapshot();
    // SAFETY: as in shuffle_weight.
    let ok = documented("moeplug_quantize_mx", unsafe {
        moeplug_quantize_mx(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_quantize_mx", &before, ok, &[q.buf, s.buf]);
}

/// Checkpoint shapes of one MoE layer for `format`: (w13, w2, w13_scale, w2_scale) and the
/// weight dtype.
fn checkpoint(
    format: i32,
    e: i64,
    h: i64,
    i: i64,
    inp: &mut Input,
) -> ([Vec<i64>; 2], [Option<Vec<i64>>; 2], (u8, u8), (u8, u8)) {
    let w = match format {
        1 => BF16,
        2 => F16,
        6 => U8,
        _ => inp.pick(&[FP8, FP8_FNUZ, U8]),
    };
    let vpe = if format == 6 { 2 } else { 1 };
    let ws = [vec![e, 2 * i, h / vpe], vec![e, h, i / vpe]];
    let (scales, sdtype) = match format {
        3 => ([Some(vec![e]), Some(vec![e])], F32),
        4 => ([Some(vec![e, 2 * i]), Some(vec![e, h])], F32),
        5 => (
            [
                Some(vec![e, 2 * i / 128, cdiv(h, 128)]),
                Some(vec![e, cdiv(h, 128), i / 128]),
            ],
            F32,
        ),
        6 | 7 => (
            [Some(vec![e, 2 * i, h / 32]), Some(vec![e, h, i / 32])],
            E8M0,
        ),
        _ => ([None, None], F32),
    };
    (ws, scales, w, sdtype)
}

fn moe(inp: &mut Input) {
    let format = inp.pick(&[1, 2, 3, 4, 5, 6, 7]);
    let e = 1 + inp.below(4) as i64;
    let (mut h, mut i) = match format {
        5 => (
            128 * (1 + inp.below(2) as i64),
            128 * (1 + inp.below(2) as i64),
        ),
        6 | 7 => (32 * inp.pick(&[1, 2, 4, 8]), 32 * inp.pick(&[1, 2, 4])),
        _ => (inp.pick(&[16, 32, 48, 64, 96]), inp.pick(&[16, 32, 48, 64])),
    };
    if inp.chance(24) {
        h += 1;
    }
    if inp.chance(24) {
        i += 2;
    }
    let ([s13, s2], [sc13, sc2], wdt, sdt) = checkpoint(format, e, h, i, inp);
    let bias = inp.chance(2);
    let mut b = Bufs(Vec::new());
    let w13 = b.tensor(inp, &s13, wdt, Fill::Noise);
    let w2 = b.tensor(inp, &s2, wdt, Fill::Noise);
    let w13s = b.tensor_opt(inp, sc13.as_deref(), sdt, Fill::Noise);
    let w2s = b.tensor_opt(inp, sc2.as_deref(), sdt, Fill::Noise);
    let b13 = bias.then(|| b.tensor(inp, &[e, 2 * i], F32, Fill::Noise));
    let b2 = bias.then(|| b.tensor(inp, &[e, h], F32, Fill::Noise));
    let mut pa: moeplug_prepare_moe_args = unsafe { std::mem::zeroed() };
    pa.struct_size = std::mem::size_of::<moeplug_prepare_moe_args>() as u32;
    pa.weight_format = enum_value(inp, &[format]);
    pa.gate_mode_in = enum_value(inp, &[0, 1, 1, 2, 3]);
    pa.device_type = enum_value(inp, &[0, 1]);
    pa.act_dtype = enum_value(inp, &[0, 0, 1, 2]);
    pa.hidden_align = inp.pick(&[0, 0, 0, 1, 32, 64, 256, -1]);
    pa.intermediate_align = inp.pick(&[0, 0, 0, 1, 32, 64, 256, -1]);
    pa.w13 = &w13.t;
    pa.w2 = &w2.t;
    pa.w13_scale = p(&w13s);
    pa.w2_scale = p(&w2s);
    pa.w13_bias = p(&b13);
    pa.w2_bias = p(&b2);
    if inp.chance(16) {
        pa.w13_scale = ptr::null();
    }
    let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    sizes.struct_size = std::mem::size_of::<moeplug_prepare_moe_sizes_out>() as u32;
    let ab = ArgBuf::new(inp, &pa);
    let before = b.snapshot();
    let sizes_before: [u8; std::mem::size_of::<moeplug_prepare_moe_sizes_out>()] =
        unsafe { std::mem::transmute(sizes) };
    // SAFETY: every pointer names memory of this frame.
    let ok = documented("moeplug_prepare_moe_sizes", unsafe {
        moeplug_prepare_moe_sizes(ab.ptr(), &mut sizes)
    });
    b.verify("moeplug_prepare_moe_sizes", &before, ok, &[]);
    let sizes_after: [u8; std::mem::size_of::<moeplug_prepare_moe_sizes_out>()] =
        unsafe { std::mem::transmute(sizes) };
    if !ok {
        assert!(
            sizes_before == sizes_after,
            "prepare_moe_sizes failed but wrote its output"
        );
        return;
    }
    assert!(
        sizes.layout.num_experts > 0 && sizes.w13_bytes > 0 && sizes.w2_bytes > 0,
        "sizes OK but empty"
    );
    // The outputs, as sizes says (dtype of the matching input).
    let shape = |nd: i32, s: [i64; 4]| s[..nd as usize].to_vec();
    let o13 = b.tensor(
        inp,
        &shape(sizes.w13_ndim, sizes.w13_shape),
        wdt,
        Fill::Pattern,
    );
    let o2 = b.tensor(
        inp,
        &shape(sizes.w2_ndim, sizes.w2_shape),
        wdt,
        Fill::Pattern,
    );
    let o13s = (sizes.w13_scale_ndim > 0).then(|| {
        b.tensor(
            inp,
            &shape(sizes.w13_scale_ndim, sizes.w13_scale_shape),
            sdt,
            Fill::Pattern,
        )
    });
    let o2s = (sizes.w2_scale_ndim > 0).then(|| {
        b.tensor(
            inp,
            &shape(sizes.w2_scale_ndim, sizes.w2_scale_shape),
            sdt,
            Fill::Pattern,
        )
    });
    let o13b = (sizes.w13_bias_ndim > 0).then(|| {
        b.tensor(
            inp,
            &shape(sizes.w13_bias_ndim, sizes.w13_bias_shape),
            F32,
            Fill::Pattern,
        )
    });
    let o2b = (sizes.w2_bias_ndim > 0).then(|| {
        b.tensor(
            inp,
            &shape(sizes.w2_bias_ndim, sizes.w2_bias_shape),
            F32,
            Fill::Pattern,
        )
    });
    let mut layout: moeplug_layout = unsafe { std::mem::zeroed() };
    layout.struct_size = std::mem::size_of::<moeplug_layout>() as u32;
    let mut pa2 = pa;
    pa2.out_w13 = &o13.t;
    pa2.out_w2 = &o2.t;
    pa2.out_w13_scale = p(&o13s);
    pa2.out_w2_scale = p(&o2s);
    pa2.out_w13_bias = p(&o13b);
    pa2.out_w2_bias = p(&o2b);
    pa2.out_layout = &mut layout;
    let mut o13m = o13;
    maybe_alias(inp, &b, &mut o13m, &[&w13, &w2]);
    pa2.out_w13 = &o13m.t;
    let ab = ArgBuf::new(inp, &pa2);
    let outs: Vec<usize> = [
        Some(&o13m),
        Some(&o2),
        o13s.as_ref(),
        o2s.as_ref(),
        o13b.as_ref(),
        o2b.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|d| d.buf)
    .collect();
    let before = b.snapshot();
    // SAFETY: as above.
    let ok = documented("moeplug_prepare_moe", unsafe {
        moeplug_prepare_moe(ab.ptr(), ptr::null_mut())
    });
    b.verify("moeplug_prepare_moe", &before, ok, &outs);
    if !ok {
        assert_eq!(
            layout.num_experts, 0,
            "prepare_moe failed but wrote the layout"
        );
        return;
    }
    fused(
        inp,
        &mut b,
        &mut layout,
        format,
        [&o13m, &o2],
        [&o13s, &o2s],
        [&o13b, &o2b],
        wdt,
    );
}

fn fused(
    inp: &mut Input,
    b: &mut Bufs,
    layout: &mut moeplug_layout,
    format: i32,
    w: [&Box<Desc>; 2],
    scales: [&Option<Box<Desc>>; 2],
    biases: [&Option<Box<Desc>>; 2],
    _wdt: (u8, u8),
) {
    let (h, hp, e) = (
        layout.hidden_size,
        layout.hidden_padded,
        layout.num_experts as i64,
    );
    // Large M rarely and not too large: a 4096-token launch costs a thousand small ones.
    let m = if inp.chance(64) {
        inp.pick(&[130i64, 600])
    } else {
        inp.pick(&[1i64, 2, 3, 5, 8, 17, 0, 33, 64])
    };
    let k = if inp.chance(24) {
        inp.pick(&[129i64, 200, 8])
    } else {
        1 + inp.below(e.min(4) as usize) as i64
    };
    // Many slots only with few tokens: a fuzz run stays fast.
    let m = if k > 8 { m.min(9) } else { m };
    let xdt = inp.pick(&[BF16, BF16, F16]);
    let odt = inp.pick(&[BF16, BF16, F16]);
    let xcols = if inp.chance(3) { hp } else { h };
    let ocols = if inp.chance(3) { hp } else { h };
    let x = b.tensor(inp, &[m, xcols], xdt, Fill::Noise);
    let tw = b.tensor(inp, &[m, k], F32, Fill::Noise);
    let ti = b.tensor(inp, &[m, k], I32, Fill::Zero);
    // Expert ids mostly in range, some out of range.
    {
        let ids = ti.buf;
        let n = (m * k).max(0) as usize;
        let vals: Vec<i32> = (0..n)
            .map(|_| (inp.noise() as i32 % (e as i32 + 2)) - 1)
            .collect();
        let body = &mut b.0[ids];
        let at = GUARD + body.misalign;
        for (j, v) in vals.iter().enumerate() {
            body.all_mut()[at + 4 * j..at + 4 * j + 4].copy_from_slice(&v.to_le_bytes());
        }
        // Weights: small finite values (the noise may hold NaNs: they stay NaN, never crash).
        if inp.chance(2) {
            let twb = &mut b.0[tw.buf];
            let at = GUARD + twb.misalign;
            for j in 0..n {
                twb.all_mut()[at + 4 * j..at + 4 * j + 4].copy_from_slice(&0.25f32.to_le_bytes());
            }
        }
    }
    let mask = inp.chance(4).then(|| {
        let eg = e + inp.below(3) as i64;
        let d = b.tensor(inp, &[eg], I32, Fill::Zero);
        let mb = &mut b.0[d.buf];
        let at = GUARD + mb.misalign;
        for j in 0..e as usize {
            mb.all_mut()[at + 4 * j..at + 4 * j + 4].copy_from_slice(&1i32.to_le_bytes());
        }
        d
    });
    let nlt = inp.chance(4).then(|| {
        let d = b.tensor(inp, &[1], I32, Fill::Zero);
        let v = inp.pick(&[0i32, 1, -3, m as i32, m as i32 + 5, i32::MAX]);
        let nb = &mut b.0[d.buf];
        let at = GUARD + nb.misalign;
        nb.all_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes());
        d
    });
    let mut out = b.tensor(inp, &[m, ocols], odt, Fill::Pattern);
    maybe_alias(inp, b, &mut out, &[&x, w[0], &tw]);
    if inp.chance(20) {
        // A bent record: one field off.
        match inp.below(5) {
            0 => layout.num_experts += 1,
            1 => layout.hidden_padded += 16,
            2 => layout.gate_mode = enum_value(inp, &[1, 2, 3]),
            3 => layout.flags ^= 1,
            _ => layout.weight_layout = enum_value(inp, &[1, 2]),
        }
    }
    let allowed: &[i32] = match format {
        1 | 2 => &[0, 1, 2],
        3 | 4 => &[0, 1, 2, 3, 4],
        5 => &[0, 1, 2, 5],
        6 => &[0, 1, 2, 6, 7],
        _ => &[0, 1, 2, 7],
    };
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = std::mem::size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = layout;
    a.activation = enum_value(inp, &[0, 1, 2, 3]);
    a.alpha = inp.pick(&[0.0f32, 0.0, 1.0, 1.702, -1.0, f32::NAN]);
    a.limit = inp.pick(&[0.0f32, 0.0, 7.0, 0.5, -1.0, f32::INFINITY]);
    a.act_dtype = enum_value(inp, allowed);
    a.flags = inp.pick(&[0u32, 0, 8, 1, 0xFFFF]);
    a.hidden_states = &x.t;
    a.w13 = &w[0].t;
    a.w2 = &w[1].t;
    a.w13_scale = p(scales[0]);
    a.w2_scale = p(scales[1]);
    a.w13_bias = p(biases[0]);
    a.w2_bias = p(biases[1]);
    a.topk_weights = &tw.t;
    a.topk_ids = &ti.t;
    a.expert_mask = p(&mask);
    a.num_local_tokens = p(&nlt);
    a.output = &out.t;
    let ab = ArgBuf::new(inp, &a);
    let before = b.snapshot();
    // SAFETY: every pointer names memory of this frame.
    let ok = documented("moeplug_check_fused_moe", unsafe {
        moeplug_check_fused_moe(1, 0, ab.ptr())
    });
    b.verify("moeplug_check_fused_moe", &before, ok, &[]);
    let mut ws = usize::MAX;
    let ok = documented("moeplug_fused_moe_workspace_size", unsafe {
        moeplug_fused_moe_workspace_size(ab.ptr(), &mut ws)
    });
    b.verify("moeplug_fused_moe_workspace_size", &before, ok, &[]);
    if ok {
        assert_eq!(ws, 0, "the CPU backend needs no workspace");
    } else {
        assert_eq!(ws, usize::MAX, "workspace_size failed but wrote");
    }
    let ok = documented("moeplug_fused_moe", unsafe { moeplug_fused_moe(ab.ptr()) });
    b.verify("moeplug_fused_moe", &before, ok, &[out.buf]);
    if ok && m * k <= 256 && inp.below(4) == 0 {
        // The same launch again gives the same bytes.
        let first = b.0[out.buf].body().to_vec();
        let ok2 = documented("moeplug_fused_moe", unsafe { moeplug_fused_moe(ab.ptr()) });
        assert!(ok2, "a launch that succeeded failed the second time");
        assert!(
            b.0[out.buf].body() == &first[..],
            "fused_moe is not deterministic"
        );
    }
}
