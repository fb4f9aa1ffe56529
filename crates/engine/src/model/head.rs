//! The head: logits = Wout·rmsnorm(x) (the final norm folded into the matmul's input),
//! the logit softcap of the models that cap them, and the argmax.

use arch::Config;
use vk::DescriptorSet;

use super::bounds::{check_fits, missing};
use super::record::Recorder;
use super::to_u32;
use crate::activations::Activations;
use crate::kernels::{self, Kernels, SoftcapBindings, SoftcapPush};
use crate::EngineError;

impl Recorder<'_> {
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
}

/// `softcap.comp` bound to the logits.
pub struct SoftcapCall {
    pub set: DescriptorSet,
    pub push: SoftcapPush,
}

/// `softcap.comp` over the logits, when the model caps them.
pub(super) fn softcap_call(
    cfg: &Config,
    acts: &Activations,
    kernels: &mut Kernels,
) -> Result<Option<SoftcapCall>, EngineError> {
    let Some(cap) = cfg.final_logit_softcap else {
        return Ok(None);
    };
    let bindings = SoftcapBindings {
        logits: acts.logits.binding(),
    };
    let set = kernels
        .softcap()?
        .descriptor_set_with(&bindings.descriptors())?;
    let push = SoftcapPush {
        n: to_u32(cfg.vocab_size as u64, "vocabulary")?,
        cap,
    };
    Ok(Some(SoftcapCall { set, push }))
}
