//! Compiles every `shaders/*.comp` to SPIR-V with `glslc` and generates the `Kernel` enum.
//!
//! A shader is compiled once per build-time variant listed in [`variants`] (a name and the
//! `-D` defines that select it; a shader with no list is compiled once), giving one SPIR-V
//! module per variant, named `<stem>.<variant>`, and one `Kernel` each. Modes are defines,
//! not specialization constants: lavapipe compiles a constant's dead branches too
//! (docs/facts.md, "Decode kernels on lavapipe"), so each module holds only the code its
//! variant runs. Only the variants the engine can ask for are listed.
//!
//! The modules are embedded packed: one zstd frame per group of modules ([`group_of`]:
//! the stem and first variant part, `matmul.q8_0`), since the variants of one shader
//! share most of their bytes and compress together to a sixth of their 54 MiB, where
//! each alone only shrinks to two sevenths. A group is decompressed the first time one
//! of its kernels is asked for (`Kernel::spirv`), so a model unpacks only the weight
//! types it has. `GLSLC` overrides the compiler's path.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Variant {
    name: String,
    flags: Vec<String>,
}

/// The weight types the matmul and embedding kernels read: variant name and define.
const WEIGHT_TYPES: &[(&str, &str)] = &[
    ("q8_0", "WTYPE_Q8_0"),
    ("q4_0", "WTYPE_Q4_0"),
    ("q4_1", "WTYPE_Q4_1"),
    ("q5_0", "WTYPE_Q5_0"),
    ("q5_1", "WTYPE_Q5_1"),
    ("bf16", "WTYPE_BF16"),
    ("f16", "WTYPE_F16"),
    ("f32", "WTYPE_F32"),
    ("q4_k", "WTYPE_Q4_K"),
    ("q5_k", "WTYPE_Q5_K"),
    ("q6_k", "WTYPE_Q6_K"),
    ("q3_k", "WTYPE_Q3_K"),
    ("q2_k", "WTYPE_Q2_K"),
];

/// The fused matmul steps of the forward pass (engine::kernels::Epilogue): name, defines.
const EPILOGUES: [(&str, &[&str]); 6] = [
    // q/k/v: rmsnorm in, rope + KV-cache write out
    ("qkv", &["IN_RMSNORM", "OUT_MODE=2"]),
    // attn_output, ffn_down: residual add (and the next norm's input)
    ("add", &["OUT_MODE=1"]),
    // gate/up: rmsnorm in, SwiGLU out
    ("glu", &["IN_RMSNORM", "OUT_MODE=3"]),
    // the logits, and a plain q/k/v before heads.comp: rmsnorm in, stored
    ("logits", &["IN_RMSNORM", "OUT_MODE=0"]),
    // attn_output, ffn_down of post-norm families (gemma3): stored for post_norm.comp
    ("store", &["OUT_MODE=0"]),
    // gate/up of gemma3: rmsnorm in, GELU(tanh)-gated out
    ("geglu", &["IN_RMSNORM", "OUT_MODE=3", "ACT_GELU"]),
];

/// Tokens per invocation of the row-per-lane matmul: decode (1) and prefill (4).
const MATMUL_TB: [u32; 2] = [1, 4];
/// Tokens per workgroup of the prefill GEMM (`matmul_mm.comp`'s `TT`;
/// engine::kernels::GEMM_TT).
const GEMM_TT: [u32; 2] = [2, 8];
/// Whole rounds of lanes' chunks per row of the column-split matmul (its `SPLIT_K`).
const SPLIT_K: [u32; 4] = [1, 2, 3, 4];

fn variant(name: String, flags: &[&str]) -> Variant {
    Variant {
        name,
        flags: flags.iter().map(|f| format!("-D{f}")).collect(),
    }
}

/// The build-time variants of shader `stem` (empty: compiled once, as is).
fn variants(stem: &str) -> Vec<Variant> {
    let mut out = Vec::new();
    match stem {
        "embed" => {
            for &(ty, def) in WEIGHT_TYPES {
                out.push(variant(ty.to_string(), &[def]));
            }
        }
        "matmul" => {
            for &(ty, def) in WEIGHT_TYPES {
                for tb in MATMUL_TB {
                    for (epi, defs) in EPILOGUES {
                        let tbdef = format!("TB={tb}");
                        let mut flags = vec![def, tbdef.as_str()];
                        flags.extend_from_slice(defs);
                        out.push(variant(format!("{ty}.tb{tb}.{epi}"), &flags));
                    }
                }
            }
        }
        "matmul_mm" => {
            for &(ty, def) in WEIGHT_TYPES {
                for tt in GEMM_TT {
                    // "logits" too: at batch width it is the plain q/k/v before heads.comp
                    for (epi, defs) in EPILOGUES {
                        let ttdef = format!("TT={tt}");
                        let tbdef = format!("TB={}", tt.min(4));
                        let mut flags = vec![def, tbdef.as_str(), ttdef.as_str()];
                        flags.extend_from_slice(defs);
                        out.push(variant(format!("{ty}.t{tt}.{epi}"), &flags));
                    }
                }
            }
        }
        "matmul_split" => {
            for &(ty, def) in WEIGHT_TYPES {
                for k in SPLIT_K {
                    for (epi, defs) in EPILOGUES {
                        let kdef = format!("SPLIT_K={k}");
                        let mut flags = vec![def, "TB=1", kdef.as_str()];
                        flags.extend_from_slice(defs);
                        out.push(variant(format!("{ty}.k{k}.{epi}"), &flags));
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// `matmul_split.q8_0.k1` -> `MatmulSplitQ8_0K1`.
fn ident_of(name: &str) -> String {
    name.split('.').map(variant_camel).collect()
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

const OP_TYPE_IMAGE: u32 = 25;
const OP_TYPE_SAMPLED_IMAGE: u32 = 27;
const OP_TYPE_POINTER: u32 = 32;
const OP_VARIABLE: u32 = 59;
const OP_DECORATE: u32 = 71;
const DECORATION_BINDING: u32 = 33;
const DIM_BUFFER: u32 = 5;

/// The module's instructions after the 5-word header: (opcode, operand words). Stops at
/// a malformed length rather than reading past the end.
fn instructions(words: &[u32]) -> impl Iterator<Item = (u32, &[u32])> {
    let mut i = 5;
    std::iter::from_fn(move || {
        let head = *words.get(i)?;
        let count = (head >> 16) as usize;
        if count == 0 || i + count > words.len() {
            return None;
        }
        let operands = &words[i + 1..i + count];
        i += count;
        Some((head & 0xFFFF, operands))
    })
}

/// Highest `Binding` decoration + 1 (0 if none).
fn max_binding(words: &[u32]) -> u32 {
    instructions(words)
        .filter(|(op, w)| *op == OP_DECORATE && w.len() >= 3 && w[1] == DECORATION_BINDING)
        .map(|(_, w)| w[2] + 1)
        .max()
        .unwrap_or(0)
}

/// Per binding 0..max_binding: `true` for a texel buffer (`textureBuffer`: an image of
/// dimension Buffer, possibly wrapped in a sampled image), `false` for anything else
/// (storage buffers). Read from OpDecorate/OpVariable/OpTypePointer/OpType*Image.
fn texel_bindings(words: &[u32]) -> Vec<bool> {
    use std::collections::HashMap;
    let mut binding_of: HashMap<u32, u32> = HashMap::new();
    let mut var_type: HashMap<u32, u32> = HashMap::new();
    let mut pointee: HashMap<u32, u32> = HashMap::new();
    let mut sampled_image: HashMap<u32, u32> = HashMap::new();
    let mut buffer_images: std::collections::HashSet<u32> = Default::default();
    for (op, w) in instructions(words) {
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

/// Whether the module declares an `OpTypeSampledImage` of a `Dim Buffer` image (what
/// `samplerBuffer` compiles to). Newer SPIR-V validators, Mesa 25's among them, reject it;
/// `spirv-val` 2023.1 at vulkan1.2 does not, so the build checks it itself.
fn samples_buffer_image(words: &[u32]) -> bool {
    let buffer_images: std::collections::HashSet<u32> = instructions(words)
        .filter(|(op, w)| *op == OP_TYPE_IMAGE && w.len() >= 3 && w[2] == DIM_BUFFER)
        .map(|(_, w)| w[0])
        .collect();
    instructions(words)
        .any(|(op, w)| op == OP_TYPE_SAMPLED_IMAGE && w.len() >= 2 && buffer_images.contains(&w[1]))
}

/// Compiles one variant of `comp` to `spv` and returns its words. A module built from the
/// same sources (`sources`: a hash of the shader and every include) with the same compiler
/// and flags, as its `.stamp` file records, is reused, so editing one shader does not
/// recompile the hundred others. Contents, not times: a build directory copied from
/// another checkout holds modules newer than sources they were not built from.
fn compile(
    glslc: &str,
    include: &Path,
    comp: &Path,
    v: &Variant,
    spv: &Path,
    sources: u64,
) -> Vec<u32> {
    let stamp = format!("{glslc} {} sources {sources:016x}", v.flags.join(" "));
    let stamp_path = spv.with_extension("stamp");
    let same = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    if !(same && spv.exists()) {
        run_glslc(glslc, include, comp, v, spv);
    }
    std::fs::write(&stamp_path, stamp).expect("write the stamp");
    let bytes = std::fs::read(spv).expect("read SPIR-V");
    assert!(
        bytes.len().is_multiple_of(4),
        "SPIR-V of {} is not whole words",
        spv.display()
    );
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A hash of the files' contents, in order (the cache key of a module's sources).
fn hash_files(paths: &[&Path]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in paths {
        p.hash(&mut h);
        std::fs::read(p)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
            .hash(&mut h);
    }
    h.finish()
}

fn run_glslc(glslc: &str, include: &Path, comp: &Path, v: &Variant, spv: &Path) {
    let mut cmd = Command::new(glslc);
    cmd.arg("--target-env=vulkan1.2")
        .arg("-O")
        .arg("-fshader-stage=compute")
        .arg("-I")
        .arg(include)
        .args(&v.flags)
        .arg(comp)
        .arg("-o")
        .arg(spv);
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
}

/// The group module `name` is packed with: `stem.first_variant_part` (`matmul.q8_0` of
/// `matmul.q8_0.tb1.add`), or the whole name when it has fewer parts. The variants a
/// model of one weight type asks for are unpacked together.
fn group_of(name: &str) -> &str {
    match name.match_indices('.').nth(1) {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

/// zstd level of the packs: 19 is the last level before `--ultra` memory, and a pack is
/// recompressed only when its modules change (a stamp, like the modules').
const PACK_LEVEL: i32 = 19;

/// Compresses `bytes` (one group's modules, concatenated) into `zst`, reusing the file
/// when its stamp records the same contents and level.
fn pack(bytes: &[u8], zst: &Path) {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    let stamp = format!("zstd {PACK_LEVEL} long contents {:016x}", h.finish());
    let stamp_path = zst.with_extension("zst.stamp");
    let same = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    if same && zst.exists() {
        return;
    }
    let mut enc = zstd::bulk::Compressor::new(PACK_LEVEL).expect("zstd compressor");
    // a window over the whole group, so a variant finds its siblings' matching code
    let window_log = (u64::BITS - (bytes.len() as u64).leading_zeros()).clamp(10, 27);
    enc.window_log(window_log).expect("zstd window");
    enc.long_distance_matching(true).expect("zstd long mode");
    let frame = enc.compress(bytes).expect("zstd compress");
    std::fs::write(zst, frame).expect("write a pack");
    std::fs::write(&stamp_path, stamp).expect("write the pack's stamp");
}

/// One module to build: kernel ident, name, source, variant.
struct Job {
    ident: String,
    name: String,
    comp: PathBuf,
    variant: Variant,
    /// A hash of the shader's and every include's contents.
    sources: u64,
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

    let mut jobs: Vec<Job> = Vec::new();
    for comp in &comps {
        println!("cargo:rerun-if-changed={}", comp.display());
        let stem = comp
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 shader name");
        let mut files: Vec<&Path> = vec![comp.as_path()];
        files.extend(includes.iter().map(PathBuf::as_path));
        let sources = hash_files(&files);
        let vs = variants(stem);
        if vs.is_empty() {
            jobs.push(Job {
                ident: ident_of(stem),
                name: stem.to_string(),
                comp: comp.clone(),
                sources,
                variant: Variant {
                    name: String::new(),
                    flags: Vec::new(),
                },
            });
        }
        for v in vs {
            let name = format!("{stem}.{}", v.name);
            jobs.push(Job {
                ident: ident_of(&name),
                name,
                comp: comp.clone(),
                sources,
                variant: v,
            });
        }
    }

    // glslc per module, on every core (a hundred modules, up to seconds each)
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut words: Vec<Option<Vec<u32>>> = Vec::new();
    words.resize_with(jobs.len(), || None);
    let words = std::sync::Mutex::new(words);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let spv = out_dir.join(format!("{}.spv", job.name));
                let w = compile(&glslc, &include, &job.comp, &job.variant, &spv, job.sources);
                words.lock().expect("no panic while holding the lock")[i] = Some(w);
            });
        }
    });
    let words: Vec<Vec<u32>> = words
        .into_inner()
        .expect("no panic while holding the lock")
        .into_iter()
        .map(|w| w.expect("every module compiled"))
        .collect();

    // A variant's compiler drops the bindings it never reads, so a kernel's layout is the
    // union over every variant of its shader (all declare the same set 0).
    let mut layouts: std::collections::HashMap<&Path, Vec<bool>> = Default::default();
    for (j, w) in jobs.iter().zip(&words) {
        assert!(
            !samples_buffer_image(w),
            "{} (variant `{}`) declares a sampled image of a buffer: Mesa 25's SPIR-V checks \
             reject it; read weights through `textureBuffer`/`utextureBuffer` \
             (GL_EXT_samplerless_texture_functions) instead",
            j.comp.display(),
            j.variant.name
        );
        let kinds = texel_bindings(w);
        let l = layouts.entry(j.comp.as_path()).or_default();
        if l.len() < kinds.len() {
            l.resize(kinds.len(), false);
        }
        for (i, t) in kinds.into_iter().enumerate() {
            l[i] |= t;
        }
    }

    let mut gen = String::new();
    gen.push_str("/// Every compute kernel compiled from `shaders/` (one entry per variant).\n");
    gen.push_str("#[allow(non_camel_case_types)]\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n");
    for j in &jobs {
        let _ = writeln!(gen, "    /// `{}`\n    {},", j.name, j.ident);
    }
    gen.push_str("}\n\nimpl Kernel {\n    /// All kernels, in file order.\n");
    let _ = writeln!(gen, "    pub const ALL: &'static [Kernel] = &[");
    for j in &jobs {
        let _ = writeln!(gen, "        Kernel::{},", j.ident);
    }
    gen.push_str("    ];\n\n    /// `stem` or `stem.variant`.\n    pub fn name(self) -> &'static str {\n        match self {\n");
    for j in &jobs {
        let _ = writeln!(gen, "            Kernel::{} => \"{}\",", j.ident, j.name);
    }
    gen.push_str("        }\n    }\n\n    /// The kernel named `stem` or `stem.variant`, if it was built.\n    pub fn by_name(name: &str) -> Option<Kernel> {\n        match name {\n");
    for j in &jobs {
        let _ = writeln!(
            gen,
            "            \"{}\" => Some(Kernel::{}),",
            j.name, j.ident
        );
    }
    gen.push_str("            _ => None,\n        }\n    }\n\n    /// Bindings the shader declares in set 0 (highest `binding` + 1, read from the SPIR-V\n    /// of every variant of its source).\n    pub fn bindings(self) -> u32 {\n        match self {\n");
    for j in &jobs {
        let n = layouts[j.comp.as_path()].len();
        let _ = writeln!(gen, "            Kernel::{} => {n},", j.ident);
    }
    gen.push_str("        }\n    }\n\n    /// Descriptor type of each binding 0..bindings() (reflected from the SPIR-V of every\n    /// variant of its source).\n    pub fn descriptor_kinds(self) -> &'static [crate::DescriptorKind] {\n        use crate::DescriptorKind::{StorageBuffer as S, UniformTexelBuffer as T};\n        match self {\n");
    for j in &jobs {
        let kinds: Vec<&str> = layouts[j.comp.as_path()]
            .iter()
            .map(|&t| if t { "T" } else { "S" })
            .collect();
        let _ = writeln!(
            gen,
            "            Kernel::{} => &[{}],",
            j.ident,
            kinds.join(", ")
        );
    }
    // Packs in order of first appearance; each module's word range in its pack.
    let mut packs: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut placed: Vec<(usize, usize, usize)> = Vec::new();
    for (j, w) in jobs.iter().zip(&words) {
        let group = group_of(&j.name);
        let p = match packs.iter().position(|(g, _)| *g == group) {
            Some(p) => p,
            None => {
                packs.push((group, Vec::new()));
                packs.len() - 1
            }
        };
        let start = packs[p].1.len() / 4;
        packs[p].1.extend(w.iter().flat_map(|x| x.to_le_bytes()));
        placed.push((p, start, start + w.len()));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((group, bytes)) = packs.get(i) else {
                    break;
                };
                pack(bytes, &out_dir.join(format!("{group}.zst")));
            });
        }
    });

    gen.push_str("        }\n    }\n\n    /// The pack holding this kernel's module, and the module's word range in it.\n    fn packed(self) -> (usize, std::ops::Range<usize>) {\n        match self {\n");
    for (j, (p, start, end)) in jobs.iter().zip(&placed) {
        let _ = writeln!(
            gen,
            "            Kernel::{} => ({p}, {start}..{end}),",
            j.ident
        );
    }
    gen.push_str("        }\n    }\n}\n\n");
    let _ = writeln!(
        gen,
        "/// How many packs there are.\nconst PACK_COUNT: usize = {};\n",
        packs.len()
    );
    gen.push_str("/// The packs: a group's modules, concatenated, in one zstd frame.\nstatic PACKS: [Pack; PACK_COUNT] = [\n");
    for (group, bytes) in &packs {
        let zst = out_dir.join(format!("{group}.zst"));
        let _ = writeln!(
            gen,
            "    Pack {{ name: {group:?}, words: {}, zst: include_bytes!({:?}) }},",
            bytes.len() / 4,
            zst.display().to_string()
        );
    }
    gen.push_str("];\n");
    std::fs::write(out_dir.join("kernels.rs"), gen).expect("write kernels.rs");
}
