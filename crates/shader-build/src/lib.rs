//! shader-build: the build-script half of vkdecode's kernels, generic over what they are.
//!
//! A build script hands [`build`] a list of [`Module`]s (a `.comp` file and the `-D`
//! defines of one build-time variant); this crate compiles each with `glslc`, checks and
//! reflects the SPIR-V, packs the modules into zstd frames and writes a Rust file that
//! declares them as `vk::Shader` values. Which variants exist is the caller's business
//! (the engine's kernel registry): nothing here knows a weight type or an epilogue.
//!
//! - Compiling: one `glslc` per module, on every core. A module built from the same
//!   sources (a hash of the shader and every include) with the same compiler and flags,
//!   as its `.stamp` file records, is reused, so editing one shader does not recompile
//!   the others. Contents, not times: a build directory copied from another checkout
//!   holds modules newer than sources they were not built from.
//! - Sharing: every module and pack is also kept in `<target dir>/shader-cache`, named by
//!   the hash of its stamp. Cargo gives a build script a new `OUT_DIR` whenever the
//!   features of its build dependencies differ, and the project's builds differ that way
//!   (`models/fetch` builds `-p vkdecode` for its conversion; clippy and the tests build
//!   the whole workspace with its dev-dependencies): each unit found an empty `OUT_DIR`
//!   and compiled every module again, four minutes on 2 cores. Through the cache a second
//!   unit copies what the first compiled.
//! - Checking: no module may declare an `OpTypeSampledImage` of a `Dim Buffer` image
//!   (what `samplerBuffer` compiles to): newer SPIR-V validators, Mesa 25's among them,
//!   reject it, and `spirv-val` 2023.1 at vulkan1.2 does not catch it.
//! - Reflecting: the descriptor type of every binding of set 0. A variant's compiler
//!   drops the bindings it never reads, so a shader's layout is the union over all of its
//!   variants (one descriptor set serves every variant of a dispatch).
//! - Packing: one zstd frame per group of modules ([`group_of`]: the stem and first
//!   variant part, `matmul.q8_0`), since the variants of one shader share most of their
//!   bytes and compress together to a sixth, where each alone only shrinks to two
//!   sevenths. `vk::Shader::spirv` unpacks its group when a pipeline is created from it
//!   and keeps nothing, so a model unpacks only the weight types it has, once per pipeline.
//!
//! `GLSLC` overrides the compiler's path.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One SPIR-V module to build.
#[derive(Clone, Debug)]
pub struct Module {
    /// `stem` or `stem.variant.parts` (pipeline errors and `VKDECODE_SPIRV_DIR` files
    /// name it; [`group_of`] packs by it).
    pub name: String,
    /// The `.comp` file.
    pub source: PathBuf,
    /// Preprocessor defines, without `-D` (`WTYPE_Q8_0`, `TB=4`).
    pub defines: Vec<String>,
}

/// The `.comp` files in `dir`, sorted, and the files of `dir/include`; tells cargo to
/// rerun the build script when any of them (or the directories) change.
pub fn sources(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let list = |d: &Path, ext: Option<&str>| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.retain(|p| ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)));
        v.sort();
        v
    };
    let include = dir.join("include");
    let comps = list(dir, Some("comp"));
    let includes = if include.is_dir() {
        list(&include, None)
    } else {
        Vec::new()
    };
    for p in watched(dir, &comps, &includes) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    (comps, includes)
}

/// What cargo watches for [`sources`]: `dir`, its `include` directory where there is one,
/// and every file. Only paths that exist: cargo takes a missing one as changed on every
/// build, which reran the build script and rebuilt every crate above it (and relinked
/// every test binary) on each cargo command.
fn watched(dir: &Path, comps: &[PathBuf], includes: &[PathBuf]) -> Vec<PathBuf> {
    let include = dir.join("include");
    let mut v = vec![dir.to_path_buf()];
    if include.is_dir() {
        v.push(include);
    }
    v.extend(comps.iter().chain(includes).cloned());
    v
}

/// Compiles `modules` (their `.comp` files may include from `include`), packs them, and
/// writes `OUT_DIR/<rs_file>`: a private `PACKS` array and
/// `pub(crate) static SHADERS: [<vk>::Shader; N]`, one entry per module in the order
/// given, where `<vk>` is the path of the vk crate from the including crate (`crate`
/// inside vk itself, `vk` elsewhere). Panics with the compiler's message on any error:
/// a build script has no one else to tell.
pub fn build(include: &Path, includes: &[PathBuf], modules: &[Module], vk: &str, rs_file: &str) {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let glslc = std::env::var("GLSLC").unwrap_or_else(|_| "glslc".to_string());
    println!("cargo:rerun-if-env-changed=GLSLC");
    let cache = shared_cache(&out_dir);
    let cache = cache.as_deref();

    let mut hashes: HashMap<&Path, u64> = HashMap::new();
    for m in modules {
        hashes.entry(m.source.as_path()).or_insert_with(|| {
            let mut files: Vec<&Path> = vec![m.source.as_path()];
            files.extend(includes.iter().map(PathBuf::as_path));
            hash_files(&files)
        });
    }

    // glslc per module, on every core (hundreds of modules, up to seconds each)
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicUsize::new(0);
    let words: Mutex<Vec<Option<Vec<u32>>>> = Mutex::new(vec![None; modules.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(m) = modules.get(i) else { break };
                let spv = out_dir.join(format!("{}.spv", m.name));
                let w = compile(&glslc, include, m, &spv, hashes[m.source.as_path()], cache);
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

    let mut layouts: HashMap<&Path, Vec<bool>> = HashMap::new();
    for (m, w) in modules.iter().zip(&words) {
        assert!(
            !samples_buffer_image(w),
            "{} (`{}`) declares a sampled image of a buffer: Mesa 25's SPIR-V checks reject \
             it; read through `textureBuffer`/`utextureBuffer` \
             (GL_EXT_samplerless_texture_functions) instead",
            m.source.display(),
            m.name
        );
        let kinds = texel_bindings(w);
        let l = layouts.entry(m.source.as_path()).or_default();
        if l.len() < kinds.len() {
            l.resize(kinds.len(), false);
        }
        for (i, t) in kinds.into_iter().enumerate() {
            l[i] |= t;
        }
    }

    // Packs in order of first appearance; each module's word range in its pack.
    let mut packs: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut placed: Vec<(usize, usize, usize)> = Vec::new();
    for (m, w) in modules.iter().zip(&words) {
        let group = group_of(&m.name);
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
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((group, bytes)) = packs.get(i) else {
                    break;
                };
                pack(bytes, &out_dir.join(format!("{group}.zst")), cache);
            });
        }
    });

    let mut gen = String::new();
    gen.push_str(
        "// Generated by shader-build: the packs of SPIR-V modules and one Shader each.\n\n",
    );
    let _ = writeln!(
        gen,
        "/// The packs: a group's modules, concatenated, in one zstd frame.\nstatic PACKS: [{vk}::ShaderPack; {}] = [",
        packs.len()
    );
    for (group, bytes) in &packs {
        let zst = out_dir.join(format!("{group}.zst"));
        let _ = writeln!(
            gen,
            "    {vk}::ShaderPack::new({group:?}, {}, include_bytes!({:?})),",
            bytes.len() / 4,
            zst.display().to_string()
        );
    }
    gen.push_str("];\n\n");
    let _ = writeln!(
        gen,
        "/// Every module built, in the order the build script listed them.\npub(crate) static SHADERS: [{vk}::Shader; {}] = [",
        modules.len()
    );
    for (m, (p, start, end)) in modules.iter().zip(&placed) {
        let kinds: Vec<String> = layouts[m.source.as_path()]
            .iter()
            .map(|&t| {
                let k = if t {
                    "UniformTexelBuffer"
                } else {
                    "StorageBuffer"
                };
                format!("{vk}::DescriptorKind::{k}")
            })
            .collect();
        let _ = writeln!(
            gen,
            "    {vk}::Shader::new({:?}, &[{}], &PACKS[{p}], {start}, {end}),",
            m.name,
            kinds.join(", ")
        );
    }
    gen.push_str("];\n");
    std::fs::write(out_dir.join(rs_file), gen).expect("write the shader table");
}

/// The group module `name` is packed with: `stem.first_variant_part` (`matmul.q8_0` of
/// `matmul.q8_0.tb1.add`), or the whole name when it has fewer parts. The variants a
/// model of one weight type asks for are unpacked together.
pub fn group_of(name: &str) -> &str {
    match name.match_indices('.').nth(1) {
        Some((i, _)) => &name[..i],
        None => name,
    }
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

/// Per binding 0..=highest: `true` for a texel buffer (`textureBuffer`: an image of
/// dimension Buffer, possibly wrapped in a sampled image), `false` for anything else
/// (storage buffers). Read from OpDecorate/OpVariable/OpTypePointer/OpType*Image.
fn texel_bindings(words: &[u32]) -> Vec<bool> {
    let mut binding_of: HashMap<u32, u32> = HashMap::new();
    let mut var_type: HashMap<u32, u32> = HashMap::new();
    let mut pointee: HashMap<u32, u32> = HashMap::new();
    let mut sampled_image: HashMap<u32, u32> = HashMap::new();
    let mut buffer_images: HashSet<u32> = HashSet::new();
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
    let n = binding_of
        .values()
        .map(|b| *b as usize + 1)
        .max()
        .unwrap_or(0);
    let mut out = vec![false; n];
    for (var, b) in binding_of {
        let Some(ty) = var_type.get(&var).and_then(|p| pointee.get(p)) else {
            continue;
        };
        let image = sampled_image.get(ty).copied().unwrap_or(*ty);
        if buffer_images.contains(&image) {
            out[b as usize] = true;
        }
    }
    out
}

/// Whether the module declares an `OpTypeSampledImage` of a `Dim Buffer` image.
fn samples_buffer_image(words: &[u32]) -> bool {
    let buffer_images: HashSet<u32> = instructions(words)
        .filter(|(op, w)| *op == OP_TYPE_IMAGE && w.len() >= 3 && w[2] == DIM_BUFFER)
        .map(|(_, w)| w[0])
        .collect();
    instructions(words)
        .any(|(op, w)| op == OP_TYPE_SAMPLED_IMAGE && w.len() >= 2 && buffer_images.contains(&w[1]))
}

/// Compiles `m` to `spv` unless its stamp shows the same sources, compiler and flags
/// (or the shared cache holds the module of that stamp), and returns its words.
fn compile(
    glslc: &str,
    include: &Path,
    m: &Module,
    spv: &Path,
    sources: u64,
    cache: Option<&Path>,
) -> Vec<u32> {
    let flags: Vec<String> = m.defines.iter().map(|d| format!("-D{d}")).collect();
    let stamp = format!("{glslc} {} sources {sources:016x}", flags.join(" "));
    let stamp_path = spv.with_extension("stamp");
    let same = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    let built = (same && spv.exists()) || from_cache(cache, &m.name, "spv", &stamp, spv);
    if !built {
        run_glslc(glslc, include, m, &flags, spv);
    }
    keep(cache, &m.name, "spv", &stamp, spv);
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

/// A hash of `x` (the key of a pack's contents and of a cache entry's stamp).
fn hash_of(x: &(impl std::hash::Hash + ?Sized)) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
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

fn run_glslc(glslc: &str, include: &Path, m: &Module, flags: &[String], spv: &Path) {
    let mut cmd = Command::new(glslc);
    cmd.arg("--target-env=vulkan1.2")
        .arg("-O")
        .arg("-fshader-stage=compute")
        .arg("-I")
        .arg(include)
        .args(flags)
        .arg(&m.source)
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
            "glslc failed on {} (`{}`):\n{}{}",
            m.source.display(),
            m.name,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// zstd level of the packs: 19 is the last level before `--ultra` memory, and a pack is
/// recompressed only when its modules change (a stamp, like the modules').
const PACK_LEVEL: i32 = 19;

/// Compresses `bytes` (one group's modules, concatenated) into `zst`, reusing the file
/// when its stamp records the same contents and level.
fn pack(bytes: &[u8], zst: &Path, cache: Option<&Path>) {
    let stamp = format!("zstd {PACK_LEVEL} long contents {:016x}", hash_of(bytes));
    let stamp_path = zst.with_extension("zst.stamp");
    let same = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    let group = zst.file_stem().and_then(|s| s.to_str()).unwrap_or("pack");
    if same && zst.exists() {
        keep(cache, group, "zst", &stamp, zst);
        return;
    }
    if from_cache(cache, group, "zst", &stamp, zst) {
        std::fs::write(&stamp_path, stamp).expect("write the pack's stamp");
        return;
    }
    let mut enc = zstd::bulk::Compressor::new(PACK_LEVEL).expect("zstd compressor");
    // a window over the whole group, so a variant finds its siblings' matching code
    let window_log = (u64::BITS - (bytes.len() as u64).leading_zeros()).clamp(10, 27);
    enc.window_log(window_log).expect("zstd window");
    enc.long_distance_matching(true).expect("zstd long mode");
    let frame = enc.compress(bytes).expect("zstd compress");
    std::fs::write(zst, frame).expect("write a pack");
    keep(cache, group, "zst", &stamp, zst);
    std::fs::write(&stamp_path, stamp).expect("write the pack's stamp");
}

/// The directory shared by every build-script unit of one target directory:
/// `<target dir>/shader-cache`, found from `OUT_DIR` (`<target dir>/<profile>/build/
/// <unit>/out`, or with a target triple between). `None` (no sharing, nothing breaks)
/// when `OUT_DIR` is laid out otherwise or the directory cannot be made.
fn shared_cache(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir.parent()?.parent()?;
    if build.file_name()? != "build" {
        return None;
    }
    let mut target = build.parent()?.parent()?;
    if !target.join("CACHEDIR.TAG").exists() {
        // a target triple's directory: its parent is the target directory
        target = target
            .parent()
            .filter(|t| t.join("CACHEDIR.TAG").exists())?;
    }
    let dir = target.join("shader-cache");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// The cache's file for `name` built as `stamp`: `<name>.<hash of stamp>.<ext>`.
fn cache_entry(cache: &Path, name: &str, ext: &str, stamp: &str) -> PathBuf {
    cache.join(format!("{name}.{:016x}.{ext}", hash_of(stamp)))
}

/// Copies the cached file of `name` built as `stamp` to `out`; false when there is none.
fn from_cache(cache: Option<&Path>, name: &str, ext: &str, stamp: &str, out: &Path) -> bool {
    cache.is_some_and(|c| std::fs::copy(cache_entry(c, name, ext, stamp), out).is_ok())
}

/// Keeps `built` (the file of `name` built as `stamp`) in the cache unless it is there,
/// replacing the entries of `name` built from other sources (so that editing a shader
/// does not pile up modules). Written under a temporary name and renamed, so a build
/// script that runs beside this one reads a whole file or none. Best effort: the cache
/// is only a shortcut.
fn keep(cache: Option<&Path>, name: &str, ext: &str, stamp: &str, built: &Path) {
    let Some(cache) = cache else { return };
    let entry = cache_entry(cache, name, ext, stamp);
    if entry.exists() {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(cache) {
        let prefix = format!("{name}.");
        let suffix = format!(".{ext}");
        for e in rd.flatten() {
            let file = e.file_name();
            let Some(f) = file.to_str() else { continue };
            let stale = f
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(&suffix))
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if stale && e.path() != entry {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let tmp = entry.with_extension(format!("{ext}.{}.tmp", std::process::id()));
    let stored = std::fs::copy(built, &tmp).is_ok() && std::fs::rename(&tmp, &entry).is_ok();
    if !stored {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path cargo is told to watch exists (a missing one would rerun the build
    /// script on every build), with and without an include directory.
    #[test]
    fn only_existing_paths_are_watched() {
        let root = std::env::temp_dir().join(format!("shader-build-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.comp"), "#version 450\nvoid main() {}\n").unwrap();
        let comps = vec![root.join("a.comp")];
        let w = watched(&root, &comps, &[]);
        assert_eq!(w, vec![root.clone(), root.join("a.comp")]);
        std::fs::create_dir_all(root.join("include")).unwrap();
        std::fs::write(root.join("include/b.glsl"), "").unwrap();
        let w = watched(&root, &comps, &[root.join("include/b.glsl")]);
        assert!(w.contains(&root.join("include")), "{w:?}");
        assert!(w.iter().all(|p| p.exists()), "{w:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn groups_are_the_stem_and_first_variant_part() {
        assert_eq!(group_of("matmul.q8_0.tb1.add"), "matmul.q8_0");
        assert_eq!(group_of("embed.q4_k"), "embed.q4_k");
        assert_eq!(group_of("argmax"), "argmax");
    }

    /// A hand-written module: binding 0 a storage buffer, binding 2 a texel buffer
    /// wrapped in a sampled image (binding 1 unused).
    fn module(sampled: bool) -> Vec<u32> {
        let op = |code: u32, operands: &[u32]| {
            let mut v = vec![((operands.len() as u32 + 1) << 16) | code];
            v.extend_from_slice(operands);
            v
        };
        let mut w = vec![0x0723_0203, 0x0001_0500, 0, 100, 0];
        w.extend(op(OP_DECORATE, &[10, DECORATION_BINDING, 0]));
        w.extend(op(OP_DECORATE, &[20, DECORATION_BINDING, 2]));
        // %1 = struct (stand-in), %2 = ptr to %1, %10 = var %2
        w.extend(op(OP_TYPE_POINTER, &[2, 12, 1]));
        w.extend(op(OP_VARIABLE, &[2, 10, 12]));
        // %3 = image Dim Buffer, %4 = sampled image of %3 (or %3 itself), %5 = ptr, %20 = var
        w.extend(op(OP_TYPE_IMAGE, &[3, 6, DIM_BUFFER, 0, 0, 0, 1, 0]));
        let ty = if sampled {
            w.extend(op(OP_TYPE_SAMPLED_IMAGE, &[4, 3]));
            4
        } else {
            3
        };
        w.extend(op(OP_TYPE_POINTER, &[5, 0, ty]));
        w.extend(op(OP_VARIABLE, &[5, 20, 0]));
        w
    }

    /// A module compiled under one build-script unit's `OUT_DIR` is copied from the
    /// shared cache into another unit's instead of being compiled again; a module built
    /// from other sources is compiled and replaces the old entry. The compiler is a script
    /// that logs each call and writes a fixed module.
    #[test]
    fn a_second_unit_reuses_the_modules_of_the_first() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("shader-build-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let target = root.join("target");
        let units = [1, 2].map(|u| target.join(format!("release/build/engine-{u}/out")));
        for u in &units {
            std::fs::create_dir_all(u).unwrap();
        }
        std::fs::write(target.join("CACHEDIR.TAG"), "").unwrap();
        let words = module(false);
        let fixed = root.join("fixed.spv");
        std::fs::write(
            &fixed,
            words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        let log = root.join("calls");
        let glslc = root.join("glslc");
        std::fs::write(
            &glslc,
            format!(
                "#!/bin/sh\necho call >> {log}\nwhile [ $# -gt 1 ]; do [ \"$1\" = -o ] && out=$2; shift; done\ncp {fixed} \"$out\"\n",
                log = log.display(),
                fixed = fixed.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&glslc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let glslc = glslc.to_str().unwrap();
        let calls = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .count()
        };
        let m = Module {
            name: "matmul.q8_0".into(),
            source: root.join("matmul.comp"),
            defines: vec!["WTYPE_Q8_0".into()],
        };
        let cache = shared_cache(&units[0]).expect("a cache beside the target directory");
        assert_eq!(cache, target.join("shader-cache"));
        assert_eq!(shared_cache(&units[1]).as_deref(), Some(cache.as_path()));
        let spv = |u: usize| units[u].join("matmul.q8_0.spv");

        assert_eq!(compile(glslc, &root, &m, &spv(0), 1, Some(&cache)), words);
        assert_eq!(calls(), 1);
        assert_eq!(compile(glslc, &root, &m, &spv(1), 1, Some(&cache)), words);
        assert_eq!(calls(), 1, "the second unit compiled the module again");
        assert!(spv(1).exists());
        // the same unit again: its own stamp, no compiler either
        compile(glslc, &root, &m, &spv(1), 1, Some(&cache));
        assert_eq!(calls(), 1);
        // other sources: compiled, and the cache holds the new module only
        compile(glslc, &root, &m, &spv(1), 2, Some(&cache));
        assert_eq!(calls(), 2);
        let entries: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        // without a target directory's layout there is no cache, and nothing breaks
        assert_eq!(shared_cache(&root.join("elsewhere/out")), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn reflection_reads_storage_and_texel_bindings() {
        for sampled in [false, true] {
            let w = module(sampled);
            assert_eq!(texel_bindings(&w), vec![false, false, true]);
            assert_eq!(samples_buffer_image(&w), sampled);
        }
        // a truncated instruction stops the walk instead of reading past the end
        let mut w = module(false);
        w.push(0xFFFF_0000 | OP_DECORATE);
        assert_eq!(texel_bindings(&w), vec![false, false, true]);
    }
}
