//! GGUF v2/v3 reading and writing, quantised block layouts and CPU (de)quantisation.
//!
//! The reader ([`Gguf::parse`]) works over a byte slice, normally the memory map owned by
//! [`GgufFile`], and copies no tensor data: a tensor's bytes are a sub-slice of the file.
//! Spec: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.
//!
//! This crate depends on no GPU code. Its only `unsafe` is the file map in
//! [`GgufFile::open`].
#![deny(unsafe_code)]

mod cursor;
mod error;
mod file;
pub mod quant;
mod reader;
mod types;
pub mod writer;

pub use cursor::MAX_ARRAY_DEPTH;
pub use error::GgufError;
pub use file::GgufFile;
pub use quant::{dequantize, dequantize_row, quantize_q8_0};
pub use reader::{Gguf, TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
pub use types::{GgmlType, ScalarArray, Value, ValueType};
pub use writer::GgufWriter;

/// `general.file_type` value for "mostly Q8_0" (llama.cpp `LLAMA_FTYPE_MOSTLY_Q8_0`).
pub const FILE_TYPE_MOSTLY_Q8_0: u32 = 7;
