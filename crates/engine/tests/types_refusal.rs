//! A file whose forward pass needs a tensor the GPU kernels cannot read is refused
//! before anything is allocated on the device, and the error names the tensor and its
//! type (or its row length): checked on the device's allocation counters
//! (`vk::Context::live_allocations`, `total_allocations`).

mod common;

use std::sync::Arc;

use common::*;
use engine::{Session, SessionOptions};
use gguf::{GgmlType, Gguf, GgufWriter};
use reference::synthetic::{tiny_llama, tiny_model, TinySpec};

/// `bytes` with tensor `name` rewritten as `ty` (its bytes filled with a pattern: they
/// are never read).
fn retyped(bytes: &[u8], name: &str, ty: GgmlType) -> Vec<u8> {
    let g = Gguf::parse(bytes).unwrap();
    let mut w = GgufWriter::new(g.alignment);
    for (k, v) in &g.metadata {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in &g.tensors {
        if t.name == name {
            let n = ty.row_bytes(t.shape[0]).unwrap() * t.shape[1];
            w.add_tensor(t.name.clone(), ty, &t.shape, vec![0x11; n as usize])
                .unwrap();
        } else {
            w.add_tensor(
                t.name.clone(),
                t.ty,
                &t.shape,
                g.tensor_data(bytes, t).to_vec(),
            )
            .unwrap();
        }
    }
    w.to_bytes()
}

/// Opens `bytes` as a session on `ctx` and returns the error, checking that no device
/// allocation was made (none alive, none made and freed).
fn refused(ctx: &Arc<vk::Context>, bytes: &[u8], tag: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "vkdecode-types-refusal-{tag}-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    let file = Arc::new(gguf::GgufFile::open(&path).unwrap());
    let before = (ctx.live_allocations(), ctx.total_allocations());
    let opts = SessionOptions {
        ctx_len: 32,
        ..SessionOptions::default()
    };
    let err = match Session::new(Arc::clone(ctx), Arc::clone(&file), &opts) {
        Ok(_) => panic!("{tag}: the session was built"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        (ctx.live_allocations(), ctx.total_allocations()),
        before,
        "{tag}: device memory was allocated before the refusal ({err})"
    );
    drop(file);
    let _ = std::fs::remove_file(&path);
    err
}

#[test]
fn unreadable_type_is_refused_before_any_allocation() {
    let Some(ctx) = ctx() else { return };
    let good = tiny_llama(7, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0);
    for ty in [GgmlType::IQ4_NL, GgmlType::Q8_1] {
        let err = refused(
            &ctx,
            &retyped(&good, "blk.1.ffn_down.weight", ty),
            ty.name(),
        );
        assert!(
            err.contains("blk.1.ffn_down.weight")
                && err.contains(&format!(
                    "type {} is not read by the GPU kernels",
                    ty.name()
                )),
            "{err}"
        );
    }
    assert_eq!(ctx.total_allocations(), 0);
    // the same file untouched loads (so the refusal above is the type's, not the file's)
    let path = std::env::temp_dir().join(format!(
        "vkdecode-types-refusal-ok-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, &good).unwrap();
    let file = Arc::new(gguf::GgufFile::open(&path).unwrap());
    let opts = SessionOptions {
        ctx_len: 32,
        ..SessionOptions::default()
    };
    let s = Session::new(Arc::clone(&ctx), file, &opts).unwrap();
    assert!(ctx.live_allocations() > 0);
    drop(s);
    let _ = std::fs::remove_file(&path);
    assert_no_validation_errors(&ctx);
}

/// Rows the kernels cannot split into 64-element chunks (dim 96: three 32-blocks of
/// Q8_0) are refused the same way, naming a tensor and its row length.
#[test]
fn row_length_is_refused_before_any_allocation() {
    let Some(ctx) = ctx() else { return };
    let bytes = tiny_model(&TinySpec {
        dim: 96,
        n_heads: 3,
        n_kv_heads: 1,
        hidden_dim: 192,
        ..TinySpec::new(arch::Arch::Llama, 3, GgmlType::Q8_0)
    });
    let err = refused(&ctx, &bytes, "dim96");
    assert!(
        err.contains("token_embd.weight") && err.contains("rows of 96 elements of type Q8_0"),
        "{err}"
    );
    assert_eq!(ctx.total_allocations(), 0);
    assert_no_validation_errors(&ctx);
}
