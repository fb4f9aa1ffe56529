//! `vkdecode convert`: rewrite a GGUF file with its weights requantised, tensor by
//! tensor as llama.cpp's `llama-quantize` would.
//!
//! `--type` names a single type (every quantisable tensor gets it, with llama-quantize
//! `--pure`'s fallback where a row is not whole blocks: Q4_K -> Q5_0, Q5_K -> Q5_1,
//! Q6_K -> Q8_0, Q3_K/Q2_K -> Q4_0) or a mix (`q4_k_m`, `q5_k_m`: llama-quantize's
//! per-tensor rules, see `gguf::quant::mix`). Each tensor is dequantised to f32 and
//! quantised with ggml's reference quantiser; a tensor already of its new type is
//! copied as it is (as llama-quantize does); tensors llama-quantize leaves alone (1-D,
//! norms) keep their type. All metadata is copied, `general.file_type` is set as
//! llama-quantize sets it and `general.alignment` to the chosen alignment. The output is
//! written to a file with no name in the same directory and named once complete, so no
//! signal, SIGKILL included, leaves a partial file; converting a file onto itself is
//! refused.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gguf::quant::mix::{self, Scheme, TensorDesc};
use gguf::quant::{can_dequantize, can_quantize};
use gguf::{GgmlType, Gguf, GgufFile, GgufWriter, TensorInfo, Value};

/// Target type (or mix) of `convert`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetType {
    /// 32-bit floats.
    #[value(name = "f32")]
    F32,
    /// 16-bit floats.
    #[value(name = "f16")]
    F16,
    /// 8-bit blocks of 32 with an f16 scale (34 bytes per 32 weights).
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32, symmetric (18 bytes per 32).
    #[value(name = "q4_0")]
    Q4_0,
    /// 4-bit blocks of 32 with a min (20 bytes per 32).
    #[value(name = "q4_1")]
    Q4_1,
    /// 5-bit blocks of 32, symmetric (22 bytes per 32).
    #[value(name = "q5_0")]
    Q5_0,
    /// 5-bit blocks of 32 with a min (24 bytes per 32).
    #[value(name = "q5_1")]
    Q5_1,
    /// 2-bit K-quant (84 bytes per 256; rows not a multiple of 256 fall back to Q4_0).
    #[value(name = "q2_k")]
    Q2K,
    /// 3-bit K-quant (110 bytes per 256; fallback Q4_0).
    #[value(name = "q3_k")]
    Q3K,
    /// 4-bit K-quant (144 bytes per 256; fallback Q5_0).
    #[value(name = "q4_k")]
    Q4K,
    /// 5-bit K-quant (176 bytes per 256; fallback Q5_1).
    #[value(name = "q5_k")]
    Q5K,
    /// 6-bit K-quant (210 bytes per 256; fallback Q8_0).
    #[value(name = "q6_k")]
    Q6K,
    /// llama-quantize's Q4_K_M mix: Q4_K, with Q6_K for the output (or tied embedding)
    /// and half the attn_v and ffn_down tensors.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama-quantize's Q5_K_M mix: as q4_k_m with Q5_K as the base.
    #[value(name = "q5_k_m")]
    Q5KM,
}

impl TargetType {
    fn scheme(self) -> Scheme {
        use GgmlType as G;
        match self {
            TargetType::F32 => Scheme::Pure(G::F32),
            TargetType::F16 => Scheme::Pure(G::F16),
            TargetType::Q8_0 => Scheme::Pure(G::Q8_0),
            TargetType::Q4_0 => Scheme::Pure(G::Q4_0),
            TargetType::Q4_1 => Scheme::Pure(G::Q4_1),
            TargetType::Q5_0 => Scheme::Pure(G::Q5_0),
            TargetType::Q5_1 => Scheme::Pure(G::Q5_1),
            TargetType::Q2K => Scheme::Pure(G::Q2_K),
            TargetType::Q3K => Scheme::Pure(G::Q3_K),
            TargetType::Q4K => Scheme::Pure(G::Q4_K),
            TargetType::Q5K => Scheme::Pure(G::Q5_K),
            TargetType::Q6K => Scheme::Pure(G::Q6_K),
            TargetType::Q4KM => Scheme::Q4KM,
            TargetType::Q5KM => Scheme::Q5KM,
        }
    }
}

/// Smallest `--align`: the GGUF spec asks for a multiple of 8 (the engine itself reads
/// tensors as 4-byte words).
const MIN_ALIGN: u64 = 8;
/// Largest `--align` (a u32 power of two).
const MAX_ALIGN: u64 = 1 << 31;

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input GGUF file.
    pub input: PathBuf,
    /// Output GGUF file (written beside it without a name, then named); must not be the
    /// input file.
    pub output: PathBuf,
    /// Type for every quantisable weight (single types as `llama-quantize --pure`), or
    /// a mix (q4_k_m, q5_k_m); 1-D tensors and norms keep their type.
    #[arg(long = "type", value_name = "TYPE", value_enum, default_value = "q8_0")]
    pub ty: TargetType,
    /// Alignment of the data section and of every tensor, in bytes: a power of two from
    /// 8 to 2^31 (4096 puts every tensor on a page boundary). Default: the input's
    /// alignment.
    #[arg(long)]
    pub align: Option<u64>,
}

/// Refuses an alignment the GGUF spec or the engine cannot use.
fn check_align(align: u64) -> Result<()> {
    if !align.is_power_of_two() || !(MIN_ALIGN..=MAX_ALIGN).contains(&align) {
        bail!(
            "--align {align} is not usable: the alignment must be a power of two from \
             {MIN_ALIGN} to 2^31 (GGUF asks for a multiple of 8; 32 is the default, 4096 \
             page-aligns every tensor)"
        );
    }
    Ok(())
}

/// Refuses to write over the input: the same device and inode, however the paths are
/// spelt (symlinks and hard links included). Refuses an output that exists and is not a
/// regular file too: the result is renamed into place, which would replace a device node
/// (`/dev/null`), a FIFO or a socket with a regular file.
fn check_output(input: &Path, output: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(out) = std::fs::metadata(output) else {
        return Ok(()); // no output yet (or unreachable: creating it will say so)
    };
    if !out.is_file() {
        bail!(
            "refusing to write to {}: it exists and is not a regular file (a directory, \
             device, FIFO or socket would be replaced by the converted file)",
            output.display()
        );
    }
    let inp = std::fs::metadata(input).with_context(|| format!("reading {}", input.display()))?;
    if (inp.dev(), inp.ino()) == (out.dev(), out.ino()) {
        bail!(
            "refusing to convert {} onto itself: {} is the same file (device {}, inode {}); \
             write to another path",
            input.display(),
            output.display(),
            inp.dev(),
            inp.ino()
        );
    }
    Ok(())
}

/// Refuses input whose tensors share bytes: converting each alias separately would
/// multiply the output (a file of aliases can claim far more tensor data than it holds).
fn check_no_aliasing(g: &Gguf, file_len: u64) -> Result<()> {
    let data = file_len.saturating_sub(g.data_offset);
    let claimed = g
        .tensors
        .iter()
        .map(|t| t.n_bytes())
        .try_fold(0u64, |a, b| a.checked_add(b))
        .unwrap_or(u64::MAX);
    if claimed > data {
        bail!(
            "the tensors claim {claimed} bytes but the data section holds {data}: tensor \
             data overlaps (aliased tensors), refusing to convert"
        );
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let start = std::time::Instant::now();
    check_output(&args.input, &args.output)?;
    let input =
        GgufFile::open(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let align = args.align.unwrap_or(input.gguf().alignment);
    check_align(align)?;
    check_no_aliasing(input.gguf(), input.bytes().len() as u64)?;
    let scheme = args.ty.scheme();
    let types = plan(input.gguf(), scheme);
    let writer = build(&input, &types, scheme, align)?;
    let bytes_written = write_atomically(&writer, &args.output)?;
    let changed = input
        .gguf()
        .tensors
        .iter()
        .zip(&types)
        .filter(|(t, ty)| t.ty != **ty)
        .count();
    let mut counts = std::collections::BTreeMap::new();
    for ty in &types {
        *counts.entry(ty.name()).or_insert(0usize) += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    errln!(
        "converted {} -> {}: {} tensors requantised, {} copied ({}), {} bytes, alignment {}, {:.2} s",
        args.input.display(),
        args.output.display(),
        changed,
        types.len() - changed,
        counts.join(", "),
        bytes_written,
        align,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The new type of every tensor (llama-quantize's choice for `scheme`).
fn plan(g: &Gguf, scheme: Scheme) -> Vec<GgmlType> {
    let arch = g.get_str("general.architecture").unwrap_or("llama");
    let n_layer = g
        .get(&format!("{arch}.block_count"))
        .and_then(|v| v.as_integer())
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0);
    let descs: Vec<TensorDesc<'_>> = g
        .tensors
        .iter()
        .map(|t| TensorDesc {
            name: &t.name,
            shape: &t.shape,
            ty: t.ty,
        })
        .collect();
    mix::plan(scheme, &descs, n_layer)
}

fn requantize(file: &GgufFile, t: &TensorInfo, target: GgmlType) -> Result<Vec<u8>> {
    if !can_dequantize(t.ty) {
        bail!("tensor '{}': cannot dequantise {} yet", t.name, t.ty);
    }
    if !can_quantize(target) {
        bail!("tensor '{}': no quantiser for {target}", t.name);
    }
    let n = usize::try_from(t.n_elements())?;
    let x = gguf::dequantize_row(t.ty, file.tensor_data(t), n)
        .with_context(|| format!("dequantising tensor '{}'", t.name))?;
    gguf::quant::quantize(target, &x).with_context(|| format!("quantising tensor '{}'", t.name))
}

/// Builds the converted file in memory. Tensors are requantised on every available core.
fn build(file: &GgufFile, types: &[GgmlType], scheme: Scheme, align: u64) -> Result<GgufWriter> {
    let g: &Gguf = file.gguf();
    let mut writer = GgufWriter::try_new(align)?;
    for (k, v) in &g.metadata {
        writer.add_metadata(k.clone(), v.clone());
    }
    writer.add_metadata("general.file_type", Value::U32(scheme.file_type()));
    writer.add_metadata(gguf::writer::ALIGNMENT_KEY, Value::U32(align as u32));

    // A shared counter hands out tensors to one thread per core; results keep file order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut results: Vec<Option<Result<Vec<u8>>>> = (0..g.tensors.len()).map(|_| None).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..threads {
            let tx = tx.clone();
            let next = &next;
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (Some(t), Some(&ty)) = (g.tensors.get(i), types.get(i)) else {
                    break;
                };
                let out = if ty != t.ty {
                    requantize(file, t, ty)
                } else {
                    Ok(file.tensor_data(t).to_vec())
                };
                if tx.send((i, out)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, out) in rx {
            results[i] = Some(out);
        }
    });
    for ((t, out), &ty) in g.tensors.iter().zip(results).zip(types) {
        let data = out.context("a conversion thread stopped early")??;
        writer
            .add_tensor(t.name.clone(), ty, &t.shape, data)
            .with_context(|| format!("adding tensor '{}'", t.name))?;
    }
    Ok(writer)
}

/// From now on SIGINT, SIGTERM or SIGHUP removes `tmp` (a partial or not yet renamed
/// output) and ends the process with 128 + the signal, so an interrupted conversion
/// leaves nothing behind.
fn remove_on_signal(tmp: PathBuf) -> Result<()> {
    crate::signals::catch().context("installing the signal handlers")?;
    std::thread::spawn(move || loop {
        if let Some(sig) = crate::signals::TERMINATION
            .into_iter()
            .find(|&s| crate::signals::count(s) > 0)
        {
            let _ = std::fs::remove_file(&tmp);
            std::process::exit(128 + sig);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    });
    Ok(())
}

/// What a temporary output beside `name` is called: `.<name>.tmp-<pid>`, with `name`
/// cut to 200 bytes so that the whole stays within the 255 bytes a file name may have
/// (an output named with 250 could not be replaced).
fn tmp_prefix(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    let cut = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]);
    format!(".{cut}.tmp-")
}

/// Removes the temporary outputs for `name` in `dir` whose process is gone: what a
/// SIGKILLed convert on a filesystem without unnamed files left behind.
fn remove_stale(dir: &Path, name: &std::ffi::OsStr) {
    let prefix = tmp_prefix(name);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = !Path::new("/proc").join(pid.to_string()).exists();
        if gone && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Writes `writer` to `out` so that no partial output is ever seen or left, even after
/// SIGKILL: into a file with no name in `out`'s directory, named once complete (see
/// `unnamed_file`). A failure leaves any existing `out` untouched. Where the filesystem
/// has no unnamed files, the output is written to `<dir>/.<name>.tmp-<pid>` and renamed
/// over `out`: SIGKILL then leaves that file, and the next convert to `out` removes it.
/// Returns the bytes written.
fn write_atomically(writer: &GgufWriter, out: &Path) -> Result<u64> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .with_context(|| format!("output path {} has no file name", out.display()))?;
    let tmp = dir.join(format!("{}{}", tmp_prefix(name), std::process::id()));
    remove_stale(&dir, name);
    remove_on_signal(tmp.clone())?;
    let result = (|| -> Result<u64> {
        let unnamed = crate::unnamed_file::create(&dir)
            .with_context(|| format!("creating the output in {}", dir.display()))?;
        let named = unnamed.is_none();
        let f = match unnamed {
            Some(f) => f,
            None => File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
        };
        let mut w = BufWriter::with_capacity(1 << 20, f);
        writer
            .write_to(&mut w)
            .with_context(|| format!("writing {}", out.display()))?;
        let f = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", out.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", out.display()))?;
        let len = f.metadata()?.len();
        if !named {
            match crate::unnamed_file::link(&f, out) {
                Ok(()) => return Ok(len),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // a file of a dead process that had our id (ids are reused)
                    let _ = std::fs::remove_file(&tmp);
                    crate::unnamed_file::link(&f, &tmp)
                        .with_context(|| format!("naming the output {}", tmp.display()))?;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("naming the output {}", out.display()))
                }
            }
        }
        std::fs::rename(&tmp, out)
            .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
        Ok(len)
    })();
    match result {
        Ok(len) => Ok(len),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where unnamed files cannot be made, a SIGKILLed convert leaves `.<name>.tmp-<pid>`;
    /// the next convert to the same output removes it once its process is gone, and
    /// nothing else.
    #[test]
    fn stale_temporary_outputs_of_dead_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("vkdecode-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = std::ffi::OsStr::new("out.gguf");
        // above any pid_max (2^22): never a live process
        let dead = dir.join(".out.gguf.tmp-4194305");
        let alive = dir.join(format!(".out.gguf.tmp-{}", std::process::id()));
        let other = dir.join(".other.gguf.tmp-4194305");
        let odd = dir.join(".out.gguf.tmp-x");
        for p in [&dead, &alive, &other, &odd] {
            std::fs::write(p, b"partial").unwrap();
        }
        remove_stale(&dir, name);
        assert!(!dead.exists());
        assert!(alive.exists() && other.exists() && odd.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The output has no name until it is complete, and then replaces an existing file.
    #[test]
    fn the_output_is_named_only_when_complete() {
        let dir = std::env::temp_dir().join(format!("vkdecode-named-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out.gguf");
        let mut w = GgufWriter::new(32);
        w.add_metadata("general.architecture", Value::String("llama".into()));
        let n = write_atomically(&w, &out).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), n);
        std::fs::write(&out, b"old").unwrap();
        let n = write_atomically(&w, &out).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), n);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("out.gguf")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An output whose name has the longest length a file name may have is written, and
    /// replaced: the temporary name beside it was 10 bytes longer, too long.
    #[test]
    fn an_output_with_the_longest_name_is_replaced() {
        let dir = std::env::temp_dir().join(format!("vkdecode-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("L".repeat(255));
        let w = GgufWriter::new(32);
        std::fs::write(&out, b"old").unwrap();
        let n = write_atomically(&w, &out).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), n);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
