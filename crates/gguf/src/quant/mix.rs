//! Which type each tensor gets when a model is quantised, following the rules of
//! llama.cpp's `llama-quantize` (`src/llama-quant.cpp` at d775b8967) for the schemes
//! `vkdecode convert` offers: a single type (as `llama-quantize --pure`), and the
//! Q4_K_M / Q5_K_M mixes. Rewritten from its behaviour; MoE, Falcon, RWKV and
//! 70B-specific rules are not modelled (no such models are converted here).

use crate::types::GgmlType;

/// How a model is quantised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Every quantisable tensor gets this type, or its row-width fallback
    /// (`llama-quantize --pure`).
    Pure(GgmlType),
    /// Q4_K with Q6_K for the output (or tied embedding), half the `attn_v` and half
    /// the `ffn_down` tensors.
    Q4KM,
    /// As [`Scheme::Q4KM`] with Q5_K as the base type.
    Q5KM,
}

impl Scheme {
    /// The base type (ggml's `llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            Scheme::Pure(t) => t,
            Scheme::Q4KM => GgmlType::Q4_K,
            Scheme::Q5KM => GgmlType::Q5_K,
        }
    }

    /// The `general.file_type` value llama-quantize writes (`llama_ftype`): the single
    /// K types take their `_M` (or only) file type, as llama-quantize's names do.
    pub fn file_type(self) -> u32 {
        use GgmlType::*;
        match self {
            Scheme::Q4KM => 15,
            Scheme::Q5KM => 17,
            Scheme::Pure(t) => match t {
                F32 => 0,
                F16 => 1,
                Q4_0 => 2,
                Q4_1 => 3,
                Q8_0 => 7,
                Q5_0 => 8,
                Q5_1 => 9,
                Q2_K => 10,
                Q3_K => 12,
                Q4_K => 15,
                Q5_K => 17,
                Q6_K => 18,
                BF16 => 32,
                _ => 1024, // LLAMA_FTYPE_GUESSED: not a type convert produces
            },
        }
    }
}

/// A tensor as the planner sees it.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc<'a> {
    pub name: &'a str,
    /// ggml order: `shape[0]` is the row length.
    pub shape: &'a [u64],
    pub ty: GgmlType,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Category::TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        Category::AttnV
    } else if name.contains("attn_k.weight")
        || name.contains("attn_q.weight")
        || name.contains("attn_output.weight")
        || name.contains("ffn_up")
        || name.contains("ffn_gate")
    {
        Category::Other
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count.
fn n_dims(shape: &[u64]) -> usize {
    shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether llama-quantize would quantise this tensor at all: 2-D or more, a name ending
/// in `weight`, and none of the small or special tensors it keeps as they are.
pub fn allows_quantization(name: &str, shape: &[u64]) -> bool {
    const KEEP: [&str; 13] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        ".position_embd",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
    ];
    n_dims(shape) >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !KEEP.iter().any(|k| name.contains(k))
}

/// The layer of `blk.N.*` names, -1 for others (as ggml's `sscanf("blk.%d.")`).
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type a tensor falls back to when its rows are not whole blocks of `target`
/// (llama-quantize's `tensor_type_fallback`); F16 when even that does not fit. `None`
/// where llama-quantize defines no fallback (it would stop).
pub fn fallback(target: GgmlType, row_len: u64) -> Option<GgmlType> {
    use GgmlType::*;
    if row_len.is_multiple_of(target.block_size() as u64) {
        return Some(target);
    }
    let t = match target {
        Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        _ => return None,
    };
    Some(if row_len.is_multiple_of(t.block_size() as u64) {
        t
    } else {
        F16
    })
}

/// The type of every tensor after quantising with `scheme`, in input order. `n_layer`
/// is the model's block count (`{arch}.block_count`). A tensor llama-quantize would not
/// touch keeps its type; one whose type has no fallback for its row width keeps its
/// type too (llama-quantize would refuse the model).
pub fn plan(scheme: Scheme, tensors: &[TensorDesc<'_>], n_layer: u64) -> Vec<GgmlType> {
    let default = scheme.default_type();
    let tied = !tensors.iter().any(|t| category(t.name) == Category::Output);
    let n_attn_v = tensors
        .iter()
        .filter(|t| category(t.name) == Category::AttnV)
        .count() as i64;
    // llama-quantize visits tensors ordered by layer, then name; its attn_v and ffn_down
    // counters follow that order.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (tensors[a].name, tensors[b].name);
        (layer_of(ta), ta).cmp(&(layer_of(tb), tb))
    });
    let (mut i_attn_v, mut i_ffn_down) = (0i64, 0i64);
    let mut out: Vec<GgmlType> = tensors.iter().map(|t| t.ty).collect();
    for i in order {
        let t = &tensors[i];
        if !allows_quantization(t.name, t.shape) {
            continue;
        }
        if !default.is_quantized() {
            out[i] = default; // F32/F16: no per-tensor rules, no fallback
            continue;
        }
        let mut ty = default;
        if !matches!(scheme, Scheme::Pure(_)) {
            let cat = category(t.name);
            match cat {
                Category::Output | Category::TokenEmbd if cat == Category::Output || tied => {
                    ty = if !t.shape[0].is_multiple_of(ty.block_size() as u64) {
                        GgmlType::Q8_0
                    } else if ty != GgmlType::Q8_0 {
                        GgmlType::Q6_K
                    } else {
                        ty
                    };
                }
                Category::AttnV => {
                    if use_more_bits(i_attn_v, n_attn_v) {
                        ty = GgmlType::Q6_K;
                    }
                    i_attn_v += 1;
                }
                Category::FfnDown => {
                    if use_more_bits(i_ffn_down, n_layer as i64) {
                        ty = GgmlType::Q6_K;
                    }
                    i_ffn_down += 1;
                }
                _ => {}
            }
        }
        if let Some(ty) = fallback(ty, t.shape[0]) {
            out[i] = ty;
        }
    }
    out
}
