//! `vkdecode convert`: rewrite a GGUF file with its 2-D weights requantised to Q8_0.
//!
//! Every 2-D tensor is dequantised to f32 and quantised with ggml's reference Q8_0
//! rounding, so the tensor bytes match `llama-quantize --allow-requantize ... Q8_0`;
//! tensors already in Q8_0 are copied as they are (as llama-quantize does); 1-D tensors
//! (norms) keep their type. All metadata is copied, `general.file_type` is set to 7
//! (MOSTLY_Q8_0) and `general.alignment` to the chosen alignment. The output is written
//! to a temporary file in the same directory and renamed into place.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gguf::quant::{can_dequantize, quantize_q8_0};
use gguf::{GgmlType, Gguf, GgufFile, GgufWriter, TensorInfo, Value, FILE_TYPE_MOSTLY_Q8_0};

/// Target type of `convert`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetType {
    /// 8-bit blocks of 32 with an f16 scale (34 bytes per 32 weights).
    #[value(name = "q8_0")]
    Q8_0,
}

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input GGUF file.
    pub input: PathBuf,
    /// Output GGUF file (written to a temporary name beside it, then renamed).
    pub output: PathBuf,
    /// Type for every 2-D weight; 1-D tensors keep their type.
    #[arg(long = "type", value_name = "TYPE", value_enum, default_value = "q8_0")]
    pub ty: TargetType,
    /// Alignment of the data section and of every tensor, in bytes (a power of two;
    /// 4096 puts every tensor on a page boundary). Default: the input's alignment.
    #[arg(long)]
    pub align: Option<u64>,
}

pub fn run(args: Args) -> Result<()> {
    let start = std::time::Instant::now();
    let input =
        GgufFile::open(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let align = args.align.unwrap_or(input.gguf().alignment);
    if !align.is_power_of_two() || align > 1 << 31 {
        bail!("--align {align} is not a power of two between 1 and 2^31");
    }
    let target = match args.ty {
        TargetType::Q8_0 => GgmlType::Q8_0,
    };
    let writer = build(&input, target, align)?;
    let bytes_written = write_atomically(&writer, &args.output)?;
    let requantized = input
        .gguf()
        .tensors
        .iter()
        .filter(|t| converts(t, target))
        .count();
    eprintln!(
        "converted {} -> {}: {} tensors requantised to {}, {} copied, {} bytes, alignment {}, {:.2} s",
        args.input.display(),
        args.output.display(),
        requantized,
        target,
        input.gguf().tensors.len() - requantized,
        bytes_written,
        align,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Whether `t` becomes `target`: 2-D tensors whose rows are whole target blocks and are
/// not already of the target type.
fn converts(t: &TensorInfo, target: GgmlType) -> bool {
    t.shape.len() == 2 && t.ty != target && t.row_len().is_multiple_of(target.block_size() as u64)
}

fn requantize(file: &GgufFile, t: &TensorInfo, target: GgmlType) -> Result<Vec<u8>> {
    if !can_dequantize(t.ty) {
        bail!("tensor '{}': cannot dequantise {} yet", t.name, t.ty);
    }
    let n = usize::try_from(t.n_elements())?;
    let x = gguf::dequantize_row(t.ty, file.tensor_data(t), n)
        .with_context(|| format!("dequantising tensor '{}'", t.name))?;
    match target {
        GgmlType::Q8_0 => Ok(quantize_q8_0(&x)?),
        other => bail!("no quantiser for {other}"),
    }
}

/// Builds the converted file in memory. Tensors are requantised on every available core.
fn build(file: &GgufFile, target: GgmlType, align: u64) -> Result<GgufWriter> {
    let g: &Gguf = file.gguf();
    let mut writer = GgufWriter::try_new(align)?;
    for (k, v) in &g.metadata {
        writer.add_metadata(k.clone(), v.clone());
    }
    writer.add_metadata("general.file_type", Value::U32(FILE_TYPE_MOSTLY_Q8_0));
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
                let Some(t) = g.tensors.get(i) else { break };
                let out = if converts(t, target) {
                    requantize(file, t, target)
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
    for (t, out) in g.tensors.iter().zip(results) {
        let data = out.context("a conversion thread stopped early")??;
        let ty = if converts(t, target) { target } else { t.ty };
        writer
            .add_tensor(t.name.clone(), ty, &t.shape, data)
            .with_context(|| format!("adding tensor '{}'", t.name))?;
    }
    Ok(writer)
}

/// Writes to `<dir>/.<name>.tmp-<pid>` then renames over `out`, so a failure leaves any
/// existing `out` untouched and no partial file behind. Returns the bytes written.
fn write_atomically(writer: &GgufWriter, out: &Path) -> Result<u64> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .with_context(|| format!("output path {} has no file name", out.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<u64> {
        let f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        writer
            .write_to(&mut w)
            .with_context(|| format!("writing {}", tmp.display()))?;
        let f = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        let len = f.metadata()?.len();
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
