//! The in-process hostile-metadata property test: every numeric metadata key of the default model
//! (and its two bools), one at a time, set to 0, 1, -1, 2^31, 2^32-1, 2^58, 2^63,
//! 2^64-1, NaN and inf and a few neighbours, in every numeric type that can hold the
//! value, and also as a bool, a string, or removed: over 2,000 files through the
//! library's load path (gguf parse, `arch::Config::from_gguf`, `Tokenizer::from_gguf`,
//! `ChatTemplate::from_gguf`, a rendered and encoded chat turn).
//!
//! Each case must not panic (caught per case), must load or return a typed error, and
//! a config that loads must have meaningful values and K/V-cache and weight sizes that
//! compute without overflow.
//!
//! The mutated files are built in memory: the header is re-serialised with the one
//! value changed and followed by the original size of the data section (zeros: the
//! weights are not read on this path), so no case copies the 145 MB model.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use gguf::{Gguf, TensorInfo, Value};
use tokenizer::{ChatTemplate, Message, Tokenizer};

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q8_0.gguf")
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// A value's encoding without its type tag (GGUF v3).
fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Array(ty, items) => {
            buf.extend_from_slice(&(*ty as u32).to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(buf, i));
        }
        Value::Scalars(a) => {
            buf.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
            buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
            a.iter().for_each(|i| put_value(buf, &i));
        }
    }
}

fn kv_blob(key: &str, v: &Value) -> Vec<u8> {
    let mut b = Vec::new();
    put_str(&mut b, key);
    b.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
    put_value(&mut b, v);
    b
}

fn tensor_blob(tensors: &[TensorInfo]) -> Vec<u8> {
    let mut b = Vec::new();
    for t in tensors {
        put_str(&mut b, &t.name);
        b.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        t.shape
            .iter()
            .for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        b.extend_from_slice(&(t.ty as u32).to_le_bytes());
        b.extend_from_slice(&t.offset.to_le_bytes());
    }
    b
}

/// The replacement values for one key: `None` removes it.
fn replacements() -> Vec<Option<Value>> {
    let ints: [i128; 15] = [
        0,
        1,
        -1,
        2,
        7,
        255,
        65_535,
        1 << 24,
        1 << 31,
        -(1 << 31),
        (1 << 32) - 1,
        1 << 58,
        1 << 63,
        -(1 << 63),
        (1 << 64) - 1,
    ];
    let mut out = Vec::new();
    for v in ints {
        out.extend(u8::try_from(v).ok().map(Value::U8));
        out.extend(i8::try_from(v).ok().map(Value::I8));
        out.extend(u16::try_from(v).ok().map(Value::U16));
        out.extend(i16::try_from(v).ok().map(Value::I16));
        out.extend(u32::try_from(v).ok().map(Value::U32));
        out.extend(i32::try_from(v).ok().map(Value::I32));
        out.extend(u64::try_from(v).ok().map(Value::U64));
        out.extend(i64::try_from(v).ok().map(Value::I64));
        out.push(Value::F32(v as f32));
        out.push(Value::F64(v as f64));
    }
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.5, 1e-30] {
        out.push(Value::F32(f as f32));
        out.push(Value::F64(f));
    }
    let mut out: Vec<Option<Value>> = out.into_iter().map(Some).collect();
    out.push(Some(Value::Bool(true)));
    out.push(Some(Value::Bool(false)));
    out.push(Some(Value::String("1".into())));
    out.push(None);
    out
}

#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    loaded: usize,
    gguf_err: usize,
    config_err: usize,
    tokenizer_err: usize,
    template_err: usize,
}

/// One file through the load path; `Err` describes a broken property.
fn load(bytes: &[u8], tally: &mut Tally) -> Result<(), String> {
    let g = match Gguf::parse(bytes) {
        Ok(g) => g,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            tally.gguf_err += 1;
            return Ok(());
        }
    };
    let cfg = arch::Config::from_gguf(&g);
    let tok = Tokenizer::from_gguf(&g);
    let tmpl = ChatTemplate::from_gguf(&g);
    match &cfg {
        Ok(c) => {
            if !(c.rms_eps.is_finite() && c.rms_eps > 0.0) {
                return Err(format!("loaded rms_eps {}", c.rms_eps));
            }
            if !(c.rope_base.is_finite() && c.rope_base >= 1.0) {
                return Err(format!("loaded rope_base {}", c.rope_base));
            }
            if c.context_length == 0 || c.context_length > arch::MAX_CONTEXT_LENGTH {
                return Err(format!("loaded context_length {}", c.context_length));
            }
            if c.kv_cache_bytes(c.context_length as u64).is_none() {
                return Err(format!("K/V cache size overflows: {c:?}"));
            }
            let weights = (c.dim as u64)
                .checked_mul(c.vocab_size as u64)
                .and_then(|e| e.checked_mul(c.n_layers.max(1) as u64))
                .and_then(|e| e.checked_mul(c.hidden_dim.max(c.q_dim()) as u64));
            if weights.is_none() || c.vocab_size == 0 {
                return Err(format!("weight sizes overflow or empty vocabulary: {c:?}"));
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            tally.config_err += 1;
        }
    }
    let tok = match tok {
        Ok(t) => t,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            tally.tokenizer_err += 1;
            return Ok(());
        }
    };
    if let Some(bos) = tok.bos() {
        if bos as usize >= tok.vocab_size() {
            return Err(format!("bos {bos} outside the vocabulary"));
        }
    }
    let ids = tok
        .encode("The capital of France is", true, false)
        .map_err(|e| format!("encode failed: {e}"))?;
    if ids.iter().any(|&i| i as usize >= tok.vocab_size()) {
        return Err(format!("encoded ids outside the vocabulary: {ids:?}"));
    }
    match tmpl {
        Ok(Some(t)) => {
            let chat = t.render_chat(&[Message::new("user", "Hi <|im_start|>")], true, "", "");
            match chat {
                Ok(chat) => {
                    tok.encode_chat(&chat, true, false)
                        .map_err(|e| format!("encode_chat failed: {e}"))?;
                }
                Err(_) => tally.template_err += 1,
            }
        }
        Ok(None) => {}
        Err(_) => tally.template_err += 1,
    }
    if cfg.is_ok() {
        tally.loaded += 1;
    }
    Ok(())
}

#[test]
fn every_numeric_key_set_to_extremes_loads_or_errors() {
    let path = model_path();
    assert!(
        path.exists(),
        "{} is missing: run models/fetch",
        path.display()
    );
    let file = gguf::GgufFile::open(&path).unwrap();
    let g = file.gguf();
    let data_len = (g.file_size - g.data_offset) as usize;
    let blobs: Vec<Vec<u8>> = g.metadata.iter().map(|(k, v)| kv_blob(k, v)).collect();
    let tensors = tensor_blob(&g.tensors);
    let keys: Vec<usize> = g
        .metadata
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| {
            v.as_integer().is_some() || matches!(v, Value::F32(_) | Value::F64(_) | Value::Bool(_))
        })
        .map(|(i, _)| i)
        .collect();
    assert!(keys.len() >= 17, "numeric keys found: {}", keys.len());
    let values = replacements();
    let cases: Vec<(usize, Option<Value>)> = keys
        .iter()
        .flat_map(|&k| values.iter().map(move |v| (k, v.clone())))
        .collect();
    assert!(cases.len() >= 2000, "only {} cases", cases.len());

    let run = |cases: &[(usize, Option<Value>)]| -> (Tally, Vec<String>) {
        // One buffer per thread: header, padding to the file's alignment, data.
        let header_max = 24 + blobs.iter().map(Vec::len).sum::<usize>() + 64 + tensors.len();
        let mut buf = vec![0u8; header_max + 8192 + data_len];
        let mut tally = Tally::default();
        let mut failures = Vec::new();
        for (k, v) in cases {
            let mut h = Vec::with_capacity(header_max);
            h.extend_from_slice(b"GGUF");
            h.extend_from_slice(&3u32.to_le_bytes());
            h.extend_from_slice(&(g.tensors.len() as u64).to_le_bytes());
            let n_kv = g.metadata.len() - usize::from(v.is_none());
            h.extend_from_slice(&(n_kv as u64).to_le_bytes());
            for (i, b) in blobs.iter().enumerate() {
                if i != *k {
                    h.extend_from_slice(b);
                } else if let Some(v) = v {
                    h.extend_from_slice(&kv_blob(&g.metadata[i].0, v));
                }
            }
            h.extend_from_slice(&tensors);
            let len = h.len().next_multiple_of(4096) + data_len;
            buf[..h.len()].copy_from_slice(&h);
            buf[h.len()..h.len() + 4096].fill(0);
            let what = format!("{} = {v:?}", g.metadata[*k].0);
            tally.cases += 1;
            match catch_unwind(AssertUnwindSafe(|| load(&buf[..len], &mut tally))) {
                Ok(Ok(())) => {}
                Ok(Err(broken)) => failures.push(format!("{what}: {broken}")),
                Err(_) => failures.push(format!("{what}: panicked")),
            }
        }
        (tally, failures)
    };
    let (a, b) = cases.split_at(cases.len() / 2);
    let ((ta, mut fa), (tb, fb)) = std::thread::scope(|s| {
        let ha = s.spawn(|| run(a));
        let hb = s.spawn(|| run(b));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    fa.extend(fb);
    let t = Tally {
        cases: ta.cases + tb.cases,
        loaded: ta.loaded + tb.loaded,
        gguf_err: ta.gguf_err + tb.gguf_err,
        config_err: ta.config_err + tb.config_err,
        tokenizer_err: ta.tokenizer_err + tb.tokenizer_err,
        template_err: ta.template_err + tb.template_err,
    };
    eprintln!("{t:?}");
    assert!(
        fa.is_empty(),
        "{} of {} cases broke a property:\n{}",
        fa.len(),
        t.cases,
        fa.join("\n")
    );
    assert_eq!(t.cases, cases.len());
    // The unmutated values load: some cases must (the same value in another type).
    assert!(
        t.loaded > 0 && t.config_err > 0 && t.tokenizer_err > 0,
        "{t:?}"
    );
}
