//! Host structs that mirror a kernel-source struct are checked against the source itself:
//! [`c_layout`] reads a `struct Name { ... };` out of the `.cu`/`.cuh` text and lays it out
//! as the C compiler does (natural alignment), and [`assert_mirrors!`] compares it field by
//! field (name and offset) and in size with the `#[repr(C)]` Rust struct.

/// (field, offset, size) of `struct name` in `src`, and the struct's size. Field types: u64,
/// i64, u32, int, float, or another struct of `src`.
pub fn c_layout(src: &str, name: &str) -> (Vec<(String, usize, usize)>, usize) {
    let head = format!("struct {name} {{");
    let body = src
        .split(head.as_str())
        .nth(1)
        .and_then(|rest| rest.split("};").next())
        .unwrap_or_else(|| panic!("struct {name} not found in the kernel source"));
    let code: String = body
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    let (mut fields, mut off, mut align) = (Vec::new(), 0usize, 1usize);
    for decl in code.split(';') {
        let mut words = decl.split_whitespace();
        let Some(ty) = words.next() else { continue };
        let (size, a) = match ty {
            "u64" | "i64" => (8, 8),
            "u32" | "int" | "float" => (4, 4),
            nested => (c_layout(src, nested).1, 8),
        };
        for field in words.collect::<String>().split(',') {
            off = off.div_ceil(a) * a;
            fields.push((field.trim().to_string(), off, size));
            off += size;
            align = align.max(a);
        }
    }
    (fields, off.div_ceil(align) * align)
}

/// `assert_mirrors!(RustType, source_text, "CName", rust_field => "c_field", ...)`: same
/// fields in the same order at the same offsets, same size.
macro_rules! assert_mirrors {
    ($t:ty, $src:expr, $cname:literal, $($f:ident => $cf:literal),+ $(,)?) => {{
        let (c, size) = $crate::backend::gpu::mirror::c_layout($src, $cname);
        let rust: Vec<(String, usize)> =
            vec![$(($cf.to_string(), std::mem::offset_of!($t, $f))),+];
        let c_fields: Vec<(String, usize)> = c.iter().map(|(n, o, _)| (n.clone(), *o)).collect();
        assert_eq!(rust, c_fields, "{} vs struct {} of the kernel source", stringify!($t), $cname);
        assert_eq!(std::mem::size_of::<$t>(), size, "size of {}", stringify!($t));
    }};
}
pub(crate) use assert_mirrors;
