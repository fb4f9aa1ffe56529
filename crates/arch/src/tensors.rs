//! The tensors a model's forward pass reads, with their GGUF shapes (fastest dimension
//! first: `blk.0.attn_q.weight` is `[dim, q_dim]`, i.e. `q_dim` rows of `dim` elements).
//! Names follow llama.cpp's `LLM_TENSOR_*` table (`src/llama-arch.cpp`).

use crate::Config;

impl Config {
    /// Every tensor the forward pass reads, with its GGUF shape.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (d, h, q, kv, hd) = (
            self.dim as u64,
            self.hidden_dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.head_dim as u64,
        );
        let mut t = vec![
            (
                "token_embd.weight".to_string(),
                vec![d, self.vocab_size as u64],
            ),
            ("output_norm.weight".to_string(), vec![d]),
        ];
        if !self.tied_output {
            t.push(("output.weight".to_string(), vec![d, self.vocab_size as u64]));
        }
        if self.rope_freqs {
            t.push(("rope_freqs.weight".to_string(), vec![hd / 2]));
        }
        for l in 0..self.n_layers {
            let b = |n: &str| format!("blk.{l}.{n}");
            t.push((b("attn_norm.weight"), vec![d]));
            t.push((b("attn_q.weight"), vec![d, q]));
            t.push((b("attn_k.weight"), vec![d, kv]));
            t.push((b("attn_v.weight"), vec![d, kv]));
            if self.qkv_bias {
                t.push((b("attn_q.bias"), vec![q]));
                t.push((b("attn_k.bias"), vec![kv]));
                t.push((b("attn_v.bias"), vec![kv]));
            }
            if self.qk_norm {
                t.push((b("attn_q_norm.weight"), vec![hd]));
                t.push((b("attn_k_norm.weight"), vec![hd]));
            }
            t.push((b("attn_output.weight"), vec![q, d]));
            if self.post_norms {
                t.push((b("post_attention_norm.weight"), vec![d]));
            }
            t.push((b("ffn_norm.weight"), vec![d]));
            t.push((b("ffn_gate.weight"), vec![d, h]));
            t.push((b("ffn_up.weight"), vec![d, h]));
            t.push((b("ffn_down.weight"), vec![h, d]));
            if self.post_norms {
                t.push((b("post_ffw_norm.weight"), vec![d]));
            }
        }
        t
    }
}
