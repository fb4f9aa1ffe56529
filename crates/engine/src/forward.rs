//! Recording the forward pass into a command buffer. Reads top to bottom, as llama2.c's
//! `forward()`: embedding → per layer (qkv [, heads], attention, output + residual
//! [post-norm], gate/up, down + residual [post-norm]) → logits (final norm folded in)
//! [→ softcap] → argmax. The bracketed steps exist for the families that need them
//! (`graph.rs`). One global barrier between
//! dependent dispatches; no host wait anywhere in here. What each step reads and writes
//! is in `step.rs`, built once at load (model.rs binds it; forward depends on model, model
//! on step, never the other way).

use vk::{CommandBuffer, QueryPool};

mod bounds;

use bounds::{check_fits, missing};

use crate::activations::Activations;
use crate::kernels::{self, MatmulPush};
use crate::model::{Batch, GpuModel, HeadsCall, MatmulCall, PostNormCall};
use crate::profile;
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
    pub kernels: &'a mut kernels::Kernels,
    pub model: &'a GpuModel,
    pub acts: &'a Activations,
    pub cfg: &'a Config,
    pub ctx_len: usize,
    /// Tokens in the batch, and the batch kind (the kernels' shapes); the last layer's
    /// tail for the last token turns them into one token of a decode step.
    pub n_tok: u32,
    pub batch: Batch,
    /// Timestamp after every dispatch, and the dispatch names, when profiling.
    pub profile: Option<(&'a QueryPool, &'a mut Vec<String>)>,
}

impl Recorder<'_> {
    /// The whole pass; `dump` copies the residual after every layer into `layer_dump`.
    ///
    /// Past its keys and values, the last layer computes only the rows whose result is
    /// used (llama.cpp likewise computes the last layer's rest only for the rows whose
    /// logits it wants), unless the residuals are dumped:
    /// - a prompt chunk that is not the last (`Head::None`) leaves behind only the
    ///   caches (the next chunk starts again from the embedding), so its last layer stops
    ///   once its keys and values are written;
    /// - the logits are the last token's, so the last layer's rest runs for that token
    ///   alone ([`Recorder::last_token_rest`]).
    pub fn forward(&mut self, head: Head, dump: bool) -> Result<(), EngineError> {
        self.begin_profile();
        self.embed()?;
        let n_layers = self.model.layers.len();
        for l in 0..n_layers {
            if !dump && l + 1 == n_layers {
                self.layer_kv(l)?;
                if head == Head::LogitsArgmax {
                    self.last_token_rest(l)?;
                }
                break;
            }
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
        profile::begin(self.cmd, &mut self.profile);
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
        self.layer_kv(l)?;
        self.attention(l, 0)?;
        self.after_named(|| format!("blk.{l}.attention"));
        self.layer_rest(l)
    }

    /// The rest of layer `l` past its keys and values for the batch's last token alone,
    /// as a one-token decode step runs it: the token's attention row goes to row 0 of
    /// att_out, its residual is copied to row 0 of x, and the batch becomes that one token
    /// (the decode kernels, row 0 everywhere, the head reading row 0).
    fn last_token_rest(&mut self, l: usize) -> Result<(), EngineError> {
        let last = self.n_tok - 1;
        self.attention(l, last)?;
        if last > 0 {
            // the copy only touches x, which attention does not read: one barrier for both
            let row = (self.cfg.dim * 4) as u64;
            self.cmd.copy_buffer(
                &self.acts.x,
                &self.acts.x,
                &[(u64::from(last) * row, 0, row)],
            );
        }
        self.after_named(|| format!("blk.{l}.attention"));
        self.n_tok = 1;
        self.batch = Batch::Decode;
        self.layer_rest(l)
    }

    /// att_out[t - t0] = softmax(q[t]·K^T·scale)·V over layer `l`'s window of positions
    /// ..=pos(t), for the batch's tokens t0.. (no barrier after it).
    fn attention(&mut self, l: usize, t0: u32) -> Result<(), EngineError> {
        let layer = &self.model.layers[l];
        let push = kernels::AttentionPush {
            t0,
            ..layer.attention_push
        };
        let attention = self
            .kernels
            .attention_ref(push.head_dim)
            .ok_or_else(|| missing("attention"))?;
        let rows = self.n_tok - t0;
        let need = u64::from(rows) * u64::from(push.n_heads * push.head_dim) * 4;
        check_fits("attention", "att_out", need, self.acts.att_out.size())?;
        self.cmd.dispatch(
            attention,
            &layer.attention,
            bytemuck::bytes_of(&push),
            [self.cfg.n_heads as u32, rows, 1],
        );
        Ok(())
    }

    /// Layer `l` after its attention: the output projection, the feed-forward block, and
    /// the post-norms of the families that have them.
    fn layer_rest(&mut self, l: usize) -> Result<(), EngineError> {
        let model = self.model;
        let layer = &model.layers[l];
        // x += Wo·att_out (post-norm families: y = Wo·att_out; x += rmsnorm(y)∘w)
        self.matmuls(&layer.attn_output)?;
        if let Some(p) = &layer.post_attn {
            self.post_norm(p, || format!("blk.{l}.post_attention_norm"))?;
        }
        // hb = act(Wgate·rmsnorm(x)) * (Wup·rmsnorm(x))
        self.matmuls(&layer.gate_up)?;
        // x += Wdown·hb (post-norm families: y = Wdown·hb; x += rmsnorm(y)∘w)
        self.matmuls(&layer.ffn_down)?;
        if let Some(p) = &layer.post_ffn {
            self.post_norm(p, || format!("blk.{l}.post_ffw_norm"))?;
        }
        Ok(())
    }

    /// The start of layer `l` that fills its caches: q, and the keys and values of the
    /// batch's positions.
    fn layer_kv(&mut self, l: usize) -> Result<(), EngineError> {
        let layer = &self.model.layers[l];
        // q = rope(Wq·rmsnorm(x)); k_cache[pos] = rope(Wk·rmsnorm(x)); v_cache[pos] = Wv·rmsnorm(x)
        self.matmuls(&layer.qkv)?;
        // (plain q/k/v) + biases, per-head norms, rope, cache writes
        if let Some(h) = &layer.heads {
            self.heads(l, h)?;
        }
        Ok(())
    }

    /// heads.comp: every (head, token) of the plain q/k/v row to q and the caches.
    fn heads(&mut self, l: usize, h: &HeadsCall) -> Result<(), EngineError> {
        let p = self.kernels.heads_ref().ok_or_else(|| missing("heads"))?;
        let push = h.push;
        let f = 4u64;
        let need_q = u64::from(self.n_tok) * u64::from(push.q_ld) * f;
        check_fits("heads", "q", need_q, self.acts.q.size())?;
        let need_kv = self.ctx_len as u64 * u64::from(push.kv_ld) * f;
        check_fits("heads", "k_cache", need_kv, self.acts.key_cache[l].size())?;
        check_fits("heads", "v_cache", need_kv, self.acts.value_cache[l].size())?;
        let need_in = u64::from(self.n_tok) * u64::from(push.qkv_ld) * f;
        check_fits("heads", "qkv", need_in, self.acts.qkv.size())?;
        self.cmd.dispatch(
            p,
            &h.set,
            bytemuck::bytes_of(&push),
            kernels::heads_groups(&push, self.n_tok),
        );
        self.after_named(|| format!("blk.{l}.heads"));
        Ok(())
    }

    /// post_norm.comp: x += rmsnorm(y)∘w; xg = x∘g, one workgroup per token.
    fn post_norm(
        &mut self,
        call: &PostNormCall,
        name: impl FnOnce() -> String,
    ) -> Result<(), EngineError> {
        let p = self
            .kernels
            .post_norm_ref()
            .ok_or_else(|| missing("post_norm"))?;
        let need = u64::from(self.n_tok) * u64::from(call.push.dim) * 4;
        for (what, have) in [
            ("x", self.acts.x.size()),
            ("xg", self.acts.xg.size()),
            ("y", self.acts.y.size()),
        ] {
            check_fits("post_norm", what, need, have)?;
        }
        self.cmd.dispatch(
            p,
            &call.set,
            bytemuck::bytes_of(&call.push),
            [self.n_tok, 1, 1],
        );
        self.after_named(name);
        Ok(())
    }

    /// logits = Wout·rmsnorm(x[last]); result = argmax(logits)
    pub fn logits_argmax(&mut self) -> Result<(), EngineError> {
        self.head(false)
    }

    /// logits[t] = Wout·rmsnorm(x[t]); result[t] = argmax(logits[t]) for every token t
    /// of the batch: a batched decode step's head, one matmul over the slots' tokens
    /// through the batch's own kernel (so a token's row is reduced the same way whatever
    /// the batch size), then one argmax workgroup per row.
    pub fn logits_argmax_rows(&mut self) -> Result<(), EngineError> {
        self.head(true)
    }

    /// The head over the last token, or over every token (`all`).
    fn head(&mut self, all: bool) -> Result<(), EngineError> {
        let model = self.model;
        let rows = if all { self.n_tok } else { 1 };
        let have = self.acts.logits.size();
        let need = u64::from(rows) * self.cfg.vocab_size as u64 * 4;
        check_fits("logits", "logits", need, have)?;
        check_fits(
            "argmax",
            "result",
            u64::from(rows) * 4,
            self.acts.result.size(),
        )?;
        self.matmuls_of(&model.logits, all)?;
        if let Some(c) = &model.softcap {
            let p = self
                .kernels
                .softcap_ref()
                .ok_or_else(|| missing("softcap"))?;
            let mut push = c.push;
            push.n *= rows;
            check_fits("softcap", "logits", u64::from(push.n) * 4, have)?;
            let groups = push.n.div_ceil(kernels::SOFTCAP_WG);
            self.cmd
                .dispatch(p, &c.set, bytemuck::bytes_of(&push), [groups, 1, 1]);
            self.after("softcap");
        }
        let push = kernels::ArgmaxPush {
            n: self.cfg.vocab_size as u32,
        };
        self.cmd.dispatch(
            &self.kernels.argmax,
            &self.model.argmax,
            bytemuck::bytes_of(&push),
            [rows, 1, 1],
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
        self.matmuls_of(calls, false)
    }

    /// [`Recorder::matmuls`]; `all_tokens`: a `last_token_only` call (the logits) runs
    /// over every token of the batch too.
    fn matmuls_of(&mut self, calls: &[MatmulCall], all_tokens: bool) -> Result<(), EngineError> {
        for call in calls {
            let variant = crate::model::MatmulVariant {
                last_token_only: call.variant.last_token_only && !all_tokens,
                ..call.variant
            };
            let (n_tok, x_tok0) = if variant.last_token_only {
                (1, self.n_tok - 1)
            } else {
                (self.n_tok, 0)
            };
            let key = self
                .kernels
                .matmul_key(&variant, self.batch, self.model.neox, self.model.head_dim)
                .for_tokens(n_tok);
            // created here on first use: a step that no run takes (a small tile, the
            // batched head) costs neither load time nor the driver's memory for its code
            let p = self.kernels.matmul(key)?;
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
            bounds::check_matmul(call, &push, self.ctx_len)?;
            self.cmd
                .dispatch(p, &call.set, bytemuck::bytes_of(&push), groups);
            profile::mark(self.cmd, &mut self.profile, || call.name.clone());
        }
        self.cmd.barrier();
        Ok(())
    }

    fn after(&mut self, name: &str) {
        self.after_named(|| name.to_string());
    }

    /// Barrier after a dispatch (and a timestamp when profiling).
    fn after_named(&mut self, name: impl FnOnce() -> String) {
        profile::mark(self.cmd, &mut self.profile, name);
        self.cmd.barrier();
    }
}
