//! A GGUF v3 writer with a chosen alignment, used by `vkdecode convert` and by tests to
//! build small models.

use std::collections::HashSet;
use std::io::{self, Write};

use crate::error::GgufError;
use crate::reader::{TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::types::{GgmlType, Value};

/// The key that holds the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

struct PendingTensor {
    info: TensorInfo,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory and writes it out.
///
/// Alignment: `general.alignment` is written when the alignment is not the default 32,
/// or when the caller added a `general.alignment` key with [`GgufWriter::add_metadata`]
/// (then it keeps its position, with its value replaced by the writer's alignment so the
/// file is always self-consistent). Tensor offsets are laid out in insertion order; the
/// data section starts on the alignment and every tensor's data is padded with zeros to
/// the alignment (the last one too, as ggml writes it).
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// A writer whose data section and tensors are aligned to `alignment`. It must be a
    /// power of two no larger than 2^31; any other value is rounded up to the next power
    /// of two within that range (0 becomes 32). Use [`GgufWriter::try_new`] to reject
    /// such values instead.
    pub fn new(alignment: u64) -> Self {
        let alignment = match alignment {
            0 => DEFAULT_ALIGNMENT,
            a => a.min(1 << 31).next_power_of_two(),
        };
        GgufWriter {
            alignment,
            metadata: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Like [`GgufWriter::new`], but an alignment that is not a power of two in
    /// 1..=2^31 is an error.
    pub fn try_new(alignment: u64) -> Result<Self, GgufError> {
        if !alignment.is_power_of_two() || alignment > 1 << 31 {
            return Err(GgufError::WriterAlignment { found: alignment });
        }
        Ok(Self::new(alignment))
    }

    /// The alignment tensors are laid out with.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Adds a metadata entry. A key added twice keeps its first position and takes the
    /// last value.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Adds a tensor with its data (`ty.row_bytes(shape[0]) * rows` bytes). Checks 1 to 4
    /// dimensions, a row length that is a whole number of blocks, the data length, and
    /// that the name is new.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                name,
                n_dims: shape.len().min(u32::MAX as usize) as u32,
            });
        }
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let n_elements = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| GgufError::DimOverflow {
                name: name.clone(),
                shape: shape.to_vec(),
            })?;
        if !shape[0].is_multiple_of(ty.block_size() as u64) {
            return Err(GgufError::RowNotBlockMultiple {
                name,
                ty,
                row_len: shape[0],
                block_size: ty.block_size(),
            });
        }
        let expected = ty.row_bytes(n_elements);
        if expected != Some(data.len() as u64) {
            return Err(GgufError::DataLength {
                ty,
                n_elements,
                expected: expected.map_or_else(|| "overflow".into(), |e| e.to_string()),
                found: data.len(),
            }
            .context(format!("tensor '{name}'")));
        }
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            info: TensorInfo {
                name,
                shape: shape.to_vec(),
                ty,
                offset: 0,
            },
            data,
        });
        Ok(())
    }

    /// The metadata as it will be written (with the alignment key resolved).
    fn final_metadata(&self) -> Vec<(&str, Value)> {
        let mut out: Vec<(&str, Value)> = self
            .metadata
            .iter()
            .map(|(k, v)| {
                if k == ALIGNMENT_KEY {
                    (k.as_str(), Value::U32(self.alignment as u32))
                } else {
                    (k.as_str(), v.clone())
                }
            })
            .collect();
        if self.alignment != DEFAULT_ALIGNMENT && !out.iter().any(|(k, _)| *k == ALIGNMENT_KEY) {
            out.push((ALIGNMENT_KEY, Value::U32(self.alignment as u32)));
        }
        out
    }

    /// Writes the whole file.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut pos = 0u64;
        let mut put = |w: &mut dyn Write, b: &[u8]| -> io::Result<u64> {
            pos += b.len() as u64;
            w.write_all(b).map(|()| pos)
        };
        let metadata = self.final_metadata();
        put(w, &MAGIC)?;
        put(w, &3u32.to_le_bytes())?;
        put(w, &(self.tensors.len() as u64).to_le_bytes())?;
        put(w, &(metadata.len() as u64).to_le_bytes())?;
        let mut buf = Vec::new();
        for (k, v) in &metadata {
            buf.clear();
            write_string(&mut buf, k);
            buf.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut buf, v)
                .map_err(|e| io::Error::new(e.kind(), format!("metadata key '{k}': {e}")))?;
            put(w, &buf)?;
        }
        let mut offset = 0u64;
        let mut header_end = put(w, &[])?;
        for t in &self.tensors {
            buf.clear();
            write_string(&mut buf, &t.info.name);
            buf.extend_from_slice(&(t.info.shape.len() as u32).to_le_bytes());
            for d in &t.info.shape {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&(t.info.ty as u32).to_le_bytes());
            buf.extend_from_slice(&offset.to_le_bytes());
            header_end = put(w, &buf)?;
            offset = pad_to(offset + t.data.len() as u64, self.alignment);
        }
        let zeros = vec![0u8; self.alignment as usize];
        if !self.tensors.is_empty() {
            let pad = pad_to(header_end, self.alignment) - header_end;
            put(w, &zeros[..pad as usize])?;
        }
        for t in &self.tensors {
            put(w, &t.data)?;
            let len = t.data.len() as u64;
            let pad = pad_to(len, self.alignment) - len;
            put(w, &zeros[..pad as usize])?;
        }
        w.flush()
    }

    /// The whole file as bytes. Writing into memory fails only when a metadata array
    /// holds an element that is not of its declared element type; then the result is
    /// empty (and [`GgufWriter::write_to`] says which key).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.write_to(&mut out) {
            Ok(()) => out,
            Err(_) => Vec::new(),
        }
    }
}

fn pad_to(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

fn write_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn write_value(buf: &mut Vec<u8>, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => write_string(buf, s),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Scalars(a) => {
            buf.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
            buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
            a.write_le(buf);
        }
        Value::Array(ty, items) => {
            buf.extend_from_slice(&(*ty as u32).to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                if item.value_type() != *ty {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("array of {ty} holds a {} element", item.value_type().name()),
                    ));
                }
                write_value(buf, item)?;
            }
        }
    }
    Ok(())
}
