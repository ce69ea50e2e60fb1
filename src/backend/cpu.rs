//! The CPU backend: runs host tensors on the calling thread's worker pool; the embedded default
//! and the numerical reference of every GPU kernel.

use std::sync::Arc;

use once_cell::sync::Lazy;

use super::{Backend, Caps};
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

    fn caps(&self) -> Caps {
        Caps {
            backend: Some(BackendKind::Cpu),
            arch: std::env::consts::ARCH.to_string(),
            runtime_version: format!("{} threads", crate::backend::cpu::threads()),
            // fused_moe on the CPU is not implemented yet: it reports nothing it cannot run.
            ..Caps::default()
        }
    }
}

/// Worker threads the CPU backend uses (all cores).
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
