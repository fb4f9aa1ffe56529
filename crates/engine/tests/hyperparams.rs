//! Every numeric hyper-parameter of every supported family, set to values from the
//! ordinary to the absurd on a tiny synthetic model: whatever the loader accepts, the GPU
//! computes what the reference computes. A value on which the two disagree (a gemma3
//! `rope.freq_base_swa` of 0.5 or 1e-30 gave logits 40.8 apart, exit 0) must be refused
//! by the loader, naming the key.
//!
//! For each key, present in the file or read with a default, each value is written into
//! a copy of the model; if `arch::Config` accepts it, the logits at every position of a
//! short prompt (decode path, one token per submission) must be finite and match the
//! reference within model_families.rs's tolerance, `TOL · (1 + max|ref|)`.

mod common;

use std::sync::Arc;

use common::*;
use engine::{EngineError, Session, SessionOptions};
use gguf::{GgmlType, Value};
use reference::synthetic::{tiny_gemma3, tiny_llama, tiny_llama3, tiny_qwen2, tiny_qwen3};
use reference::{forward, Model, State};

const TOL: f32 = 2e-4;
const CTX: usize = 16;
const PROMPT: [u32; 5] = [1, 70, 260, 3, 199];

/// Keys the loader reads that a file may leave out (then a default applies; the last two
/// only for families with sliding-window layers or a logit softcap).
const OPTIONAL: [&str; 9] = [
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.factor",
    "rope.scale_linear",
    "rope.freq_base_swa",
    "final_logit_softcapping",
];

/// Float values tried: negative, zero, subnormal, tiny, around 1, huge, not finite.
const FLOATS: [f32; 14] = [
    -1.0,
    0.0,
    1e-45,
    1e-30,
    1e-6,
    0.5,
    1.0,
    30.0,
    1e4,
    1e6,
    1e30,
    f32::MAX,
    f32::INFINITY,
    f32::NAN,
];

/// Integer values tried: around the tiny models' sizes, and far beyond.
const INTS: [u64; 10] = [0, 1, 2, 3, 4, 16, 64, 256, u32::MAX as u64, u64::MAX];

/// The models: one per family, gemma3 with a window (4 positions) shorter than the prompt
/// plus the positions decoded, so the sliding-window layers drop positions.
fn models() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "llama",
            tiny_llama(31, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0),
        ),
        ("llama3", tiny_llama3(32, GgmlType::Q8_0)),
        ("qwen2", tiny_qwen2(33, GgmlType::Q8_0)),
        ("qwen3", tiny_qwen3(34, GgmlType::Q8_0)),
        ("gemma3", tiny_gemma3(35, GgmlType::Q8_0, 4)),
    ]
}

/// `bytes` with `key` set to `value` (added if absent), the tensors as they are.
fn with_value(bytes: &[u8], key: &str, value: Value) -> Vec<u8> {
    let g = gguf::Gguf::parse(bytes).unwrap();
    let mut w = gguf::GgufWriter::new(32);
    for (k, v) in &g.metadata {
        w.add_metadata(k.clone(), v.clone());
    }
    w.add_metadata(key.to_string(), value);
    for t in &g.tensors {
        w.add_tensor(
            t.name.clone(),
            t.ty,
            &t.shape,
            g.tensor_data(bytes, t).to_vec(),
        )
        .unwrap();
    }
    w.to_bytes()
}

/// The numeric keys of `bytes`' family: those in the file (with their value), and the
/// optional ones.
fn numeric_keys(bytes: &[u8]) -> Vec<(String, bool, Option<Value>)> {
    let g = gguf::Gguf::parse(bytes).unwrap();
    let arch = g.get("general.architecture").unwrap().as_str().unwrap();
    let prefix = format!("{arch}.");
    let mut keys: Vec<(String, bool, Option<Value>)> = g
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter_map(|(k, v)| match v {
            Value::F32(_) | Value::F64(_) => Some((k.clone(), true, Some(v.clone()))),
            v if v.as_integer().is_some() => Some((k.clone(), false, Some(v.clone()))),
            _ => None,
        })
        .collect();
    let family = arch::Arch::from_name(arch).unwrap();
    for k in OPTIONAL {
        // keys of features the family lacks are not read: sweeping them only takes time
        if (k == "rope.freq_base_swa" && !family.has_sliding_window())
            || (k == "final_logit_softcapping" && !family.has_logit_softcap())
        {
            continue;
        }
        let key = format!("{prefix}{k}");
        if !keys.iter().any(|(have, _, _)| *have == key) {
            let float = k.contains("freq_base") || k.contains("scal") || k.contains("softcap");
            keys.push((key, float, None));
        }
    }
    keys
}

/// The GPU's logits at every prompt position against the reference's: None when they
/// agree, else what differs.
fn disagreement(ctx: &Arc<vk::Context>, model: &Model, path: &std::path::Path) -> Option<String> {
    let file = Arc::new(gguf::GgufFile::open(path).unwrap());
    // a trained context shorter than the test's is a context the engine refuses to exceed
    let ctx_len = CTX.min(model.config().context_length);
    let opts = SessionOptions {
        ctx_len,
        ..SessionOptions::default()
    };
    let mut s = match Session::new(Arc::clone(ctx), file, &opts) {
        Ok(s) => s,
        // a context too short for the engine's first step is refused at load: a refusal,
        // not a wrong answer
        Err(EngineError::ContextFull { .. }) => return None,
        Err(e) => return Some(format!("the reference loads it, the engine refuses: {e}")),
    };
    let mut state = State::new(model.config(), ctx_len);
    for (pos, &t) in PROMPT.iter().enumerate().take(ctx_len) {
        let want = forward(model, &mut state, t, pos, &mut |_, _| {})
            .map(|l| l.to_vec())
            .map_err(|e| format!("reference pos {pos}: {e}"));
        let got = s
            .forward_observed(&[t], &mut |_, _| {})
            .map(|l| l.to_vec())
            .map_err(|e| format!("gpu pos {pos}: {e}"));
        let (got, want) = match (got, want) {
            (Ok(g), Ok(w)) => (g, w),
            (Err(e), _) | (_, Err(e)) => return Some(e),
        };
        if want.iter().any(|x| !x.is_finite()) {
            return Some(format!("pos {pos}: the reference's logits are not finite"));
        }
        let m = want.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
        let tol = TOL * (1.0 + m);
        if let Some((i, (g, w))) = got.iter().zip(&want).enumerate().find(|(_, (g, w))| {
            // a NaN from the GPU is a disagreement too
            let d = (*g - *w).abs();
            d.is_nan() || d > tol
        }) {
            return Some(format!(
                "pos {pos} logit {i}: gpu {g} vs reference {w} (tolerance {tol})"
            ));
        }
    }
    None
}

#[test]
fn every_accepted_hyperparameter_gives_gpu_equal_to_reference() {
    let Some(ctx) = ctx() else { return };
    let dir = std::env::temp_dir().join(format!("vkdecode-hyper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    let mut accepted = 0;
    let mut tried = 0;
    for (family, bytes) in models() {
        for (key, float, own) in numeric_keys(&bytes) {
            // the file's own value first: the sweep reaches the key only if it is accepted
            let mut values: Vec<Value> = own.into_iter().collect();
            let sweep: Vec<Value> = if float {
                FLOATS.iter().map(|&x| Value::F32(x)).collect()
            } else {
                INTS.iter()
                    .map(|&n| match u32::try_from(n) {
                        Ok(n) => Value::U32(n),
                        Err(_) => Value::U64(n),
                    })
                    .collect()
            };
            values.extend(sweep);
            let accepted_before = accepted;
            for value in values {
                tried += 1;
                let crafted = with_value(&bytes, &key, value.clone());
                let g = gguf::Gguf::parse(&crafted).unwrap();
                if arch::Config::from_gguf(&g).is_err() {
                    continue;
                }
                accepted += 1;
                let model = match Model::from_bytes(&crafted) {
                    Ok(m) => m,
                    Err(e) => {
                        failures.push(format!(
                            "{family} {key} = {value:?}: the loader accepts, the reference refuses: {e}"
                        ));
                        continue;
                    }
                };
                let path = dir.join(format!("{family}.gguf"));
                std::fs::write(&path, &crafted).unwrap();
                if let Some(why) = disagreement(&ctx, &model, &path) {
                    failures.push(format!("{family} {key} = {value:?}: {why}"));
                }
            }
            if accepted == accepted_before {
                // every key has a value the file's shapes allow: none accepted means the
                // sweep no longer reaches the key
                failures.push(format!("{family} {key}: no value tried was accepted"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{accepted} of {tried} values accepted");
    assert!(
        failures.is_empty(),
        "{} accepted values where the GPU and the reference disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_no_validation_errors(&ctx);
}
