//! The Llama graph bound to the GPU: for every dispatch of a token, the weight views,
//! activation buffers and the descriptor set that ties them together, built once at load.
//!
//! Per layer (DESIGN.md, "Decode"), five dispatches:
//! 1. `qkv`: rmsnorm(x, attn_norm) folded into the input of q/k/v (one dispatch over three
//!    weight views); rope on q and k; k and v written into the cache row of their position;
//! 2. `attention`: causal GQA attention over the cache;
//! 3. `attn_output`: x += Wo · attention output;
//! 4. `gate_up`: rmsnorm(x, ffn_norm) folded in; silu(gate) · up in the epilogue;
//! 5. `ffn_down`: x += Wdown · hb.
//!
//! plus the embedding gather first, and the logits (output_norm folded in) and argmax last.

use arch::{Arch, Config, RopeMode};
use gguf::GgmlType;
use std::sync::Arc;

use vk::{BufferBinding, BufferView, DescriptorSet};

use crate::activations::Activations;
use crate::kernels::{
    self, ArgmaxBindings, EmbedBindings, InMode, Kernels, MatmulBindings, MatmulKey, OutMode, Slot,
    CHUNK,
};
use crate::residency::{TensorView, ViewPart, Weights};
use crate::step::{self, Dims, Io, LayerWeights, MatmulSpec};
use crate::views::Views;
use crate::EngineError;

/// Workgroup shape of one kind of batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    pub wg: u32,
    pub pairs: u32,
    pub tb: u32,
}

/// One token at a time (decode) vs a batch of prompt tokens (prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    Decode,
    /// Prompt tokens through the GEMM (`matmul_mm.comp`).
    Prefill,
    /// Prompt tokens through matmul.comp 4 at a time, where the GEMM cannot run
    /// ([`Kernels::gemm_supported`]).
    PrefillMatvec,
}

/// Decode: 8 lanes × 8 row pairs = 128 rows per workgroup, one token (measured against 4
/// pairs, alternating runs: 19.2 vs 17.9 tok/s median of 7, Q8_0), two pairs in lockstep
/// (against one: 20.8 vs 18.9 tok/s, median of 5 alternating runs; four pairs measured no
/// faster and doubled the pipelines' compile time: `GROUP` in matmul.comp).
pub const DECODE_SHAPE: MatmulShape = MatmulShape {
    wg: 8,
    pairs: 8,
    tb: 1,
};
/// Prefill without the GEMM: each weight chunk loaded is used for 4 tokens (two pairs in
/// lockstep: about 60 against 50 tok/s over a 200-token prompt).
pub const PREFILL_MATVEC_SHAPE: MatmulShape = MatmulShape {
    wg: 8,
    pairs: 4,
    tb: 4,
};
/// Prefill: the GEMM (`matmul_mm.comp`), each weight chunk decoded once per tile of
/// `tb` tokens (shape measured on lavapipe: kernels/gemm.rs).
pub const PREFILL_SHAPE: MatmulShape = MatmulShape {
    wg: kernels::GEMM_WG,
    pairs: kernels::GEMM_PAIRS,
    tb: kernels::GEMM_TILE,
};

/// What selects a matmul dispatch's pipeline, apart from the batch kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulVariant {
    pub wtype: GgmlType,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    /// Reads only the last token of the batch (the logits).
    pub last_token_only: bool,
    /// `MatmulKey::split_k` of the one-token pipeline (0: lanes own rows).
    pub split_k: u32,
}

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
    pub attention: DescriptorSet,
    pub attn_output: Vec<MatmulCall>,
    pub gate_up: Vec<MatmulCall>,
    pub ffn_down: Vec<MatmulCall>,
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
    pub argmax: DescriptorSet,
    /// Rope pairs (2i, 2i+1) or (i, i + head_dim/2).
    pub neox: bool,
    pub head_dim: u32,
    /// The batch kind prompt chunks run as (the GEMM where the device runs it).
    pub prefill: Batch,
    /// Texel views of the weights and activations the sets read.
    pub views: Vec<Arc<BufferView>>,
}

/// The matmul pipeline key of a dispatch of variant `v` for a batch kind.
pub fn matmul_key(v: &MatmulVariant, batch: Batch, neox: bool, head_dim: u32) -> MatmulKey {
    let call = v;
    let shape = match batch {
        Batch::Prefill if !call.last_token_only => PREFILL_SHAPE,
        Batch::PrefillMatvec if !call.last_token_only => PREFILL_MATVEC_SHAPE,
        _ => DECODE_SHAPE,
    };
    let qkv_neox = call.out_mode == OutMode::Qkv && neox;
    let pairs = if qkv_neox {
        // a workgroup must hold whole heads so that both rows of a pair are its own
        (head_dim / (2 * shape.wg)).max(1)
    } else {
        shape.pairs
    };
    MatmulKey {
        wtype: call.wtype,
        in_mode: call.in_mode,
        out_mode: call.out_mode,
        neox: qkv_neox,
        wg: shape.wg,
        pairs,
        tb: shape.tb,
        split_k: if shape.tb == 1 { call.split_k } else { 0 },
    }
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
                "type {} is not read by the GPU kernels (Q8_0, Q4_0, Q4_1, F16, F32 are)",
                v.ty.name()
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
        if cfg.arch != Arch::Llama && cfg.arch != Arch::Qwen2 {
            return Err(EngineError::Unsupported(format!(
                "architecture {}",
                cfg.arch.name()
            )));
        }
        if cfg.arch == Arch::Qwen2 {
            return Err(EngineError::Unsupported(
                "architecture qwen2 (q/k/v biases) on the GPU: only llama is wired so far".into(),
            ));
        }
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
        if neox && !hd.is_multiple_of(16) {
            return Err(EngineError::Unsupported(format!(
                "neox rope with head_dim {hd} (a multiple of 16 is needed)"
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
            hidden,
            vocab: cfg.vocab_size,
        };
        let dummy = acts.dummy.binding();
        let head_dim = to_u32(hd as u64, "head_dim")?;
        let mut views = Views::new(ctx, acts)?;

        let embed_view = matrix(weights, "token_embd.weight", cfg.vocab_size, dim)?;
        let first_norm = vector(weights, "blk.0.attn_norm.weight", dim)?;
        let embed = embed_call(embed_view, first_norm, acts, kernels, &mut views, dim)?;

        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let t = |s: &str| format!("blk.{l}.{s}.weight");
            let q = matrix(weights, &t("attn_q"), q_dim, dim)?;
            let k = matrix(weights, &t("attn_k"), kv_dim, dim)?;
            let v = matrix(weights, &t("attn_v"), kv_dim, dim)?;
            let o = matrix(weights, &t("attn_output"), dim, q_dim)?;
            let gate = matrix(weights, &t("ffn_gate"), hidden, dim)?;
            let up = matrix(weights, &t("ffn_up"), hidden, dim)?;
            let down = matrix(weights, &t("ffn_down"), dim, hidden)?;
            let ffn_norm = vector(weights, &t("ffn_norm"), dim)?;
            // the norm applied after this layer: the next layer's attn_norm, or output_norm
            let next_norm = if l + 1 < cfg.n_layers {
                vector(weights, &format!("blk.{}.attn_norm.weight", l + 1), dim)?
            } else {
                vector(weights, "output_norm.weight", dim)?
            };
            let (kc, vc) = (acts.key_cache[l].binding(), acts.value_cache[l].binding());

            let lw = LayerWeights {
                qkv: [q, k, v],
                o,
                gate_up: [gate, up],
                down,
                ffn_norm,
                next_norm,
            };
            let (kc4, vc4) = (views.rgba(kc)?, views.rgba(vc)?);
            let attention = kernels
                .attention(head_dim)?
                .descriptor_set_with(&step::attention(&views, &kc4, &vc4, acts).descriptors())?;
            let io = Io {
                a: acts,
                v: &views,
                d: &d,
            };
            let (qkv, attn_output) = (step::qkv(l, &lw, &io), step::attn_output(l, &lw, &io));
            let (gate_up, ffn_down) = (step::gate_up(l, &lw, &io), step::ffn_down(l, &lw, &io));
            let mut build =
                |s: MatmulSpec| matmul_calls(s, &dummy, acts, kernels, &mut views, neox, head_dim);
            layers.push(LayerCalls {
                qkv: build(qkv)?,
                attention,
                attn_output: build(attn_output)?,
                gate_up: build(gate_up)?,
                ffn_down: build(ffn_down)?,
            });
        }

        let out_name = if cfg.tied_output {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        let out_view = matrix(weights, out_name, cfg.vocab_size, dim)?;
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
        let argmax = ArgmaxBindings {
            logits: acts.logits.binding(),
            result: acts.result.binding(),
        };
        let argmax = kernels.argmax.descriptor_set_with(&argmax.descriptors())?;
        Ok(GpuModel {
            embed,
            layers,
            logits,
            argmax,
            neox,
            head_dim,
            prefill: if kernels.gemm_supported() {
                Batch::Prefill
            } else {
                Batch::PrefillMatvec
            },
            views: views.all,
        })
    }
}

fn embed_call(
    view: &TensorView,
    norm: (BufferBinding, u32),
    acts: &Activations,
    kernels: &mut Kernels,
    views: &mut Views,
    dim: usize,
) -> Result<EmbedCall, EngineError> {
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
    let split_k = kernels.column_split(DECODE_SHAPE.wg, to_u32(ncols, "columns")?);
    // (slot, weight view in binding 0 or 1, word offset, part) per dispatch
    type Member<'p> = (usize, Arc<BufferView>, u64, &'p ViewPart);
    let mut groups: Vec<Vec<Member<'_>>> = Vec::new();
    if spec.out_mode == OutMode::Glu {
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
    let types: Vec<GgmlType> = if spec.out_mode == OutMode::Glu {
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
    let n_groups = groups.len();
    let mut calls = Vec::with_capacity(n_groups);
    for (gi, (group, wtype)) in groups.into_iter().zip(types).enumerate() {
        let mut w = [Arc::clone(&views.dummy_w), Arc::clone(&views.dummy_w)];
        let mut slots = Vec::new();
        for (k, (s, view, wofs, p)) in group.into_iter().enumerate() {
            // gate/up in bindings 0 and 1; every other view through binding 0
            w[if spec.out_mode == OutMode::Glu { k } else { 0 }] = view;
            slots.push(Slot {
                slot: s,
                nrows: to_u32(p.n_rows, "rows")?,
                wofs: to_u32(wofs, "weight offset")?,
                orow: to_u32(p.first_row, "first row")?,
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
        let variant = MatmulVariant {
            wtype,
            in_mode: spec.in_mode,
            out_mode: spec.out_mode,
            last_token_only: spec.last_token_only,
            split_k,
        };
        // the prefill pipeline has an identical set layout, so it accepts this set too
        let set = kernels
            .matmul(matmul_key(&variant, Batch::Decode, neox, head_dim))?
            .descriptor_set_with(&bindings.descriptors())?;
        let prefill = if kernels.gemm_supported() {
            Batch::Prefill
        } else {
            Batch::PrefillMatvec
        };
        kernels.matmul(matmul_key(&variant, prefill, neox, head_dim))?;
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
