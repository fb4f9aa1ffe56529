//! Recording the forward pass into a command buffer. Reads top to bottom, as llama2.c's
//! `forward()`: embedding → per layer (qkv, attention, output + residual, gate/up,
//! down + residual) → logits (final norm folded in) → argmax. One global barrier between
//! dependent dispatches; no host wait anywhere in here. What each step reads and writes
//! is in [`step`], built once at load (model.rs binds it).

use vk::{CommandBuffer, QueryPool};

use crate::activations::Activations;
use crate::kernels::{self, AttentionPush, MatmulPush};
use crate::model::{matmul_key, Batch, GpuModel, MatmulCall};
use crate::EngineError;
use arch::Config;

/// What the end of the pass produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Nothing (a prompt chunk that is not the last).
    None,
    /// Logits of the last token and their argmax.
    LogitsArgmax,
}

/// Records dispatches for a batch of `n_tok` tokens at positions `pos0..pos0+n_tok`
/// (`pos0` and the token ids are read from the step buffer at run time).
pub struct Recorder<'a> {
    pub cmd: &'a mut CommandBuffer,
    pub kernels: &'a kernels::Kernels,
    pub model: &'a GpuModel,
    pub acts: &'a Activations,
    pub cfg: &'a Config,
    pub ctx_len: usize,
    pub n_tok: u32,
    pub batch: Batch,
    /// Timestamp after every dispatch, and the dispatch names, when profiling.
    pub profile: Option<(&'a QueryPool, &'a mut Vec<String>)>,
}

impl Recorder<'_> {
    /// The whole pass; `dump` copies the residual after every layer into `layer_dump`.
    pub fn forward(&mut self, head: Head, dump: bool) -> Result<(), EngineError> {
        self.begin_profile();
        self.embed()?;
        for l in 0..self.model.layers.len() {
            self.layer(l)?;
            if dump {
                self.dump_residual(l);
            }
        }
        if head == Head::LogitsArgmax {
            self.logits_argmax()?;
        }
        Ok(())
    }

    /// Resets the timestamp queries and writes the first one.
    pub fn begin_profile(&mut self) {
        if let Some((pool, names)) = self.profile.as_mut() {
            names.clear();
            self.cmd.reset_queries(pool, 0, pool.count());
            self.cmd.timestamp(pool, 0);
        }
    }

    /// x[t] = token_embd[tokens[t]]
    pub fn embed(&mut self) -> Result<(), EngineError> {
        let e = &self.model.embed;
        let p = self
            .kernels
            .embed_ref(e.ty)
            .ok_or_else(|| missing("embed"))?;
        let mut push = e.push;
        push.n_tok = self.n_tok;
        let chunks = self.cfg.dim.div_ceil(kernels::CHUNK) as u32;
        let need = u64::from(self.n_tok) * self.cfg.dim as u64 * 4;
        check_fits("embed", "x", need, self.acts.x.size())?;
        check_fits("embed", "xg", need, self.acts.xg.size())?;
        self.cmd.dispatch(
            p,
            &e.set,
            bytemuck::bytes_of(&push),
            [chunks.div_ceil(kernels::EMBED_WG), self.n_tok, 1],
        );
        self.after("embed");
        Ok(())
    }

    /// One decoder layer.
    pub fn layer(&mut self, l: usize) -> Result<(), EngineError> {
        let model = self.model;
        let layer = &model.layers[l];
        // q = rope(Wq·rmsnorm(x)); k_cache[pos] = rope(Wk·rmsnorm(x)); v_cache[pos] = Wv·rmsnorm(x)
        self.matmuls(&layer.qkv)?;
        // att_out = softmax(q·K^T/sqrt(hd))·V over positions 0..=pos
        let push = AttentionPush {
            n_heads: self.cfg.n_heads as u32,
            n_kv_heads: self.cfg.n_kv_heads as u32,
            head_dim: self.cfg.head_dim as u32,
            scale: 1.0 / (self.cfg.head_dim as f32).sqrt(),
        };
        let attention = self
            .kernels
            .attention_ref(push.head_dim)
            .ok_or_else(|| missing("attention"))?;
        let need = u64::from(self.n_tok) * u64::from(push.n_heads * push.head_dim) * 4;
        check_fits("attention", "att_out", need, self.acts.att_out.size())?;
        self.cmd.dispatch(
            attention,
            &layer.attention,
            bytemuck::bytes_of(&push),
            [self.cfg.n_heads as u32, self.n_tok, 1],
        );
        self.after_named(|| format!("blk.{l}.attention"));
        // x += Wo·att_out
        self.matmuls(&layer.attn_output)?;
        // hb = silu(Wgate·rmsnorm(x)) * (Wup·rmsnorm(x))
        self.matmuls(&layer.gate_up)?;
        // x += Wdown·hb
        self.matmuls(&layer.ffn_down)?;
        Ok(())
    }

    /// logits = Wout·rmsnorm(x[last]); result = argmax(logits)
    pub fn logits_argmax(&mut self) -> Result<(), EngineError> {
        let model = self.model;
        self.matmuls(&model.logits)?;
        let push = kernels::ArgmaxPush {
            n: self.cfg.vocab_size as u32,
        };
        self.cmd.dispatch(
            &self.kernels.argmax,
            &self.model.argmax,
            bytemuck::bytes_of(&push),
            [1, 1, 1],
        );
        self.after("argmax");
        self.cmd.host_barrier();
        Ok(())
    }

    /// Copies the residual of every token into row `l` of `layer_dump`.
    fn dump_residual(&mut self, l: usize) {
        let row = (self.acts.max_batch * self.cfg.dim * 4) as u64;
        let n = u64::from(self.n_tok) * (self.cfg.dim * 4) as u64;
        self.cmd.copy_buffer(
            &self.acts.x,
            &self.acts.layer_dump,
            &[(0, l as u64 * row, n)],
        );
        self.cmd.barrier();
    }

    /// The dispatches of one fused matmul (several only for split or mixed-type weights;
    /// they write disjoint rows, so no barrier between them).
    fn matmuls(&mut self, calls: &[MatmulCall]) -> Result<(), EngineError> {
        for call in calls {
            let key = matmul_key(
                &call.variant,
                self.batch,
                self.model.neox,
                self.model.head_dim,
            );
            let p = self
                .kernels
                .matmul_ref(&key)
                .ok_or_else(|| missing(&call.name))?;
            let (n_tok, x_tok0) = if call.variant.last_token_only {
                (1, self.n_tok - 1)
            } else {
                (self.n_tok, 0)
            };
            let mut push = MatmulPush {
                n_tok,
                x_tok0,
                ncols: call.ncols,
                x_ld: call.x_ld,
                out_ld: call.out_ld,
                kv_ld: self.cfg.kv_dim() as u32,
                head_dim: self.cfg.head_dim as u32,
                eps: self.cfg.rms_eps,
                aux_ofs: call.aux_ofs,
                write_xg: u32::from(call.write_xg),
                rope_neox: u32::from(key.neox),
                ..MatmulPush::default()
            };
            let groups = kernels::matmul_layout(&key, &mut push, &call.slots);
            let need = kernels::matmul_write_bytes(
                call.variant.out_mode,
                call.write_xg,
                &call.slots,
                &push,
                self.ctx_len,
            );
            for (i, (&need, &have)) in need.iter().zip(&call.out_bytes).enumerate() {
                check_fits(&call.name, &format!("out{i}"), need, have)?;
            }
            self.cmd
                .dispatch(p, &call.set, bytemuck::bytes_of(&push), groups);
            if let Some((pool, names)) = self.profile.as_mut() {
                if (names.len() as u32) + 1 < pool.count() {
                    names.push(call.name.clone());
                    self.cmd.timestamp(pool, names.len() as u32);
                }
            }
        }
        self.cmd.barrier();
        Ok(())
    }

    fn after(&mut self, name: &str) {
        self.after_named(|| name.to_string());
    }

    /// Barrier after a dispatch (and a timestamp when profiling).
    fn after_named(&mut self, name: impl FnOnce() -> String) {
        if let Some((pool, names)) = self.profile.as_mut() {
            if (names.len() as u32) + 1 < pool.count() {
                names.push(name());
                self.cmd.timestamp(pool, names.len() as u32);
            }
        }
        self.cmd.barrier();
    }
}

/// A dispatch that would write `need` bytes of a binding holding `have` is refused.
fn check_fits(dispatch: &str, binding: &str, need: u64, have: u64) -> Result<(), EngineError> {
    if need > have {
        return Err(EngineError::DispatchOutOfBounds {
            dispatch: dispatch.to_string(),
            binding: binding.to_string(),
            need,
            have,
        });
    }
    Ok(())
}

fn missing(what: &str) -> EngineError {
    EngineError::Unsupported(format!("internal: no pipeline was created for `{what}`"))
}

/// The steps of the pass as data: for each fused matmul, the weights it reads, its input
/// and what it writes (model.rs turns each into dispatches and descriptor sets at load).
pub(crate) mod step {
    use std::sync::Arc;

    use vk::{BufferBinding, BufferView};

    use crate::activations::Activations;
    use crate::kernels::{AttentionBindings, InMode, OutMode};
    use crate::residency::TensorView;
    use crate::views::Views;

    /// What one fused matmul reads and writes, before it is split into calls.
    pub(crate) struct MatmulSpec<'a> {
        pub name: String,
        pub views: Vec<&'a TensorView>,
        pub in_mode: InMode,
        pub out_mode: OutMode,
        /// The dot input (xg for IN_RMSNORM).
        pub x: Arc<BufferView>,
        /// The raw residual the rms is taken of (IN_RMSNORM).
        pub xr: Option<Arc<BufferView>>,
        pub x_ld: usize,
        /// OUT_ADD: the next norm weight (binding, float offset); out1 receives x∘aux.
        pub aux: Option<(BufferBinding, u32)>,
        pub outs: [Option<BufferBinding>; 3],
        pub out_ld: usize,
        pub last_token_only: bool,
    }

    /// One layer's weights, and the norms it folds into the next step's input.
    pub(crate) struct LayerWeights<'w> {
        pub qkv: [&'w TensorView; 3],
        pub o: &'w TensorView,
        pub gate_up: [&'w TensorView; 2],
        pub down: &'w TensorView,
        pub ffn_norm: (BufferBinding, u32),
        /// The next layer's attn_norm, or output_norm after the last layer.
        pub next_norm: (BufferBinding, u32),
    }

    /// Row lengths: dim, n_heads·head_dim, hidden_dim, vocabulary.
    pub(crate) struct Dims {
        pub dim: usize,
        pub q_dim: usize,
        pub hidden: usize,
        pub vocab: usize,
    }

    /// q = rope(Wq·rmsnorm(x)); k_cache[pos] = rope(Wk·rmsnorm(x)); v_cache[pos] =
    /// Wv·rmsnorm(x). Reads xg = x∘attn_norm and x; writes q and layer l's caches.
    pub(crate) fn qkv<'w>(
        l: usize,
        w: &LayerWeights<'w>,
        a: &Activations,
        v: &Views,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        let caches = (a.key_cache[l].binding(), a.value_cache[l].binding());
        MatmulSpec {
            name: format!("blk.{l}.qkv"),
            views: w.qkv.to_vec(),
            in_mode: InMode::RmsNorm,
            out_mode: OutMode::Qkv,
            x: Arc::clone(&v.xg),
            xr: Some(Arc::clone(&v.x)),
            x_ld: d.dim,
            aux: None,
            outs: [Some(a.q.binding()), Some(caches.0), Some(caches.1)],
            out_ld: d.q_dim,
            last_token_only: false,
        }
    }

    /// att_out = softmax(q·K^T/sqrt(hd))·V over positions 0..=pos. Reads q and the caches
    /// (RGBA32F views `kc4`, `vc4`) and the step buffer; writes att_out.
    pub(crate) fn attention<'v>(
        v: &'v Views,
        kc4: &'v BufferView,
        vc4: &'v BufferView,
        a: &Activations,
    ) -> AttentionBindings<'v> {
        AttentionBindings {
            q: &v.q,
            k_cache: kc4,
            v_cache: vc4,
            out: a.att_out.binding(),
            step: a.step.binding(),
        }
    }

    /// x += Wo·att_out; xg = x∘ffn_norm. Reads att_out; writes x and xg.
    pub(crate) fn attn_output<'w>(
        l: usize,
        w: &LayerWeights<'w>,
        a: &Activations,
        v: &Views,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        residual_add(
            format!("blk.{l}.attn_output"),
            w.o,
            &v.att_out,
            d.q_dim,
            w.ffn_norm.clone(),
            a,
            d,
        )
    }

    /// hb = silu(Wgate·rmsnorm(x)) * (Wup·rmsnorm(x)). Reads xg = x∘ffn_norm and x;
    /// writes hb.
    pub(crate) fn gate_up<'w>(
        l: usize,
        w: &LayerWeights<'w>,
        a: &Activations,
        v: &Views,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        MatmulSpec {
            name: format!("blk.{l}.gate_up"),
            views: w.gate_up.to_vec(),
            in_mode: InMode::RmsNorm,
            out_mode: OutMode::Glu,
            x: Arc::clone(&v.xg),
            xr: Some(Arc::clone(&v.x)),
            x_ld: d.dim,
            aux: None,
            outs: [Some(a.hb.binding()), None, None],
            out_ld: d.hidden,
            last_token_only: false,
        }
    }

    /// x += Wdown·hb; xg = x∘(next attn_norm, or output_norm). Reads hb; writes x, xg.
    pub(crate) fn ffn_down<'w>(
        l: usize,
        w: &LayerWeights<'w>,
        a: &Activations,
        v: &Views,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        residual_add(
            format!("blk.{l}.ffn_down"),
            w.down,
            &v.hb,
            d.hidden,
            w.next_norm.clone(),
            a,
            d,
        )
    }

    /// logits = Wout·rmsnorm(x[last]). Reads xg = x∘output_norm and x of the last token;
    /// writes logits.
    pub(crate) fn logits<'w>(
        out: &'w TensorView,
        a: &Activations,
        v: &Views,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        MatmulSpec {
            name: "logits".into(),
            views: vec![out],
            in_mode: InMode::RmsNorm,
            out_mode: OutMode::Store,
            x: Arc::clone(&v.xg),
            xr: Some(Arc::clone(&v.x)),
            x_ld: d.dim,
            aux: None,
            outs: [Some(a.logits.binding()), None, None],
            out_ld: d.vocab,
            last_token_only: true,
        }
    }

    /// x += W·input (input rows `x_ld` floats apart); xg = x∘norm.
    fn residual_add<'w>(
        name: String,
        w: &'w TensorView,
        input: &Arc<BufferView>,
        x_ld: usize,
        norm: (BufferBinding, u32),
        a: &Activations,
        d: &Dims,
    ) -> MatmulSpec<'w> {
        MatmulSpec {
            name,
            views: vec![w],
            in_mode: InMode::Plain,
            out_mode: OutMode::Add,
            x: Arc::clone(input),
            xr: None,
            x_ld,
            aux: Some(norm),
            outs: [Some(a.x.binding()), Some(a.xg.binding()), None],
            out_ld: d.dim,
            last_token_only: false,
        }
    }
}
