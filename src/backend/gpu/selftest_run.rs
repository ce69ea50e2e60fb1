//! Runs the self-test before first use ([`super::selftest`] decides) on a device being opened:
//! one tiny fused_moe per kernel family the device may select, forced to that family, against
//! the CPU backend, and one device prep (the AITER weight shuffle) against the host bytes.
//! Tiny shapes on device memory it allocates and frees; the kernels it compiles are the
//! backend's (same cache, same per-device table), so the configuration it uses (bf16 weights in
//! the AITER layout, SiLU) is ready for the first real launch.
//!
//! `MOEPLUG_SELFTEST=0` skips it (every family is selectable, unproven).
//! `MOEPLUG_SELFTEST_BREAK=<family>|prep` is for tests only: it corrupts that family's result
//! after the device ran it, before the comparison, to show the refusal path on a good GPU.

use std::time::Instant;

use half::bf16;

use super::heuristics::{selectable, sm_version};
use super::selftest::{decide, refusal, Decision, FamilyResult, Outcome, Role};
use super::spec::{Family, FamilySet, KernelSpec};
use super::{launch, GpuBackend, Vendor};
use crate::error::{Result, Status};
use crate::layout::Layout;
use crate::moe::check::check_launch;
use crate::moe::{MoeConfig, MoeLaunch};
use crate::prep::shuffle::{self, ShuffleWeightParams};
use crate::prep::steps::{run_host, Step};
use crate::runtime::log::{self, Level};
use crate::tensor::{DeviceKind, ElemType, Tensor};
use crate::types::{ActDtype, Activation, GateMode, WeightFormat, WeightLayout};

/// `MOEPLUG_SELFTEST=0` skips the self-test.
pub const SKIP_ENV: &str = "MOEPLUG_SELFTEST";
/// Test only: `MOEPLUG_SELFTEST_BREAK=stream` (a family name, or `prep`) corrupts that result.
pub const BREAK_ENV: &str = "MOEPLUG_SELFTEST_BREAK";
/// The name of the prep row of the results.
pub const PREP: &str = "prep";

/// What a device's self-test concluded, kept by its backend.
#[derive(Debug, Clone, PartialEq)]
pub struct SelfTest {
    /// The fused_moe families the heuristics may pick on this device.
    pub accepted: FamilySet,
    /// Why device prep is refused (None: offered).
    pub prep_refused: Option<String>,
    /// "fp32 ok; tile32 ok; stream refused (...); prep ok", or why nothing ran.
    pub summary: String,
    /// Wall time of the whole self-test (compiles or cache reads included).
    pub seconds: f64,
}

impl SelfTest {
    /// Before the self-test has run (and with `MOEPLUG_SELFTEST=0`): everything offered.
    pub fn unproven(summary: &str) -> SelfTest {
        SelfTest {
            accepted: FamilySet::all(),
            prep_refused: None,
            summary: summary.to_string(),
            seconds: 0.0,
        }
    }

    /// The backend's view of a [`Decision`].
    pub fn from_decision(d: &Decision, seconds: f64) -> SelfTest {
        SelfTest {
            accepted: Family::ALL
                .into_iter()
                .filter(|f| d.selectable(f.name()))
                .collect(),
            prep_refused: d
                .refused
                .iter()
                .find(|(f, _)| *f == PREP)
                .map(|(_, why)| why.clone()),
            summary: d.summary().trim_start_matches("self-test: ").to_string(),
            seconds,
        }
    }

    /// One line for `moeplug info`.
    pub fn line(&self) -> String {
        format!(
            "self-test before first use: {:.3} s; {}",
            self.seconds, self.summary
        )
    }
}

/// The fused_moe families a device may select: those [`selectable`] for the self-test's
/// configuration on this arch (HIP: [`super::heuristics::hip_families`]), and every family on
/// their fallback chains (what runs a launch when the first pick was refused).
pub fn families_to_test(vendor: Vendor, arch: &str) -> Vec<Family> {
    let spec = |f: Family| KernelSpec {
        family: f,
        ..problem_spec()
    };
    let mut set = FamilySet::NONE;
    for f in Family::ALL {
        let may = match vendor {
            Vendor::Hip => super::heuristics::hip_families(arch).contains(&f),
            Vendor::Cuda => sm_version(arch).is_some_and(|sm| selectable(sm, &spec(f))),
        };
        let mut at = may.then_some(f);
        while let Some(g) = at {
            set.insert(g);
            at = g.fallback();
        }
    }
    Family::ALL
        .into_iter()
        .filter(|f| set.contains(*f))
        .collect()
}

/// The kernel configuration each tested family runs (what the self-test compiles on `arch`;
/// `tests/kernel_compile.rs` compiles the same list).
pub fn tested_specs(vendor: Vendor, arch: &str) -> Vec<KernelSpec> {
    let mut specs = Vec::new();
    for family in families_to_test(vendor, arch) {
        let spec = KernelSpec {
            family,
            // as a launch gets it
            fused_combine: super::heuristics::fused_combine(arch, family),
            ..problem_spec()
        };
        // The wgmma family runs its warp-specialised TMA kernel where launches would, on both
        // tile heights launches take (64 rows at few pairs per expert, 128 at many).
        let ws = |rows: u32| KernelSpec {
            wgmma_tma: true,
            wgmma_ws: true,
            wgmma_bm: rows,
            ..spec.clone()
        };
        let ws_ok = |s: &KernelSpec| {
            family == Family::Wgmma && sm_version(arch).is_some_and(|sm| selectable(sm, s))
        };
        let shapes: Vec<KernelSpec> = [ws(128), ws(64)].into_iter().filter(ws_ok).collect();
        if shapes.is_empty() {
            specs.push(spec);
        } else {
            specs.extend(shapes);
        }
    }
    specs
}

/// Run the self-test on `dev` (its context is retained, the backend not yet shared) and
/// decide; BACKEND_UNAVAILABLE if no fused_moe family passed.
pub fn run(dev: &GpuBackend) -> Result<SelfTest> {
    let label = dev.label();
    if std::env::var(SKIP_ENV).is_ok_and(|v| v.trim() == "0") {
        let t = SelfTest::unproven(&format!("skipped ({SKIP_ENV}=0): no family proven"));
        log::emit(Level::Warn, || format!("{label}: {}", t.line()));
        return Ok(t);
    }
    let broken = std::env::var(BREAK_ENV).ok().map(|v| v.trim().to_string());
    let is_broken = |name: &str| broken.as_deref() == Some(name);
    let start = Instant::now();
    let problem = Problem::new()?;
    let specs = tested_specs(dev.api.vendor, &dev.arch);
    warm_cache(dev, &specs);
    let mut results = Vec::new();
    for spec in specs {
        let name = spec.family.name();
        let result = FamilyResult {
            family: name,
            role: Role::FusedMoe,
            outcome: outcome_of(run_fused(dev, &problem, spec, is_broken(name))),
        };
        // A family tested on several shapes passes only if each does: its first failure stands.
        match results
            .iter_mut()
            .find(|r: &&mut FamilyResult| r.family == name)
        {
            Some(first) if refusal(first).is_none() => *first = result,
            Some(_) => {}
            None => results.push(result),
        }
    }
    results.push(FamilyResult {
        family: PREP,
        role: Role::Prep,
        outcome: outcome_of(run_prep(dev, &problem, is_broken(PREP))),
    });
    let seconds = start.elapsed().as_secs_f64();
    let decision = decide(&label, &results).inspect_err(|e| {
        log::emit(Level::Error, || e.message.clone());
    })?;
    let mut t = SelfTest::from_decision(&decision, seconds);
    if let Some(b) = broken
        .as_deref()
        .filter(|b| results.iter().any(|r| r.family == *b))
    {
        t.summary.push_str(&format!(
            " [{BREAK_ENV}={b}: a test switch corrupted that result]"
        ));
    }
    let level = if decision.refused.is_empty() {
        Level::Info
    } else {
        Level::Warn
    };
    log::emit(level, || format!("{label}: {}", t.line()));
    Ok(t)
}

/// Compile the tested configurations side by side into the disk cache, so that a cold first
/// open waits about one compile rather than one per family. Errors are not lost: the family's
/// own run compiles again and reports them.
fn warm_cache(dev: &GpuBackend, specs: &[KernelSpec]) {
    if super::cache::cache_dir().is_none() || specs.len() < 2 {
        return;
    }
    std::thread::scope(|s| {
        let jobs = specs.iter().map(|spec| {
            move || {
                if let Ok(c) =
                    super::cache::compile(dev.api, &spec.compile_arch(&dev.arch), &spec.defines())
                {
                    super::record_compile(&c);
                }
            }
        });
        crate::runtime::threads::run_jobs(s, jobs);
    });
}

/// A failed step of a family's run as the outcome the decision reads.
fn outcome_of(r: Result<Outcome>) -> Outcome {
    match r {
        Ok(o) => o,
        Err(e) if e.status == Status::CompileError => Outcome::CompileFailed(shorten(&e.message)),
        Err(e) => Outcome::DeviceFailed(shorten(&e.message)),
    }
}

/// The first lines of a compiler log or driver message, enough to say why.
fn shorten(s: &str) -> String {
    const MAX: usize = 300;
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", &one_line[..at]),
        None => one_line,
    }
}

// The problem: big enough for two blocks of every family's stage 2 and several sorted tiles,
// small enough to cost microseconds.
const E: usize = 4;
const H: usize = 256;
const I: usize = 128;
const M: usize = 7;
const TOPK: usize = 2;

/// The configuration every family is tested with (bf16, AITER 16x16, separated, SiLU).
fn problem_spec() -> KernelSpec {
    super::default_spec()
}

/// Host inputs in the launch's layout, the raw w13 the device prep shuffles, and the CPU
/// backend's output.
pub(crate) struct Problem {
    config: MoeConfig,
    x: Vec<bf16>,
    w13_raw: Vec<bf16>,
    w13: Vec<bf16>,
    w2: Vec<bf16>,
    topk_weights: Vec<f32>,
    topk_ids: Vec<i32>,
    shuffle_w13: Step,
    reference: Vec<bf16>,
}

/// Deterministic values in [-scale, scale) (a 64-bit LCG: the same problem on every device).
fn values(seed: u64, n: usize, scale: f32) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            bf16::from_f32((2.0 * u - 1.0) * scale)
        })
        .collect()
}

/// The bytes of a slice of plain numbers (bf16, f32, i32).
fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a plain number type without padding; the view lives as long as `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn tensor(
    name: &'static str,
    ptr: u64,
    at: (DeviceKind, i32),
    elem: ElemType,
    shape: &[usize],
) -> Tensor {
    Tensor {
        name,
        ptr: ptr as *mut u8,
        device: at.0,
        device_id: at.1,
        elem,
        shape: shape.to_vec(),
    }
}

/// Where each tensor of a launch is (host or device addresses).
#[derive(Clone, Copy)]
pub(crate) struct Addresses {
    x: u64,
    w13: u64,
    w2: u64,
    topk_weights: u64,
    topk_ids: u64,
    output: u64,
    workspace: Option<(u64, usize)>,
}

impl Problem {
    pub(crate) fn new() -> Result<Problem> {
        let layout = Layout {
            weight_format: WeightFormat::Bf16,
            gate_mode: GateMode::Separated,
            weight_layout: WeightLayout::Aiter16x16,
            scale_layout: None,
            num_experts: E,
            hidden_size: H,
            intermediate_size: I,
            hidden_padded: H,
            intermediate_padded: I,
            has_bias: false,
        };
        let config = MoeConfig {
            layout,
            activation: Activation::Silu,
            alpha: Activation::Silu.resolve_alpha(0.0),
            limit: None,
            act_dtype: ActDtype::Bf16,
            stage2_act_dtype: ActDtype::Bf16,
            prequantized_input: false,
            static_act_scale: [false; 2],
            router_weight_on_input: false,
            has_expert_mask: false,
            has_num_local_tokens: false,
        };
        // Sums of H (I) products of these stay O(1): bf16 keeps every output meaningful.
        let x = values(1, M * H, 1.0);
        let w13_raw = values(2, E * 2 * I * H, 0.1);
        let w2_raw = values(3, E * H * I, 0.1);
        let shuffle = |name: &str, shape: &[usize], raw: &[bf16]| -> Result<(Vec<bf16>, Step)> {
            let params = ShuffleWeightParams {
                layout_n: 16,
                layout_k: 16,
                use_int4: false,
                is_guinterleave: false,
                gate_up: false,
                pad_k_to: 0,
            };
            let plan = shuffle::plan_shuffle_weight(name, shape, 2, &params)?;
            let step = shuffle::step(&plan);
            let mut out = vec![bf16::ZERO; step.dst_bytes / 2];
            // SAFETY: `out` is plain bf16 storage of exactly dst_bytes bytes.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, step.dst_bytes)
            };
            run_host(&step, bytes_of(raw), dst);
            Ok((out, step))
        };
        let (w13, shuffle_w13) = shuffle("w13", &[E, 2 * I, H], &w13_raw)?;
        let (w2, _) = shuffle("w2", &[E, H, I], &w2_raw)?;
        // Distinct experts per token, every expert used, weights not summing to one.
        let topk_ids: Vec<i32> = (0..M * TOPK)
            .map(|p| ((p / TOPK + (p % TOPK) * 3) % E) as i32)
            .collect();
        let topk_weights: Vec<f32> = (0..M * TOPK)
            .map(|p| 0.25 + 0.5 * (p % 3) as f32 / 2.0)
            .collect();
        let mut p = Problem {
            config,
            x,
            w13_raw,
            w13,
            w2,
            topk_weights,
            topk_ids,
            shuffle_w13,
            reference: vec![bf16::ZERO; M * H],
        };
        let mut reference = vec![bf16::NAN; M * H];
        let host = Addresses {
            x: p.x.as_ptr() as u64,
            w13: p.w13.as_ptr() as u64,
            w2: p.w2.as_ptr() as u64,
            topk_weights: p.topk_weights.as_ptr() as u64,
            topk_ids: p.topk_ids.as_ptr() as u64,
            output: reference.as_mut_ptr() as u64,
            workspace: None,
        };
        crate::backend::cpu::backend().fused_moe(&p.launch(host, (DeviceKind::Cpu, 0)))?;
        p.reference = reference;
        Ok(p)
    }

    /// The launch over tensors at `a` on `at`.
    pub(crate) fn launch(&self, a: Addresses, at: (DeviceKind, i32)) -> MoeLaunch {
        let t = |name, ptr, elem, shape: &[usize]| tensor(name, ptr, at, elem, shape);
        MoeLaunch {
            config: self.config,
            hidden_states: t("hidden_states", a.x, ElemType::Bf16, &[M, H]),
            hidden_scale: None,
            w13: t("w13", a.w13, ElemType::Bf16, &[E, 2 * I, H]),
            w13_scale: None,
            w13_bias: None,
            w2: t("w2", a.w2, ElemType::Bf16, &[E, H, I]),
            w2_scale: None,
            w2_bias: None,
            topk_weights: t("topk_weights", a.topk_weights, ElemType::F32, &[M, TOPK]),
            topk_ids: t("topk_ids", a.topk_ids, ElemType::I32, &[M, TOPK]),
            expert_mask: None,
            num_local_tokens: None,
            output: t("output", a.output, ElemType::Bf16, &[M, H]),
            workspace: a
                .workspace
                .map(|(ptr, n)| t("workspace", ptr, ElemType::U8, &[n])),
            stream: 0,
            stage1_act_scale: None,
            stage2_act_scale: None,
        }
    }
}

/// Relative L2 of `got` against `want` (as f64) and how many of `got` are not finite where
/// `want` is.
pub fn compare(got: &[bf16], want: &[bf16]) -> Outcome {
    let (mut err, mut norm, mut non_finite) = (0f64, 0f64, 0usize);
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (g.to_f64(), w.to_f64());
        if !g.is_finite() && w.is_finite() {
            non_finite += 1;
            continue;
        }
        err += (g - w) * (g - w);
        norm += w * w;
    }
    let rel_l2 = if got.len() != want.len() {
        f64::NAN
    } else {
        (err / norm).sqrt()
    };
    Outcome::Compared { rel_l2, non_finite }
}

/// Device memory freed on drop (the device's context is current for the self-test's scope).
struct DeviceBuffer<'a> {
    dev: &'a GpuBackend,
    ptr: u64,
    bytes: usize,
}

impl<'a> DeviceBuffer<'a> {
    fn new(dev: &'a GpuBackend, bytes: usize) -> Result<DeviceBuffer<'a>> {
        let mut ptr = 0u64;
        // SAFETY: valid out-pointer; the context is current.
        dev.api.check(
            unsafe { (dev.api.cuMemAlloc)(&mut ptr, bytes.max(1)) },
            "cuMemAlloc (self-test)",
        )?;
        Ok(DeviceBuffer { dev, ptr, bytes })
    }

    fn upload(dev: &'a GpuBackend, host: &[u8]) -> Result<DeviceBuffer<'a>> {
        let b = DeviceBuffer::new(dev, host.len())?;
        // SAFETY: `host` has `b.bytes` readable bytes; the allocation is as large.
        dev.api.check(
            unsafe {
                (dev.api.cuMemcpyHtoD)(b.ptr, host.as_ptr() as *const std::ffi::c_void, b.bytes)
            },
            "cuMemcpyHtoD (self-test)",
        )?;
        Ok(b)
    }

    fn download(&self, host: &mut [u8]) -> Result<()> {
        let n = host.len().min(self.bytes);
        // SAFETY: `host` has at least `n` writable bytes, the allocation as many.
        self.dev.api.check(
            unsafe {
                (self.dev.api.cuMemcpyDtoH)(host.as_mut_ptr() as *mut std::ffi::c_void, self.ptr, n)
            },
            "cuMemcpyDtoH (self-test)",
        )
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context; freed once.
        unsafe { (self.dev.api.cuMemFree)(self.ptr) };
    }
}

fn synchronize(dev: &GpuBackend, what: &str) -> Result<()> {
    // SAFETY: no arguments; the context is current.
    dev.api.check(
        unsafe { (dev.api.cuCtxSynchronize)() },
        &format!("synchronize after {what} (self-test)"),
    )
}

/// One fused_moe on the device forced to `family`, compared with the CPU backend.
fn run_fused(dev: &GpuBackend, p: &Problem, spec: KernelSpec, broken: bool) -> Result<Outcome> {
    let family = spec.family;
    let _ctx = dev.enter()?;
    let x = DeviceBuffer::upload(dev, bytes_of(&p.x))?;
    let w13 = DeviceBuffer::upload(dev, bytes_of(&p.w13))?;
    let w2 = DeviceBuffer::upload(dev, bytes_of(&p.w2))?;
    let tw = DeviceBuffer::upload(dev, bytes_of(&p.topk_weights))?;
    let ids = DeviceBuffer::upload(dev, bytes_of(&p.topk_ids))?;
    // NaN everywhere: an output the kernels never write cannot match.
    let poison = vec![bf16::NAN; M * H];
    let out = DeviceBuffer::upload(dev, bytes_of(&poison))?;
    let at = (dev.api.vendor.device_kind(), dev.device_id);
    let mut a = Addresses {
        x: x.ptr,
        w13: w13.ptr,
        w2: w2.ptr,
        topk_weights: tw.ptr,
        topk_ids: ids.ptr,
        output: out.ptr,
        workspace: None,
    };
    let l = p.launch(a, at);
    let shape = check_launch(&l)?;
    let bytes = launch::plan(&l, &shape, spec.clone())?.workspace_bytes;
    let ws = DeviceBuffer::new(dev, bytes)?;
    a.workspace = Some((ws.ptr, bytes));
    let l = p.launch(a, at);
    let plan = launch::plan(&l, &shape, spec)?;
    dev.run_plan(&l, &plan)?;
    synchronize(dev, &format!("fused_moe {}", family.name()))?;
    let mut got = vec![bf16::ZERO; M * H];
    // SAFETY: plain bf16 storage of M*H elements.
    let got_bytes =
        unsafe { std::slice::from_raw_parts_mut(got.as_mut_ptr() as *mut u8, M * H * 2) };
    out.download(got_bytes)?;
    if broken {
        got.iter_mut().for_each(|v| *v = -*v);
    }
    Ok(compare(&got, &p.reference))
}

/// The AITER shuffle of w13 on the device, compared byte for byte with the host's.
fn run_prep(dev: &GpuBackend, p: &Problem, broken: bool) -> Result<Outcome> {
    let _ctx = dev.enter()?;
    let src = DeviceBuffer::upload(dev, bytes_of(&p.w13_raw))?;
    let want = bytes_of(&p.w13);
    let dst = DeviceBuffer::upload(dev, &vec![0xA5u8; want.len()])?;
    super::prep::run_steps_on(
        dev,
        std::ptr::null_mut(),
        &[(p.shuffle_w13, src.ptr, dst.ptr)],
    )?;
    synchronize(dev, "prep")?;
    let mut got = vec![0u8; want.len()];
    dst.download(&mut got)?;
    if broken {
        got[0] ^= 0xFF;
    }
    let mismatched = got.iter().zip(want).filter(|(g, w)| g != w).count();
    Ok(Outcome::Bytes {
        mismatched,
        total: want.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::heuristics::choose_accepted;
    use crate::error::Error;

    #[test]
    fn every_family_a_device_may_select_is_tested_with_its_fallbacks() {
        use Family::*;
        assert_eq!(
            families_to_test(Vendor::Cuda, "sm_90"),
            [Fp32, Tile32, Stream, Wgmma]
        );
        assert_eq!(
            families_to_test(Vendor::Cuda, "sm_80"),
            [Fp32, Tile32, Stream]
        );
        assert_eq!(families_to_test(Vendor::Cuda, "sm_75"), [Fp32]);
        assert_eq!(families_to_test(Vendor::Hip, "gfx942"), [Fp32, Mfma]);
        assert_eq!(families_to_test(Vendor::Hip, "gfx950"), [Fp32, Mfma]);
        assert_eq!(families_to_test(Vendor::Hip, "gfx90a"), [Fp32]);
    }

    fn fused(family: &'static str, rel_l2: f64) -> FamilyResult {
        FamilyResult {
            family,
            role: Role::FusedMoe,
            outcome: Outcome::Compared {
                rel_l2,
                non_finite: 0,
            },
        }
    }
    fn prep(mismatched: usize) -> FamilyResult {
        FamilyResult {
            family: PREP,
            role: Role::Prep,
            outcome: Outcome::Bytes {
                mismatched,
                total: 1024,
            },
        }
    }

    #[test]
    fn the_backend_keeps_exactly_what_the_decision_accepted() {
        let d = decide(
            "cuda:0 (sm_90)",
            &[
                fused("fp32", 1e-3),
                fused("tile32", 2e-3),
                fused("stream", 2.0),
                prep(0),
            ],
        )
        .unwrap();
        let t = SelfTest::from_decision(&d, 0.25);
        let want: FamilySet = [Family::Fp32, Family::Tile32].into_iter().collect();
        assert_eq!(t.accepted, want);
        assert_eq!(t.prep_refused, None);
        assert_eq!(
            t.line(),
            "self-test before first use: 0.250 s; fp32 ok; tile32 ok; prep ok; \
             stream refused (rel L2 2.000e0 vs the CPU backend > 1e-2)"
        );

        let d = decide("cuda:0 (sm_90)", &[fused("fp32", 1e-3), prep(3)]).unwrap();
        let t = SelfTest::from_decision(&d, 0.0);
        assert_eq!(
            t.prep_refused.as_deref(),
            Some("3 of 1024 bytes differ from the host prep")
        );
        assert_eq!(t.accepted, [Family::Fp32].into_iter().collect());

        let skipped = SelfTest::unproven("skipped");
        assert_eq!(skipped.accepted, FamilySet::all());
        assert_eq!(skipped.prep_refused, None);
    }

    #[test]
    fn outcomes_of_failed_runs_name_the_failure() {
        let compile = Error::new(Status::CompileError, "nvrtcCompileProgram failed:\n  error");
        assert_eq!(
            outcome_of(Err(compile)),
            Outcome::CompileFailed("nvrtcCompileProgram failed: error".into())
        );
        let device = Error::device("cuLaunchKernel(moe_stage1) failed: CUDA_ERROR_X (1)");
        assert_eq!(
            outcome_of(Err(device)),
            Outcome::DeviceFailed("cuLaunchKernel(moe_stage1) failed: CUDA_ERROR_X (1)".into())
        );
        let long = "x".repeat(1000);
        assert_eq!(shorten(&long).len(), 303);
    }

    #[test]
    fn comparison_counts_non_finite_and_measures_relative_l2() {
        let want: Vec<bf16> = [1.0f32, -2.0, 0.5, 4.0].map(bf16::from_f32).to_vec();
        assert_eq!(
            compare(&want, &want),
            Outcome::Compared {
                rel_l2: 0.0,
                non_finite: 0
            }
        );
        let negated: Vec<bf16> = want.iter().map(|v| -*v).collect();
        assert_eq!(
            compare(&negated, &want),
            Outcome::Compared {
                rel_l2: 2.0,
                non_finite: 0
            }
        );
        let mut poisoned = want.clone();
        poisoned[2] = bf16::NAN;
        let Outcome::Compared { non_finite, .. } = compare(&poisoned, &want) else {
            panic!()
        };
        assert_eq!(non_finite, 1);
    }

    impl Addresses {
        fn from_launch(l: &MoeLaunch) -> Addresses {
            Addresses {
                x: l.hidden_states.ptr as u64,
                w13: l.w13.ptr as u64,
                w2: l.w2.ptr as u64,
                topk_weights: l.topk_weights.ptr as u64,
                topk_ids: l.topk_ids.ptr as u64,
                output: l.output.ptr as u64,
                workspace: None,
            }
        }
    }

    /// The problem's launch at device-like addresses (never dereferenced: only the checks and
    /// the heuristics read it).
    fn device_launch(p: &Problem) -> MoeLaunch {
        let at = |i: u64| 0x7f00_0000_0000 + (i << 24);
        let a = Addresses {
            x: at(1),
            w13: at(2),
            w2: at(3),
            topk_weights: at(4),
            topk_ids: at(5),
            output: at(6),
            workspace: Some((at(7), 1 << 20)),
        };
        p.launch(a, (DeviceKind::Cuda, 0))
    }

    #[test]
    fn the_cpu_reference_is_finite_and_not_trivial() {
        let p = Problem::new().unwrap();
        assert!(p.reference.iter().all(|v| v.to_f32().is_finite()));
        let norm: f64 = p.reference.iter().map(|v| v.to_f64() * v.to_f64()).sum();
        assert!(norm > 1.0, "{norm}");
        // Every expert receives pairs (each family's tiles are exercised for all experts).
        for e in 0..E as i32 {
            assert!(p.topk_ids.contains(&e));
        }
    }

    #[test]
    fn the_problem_passes_every_gpu_rule_for_every_tested_family() {
        use crate::backend::gpu::heuristics::stream_unsupported;
        let p = Problem::new().unwrap();
        let l = device_launch(&p);
        let shape = check_launch(&l).unwrap();
        for arch in ["sm_80", "sm_89", "sm_90"] {
            for spec in tested_specs(Vendor::Cuda, arch) {
                if spec.family == Family::Stream {
                    assert_eq!(stream_unsupported(90, &spec, &l), None);
                }
                let plan = launch::plan(&l, &shape, spec.clone()).unwrap();
                assert_eq!(plan.spec, spec);
                assert!(plan.workspace_bytes <= 1 << 20);
            }
        }
        let hip = p.launch(
            Addresses {
                workspace: Some((0x7f00_7000_0000, 1 << 20)),
                ..Addresses::from_launch(&l)
            },
            (DeviceKind::Rocm, 0),
        );
        let shape = check_launch(&hip).unwrap();
        for spec in tested_specs(Vendor::Hip, "gfx942") {
            assert!(launch::plan(&hip, &shape, spec).is_ok());
        }
    }

    #[test]
    fn heuristics_never_pick_a_refused_family() {
        let p = Problem::new().unwrap();
        let l = device_launch(&p);
        let shape = check_launch(&l).unwrap();
        let all = FamilySet::all();
        // 4 pairs per expert: the wgmma family is the first pick on sm_90, stream before it.
        assert_eq!(
            choose_accepted("sm_90", &l, &shape, all).unwrap(),
            Family::Wgmma
        );
        assert_eq!(
            choose_accepted("sm_89", &l, &shape, all).unwrap(),
            Family::Stream
        );
        let no_stream: FamilySet = [Family::Fp32, Family::Tile32].into_iter().collect();
        for arch in ["sm_89", "sm_90"] {
            assert_eq!(
                choose_accepted(arch, &l, &shape, no_stream).unwrap(),
                Family::Tile32
            );
        }
        let fp32_only: FamilySet = [Family::Fp32].into_iter().collect();
        assert_eq!(
            choose_accepted("sm_90", &l, &shape, fp32_only).unwrap(),
            Family::Fp32
        );
        // The launch's plan follows (the route sorts for the family that runs).
        let caps = super::super::gpu_caps("sm_90", "test");
        let plan = launch::validate_among(&caps, &l, no_stream).unwrap();
        assert_eq!(plan.spec.family, Family::Tile32);
        let e = launch::validate_among(&caps, &l, FamilySet::NONE).unwrap_err();
        assert_eq!(e.status, Status::Unsupported);
        assert_eq!(
            e.message,
            "no kernel family that passed this device's self-test before first use can run \
             this launch (wgmma and its fallbacks were refused; `moeplug info` says why)"
        );
        // HIP picks fp32: refusing it leaves nothing.
        assert!(choose_accepted("gfx942", &l, &shape, no_stream).is_ok());
        let tile_only: FamilySet = [Family::Tile32].into_iter().collect();
        assert!(choose_accepted("gfx942", &l, &shape, tile_only).is_err());
    }
}
