//! Weight preparation: AITER's shuffles, scale shuffles, padding and swizzles, byte for byte
//! (docs/layouts.md §2–3), and `prepare`, which chains them for a target. `maps` holds the index
//! maps every reader and writer shares; `rows` the three writers everything is built from;
//! `steps` each prep call as data (row map + writer), which the host runs with `rows` and
//! the GPU backend with its kernels. The other modules check arguments and build steps;
//! `request` holds each prep call as a typed request that checks its tensors and returns the
//! job to run (through `Backend::run_prep`) and the layout fragment it produces.

pub mod int4;
pub mod maps;
pub mod pad;
pub mod parallel;
pub mod prepare;
pub mod request;
pub mod rows;
pub mod scale;
pub mod shuffle;
pub mod steps;
pub mod swizzle;
