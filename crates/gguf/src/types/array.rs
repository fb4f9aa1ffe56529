//! Metadata arrays of scalars kept as compact typed vectors.
//!
//! A [`Value`] takes 32 bytes; a u8 array read as `Vec<Value>` took 32 times its size in
//! the file (a 50M-element array cost 1.6 GB). The reader keeps every array whose
//! elements are numbers or bools as one of these instead: one element costs what it
//! costs in the file (the cursor decodes them with one `try_reserve`d allocation, so a
//! file that does not fit in memory is an error, not an abort).

use super::{Value, ValueType};

/// An array of one scalar type, as stored in the file (little-endian decoded).
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl ScalarArray {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            ScalarArray::U8(_) => ValueType::U8,
            ScalarArray::I8(_) => ValueType::I8,
            ScalarArray::U16(_) => ValueType::U16,
            ScalarArray::I16(_) => ValueType::I16,
            ScalarArray::U32(_) => ValueType::U32,
            ScalarArray::I32(_) => ValueType::I32,
            ScalarArray::F32(_) => ValueType::F32,
            ScalarArray::Bool(_) => ValueType::Bool,
            ScalarArray::U64(_) => ValueType::U64,
            ScalarArray::I64(_) => ValueType::I64,
            ScalarArray::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ScalarArray::U8(v) => v.len(),
            ScalarArray::I8(v) => v.len(),
            ScalarArray::U16(v) => v.len(),
            ScalarArray::I16(v) => v.len(),
            ScalarArray::U32(v) => v.len(),
            ScalarArray::I32(v) => v.len(),
            ScalarArray::F32(v) => v.len(),
            ScalarArray::Bool(v) => v.len(),
            ScalarArray::U64(v) => v.len(),
            ScalarArray::I64(v) => v.len(),
            ScalarArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`].
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            ScalarArray::U8(v) => Value::U8(*v.get(i)?),
            ScalarArray::I8(v) => Value::I8(*v.get(i)?),
            ScalarArray::U16(v) => Value::U16(*v.get(i)?),
            ScalarArray::I16(v) => Value::I16(*v.get(i)?),
            ScalarArray::U32(v) => Value::U32(*v.get(i)?),
            ScalarArray::I32(v) => Value::I32(*v.get(i)?),
            ScalarArray::F32(v) => Value::F32(*v.get(i)?),
            ScalarArray::Bool(v) => Value::Bool(*v.get(i)?),
            ScalarArray::U64(v) => Value::U64(*v.get(i)?),
            ScalarArray::I64(v) => Value::I64(*v.get(i)?),
            ScalarArray::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// The elements as [`Value`]s, in order.
    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// Appends the elements' little-endian encoding (no type tag or count).
    pub(crate) fn write_le(&self, buf: &mut Vec<u8>) {
        fn put<T: Copy, const N: usize>(buf: &mut Vec<u8>, v: &[T], f: impl Fn(T) -> [u8; N]) {
            buf.reserve(v.len() * N);
            for &x in v {
                buf.extend_from_slice(&f(x));
            }
        }
        match self {
            ScalarArray::U8(v) => buf.extend_from_slice(v),
            ScalarArray::I8(v) => put(buf, v, i8::to_le_bytes),
            ScalarArray::U16(v) => put(buf, v, u16::to_le_bytes),
            ScalarArray::I16(v) => put(buf, v, i16::to_le_bytes),
            ScalarArray::U32(v) => put(buf, v, u32::to_le_bytes),
            ScalarArray::I32(v) => put(buf, v, i32::to_le_bytes),
            ScalarArray::F32(v) => put(buf, v, f32::to_le_bytes),
            ScalarArray::Bool(v) => put(buf, v, |b| [u8::from(b)]),
            ScalarArray::U64(v) => put(buf, v, u64::to_le_bytes),
            ScalarArray::I64(v) => put(buf, v, i64::to_le_bytes),
            ScalarArray::F64(v) => put(buf, v, f64::to_le_bytes),
        }
    }
}
