//! One submit advancing several slots by one token each: the slots' tokens are
//! one batch, so every layer's matmuls are a small matrix-matrix product over the slots
//! and each weight is read once per step whatever the concurrency. Each token carries its
//! own position and cache row in the step buffer (`STEP_POS`, `STEP_ROW`), so rope, the
//! cache write and attention stay inside its slot.
//!
//! Batch-invariant: the layers run one matmul pipeline whatever the batch size (the
//! prefill-shaped matrix-matrix one, tokens in independent accumulators, or the one-token
//! decode one, a workgroup row per token), each row reduced in the same order for any
//! batch; attention is one workgroup per (head, token), and the head is one matmul over
//! every token of the batch through the layers' kernel (each token's logits row reduced
//! the same way at any batch size), then one argmax workgroup per row. A slot's results
//! are therefore the same alone or beside others, as long as every step goes through
//! here; with the one-token matmul they are also those of a lone `decode_*` (the one-shot
//! generator).

use vk::CommandBuffer;

use super::Session;
use crate::kernels::{ARGMAX_NON_FINITE, STEP_MAX_BATCH};
use crate::model::{Batch, Recorder};
use crate::profile::{per_kernel, KernelTime};
use crate::EngineError;

/// The batched step's command buffer and what the last step left.
pub(super) struct BatchOut {
    cmd: CommandBuffer,
    /// Tokens in the last batched step, and whether their logits may be read.
    last: (usize, bool),
    /// Per-kernel GPU time of the last batched step, when the session profiles.
    profile: Option<Vec<KernelTime>>,
    /// The head's matmul: the matrix-matrix kernel over every token (true), or the
    /// one-token kernel once per token (one dispatch still); for A/B runs.
    head_mm: bool,
}

impl BatchOut {
    pub fn new(ctx: &std::sync::Arc<vk::Context>) -> Result<BatchOut, EngineError> {
        Ok(BatchOut {
            cmd: CommandBuffer::new(ctx)?,
            last: (0, false),
            profile: None,
            head_mm: true,
        })
    }
}

impl Session {
    /// Feeds `items[i].1` to slot `items[i].0` (at that slot's next position), every
    /// item in ONE submit; afterwards [`Session::batch_argmax`] / [`Session::batch_logits`]
    /// give item `i`'s next-token prediction (`keep_logits`: the logits may be read). The
    /// slots must differ and have room; at most `min(slots, STEP_MAX_BATCH)` items.
    /// `matrix_matrix`: the layers' matmuls read each weight chunk once per 4 tokens (the
    /// prefill kernel); else once per token through the one-token decode kernel.
    pub fn decode_batch(
        &mut self,
        items: &[(usize, u32)],
        keep_logits: bool,
        matrix_matrix: bool,
    ) -> Result<(), EngineError> {
        let _span = tracing::debug_span!("decode_batch", n = items.len()).entered();
        let cap = self.pos.len().min(STEP_MAX_BATCH);
        if items.is_empty() || items.len() > cap {
            return Err(EngineError::Input(format!(
                "a batched step takes 1..={cap} slots, got {}",
                items.len()
            )));
        }
        let mut step = Vec::with_capacity(items.len());
        for (i, &(slot, token)) in items.iter().enumerate() {
            if slot >= self.pos.len() || items[..i].iter().any(|&(s, _)| s == slot) {
                return Err(EngineError::Input(format!(
                    "slot {slot} is missing or appears twice in a batched step"
                )));
            }
            let pos = self.pos[slot];
            if pos + 1 > self.ctx_len {
                return Err(EngineError::ContextFull {
                    pos,
                    n: 1,
                    ctx_len: self.ctx_len,
                });
            }
            step.push((token, slot, pos));
        }
        self.write_step_items(&step)?;
        let n_tok = items.len() as u32;
        let cmd = &mut self.batch.cmd;
        cmd.begin()?;
        let mut names = Vec::new();
        let mut rec = Recorder {
            cmd,
            kernels: &mut self.kernels,
            model: &self.model,
            acts: &self.acts,
            cfg: &self.cfg,
            ctx_len: self.ctx_len * self.pos.len(),
            n_tok,
            batch: if matrix_matrix {
                Batch::Prefill
            } else {
                Batch::Decode
            },
            profile: self.query.as_ref().map(|q| (q, &mut names)),
        };
        rec.begin_profile();
        rec.embed()?;
        for l in 0..self.model.layers.len() {
            rec.layer(l)?;
        }
        if !self.batch.head_mm {
            rec.batch = Batch::Decode;
        }
        rec.logits_argmax_rows()?;
        self.batch.cmd.end()?;
        self.ctx.submit_and_wait(&self.batch.cmd)?;
        self.counters.host_waits += 1;
        if let Some(q) = &self.query {
            let ts = q.read_ns(0, names.len() as u32 + 1)?;
            let bytes = self.model.dispatch_weight_bytes(&names);
            self.batch.profile = Some(per_kernel(&names, &bytes, &ts));
        }
        for &(slot, _) in items {
            self.pos[slot] += 1;
        }
        self.counters.decoded_tokens += items.len() as u64;
        self.batch.last = (items.len(), keep_logits);
        Ok(())
    }

    /// Which matmul kernel the batched step's head runs (`matrix_matrix`: the prefill
    /// kernel over every token, the default; else the one-token kernel once per token);
    /// for A/B runs. Both keep a token's logits independent of the batch size.
    pub(crate) fn set_batch_head(&mut self, matrix_matrix: bool) {
        self.batch.head_mm = matrix_matrix;
    }

    /// Per-kernel GPU time of the last [`Session::decode_batch`] (kernels in order of
    /// first appearance), when the session profiles.
    pub fn profile_last_batch(&self) -> Option<Vec<KernelTime>> {
        self.batch.profile.clone()
    }

    /// Item `i`'s argmax after the last [`Session::decode_batch`], or
    /// [`EngineError::NonFiniteLogits`] when its logits held a NaN or an infinity.
    pub fn batch_argmax(&mut self, i: usize, slot: usize) -> Result<u32, EngineError> {
        self.check_batch_item(i, false)?;
        let mut r = [0u32; 1];
        self.acts.result.read(4 * i as u64, &mut r)?;
        self.counters.bytes_read_back += 4;
        if r[0] & ARGMAX_NON_FINITE != 0 {
            return Err(EngineError::NonFiniteLogits {
                pos: self.pos.get(slot).map_or(0, |p| p.saturating_sub(1)),
            });
        }
        Ok(r[0])
    }

    /// Item `i`'s logits after the last [`Session::decode_batch`] with `keep_logits`.
    pub fn batch_logits(&mut self, i: usize) -> Result<&[f32], EngineError> {
        self.check_batch_item(i, true)?;
        let ofs = (i * self.cfg.vocab_size * 4) as u64;
        self.acts.logits.read(ofs, &mut self.logits_host)?;
        self.counters.bytes_read_back += (self.logits_host.len() * 4) as u64;
        Ok(&self.logits_host)
    }

    fn check_batch_item(&self, i: usize, logits: bool) -> Result<(), EngineError> {
        let (n, kept) = self.batch.last;
        if i >= n || (logits && !kept) {
            return Err(EngineError::Input(format!(
                "item {i} of the last batched step ({n} items, logits {}) has no {}",
                if kept { "kept" } else { "not kept" },
                if logits { "logits" } else { "result" }
            )));
        }
        Ok(())
    }
}
