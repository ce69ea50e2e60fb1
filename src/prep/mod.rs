//! Weight preparation: AITER's shuffles, scale shuffles, padding and swizzles, byte for byte
//! (LAYOUTS.md §2–3). `maps` holds the index maps every reader and writer shares.

pub mod maps;
