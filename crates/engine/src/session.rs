//! A decoding session: the weights, every pipeline and descriptor set, the activation
//! buffers and the KV cache, all created at load; then `prefill` and `decode_*`.
//!
//! Per decode token (docs/design.md, "The three conditions"): the host writes the token id and
//! its position into the step buffer, submits ONE pre-recorded command buffer and waits
//! on ONE fence; greedy decoding reads back 4 bytes (the argmax taken on the GPU), and the
//! logits are read back only when sampling needs them. Nothing is allocated per token.

use std::sync::Arc;

use arch::Config;
use tracing::{debug_span, info_span};
use vk::{CommandBuffer, QueryPool};

use crate::activations::Activations;
use crate::graph;
use crate::kernels::{self, Kernels, StepHeader, ARGMAX_NON_FINITE};
use crate::model::{Batch, GpuModel, Head, Recorder};
use crate::profile::per_kernel;
pub use crate::profile::KernelTime;
use crate::EngineError;
use residency::{ResidencyOptions, Weights};

mod batch;

/// How a session is built.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub weights: ResidencyOptions,
    /// Positions the KV cache holds (prompt + generated tokens), per slot.
    pub ctx_len: usize,
    /// Independent sequences (slots) over the one set of weights and pipelines: each has
    /// its own `ctx_len` rows of every layer's KV cache (rows `slot·ctx_len..`) and its own
    /// position; [`Session::select_slot`] picks the one the next calls work on. 1 for a
    /// plain session.
    pub slots: usize,
    /// Ablation: submit and wait after every layer (a host drain), as a naive runtime does.
    pub sync_each_layer: bool,
    /// Record GPU timestamps around every dispatch of a decode token.
    pub profile: bool,
    /// Let one-token matmuls split each row's columns across lanes where the device
    /// allows it (`Kernels::column_split`); off: lanes own rows (the fallback, for A/B).
    pub column_split: bool,
    /// The kernel set (`--kernels`): shaped for a CPU device or for a GPU, or by device
    /// type (`kernels::Shapes::for_profile`).
    pub kernels: crate::kernels::KernelProfile,
    /// Most prompt tokens one prefill submission takes (llama.cpp's `--ubatch-size`):
    /// fewer make the activation buffers smaller and the submits more. `None`, or more than the
    /// device allows: the device's ([`kernels::prefill_chunk`](crate::kernels::prefill_chunk)).
    pub prefill_chunk: Option<usize>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            weights: ResidencyOptions::default(),
            ctx_len: 2048,
            slots: 1,
            sync_each_layer: false,
            profile: false,
            column_split: true,
            kernels: crate::kernels::KernelProfile::Auto,
            prefill_chunk: None,
        }
    }
}

/// What the session did, for the condition-2/3 test and the stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Fence waits by this session.
    pub host_waits: u64,
    /// Bytes read back from GPU buffers by this session.
    pub bytes_read_back: u64,
    /// Device memory allocations alive on the session's context (`vk::Context::live_allocations`).
    pub allocations: u64,
    /// Tokens decoded (`decode_*`), prompt tokens not included.
    pub decoded_tokens: u64,
    /// Prompt tokens prefilled.
    pub prefilled_tokens: u64,
}

/// A model loaded on the GPU, ready to prefill and decode.
///
/// Field order is drop order: command buffers, then descriptor sets (in `model`), then
/// pipelines, then activation buffers, then the weights (whose imports keep the file
/// mapping alive), then the context.
pub struct Session {
    decode_cmds: Vec<CommandBuffer>,
    prefill_cmd: CommandBuffer,
    /// The batched decode step (several slots, one submit: batch.rs).
    batch: batch::BatchOut,
    query: Option<QueryPool>,
    model: GpuModel,
    kernels: Kernels,
    acts: Activations,
    weights: Weights,
    cfg: Config,
    ctx: Arc<vk::Context>,
    ctx_len: usize,
    /// Next position of each slot (tokens in its part of the cache).
    pos: Vec<usize>,
    /// The slot `prefill`/`decode_*` work on.
    slot: usize,
    /// Host copy of the logits, allocated once.
    logits_host: Vec<f32>,
    /// Host copy of the residual dumps (observer), allocated once.
    dump_host: Vec<f32>,
    counters: Counters,
    profile_names: Vec<String>,
    /// Weight bytes each profiled dispatch reads (`None`: not a matvec).
    profile_bytes: Vec<Option<u64>>,
    last_profile: Option<Vec<KernelTime>>,
    /// The last profiled prefill chunk: its tokens and per-kernel times.
    last_prefill_profile: Option<(usize, Vec<KernelTime>)>,
}

impl Session {
    /// Loads the weights, creates the pipelines, descriptor sets and buffers, records the
    /// decode command buffer, and warms the decode and prefill pipelines (lavapipe
    /// compiles a pipeline on its first dispatch) with throw-away tokens. Pipelines only
    /// some runs take (the GEMM's small tile, the batched step's head) are created on
    /// first use.
    pub fn new(
        ctx: Arc<vk::Context>,
        file: Arc<gguf::GgufFile>,
        opts: &SessionOptions,
    ) -> Result<Session, EngineError> {
        let _span = info_span!("session", ctx_len = opts.ctx_len).entered();
        let cfg = Config::from_gguf(file.gguf()).map_err(|e| EngineError::Model(e.to_string()))?;
        if opts.ctx_len == 0 {
            return Err(EngineError::Input(
                "the context length must be at least 1".into(),
            ));
        }
        if opts.slots == 0 {
            return Err(EngineError::Input("a session needs at least 1 slot".into()));
        }
        let ctx_len = opts.ctx_len.min(cfg.context_length.max(1));
        // a tensor the kernels cannot read is refused before the first allocation
        crate::support::check_gpu_readable(&cfg, file.gguf())?;
        let factors = rope_factors(&file, &cfg)?;
        // every slot's rows of the KV cache lie in one buffer per layer (so one dispatch
        // can reach any slot's rows: the step buffer gives each token its position and row)
        let cache_rows = ctx_len
            .checked_mul(opts.slots)
            .filter(|&r| u32::try_from(r).is_ok())
            .ok_or_else(|| EngineError::ContextTooLarge {
                ctx_len,
                why: format!(
                    "{} slots of {ctx_len} positions overflow 32 bits",
                    opts.slots
                ),
            })?;
        let weights = Weights::load(&ctx, file, &opts.weights)?;
        let device_chunk = prefill_chunk(&ctx, &cfg);
        let chunk = opts
            .prefill_chunk
            .map_or(device_chunk, |c| c.clamp(1, device_chunk));
        let acts = Activations::new(&ctx, &cfg, cache_rows, chunk, opts.slots)?;
        let mut kernels = Kernels::with_profile(&ctx, opts.kernels)?;
        kernels.set_column_split(opts.column_split);
        let model = GpuModel::build(&ctx, &cfg, &weights, &acts, &mut kernels)?;

        // RoPE frequencies with the linear scale and Llama 3's divisors folded in: the
        // global table in the step buffer (the fused q/k/v epilogue), both tables (global,
        // sliding-window layers) in the rope buffer (heads.comp)
        let tables = graph::rope_tables(&cfg, factors.as_deref());
        let mut step_init = vec![0u32; 4 + kernels::STEP_FREQS_MAX];
        for (i, f) in tables[..kernels::STEP_FREQS_MAX].iter().enumerate() {
            step_init[4 + i] = f.to_bits();
        }
        acts.step.write(0, &step_init)?;
        acts.rope.write(0, &tables)?;

        let query = if opts.profile {
            // one timestamp before and after every dispatch of a token, with room to spare
            // (up to 8 dispatches a layer, more where weights come in parts)
            Some(QueryPool::new(&ctx, (12 * cfg.n_layers + 16) as u32)?)
        } else {
            None
        };
        let n_layers = cfg.n_layers;
        let mut session = Session {
            decode_cmds: Vec::new(),
            prefill_cmd: CommandBuffer::new(&ctx)?,
            batch: batch::BatchOut::new(&ctx)?,
            query,
            model,
            kernels,
            acts,
            weights,
            logits_host: vec![0.0; cfg.vocab_size],
            dump_host: vec![0.0; n_layers * chunk * cfg.dim],
            cfg,
            ctx,
            ctx_len,
            pos: vec![0; opts.slots],
            slot: 0,
            counters: Counters::default(),
            profile_names: Vec::new(),
            profile_bytes: Vec::new(),
            last_profile: None,
            last_prefill_profile: None,
        };
        session.counters.allocations = session.acts.count();
        session.record_decode(opts.sync_each_layer)?;
        // warm the pipelines a run takes: a prefill of the smallest batch that runs the
        // full GEMM tile (a chunk of one or two tokens takes the small tile, created when
        // first needed) and one decode step (the tokens are thrown away: a model whose
        // logits are not finite loads, and says so on the first token it is asked for)
        let warm = (kernels::GEMM_SMALL_TILE as usize + 1).min(ctx_len);
        session.prefill(&vec![0; warm])?;
        match session.decode_argmax(0) {
            Ok(_) | Err(EngineError::NonFiniteLogits { .. }) => {}
            Err(e) => return Err(e),
        }
        session.reset();
        session.counters = Counters {
            allocations: session.counters.allocations,
            ..Counters::default()
        };
        Ok(session)
    }

    /// Hyper-parameters of the model.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The weights (residency report, views).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The context the session was created on.
    pub fn context(&self) -> &Arc<vk::Context> {
        &self.ctx
    }

    /// The matmul shapes of the session's kernel profile (`SessionOptions::kernels`).
    pub fn shapes(&self) -> &kernels::Shapes {
        self.kernels.shapes()
    }

    /// The kernel profile the session runs (`SessionOptions::kernels` on this device), and why.
    pub fn profile(&self) -> &kernels::ProfileChoice {
        self.kernels.profile()
    }

    /// Next position to be written in the current slot (tokens in its cache).
    pub fn pos(&self) -> usize {
        self.pos[self.slot]
    }

    /// Positions the cache holds (per slot).
    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Starts a new sequence in the current slot (its cache is overwritten as it refills).
    pub fn reset(&mut self) {
        self.pos[self.slot] = 0;
    }

    /// Slots (independent sequences) this session holds.
    pub fn slots(&self) -> usize {
        self.pos.len()
    }

    /// The slot `prefill` and `decode_*` work on.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Makes `slot` the one the next `prefill`/`decode_*`/`pos`/`reset` calls work on.
    /// Its cache rows and position are kept as they were.
    pub fn select_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        if slot >= self.pos.len() {
            return Err(EngineError::Input(format!(
                "slot {slot} does not exist (the session has {})",
                self.pos.len()
            )));
        }
        self.slot = slot;
        Ok(())
    }

    /// Drops the current slot's positions from `pos` on, keeping `0..pos` (a cached
    /// prefix); the next token fed goes to `pos`. Positions past the current one are
    /// refused (they hold nothing).
    pub fn truncate(&mut self, pos: usize) -> Result<(), EngineError> {
        let cur = self.pos[self.slot];
        if pos > cur {
            return Err(EngineError::Input(format!(
                "cannot truncate slot {} to position {pos}: it holds {cur}",
                self.slot
            )));
        }
        self.pos[self.slot] = pos;
        Ok(())
    }

    /// Gives slot `to` the first `len` positions of slot `from`: their K/V rows are copied
    /// on the device (one transfer submit, no host round trip of the cache) and `to`'s
    /// position becomes `len`. Several answers to one prompt share its prefill this way.
    /// The current slot stays selected.
    pub(crate) fn copy_prefix(
        &mut self,
        from: usize,
        to: usize,
        len: usize,
    ) -> Result<(), EngineError> {
        let n = self.pos.len();
        if from >= n || to >= n || from == to {
            return Err(EngineError::Input(format!(
                "cannot copy slot {from}'s cache to slot {to} ({n} slots)"
            )));
        }
        if len > self.pos[from] {
            return Err(EngineError::Input(format!(
                "cannot copy {len} positions of slot {from}: it holds {}",
                self.pos[from]
            )));
        }
        if len > 0 {
            // each layer's cache is `slots · ctx_len` rows of equal size
            let rows = (self.ctx_len * n) as u64;
            let row = self.acts.key_cache.first().map_or(0, |b| b.size() / rows);
            let (src, dst) = (
                (from * self.ctx_len) as u64 * row,
                (to * self.ctx_len) as u64 * row,
            );
            let region = [(src, dst, len as u64 * row)];
            let cmd = &mut self.prefill_cmd;
            cmd.begin()?;
            for (k, v) in self.acts.key_cache.iter().zip(&self.acts.value_cache) {
                cmd.copy_buffer(k, k, &region);
                cmd.copy_buffer(v, v, &region);
            }
            cmd.barrier();
            cmd.end()?;
            self.ctx.submit_and_wait(&self.prefill_cmd)?;
            self.counters.host_waits += 1;
        }
        self.pos[to] = len;
        Ok(())
    }

    pub fn counters(&self) -> Counters {
        Counters {
            allocations: self.ctx.live_allocations(),
            ..self.counters
        }
    }

    /// Per-kernel GPU time of the last decode token (in dispatch order of first
    /// appearance), when the session profiles.
    pub fn profile_last_token(&self) -> Option<Vec<KernelTime>> {
        self.last_profile.clone()
    }

    /// Per-kernel GPU time of the last prefill chunk and its number of tokens, when the
    /// session profiles.
    pub fn profile_last_prefill_chunk(&self) -> Option<(usize, Vec<KernelTime>)> {
        self.last_prefill_profile.clone()
    }

    /// Most prompt tokens one prefill submission processes (longer prompts go in chunks,
    /// with a cancellation check between them in the generator): chosen for the device
    /// by [`kernels::prefill_chunk`].
    pub fn prefill_chunk(&self) -> usize {
        self.acts.max_batch
    }

    /// Runs the prompt through the model in batches of up to [`Session::prefill_chunk`] tokens at
    /// positions `pos..pos+n`; afterwards [`Session::last_argmax`] / [`Session::last_logits`]
    /// give the prediction after the last prompt token.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        let _span = info_span!("prefill", tokens = tokens.len()).entered();
        if tokens.is_empty() {
            return Err(EngineError::Input(
                "empty prompt: nothing to prefill".into(),
            ));
        }
        self.check_room(tokens.len())?;
        let n_chunks = tokens.len().div_ceil(self.acts.max_batch);
        for (i, chunk) in tokens.chunks(self.acts.max_batch).enumerate() {
            let head = if i + 1 == n_chunks {
                Head::LogitsArgmax
            } else {
                Head::None
            };
            self.run_batch(chunk, head, false)?;
        }
        self.counters.prefilled_tokens += tokens.len() as u64;
        Ok(())
    }

    /// Feeds `token` at the next position and returns the argmax of the next-token
    /// logits (4 bytes read back).
    pub fn decode_argmax(&mut self, token: u32) -> Result<u32, EngineError> {
        self.decode(token)?;
        self.read_argmax()
    }

    /// Feeds `token` at the next position and returns the next-token logits.
    pub fn decode_logits(&mut self, token: u32) -> Result<&[f32], EngineError> {
        self.decode(token)?;
        self.read_logits()
    }

    /// Argmax after the last prefill or decode step.
    pub fn last_argmax(&mut self) -> Result<u32, EngineError> {
        self.read_argmax()
    }

    /// Logits after the last prefill or decode step.
    pub fn last_logits(&mut self) -> Result<&[f32], EngineError> {
        self.read_logits()
    }

    /// Debug entry point for tests: runs `tokens` (at most [`Session::prefill_chunk`]) as one batch
    /// at positions `pos..`, calling `observe(layer, x)` with the residual stream after
    /// every layer (`x`: `tokens.len() × dim`), and returns the logits of the last token.
    pub fn forward_observed(
        &mut self,
        tokens: &[u32],
        observe: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<&[f32], EngineError> {
        let max = self.acts.max_batch;
        if tokens.is_empty() || tokens.len() > max {
            return Err(EngineError::Input(format!(
                "forward_observed takes 1..={max} tokens, got {}",
                tokens.len()
            )));
        }
        self.check_room(tokens.len())?;
        self.run_batch(tokens, Head::LogitsArgmax, true)?;
        let dim = self.cfg.dim;
        let n = tokens.len() * dim;
        self.acts.layer_dump.read(0, &mut self.dump_host)?;
        self.counters.bytes_read_back += (self.cfg.n_layers * n * 4) as u64;
        for l in 0..self.cfg.n_layers {
            let row = l * max * dim;
            observe(l, &self.dump_host[row..row + n]);
        }
        self.read_logits()
    }

    fn check_room(&self, n: usize) -> Result<(), EngineError> {
        if self.pos() + n > self.ctx_len {
            return Err(EngineError::ContextFull {
                pos: self.pos(),
                n,
                ctx_len: self.ctx_len,
            });
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(EngineError::Input(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// Writes the token ids the next submission reads, at consecutive positions of the
    /// current slot.
    fn write_step(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        let pos0 = self.pos();
        let items: Vec<(u32, usize, usize)> = (tokens.iter().enumerate())
            .map(|(t, &id)| (id, self.slot, pos0 + t))
            .collect();
        self.write_step_items(&items)
    }

    /// Writes a batch's (token id, slot, position) triples: token ids, positions and cache
    /// rows (`slot·ctx_len + position`) in the step buffer.
    fn write_step_items(&mut self, items: &[(u32, usize, usize)]) -> Result<(), EngineError> {
        let ids: Vec<u32> = items.iter().map(|i| i.0).collect();
        self.check_tokens(&ids)?;
        if items.len() > kernels::STEP_MAX_BATCH {
            return Err(EngineError::Input(format!(
                "a batch of {} tokens (the step buffer holds {})",
                items.len(),
                kernels::STEP_MAX_BATCH
            )));
        }
        let header = StepHeader {
            pos0: items.first().map_or(0, |i| i.2 as u32),
            pad: [0; 3],
        };
        let pos: Vec<u32> = items.iter().map(|i| i.2 as u32).collect();
        let rows: Vec<u32> = (items.iter())
            .map(|i| (i.1 * self.ctx_len + i.2) as u32)
            .collect();
        self.acts.step.write(0, std::slice::from_ref(&header))?;
        self.acts.step.write(kernels::STEP_TOKENS_OFFSET, &ids)?;
        self.acts.step.write(kernels::STEP_POS_OFFSET, &pos)?;
        self.acts.step.write(kernels::STEP_ROW_OFFSET, &rows)?;
        Ok(())
    }

    /// Records and runs one batch (prefill chunk or observed run): one submit, one wait.
    fn run_batch(&mut self, tokens: &[u32], head: Head, dump: bool) -> Result<(), EngineError> {
        self.write_step(tokens)?;
        let cmd = &mut self.prefill_cmd;
        cmd.begin()?;
        let mut names = Vec::new();
        let mut rec = Recorder {
            cmd,
            kernels: &mut self.kernels,
            model: &self.model,
            acts: &self.acts,
            cfg: &self.cfg,
            ctx_len: self.ctx_len * self.pos.len(),
            n_tok: tokens.len() as u32,
            batch: self.model.prefill,
            profile: self.query.as_ref().map(|q| (q, &mut names)),
        };
        rec.forward(head, dump)?;
        self.prefill_cmd.end()?;
        self.ctx.submit_and_wait(&self.prefill_cmd)?;
        if let Some(q) = &self.query {
            let ts = q.read_ns(0, names.len() as u32 + 1)?;
            let bytes = self.model.dispatch_weight_bytes(&names);
            self.last_prefill_profile = Some((tokens.len(), per_kernel(&names, &bytes, &ts)));
        }
        self.counters.host_waits += 1;
        self.pos[self.slot] += tokens.len();
        Ok(())
    }

    /// Records the decode command buffer(s) once: one for the whole token, or (ablation)
    /// one per layer plus the embedding and the head.
    fn record_decode(&mut self, sync_each_layer: bool) -> Result<(), EngineError> {
        let n_layers = self.cfg.n_layers;
        let n_cmds = if sync_each_layer { n_layers + 2 } else { 1 };
        let mut cmds = Vec::with_capacity(n_cmds);
        for _ in 0..n_cmds {
            cmds.push(CommandBuffer::new(&self.ctx)?);
        }
        let mut names = Vec::new();
        for (i, cmd) in cmds.iter_mut().enumerate() {
            cmd.begin()?;
            let profile = if n_cmds == 1 {
                self.query.as_ref().map(|q| (q, &mut names))
            } else {
                None
            };
            let mut rec = Recorder {
                cmd,
                kernels: &mut self.kernels,
                model: &self.model,
                acts: &self.acts,
                cfg: &self.cfg,
                ctx_len: self.ctx_len * self.pos.len(),
                n_tok: 1,
                batch: Batch::Decode,
                profile,
            };
            if n_cmds == 1 {
                rec.forward(Head::LogitsArgmax, false)?;
            } else if i == 0 {
                rec.embed()?;
            } else if i <= n_layers {
                rec.layer(i - 1)?;
            } else {
                rec.logits_argmax()?;
            }
            cmd.end()?;
        }
        self.decode_cmds = cmds;
        self.profile_bytes = self.model.dispatch_weight_bytes(&names);
        self.profile_names = names;
        Ok(())
    }

    /// One decode step: write the step buffer, submit, wait (once per command buffer).
    fn decode(&mut self, token: u32) -> Result<(), EngineError> {
        let _span = debug_span!("decode", slot = self.slot, pos = self.pos()).entered();
        self.check_room(1)?;
        self.write_step(&[token])?;
        for cmd in &self.decode_cmds {
            self.ctx.submit_and_wait(cmd)?;
            self.counters.host_waits += 1;
        }
        if let Some(q) = &self.query {
            let n = self.profile_names.len();
            let ts = q.read_ns(0, n as u32 + 1)?;
            self.last_profile = Some(per_kernel(&self.profile_names, &self.profile_bytes, &ts));
        }
        self.pos[self.slot] += 1;
        self.counters.decoded_tokens += 1;
        Ok(())
    }

    /// The argmax of the last logits, or [`EngineError::NonFiniteLogits`] when the row
    /// held a NaN or an infinity (`argmax.comp` sets [`ARGMAX_NON_FINITE`]).
    fn read_argmax(&mut self) -> Result<u32, EngineError> {
        let mut r = [0u32; 1];
        self.acts.result.read(0, &mut r)?;
        self.counters.bytes_read_back += 4;
        if r[0] & ARGMAX_NON_FINITE != 0 {
            return Err(EngineError::NonFiniteLogits {
                pos: self.pos().saturating_sub(1),
            });
        }
        Ok(r[0])
    }

    fn read_logits(&mut self) -> Result<&[f32], EngineError> {
        self.acts.logits.read(0, &mut self.logits_host)?;
        self.counters.bytes_read_back += (self.logits_host.len() * 4) as u64;
        Ok(&self.logits_host)
    }
}

/// Llama 3's `rope_freqs.weight` (`[head_dim/2]` frequency divisors), when the model has
/// them, read from the file (F32 or F16).
fn rope_factors(file: &gguf::GgufFile, cfg: &Config) -> Result<Option<Vec<f32>>, EngineError> {
    if !cfg.rope_freqs {
        return Ok(None);
    }
    let name = arch::ModelTensor::RopeFreqs.name();
    let bad = |why: String| EngineError::Tensor {
        name: name.into(),
        why,
    };
    let t = file
        .gguf()
        .tensor(name)
        .ok_or_else(|| bad("missing from the model".into()))?;
    let half = cfg.head_dim / 2;
    if t.shape.as_slice() != [half as u64] {
        return Err(bad(format!("shape {:?}, expected [{half}]", t.shape)));
    }
    let mut out = vec![0.0f32; half];
    gguf::quant::dequantize(t.ty, file.tensor_data(t), &mut out)
        .map_err(|e| bad(format!("cannot read its {} values: {e}", t.ty.name())))?;
    if let Some(f) = out.iter().find(|f| !f.is_finite() || **f <= 0.0) {
        return Err(bad(format!("divisor {f} is not a positive finite number")));
    }
    Ok(Some(out))
}

/// Prompt tokens per prefill submission on this device for this model
/// ([`kernels::prefill_chunk`]: the widest per-token activation must fit one binding).
fn prefill_chunk(ctx: &vk::Context, cfg: &Config) -> usize {
    let caps = ctx.caps();
    let widest = cfg.dim.max(cfg.hidden_dim).max(cfg.n_heads * cfg.head_dim);
    kernels::prefill_chunk(
        caps.max_storage_buffer_range,
        caps.max_compute_work_group_count[1],
        widest,
        crate::kernels::GEMM_SHAPE.tb,
    )
}
