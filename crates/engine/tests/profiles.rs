//! Each kernel profile (`SessionOptions::kernels`: `cpu`, `gpu`), whatever the device,
//! against the f32 CPU reference on the default model: every prompt position through the
//! decode path, the batched prefill's last logits, then greedy tokens. On lavapipe `cpu`
//! is the tuned 8-lane entry with the column split and the GEMM (subgroups of 8) or, at
//! `LP_NATIVE_VECTOR_WIDTH=128`/`512`, its lanes-own-rows form; `gpu` is the wide
//! workgroups at every width. `.ci/run` runs this at the three widths.
//!
//! Tolerance `common::LOGIT_TOL` on logits of O(10) (the GPU sums in another order than
//! the reference, and the f16 caches may round a key differently on the two sides; a
//! wrong row, tile bound or scale moves them by O(1)).
//! Greedy ids must equal the reference's unless the reference's top-2 gap is below TOL.

mod common;

use std::sync::Arc;

use common::*;
use engine::kernels::{KernelProfile, Shapes};
use engine::{Session, SessionOptions};
use reference::{forward, Model, State};

const TOL: f32 = LOGIT_TOL;
/// "The capital of France is" (model_smollm.rs).
const FRANCE: [u32; 5] = [504, 3575, 282, 4649, 314];

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_cpu_profile_decodes_as_the_reference() {
    decodes_as_the_reference(KernelProfile::Cpu);
}

#[test]
fn the_gpu_profile_decodes_as_the_reference() {
    decodes_as_the_reference(KernelProfile::Gpu);
}

fn decodes_as_the_reference(profile: KernelProfile) {
    let Some(ctx) = ctx() else { return };
    let file =
        Arc::new(gguf::GgufFile::open(model_path("SmolLM2-135M-Instruct.Q8_0.gguf")).unwrap());
    let model = Model::load(&file).unwrap();
    let opts = SessionOptions {
        ctx_len: 64,
        kernels: profile,
        ..SessionOptions::default()
    };
    let choice = Shapes::for_profile(ctx.caps(), profile);
    assert_eq!(choice.profile, profile);
    let mut s = Session::new(Arc::clone(&ctx), Arc::clone(&file), &opts).unwrap();
    assert_eq!(
        s.shapes(),
        &choice.shapes,
        "the session runs its profile's shapes"
    );
    assert_eq!(s.profile(), &choice, "and reports the profile it runs");

    // every prompt position, one token per submission
    let mut state = State::new(model.config(), 64);
    let mut ref_logits = Vec::new();
    let mut worst = 0.0f32;
    for (pos, &t) in FRANCE.iter().enumerate() {
        ref_logits = forward(&model, &mut state, t, pos, &mut |_, _| {})
            .unwrap()
            .to_vec();
        let d = max_diff(s.decode_logits(t).unwrap(), &ref_logits);
        assert!(d <= TOL, "decode logits at position {pos} differ by {d}");
        worst = worst.max(d);
    }
    // the batched prefill (the prefill shape) gives the same last logits, on a session of
    // its own (a reset keeps the cache rows the decode pass wrote)
    drop(s);
    let mut s = Session::new(Arc::clone(&ctx), Arc::clone(&file), &opts).unwrap();
    s.prefill(&FRANCE).unwrap();
    let d = max_diff(s.last_logits().unwrap(), &ref_logits);
    assert!(d <= TOL, "prefill logits differ by {d}");
    worst = worst.max(d);

    // greedy steps
    let mut gpu_next = s.last_argmax().unwrap();
    let mut same = 0;
    for step in 0..12 {
        let ref_next = reference::kernels::argmax(&ref_logits) as u32;
        if gpu_next != ref_next {
            let mut sorted = ref_logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let gap = sorted[0] - sorted[1];
            assert!(
                gap < TOL,
                "step {step}: gpu {gpu_next} vs reference {ref_next}, top-2 gap {gap}"
            );
            break;
        }
        same += 1;
        let pos = FRANCE.len() + step;
        ref_logits = forward(&model, &mut state, ref_next, pos, &mut |_, _| {})
            .unwrap()
            .to_vec();
        let logits = s.decode_logits(ref_next).unwrap();
        worst = worst.max(max_diff(logits, &ref_logits));
        gpu_next = s.last_argmax().unwrap();
    }
    assert!(same >= 4, "only {same} greedy ids agreed");
    eprintln!(
        "{} profile, {} shapes (subgroup size {}): {same} greedy ids equal, max logit difference {worst}",
        profile.as_str(),
        choice.shapes.name,
        ctx.caps().subgroup_size
    );
    drop(s);
    assert_no_validation_errors(&ctx);
}
