//! The matmuls: a weight checked for the kernels, a fused matmul split into the
//! dispatches that compute it and bound (at load), and those dispatches recorded.

use std::sync::Arc;

use gguf::GgmlType;
use vk::{BufferBinding, BufferView, DescriptorSet};

use super::bounds::check_fits;
use super::record::Recorder;
use super::{to_u32, Bind};
use crate::kernels::{
    self, k_texel_aligned, Batch, Kernels, MatmulBindings, MatmulPush, MatmulVariant, OutMode,
    Slot, CHUNK,
};
use crate::profile;
use crate::step::MatmulSpec;
use crate::views::Views;
use crate::EngineError;
use residency::{TensorView, ViewPart, Weights};

/// One matmul dispatch (per batch kind the pipeline differs only in shape). Every view
/// it reads lies in binding 0 at its own word offset (one texel view spanning q, k and v,
/// or a dispatch per view), except gate/up (bindings 0 and 1).
pub struct MatmulCall {
    pub name: String,
    pub set: DescriptorSet,
    pub slots: Vec<Slot>,
    pub variant: MatmulVariant,
    pub ncols: u32,
    pub x_ld: u32,
    pub out_ld: u32,
    pub aux_ofs: u32,
    /// OUT_ADD: also write x∘aux (the next rmsnorm's input) into out1.
    pub write_xg: bool,
    /// Bytes bound at out0, out1, out2 (checked against what a dispatch writes when it
    /// is recorded: [`kernels::matmul_write_bytes`]).
    pub out_bytes: [u64; 3],
}

/// A 2-D weight the matmul kernels can read: `rows` rows of `cols` elements.
pub(super) fn matrix<'w>(
    weights: &'w Weights,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<&'w TensorView, EngineError> {
    let v = weights.view(name).ok_or_else(|| EngineError::Tensor {
        name: name.into(),
        why: "missing from the model".into(),
    })?;
    let want = [cols as u64, rows as u64];
    if v.shape.as_slice() != want {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: format!("shape {:?}, the metadata implies {:?}", v.shape, want),
        });
    }
    if !kernels::supported_weight_type(v.ty) {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: format!(
                "type {} is not read by the GPU kernels ({} are)",
                v.ty.name(),
                kernels::supported_weight_type_names()
            ),
        });
    }
    if kernels::is_k_quant(v.ty) && !cols.is_multiple_of(kernels::K_SUPER_BLOCK) {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: format!(
                "rows of {cols} elements: the GPU kernels read {} in rows that are a multiple of {} columns (whole super-blocks)",
                v.ty.name(),
                kernels::K_SUPER_BLOCK
            ),
        });
    }
    if !cols.is_multiple_of(CHUNK) {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: format!("rows of {cols} elements: the GPU kernels need a multiple of {CHUNK}"),
        });
    }
    for p in &v.parts {
        if !p.byte_offset.is_multiple_of(4) {
            return Err(EngineError::Tensor {
                name: name.into(),
                why: format!(
                    "part at byte offset {} is not 4-byte aligned",
                    p.byte_offset
                ),
            });
        }
    }
    Ok(v)
}

/// An F32 vector of `n` elements (a norm weight) bound whole: binding and float offset.
pub(super) fn vector(
    weights: &Weights,
    name: &str,
    n: usize,
) -> Result<(BufferBinding, u32), EngineError> {
    let v = weights.view(name).ok_or_else(|| EngineError::Tensor {
        name: name.into(),
        why: "missing from the model".into(),
    })?;
    if v.ty != GgmlType::F32 || v.shape.as_slice() != [n as u64] || v.parts.len() != 1 {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: format!(
                "expected one F32 part of shape [{n}], found {} {:?} in {} part(s)",
                v.ty.name(),
                v.shape,
                v.parts.len()
            ),
        });
    }
    let p = &v.parts[0];
    if !p.byte_offset.is_multiple_of(4) {
        return Err(EngineError::Tensor {
            name: name.into(),
            why: "not 4-byte aligned".into(),
        });
    }
    Ok((p.binding.clone(), to_u32(p.byte_offset / 4, "norm offset")?))
}

/// Splits a fused matmul into dispatches: one when every view has the same type, is a
/// single part and one texel view spans them all (q/k/v read through binding 0), else one
/// per (view, part) (gate/up: one per pair of matching parts, in bindings 0 and 1).
pub(super) fn matmul_calls(
    spec: MatmulSpec<'_>,
    b: &Bind<'_>,
    kernels: &mut Kernels,
    views: &mut Views,
) -> Result<Vec<MatmulCall>, EngineError> {
    let dummy = &b.acts.dummy.binding();
    let ncols = spec.views[0].shape[0];
    let split_k = kernels.column_split(kernels.shapes().decode.wg, to_u32(ncols, "columns")?);
    // (slot, weight view in binding 0 or 1, word offset, part) per dispatch
    type Member<'p> = (usize, Arc<BufferView>, u64, &'p ViewPart);
    let mut groups: Vec<Vec<Member<'_>>> = Vec::new();
    if spec.out_mode.is_gated() {
        let (g, u) = (spec.views[0], spec.views[1]);
        let aligned = g.ty == u.ty
            && g.parts.len() == u.parts.len()
            && g.parts
                .iter()
                .zip(&u.parts)
                .all(|(a, b)| a.first_row == b.first_row && a.n_rows == b.n_rows);
        if !aligned {
            return Err(EngineError::Unsupported(format!(
                "{}: gate ({} in {} parts) and up ({} in {} parts) must have the same type and row split",
                spec.name,
                g.ty.name(),
                g.parts.len(),
                u.ty.name(),
                u.parts.len()
            )));
        }
        for (pg, pu) in g.parts.iter().zip(&u.parts) {
            groups.push(vec![
                (
                    0,
                    views.weights(g.ty, pg, g.row_bytes)?,
                    pg.byte_offset / 4,
                    pg,
                ),
                (
                    1,
                    views.weights(u.ty, pu, u.row_bytes)?,
                    pu.byte_offset / 4,
                    pu,
                ),
            ]);
        }
    } else {
        let same_type = spec.views.iter().all(|v| v.ty == spec.views[0].ty);
        let whole = spec.views.iter().all(|v| v.parts.len() == 1);
        let spanning = if spec.views.len() > 1 && same_type && whole {
            let parts: Vec<(&ViewPart, u64)> = spec
                .views
                .iter()
                .map(|v| (&v.parts[0], v.row_bytes))
                .collect();
            views.spanning(spec.views[0].ty, &parts)?
        } else {
            None
        };
        if let Some((view, ofs)) = spanning {
            groups.push(
                spec.views
                    .iter()
                    .enumerate()
                    .map(|(s, v)| (s, Arc::clone(&view), ofs[s] / 4, &v.parts[0]))
                    .collect(),
            );
        } else {
            for (s, v) in spec.views.iter().enumerate() {
                for p in &v.parts {
                    let w = views.weights(v.ty, p, v.row_bytes)?;
                    groups.push(vec![(s, w, p.byte_offset / 4, p)]);
                }
            }
        }
    }
    let types: Vec<GgmlType> = if spec.out_mode.is_gated() {
        spec.views[0]
            .parts
            .iter()
            .map(|_| spec.views[0].ty)
            .collect()
    } else if groups.len() == 1 {
        vec![spec.views[0].ty]
    } else {
        spec.views
            .iter()
            .flat_map(|v| v.parts.iter().map(|_| v.ty))
            .collect()
    };
    let (aux, aux_ofs) = spec.aux.clone().unwrap_or((dummy.clone(), 0));
    // a store of several views (a plain q/k/v) lays them end to end in each out0 row;
    // every other mode writes each view at its own rows (or binding)
    let mut row_base = vec![0u64; spec.views.len()];
    if spec.out_mode == OutMode::Store {
        for s in 1..spec.views.len() {
            row_base[s] = row_base[s - 1] + spec.views[s - 1].shape[1];
        }
    }
    let n_groups = groups.len();
    let mut calls = Vec::with_capacity(n_groups);
    for (gi, (group, wtype)) in groups.into_iter().zip(types).enumerate() {
        let mut w = [Arc::clone(&views.dummy_w), Arc::clone(&views.dummy_w)];
        let mut slots = Vec::new();
        for (k, (s, view, wofs, p)) in group.into_iter().enumerate() {
            // gate/up in bindings 0 and 1; every other view through binding 0
            w[if spec.out_mode.is_gated() { k } else { 0 }] = view;
            slots.push(Slot {
                slot: s,
                nrows: to_u32(p.n_rows, "rows")?,
                wofs: to_u32(wofs, "weight offset")?,
                orow: to_u32(row_base[s] + p.first_row, "first row")?,
            });
        }
        let o = |i: usize| spec.outs[i].clone().unwrap_or_else(|| dummy.clone());
        let bindings = MatmulBindings {
            w0: &w[0],
            w1: &w[1],
            x: &spec.x,
            aux: aux.clone(),
            out0: o(0),
            out1: o(1),
            out2: o(2),
            step: b.acts.step.binding(),
            xr: spec.xr.as_ref().unwrap_or(&spec.x),
        };
        // the rows that own workgroups (gate's, not up's: a gated pair reads both)
        let rows: Vec<u32> = slots
            .iter()
            .filter(|s| !spec.out_mode.is_gated() || s.slot == 0)
            .map(|s| s.nrows)
            .collect();
        let variant = MatmulVariant {
            wtype,
            in_mode: spec.in_mode,
            out_mode: spec.out_mode,
            last_token_only: spec.last_token_only,
            split_k,
            pairs: kernels.decode_pairs(split_k, spec.out_mode.is_gated(), &rows),
            texel_aligned: k_texel_aligned(wtype, &slots),
        };
        // the prefill pipeline has an identical set layout, so it accepts this set too
        let set = kernels
            .matmul(kernels.matmul_key(&variant, Batch::Decode))?
            .descriptor_set_with(&bindings.descriptors())?;
        calls.push(MatmulCall {
            name: if n_groups == 1 {
                spec.name.clone()
            } else {
                format!("{}#{gi}", spec.name)
            },
            set,
            slots,
            variant,
            ncols: to_u32(ncols, "columns")?,
            x_ld: to_u32(spec.x_ld as u64, "x stride")?,
            out_ld: to_u32(spec.out_ld as u64, "out stride")?,
            aux_ofs,
            write_xg: spec.aux.is_some() && spec.out_mode == OutMode::Add,
            out_bytes: [o(0).range, o(1).range, o(2).range],
        });
    }
    Ok(calls)
}

impl Recorder<'_> {
    /// The dispatches of one fused matmul (several only for split or mixed-type weights;
    /// they write disjoint rows, so no barrier between them).
    pub(super) fn matmuls(&mut self, calls: &[MatmulCall]) -> Result<(), EngineError> {
        self.matmuls_of(calls, false)
    }

    /// [`Recorder::matmuls`]; `all_tokens`: a `last_token_only` call (the logits) runs
    /// over every token of the batch too.
    pub(super) fn matmuls_of(
        &mut self,
        calls: &[MatmulCall],
        all_tokens: bool,
    ) -> Result<(), EngineError> {
        for call in calls {
            let variant = MatmulVariant {
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
                .matmul_key(&variant, self.batch)
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
                ..MatmulPush::default()
            };
            let groups = kernels::matmul_layout(&key, &mut push, &call.slots);
            check_matmul(call, &push, self.ctx_len)?;
            self.cmd
                .dispatch(p, &call.set, bytemuck::bytes_of(&push), groups);
            profile::mark(self.cmd, &mut self.profile, || call.name.clone());
        }
        self.cmd.barrier();
        Ok(())
    }
}

/// What a matmul dispatch of `call` with `push` writes (out0, out1, out2) fits what its
/// set binds ([`kernels::matmul_write_bytes`]).
fn check_matmul(call: &MatmulCall, push: &MatmulPush, ctx_len: usize) -> Result<(), EngineError> {
    let need = kernels::matmul_write_bytes(
        call.variant.out_mode,
        call.write_xg,
        &call.slots,
        push,
        ctx_len,
    );
    for (i, (&need, &have)) in need.iter().zip(&call.out_bytes).enumerate() {
        check_fits(&call.name, &format!("out{i}"), need, have)?;
    }
    Ok(())
}
