//! Prints what `moeplug info` will show for the GPU backend (runtime, device, kernel cache,
//! cold compile time). Runs anywhere: without a GPU it says why the backend is unavailable.
fn main() {
    print!("{}", moeplug::backend::gpu::describe());
}
