//! Backends the engine does not hold: the plain f32 CPU reference (`--backend
//! reference`: slow, one token at a time, for checking) and `--check` (the Vulkan
//! session with the reference fed the same tokens, every step's logits compared). Both
//! are [`Forward`]s, so the engine's one generation driver runs them as it runs the
//! session; the engine itself needs the reference only in its tests.

use std::sync::Arc;
use std::time::Instant;

use arch::Config;
use engine::generate::fit::{self, CtxRequest};
use engine::generate::{check_finite, load, BackendInfo, Forward, GenerateError, LoadOptions};
use engine::Counters;
use engine::Session;

/// A reference failure as a generation error.
fn failed(e: reference::RefError) -> GenerateError {
    GenerateError::Backend {
        what: "reference",
        source: Box::new(e),
    }
}

/// Bytes of every tensor of `file` as f32 (what the reference holds in RAM).
fn f32_bytes(file: &gguf::GgufFile) -> u64 {
    file.gguf().tensors.iter().fold(0u64, |s, t| {
        s.saturating_add(t.n_elements().saturating_mul(4))
    })
}

/// The CPU reference over `file` with the context `ctx` asks for, sized against the RAM
/// left beside its f32 weights, and its report.
pub fn load_reference(
    file: &Arc<gguf::GgufFile>,
    ctx: CtxRequest,
) -> Result<(Box<dyn Forward>, BackendInfo), GenerateError> {
    let start = Instant::now();
    let cfg = Config::from_gguf(file.gguf())?;
    let choice = fit::resolve(&cfg, ctx, &fit::host_budget(f32_bytes(file)))?;
    let model = reference::Model::load(file).map_err(failed)?;
    let forward = ReferenceForward::new(model, choice.ctx_len)?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let info = BackendInfo {
        backend: "reference",
        device: "cpu (reference)".into(),
        driver: "reference".into(),
        weights_path: "f32 in RAM".into(),
        kernels: "reference".into(),
        kernels_why: "the CPU reference runs no GPU kernels".into(),
        device_bytes: 0,
        kv_bytes: cfg.kv_cache_bytes(choice.ctx_len as u64).unwrap_or(0),
        ctx_len: choice.ctx_len,
        slots: 1,
        ctx_note: choice.note,
        load_ms,
        weights_load_ms: load_ms,
    };
    Ok((Box::new(forward), info))
}

/// `--check`: the Vulkan session as `opts` asks (one slot; the context also fits in the
/// RAM the reference leaves), with the reference beside it, and the session's report.
pub fn load_checked(
    file: &Arc<gguf::GgufFile>,
    opts: &LoadOptions,
) -> Result<(Box<dyn Forward>, BackendInfo), GenerateError> {
    let start = Instant::now();
    if opts.session.slots > 1 {
        return Err(GenerateError::Input(
            "--check runs the CPU reference beside the device: one slot only".into(),
        ));
    }
    let host = fit::host_budget(f32_bytes(file));
    let opts = LoadOptions {
        budget_cap: Some(fit::Budget {
            what: format!("{} (--check runs the reference too)", host.what),
            ..host
        }),
        ..opts.clone()
    };
    let loaded = load(file, &opts)?;
    let model = reference::Model::load(file).map_err(failed)?;
    let reference = ReferenceForward::new(model, loaded.session.ctx_len())?;
    let info = BackendInfo {
        load_ms: start.elapsed().as_secs_f64() * 1e3,
        ..loaded.info
    };
    Ok((Box::new(Checked::new(loaded.session, reference)), info))
}

/// The plain f32 CPU reference as a backend (slow; one token at a time).
pub struct ReferenceForward {
    model: reference::Model,
    state: reference::State,
    pos: usize,
}

impl ReferenceForward {
    /// A reference decoder with a KV cache of `ctx_len` positions; a cache that cannot be
    /// sized or allocated is an error naming the context and the bytes.
    pub fn new(model: reference::Model, ctx_len: usize) -> Result<ReferenceForward, GenerateError> {
        let state = reference::State::try_new(model.config(), ctx_len).map_err(failed)?;
        Ok(ReferenceForward {
            model,
            state,
            pos: 0,
        })
    }

    fn feed(&mut self, token: u32) -> Result<(), GenerateError> {
        reference::forward(
            &self.model,
            &mut self.state,
            token,
            self.pos,
            &mut |_, _| {},
        )
        .map_err(failed)?;
        self.pos += 1;
        Ok(())
    }

    fn logits(&self) -> Result<&[f32], GenerateError> {
        if self.pos == 0 {
            return Err(GenerateError::Input(
                "no token fed yet: nothing to predict from".into(),
            ));
        }
        Ok(&self.state.logits)
    }
}

impl Forward for ReferenceForward {
    /// One token: the reference runs a token at a time, so Ctrl-C is seen between tokens.
    fn chunk_len(&self) -> usize {
        1
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError> {
        tokens.iter().try_for_each(|&t| self.feed(t))
    }
    fn last_argmax(&mut self) -> Result<u32, GenerateError> {
        let pos = self.pos.saturating_sub(1);
        finite_argmax(self.logits()?, pos)
    }
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        self.logits()
    }
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError> {
        self.feed(token)?;
        self.last_argmax()
    }
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError> {
        self.feed(token)?;
        self.logits()
    }
    fn pos(&self) -> usize {
        self.pos
    }
    fn ctx_len(&self) -> usize {
        self.state.ctx_len
    }
    fn reset(&mut self) {
        self.pos = 0;
    }
    /// The cache rows past `pos` are overwritten as tokens are fed again.
    fn truncate(&mut self, pos: usize) -> Result<(), GenerateError> {
        if pos > self.pos {
            return Err(GenerateError::Input(format!(
                "cannot truncate to position {pos}: the cache holds {}",
                self.pos
            )));
        }
        self.pos = pos;
        Ok(())
    }
}

/// `--check`: the Vulkan session with the reference run beside it on the same tokens;
/// every step's logits are compared.
pub struct Checked {
    inner: Session,
    reference: ReferenceForward,
    last_diff: Option<f32>,
}

impl Checked {
    /// Runs `reference` beside `inner`; both must have the same context length.
    pub fn new(inner: Session, reference: ReferenceForward) -> Checked {
        Checked {
            inner,
            reference,
            last_diff: None,
        }
    }

    fn compare(diff: &mut Option<f32>, gpu: &[f32], cpu: &[f32]) {
        let d = gpu
            .iter()
            .zip(cpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        *diff = Some(d);
    }
}

impl Forward for Checked {
    fn chunk_len(&self) -> usize {
        self.inner.prefill_chunk()
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError> {
        self.reference.prefill(tokens)?;
        Ok(self.inner.prefill(tokens)?)
    }
    fn last_argmax(&mut self) -> Result<u32, GenerateError> {
        let pos = self.inner.pos().saturating_sub(1);
        finite_argmax(self.last_logits()?, pos)
    }
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        let gpu = self.inner.last_logits()?;
        Self::compare(&mut self.last_diff, gpu, self.reference.logits()?);
        Ok(gpu)
    }
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError> {
        let pos = self.inner.pos();
        finite_argmax(self.decode_logits(token)?, pos)
    }
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError> {
        self.reference.feed(token)?;
        let gpu = self.inner.decode_logits(token)?;
        Self::compare(&mut self.last_diff, gpu, self.reference.logits()?);
        Ok(gpu)
    }
    fn pos(&self) -> usize {
        self.inner.pos()
    }
    fn ctx_len(&self) -> usize {
        self.inner.ctx_len()
    }
    fn reset(&mut self) {
        self.inner.reset();
        self.reference.reset();
    }
    fn truncate(&mut self, pos: usize) -> Result<(), GenerateError> {
        self.inner.truncate(pos)?;
        self.reference.truncate(pos)
    }
    fn wants_logits(&self) -> bool {
        true
    }
    fn take_check_diff(&mut self) -> Option<f32> {
        self.last_diff.take()
    }
    fn counters(&self) -> Option<Counters> {
        Some(self.inner.counters())
    }
    fn session(&self) -> Option<&Session> {
        Some(&self.inner)
    }
}

/// The first maximum of `logits`, once they are known to be finite (see [`check_finite`]).
fn finite_argmax(logits: &[f32], pos: usize) -> Result<u32, GenerateError> {
    check_finite(logits, pos)?;
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

#[cfg(test)]
mod tests {
    use super::finite_argmax;

    #[test]
    fn finite_argmax_takes_the_first_maximum_of_finite_logits() {
        assert_eq!(finite_argmax(&[1.0, 3.0, 3.0, 2.0], 0).unwrap(), 1);
        assert!(finite_argmax(&[1.0, f32::NAN], 0).is_err());
    }
}
