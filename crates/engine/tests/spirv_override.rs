//! The developer hook `VKDECODE_SPIRV_DIR` (`vk::SPIRV_DIR_ENV`): a kernel's pipeline is
//! built from `DIR/<kernel name>.spv` when that file exists, so a shader experiment needs
//! glslc and no rebuild. Here the residual-add variant of the 4-token matmul is replaced
//! by its plain-store variant (same bindings, push constants and specialisation
//! constants): over an output holding ones, the dispatch then stores W·x instead of
//! adding it, while a kernel without a file in the directory (the 1-token add) still runs
//! its own module and adds.
//!
//! The only test in this binary, so setting the variable races with nothing.

mod common;

use common::gpu::*;
use common::*;
use engine::kernels::{InMode, Kernels, MatmulBindings, MatmulPush, OutMode, Slot};
use gguf::GgmlType;
use reference::synthetic::Rng;
use vk::{BufferView, TexelFormat};

#[test]
fn a_kernel_is_built_from_the_replacement_module() {
    let add = row_key(GgmlType::Q8_0, InMode::Plain, OutMode::Add, 4)
        .kernel()
        .unwrap();
    let store = row_key(GgmlType::Q8_0, InMode::Plain, OutMode::Store, 4)
        .kernel()
        .unwrap();
    assert_eq!(add.name(), "matmul.q8_0.tb4.add");
    let dir = std::env::temp_dir().join(format!("vkdecode-spirv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes: Vec<u8> = store.spirv().iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(dir.join(format!("{}.spv", add.name())), bytes).unwrap();
    std::env::set_var(vk::SPIRV_DIR_ENV, &dir);

    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(41);
    let (rows, cols, n_tok) = (40, 128, 3);
    let w = gguf::quant::quantize(GgmlType::Q8_0, &rng.vec(rows * cols, 1.0)).unwrap();
    let x = rng.vec(n_tok * cols, 1.0);
    let mut want = vec![0f32; rows * n_tok];
    reference::kernels::matmul(GgmlType::Q8_0, &w, rows, cols, &x, n_tok, &mut want).unwrap();

    let wbuf = wupload(&ctx, "w", &w);
    let wv = wview(&ctx, &wbuf, GgmlType::Q8_0);
    let xbuf = upload(&ctx, "x", &x);
    let xv = xview(&ctx, &xbuf);
    let dummy = zeros(&ctx, "dummy", 4);
    let dummy_w = BufferView::new(&ctx, dummy.binding(), TexelFormat::R32Uint).unwrap();
    let step = step_buffer(&ctx, 0, &[], &[]);
    let slots = [Slot {
        slot: 0,
        nrows: rows as u32,
        wofs: 0,
        orow: 0,
    }];
    let push = MatmulPush {
        n_tok: n_tok as u32,
        ncols: cols as u32,
        x_ld: cols as u32,
        out_ld: rows as u32,
        ..Default::default()
    };
    // Each key over an output of ones: the 4-token add kernel now runs the store module, so
    // the ones are overwritten; the 1-token add kernel has no file and still adds to them.
    for (k, added) in [
        (row_key(GgmlType::Q8_0, InMode::Plain, OutMode::Add, 4), 0.0),
        (row_key(GgmlType::Q8_0, InMode::Plain, OutMode::Add, 1), 1.0),
    ] {
        let out = upload(&ctx, "out", &vec![1f32; rows * n_tok]);
        let bindings = MatmulBindings {
            w0: &wv,
            w1: &dummy_w,
            x: &xv,
            aux: dummy.binding(),
            out0: out.binding(),
            out1: dummy.binding(),
            out2: dummy.binding(),
            step: step.binding(),
            xr: &xv,
        };
        dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
        let got = read_f32(&out, rows * n_tok);
        let want: Vec<f32> = want.iter().map(|v| v + added).collect();
        assert_close(&format!("tb{} add key", k.tb), &got, &want, |_| 1e-3);
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
