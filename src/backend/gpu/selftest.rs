//! The self-test before first use: the accept/refuse decision over what a device produced
//! for a small problem per kernel family, against the CPU backend (fused_moe) or the host
//! bytes (prep). Pure, so it is tested here with fake device results.
//!
//! A family that fails is never selected and `info` (and the log callback) says which and why
//! (the caps drop DEVICE_PREP when prep failed); if no fused_moe family passes, the backend is
//! BACKEND_UNAVAILABLE with every reason.
//!
//! Wired in `GpuBackend::open`: [`super::selftest_run`] runs, for each kernel family
//! ([`super::spec::Family`]) the device may select, one small launch (and one device prep) on
//! device memory, compares with the CPU backend / host prep, and hands the outcomes to
//! [`decide`]; the backend selects only accepted families, drops DEVICE_PREP when prep failed,
//! and prints [`Decision::summary`] with the time in `info`.

use crate::error::{Error, Result};

/// fused_moe on the device vs the CPU backend, relative L2 (tests/gpu `TOL_CPU`: both run
/// the same fp32 math with bf16 rounding; the summation order differs, and the wgmma family
/// rounds stage 2's partials to the output's type before the top-k sum).
pub const FUSED_MOE_REL_L2: f64 = 1e-2;

/// What a family is for: the backend needs one fused_moe family; prep is optional (without
/// it the backend drops DEVICE_PREP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    FusedMoe,
    Prep,
}

/// What running one family's problem on the device gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// fused_moe output vs the CPU backend: relative L2 error, and how many output values
    /// were NaN or infinite where the CPU's were finite.
    Compared { rel_l2: f64, non_finite: usize },
    /// Device prep output vs the host bytes.
    Bytes { mismatched: usize, total: usize },
    /// The run-time compiler refused the family (the log, shortened).
    CompileFailed(String),
    /// Module load, launch or synchronize failed (the driver's error).
    DeviceFailed(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FamilyResult {
    pub family: &'static str,
    pub role: Role,
    pub outcome: Outcome,
}

/// Why a result is refused, or `None` if it passes.
pub fn refusal(r: &FamilyResult) -> Option<String> {
    match (&r.outcome, r.role) {
        (Outcome::Compared { rel_l2, non_finite }, Role::FusedMoe) => {
            if *non_finite > 0 {
                Some(format!(
                    "{non_finite} NaN/inf outputs where the CPU's are finite"
                ))
            } else if !(rel_l2.is_finite() && *rel_l2 <= FUSED_MOE_REL_L2) {
                Some(format!(
                    "rel L2 {rel_l2:.3e} vs the CPU backend > {FUSED_MOE_REL_L2:.0e}"
                ))
            } else {
                None
            }
        }
        (Outcome::Bytes { mismatched, total }, Role::Prep) => (*mismatched > 0 || *total == 0)
            .then(|| format!("{mismatched} of {total} bytes differ from the host prep")),
        (Outcome::CompileFailed(log), _) => Some(format!("compile failed: {log}")),
        (Outcome::DeviceFailed(e), _) => Some(format!("device error: {e}")),
        (o, role) => Some(format!(
            "internal: outcome {o:?} does not fit a {role:?} family"
        )),
    }
}

/// The verdict over every family of a device.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub accepted: Vec<&'static str>,
    /// (family, why).
    pub refused: Vec<(&'static str, String)>,
    /// Whether device prep may be offered (its family passed).
    pub device_prep: bool,
}

impl Decision {
    pub fn selectable(&self, family: &str) -> bool {
        self.accepted.contains(&family)
    }

    /// One line for `info` / the caps' note: "self-test: fused_moe_fp32 ok; prep refused (...)".
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self.accepted.iter().map(|f| format!("{f} ok")).collect();
        parts.extend(
            self.refused
                .iter()
                .map(|(f, why)| format!("{f} refused ({why})")),
        );
        format!("self-test: {}", parts.join("; "))
    }
}

/// Accept the families that passed; BACKEND_UNAVAILABLE naming `device` and every reason if
/// no fused_moe family did (an empty result list included: nothing proved itself).
pub fn decide(device: &str, results: &[FamilyResult]) -> Result<Decision> {
    let mut d = Decision {
        accepted: Vec::new(),
        refused: Vec::new(),
        device_prep: false,
    };
    for r in results {
        match refusal(r) {
            None => {
                d.accepted.push(r.family);
                d.device_prep |= r.role == Role::Prep;
            }
            Some(why) => d.refused.push((r.family, why)),
        }
    }
    let fused_ok = results
        .iter()
        .any(|r| r.role == Role::FusedMoe && d.selectable(r.family));
    if !fused_ok {
        let why = if d.refused.is_empty() {
            "no fused_moe kernel family was tested".to_string()
        } else {
            d.refused
                .iter()
                .map(|(f, w)| format!("{f}: {w}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(Error::unavailable(format!(
            "{device}: no fused_moe kernel family passed the self-test before first use ({why})"
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    fn fused(family: &'static str, rel_l2: f64, non_finite: usize) -> FamilyResult {
        FamilyResult {
            family,
            role: Role::FusedMoe,
            outcome: Outcome::Compared { rel_l2, non_finite },
        }
    }
    fn prep(mismatched: usize, total: usize) -> FamilyResult {
        FamilyResult {
            family: "prep",
            role: Role::Prep,
            outcome: Outcome::Bytes { mismatched, total },
        }
    }

    #[test]
    fn good_families_are_accepted_and_a_broken_one_refused_with_its_reason() {
        let d = decide(
            "rocm:0 (gfx942)",
            &[
                fused("fused_moe_fp32", 3.2e-4, 0),
                fused("fused_moe_mfma", 0.71, 0),
                prep(0, 4096),
            ],
        )
        .unwrap();
        assert_eq!(d.accepted, ["fused_moe_fp32", "prep"]);
        assert_eq!(
            d.refused,
            [(
                "fused_moe_mfma",
                "rel L2 7.100e-1 vs the CPU backend > 1e-2".to_string()
            )]
        );
        assert!(d.device_prep);
        assert!(!d.selectable("fused_moe_mfma"));
        assert_eq!(
            d.summary(),
            "self-test: fused_moe_fp32 ok; prep ok; fused_moe_mfma refused (rel L2 7.100e-1 vs the CPU backend > 1e-2)"
        );
    }

    #[test]
    fn the_threshold_is_inclusive_and_nan_never_passes() {
        assert_eq!(refusal(&fused("a", FUSED_MOE_REL_L2, 0)), None);
        assert!(refusal(&fused("a", FUSED_MOE_REL_L2 * 1.0001, 0)).is_some());
        assert_eq!(
            refusal(&fused("a", f64::NAN, 0)).unwrap(),
            "rel L2 NaN vs the CPU backend > 1e-2"
        );
        assert!(refusal(&fused("a", f64::INFINITY, 0)).is_some());
        // A few NaNs can hide in a small L2 (if the comparison skipped them): refused anyway.
        assert_eq!(
            refusal(&fused("a", 1e-5, 3)).unwrap(),
            "3 NaN/inf outputs where the CPU's are finite"
        );
    }

    #[test]
    fn prep_failure_only_drops_device_prep() {
        let d = decide(
            "cuda:0 (sm_90)",
            &[fused("fused_moe_tc", 1e-3, 0), prep(2, 4096)],
        )
        .unwrap();
        assert_eq!(d.accepted, ["fused_moe_tc"]);
        assert!(!d.device_prep);
        assert_eq!(d.refused[0].1, "2 of 4096 bytes differ from the host prep");
        // A prep that compared nothing proves nothing.
        assert!(refusal(&prep(0, 0)).is_some());
    }

    #[test]
    fn nothing_passing_is_backend_unavailable_with_every_reason() {
        let e = decide(
            "rocm:0 (gfx950)",
            &[
                FamilyResult {
                    family: "fused_moe_fp32",
                    role: Role::FusedMoe,
                    outcome: Outcome::CompileFailed("error: unknown builtin".into()),
                },
                FamilyResult {
                    family: "fused_moe_mfma",
                    role: Role::FusedMoe,
                    outcome: Outcome::DeviceFailed("hipErrorIllegalAddress (700)".into()),
                },
                prep(0, 4096),
            ],
        )
        .unwrap_err();
        assert_eq!(e.status, Status::BackendUnavailable);
        assert_eq!(
            e.message,
            "rocm:0 (gfx950): no fused_moe kernel family passed the self-test before first use \
             (fused_moe_fp32: compile failed: error: unknown builtin; \
             fused_moe_mfma: device error: hipErrorIllegalAddress (700))"
        );
        let e = decide("rocm:0 (gfx942)", &[prep(0, 16)]).unwrap_err();
        assert!(
            e.message
                .ends_with("(no fused_moe kernel family was tested)"),
            "{}",
            e.message
        );
        assert!(decide("rocm:0 (gfx942)", &[]).is_err());
    }

    #[test]
    fn an_outcome_of_the_wrong_kind_is_refused() {
        let r = FamilyResult {
            family: "prep",
            role: Role::Prep,
            outcome: Outcome::Compared {
                rel_l2: 0.0,
                non_finite: 0,
            },
        };
        assert!(refusal(&r).unwrap().starts_with("internal: outcome"));
    }
}
