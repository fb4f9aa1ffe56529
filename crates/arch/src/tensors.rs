//! The tensors a model's forward pass reads: their names, which configurations have them,
//! and their GGUF shapes (fastest dimension first: `blk.0.attn_q.weight` is
//! `[dim, q_dim]`, i.e. `q_dim` rows of `dim` elements). Names follow llama.cpp's
//! `LLM_TENSOR_*` table (`src/llama-arch.cpp`).
//!
//! This is the one place a tensor name is spelled: the loader's checks, the GPU binding,
//! the CPU reference and the synthetic test writer name tensors by [`ModelTensor`] and
//! [`LayerTensor`].

use crate::Config;

/// A tensor the model holds once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelTensor {
    TokenEmbd,
    OutputNorm,
    /// The output projection; absent when the model ties it to `TokenEmbd`.
    Output,
    /// Llama 3's per-frequency RoPE factors.
    RopeFreqs,
}

impl ModelTensor {
    /// In the order the checks report a missing tensor.
    pub const ALL: [ModelTensor; 4] = [
        ModelTensor::TokenEmbd,
        ModelTensor::OutputNorm,
        ModelTensor::Output,
        ModelTensor::RopeFreqs,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ModelTensor::TokenEmbd => "token_embd.weight",
            ModelTensor::OutputNorm => "output_norm.weight",
            ModelTensor::Output => "output.weight",
            ModelTensor::RopeFreqs => "rope_freqs.weight",
        }
    }
}

/// A tensor every layer holds (or, for the optional ones, every layer of a family that
/// has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    AttnOutput,
    PostAttnNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    PostFfwNorm,
}

impl LayerTensor {
    /// In the order a layer's data flows (and the checks report a missing tensor).
    pub const ALL: [LayerTensor; 16] = [
        LayerTensor::AttnNorm,
        LayerTensor::AttnQ,
        LayerTensor::AttnK,
        LayerTensor::AttnV,
        LayerTensor::AttnQBias,
        LayerTensor::AttnKBias,
        LayerTensor::AttnVBias,
        LayerTensor::AttnQNorm,
        LayerTensor::AttnKNorm,
        LayerTensor::AttnOutput,
        LayerTensor::PostAttnNorm,
        LayerTensor::FfnNorm,
        LayerTensor::FfnGate,
        LayerTensor::FfnUp,
        LayerTensor::FfnDown,
        LayerTensor::PostFfwNorm,
    ];

    /// The name without its `blk.N.` prefix: `attn_q.weight`.
    pub const fn suffix(self) -> &'static str {
        match self {
            LayerTensor::AttnNorm => "attn_norm.weight",
            LayerTensor::AttnQ => "attn_q.weight",
            LayerTensor::AttnK => "attn_k.weight",
            LayerTensor::AttnV => "attn_v.weight",
            LayerTensor::AttnQBias => "attn_q.bias",
            LayerTensor::AttnKBias => "attn_k.bias",
            LayerTensor::AttnVBias => "attn_v.bias",
            LayerTensor::AttnQNorm => "attn_q_norm.weight",
            LayerTensor::AttnKNorm => "attn_k_norm.weight",
            LayerTensor::AttnOutput => "attn_output.weight",
            LayerTensor::PostAttnNorm => "post_attention_norm.weight",
            LayerTensor::FfnNorm => "ffn_norm.weight",
            LayerTensor::FfnGate => "ffn_gate.weight",
            LayerTensor::FfnUp => "ffn_up.weight",
            LayerTensor::FfnDown => "ffn_down.weight",
            LayerTensor::PostFfwNorm => "post_ffw_norm.weight",
        }
    }

    /// Whether a layer has this tensor, given which optional groups its family has.
    pub fn present(self, qkv_bias: bool, qk_norm: bool, post_norms: bool) -> bool {
        use LayerTensor::*;
        match self {
            AttnQBias | AttnKBias | AttnVBias => qkv_bias,
            AttnQNorm | AttnKNorm => qk_norm,
            PostAttnNorm | PostFfwNorm => post_norms,
            AttnNorm | AttnQ | AttnK | AttnV | AttnOutput | FfnNorm | FfnGate | FfnUp | FfnDown => {
                true
            }
        }
    }

    /// Layer `layer`'s tensor: `blk.3.attn_q.weight`.
    pub fn name(self, layer: usize) -> String {
        format!("blk.{layer}.{}", self.suffix())
    }
}

impl crate::Arch {
    /// Whether this family's layers have `t`.
    pub fn has_layer(self, t: LayerTensor) -> bool {
        t.present(self.qkv_bias(), self.qk_norm(), self.post_norms())
    }
}

impl Config {
    /// Whether this model has `t` (every model has the embedding and the output norm).
    pub fn has(&self, t: ModelTensor) -> bool {
        match t {
            ModelTensor::TokenEmbd | ModelTensor::OutputNorm => true,
            ModelTensor::Output => !self.tied_output,
            ModelTensor::RopeFreqs => self.rope_freqs,
        }
    }

    /// Whether this model's layers have `t`.
    pub fn has_layer(&self, t: LayerTensor) -> bool {
        t.present(self.qkv_bias, self.qk_norm, self.post_norms)
    }

    /// The tensor the logits read: `output.weight`, or the embedding when tied.
    pub fn output_tensor(&self) -> ModelTensor {
        if self.tied_output {
            ModelTensor::TokenEmbd
        } else {
            ModelTensor::Output
        }
    }

    /// `t`'s GGUF shape.
    pub fn shape(&self, t: ModelTensor) -> Vec<u64> {
        let (d, vocab) = (self.dim as u64, self.vocab_size as u64);
        match t {
            ModelTensor::TokenEmbd | ModelTensor::Output => vec![d, vocab],
            ModelTensor::OutputNorm => vec![d],
            ModelTensor::RopeFreqs => vec![self.head_dim as u64 / 2],
        }
    }

    /// The GGUF shape of every layer's `t`.
    pub fn layer_shape(&self, t: LayerTensor) -> Vec<u64> {
        use LayerTensor::*;
        let (d, h, q, kv, hd) = (
            self.dim as u64,
            self.hidden_dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.head_dim as u64,
        );
        match t {
            AttnNorm | PostAttnNorm | FfnNorm | PostFfwNorm => vec![d],
            AttnQ => vec![d, q],
            AttnK | AttnV => vec![d, kv],
            AttnQBias => vec![q],
            AttnKBias | AttnVBias => vec![kv],
            AttnQNorm | AttnKNorm => vec![hd],
            AttnOutput => vec![q, d],
            FfnGate | FfnUp => vec![d, h],
            FfnDown => vec![h, d],
        }
    }

    /// Every tensor the forward pass reads, with its GGUF shape.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let model = ModelTensor::ALL
            .into_iter()
            .filter(|&t| self.has(t))
            .map(|t| (t.name().to_string(), self.shape(t)));
        let layers = (0..self.n_layers).flat_map(|l| {
            LayerTensor::ALL
                .into_iter()
                .filter(|&t| self.has_layer(t))
                .map(move |t| (t.name(l), self.layer_shape(t)))
        });
        model.chain(layers).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, FfnAct, RopeMode};
    use std::collections::HashSet;

    fn config(arch: Arch) -> Config {
        Config {
            arch,
            n_layers: 2,
            dim: 64,
            hidden_dim: 160,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
            vocab_size: 300,
            context_length: 128,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_scale: 1.0,
            rope_mode: RopeMode::Normal,
            rope_freqs: false,
            tied_output: true,
            qkv_bias: arch.qkv_bias(),
            qk_norm: arch.qk_norm(),
            post_norms: arch.post_norms(),
            ffn_act: FfnAct::Silu,
            embd_scale: 1.0,
            attn_scale: 0.125,
            final_logit_softcap: None,
            sliding_window: None,
        }
    }

    #[test]
    fn names_are_distinct_and_llama_cpp_spelled() {
        let model: HashSet<_> = ModelTensor::ALL.iter().map(|t| t.name()).collect();
        let layer: HashSet<_> = LayerTensor::ALL.iter().map(|t| t.suffix()).collect();
        assert_eq!(model.len(), ModelTensor::ALL.len());
        assert_eq!(layer.len(), LayerTensor::ALL.len());
        assert_eq!(LayerTensor::AttnQ.name(3), "blk.3.attn_q.weight");
        assert_eq!(LayerTensor::AttnVBias.name(0), "blk.0.attn_v.bias");
        assert_eq!(
            LayerTensor::PostAttnNorm.name(1),
            "blk.1.post_attention_norm.weight"
        );
    }

    #[test]
    fn each_family_expects_its_own_tensors() {
        // per layer: 9 every family has, +3 biases (qwen2), +2 q/k norms (qwen3),
        // +2 q/k norms and 2 post norms (gemma3); + embedding and output norm
        for (arch, per_layer) in [
            (Arch::Llama, 9),
            (Arch::Qwen2, 12),
            (Arch::Qwen3, 11),
            (Arch::Gemma3, 13),
        ] {
            let c = config(arch);
            let t = c.expected_tensors();
            assert_eq!(t.len(), 2 + 2 * per_layer, "{arch:?}");
            let names: HashSet<_> = t.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names.len(), t.len(), "{arch:?}: a name twice");
            for l in 0..2 {
                for lt in LayerTensor::ALL {
                    assert_eq!(names.contains(lt.name(l).as_str()), arch.has_layer(lt));
                }
            }
        }
    }

    #[test]
    fn untied_output_and_rope_freqs_add_their_tensors_with_shapes() {
        let mut c = config(Arch::Llama);
        assert_eq!(c.output_tensor(), ModelTensor::TokenEmbd);
        c.tied_output = false;
        c.rope_freqs = true;
        assert_eq!(c.output_tensor(), ModelTensor::Output);
        let t = c.expected_tensors();
        let shape = |name: &str| t.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
        assert_eq!(shape("output.weight"), Some(vec![64, 300]));
        assert_eq!(shape("rope_freqs.weight"), Some(vec![16]));
        assert_eq!(shape("blk.1.attn_q.weight"), Some(vec![64, 128]));
        assert_eq!(shape("blk.1.attn_k.weight"), Some(vec![64, 64]));
        assert_eq!(shape("blk.0.attn_output.weight"), Some(vec![128, 64]));
        assert_eq!(shape("blk.0.ffn_down.weight"), Some(vec![160, 64]));
    }
}
