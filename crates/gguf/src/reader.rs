//! The GGUF v2/v3 reader: header, metadata, tensor infos. Works over a byte slice and
//! copies no tensor data. Spec: ggml `docs/gguf.md`.
//!
//! Every count, length, dimension and offset is checked against the bytes that are
//! really there before it is used, so hostile input yields an error, never a panic or a
//! huge allocation.

use std::collections::HashSet;
use std::ops::Range;

use crate::cursor::{align_up, capacity_hint, Cursor};
use crate::error::{wrong_type, GgufError};
use crate::types::{GgmlType, ScalarArray, Value, ValueType};

/// The four magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor's description from the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order, fastest dimension first: `shape[0]` is the row length.
    pub shape: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the start of the data section ([`Gguf::data_offset`]).
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape; checked at parse time not to overflow).
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Bytes of data (checked at parse time to fit the file).
    pub fn n_bytes(&self) -> u64 {
        self.ty
            .row_bytes(self.row_len())
            .and_then(|rb| rb.checked_mul(self.n_rows()))
            .unwrap_or(u64::MAX)
    }

    /// Elements per row: `shape[0]`.
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `shape[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.row_len()).unwrap_or(u64::MAX)
    }
}

/// A parsed GGUF header. Tensor data stays in the caller's bytes.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    /// In file order.
    pub metadata: Vec<(String, Value)>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute file offset where tensor data starts.
    pub data_offset: u64,
    /// Size of the byte slice parsed.
    pub file_size: u64,
}

impl Gguf {
    /// Parses and validates a whole GGUF file held in `bytes` (normally a memory map).
    ///
    /// Checks: magic, version (2 or 3), every count against the bytes remaining, value
    /// types, UTF-8 of keys and strings, duplicate keys and tensor names,
    /// `general.alignment` (a u32 power of two), 1 to 4 dimensions with a product that
    /// does not overflow, known tensor types, rows a whole number of blocks, offsets that
    /// are multiples of the alignment, tensor data inside the file, and no two tensors
    /// sharing a byte. Allocation failure is an error ([`GgufError::OutOfMemory`]).
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut c = Cursor { bytes, pos: 0 };
        let magic: [u8; 4] = c.array("magic").map_err(|_| GgufError::BadMagic {
            found: bytes[..bytes.len().min(4)].to_vec(),
        })?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            let hint = if version == 1 {
                " (version 1 is obsolete; re-convert the model)"
            } else if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (this looks like a big-endian file, which is not supported)"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion { version, hint });
        }
        let at = c.pos;
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // A tensor info takes at least 8 (name) + 4 (dims) + 8 (one dim) + 4 + 8 bytes;
        // a key/value at least 8 (key) + 4 (type) + 1 byte.
        c.check_count(n_tensors, 32, "tensor", at)?;
        c.check_count(n_kv, 13, "metadata key/value", at + 8)?;

        let mut metadata = Vec::with_capacity(capacity_hint(n_kv));
        let mut keys = HashSet::with_capacity(capacity_hint(n_kv));
        for i in 0..n_kv {
            let key = c
                .string("metadata key")
                .map_err(|e| e.context(format!("metadata entry {i}")))?;
            let value = c
                .value_type()
                .and_then(|ty| c.value(ty, 0))
                .map_err(|e| e.context(format!("metadata key '{key}'")))?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(GgufError::BadAlignment {
                    found: format!("{} {}", v.value_type(), v.summary(20)),
                })
            }
        };

        let mut tensors = Vec::with_capacity(capacity_hint(n_tensors));
        let mut names = HashSet::with_capacity(capacity_hint(n_tensors));
        for i in 0..n_tensors {
            let name = c
                .string("tensor name")
                .map_err(|e| e.context(format!("tensor info {i}")))?;
            let info = read_tensor_info(&mut c, &name)
                .map_err(|e| e.context(format!("tensor info {i} ('{name}')")))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor { name });
            }
            tensors.push(info);
        }

        let file_size = bytes.len() as u64;
        // The data section starts at the next multiple of the alignment; a file with no
        // tensors may end before it.
        let data_offset = align_up(c.pos as u64, alignment).unwrap_or(u64::MAX);
        for t in &tensors {
            if !t.offset.is_multiple_of(alignment) {
                return Err(GgufError::MisalignedTensor {
                    name: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data_offset as u128 + t.offset as u128;
            let end = start + t.n_bytes() as u128;
            if end > file_size as u128 {
                return Err(GgufError::TensorPastEof {
                    name: t.name.clone(),
                    start: start.min(u64::MAX as u128) as u64,
                    end,
                    file_size,
                });
            }
        }

        check_overlaps(&tensors, data_offset)?;

        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            file_size,
        })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn get_int(&self, key: &str, expected: &'static str) -> Result<i128, GgufError> {
        let v = self.require(key)?;
        v.as_integer()
            .ok_or_else(|| wrong_type(key, expected, v.value_type()))
    }

    fn int_to<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let i = self.get_int(key, expected)?;
        T::try_from(i).map_err(|_| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: format!("out-of-range value {i}"),
        })
    }

    /// An integer value that fits `u32` (any integer type is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.int_to(key, "an integer fitting u32")
    }

    /// An integer value that fits `u64` (any integer type is accepted).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.int_to(key, "an integer fitting u64")
    }

    /// An integer value that fits `i32` (any integer type is accepted).
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.int_to(key, "an integer fitting i32")
    }

    /// An `f32` value (an `f64` is narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            v => Err(wrong_type(key, "f32", v.value_type())),
        }
    }

    /// A `bool` value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            v => Err(wrong_type(key, "bool", v.value_type())),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(wrong_type(key, "string", v.value_type())),
        }
    }

    /// The elements of an array of any type, as values (cheap for numbers; strings are
    /// cloned).
    fn array_values(
        &self,
        key: &str,
    ) -> Result<(ValueType, Box<dyn Iterator<Item = Value> + '_>), GgufError> {
        match self.require(key)? {
            Value::Array(ty, items) => Ok((*ty, Box::new(items.iter().cloned()))),
            Value::Scalars(a) => Ok((a.elem_type(), Box::new(a.iter()))),
            v => Err(wrong_type(key, "array", v.value_type())),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        match self.require(key)? {
            Value::Array(ValueType::String, items) => {
                Ok(items.iter().filter_map(Value::as_str).collect())
            }
            v => match v.array_info() {
                Some((ty, _)) => Err(wrong_array(key, "array of string", ty)),
                None => Err(wrong_type(key, "array", v.value_type())),
            },
        }
    }

    /// An array of `f32` (`f64` elements are narrowed).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        if let Some(ScalarArray::F32(v)) = self.get(key).and_then(Value::as_scalars) {
            return Ok(v.clone());
        }
        let (ty, items) = self.array_values(key)?;
        items
            .map(|v| match v {
                Value::F32(x) => Ok(x),
                Value::F64(x) => Ok(x as f32),
                _ => Err(wrong_array(key, "array of f32", ty)),
            })
            .collect()
    }

    /// An array of integers that each fit `i32` (any integer element type).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        if let Some(ScalarArray::I32(v)) = self.get(key).and_then(Value::as_scalars) {
            return Ok(v.clone());
        }
        let (ty, items) = self.array_values(key)?;
        items
            .map(|v| {
                v.as_integer()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| wrong_array(key, "array of integers fitting i32", ty))
            })
            .collect()
    }

    /// An array of integers that each fit `u32` (any integer element type).
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        if let Some(ScalarArray::U32(v)) = self.get(key).and_then(Value::as_scalars) {
            return Ok(v.clone());
        }
        let (ty, items) = self.array_values(key)?;
        items
            .map(|v| {
                v.as_integer()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| wrong_array(key, "array of integers fitting u32", ty))
            })
            .collect()
    }

    /// `general.architecture` (`"llama"`, `"qwen2"`, ...).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's absolute byte range in the file (validated at parse time).
    pub fn tensor_range(&self, t: &TensorInfo) -> Range<u64> {
        let start = self.data_offset.saturating_add(t.offset);
        start..start.saturating_add(t.n_bytes())
    }

    /// The tensor's bytes within `bytes` (the same file bytes this header was parsed
    /// from). Returns an empty slice if the range does not lie in `bytes`, which can only
    /// happen when `bytes` is not the parsed file or `t` is not one of its tensors.
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], t: &TensorInfo) -> &'a [u8] {
        let r = self.tensor_range(t);
        usize::try_from(r.start)
            .ok()
            .zip(usize::try_from(r.end).ok())
            .and_then(|(s, e)| bytes.get(s..e))
            .unwrap_or(&[])
    }
}

/// Refuses two tensors whose data share a byte (llama.cpp's loader refuses them too):
/// aliased data would be read, converted and uploaded once per alias.
fn check_overlaps(tensors: &[TensorInfo], data_offset: u64) -> Result<(), GgufError> {
    // Ranges were checked to lie in the file, so these sums fit u64.
    let range = |t: &TensorInfo| {
        let start = data_offset + t.offset;
        (start, start + t.n_bytes())
    };
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes() > 0)
        .collect();
    order.sort_by_key(|&i| range(&tensors[i]));
    // The tensor reaching furthest so far: any later start before its end overlaps it.
    let mut reach: Option<usize> = None;
    for &i in &order {
        if let Some(j) = reach {
            let (a, b) = (range(&tensors[j]), range(&tensors[i]));
            if b.0 < a.1 {
                return Err(GgufError::OverlappingTensors {
                    first: tensors[j].name.clone(),
                    first_range: a.0..a.1,
                    second: tensors[i].name.clone(),
                    second_range: b.0..b.1,
                });
            }
        }
        if reach.is_none_or(|j| range(&tensors[i]).1 > range(&tensors[j]).1) {
            reach = Some(i);
        }
    }
    Ok(())
}

fn wrong_array(key: &str, expected: &'static str, elem: ValueType) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: format!("array of {elem}"),
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, name: &str) -> Result<TensorInfo, GgufError> {
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            name: name.to_string(),
            n_dims,
        });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(c.u64("tensor dimension")?);
    }
    let overflow = || GgufError::DimOverflow {
        name: name.to_string(),
        shape: shape.clone(),
    };
    // ggml keeps element counts in int64: stay below i64::MAX.
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    let raw_ty = c.u32("tensor type")?;
    let ty = GgmlType::from_u32(raw_ty).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.to_string(),
        found: raw_ty,
    })?;
    if !shape[0].is_multiple_of(ty.block_size() as u64) {
        return Err(GgufError::RowNotBlockMultiple {
            name: name.to_string(),
            ty,
            row_len: shape[0],
            block_size: ty.block_size(),
        });
    }
    ty.row_bytes(n_elements).ok_or_else(overflow)?;
    let offset = c.u64("tensor offset")?;
    Ok(TensorInfo {
        name: name.to_string(),
        shape,
        ty,
        offset,
    })
}
