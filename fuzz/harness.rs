//! The fuzz harness of the C surface, shared by the libFuzzer target (fuzz/fuzz_targets) and
//! the corpus replay of the normal test suite (tests/fuzz_corpus.rs).
//!
//! One input drives a short sequence of calls. Every tensor gets a distinct host buffer of
//! exactly the bytes it describes, framed by guard bytes, so well-formed calls reach the
//! kernels; the input then bends one thing at a time: shapes, dtypes, strides, data /
//! byte_offset splits (equivalent or wild), misalignment, devices, aliasing between an
//! output and an input, struct_size (with a real tail buffer behind it), enum values and
//! flags. The full MoE path is prepare_moe_sizes → prepare_moe (also with an AITER `target`)
//! → aiter_args → check_fused_moe / resolve_config → fused_moe_workspace_size → fused_moe on
//! the prepared weights. Every ABI 1.1 export is driven too: each primitive writes its
//! `out_fragment` (a real buffer, struct_size bent); `layout_from_fragments` assembles the
//! fragments a run produced (a pad_weights + shuffle_weight chain whose record then launches
//! fused_moe, and pools of produced, declared and mutated fragments); `aiter_args` and
//! `resolve_config` take prepared, assembled and mutated records; a run may set the thread
//! count (1 to 4, restored), a log and a progress callback (cleared after the run), whose
//! messages and reports are checked, and which call back into the library.
//!
//! After every call: the status is documented and never INTERNAL; a failure has a message
//! that begins with the function's name (and, with the log callback set, is logged as DEBUG
//! `STATUS: message`); a success leaves `moeplug_last_error` empty; on failure no byte of any
//! buffer or output struct changed; on success no input changed and output structs follow the
//! struct_size rules (min(S, L) bytes, the caller's tail zeroed, nothing past S); guard bytes
//! are intact everywhere; a successful fused_moe gives the same bytes when run again (a
//! quarter of the time, possibly with another thread count: it doubles the cost).

#![allow(clippy::too_many_arguments)]

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::mem::size_of;
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use libc::{c_char, c_void};

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
        let buf = Buf::new(storage_bytes(shape, dtype), misalign, inp, fill);
        self.0.push(buf);
        self.view(inp, self.0.len() - 1, shape, dtype)
    }
    /// A descriptor over buffer `idx` (a new one, or an earlier call's output), bent by the
    /// input.
    fn view(&mut self, inp: &mut Input, idx: usize, shape: &[i64], dtype: (u8, u8)) -> Box<Desc> {
        let data = self.0[idx].ptr();
        let mut d = Box::new(Desc {
            shape: [0; 8],
            strides: [0; 8],
            t: moeplug_tensor::host(data as *mut libc::c_void, &[], dtype.0, dtype.1),
            buf: idx,
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

/// The status is documented, never INTERNAL, and a failure says which call failed (and a
/// success leaves no message); then the callbacks' observations of the call are checked.
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
    let m = last_error();
    if s != moeplug_status::MoeplugOk {
        assert!(
            m.starts_with(&format!("{what}: ")),
            "{what}: status {s:?}, message {m:?}"
        );
        assert!(
            m.len() > what.len() + 2,
            "{what}: status {s:?} without a message"
        );
    }
    after_call(what, s, &m);
    s == moeplug_status::MoeplugOk
}

/// An argument struct in a buffer of STRUCT_BUF bytes, its struct_size bent by the input
/// (below the first size, 0, each frozen size of the struct, larger with a zero or non-zero
/// tail, the largest the rules know). Sizes that would cut a field in two are never claimed:
/// a torn `out_fragment` pointer would be the caller's memory error, not a finding.
struct ArgBuf {
    store: Vec<u64>,
    /// The struct_size the library sees.
    claimed: usize,
    /// Whether the size rules accept it (at least the first size, zero tail).
    valid: bool,
}

impl ArgBuf {
    /// `versions`: the struct's frozen sizes, smallest (the first accepted) first.
    fn new<T: Copy>(inp: &mut Input, args: &T, versions: &[u32]) -> ArgBuf {
        let mut store = vec![0u64; STRUCT_BUF / 8];
        let size = size_of::<T>();
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
        let (mut claimed, mut valid) = (size, true);
        if inp.chance(12) {
            claimed = match inp.below(6 + versions.len()) {
                0 => versions[0] as usize - 4,
                1 => 0,
                2 => size + 8,
                3 => 4096,
                4 => 4097,
                5 => STRUCT_BUF,
                k => versions[k - 6] as usize,
            };
            bytes[..4].copy_from_slice(&(claimed as u32).to_le_bytes());
            valid = claimed >= versions[0] as usize;
            if inp.chance(2) && claimed > size {
                bytes[size + inp.below(claimed - size)] = 1;
                valid = false;
            }
        }
        ArgBuf {
            store,
            claimed,
            valid,
        }
    }
    fn ptr<T>(&self) -> *const T {
        self.store.as_ptr() as *const T
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the store holds STRUCT_BUF bytes.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr() as *const u8, STRUCT_BUF) }
    }
}

/// An output struct the library fills, in a buffer of STRUCT_BUF bytes preset to 0xEE, its
/// struct_size bent by the input (below the first size: refused; larger: the tail zeroed).
struct OutStruct {
    store: Vec<u64>,
    size: usize,
    before: Vec<u8>,
}

impl OutStruct {
    fn new(inp: &mut Input, min: usize, known: usize) -> OutStruct {
        let size = if inp.chance(10) {
            inp.pick(&[min - 4, 0, min, known + 8, 4096, STRUCT_BUF])
        } else {
            known
        };
        let mut store = vec![0u64; STRUCT_BUF / 8];
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(store.as_mut_ptr() as *mut u8, STRUCT_BUF) };
        bytes.fill(0xEE);
        bytes[..4].copy_from_slice(&(size as u32).to_le_bytes());
        let before = bytes.to_vec();
        OutStruct {
            store,
            size,
            before,
        }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the store holds STRUCT_BUF bytes.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr() as *const u8, STRUCT_BUF) }
    }
    fn ptr<T>(&mut self) -> *mut T {
        self.store.as_mut_ptr() as *mut T
    }
    /// docs/abi.md §5 after a call: untouched unless the call succeeded and was given the
    /// struct; else min(S, L) bytes written, struct_size set to that, the caller's bytes from
    /// L to S zeroed, nothing past S touched.
    fn check(&self, what: &str, ok: bool, given: bool, min: usize, known: usize) {
        let now = self.bytes();
        if !ok || !given {
            assert!(
                now == &self.before[..],
                "{what}: output struct written (ok {ok}, given {given})"
            );
            return;
        }
        assert!(
            self.size >= min,
            "{what}: succeeded with an output struct_size of {} (below {min})",
            self.size
        );
        let written = self.size.min(known);
        let reported = u32::from_le_bytes(now[..4].try_into().unwrap()) as usize;
        assert_eq!(reported, written, "{what}: struct_size written back");
        assert!(
            now[written..self.size].iter().all(|&b| b == 0),
            "{what}: the caller's bytes past the library's struct not zeroed"
        );
        assert!(
            now[self.size..] == self.before[self.size..],
            "{what}: wrote past struct_size {}",
            self.size
        );
    }
    /// The struct as written (fields past its struct_size zero).
    fn get<T: Copy>(&self) -> T {
        // SAFETY: T is plain data for which all-zero is valid; n <= size_of::<T>().
        unsafe {
            let mut v: T = std::mem::zeroed();
            let n = (u32::from_le_bytes(self.bytes()[..4].try_into().unwrap()) as usize)
                .min(size_of::<T>());
            ptr::copy_nonoverlapping(self.bytes().as_ptr(), &mut v as *mut T as *mut u8, n);
            v
        }
    }
}

const FRAG: usize = size_of::<moeplug_layout_fragment>();
const RECORD: usize = size_of::<moeplug_layout>();
const RECORD_V10: usize = MOEPLUG_LAYOUT_SIZE_V1_0 as usize;

thread_local! {
    /// Fragments the primitives of this run wrote (assembled by `assemble`).
    static FRAGS: RefCell<Vec<moeplug_layout_fragment>> = const { RefCell::new(Vec::new()) };
}

/// A primitive's optional `out_fragment` (1.1): NULL, or a buffer with a bent struct_size.
struct FragOut(Option<OutStruct>);

impl FragOut {
    fn new(inp: &mut Input) -> FragOut {
        FragOut((inp.below(4) != 0).then(|| OutStruct::new(inp, FRAG, FRAG)))
    }
    fn ptr(&mut self) -> *mut moeplug_layout_fragment {
        self.0.as_mut().map_or(ptr::null_mut(), |o| o.ptr())
    }
    /// After the call: the library read `out_fragment` only if the argument struct's size
    /// covers it (`v11`); a bad fragment size fails the call before any work; a success
    /// writes every byte of the fragment. Returns the fragment written (also pooled).
    fn after(
        &self,
        what: &'static str,
        s: moeplug_status,
        ab: &ArgBuf,
        v11: u32,
    ) -> Option<moeplug_layout_fragment> {
        let o = self.0.as_ref()?;
        let ok = s == moeplug_status::MoeplugOk;
        let given = ab.claimed >= v11 as usize;
        if given && ab.valid && o.size < FRAG {
            assert_eq!(
                s,
                moeplug_status::MoeplugInvalidArgument,
                "{what}: out_fragment.struct_size {} accepted",
                o.size
            );
            let m = last_error();
            assert!(m.contains("out_fragment"), "{what}: {m:?}");
        }
        o.check(what, ok, given, FRAG, FRAG);
        if !(ok && given) {
            return None;
        }
        let f: moeplug_layout_fragment = o.get();
        check_fragment(what, &f);
        FRAGS.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < 32 {
                p.push(f);
            }
        });
        Some(f)
    }
}

/// A fragment a primitive wrote: reserved zero, values in range.
fn check_fragment(what: &str, f: &moeplug_layout_fragment) {
    assert_eq!(f.reserved0, 0, "{what}: fragment reserved0");
    for (name, v) in [
        ("weight_format", f.weight_format),
        ("gate_mode", f.gate_mode),
        ("weight_layout", f.weight_layout),
        ("scale_layout", f.scale_layout),
        ("act_dtype", f.act_dtype),
    ] {
        assert!((0..=16).contains(&v), "{what}: fragment {name} {v}");
    }
    assert!((0..=2).contains(&f.has_bias), "{what}: fragment has_bias");
    for (name, v) in [
        ("num_experts", f.num_experts),
        ("hidden_size", f.hidden_size),
        ("intermediate_size", f.intermediate_size),
        ("hidden_padded", f.hidden_padded),
        ("intermediate_padded", f.intermediate_padded),
    ] {
        assert!((0..1 << 40).contains(&v), "{what}: fragment {name} {v}");
    }
    for (n, p) in [
        (f.hidden_size, f.hidden_padded),
        (f.intermediate_size, f.intermediate_padded),
    ] {
        assert!(
            n == 0 || p == 0 || p >= n,
            "{what}: fragment padded {p} below logical {n}"
        );
    }
}

// ---- Process settings: thread count, log and progress callbacks (ABI 1.1) ------------------

/// Held by the run that changes the process settings, for the whole run: in the stable test
/// several threads run the harness at once, and a run that checks what its callbacks saw must
/// be the only one setting them. Runs that change nothing do not take it.
static SETTINGS: Mutex<()> = Mutex::new(());
/// What `user` points to (the callbacks check they get it back).
static USER_MARK: u8 = 0x5A;

fn user_mark() -> *mut c_void {
    &USER_MARK as *const u8 as *mut c_void
}

/// What this thread's callbacks saw since the last `documented` call.
#[derive(Default)]
struct Seen {
    /// This thread holds SETTINGS and installed the settings below.
    owner: bool,
    threads: u32,
    log: bool,
    progress: bool,
    /// The callbacks call setters back (each must be refused from inside a callback).
    reenter: bool,
    last_log: Option<(i32, String)>,
    /// (operation, first done, last done, total) of the reports.
    report: Option<(String, u64, u64, u64)>,
    /// Statuses of the calls the callbacks made.
    nested: Vec<(&'static str, i32)>,
    /// The first rule a callback saw broken.
    bad: Option<String>,
}

impl Seen {
    fn flag(&mut self, why: String) {
        self.bad.get_or_insert(why);
    }
}

thread_local! {
    static SEEN: RefCell<Seen> = RefCell::new(Seen::default());
    /// A callback is running on this thread (a nested one would be a finding).
    static IN_CB: Cell<bool> = const { Cell::new(false) };
    static NESTED_CB: Cell<bool> = const { Cell::new(false) };
}

/// Setters from inside a callback: refused (INVALID_ARGUMENT), and they neither log nor
/// report (a nested callback is flagged).
fn reenter() -> Vec<(&'static str, i32)> {
    vec![
        (
            "moeplug_set_log_callback",
            moeplug_set_log_callback(None, ptr::null_mut()) as i32,
        ),
        (
            "moeplug_set_progress_callback",
            moeplug_set_progress_callback(None, ptr::null_mut()) as i32,
        ),
        (
            "moeplug_set_num_threads",
            moeplug_set_num_threads(4097) as i32,
        ),
    ]
}

/// Enter a callback: false (and flagged) if one is already running on this thread.
fn cb_enter() -> bool {
    if IN_CB.with(|c| c.replace(true)) {
        NESTED_CB.with(|n| n.set(true));
        return false;
    }
    true
}

fn cb_reenter_wanted() -> bool {
    SEEN.with(|s| s.try_borrow().is_ok_and(|s| s.reenter))
}

/// The shared part of both callbacks: refuse nesting, try the setters from inside when the
/// input asks, check `user` and the string argument (`what` names it in a flag), then run
/// `body` on what was seen.
fn in_callback(
    kind: &str,
    what: &str,
    user: *mut c_void,
    text: *const c_char,
    body: impl FnOnce(&mut Seen, String),
) {
    if !cb_enter() {
        return;
    }
    // SAFETY: the library passes a NUL-terminated string valid during the callback, or NULL.
    let text = (!text.is_null()).then(|| {
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    });
    let nested = if cb_reenter_wanted() {
        reenter()
    } else {
        Vec::new()
    };
    SEEN.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if user != user_mark() {
                s.flag(format!("{kind} callback: user {user:p}"));
            }
            match text {
                None => s.flag(format!("{kind} callback: NULL {what}")),
                Some(t) => body(&mut s, t),
            }
            if s.nested.len() < 16 {
                s.nested.extend(nested);
            }
        }
    });
    IN_CB.with(|c| c.set(false));
}

unsafe extern "C" fn log_cb(level: i32, message: *const c_char, user: *mut c_void) {
    in_callback("log", "message", user, message, |s, t| {
        if !(2..=4).contains(&level) {
            s.flag(format!("log level {level}: {t}"));
        }
        if t.is_empty() {
            s.flag("log callback: empty message".into());
        }
        s.last_log = Some((level, t));
    });
}

unsafe extern "C" fn progress_cb(op: *const c_char, done: u64, total: u64, user: *mut c_void) {
    in_callback("progress", "operation", user, op, |s, op| {
        if done > total {
            s.flag(format!("progress {op}: done {done} > total {total}"));
        }
        match s.report.take() {
            None => s.report = Some((op, done, done, total)),
            Some((o, first, last, t)) => {
                if o != op || t != total || done <= last {
                    s.flag(format!(
                        "progress: ({op}, {done}, {total}) after ({o}, {last}, {t})"
                    ));
                }
                s.report = Some((o, first, done, t));
            }
        }
    });
}

/// What the callbacks saw of the call `what` that returned `s` (message `m`).
fn after_call(what: &'static str, s: moeplug_status, m: &str) {
    let seen = SEEN.with(|c| {
        let mut c = c.borrow_mut();
        Seen {
            owner: c.owner,
            threads: c.threads,
            log: c.log,
            progress: c.progress,
            reenter: c.reenter,
            last_log: c.last_log.take(),
            report: c.report.take(),
            nested: std::mem::take(&mut c.nested),
            bad: c.bad.take(),
        }
    });
    assert!(
        !NESTED_CB.with(|n| n.replace(false)),
        "{what}: a callback was called from inside a callback"
    );
    // A setter a callback called may leave its message; otherwise a success leaves none.
    if s == moeplug_status::MoeplugOk && seen.nested.is_empty() {
        assert!(m.is_empty(), "{what}: OK but last_error {m:?}");
    }
    if !seen.owner {
        return;
    }
    if let Some(b) = seen.bad {
        panic!("{what}: {b}");
    }
    for (f, st) in &seen.nested {
        assert_eq!(
            *st,
            moeplug_status::MoeplugInvalidArgument as i32,
            "{what}: {f} from inside a callback returned {st}"
        );
    }
    if seen.threads != 0 {
        let n = moeplug_num_threads();
        assert_eq!(n, seen.threads, "{what}: the thread count changed");
    }
    if seen.log && s != moeplug_status::MoeplugOk {
        // SAFETY: a static C string.
        let name = unsafe { CStr::from_ptr(moeplug_status_name(s as i32)) }.to_string_lossy();
        assert_eq!(
            seen.last_log,
            Some((4, format!("{name}: {m}"))),
            "{what}: the failure was not logged as DEBUG"
        );
    }
    if seen.progress {
        let reports = matches!(what, "moeplug_prepare_moe" | "moeplug_quantize_mx");
        match &seen.report {
            None => assert!(
                !(reports && s == moeplug_status::MoeplugOk),
                "{what}: succeeded without a progress report"
            ),
            Some((op, first, last, total)) => {
                assert!(reports, "{what}: reported progress ({op})");
                assert_eq!(op, what, "{what}: progress operation");
                assert_eq!(*first, 0, "{what}: first report done {first}");
                if s == moeplug_status::MoeplugOk {
                    assert_eq!(last, total, "{what}: last report of a success");
                } else {
                    assert!(
                        *total == 0 || last < total,
                        "{what}: failed after reporting done == total"
                    );
                }
            }
        }
    }
}

/// The process settings of one run; restored (default thread count, no callbacks) on drop.
struct Settings {
    _lock: MutexGuard<'static, ()>,
}

/// Maybe change the process settings for this run: refused values first (the setting
/// unchanged), then a thread count of 1 to 4, a log and a progress callback.
fn settings(inp: &mut Input) -> Option<Settings> {
    if !inp.chance(5) {
        return None;
    }
    let lock = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    SEEN.with(|s| {
        *s.borrow_mut() = Seen {
            owner: true,
            ..Seen::default()
        }
    });
    let set = |f: fn(&mut Seen)| SEEN.with(|s| f(&mut s.borrow_mut()));
    if inp.chance(4) {
        let before = moeplug_num_threads();
        let bad = inp.pick(&[4097u32, u32::MAX, 1 << 20]);
        let s = moeplug_set_num_threads(bad);
        assert!(
            !documented("moeplug_set_num_threads", s),
            "{bad} threads accepted"
        );
        assert_eq!(s, moeplug_status::MoeplugInvalidArgument);
        let after = moeplug_num_threads();
        assert_eq!(after, before, "a refused set_num_threads changed the count");
    }
    if inp.chance(4) {
        let s = moeplug_set_log_callback(None, user_mark());
        assert!(
            !documented("moeplug_set_log_callback", s),
            "NULL callback with a user"
        );
        let s = moeplug_set_progress_callback(None, user_mark());
        assert!(
            !documented("moeplug_set_progress_callback", s),
            "NULL callback with a user"
        );
    }
    if inp.chance(2) {
        let n = 1 + inp.below(4) as u32;
        SEEN.with(|s| s.borrow_mut().threads = n);
        let s = moeplug_set_num_threads(n);
        assert!(documented("moeplug_set_num_threads", s));
        assert_eq!(moeplug_num_threads(), n, "num_threads after set");
    }
    if inp.chance(2) {
        let s = moeplug_set_log_callback(Some(log_cb), user_mark());
        assert!(documented("moeplug_set_log_callback", s));
        set(|s| s.log = true);
    }
    if inp.chance(2) {
        let s = moeplug_set_progress_callback(Some(progress_cb), user_mark());
        assert!(documented("moeplug_set_progress_callback", s));
        set(|s| s.progress = true);
    }
    if inp.chance(3) {
        set(|s| s.reenter = true);
    }
    Some(Settings { _lock: lock })
}

impl Drop for Settings {
    fn drop(&mut self) {
        let r = [
            moeplug_set_num_threads(0),
            moeplug_set_log_callback(None, ptr::null_mut()),
            moeplug_set_progress_callback(None, ptr::null_mut()),
        ];
        SEEN.with(|s| *s.borrow_mut() = Seen::default());
        if !std::thread::panicking() {
            assert!(
                r.iter().all(|&s| s == moeplug_status::MoeplugOk),
                "restoring the settings: {r:?}"
            );
        }
    }
}

/// The thread count this run set (0: the default), if it owns the settings.
fn owned_threads() -> Option<u32> {
    SEEN.with(|s| {
        let s = s.borrow();
        s.owner.then_some(s.threads)
    })
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

/// One input: a few calls, maybe under changed process settings.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    FRAGS.with(|f| f.borrow_mut().clear());
    let settings = settings(&mut inp);
    let calls = 1 + inp.below(3);
    for _ in 0..calls {
        // Past the input's end (0) the full MoE path runs.
        match inp.below(12) {
            1 => caps(&mut inp),
            2 => shuffle_weight(&mut inp),
            3 => shuffle_scale(&mut inp),
            4 => pad_weights(&mut inp),
            5 => swizzle_scale(&mut inp),
            6 => quantize_mx(&mut inp),
            9 => frag_chain(&mut inp),
            10 => assemble(&mut inp),
            _ => moe(&mut inp),
        }
    }
    drop(settings);
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
    let abi = moeplug_abi_version();
    assert!(
        abi >> 16 == 1 && abi & 0xFFFF >= 1,
        "abi_version {abi:#x}: this harness drives 1.1 exports"
    );
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
        assert_eq!(
            u32::from_le_bytes(out[4..8].try_into().unwrap()),
            abi,
            "caps.abi_version"
        );
    } else {
        assert!(out == before, "get_caps failed but wrote");
    }
    // The status names and the version are static and total.
    for s in [-1, 0, 9, 10, inp.pick(&[i32::MIN, 5])] {
        // SAFETY: a static C string.
        let name = unsafe { CStr::from_ptr(moeplug_status_name(s)) };
        assert!(!name.to_bytes().is_empty());
    }
    let (v1, v2) = (moeplug_version(), moeplug_version());
    assert!(
        !v1.is_null() && v1 == v2,
        "moeplug_version: not one static string"
    );
    // SAFETY: non-NULL, static.
    let v = unsafe { CStr::from_ptr(v1) }.to_bytes();
    assert!(
        v.first().is_some_and(|c| c.is_ascii_digit()) && std::str::from_utf8(v).is_ok(),
        "moeplug_version {v:?}"
    );
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
    let tiles = [enum_value(inp, &[0, 16, 32]), enum_value(inp, &[0, 16, 32])];
    let flags = [inp.chance(8), inp.chance(6), inp.chance(6)];
    shuffle_call(inp, &mut b, &src, &dst, tiles, flags, pad);
}

/// `moeplug_shuffle_weight` from `src` into `dst`; `flags`: use_int4, is_guinterleave,
/// gate_up. Returns the fragment written.
fn shuffle_call(
    inp: &mut Input,
    b: &mut Bufs,
    src: &Desc,
    dst: &Desc,
    tiles: [i32; 2],
    flags: [bool; 3],
    pad: i64,
) -> Option<moeplug_layout_fragment> {
    let what = "moeplug_shuffle_weight";
    let mut fo = FragOut::new(inp);
    let a = moeplug_shuffle_weight_args {
        struct_size: size_of::<moeplug_shuffle_weight_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        layout_n: tiles[0],
        layout_k: tiles[1],
        use_int4: flags[0] as i32,
        is_guinterleave: flags[1] as i32,
        gate_up: flags[2] as i32,
        pad_k_to: pad,
        out_fragment: fo.ptr(),
    };
    let v = [
        MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_0,
        MOEPLUG_SHUFFLE_WEIGHT_ARGS_SIZE_V1_1,
    ];
    let ab = ArgBuf::new(inp, &a, &v);
    let before = b.snapshot();
    // SAFETY: every pointer names memory of this frame, sized as described (or bent on purpose).
    let s = unsafe { moeplug_shuffle_weight(ab.ptr(), ptr::null_mut()) };
    let ok = documented(what, s);
    b.verify(what, &before, ok, &[dst.buf]);
    fo.after(what, s, &ab, v[1])
}

fn shuffle_scale(inp: &mut Input) {
    let what = "moeplug_shuffle_scale";
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
    let mut fo = FragOut::new(inp);
    let a = moeplug_shuffle_scale_args {
        struct_size: size_of::<moeplug_shuffle_scale_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        num_experts: if gui {
            e as i32
        } else {
            enum_value(inp, &[0, 1])
        },
        is_guinterleave: gui as i32,
        gate_up: inp.chance(3) as i32,
        out_fragment: fo.ptr(),
    };
    let v = [
        MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_0,
        MOEPLUG_SHUFFLE_SCALE_ARGS_SIZE_V1_1,
    ];
    let ab = ArgBuf::new(inp, &a, &v);
    let before = b.snapshot();
    // SAFETY: as in shuffle_call.
    let s = unsafe { moeplug_shuffle_scale(ab.ptr(), ptr::null_mut()) };
    let ok = documented(what, s);
    b.verify(what, &before, ok, &[dst.buf]);
    fo.after(what, s, &ab, v[1]);
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
    let gate_up = inp.chance(4);
    pad_call(inp, &mut b, &src, &dst, gate_up);
}

/// `moeplug_pad_weights` from `src` into `dst`. Returns the fragment written.
fn pad_call(
    inp: &mut Input,
    b: &mut Bufs,
    src: &Desc,
    dst: &Desc,
    gate_up: bool,
) -> Option<moeplug_layout_fragment> {
    let what = "moeplug_pad_weights";
    let fill = inp.pick(&[
        0.0,
        0.0,
        1.0,
        -2.5,
        0.3,
        f64::NAN,
        1e300,
        2f64.powi(-127),
        127.0,
    ]);
    let mut fo = FragOut::new(inp);
    let a = moeplug_pad_weights_args {
        struct_size: size_of::<moeplug_pad_weights_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        gate_up: gate_up as i32,
        fill,
        out_fragment: fo.ptr(),
    };
    let v = [
        MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_0,
        MOEPLUG_PAD_WEIGHTS_ARGS_SIZE_V1_1,
    ];
    let ab = ArgBuf::new(inp, &a, &v);
    trace(what, &[src, dst]);
    if std::env::var_os("MOEPLUG_FUZZ_TRACE").is_some() {
        eprintln!("gate_up {} fill {}", a.gate_up, a.fill);
    }
    let before = b.snapshot();
    // SAFETY: as in shuffle_call.
    let s = unsafe { moeplug_pad_weights(ab.ptr(), ptr::null_mut()) };
    let ok = documented(what, s);
    b.verify(what, &before, ok, &[dst.buf]);
    fo.after(what, s, &ab, v[1])
}

fn swizzle_scale(inp: &mut Input) {
    let what = "moeplug_swizzle_scale";
    let e = small(inp, &[1, 2]);
    let n = small(inp, &[32, 64, 40]);
    let ks = small(inp, &[8, 4, 16, 9]);
    let mut b = Bufs(Vec::new());
    let src = b.tensor(inp, &[e, n, ks], E8M0, Fill::Noise);
    let dshape = [e, cdiv(n, 32), cdiv(ks, 8) * 8 * 32];
    let mut dst = b.tensor(inp, &dshape, E8M0, Fill::Pattern);
    maybe_alias(inp, &b, &mut dst, &[&src]);
    let mut fo = FragOut::new(inp);
    let a = moeplug_swizzle_scale_args {
        struct_size: size_of::<moeplug_swizzle_scale_args>() as u32,
        src: &src.t,
        dst: &dst.t,
        layout: enum_value(inp, &[0, 3, 1, 2]),
        out_fragment: fo.ptr(),
    };
    let v = [
        MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_0,
        MOEPLUG_SWIZZLE_SCALE_ARGS_SIZE_V1_1,
    ];
    let ab = ArgBuf::new(inp, &a, &v);
    let before = b.snapshot();
    // SAFETY: as in shuffle_call.
    let s = unsafe { moeplug_swizzle_scale(ab.ptr(), ptr::null_mut()) };
    let ok = documented(what, s);
    b.verify(what, &before, ok, &[dst.buf]);
    fo.after(what, s, &ab, v[1]);
}

fn quantize_mx(inp: &mut Input) {
    let what = "moeplug_quantize_mx";
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
    let mut fo = FragOut::new(inp);
    let a = moeplug_quantize_mx_args {
        struct_size: size_of::<moeplug_quantize_mx_args>() as u32,
        src: &src.t,
        dst_q: &q.t,
        dst_scale: &s.t,
        format: enum_value(inp, &[fmt]),
        round_mode: enum_value(inp, &[0, 1, 2, 3, 4]),
        shuffle_scale: shuffle as i32,
        out_fragment: fo.ptr(),
    };
    let v = [
        MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_0,
        MOEPLUG_QUANTIZE_MX_ARGS_SIZE_V1_1,
    ];
    let ab = ArgBuf::new(inp, &a, &v);
    let before = b.snapshot();
    // SAFETY: as in shuffle_call.
    let st = unsafe { moeplug_quantize_mx(ab.ptr(), ptr::null_mut()) };
    let ok = documented(what, st);
    b.verify(what, &before, ok, &[q.buf, s.buf]);
    fo.after(what, st, &ab, v[1]);
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
    // 1.1: an AITER kernel path (MX weights; its device type is 0 or ROCm), or a bent value.
    if matches!(format, 6 | 7) && inp.chance(3) {
        pa.target = inp.pick(&[1, 2, 3, 4, 5]);
        pa.device_type = enum_value(inp, &[0, 0, 10]);
    } else if inp.chance(24) {
        pa.target = enum_value(inp, &[0, 1, 2, 3, 4, 5]);
    }
    let mut sizes: moeplug_prepare_moe_sizes_out = unsafe { std::mem::zeroed() };
    sizes.struct_size = std::mem::size_of::<moeplug_prepare_moe_sizes_out>() as u32;
    let pv = [
        MOEPLUG_PREPARE_MOE_ARGS_SIZE_V1_0,
        size_of::<moeplug_prepare_moe_args>() as u32,
    ];
    let ab = ArgBuf::new(inp, &pa, &pv);
    let sizes_claimed = ab.claimed;
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
    let mut out_layout = OutStruct::new(inp, RECORD_V10, RECORD);
    let mut pa2 = pa;
    pa2.out_w13 = &o13.t;
    pa2.out_w2 = &o2.t;
    pa2.out_w13_scale = p(&o13s);
    pa2.out_w2_scale = p(&o2s);
    pa2.out_w13_bias = p(&o13b);
    pa2.out_w2_bias = p(&o2b);
    pa2.out_layout = out_layout.ptr();
    let mut o13m = o13;
    maybe_alias(inp, &b, &mut o13m, &[&w13, &w2]);
    pa2.out_w13 = &o13m.t;
    let ab = ArgBuf::new(inp, &pa2, &pv);
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
    out_layout.check("moeplug_prepare_moe", ok, true, RECORD_V10, RECORD);
    if !ok {
        return;
    }
    let mut layout: moeplug_layout = out_layout.get();
    check_record("moeplug_prepare_moe", &layout);
    // The record prepare_moe_sizes announced, when both calls read the same arguments.
    let full = size_of::<moeplug_prepare_moe_args>();
    if sizes_claimed == full && ab.claimed == full && out_layout.size == RECORD {
        assert_eq!(
            record_bytes(&layout),
            record_bytes(&sizes.layout),
            "prepare_moe wrote another record than prepare_moe_sizes announced"
        );
    }
    record_uses(inp, &layout, false);
    if layout.flags & 2 != 0 && inp.below(4) != 0 {
        // An AITER-target record: moeplug's launches refuse it (checked a quarter of the time).
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
) -> bool {
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
    a.activation = enum_value(inp, &[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]);
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
    // 1.1 launch options: the stage-2 act dtype, static fp8 activation scales.
    if inp.chance(8) {
        a.stage2_act_dtype = enum_value(inp, allowed);
    }
    let s1 = inp.chance(10).then(|| act_scale(inp, b));
    let s2 = inp.chance(10).then(|| act_scale(inp, b));
    a.stage1_act_scale = p(&s1);
    a.stage2_act_scale = p(&s2);
    let ab = ArgBuf::new(inp, &a, &FUSED_VERSIONS);
    let before = b.snapshot();
    // SAFETY: every pointer names memory of this frame.
    let cs = unsafe { moeplug_check_fused_moe(1, 0, ab.ptr()) };
    let ok = documented("moeplug_check_fused_moe", cs);
    let check = (cs, last_error());
    b.verify("moeplug_check_fused_moe", &before, ok, &[]);
    resolve_call(inp, &ab, &a, check);
    b.verify("moeplug_resolve_config", &before, false, &[]);
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
    let launched = ok;
    if ok && m * k <= 256 && inp.below(4) == 0 {
        // The same launch again gives the same bytes, whatever the thread count (a run that
        // owns the settings may change it for the repeat).
        let first = b.0[out.buf].body().to_vec();
        let switch = owned_threads().filter(|_| inp.chance(2));
        if switch.is_some() {
            let n = 1 + inp.below(4) as u32;
            SEEN.with(|s| s.borrow_mut().threads = n);
            let s = moeplug_set_num_threads(n);
            assert!(documented("moeplug_set_num_threads", s));
        }
        let ok2 = documented("moeplug_fused_moe", unsafe { moeplug_fused_moe(ab.ptr()) });
        if let Some(t) = switch {
            // Back to the run's count (0: the default).
            SEEN.with(|s| s.borrow_mut().threads = t);
            let s = moeplug_set_num_threads(t);
            assert!(documented("moeplug_set_num_threads", s));
        }
        assert!(ok2, "a launch that succeeded failed the second time");
        assert!(
            b.0[out.buf].body() == &first[..],
            "fused_moe is not deterministic"
        );
    }
    launched
}

const FUSED_VERSIONS: [u32; 2] = [
    MOEPLUG_FUSED_MOE_ARGS_SIZE_V1_0,
    size_of::<moeplug_fused_moe_args>() as u32,
];
const RESOLVED: usize = size_of::<moeplug_resolved_config>();
const AITER_OUT: usize = size_of::<moeplug_aiter_args_out>();

/// A static fp8 activation scale (1.1): fp32 `[1]` or `[]`, finite and > 0 or not.
fn act_scale(inp: &mut Input, b: &mut Bufs) -> Box<Desc> {
    let shape: &[i64] = if inp.chance(3) { &[] } else { &[1] };
    let d = b.tensor(inp, shape, F32, Fill::Zero);
    let v = inp.pick(&[1.0f32, 0.5, 0.0, -1.0, f32::NAN, f32::INFINITY, 1e-30]);
    let sb = &mut b.0[d.buf];
    if sb.len >= 4 {
        let at = GUARD + sb.misalign;
        sb.all_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    d
}

fn record_bytes(l: &moeplug_layout) -> [u8; RECORD] {
    // SAFETY: a plain-data struct of RECORD bytes without padding.
    unsafe { std::mem::transmute_copy(l) }
}

/// A record the library wrote: reserved fields zero, a fingerprint of encoding version 1
/// when the struct had room for it, padded sizes at least the logical ones.
fn check_record(what: &str, r: &moeplug_layout) {
    assert!(
        r.struct_size as usize == RECORD || r.struct_size as usize == RECORD_V10,
        "{what}: record struct_size {}",
        r.struct_size
    );
    assert_eq!(
        (r.reserved0, r.reserved1),
        (0, 0),
        "{what}: record reserved"
    );
    if r.struct_size as usize == RECORD {
        assert_eq!(
            r.prep_fingerprint >> 57,
            1 << 3,
            "{what}: fingerprint {:#x}",
            r.prep_fingerprint
        );
    }
    assert!(r.num_experts > 0, "{what}: record without experts");
    assert!(
        r.hidden_padded >= r.hidden_size
            && r.intermediate_padded >= r.intermediate_size
            && r.hidden_size > 0
            && r.intermediate_size > 0,
        "{what}: record sizes {r:?}"
    );
}

/// `moeplug_resolve_config` on the launch description `ab` (a copy of `a`): on the CPU it is
/// `check_fused_moe`'s check (`check`: that call's status and message), and what it resolves
/// is what the arguments and the record say.
fn resolve_call(
    inp: &mut Input,
    ab: &ArgBuf,
    a: &moeplug_fused_moe_args,
    check: (moeplug_status, String),
) {
    let what = "moeplug_resolve_config";
    let (dev, id) = if inp.chance(4) {
        (
            inp.pick(&[3, 11, 2, 10, 13, 0, 99, -1]),
            inp.pick(&[0, 1, -1]),
        )
    } else {
        (1, 0)
    };
    let mut out = OutStruct::new(inp, RESOLVED, RESOLVED);
    // SAFETY: ab holds STRUCT_BUF bytes, out too; the tensors named live in the caller's frame.
    let s = unsafe { moeplug_resolve_config(dev, id, ab.ptr(), out.ptr()) };
    let ok = documented(what, s);
    out.check(what, ok, true, RESOLVED, RESOLVED);
    if (dev, id) == (1, 0) && out.size >= RESOLVED {
        let m = last_error();
        assert_eq!(
            s, check.0,
            "resolve_config {m:?} but check_fused_moe {:?}",
            check.1
        );
        assert_eq!(
            m.strip_prefix("moeplug_resolve_config: "),
            check.1.strip_prefix("moeplug_check_fused_moe: "),
            "resolve_config and check_fused_moe give other messages"
        );
    }
    if !ok {
        return;
    }
    let r: moeplug_resolved_config = out.get();
    assert_eq!(r.reserved0, 0, "{what}: reserved0");
    assert!(
        (1..=7).contains(&r.act_dtype)
            && (1..=7).contains(&r.act_dtype_stage2)
            && (1..=5).contains(&r.activation),
        "{what}: resolved to DEFAULT or out of range: {r:?}"
    );
    if ab.claimed == size_of::<moeplug_fused_moe_args>() {
        if a.act_dtype != 0 {
            assert_eq!(r.act_dtype, a.act_dtype, "{what}: act_dtype");
        }
        if a.activation != 0 {
            assert_eq!(r.activation, a.activation, "{what}: activation");
        }
        let stage2 = if a.stage2_act_dtype != 0 {
            a.stage2_act_dtype
        } else {
            r.act_dtype
        };
        assert_eq!(r.act_dtype_stage2, stage2, "{what}: stage-2 act dtype");
        // SAFETY: the record lives in the caller's frame.
        let l = unsafe { &*a.layout };
        assert_eq!(r.weight_format, l.weight_format, "{what}: weight_format");
    }
}

/// `moeplug_aiter_args` on `rec` (its struct_size bent): (OK, whether the library saw the
/// fingerprint).
fn aiter_call(inp: &mut Input, rec: &moeplug_layout) -> (bool, bool) {
    let what = "moeplug_aiter_args";
    let ab = ArgBuf::new(inp, rec, &[RECORD_V10 as u32, RECORD as u32]);
    let act = enum_value(inp, &[0, 1, 2, 3, 4, 5]);
    let mut out = OutStruct::new(inp, AITER_OUT, AITER_OUT);
    let before = ab.bytes().to_vec();
    // SAFETY: both structs live in buffers of STRUCT_BUF bytes.
    let s = unsafe { moeplug_aiter_args(ab.ptr(), act, out.ptr()) };
    let ok = documented(what, s);
    assert!(ab.bytes() == &before[..], "{what} wrote its record");
    out.check(what, ok, true, AITER_OUT, AITER_OUT);
    if ok {
        let o: moeplug_aiter_args_out = out.get();
        assert_eq!(o.reserved0, 0, "{what}: reserved0");
        assert!(
            (0..=1).contains(&o.is_shuffled) && (0..=1).contains(&o.scale_swizzled),
            "{what}: {o:?}"
        );
        for t in [
            o.gate_mode,
            o.quant_type,
            o.quant_type_a,
            o.quant_dtype_a,
            o.quant_dtype_a2,
            o.activation,
        ] {
            let end = t.iter().position(|&c| c == 0);
            assert!(
                end.is_some_and(|e| t[..e].iter().all(|&c| (c as u8).is_ascii_graphic())),
                "{what}: a string field {t:?}"
            );
        }
        assert_ne!(o.quant_type[0], 0, "{what}: empty quant_type");
        assert_eq!(
            o.hidden_pad,
            rec.hidden_padded.wrapping_sub(rec.hidden_size),
            "{what}: hidden_pad"
        );
        assert_eq!(
            o.intermediate_pad,
            rec.intermediate_padded.wrapping_sub(rec.intermediate_size),
            "{what}: intermediate_pad"
        );
    }
    (ok, ab.valid && ab.claimed >= RECORD)
}

/// `rec` with one field edited; true when the edit changed a layout field a sealed record
/// always guards (weight_format, gate_mode, weight_layout: docs/abi.md §8).
fn mutate_record(inp: &mut Input, rec: &moeplug_layout) -> (moeplug_layout, bool) {
    let mut m = *rec;
    let guarded = match inp.below(8) {
        0 => {
            m.weight_format = inp.pick(&[1, 2, 3, 4, 5, 6, 7, 99]);
            m.weight_format != rec.weight_format
        }
        1 => {
            m.gate_mode = inp.pick(&[1, 2, 3, -1]);
            m.gate_mode != rec.gate_mode
        }
        2 => {
            m.weight_layout = inp.pick(&[1, 2, 7]);
            m.weight_layout != rec.weight_layout
        }
        3 => {
            m.num_experts = m.num_experts.wrapping_add(1);
            false
        }
        4 => {
            m.hidden_padded = m.hidden_padded.wrapping_add(16);
            false
        }
        5 => {
            m.prep_fingerprint ^= 1 << inp.below(64);
            false
        }
        6 => {
            m.act_dtype = enum_value(inp, &[0, 1, 2, 4, 6, 7]);
            false
        }
        _ => {
            m.flags ^= inp.pick(&[1, 2, 4]);
            false
        }
    };
    (m, guarded && rec.prep_fingerprint != 0)
}

/// What an engine does with a record: aiter_args; check_fused_moe and resolve_config on a
/// tensor-free launch description; the same on the record with one field edited.
fn record_uses(inp: &mut Input, rec: &moeplug_layout, tensor_free: bool) {
    aiter_call(inp, rec);
    if tensor_free || inp.chance(3) {
        let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
        a.struct_size = size_of::<moeplug_fused_moe_args>() as u32;
        a.layout = rec;
        a.activation = enum_value(inp, &[0, 1, 2, 3, 4, 5]);
        a.act_dtype = enum_value(inp, &[0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
        let ab = ArgBuf::new(inp, &a, &FUSED_VERSIONS);
        // SAFETY: the struct lives in ab; the record in the caller's frame.
        let cs = unsafe { moeplug_check_fused_moe(1, 0, ab.ptr()) };
        documented("moeplug_check_fused_moe", cs);
        resolve_call(inp, &ab, &a, (cs, last_error()));
    }
    let (m, guarded) = mutate_record(inp, rec);
    let (ok, saw) = aiter_call(inp, &m);
    assert!(
        !(guarded && saw && ok),
        "aiter_args accepted an edited sealed record {m:?} (was {rec:?})"
    );
    let mut a: moeplug_fused_moe_args = unsafe { std::mem::zeroed() };
    a.struct_size = size_of::<moeplug_fused_moe_args>() as u32;
    a.layout = &m;
    // SAFETY: as above.
    let ok = documented("moeplug_check_fused_moe", unsafe {
        moeplug_check_fused_moe(1, 0, &a)
    });
    assert!(
        !(guarded && ok),
        "check_fused_moe accepted an edited sealed record {m:?} (was {rec:?})"
    );
}

/// A fragment an engine declares itself: often a complete record's worth, then single
/// fields set, valid or not.
fn declared(inp: &mut Input) -> moeplug_layout_fragment {
    let mut f: moeplug_layout_fragment = unsafe { std::mem::zeroed() };
    f.struct_size = FRAG as u32;
    if inp.chance(3) {
        let mx = inp.chance(3);
        f.weight_format = if mx {
            inp.pick(&[6, 7])
        } else {
            inp.pick(&[1, 2, 3, 4, 5])
        };
        f.gate_mode = 1;
        f.weight_layout = inp.pick(&[2, 2, 1]);
        if mx {
            f.scale_layout = inp.pick(&[2, 1, 3]);
        }
        f.num_experts = 1 + inp.below(4) as i64;
        let (h, i) = (
            inp.pick(&[32i64, 64, 128, 256]),
            inp.pick(&[32i64, 64, 128, 256]),
        );
        (f.hidden_size, f.hidden_padded) = (h, h);
        (f.intermediate_size, f.intermediate_padded) = (i, i);
    }
    if inp.chance(3) {
        f.weight_format = enum_value(inp, &[1, 2, 3, 4, 5, 6, 7]);
    }
    if inp.chance(4) {
        f.gate_mode = enum_value(inp, &[1, 2, 3]);
    }
    if inp.chance(4) {
        f.weight_layout = enum_value(inp, &[1, 2]);
    }
    if inp.chance(4) {
        f.scale_layout = enum_value(inp, &[1, 2, 3, 4]);
    }
    if inp.chance(3) {
        f.act_dtype = enum_value(inp, &[1, 2, 3, 4, 5, 6, 7]);
    }
    if inp.chance(4) {
        f.num_experts = inp.pick(&[1, 2, 4, 0, -1, 1 << 31, 1 << 40]);
    }
    let size = |inp: &mut Input| inp.pick(&[16i64, 32, 64, 256, 0, -1, 1 << 40, i64::MAX]);
    if inp.chance(4) {
        let s = size(inp);
        f.hidden_size = s;
        f.hidden_padded = inp.pick(&[s, s.wrapping_add(32), s.wrapping_sub(1), 0]);
    }
    if inp.chance(4) {
        let s = size(inp);
        f.intermediate_size = s;
        f.intermediate_padded = inp.pick(&[s, s.wrapping_add(32), s.wrapping_sub(1), 0]);
    }
    if inp.chance(3) {
        f.has_bias = inp.pick(&[1, 2, 0, 3, -1]);
    }
    if inp.chance(24) {
        f.reserved0 = inp.pick(&[1, u32::MAX]);
    }
    f
}

/// One field of a fragment bent.
fn mutate_fragment(inp: &mut Input, f: &mut moeplug_layout_fragment) {
    let bend = |inp: &mut Input, v: i64| {
        inp.pick(&[
            v.wrapping_add(32),
            v.wrapping_sub(1),
            v.wrapping_mul(2),
            0,
            -1,
            1 << 40,
        ])
    };
    match inp.below(10) {
        0 => f.weight_format = enum_value(inp, &[1, 2, 3, 4, 5, 6, 7]),
        1 => f.gate_mode = enum_value(inp, &[1, 2, 3]),
        2 => f.weight_layout = enum_value(inp, &[1, 2]),
        3 => f.scale_layout = enum_value(inp, &[1, 2, 3, 4]),
        4 => f.num_experts = bend(inp, f.num_experts),
        5 => f.hidden_size = bend(inp, f.hidden_size),
        6 => f.intermediate_padded = bend(inp, f.intermediate_padded),
        7 => f.has_bias = inp.pick(&[0, 1, 2, 3]),
        8 => f.act_dtype = enum_value(inp, &[0, 1, 2, 4, 6]),
        _ => f.reserved0 = 1,
    }
}

/// The one non-zero value the fragments set for a field (0: none): two different ones
/// cannot assemble.
fn merged(vals: impl Iterator<Item = i64>, field: &str) -> i64 {
    let mut one = 0;
    for v in vals.filter(|&v| v != 0) {
        assert!(
            one == 0 || one == v,
            "layout_from_fragments assembled {field} from {one} and {v}"
        );
        one = v;
    }
    one
}

/// `moeplug_layout_from_fragments` over `frs`, each in its own buffer with a bent
/// struct_size, through a pointer array that may hold a NULL or a duplicate, with a bent
/// count, into an output record with a bent struct_size. The record, on success.
fn layout_from(inp: &mut Input, frs: &[moeplug_layout_fragment]) -> Option<moeplug_layout> {
    let what = "moeplug_layout_from_fragments";
    let bufs: Vec<ArgBuf> = frs
        .iter()
        .map(|f| ArgBuf::new(inp, f, &[FRAG as u32]))
        .collect();
    let n = bufs.len();
    let mut ptrs: Vec<*const moeplug_layout_fragment> = bufs.iter().map(|b| b.ptr()).collect();
    if n > 0 && inp.chance(24) {
        ptrs[inp.below(n)] = ptr::null();
    }
    if n > 1 && inp.chance(16) {
        let (i, j) = (inp.below(n), inp.below(n));
        ptrs[i] = ptrs[j];
    }
    // Room for every count the library may read (it refuses more than 256 unread).
    ptrs.resize(257, ptr::null());
    let num = if inp.chance(16) {
        inp.pick(&[0, 257, n.saturating_sub(1), usize::MAX, 256])
    } else {
        n
    };
    let arr = if inp.chance(32) {
        ptr::null()
    } else {
        ptrs.as_ptr()
    };
    let before: Vec<Vec<u8>> = bufs.iter().map(|b| b.bytes().to_vec()).collect();
    let mut out = OutStruct::new(inp, RECORD_V10, RECORD);
    // SAFETY: arr holds 257 pointers, each NULL or to a fragment buffer of STRUCT_BUF bytes.
    let s = unsafe { moeplug_layout_from_fragments(arr, num, out.ptr()) };
    let ok = documented(what, s);
    for (b, old) in bufs.iter().zip(&before) {
        assert!(b.bytes() == &old[..], "{what} wrote a fragment");
    }
    out.check(what, ok, true, RECORD_V10, RECORD);
    if !ok {
        return None;
    }
    assert!(
        (1..=256).contains(&num) && !arr.is_null(),
        "{what}: OK with {num} fragments"
    );
    // SAFETY: every pointer the library read is non-NULL (it succeeded) and names a buffer.
    let read: Vec<moeplug_layout_fragment> = ptrs[..num]
        .iter()
        .map(|&p| unsafe { ptr::read_unaligned(p) })
        .collect();
    let rec: moeplug_layout = out.get();
    check_record(what, &rec);
    let m = |f: fn(&moeplug_layout_fragment) -> i64, name| merged(read.iter().map(f), name);
    let wf = m(|f| f.weight_format as i64, "weight_format");
    assert_eq!(rec.weight_format as i64, wf, "{what}: weight_format");
    assert_eq!(
        rec.gate_mode as i64,
        m(|f| f.gate_mode as i64, "gate_mode"),
        "{what}: gate_mode"
    );
    assert_eq!(
        rec.weight_layout as i64,
        m(|f| f.weight_layout as i64, "weight_layout"),
        "{what}: weight_layout"
    );
    assert_eq!(
        rec.scale_layout as i64,
        m(|f| f.scale_layout as i64, "scale_layout"),
        "{what}: scale_layout"
    );
    let act = m(|f| f.act_dtype as i64, "act_dtype");
    if rec.struct_size as usize == RECORD {
        assert_eq!(rec.act_dtype as i64, act, "{what}: act_dtype");
    }
    assert_eq!(
        rec.num_experts as i64,
        m(|f| f.num_experts, "num_experts"),
        "{what}: num_experts"
    );
    let sizes = [
        (rec.hidden_size, m(|f| f.hidden_size, "hidden_size")),
        (
            rec.intermediate_size,
            m(|f| f.intermediate_size, "intermediate_size"),
        ),
        (rec.hidden_padded, m(|f| f.hidden_padded, "hidden_padded")),
        (
            rec.intermediate_padded,
            m(|f| f.intermediate_padded, "intermediate_padded"),
        ),
    ];
    for (got, want) in sizes {
        assert_eq!(got, want, "{what}: a size ({sizes:?})");
    }
    let bias = m(|f| f.has_bias as i64, "has_bias");
    assert_eq!(rec.flags, (bias == 2) as u32, "{what}: flags");
    Some(rec)
}

/// Fragments of this run (and declared, and mutated ones) assembled; the record used.
fn assemble(inp: &mut Input) {
    let pool = FRAGS.with(|f| f.borrow().clone());
    let n = 1 + inp.below(5);
    let mut frs = Vec::with_capacity(n);
    for _ in 0..n {
        if !pool.is_empty() && inp.below(3) != 0 {
            frs.push(pool[inp.below(pool.len())]);
        } else {
            frs.push(declared(inp));
        }
    }
    if inp.chance(4) {
        let k = inp.below(n);
        mutate_fragment(inp, &mut frs[k]);
    }
    if let Some(rec) = layout_from(inp, &frs) {
        record_uses(inp, &rec, true);
    }
}

/// Weights prepared with the primitives, as an engine without prepare_moe does: pad w13
/// (gate_up) and w2, shuffle both (16, 16), assemble the four fragments (with one declared,
/// or one mutated, at times) and launch fused_moe on the result.
fn frag_chain(inp: &mut Input) {
    let (dt, format) = inp.pick(&[(BF16, 1), (F16, 2)]);
    let e = 1 + inp.below(3) as i64;
    let h = inp.pick(&[16i64, 32, 48, 64, 96]);
    let i = inp.pick(&[16i64, 32, 48, 64]);
    let al = inp.pick(&[32i64, 64]);
    let (hp, ip) = (cdiv(h, al) * al, cdiv(i, al) * al);
    let mut b = Bufs(Vec::new());
    let w13 = b.tensor(inp, &[e, 2 * i, h], dt, Fill::Noise);
    let w2 = b.tensor(inp, &[e, h, i], dt, Fill::Noise);
    let p13 = b.tensor(inp, &[e, 2 * ip, hp], dt, Fill::Pattern);
    let p2 = b.tensor(inp, &[e, hp, ip], dt, Fill::Pattern);
    let mut frs = Vec::new();
    frs.extend(pad_call(inp, &mut b, &w13, &p13, true));
    frs.extend(pad_call(inp, &mut b, &w2, &p2, false));
    let q13 = b.view(inp, p13.buf, &[e, 2 * ip, hp], dt);
    let q2 = b.view(inp, p2.buf, &[e, hp, ip], dt);
    let s13 = b.tensor(inp, &[e, 2 * ip, hp], dt, Fill::Pattern);
    let s2 = b.tensor(inp, &[e, hp, ip], dt, Fill::Pattern);
    for (src, dst) in [(&q13, &s13), (&q2, &s2)] {
        let tiles = [
            enum_value(inp, &[16, 16, 0, 32]),
            enum_value(inp, &[16, 16, 0, 32]),
        ];
        frs.extend(shuffle_call(inp, &mut b, src, dst, tiles, [false; 3], 0));
    }
    if inp.chance(3) {
        // What no primitive establishes: biases (absent here), the activation dtype.
        let mut f: moeplug_layout_fragment = unsafe { std::mem::zeroed() };
        f.struct_size = FRAG as u32;
        f.has_bias = inp.pick(&[1, 1, 2]);
        f.act_dtype = inp.pick(&[0, format, 1, 4]);
        frs.push(f);
    }
    if !frs.is_empty() && inp.chance(6) {
        let k = inp.below(frs.len());
        mutate_fragment(inp, &mut frs[k]);
    }
    if frs.len() > 1 && inp.chance(4) {
        frs.reverse();
    }
    let Some(mut rec) = layout_from(inp, &frs) else {
        return;
    };
    record_uses(inp, &rec, false);
    let ok = fused(
        inp,
        &mut b,
        &mut rec,
        format,
        [&s13, &s2],
        [&None, &None],
        [&None, &None],
        dt,
    );
    // Not an export: how often weights prepared by the primitives launched.
    count("(frag_chain: assembled record launched)", ok);
}
