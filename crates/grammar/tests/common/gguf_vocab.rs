//! Reads a tokenizer's vocabulary from GGUF metadata, as the byte strings each token
//! decodes to: a few dozen lines instead of a dependency on the workspace's GGUF crate,
//! so this crate stays independent. GGUF spec:
//! <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::io::{self, BufReader, Read};

pub struct GgufVocab {
    pub tokens: Vec<Vec<u8>>,
    pub eos: Vec<u32>,
}

fn u32_of(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn u64_of(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn string_of(r: &mut impl Read) -> io::Result<String> {
    let n = u64_of(r)?;
    if n > 1 << 20 {
        return Err(io::Error::other("string too long"));
    }
    let mut b = vec![0; n as usize];
    r.read_exact(&mut b)?;
    String::from_utf8(b).map_err(io::Error::other)
}

enum Val {
    Int(i64),
    Strings(Vec<String>),
    Ints(Vec<i64>),
    Other,
}

fn scalar(r: &mut impl Read, ty: u32) -> io::Result<Option<i64>> {
    let size = match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return Err(io::Error::other(format!("bad type {ty}"))),
    };
    let mut b = [0u8; 8];
    r.read_exact(&mut b[..size])?;
    let v = i64::from_le_bytes(b);
    Ok(match ty {
        1 => Some(b[0] as i8 as i64),
        3 => Some(i16::from_le_bytes([b[0], b[1]]) as i64),
        5 => Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
        6 | 12 => None,
        _ => Some(v),
    })
}

fn value(r: &mut impl Read, ty: u32) -> io::Result<Val> {
    match ty {
        8 => string_of(r).map(|_| Val::Other),
        9 => {
            let elem = u32_of(r)?;
            let n = u64_of(r)?;
            if elem == 8 {
                (0..n)
                    .map(|_| string_of(r))
                    .collect::<io::Result<_>>()
                    .map(Val::Strings)
            } else {
                let mut out = Vec::new();
                for _ in 0..n {
                    out.push(scalar(r, elem)?.unwrap_or(0));
                }
                Ok(Val::Ints(out))
            }
        }
        _ => Ok(scalar(r, ty)?.map_or(Val::Other, Val::Int)),
    }
}

/// GPT-2 byte-level BPE writes each byte as a printable character; this inverts it.
fn gpt2_unicode_to_byte() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::new();
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let c = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("valid")
        };
        map.insert(c, b);
    }
    map
}

/// Reads `tokenizer.ggml.*` from the GGUF at `path`. Control and unused tokens become
/// empty byte strings (never allowed by a mask).
pub fn load(path: &str) -> io::Result<GgufVocab> {
    let mut r = BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0; 4];
    r.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(io::Error::other("not a GGUF file"));
    }
    let _version = u32_of(&mut r)?;
    let _tensors = u64_of(&mut r)?;
    let kvs = u64_of(&mut r)?;
    let (mut pieces, mut types, mut eos, mut model) =
        (Vec::new(), Vec::new(), Vec::new(), String::new());
    for _ in 0..kvs {
        let key = string_of(&mut r)?;
        let ty = u32_of(&mut r)?;
        if key == "tokenizer.ggml.model" {
            model = string_of(&mut r)?;
            continue;
        }
        match (key.as_str(), value(&mut r, ty)?) {
            ("tokenizer.ggml.tokens", Val::Strings(s)) => pieces = s,
            ("tokenizer.ggml.token_type", Val::Ints(t)) => types = t,
            ("tokenizer.ggml.eos_token_id", Val::Int(e)) => eos.push(e as u32),
            _ => {}
        }
    }
    let byte_of = gpt2_unicode_to_byte();
    let tokens = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // 1 normal, 6 byte; 2 unknown, 3 control, 4 user-defined, 5 unused.
            let ty = types.get(i).copied().unwrap_or(1);
            if ty != 1 && ty != 6 && ty != 4 {
                return Vec::new();
            }
            if model == "gpt2" {
                p.chars()
                    .map(|c| byte_of.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_default()
            } else if let Some(hex) = p.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                u8::from_str_radix(hex, 16)
                    .map(|b| vec![b])
                    .unwrap_or_default()
            } else {
                p.replace('\u{2581}', " ").into_bytes()
            }
        })
        .collect();
    Ok(GgufVocab { tokens, eos })
}

/// The model path relative to the repository, or `None` when it is missing and
/// `VKDECODE_ALLOW_NO_MODEL=1` says that is fine; panics otherwise.
pub fn model_path(name: &str) -> Option<String> {
    let path = format!("{}/../../models/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::path::Path::new(&path).exists() {
        return Some(path);
    }
    if std::env::var("VKDECODE_ALLOW_NO_MODEL").as_deref() == Ok("1") {
        eprintln!("skipping: {path} is missing and VKDECODE_ALLOW_NO_MODEL=1");
        return None;
    }
    panic!("{path} is missing: run scripts/setup, or set VKDECODE_ALLOW_NO_MODEL=1 to skip");
}
