//! The CPU backend: runs host tensors on the calling thread's worker pool (all cores); the
//! embedded default and the numerical reference of every GPU kernel.

mod kernel;
pub mod weights;

use std::sync::Arc;

use once_cell::sync::Lazy;

use super::{check_against_caps, Backend, Caps};
use crate::error::Result;
use crate::moe::check::{check_launch, check_record};
use crate::moe::{MoeConfig, MoeLaunch};
use crate::prep::request::PrepJob;
use crate::types::BackendKind;

pub struct CpuBackend;

static CPU: Lazy<Arc<CpuBackend>> = Lazy::new(|| Arc::new(CpuBackend));

pub fn backend() -> Arc<dyn Backend> {
    CPU.clone()
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    /// Everything the integration tests run (tests/moe_reference.rs, tests/moe_golden.rs).
    fn caps(&self) -> Caps {
        let mut caps = Caps::full_fused_moe(
            BackendKind::Cpu,
            std::env::consts::ARCH.to_string(),
            format!("{} threads", threads()),
        );
        // Every output element is summed in a fixed order whatever the thread count
        // (tests/determinism.rs proves it per format: docs/determinism.md).
        caps.features |= crate::types::feature::DETERMINISTIC;
        caps
    }

    /// The masks, the format's allowed activation dtypes, and a record every reader can index.
    fn check(&self, config: &MoeConfig) -> Result<()> {
        check_against_caps(&self.caps(), config)?;
        check_record(&config.layout)
    }

    /// The CPU backend takes its scratch from the host heap: no caller workspace needed.
    fn workspace_size(&self, launch: &MoeLaunch) -> Result<usize> {
        self.check(&launch.config)?;
        check_launch(launch)?;
        Ok(0)
    }

    fn fused_moe(&self, launch: &MoeLaunch) -> Result<()> {
        self.check(&launch.config)?;
        let shape = check_launch(launch)?;
        kernel::fused_moe(launch, &shape)
    }

    /// Host memory: the steps run on the calling thread (and its workers); no stream.
    unsafe fn run_prep(&self, job: &PrepJob, _stream: usize) -> Result<()> {
        crate::prep::request::run_host(job)
    }
}

/// Worker threads the CPU backend uses (`moeplug_set_num_threads`, default all cores).
pub fn threads() -> usize {
    crate::runtime::threads::count()
}
