//! Recording the forward pass into a command buffer. Reads top to bottom, as llama2.c's
//! `forward()`: embedding → per layer (layer.rs) → logits (final norm folded in)
//! [→ softcap] → argmax. One global barrier between dependent dispatches; no host wait
//! anywhere in here. Each kind of step is recorded in the file that binds it (embed.rs,
//! layer.rs, matmul.rs, head.rs).

use vk::{CommandBuffer, QueryPool};

use super::GpuModel;
use crate::activations::Activations;
use crate::kernels::{self, Batch};
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

    pub(super) fn after(&mut self, name: &str) {
        self.after_named(|| name.to_string());
    }

    /// Barrier after a dispatch (and a timestamp when profiling).
    pub(super) fn after_named(&mut self, name: impl FnOnce() -> String) {
        profile::mark(self.cmd, &mut self.profile, name);
        self.cmd.barrier();
    }
}
