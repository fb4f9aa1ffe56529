//! The model's graph bound to the GPU, and recorded. At load, every dispatch of a token
//! gets its weight views, activation buffers and the descriptor set that ties them
//! together; per pass, the recorder writes the dispatches into a command buffer.
//!
//! - `record.rs`: the pass, top to bottom (embedding → layers → head);
//! - `embed.rs`: the embedding gather (it also writes x∘attn_norm for layer 0);
//! - `layer.rs`: one decoder layer, its math and each step's kernel;
//! - `matmul.rs`: a fused matmul split into dispatches, bound and recorded;
//! - `head.rs`: the logits, the softcap, the argmax;
//! - `bounds.rs`: the record-time checks.
//!
//! llama's graph is fused: rmsnorm folded into the matmul inputs, RoPE and the KV-cache
//! writes in the q/k/v epilogue, residual adds in the output epilogues. The other
//! families (qwen2, qwen3, gemma3; `graph.rs`) keep this shape and add steps of their own
//! (layer.rs, head.rs).

mod bounds;
mod embed;
mod head;
mod layer;
mod matmul;
mod record;

pub use layer::LayerCalls;
pub use matmul::MatmulCall;
pub use record::{Head, Recorder};

use arch::{Config, LayerTensor, ModelTensor};
use gguf::GgmlType;
use std::sync::Arc;

use vk::{BufferView, DescriptorSet};

use crate::activations::Activations;
use crate::graph::GraphShape;
use crate::kernels::{self, ArgmaxBindings, Kernels};
use crate::step::{self, Dims, Io};
use crate::views::Views;
use crate::EngineError;
use head::SoftcapCall;
use matmul::{matmul_calls, matrix, vector};
use residency::Weights;

pub use crate::kernels::Batch;

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

/// What binding a step needs besides the kernels and the texel views: the model, its
/// weights and activations, and the graph's form.
pub(crate) struct Bind<'a> {
    pub cfg: &'a Config,
    pub weights: &'a Weights,
    pub acts: &'a Activations,
    pub dims: &'a Dims,
    pub shape: GraphShape,
}

impl GpuModel {
    /// Binds every dispatch and creates every pipeline they need (the matmuls' own are
    /// created when first recorded).
    pub fn build(
        ctx: &Arc<vk::Context>,
        cfg: &Config,
        weights: &Weights,
        acts: &Activations,
        kernels: &mut Kernels,
    ) -> Result<GpuModel, EngineError> {
        let shape = GraphShape::of(cfg);
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
        let dims = Dims {
            dim: cfg.dim,
            q_dim: cfg.q_dim(),
            qkv: cfg.q_dim() + 2 * cfg.kv_dim(),
            hidden: cfg.hidden_dim,
            vocab: cfg.vocab_size,
        };
        let b = Bind {
            cfg,
            weights,
            acts,
            dims: &dims,
            shape,
        };
        let mut views = Views::new(ctx, acts)?;

        let embed_view = matrix(
            weights,
            ModelTensor::TokenEmbd.name(),
            cfg.vocab_size,
            cfg.dim,
        )?;
        let first_norm = vector(weights, &LayerTensor::AttnNorm.name(0), cfg.dim)?;
        let embed = embed::embed_call(embed_view, first_norm, acts, kernels, &mut views, cfg)?;
        let layers = (0..cfg.n_layers)
            .map(|l| LayerCalls::bind(l, &b, kernels, &mut views))
            .collect::<Result<Vec<_>, _>>()?;
        let out_view = matrix(weights, cfg.output_tensor().name(), cfg.vocab_size, cfg.dim)?;
        let io = Io {
            a: acts,
            v: &views,
            d: &dims,
        };
        let logits = matmul_calls(step::logits(out_view, &io), &b, kernels, &mut views)?;
        let softcap = head::softcap_call(cfg, acts, kernels)?;
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
            prefill: kernels.prefill_batch(),
            _views: views.all,
        })
    }

    /// Weight bytes each named dispatch reads: the rows of every weight view it binds, for the
    /// matvecs of `model`; `None` for the other dispatches.
    pub(crate) fn dispatch_weight_bytes(&self, names: &[String]) -> Vec<Option<u64>> {
        let mut bytes = std::collections::HashMap::new();
        let calls = self
            .layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.attn_output, &l.gate_up, &l.ffn_down])
            .chain(std::iter::once(&self.logits))
            .flatten();
        for call in calls {
            let rows: u64 = call.slots.iter().map(|s| u64::from(s.nrows)).sum();
            if let Some(row) = call.variant.wtype.row_bytes(u64::from(call.ncols)) {
                bytes.insert(call.name.as_str(), rows * row);
            }
        }
        names
            .iter()
            .map(|n| bytes.get(n.as_str()).copied())
            .collect()
    }
}
