//! The crate's one error type.

use std::path::PathBuf;

use crate::types::{GgmlType, ValueType};

/// Everything that can go wrong reading, writing or (de)quantising GGUF data. Messages
/// name the key, tensor, offset, and expected versus found values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The I/O error is part of the message (not a `source`), so it is printed once.
    #[error("cannot open {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },

    #[error("{context}: {inner}")]
    Context {
        context: String,
        inner: Box<GgufError>,
    },

    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: Vec<u8> },

    #[error("unsupported GGUF version {version} (supported: 2 and 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },

    #[error("unexpected end of file reading {what} at offset {offset}: need {needed} bytes, {available} remain (file size {file_size})")]
    UnexpectedEof {
        what: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
        file_size: u64,
    },

    #[error("{what} count {count} at offset {offset} cannot fit: it needs at least {min_bytes} bytes but only {available} remain")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        min_bytes: u128,
        available: u64,
    },

    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },

    #[error("unknown metadata value type {found} at offset {offset} (known: 0..=12)")]
    UnknownValueType { found: u32, offset: u64 },

    #[error("arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep { max: usize, offset: u64 },

    #[error("duplicate metadata key '{key}'")]
    DuplicateKey { key: String },

    #[error("metadata key 'general.alignment' is {found}, expected a non-zero power of two")]
    BadAlignment { found: String },

    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor { name: String },

    #[error("tensor '{name}' has {n_dims} dimensions, expected 1 to 4")]
    BadDimCount { name: String, n_dims: u32 },

    #[error("tensor '{name}' shape {shape:?}: element count overflows")]
    DimOverflow { name: String, shape: Vec<u64> },

    #[error("tensor '{name}' has unknown type {found}")]
    UnknownTensorType { name: String, found: u32 },

    #[error("tensor '{name}' ({ty}) row length {row_len} is not a multiple of the block size {block_size}")]
    RowNotBlockMultiple {
        name: String,
        ty: GgmlType,
        row_len: u64,
        block_size: usize,
    },

    #[error("tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },

    #[error("tensor '{name}' data [{start}, {end}) extends past the end of the file ({file_size} bytes)")]
    TensorPastEof {
        name: String,
        start: u64,
        end: u128,
        file_size: u64,
    },

    #[error("tensors '{first}' (bytes {first_range:?}) and '{second}' (bytes {second_range:?}) overlap: tensor data may not be shared")]
    OverlappingTensors {
        first: String,
        first_range: std::ops::Range<u64>,
        second: String,
        second_range: std::ops::Range<u64>,
    },

    #[error("out of memory reading {what}: cannot allocate {bytes} bytes")]
    OutOfMemory { what: &'static str, bytes: u128 },

    #[error("missing metadata key '{key}'")]
    MissingKey { key: String },

    #[error("metadata key '{key}' is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("{ty} data for {n_elements} elements must be {expected} bytes, found {found}")]
    DataLength {
        ty: GgmlType,
        n_elements: u64,
        expected: String,
        found: usize,
    },

    #[error("{op} is not implemented for {ty}")]
    Unsupported { op: &'static str, ty: GgmlType },

    #[error("{n} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple { n: usize, block_size: usize },

    #[error("alignment {found} is not a power of two between 1 and 2^31")]
    WriterAlignment { found: u64 },
}

impl GgufError {
    /// Wraps `self` with a description of where it happened.
    pub fn context(self, context: impl Into<String>) -> GgufError {
        GgufError::Context {
            context: context.into(),
            inner: Box::new(self),
        }
    }

    /// The innermost error, past any [`GgufError::Context`] wrappers.
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::Context { inner, .. } => inner.root(),
            e => e,
        }
    }
}

pub(crate) fn wrong_type(key: &str, expected: &'static str, found: ValueType) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.name().to_string(),
    }
}
