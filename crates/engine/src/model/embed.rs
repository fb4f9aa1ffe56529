//! The embedding gather bound: the table's row-range parts, the first norm weight (the
//! gather also writes x∘g), and the embedding scale.

use std::sync::Arc;

use arch::Config;
use vk::BufferBinding;

use super::bounds::{check_fits, missing};
use super::record::Recorder;
use super::{to_u32, EmbedCall};
use crate::activations::Activations;
use crate::kernels::{self, EmbedBindings, Kernels};
use crate::views::Views;
use crate::EngineError;
use residency::TensorView;

pub(super) fn embed_call(
    view: &TensorView,
    norm: (BufferBinding, u32),
    acts: &Activations,
    kernels: &mut Kernels,
    views: &mut Views,
    cfg: &Config,
) -> Result<EmbedCall, EngineError> {
    let dim = cfg.dim;
    if view.parts.len() > 3 {
        return Err(EngineError::Tensor {
            name: view.name.clone(),
            why: format!(
                "{} row-range parts; the embedding gather binds at most 3",
                view.parts.len()
            ),
        });
    }
    let mut push = kernels::EmbedPush {
        ncols: to_u32(dim as u64, "dim")?,
        out_ld: to_u32(dim as u64, "dim")?,
        n_tok: 1,
        g_ofs: norm.1,
        part_end: [u32::MAX; 4],
        wofs: [0; 4],
        scale: cfg.embd_scale,
    };
    let mut w = [
        Arc::clone(&views.dummy_w),
        Arc::clone(&views.dummy_w),
        Arc::clone(&views.dummy_w),
    ];
    for (i, p) in view.parts.iter().enumerate() {
        w[i] = views.weights(view.ty, p, view.row_bytes)?;
        push.part_end[i] = to_u32(p.first_row + p.n_rows, "embedding rows")?;
        push.wofs[i] = to_u32(p.byte_offset / 4, "embedding offset")?;
    }
    let bindings = EmbedBindings {
        w0: &w[0],
        w1: &w[1],
        w2: &w[2],
        x: acts.x.binding(),
        step: acts.step.binding(),
        xg: acts.xg.binding(),
        g: norm.0,
    };
    let set = kernels
        .embed(view.ty)?
        .descriptor_set_with(&bindings.descriptors())?;
    Ok(EmbedCall {
        set,
        ty: view.ty,
        push,
    })
}

impl Recorder<'_> {
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
}
