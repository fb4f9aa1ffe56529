//! Helpers shared by the integration tests: re-writing a GGUF file with edits.
#![allow(dead_code)]

use gguf::{GgmlType, Gguf, GgufWriter, Value};
use reference::synthetic::tiny_llama;

pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// 2 layers, dim 64, 4 heads over 2 kv heads, hidden 128, vocab 300, Q8_0.
pub fn tiny() -> Vec<u8> {
    tiny_llama(1, 2, 64, 4, 2, 128, 300, GgmlType::Q8_0)
}

/// Re-writes a GGUF file after editing its metadata and tensors.
pub fn rewrite(
    bytes: &[u8],
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<Tensor>),
) -> Vec<u8> {
    let g = Gguf::parse(bytes).unwrap();
    let mut meta = g.metadata.clone();
    let mut tensors: Vec<Tensor> = g
        .tensors
        .iter()
        .map(|t| Tensor {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
            data: g.tensor_data(bytes, t).to_vec(),
        })
        .collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new(32);
    for (k, v) in meta {
        if k != "general.alignment" {
            w.add_metadata(k, v);
        }
    }
    for t in tensors {
        w.add_tensor(t.name, t.ty, &t.shape, t.data).unwrap();
    }
    w.to_bytes()
}

/// The tiny llama re-labelled as qwen2, with the given q/k/v biases added (or none).
pub fn as_qwen2(bytes: &[u8], biases: Option<f32>) -> Vec<u8> {
    rewrite(bytes, |meta, tensors| {
        for (k, v) in meta.iter_mut() {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("qwen2.{rest}");
            }
            if k == "general.architecture" {
                *v = Value::String("qwen2".into());
            }
        }
        if let Some(b) = biases {
            for l in 0..2 {
                for (n, len) in [("attn_q", 64), ("attn_k", 32), ("attn_v", 32)] {
                    tensors.push(Tensor {
                        name: format!("blk.{l}.{n}.bias"),
                        ty: GgmlType::F32,
                        shape: vec![len],
                        data: gguf::quant::quantize_f32(&vec![b; len as usize]),
                    });
                }
            }
        }
    })
}
