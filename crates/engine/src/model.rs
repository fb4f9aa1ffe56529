//! The Llama graph bound to the GPU: for every dispatch of a token, the weight views,
//! activation buffers and the descriptor set that ties them together, built once at load.
//!
//! Per layer (docs/design.md, "Decode"), five dispatches:
//! 1. `qkv`: rmsnorm(x, attn_norm) folded into the input of q/k/v (one dispatch over three
//!    weight views); rope on q and k; k and v written into the cache row of their position;
//! 2. `attention`: causal GQA attention over the cache;
//! 3. `attn_output`: x += Wo · attention output;
//! 4. `gate_up`: rmsnorm(x, ffn_norm) folded in; silu(gate) · up in the epilogue;
//! 5. `ffn_down`: x += Wdown · hb.
//!
//! plus the embedding gather first, and the logits (output_norm folded in) and argmax last.
//!
//! The other families (qwen2, qwen3, gemma3; `graph.rs`) keep this shape and add steps of
//! their own (`families.rs`): a plain q/k/v matmul followed by `heads.comp` (biases, Q/K
//! norms, the layer's RoPE, the cache writes); for post-norm families, output matmuls that
//! store and `post_norm.comp` for the residual adds; GELU gating as a gate/up epilogue;
//! `softcap.comp` after the logits.

mod embed;
mod families;

pub use families::{HeadsCall, PostNormCall, SoftcapCall};

use arch::{Config, LayerTensor, ModelTensor, RopeMode};
use gguf::GgmlType;
use std::sync::Arc;

use vk::{BufferBinding, BufferView, DescriptorSet};

use crate::activations::Activations;
use crate::graph::GraphShape;
use crate::kernels::{
    self, k_texel_aligned, ArgmaxBindings, AttentionPush, Kernels, MatmulBindings, OutMode, Slot,
    CHUNK,
};
use crate::step::{self, Dims, Io, LayerWeights, MatmulSpec};
use crate::views::Views;
use crate::EngineError;
use residency::{TensorView, ViewPart, Weights};

pub use crate::kernels::{Batch, MatmulVariant};

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

/// The dispatches of one decoder layer.
pub struct LayerCalls {
    pub qkv: Vec<MatmulCall>,
    /// After a plain q/k/v matmul: biases, Q/K norms, rope, cache writes (`None`: fused
    /// into qkv's epilogue).
    pub heads: Option<HeadsCall>,
    pub attention: DescriptorSet,
    /// The layer's heads, score scale and window.
    pub attention_push: AttentionPush,
    pub attn_output: Vec<MatmulCall>,
    /// x += rmsnorm(attn_output)∘post_attention_norm (`None`: added in its epilogue).
    pub post_attn: Option<PostNormCall>,
    pub gate_up: Vec<MatmulCall>,
    pub ffn_down: Vec<MatmulCall>,
    /// x += rmsnorm(ffn_down)∘post_ffw_norm (`None`: added in its epilogue).
    pub post_ffn: Option<PostNormCall>,
}

/// The embedding gather.
pub struct EmbedCall {
    pub set: DescriptorSet,
    pub ty: GgmlType,
    pub push: kernels::EmbedPush,
}

/// The whole graph, bound.
///
/// Field order is drop order: the descriptor sets go before the texel views they name.
pub struct GpuModel {
    pub embed: EmbedCall,
    pub layers: Vec<LayerCalls>,
    pub logits: Vec<MatmulCall>,
    /// logits = cap·tanh(logits/cap), when the model caps them.
    pub softcap: Option<SoftcapCall>,
    pub argmax: DescriptorSet,
    /// Rope pairs (2i, 2i+1) or (i, i + head_dim/2).
    pub neox: bool,
    pub head_dim: u32,
    /// The batch kind prompt chunks run as (the GEMM where the device runs it).
    pub prefill: Batch,
    /// Texel views of the weights and activations the sets read: held, never read, so
    /// that they outlive the sets that name them.
    _views: Vec<Arc<BufferView>>,
}

fn to_u32(v: u64, what: &str) -> Result<u32, EngineError> {
    u32::try_from(v)
        .map_err(|_| EngineError::Unsupported(format!("{what} = {v} does not fit in 32 bits")))
}

/// A 2-D weight the matmul kernels can read: `rows` rows of `cols` elements.
fn matrix<'w>(
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
fn vector(weights: &Weights, name: &str, n: usize) -> Result<(BufferBinding, u32), EngineError> {
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

impl GpuModel {
    /// Binds every dispatch and creates every pipeline they need.
    pub fn build(
        ctx: &Arc<vk::Context>,
        cfg: &Config,
        weights: &Weights,
        acts: &Activations,
        kernels: &mut Kernels,
    ) -> Result<GpuModel, EngineError> {
        let shape = GraphShape::of(cfg);
        let neox = cfg.rope_mode == RopeMode::Neox;
        let hd = cfg.head_dim;
        if !hd.is_multiple_of(4)
            || hd / 2 > kernels::STEP_FREQS_MAX
            || cfg.n_kv_heads == 0
            || !cfg.n_heads.is_multiple_of(cfg.n_kv_heads)
        {
            return Err(EngineError::Unsupported(format!(
                "head_dim {hd} with {} heads and {} kv heads (need a head_dim that is a multiple of 4 and <= {}, and n_heads a multiple of n_kv_heads)",
                cfg.n_heads,
                cfg.n_kv_heads,
                2 * kernels::STEP_FREQS_MAX
            )));
        }
        if shape.fused_qkv && neox && !hd.is_multiple_of(16) {
            return Err(EngineError::Unsupported(format!(
                "neox rope fused into the q/k/v matmul with head_dim {hd} (a multiple of 16 is needed)"
            )));
        }
        if !cfg.attn_scale.is_finite() || cfg.attn_scale <= 0.0 {
            return Err(EngineError::Unsupported(format!(
                "attention score scale {}",
                cfg.attn_scale
            )));
        }
        if cfg.vocab_size as u64 >= u64::from(kernels::ARGMAX_NON_FINITE) {
            return Err(EngineError::Unsupported(format!(
                "a vocabulary of {} tokens (the GPU argmax carries up to 2^31 - 1)",
                cfg.vocab_size
            )));
        }
        let (dim, hidden, q_dim, kv_dim) =
            (cfg.dim, cfg.hidden_dim, cfg.n_heads * hd, cfg.kv_dim());
        let d = Dims {
            dim,
            q_dim,
            qkv: q_dim + 2 * kv_dim,
            hidden,
            vocab: cfg.vocab_size,
        };
        let dummy = acts.dummy.binding();
        let head_dim = to_u32(hd as u64, "head_dim")?;
        let mut views = Views::new(ctx, acts)?;

        let embed_view = matrix(weights, ModelTensor::TokenEmbd.name(), cfg.vocab_size, dim)?;
        let first_norm = vector(weights, &LayerTensor::AttnNorm.name(0), dim)?;
        let embed = embed::embed_call(embed_view, first_norm, acts, kernels, &mut views, cfg)?;

        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let m = |t: LayerTensor, rows, cols| matrix(weights, &t.name(l), rows, cols);
            let q = m(LayerTensor::AttnQ, q_dim, dim)?;
            let k = m(LayerTensor::AttnK, kv_dim, dim)?;
            let v = m(LayerTensor::AttnV, kv_dim, dim)?;
            let o = m(LayerTensor::AttnOutput, dim, q_dim)?;
            let gate = m(LayerTensor::FfnGate, hidden, dim)?;
            let up = m(LayerTensor::FfnUp, hidden, dim)?;
            let down = m(LayerTensor::FfnDown, dim, hidden)?;
            let ffn_norm = vector(weights, &LayerTensor::FfnNorm.name(l), dim)?;
            // the norm applied after this layer: the next layer's attn_norm, or output_norm
            let next_norm = if l + 1 < cfg.n_layers {
                vector(weights, &LayerTensor::AttnNorm.name(l + 1), dim)?
            } else {
                vector(weights, ModelTensor::OutputNorm.name(), dim)?
            };
            let (kc, vc) = (acts.key_cache[l].binding(), acts.value_cache[l].binding());
            let (biases, qk_norms, post_norms) = families::layer_vectors(weights, cfg, l)?;

            let lw = LayerWeights {
                qkv: [q, k, v],
                o,
                gate_up: [gate, up],
                down,
                ffn_norm,
                next_norm,
                biases,
                qk_norms,
                post_norms,
            };
            let (kc4, vc4) = (views.rgba(kc)?, views.rgba(vc)?);
            let attention = kernels
                .attention(head_dim)?
                .descriptor_set_with(&step::attention(&views, &kc4, &vc4, acts).descriptors())?;
            let attention_push = families::attention_push(cfg, l)?;
            let io = Io {
                a: acts,
                v: &views,
                d: &d,
            };
            let (qkv, heads) = if shape.fused_qkv {
                (step::qkv(l, &lw, &io), None)
            } else {
                let h = families::heads_call(l, cfg, &lw, acts, kernels)?;
                (step::qkv_plain(l, &lw, &io), Some(h))
            };
            let (attn_output, ffn_down, post_attn, post_ffn) = match &lw.post_norms {
                Some([pa, pf]) => (
                    step::attn_output_store(l, &lw, &io),
                    step::ffn_down_store(l, &lw, &io),
                    Some(families::post_norm_call(
                        cfg,
                        pa,
                        &lw.ffn_norm,
                        acts,
                        kernels,
                    )?),
                    Some(families::post_norm_call(
                        cfg,
                        pf,
                        &lw.next_norm,
                        acts,
                        kernels,
                    )?),
                ),
                None => (
                    step::attn_output(l, &lw, &io),
                    step::ffn_down(l, &lw, &io),
                    None,
                    None,
                ),
            };
            let gate_up = step::gate_up(l, &lw, &io, shape.gelu);
            let mut build =
                |s: MatmulSpec| matmul_calls(s, &dummy, acts, kernels, &mut views, neox, head_dim);
            layers.push(LayerCalls {
                qkv: build(qkv)?,
                heads,
                attention,
                attention_push,
                attn_output: build(attn_output)?,
                post_attn,
                gate_up: build(gate_up)?,
                ffn_down: build(ffn_down)?,
                post_ffn,
            });
        }

        let out_view = matrix(weights, cfg.output_tensor().name(), cfg.vocab_size, dim)?;
        let logits = matmul_calls(
            step::logits(
                out_view,
                &Io {
                    a: acts,
                    v: &views,
                    d: &d,
                },
            ),
            &dummy,
            acts,
            kernels,
            &mut views,
            neox,
            head_dim,
        )?;
        let softcap = families::softcap_call(cfg, acts, kernels)?;
        let argmax = ArgmaxBindings {
            logits: acts.logits.binding(),
            result: acts.result.binding(),
        };
        let argmax = kernels.argmax.descriptor_set_with(&argmax.descriptors())?;
        Ok(GpuModel {
            embed,
            layers,
            logits,
            softcap,
            argmax,
            neox,
            head_dim,
            prefill: kernels.prefill_batch(),
            _views: views.all,
        })
    }
}

/// Splits a fused matmul into dispatches: one when every view has the same type, is a
/// single part and one texel view spans them all (q/k/v read through binding 0), else one
/// per (view, part) (gate/up: one per pair of matching parts, in bindings 0 and 1).
fn matmul_calls(
    spec: MatmulSpec<'_>,
    dummy: &BufferBinding,
    acts: &Activations,
    kernels: &mut Kernels,
    views: &mut Views,
    neox: bool,
    head_dim: u32,
) -> Result<Vec<MatmulCall>, EngineError> {
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
            step: acts.step.binding(),
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
            .matmul(kernels.matmul_key(&variant, Batch::Decode, neox, head_dim))?
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
