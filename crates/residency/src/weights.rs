//! `Weights::load`: plan, then import (file pages, else anonymous memory) or copy each
//! shard, and build the tensor views.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gguf::GgufFile;
use vk::checksum::{self, ChecksumPush};
use vk::{
    Buffer, BufferBinding, BufferDesc, BufferRef, CommandBuffer, Context, ImportedBuffer,
    MemLocation,
};

use memmap2::MmapMut;

use super::stamp::{FileChanged, FileStamp};
use super::sys;
use super::{
    auto_decision, plan_for, Faults, ResidencyOptions, ResidencyReport, ShardPlan, ShardReport,
    TensorView, ViewPart, WeightsMode,
};
use crate::ResidencyError;

/// Largest staging buffer alive during a copy load.
const STAGING_MAX: u64 = 64 << 20;
/// Copies at least this large report progress every 10%.
const PROGRESS_MIN: u64 = 256 << 20;
/// Below this share of the file in the page cache, load warns.
const LOW_RESIDENCY: f64 = 0.5;

/// What holds one shard's bytes on the GPU (an import holds the memory it reads).
enum Backing {
    File(ImportedBuffer),
    Anon(ImportedBuffer),
    Copy(Buffer),
}

impl Backing {
    fn buffer_ref(&self) -> BufferRef {
        match self {
            Backing::File(b) | Backing::Anon(b) => b.buffer_ref(),
            Backing::Copy(b) => b.buffer_ref(),
        }
    }
}

/// The mapped file pinned in memory (`--mlock`) until dropped; memmap2's lock/unlock.
struct Mlock(Arc<GgufFile>);

impl Mlock {
    fn new(file: &Arc<GgufFile>) -> std::io::Result<Mlock> {
        file.mmap().lock()?;
        Ok(Mlock(Arc::clone(file)))
    }
}

impl Drop for Mlock {
    fn drop(&mut self) {
        if let Err(e) = self.0.mmap().unlock() {
            tracing::warn!("munlock of the model file: {e}");
        }
    }
}

/// The model's tensors on the GPU.
///
/// Field order is drop order: GPU buffers go first, then the mlock, then the mapping
/// (`file`), so every import is released before the pages it reads are unmapped.
pub struct Weights {
    views: Vec<TensorView>,
    index: HashMap<String, usize>,
    /// Owns the GPU side of every view (never read, only kept alive).
    _shards: Vec<Backing>,
    plan: ShardPlan,
    report: ResidencyReport,
    _mlock: Option<Mlock>,
    ctx: Arc<Context>,
    file: Arc<GgufFile>,
    /// The mapped file's size and modification time at load (`None`: not watched).
    stamp: Option<FileStamp>,
}

impl Weights {
    /// Loads every tensor of `file` onto the device of `ctx` (faults from `VKDECODE_FAULT`).
    pub fn load(
        ctx: &Arc<Context>,
        file: Arc<GgufFile>,
        opts: &ResidencyOptions,
    ) -> Result<Weights, ResidencyError> {
        let faults = Faults::from_env()?;
        Weights::load_with_faults(ctx, file, opts, faults)
    }

    /// [`Weights::load`] with explicit simulated refusals (tests).
    pub fn load_with_faults(
        ctx: &Arc<Context>,
        file: Arc<GgufFile>,
        opts: &ResidencyOptions,
        faults: Faults,
    ) -> Result<Weights, ResidencyError> {
        let model_bytes = file.bytes().len() as u64;
        let span = tracing::info_span!("load", mode = %opts.mode, bytes = model_bytes);
        let _enter = span.enter();
        let t0 = Instant::now();
        let caps = ctx.caps();
        // The file as it is now, to notice a rewrite later. Not watched when the path is
        // gone (removed after mapping: the mapping stays valid) or names a file of
        // another size (most likely replaced by rename since it was mapped).
        let stamp = match FileStamp::take(file.path()) {
            Ok(st) if st.len() == model_bytes => Some(st),
            Ok(st) => {
                tracing::debug!(
                    now = st.len(),
                    mapped = model_bytes,
                    "model path names another file: not watched"
                );
                None
            }
            Err(e) => {
                tracing::debug!("model path not openable ({e}): not watched");
                None
            }
        };

        let file_resident_bytes = super::sys::resident_bytes(file.bytes()).unwrap_or(0);
        let share = if model_bytes == 0 {
            1.0
        } else {
            file_resident_bytes as f64 / model_bytes as f64
        };
        if share < LOW_RESIDENCY {
            tracing::warn!(
                resident_pct = format!("{:.0}", share * 100.0),
                "the model file is mostly not in the page cache: the first tokens will read it from storage"
            );
        }

        let decision = auto_decision(caps);
        let (want_import, mut reason) = match opts.mode {
            WeightsMode::Copy => (false, "asked for copy".to_string()),
            WeightsMode::Auto => (
                decision.mode == WeightsMode::Import,
                format!("auto: {}", decision.reason),
            ),
            WeightsMode::Import => {
                if !caps.external_memory_host {
                    return Err(ResidencyError::ImportFailed(format!(
                        "device `{}` does not support VK_EXT_external_memory_host; use --weights copy",
                        caps.name
                    )));
                }
                (true, "asked for import".to_string())
            }
        };

        let plan = plan_for(caps, &file, opts.import_cap)?;
        let mlock = if opts.mlock {
            Some(Mlock::new(&file).map_err(|source| ResidencyError::Os {
                what: format!("--mlock of {model_bytes} bytes (raise `ulimit -l`?)"),
                source,
            })?)
        } else {
            None
        };

        let mut backings: Vec<Option<Backing>> = (0..plan.shards.len()).map(|_| None).collect();
        let mut reports: Vec<ShardReport> = Vec::with_capacity(plan.shards.len());
        let mut to_copy: Vec<usize> = Vec::new();
        let mut file_refused: Option<String> = None;
        let mut anon_refused: Option<String> = None;
        for (i, s) in plan.shards.iter().enumerate() {
            let mut rep = ShardReport {
                start: s.start,
                len: s.len,
                path: "copy",
                note: None,
            };
            if !want_import {
                to_copy.push(i);
                reports.push(rep);
                continue;
            }
            if s.past_mapping {
                rep.note = Some("shard ends past the mapping's last page".into());
            } else if let Some(why) = &file_refused {
                rep.note = Some(format!("file pages refused: {why}"));
            } else if faults.import_file {
                let why = "VKDECODE_FAULT=import-file (simulated driver refusal)".to_string();
                tracing::warn!(shard = i, "import of file pages refused: {why}");
                rep.note = Some(format!("file pages refused: {why}"));
                file_refused = Some(why);
            } else {
                match sys::import_file(ctx, &file, s.start, s.len) {
                    Ok(imp) => {
                        backings[i] = Some(Backing::File(imp));
                        rep.path = "import(file)";
                        reports.push(rep);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(shard = i, "import of file pages refused: {e}");
                        rep.note = Some(format!("file pages refused: {e}"));
                        file_refused = Some(e.to_string());
                    }
                }
            }
            // Anonymous memory: one read of the file, imported (still one copy, not two).
            if anon_refused.is_none() {
                match import_anon_shard(ctx, &file, s.start, s.len, plan.align, faults) {
                    Ok(a) => {
                        backings[i] = Some(Backing::Anon(a));
                        rep.path = "import(anon)";
                        reports.push(rep);
                        continue;
                    }
                    Err(why) => {
                        tracing::warn!(shard = i, "import of anonymous memory refused: {why}");
                        anon_refused = Some(why);
                    }
                }
            }
            let why_anon = anon_refused.clone().unwrap_or_default();
            let why_file = rep.note.clone().unwrap_or_default();
            if opts.mode == WeightsMode::Import {
                return Err(ResidencyError::ImportFailed(format!(
                    "shard {i} ({}+{} bytes): {why_file}; anonymous memory refused: {why_anon}",
                    s.start, s.len
                )));
            }
            rep.note = Some(format!("{why_file}; anonymous memory refused: {why_anon}"));
            to_copy.push(i);
            reports.push(rep);
        }
        if !to_copy.is_empty() {
            for (i, buf) in copy_shards(ctx, &file, &plan, &to_copy)? {
                backings[i] = Some(Backing::Copy(buf));
            }
        }
        let shards: Vec<Backing> = backings
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.ok_or_else(|| ResidencyError::Unsupported(format!("shard {i} was not loaded")))
            })
            .collect::<Result<_, _>>()?;

        let g = file.gguf();
        let mut views = Vec::with_capacity(g.tensors.len());
        let mut index = HashMap::with_capacity(g.tensors.len());
        for (t, info) in g.tensors.iter().enumerate() {
            let parts = plan.placements[t]
                .iter()
                .map(|p| ViewPart {
                    binding: BufferBinding {
                        buffer: shards[p.shard].buffer_ref(),
                        offset: p.bind_offset,
                        range: p.range,
                    },
                    byte_offset: p.byte_offset,
                    first_row: p.first_row,
                    n_rows: p.n_rows,
                })
                .collect();
            index.insert(info.name.clone(), t);
            views.push(TensorView {
                name: info.name.clone(),
                ty: info.ty,
                shape: info.shape.clone(),
                row_bytes: info.row_bytes(),
                parts,
            });
        }

        let count = |p: &str| reports.iter().filter(|r| r.path == p).count();
        let kinds: Vec<(&str, usize)> = ["import(file)", "import(anon)", "copy"]
            .into_iter()
            .map(|p| (p, count(p)))
            .filter(|&(_, n)| n > 0)
            .collect();
        let path = match kinds.as_slice() {
            [(p, _)] => p.to_string(),
            [] => "none".to_string(),
            many => format!(
                "mixed({})",
                many.iter()
                    .map(|(p, n)| format!("{p} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        if let Some(note) = reports.iter().find_map(|r| r.note.clone()) {
            reason = format!("{reason}; fallback: {note}");
        }
        let device_bytes = shards
            .iter()
            .map(|b| {
                if let Backing::Copy(x) = b {
                    x.size()
                } else {
                    0
                }
            })
            .sum();
        let imported_bytes = shards
            .iter()
            .map(|b| match b {
                Backing::File(b) | Backing::Anon(b) => b.size(),
                Backing::Copy(_) => 0,
            })
            .sum();
        let anon_bytes = shards
            .iter()
            .map(|b| {
                if let Backing::Anon(a) = b {
                    a.size()
                } else {
                    0
                }
            })
            .sum();
        let report = ResidencyReport {
            mode: opts.mode,
            path,
            reason,
            shards: reports,
            model_bytes,
            device_bytes,
            imported_bytes,
            anon_bytes,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
            file_resident_bytes,
            mlocked: mlock.is_some(),
            alignment: plan.align,
            cap: plan.cap,
        };
        tracing::info!(
            path = %report.path,
            shards = report.shards.len(),
            load_ms = format!("{:.1}", report.load_ms),
            "weights loaded"
        );
        Ok(Weights {
            views,
            index,
            _shards: shards,
            plan,
            report,
            _mlock: mlock,
            ctx: Arc::clone(ctx),
            file,
            stamp,
        })
    }

    /// Whether the mapped model file was rewritten in place (size or modification time
    /// changed) since load: one `fstat`, cheap enough to call between tokens. A file
    /// replaced by rename is not a change (the mapping keeps the old pages). A file that
    /// shrank is caught here if no page was read since; a read of a lost page raises
    /// SIGBUS instead (see [`super::sigbus`]).
    ///
    /// Not watched (always `Ok`) when, at load, the path no longer named a file of the
    /// mapped size.
    pub fn check_file(&self) -> Result<(), FileChanged> {
        self.stamp.as_ref().map_or(Ok(()), FileStamp::check)
    }

    /// The view of tensor `name`.
    pub fn view(&self, name: &str) -> Option<&TensorView> {
        self.index.get(name).map(|&i| &self.views[i])
    }

    /// All views, in file order.
    pub fn views(&self) -> &[TensorView] {
        &self.views
    }

    /// What the load did.
    pub fn report(&self) -> &ResidencyReport {
        &self.report
    }

    /// The shard plan used.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// The mapped model file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Checksums of every tensor's bytes computed by `checksum.comp` through the views
    /// (reads every weight byte on the GPU). Order: file order.
    pub fn gpu_checksums(&self) -> Result<Vec<[u32; 2]>, ResidencyError> {
        let ctx = &self.ctx;
        let n = self.views.len().max(1) as u64;
        let p = checksum::pipeline(ctx)?;
        let out = Buffer::new(
            ctx,
            &BufferDesc::storage("checksums", 8 * n, MemLocation::GpuToCpu),
        )?;
        let mut sets = Vec::new();
        let mut jobs = Vec::new();
        for (t, v) in self.views.iter().enumerate() {
            for part in &v.parts {
                sets.push(p.descriptor_set(&[part.binding.clone(), out.binding()])?);
                let push = ChecksumPush {
                    byte_offset: part.byte_offset as u32,
                    n_bytes: (part.n_rows * v.row_bytes) as u32,
                    word_base: (part.first_row * v.row_bytes / 4) as u32,
                    out_index: t as u32,
                };
                jobs.push(push);
            }
        }
        let mut cmd = CommandBuffer::new(ctx)?;
        cmd.begin()?;
        cmd.fill(&out, 0, out.size(), 0);
        cmd.barrier();
        for (push, set) in jobs.iter().zip(&sets) {
            let groups = checksum::groups_for(u64::from(push.n_bytes));
            cmd.dispatch(&p, set, bytemuck::bytes_of(push), [groups, 1, 1]);
        }
        cmd.host_barrier();
        cmd.end()?;
        ctx.submit_and_wait(&cmd)?;
        let mut sums = vec![0u32; 2 * self.views.len()];
        out.read(0, &mut sums)?;
        Ok(sums.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
    }

    /// The same checksums computed on the CPU from the mapped file.
    pub fn cpu_checksums(&self) -> Vec<[u32; 2]> {
        let g = self.file.gguf();
        g.tensors
            .iter()
            .map(|t| checksum::cpu(self.file.tensor_data(t), 0))
            .collect()
    }
}

/// Reads `[start, start+len)` of the file into aligned anonymous memory and imports it.
fn import_anon_shard(
    ctx: &Arc<Context>,
    file: &GgufFile,
    start: u64,
    len: u64,
    align: u64,
    faults: Faults,
) -> Result<ImportedBuffer, String> {
    if faults.import_anon {
        return Err("VKDECODE_FAULT=import-anon (simulated driver refusal)".into());
    }
    let (len, align) = (len as usize, align as usize);
    // memmap2 maps whole pages; for a larger import alignment, map more and start inside.
    let page = sys::page_size() as usize;
    let extra = if align > page { align } else { 0 };
    let mut map =
        MmapMut::map_anon(len + extra).map_err(|e| format!("mmap of {len} bytes: {e}"))?;
    let base = map.as_ptr() as usize;
    let offset = base.next_multiple_of(align.max(1)) - base;
    let bytes = file.bytes();
    let end = (start + len as u64).min(bytes.len() as u64) as usize;
    let src = &bytes[start as usize..end];
    map[offset..offset + src.len()].copy_from_slice(src);
    sys::import_anon(ctx, map, offset, len).map_err(|e| e.to_string())
}

/// Copies the listed shards into device-local buffers through one bounded staging buffer.
fn copy_shards(
    ctx: &Arc<Context>,
    file: &GgufFile,
    plan: &ShardPlan,
    which: &[usize],
) -> Result<Vec<(usize, Buffer)>, ResidencyError> {
    let bytes = file.bytes();
    let largest = which.iter().map(|&i| plan.shards[i].len).max().unwrap_or(0);
    let staging_len = largest.clamp(4, STAGING_MAX);
    let staging = Buffer::new(
        ctx,
        &BufferDesc::storage("weights staging", staging_len, MemLocation::CpuToGpu),
    )?;
    let mut cmd = CommandBuffer::new(ctx)?;
    let total: u64 = which.iter().map(|&i| plan.shards[i].len).sum();
    let mut done = 0u64;
    let mut out = Vec::with_capacity(which.len());
    for &i in which {
        let s = &plan.shards[i];
        let buf = Buffer::new(
            ctx,
            &BufferDesc::storage(&format!("weights shard {i}"), s.len, MemLocation::GpuOnly),
        )?;
        let mut off = 0u64;
        while off < s.len {
            let n = staging_len.min(s.len - off);
            let a = (s.start + off).min(bytes.len() as u64) as usize;
            let b = (s.start + off + n).min(bytes.len() as u64) as usize;
            staging.write(0, &bytes[a..b])?;
            let tail = n - (b - a) as u64;
            if tail > 0 {
                // Past the end of the file: zeros, as the mapping's last page reads.
                staging.write((b - a) as u64, &vec![0u8; tail as usize])?;
            }
            cmd.begin()?;
            cmd.copy_buffer(&staging, &buf, &[(0, off, n)]);
            cmd.barrier();
            cmd.end()?;
            ctx.submit_and_wait(&cmd)?;
            off += n;
            let before = done * 10 / total.max(1);
            done += n;
            // Progress for large models (the CLI's subscriber shows it on a terminal).
            if total >= PROGRESS_MIN && done * 10 / total.max(1) > before {
                tracing::info!(
                    done_mib = done >> 20,
                    total_mib = total >> 20,
                    "copying weights"
                );
            }
        }
        tracing::debug!(shard = i, done, total, "copied");
        out.push((i, buf));
    }
    Ok(out)
}
