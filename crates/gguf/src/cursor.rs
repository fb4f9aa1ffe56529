//! The bounds-checked cursor the reader parses with: little-endian scalars, strings and
//! metadata values, each checked against the bytes really there before it is used.

use crate::error::GgufError;
use crate::types::{ScalarArray, Value, ValueType};

/// Deepest nesting of arrays accepted (arrays of arrays of ...).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A bounds-checked little-endian reader.
pub(crate) struct Cursor<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.eof(n, what));
        }
        // n <= remaining, which fits usize.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn eof(&self, n: u64, what: &'static str) -> GgufError {
        GgufError::UnexpectedEof {
            what,
            offset: self.pos as u64,
            needed: n,
            available: self.remaining(),
            file_size: self.bytes.len() as u64,
        }
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &'static str,
        at: usize,
    ) -> Result<(), GgufError> {
        let min_bytes = count as u128 * min_size as u128;
        if min_bytes > self.remaining() as u128 {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset: at as u64,
                min_bytes,
                available: self.remaining(),
            });
        }
        Ok(())
    }

    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let at = self.pos as u64;
        let raw = self.take(len, what)?;
        let s =
            std::str::from_utf8(raw).map_err(|_| GgufError::InvalidUtf8 { what, offset: at })?;
        let mut out = String::new();
        out.try_reserve_exact(s.len())
            .map_err(|_| GgufError::OutOfMemory {
                what,
                bytes: s.len() as u128,
            })?;
        out.push_str(s);
        Ok(out)
    }

    pub(crate) fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let at = self.pos as u64;
        let raw = self.u32("value type")?;
        ValueType::from_u32(raw).ok_or(GgufError::UnknownValueType {
            found: raw,
            offset: at,
        })
    }

    pub(crate) fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8("u8 value")?),
            ValueType::I8 => Value::I8(self.u8("i8 value")? as i8),
            ValueType::U16 => Value::U16(self.u16("u16 value")?),
            ValueType::I16 => Value::I16(self.u16("i16 value")? as i16),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(self.u32("i32 value")? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32("f32 value")?)),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(self.u64("i64 value")? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64("f64 value")?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.u8("bool value")? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::WrongType {
                            key: format!("(bool at offset {at})"),
                            expected: "0 or 1",
                            found: b.to_string(),
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        max: MAX_ARRAY_DEPTH,
                        offset: self.pos as u64,
                    });
                }
                let elem_ty = self.value_type()?;
                let at = self.pos;
                let count = self.u64("array count")?;
                self.check_count(count, elem_ty.min_encoded_size(), "array element", at)?;
                // The check above bounds count by the bytes remaining; the hint also
                // caps the up-front allocation, as a Value is larger than its encoding.
                if let Some(size) = elem_ty.scalar_size() {
                    // Numbers and bools: one compact vector straight from the bytes.
                    let raw = self.take(count * size, "array elements")?;
                    return scalar_array(elem_ty, raw)
                        .expect("a type with a scalar size is a scalar")
                        .map(Value::Scalars);
                }
                let mut items = Vec::new();
                if elem_ty == ValueType::String {
                    // The hot loop of every model (vocabularies, merges).
                    for _ in 0..count {
                        let s = Value::String(self.string("string value")?);
                        push_checked(&mut items, s, count)?;
                    }
                } else {
                    for _ in 0..count {
                        let v = self.value(elem_ty, depth + 1)?;
                        push_checked(&mut items, v, count)?;
                    }
                }
                Value::Array(elem_ty, items)
            }
        })
    }
}

/// Pushes onto a vector that grows as items are really read (a count that lies costs
/// no more than the bytes behind it), reporting allocation failure as an error.
fn push_checked(items: &mut Vec<Value>, v: Value, count: u64) -> Result<(), GgufError> {
    if items.len() == items.capacity() {
        let want = (items.len().max(16)).min(count as usize - items.len());
        items
            .try_reserve(want.max(1))
            .map_err(|_| GgufError::OutOfMemory {
                what: "metadata array",
                bytes: (items.len() + want) as u128 * std::mem::size_of::<Value>() as u128,
            })?;
    }
    items.push(v);
    Ok(())
}

/// Initial capacity for `count` parsed items: the vectors grow as items are really
/// read, so a count that lies costs no more than the bytes behind it.
pub(crate) fn capacity_hint(count: u64) -> usize {
    count.min(4096) as usize
}

pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let rem = x % align;
    if rem == 0 {
        Some(x)
    } else {
        x.checked_add(align - rem)
    }
}

/// Decodes `bytes` as consecutive `N`-byte elements into a vector reserved up front.
fn decode_le<T, const N: usize>(
    bytes: &[u8],
    what: &'static str,
    f: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let n = bytes.len() / N;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| GgufError::OutOfMemory {
            what,
            bytes: (n as u128) * std::mem::size_of::<T>() as u128,
        })?;
    out.extend(bytes.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a)
    }));
    Ok(out)
}

/// Decodes `bytes` (exactly the elements, `len * size` bytes) as an array of `ty`.
/// `None` when `ty` is not a scalar type (string or array).
fn scalar_array(ty: ValueType, bytes: &[u8]) -> Option<Result<ScalarArray, GgufError>> {
    let what = "metadata array";
    Some(match ty {
        ValueType::U8 => decode_le(bytes, what, |[b]: [u8; 1]| b).map(ScalarArray::U8),
        ValueType::I8 => decode_le(bytes, what, i8::from_le_bytes).map(ScalarArray::I8),
        ValueType::U16 => decode_le(bytes, what, u16::from_le_bytes).map(ScalarArray::U16),
        ValueType::I16 => decode_le(bytes, what, i16::from_le_bytes).map(ScalarArray::I16),
        ValueType::U32 => decode_le(bytes, what, u32::from_le_bytes).map(ScalarArray::U32),
        ValueType::I32 => decode_le(bytes, what, i32::from_le_bytes).map(ScalarArray::I32),
        ValueType::F32 => decode_le(bytes, what, f32::from_le_bytes).map(ScalarArray::F32),
        ValueType::U64 => decode_le(bytes, what, u64::from_le_bytes).map(ScalarArray::U64),
        ValueType::I64 => decode_le(bytes, what, i64::from_le_bytes).map(ScalarArray::I64),
        ValueType::F64 => decode_le(bytes, what, f64::from_le_bytes).map(ScalarArray::F64),
        ValueType::Bool => {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Some(Err(GgufError::WrongType {
                    key: format!("(bool array element {i})"),
                    expected: "0 or 1",
                    found: bytes[i].to_string(),
                }));
            }
            decode_le(bytes, what, |[b]: [u8; 1]| b == 1).map(ScalarArray::Bool)
        }
        ValueType::String | ValueType::Array => return None,
    })
}
