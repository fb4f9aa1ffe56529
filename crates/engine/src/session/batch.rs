//! One submit advancing several slots by one token each (issue 15): the slots' tokens are
//! one batch, so every layer's matmuls are a small matrix-matrix product over the slots
//! and each weight is read once per step whatever the concurrency. Each token carries its
//! own position and cache row in the step buffer (`STEP_POS`, `STEP_ROW`), so rope, the
//! cache write and attention stay inside its slot.
//!
//! Batch-invariant: the layers run one matmul pipeline whatever the batch size (the
//! prefill-shaped matrix-matrix one, tokens in independent accumulators, or the one-token
//! decode one, a workgroup row per token), each row reduced in the same order for any
//! batch; attention is one workgroup per (head, token), and the head (logits + argmax)
//! runs once per token with the one-token pipeline. A slot's results are therefore the
//! same alone or beside others, as long as every step goes through here; with the
//! one-token matmul they are also those of a lone `decode_*` (the one-shot generator).

use vk::{Buffer, BufferDesc, CommandBuffer, MemLocation};

use super::Session;
use crate::forward::Recorder;
use crate::kernels::{ARGMAX_NON_FINITE, STEP_MAX_BATCH};
use crate::model::Batch;
use crate::EngineError;

/// The batched step's command buffer and where each token's prediction is copied.
///
/// Field order is drop order: the command buffer before the buffers it names.
pub(super) struct BatchOut {
    cmd: CommandBuffer,
    /// [STEP_MAX_BATCH] u32: each token's argmax, with the non-finite flag.
    result: Buffer,
    /// [slots][vocab] f32: each token's logits (copied only when asked).
    logits: Buffer,
    /// Tokens in the last batched step, and whether their logits were kept.
    last: (usize, bool),
}

impl BatchOut {
    pub fn new(
        ctx: &std::sync::Arc<vk::Context>,
        slots: usize,
        vocab: usize,
    ) -> Result<BatchOut, EngineError> {
        let n = slots.min(STEP_MAX_BATCH) as u64;
        let bytes = n
            .checked_mul(vocab as u64 * 4)
            .ok_or_else(|| EngineError::Input(format!("{slots} slots of logits overflow")))?;
        let buf = |name: &str, b: u64| {
            Buffer::new(
                ctx,
                &BufferDesc::storage(name, b.max(16), MemLocation::GpuToCpu),
            )
        };
        Ok(BatchOut {
            cmd: CommandBuffer::new(ctx)?,
            result: buf("batch_result", 4 * STEP_MAX_BATCH as u64)?,
            logits: buf("batch_logits", bytes)?,
            last: (0, false),
        })
    }
}

impl Session {
    /// Feeds `items[i].1` to slot `items[i].0` (at that slot's next position), every
    /// item in ONE submit; afterwards [`Session::batch_argmax`] / [`Session::batch_logits`]
    /// give item `i`'s next-token prediction (`keep_logits` copies the logits too). The
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
        let vocab_bytes = (self.cfg.vocab_size * 4) as u64;
        let cmd = &mut self.batch.cmd;
        cmd.begin()?;
        let mut rec = Recorder {
            cmd,
            kernels: &self.kernels,
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
            profile: None,
            head_row: None,
        };
        rec.embed()?;
        for l in 0..self.model.layers.len() {
            rec.layer(l)?;
        }
        for i in 0..n_tok {
            rec.head_row = Some(i);
            rec.logits_argmax()?;
            rec.cmd.barrier();
            let at = u64::from(i);
            rec.cmd
                .copy_buffer(&self.acts.result, &self.batch.result, &[(0, 4 * at, 4)]);
            if keep_logits {
                rec.cmd.copy_buffer(
                    &self.acts.logits,
                    &self.batch.logits,
                    &[(0, at * vocab_bytes, vocab_bytes)],
                );
            }
            // the next head overwrites logits and result
            rec.cmd.barrier();
        }
        rec.cmd.host_barrier();
        self.batch.cmd.end()?;
        self.ctx.submit_and_wait(&self.batch.cmd)?;
        self.counters.host_waits += 1;
        for &(slot, _) in items {
            self.pos[slot] += 1;
        }
        self.counters.decoded_tokens += items.len() as u64;
        self.batch.last = (items.len(), keep_logits);
        Ok(())
    }

    /// Item `i`'s argmax after the last [`Session::decode_batch`], or
    /// [`EngineError::NonFiniteLogits`] when its logits held a NaN or an infinity.
    pub fn batch_argmax(&mut self, i: usize, slot: usize) -> Result<u32, EngineError> {
        self.check_batch_item(i, false)?;
        let mut r = [0u32; 1];
        self.batch.result.read(4 * i as u64, &mut r)?;
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
        self.batch.logits.read(ofs, &mut self.logits_host)?;
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
