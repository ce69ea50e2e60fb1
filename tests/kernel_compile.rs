//! The compile check: every fused-MoE kernel configuration the heuristics can select on
//! sm_80, sm_89 and sm_90 compiles with NVRTC (no GPU needed) without register spills or a
//! stack frame. Needs libnvrtc on the loader path (`.ci/run` installs it from PyPI); without
//! it the test says so and passes, unless MOEPLUG_REQUIRE_NVRTC=1 (CI) makes it fail.
//! `MOEPLUG_COMPILE_CHECK_ARCHS=sm_90` narrows the archs, `MOEPLUG_COMPILE_CHECK_LIMIT=N`
//! compiles only every N-th configuration, `MOEPLUG_COMPILE_CHECK_FAMILY=stream` one family and
//! `MOEPLUG_COMPILE_CHECK_DEFINE="ACT=5 ACT_Q=0"` only configurations with all of those `-D`
//! (a quick local look).

use moeplug::backend::gpu::{cache, compile_check, driver};

#[test]
fn every_selectable_kernel_compiles_without_spills() {
    let rtc = match driver::load_nvrtc() {
        Ok(r) => r,
        Err(e) => {
            if std::env::var("MOEPLUG_REQUIRE_NVRTC").as_deref() == Ok("1") {
                panic!("MOEPLUG_REQUIRE_NVRTC=1 but {}", e.message);
            }
            eprintln!("kernel compile check SKIPPED: {}", e.message);
            return;
        }
    };
    let archs =
        std::env::var("MOEPLUG_COMPILE_CHECK_ARCHS").unwrap_or_else(|_| "sm_80,sm_89,sm_90".into());
    let every: usize = std::env::var("MOEPLUG_COMPILE_CHECK_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut failures = Vec::new();
    let mut compiled = 0;
    for arch in archs.split(',') {
        let sm: u32 = arch.trim_start_matches("sm_").parse().expect("arch sm_XY");
        let family = std::env::var("MOEPLUG_COMPILE_CHECK_FAMILY").ok();
        let define = std::env::var("MOEPLUG_COMPILE_CHECK_DEFINE").ok();
        let specs: Vec<_> = compile_check::selectable_specs(sm)
            .into_iter()
            .filter(|s| family.as_deref().is_none_or(|f| s.family.name() == f))
            .filter(|s| {
                let d = s.defines();
                define
                    .as_ref()
                    .is_none_or(|want| want.split_whitespace().all(|w| d.iter().any(|x| x == w)))
            })
            .step_by(every.max(1))
            .collect();
        let results = std::sync::Mutex::new(Vec::new());
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(spec) = specs.get(i) else { break };
                    let r = cache::compile_check(&rtc, &spec.compile_arch(arch), &spec.defines());
                    results.lock().unwrap().push((i, r));
                });
            }
        });
        let mut results = results.into_inner().unwrap();
        results.sort_by_key(|(i, _)| *i);
        for (i, r) in results {
            let what = format!("{arch} {}", specs[i].defines().join(" "));
            match r {
                Err(e) => failures.push(format!("{what}: {}", e.message)),
                Ok(c) => {
                    compiled += 1;
                    let usage = compile_check::parse_ptxas_log(&c.log);
                    let line: Vec<String> = usage
                        .iter()
                        .filter(|k| k.name.contains("stage"))
                        .map(|k| format!("{} {} regs", k.name, k.registers))
                        .collect();
                    println!("compiled {what}: {}", line.join(", "));
                    failures.extend(usage_problems(&what, &usage));
                    failures.extend(serialized_wgmma(&what, &c.log));
                }
            }
        }
    }
    println!("kernel compile check: {compiled} configurations compiled");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the self-test before first use compiles on each arch (every family a device may
/// select and its fallbacks, fp32 included on sm_80+) compiles too, without spills.
#[test]
fn the_self_test_configurations_compile() {
    use moeplug::backend::gpu::{selftest_run, Vendor};
    let rtc = match driver::load_nvrtc() {
        Ok(r) => r,
        Err(e) => {
            if std::env::var("MOEPLUG_REQUIRE_NVRTC").as_deref() == Ok("1") {
                panic!("MOEPLUG_REQUIRE_NVRTC=1 but {}", e.message);
            }
            eprintln!("self-test compile check SKIPPED: {}", e.message);
            return;
        }
    };
    let archs =
        std::env::var("MOEPLUG_COMPILE_CHECK_ARCHS").unwrap_or_else(|_| "sm_80,sm_89,sm_90".into());
    let mut failures = Vec::new();
    for arch in archs.split(',') {
        let specs = selftest_run::tested_specs(Vendor::Cuda, arch);
        for family in ["fp32", "tile32", "stream"] {
            assert!(
                specs.iter().any(|s| s.family.name() == family),
                "{arch}: the self-test must cover {family}"
            );
        }
        for spec in specs {
            let what = format!("self-test {arch} {}", spec.family.name());
            match cache::compile_check(&rtc, &spec.compile_arch(arch), &spec.defines()) {
                Err(e) => failures.push(format!("{what}: {}", e.message)),
                Ok(c) => {
                    let usage = compile_check::parse_ptxas_log(&c.log);
                    failures.extend(usage_problems(&what, &usage));
                    println!("compiled {what}");
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `MOEPLUG_DUMP_CUBIN=/path/prefix cargo test --release --test kernel_compile dump -- --ignored`
/// writes the cubin of `MOEPLUG_DUMP_DEFINES` (space-separated) for `MOEPLUG_COMPILE_CHECK_ARCHS`
/// (one arch) to read with cuobjdump / nvdisasm.
#[test]
#[ignore]
fn dump() {
    let rtc = driver::load_nvrtc().expect("NVRTC");
    let arch = std::env::var("MOEPLUG_COMPILE_CHECK_ARCHS").unwrap_or_else(|_| "sm_90".into());
    let defines: Vec<String> = std::env::var("MOEPLUG_DUMP_DEFINES")
        .expect("MOEPLUG_DUMP_DEFINES")
        .split_whitespace()
        .map(String::from)
        .collect();
    let c = cache::compile_check(&rtc, &arch, &defines).expect("compile");
    let out = std::env::var("MOEPLUG_DUMP_CUBIN").expect("MOEPLUG_DUMP_CUBIN");
    std::fs::write(format!("{out}.cubin"), &c.binary).unwrap();
    println!("{}", c.log);
}

/// ptxas's advisory C7514, "wgmma.mma_async instructions are serialized": it waits for every
/// wgmma before the next (an accumulator read or written by other instructions while a wgmma
/// group is in flight), which costs the overlap the family is built on. Session 11 found it
/// on a two-partial-sum fp8 loop (bench/patches/wgmma-fp8-pingpong.patch).
fn serialized_wgmma(what: &str, log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("C7514") || l.contains("are serialized"))
        .map(|l| format!("{what}: {}", l.trim()))
        .collect()
}

/// What the ptxas report of one configuration must not show: no report, a spill, a stack frame.
fn usage_problems(what: &str, usage: &[compile_check::KernelUsage]) -> Vec<String> {
    let mut problems = Vec::new();
    if usage.is_empty() {
        problems.push(format!("{what}: no ptxas report in the log"));
    }
    for k in usage
        .iter()
        .filter(|k| k.spill_bytes > 0 || k.stack_bytes > 0)
    {
        problems.push(format!(
            "{what}: {} spills {} bytes, {} bytes stack",
            k.name, k.spill_bytes, k.stack_bytes
        ));
    }
    problems
}
