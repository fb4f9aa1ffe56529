//! The reader on the default model (SmolLM2-135M-Instruct, Q4_1).

mod common;

use gguf::{GgmlType, GgufFile};

#[test]
fn default_model_header() {
    let f = GgufFile::open(common::default_model()).unwrap();
    let g = f.gguf();
    assert_eq!(g.version, 3);
    assert_eq!(g.file_size, 98_362_432);
    assert_eq!(g.tensors.len(), 272);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let count = |ty| g.tensors.iter().filter(|t| t.ty == ty).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q8_0), 1);
    let t = g.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(t.shape, vec![1536, 576]);
    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes());
    // Tensor data is a view into the mapping, not a copy.
    let base = f.bytes().as_ptr() as usize;
    assert_eq!(
        f.tensor_data(t).as_ptr() as usize - base,
        g.tensor_range(t).start as usize
    );
    // Every tensor dequantises to finite values.
    for t in &g.tensors {
        let v = gguf::dequantize_row(t.ty, f.tensor_data(t), t.n_elements() as usize).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{}", t.name);
    }
}
