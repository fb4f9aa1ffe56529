//! Shared by the CLI tests that run crafted copies of the default model: the binary, the
//! model, and copies with one thing changed (written to a temporary directory; the
//! shared model file is never touched).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgmlType, Gguf, GgufWriter, Value};

pub fn q8() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q8_0.gguf");
    assert!(
        path.exists(),
        "{} is missing: run models/fetch to download the default model",
        path.display()
    );
    path
}

pub fn vkdecode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(args)
        .output()
        .expect("run vkdecode")
}

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "vkdecode-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rewrites the default model with one metadata value changed, reusing the tensors.
pub struct Mutator {
    writer: GgufWriter,
    pub metadata: Vec<(String, Value)>,
    /// The original file's bytes.
    pub bytes: Vec<u8>,
}

impl Mutator {
    pub fn new(path: &Path) -> Mutator {
        let bytes = std::fs::read(path).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        let mut writer = GgufWriter::new(g.alignment);
        for (k, v) in &g.metadata {
            writer.add_metadata(k.clone(), v.clone());
        }
        for t in &g.tensors {
            let data = g.tensor_data(&bytes, t).to_vec();
            writer
                .add_tensor(t.name.clone(), t.ty, &t.shape, data)
                .unwrap();
        }
        Mutator {
            writer,
            metadata: g.metadata.clone(),
            bytes,
        }
    }

    /// Writes the model with `key` set to `value` to `out` (then restores the key).
    pub fn write_with(&mut self, key: &str, value: Value, out: &Path) {
        let original = self
            .metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no key {key}"));
        self.writer.add_metadata(key, value);
        let mut f = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
        self.writer.write_to(&mut f).unwrap();
        drop(f);
        self.writer.add_metadata(key, original);
    }
}

/// Copies `src` to `out` with the key `key` (a 4-byte scalar in the file) given the type
/// tag `tag` and the 4 bytes `value`, in place (the header keeps its size). For keys the
/// writer rewrites itself (`general.alignment`).
pub fn patch_u32_slot(src: &[u8], key: &str, tag: u32, value: [u8; 4], out: &Path) {
    let mut bytes = src.to_vec();
    let needle: Vec<u8> = (key.len() as u64)
        .to_le_bytes()
        .into_iter()
        .chain(key.bytes())
        .collect();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("{key} not in the header"));
    let tag_at = at + needle.len();
    bytes[tag_at..tag_at + 4].copy_from_slice(&tag.to_le_bytes());
    bytes[tag_at + 4..tag_at + 8].copy_from_slice(&value);
    std::fs::write(out, bytes).unwrap();
}

/// Copies `src` to `out` with every element of the f32 tensor `name` set to NaN.
pub fn nan_tensor(src: &Path, name: &str, out: &Path) {
    let mut bytes = std::fs::read(src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let t = g.tensor(name).unwrap();
    assert_eq!(t.ty, GgmlType::F32, "{name} is not f32");
    let range = g.tensor_range(t);
    for chunk in bytes[range.start as usize..range.end as usize].chunks_exact_mut(4) {
        chunk.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(out, bytes).unwrap();
}
