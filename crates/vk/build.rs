//! Compiles every `shaders/*.comp` to SPIR-V with `glslc` and generates the `Kernel` enum.
//!
//! A shader may declare variants on a line of its own:
//! `// variants: q8_0=-DWTYPE_Q8_0 f32=-DWTYPE_F32,-DEXTRA=1`
//! (each variant: `name=flag[,flag...]`), giving one SPIR-V per variant named
//! `<Stem><Variant>` in CamelCase. The SPIR-V words are written into the generated
//! source as `u32` arrays, so they are 4-byte aligned without any cast.
//! `GLSLC` overrides the compiler's path.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Variant {
    name: String,
    flags: Vec<String>,
}

fn camel(s: &str) -> String {
    s.split(['_', '-'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn variant_camel(v: &str) -> String {
    // Keep the underscore between digits ("q8_0" -> "Q8_0"), capitalise the rest.
    let mut out = String::new();
    let mut upper = true;
    let chars: Vec<char> = v.chars().collect();
    for (i, &ch) in chars.iter().enumerate() {
        if ch == '_' || ch == '-' {
            let prev_digit = i > 0 && chars[i - 1].is_ascii_digit();
            let next_digit = chars.get(i + 1).is_some_and(|c| c.is_ascii_digit());
            if prev_digit && next_digit {
                out.push('_');
            } else {
                upper = true;
            }
            continue;
        }
        if upper {
            out.push(ch.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(ch);
        }
    }
    out
}

fn parse_variants(src: &str, path: &Path) -> Vec<Variant> {
    for line in src.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("// variants:") {
            let mut out = Vec::new();
            for item in rest.split_whitespace() {
                let (name, flags) = item.split_once('=').unwrap_or_else(|| {
                    panic!(
                        "{}: variant `{item}` must be name=flag[,flag]",
                        path.display()
                    )
                });
                out.push(Variant {
                    name: name.to_string(),
                    flags: flags.split(',').map(str::to_string).collect(),
                });
            }
            return out;
        }
    }
    Vec::new()
}

/// Highest `Binding` decoration + 1 (0 if none), scanning the SPIR-V instructions.
fn max_binding(words: &[u32]) -> u32 {
    const OP_DECORATE: u32 = 71;
    const DECORATION_BINDING: u32 = 33;
    let mut i = 5; // header
    let mut max = 0;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        let op = words[i] & 0xFFFF;
        if count == 0 {
            break;
        }
        if op == OP_DECORATE
            && count >= 4
            && i + 3 < words.len()
            && words[i + 2] == DECORATION_BINDING
        {
            max = max.max(words[i + 3] + 1);
        }
        i += count;
    }
    max
}

/// Per binding 0..max_binding: `true` for a texel buffer (`samplerBuffer`: an image of
/// dimension Buffer, possibly wrapped in a sampled image), `false` for anything else
/// (storage buffers). Read from OpDecorate/OpVariable/OpTypePointer/OpType*Image.
fn texel_bindings(words: &[u32]) -> Vec<bool> {
    use std::collections::HashMap;
    const OP_TYPE_IMAGE: u32 = 25;
    const OP_TYPE_SAMPLED_IMAGE: u32 = 27;
    const OP_TYPE_POINTER: u32 = 32;
    const OP_VARIABLE: u32 = 59;
    const OP_DECORATE: u32 = 71;
    const DECORATION_BINDING: u32 = 33;
    const DIM_BUFFER: u32 = 5;
    let mut binding_of: HashMap<u32, u32> = HashMap::new();
    let mut var_type: HashMap<u32, u32> = HashMap::new();
    let mut pointee: HashMap<u32, u32> = HashMap::new();
    let mut sampled_image: HashMap<u32, u32> = HashMap::new();
    let mut buffer_images: std::collections::HashSet<u32> = Default::default();
    let mut i = 5;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        let op = words[i] & 0xFFFF;
        if count == 0 || i + count > words.len() {
            break;
        }
        let w = &words[i + 1..i + count];
        match op {
            OP_DECORATE if w.len() >= 3 && w[1] == DECORATION_BINDING => {
                binding_of.insert(w[0], w[2]);
            }
            OP_VARIABLE if w.len() >= 2 => {
                var_type.insert(w[1], w[0]);
            }
            OP_TYPE_POINTER if w.len() >= 3 => {
                pointee.insert(w[0], w[2]);
            }
            OP_TYPE_SAMPLED_IMAGE if w.len() >= 2 => {
                sampled_image.insert(w[0], w[1]);
            }
            OP_TYPE_IMAGE if w.len() >= 3 && w[2] == DIM_BUFFER => {
                buffer_images.insert(w[0]);
            }
            _ => {}
        }
        i += count;
    }
    let n = max_binding(words) as usize;
    let mut out = vec![false; n];
    for (var, b) in binding_of {
        let Some(ty) = var_type.get(&var).and_then(|p| pointee.get(p)) else {
            continue;
        };
        let image = sampled_image.get(ty).copied().unwrap_or(*ty);
        if buffer_images.contains(&image) && (b as usize) < n {
            out[b as usize] = true;
        }
    }
    out
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let shaders = manifest.join("../../shaders");
    let include = shaders.join("include");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let glslc = std::env::var("GLSLC").unwrap_or_else(|_| "glslc".to_string());
    println!("cargo:rerun-if-env-changed=GLSLC");
    println!("cargo:rerun-if-changed={}", shaders.display());
    println!("cargo:rerun-if-changed={}", include.display());

    let mut includes: Vec<PathBuf> = std::fs::read_dir(&include)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    includes.sort();
    for inc in &includes {
        println!("cargo:rerun-if-changed={}", inc.display());
    }

    let mut comps: Vec<PathBuf> = std::fs::read_dir(&shaders)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", shaders.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "comp"))
        .collect();
    comps.sort();

    // (variant ident, name, words)
    let mut kernels: Vec<(String, String, Vec<u32>)> = Vec::new();
    for comp in &comps {
        println!("cargo:rerun-if-changed={}", comp.display());
        let src = std::fs::read_to_string(comp)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", comp.display()));
        let stem = comp
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 shader name");
        let mut variants = parse_variants(&src, comp);
        let plain = variants.is_empty();
        if plain {
            variants.push(Variant {
                name: String::new(),
                flags: Vec::new(),
            });
        }
        for v in &variants {
            let (ident, name) = if plain {
                (camel(stem), stem.to_string())
            } else {
                (
                    format!("{}{}", camel(stem), variant_camel(&v.name)),
                    format!("{stem}.{}", v.name),
                )
            };
            let spv = out_dir.join(format!("{name}.spv"));
            let mut cmd = Command::new(&glslc);
            cmd.arg("--target-env=vulkan1.2")
                .arg("-O")
                .arg("-fshader-stage=compute")
                .arg("-I")
                .arg(&include)
                .args(&v.flags)
                .arg(comp)
                .arg("-o")
                .arg(&spv);
            let output = match cmd.output() {
                Ok(o) => o,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "`{glslc}` not found: the shaders are compiled with glslc from the shaderc \
                     project. Install it with `apt install glslc` (Debian/Ubuntu), or set GLSLC \
                     to its path."
                ),
                Err(e) => panic!("cannot run `{glslc}`: {e}"),
            };
            if !output.status.success() {
                panic!(
                    "glslc failed on {} (variant `{}`):\n{}{}",
                    comp.display(),
                    v.name,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let bytes = std::fs::read(&spv).expect("read SPIR-V");
            assert!(bytes.len() % 4 == 0, "SPIR-V of {name} is not whole words");
            let words = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            kernels.push((ident, name, words));
        }
    }

    let mut gen = String::new();
    gen.push_str("/// Every compute kernel compiled from `shaders/` (one entry per variant).\n");
    gen.push_str("#[allow(non_camel_case_types)]\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n");
    for (ident, name, _) in &kernels {
        let _ = writeln!(gen, "    /// `{name}`\n    {ident},");
    }
    gen.push_str("}\n\nimpl Kernel {\n    /// All kernels, in file order.\n");
    let _ = writeln!(gen, "    pub const ALL: &'static [Kernel] = &[");
    for (ident, _, _) in &kernels {
        let _ = writeln!(gen, "        Kernel::{ident},");
    }
    gen.push_str("    ];\n\n    /// `stem` or `stem.variant`.\n    pub fn name(self) -> &'static str {\n        match self {\n");
    for (ident, name, _) in &kernels {
        let _ = writeln!(gen, "            Kernel::{ident} => \"{name}\",");
    }
    gen.push_str("        }\n    }\n\n    /// Bindings the shader declares in set 0 (highest `binding` + 1, read from the SPIR-V).\n    pub fn bindings(self) -> u32 {\n        match self {\n");
    for (ident, _, words) in &kernels {
        let _ = writeln!(
            gen,
            "            Kernel::{ident} => {},",
            max_binding(words)
        );
    }
    gen.push_str("        }\n    }\n\n    /// Descriptor type of each binding 0..bindings() (reflected from the SPIR-V).\n    pub fn descriptor_kinds(self) -> &'static [crate::DescriptorKind] {\n        use crate::DescriptorKind::{StorageBuffer as S, UniformTexelBuffer as T};\n        match self {\n");
    for (ident, _, words) in &kernels {
        let kinds: Vec<&str> = texel_bindings(words)
            .iter()
            .map(|&t| if t { "T" } else { "S" })
            .collect();
        let _ = writeln!(
            gen,
            "            Kernel::{ident} => &[{}],",
            kinds.join(", ")
        );
    }
    gen.push_str("        }\n    }\n\n    /// The SPIR-V words.\n    pub fn spirv(self) -> &'static [u32] {\n        match self {\n");
    for (ident, _, _) in &kernels {
        let _ = writeln!(
            gen,
            "            Kernel::{ident} => &SPIRV_{},",
            ident.to_ascii_uppercase()
        );
    }
    gen.push_str("        }\n    }\n}\n\n");
    for (ident, _, words) in &kernels {
        let _ = write!(
            gen,
            "static SPIRV_{}: [u32; {}] = [",
            ident.to_ascii_uppercase(),
            words.len()
        );
        for (i, w) in words.iter().enumerate() {
            if i % 8 == 0 {
                gen.push_str("\n    ");
            }
            let _ = write!(gen, "0x{w:08x}, ");
        }
        gen.push_str("\n];\n");
    }
    std::fs::write(out_dir.join("kernels.rs"), gen).expect("write kernels.rs");
}
