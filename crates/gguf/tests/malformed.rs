//! Malformed files built byte by byte: each must give an error whose text says what is
//! wrong (and never a panic).

use gguf::{GgmlType, Gguf, GgufError, GgufWriter, Value, ValueType};

/// A little-endian byte builder for hand-made GGUF files.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A key with a u32 value.
    fn kv_u32(self, k: &str, v: u32) -> Raw {
        self.str(k).u32(ValueType::U32 as u32).u32(v)
    }
    /// A tensor info.
    fn tensor(self, name: &str, shape: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(shape.len() as u32);
        for d in shape {
            r = r.u64(*d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`, then `n` data bytes.
    fn data(mut self, align: usize, n: usize) -> Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.resize(self.0.len() + n, 0x11);
        self
    }
}

/// Parses `raw` expecting failure; returns the full error text.
fn err(raw: &Raw) -> String {
    match Gguf::parse(&raw.0) {
        Ok(g) => panic!("parsed a malformed file: {g:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(raw: &Raw, needles: &[&str]) {
    let msg = err(raw);
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
}

#[test]
fn a_valid_hand_made_file_parses() {
    // The baseline the malformed cases below depart from.
    let raw = Raw::header(3, 1, 1)
        .kv_u32("a", 7)
        .tensor("w", &[32, 2], GgmlType::Q8_0 as u32, 0)
        .data(32, 68);
    let g = Gguf::parse(&raw.0).unwrap();
    assert_eq!(g.get_u32("a").unwrap(), 7);
    assert_eq!(g.tensors[0].n_bytes(), 68);
    assert_eq!(g.data_offset % 32, 0);
    assert_eq!(g.tensor_data(&raw.0, &g.tensors[0]), &[0x11u8; 68][..]);
}

#[test]
fn empty_file() {
    assert_err(&Raw::default(), &["not a GGUF file", "magic"]);
}

#[test]
fn bad_magic() {
    let raw = Raw::default().bytes(b"GGML").u32(3).u64(0).u64(0);
    assert_err(&raw, &["not a GGUF file", "47, 47, 4d, 4c"]);
}

#[test]
fn unsupported_version() {
    assert_err(
        &Raw::header(1, 0, 0),
        &["unsupported GGUF version 1", "obsolete"],
    );
    assert_err(&Raw::header(4, 0, 0), &["unsupported GGUF version 4"]);
    assert_err(
        &Raw::header(3u32.swap_bytes(), 0, 0),
        &["unsupported GGUF version 50331648", "big-endian"],
    );
}

#[test]
fn truncated_in_fixed_header() {
    let full = Raw::header(3, 0, 0);
    let cut = Raw(full.0[..14].to_vec());
    assert_err(
        &cut,
        &[
            "unexpected end of file reading tensor count at offset 8",
            "need 8 bytes, 6 remain",
        ],
    );
}

#[test]
fn tensor_count_too_large() {
    assert_err(
        &Raw::header(3, 1 << 60, 0),
        &[
            "tensor count 1152921504606846976",
            "cannot fit",
            "only 0 remain",
        ],
    );
}

#[test]
fn metadata_count_too_large() {
    assert_err(
        &Raw::header(3, 0, u64::MAX),
        &[
            "metadata key/value count 18446744073709551615",
            "cannot fit",
        ],
    );
}

#[test]
fn key_length_past_end() {
    let raw = Raw::header(3, 0, 1)
        .u64(1000)
        .bytes(b"general.")
        .u32(4)
        .u32(1);
    assert_err(
        &raw,
        &[
            "metadata entry 0",
            "reading metadata key at offset 32",
            "need 1000 bytes",
        ],
    );
}

#[test]
fn string_value_length_past_end() {
    let raw = Raw::header(3, 0, 1)
        .str("general.name")
        .u32(ValueType::String as u32)
        .u64(64)
        .bytes(b"short")
        .bytes(&[0; 8]);
    assert_err(
        &raw,
        &[
            "metadata key 'general.name'",
            "string value",
            "need 64 bytes, 13 remain",
        ],
    );
}

#[test]
fn array_count_past_end() {
    let raw = Raw::header(3, 0, 1)
        .str("tokenizer.ggml.tokens")
        .u32(ValueType::Array as u32)
        .u32(ValueType::String as u32)
        .u64(1 << 60)
        .str("a")
        .str("b");
    assert_err(
        &raw,
        &[
            "metadata key 'tokenizer.ggml.tokens'",
            "array element count 1152921504606846976",
            "cannot fit",
        ],
    );
}

#[test]
fn array_count_whose_byte_size_overflows_u64() {
    // u64::MAX elements of 8 bytes each: the byte count overflows 64 bits.
    let raw = Raw::header(3, 0, 1)
        .str("x")
        .u32(ValueType::Array as u32)
        .u32(ValueType::U64 as u32)
        .u64(u64::MAX)
        .u64(1);
    assert_err(
        &raw,
        &[
            "array element count 18446744073709551615",
            "147573952589676412920 bytes",
        ],
    );
}

#[test]
fn unknown_value_type() {
    let raw = Raw::header(3, 0, 1).str("k").u32(13).u32(0);
    assert_err(
        &raw,
        &[
            "metadata key 'k'",
            "unknown metadata value type 13 at offset 33",
        ],
    );
}

#[test]
fn unknown_array_element_type() {
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(ValueType::Array as u32)
        .u32(99)
        .u64(0);
    assert_err(&raw, &["unknown metadata value type 99"]);
}

#[test]
fn arrays_nested_too_deep() {
    let mut raw = Raw::header(3, 0, 1)
        .str("deep")
        .u32(ValueType::Array as u32);
    for _ in 0..20 {
        raw = raw.u32(ValueType::Array as u32).u64(1);
    }
    raw = raw.u32(ValueType::U8 as u32).u64(0);
    assert_err(
        &raw,
        &["metadata key 'deep'", "nested deeper than 8 levels"],
    );
}

#[test]
fn key_not_utf8() {
    let raw = Raw::header(3, 0, 1)
        .u64(2)
        .bytes(&[0xff, 0xfe])
        .u32(ValueType::U8 as u32)
        .bytes(&[1]);
    assert_err(&raw, &["metadata key at offset 32 is not valid UTF-8"]);
}

#[test]
fn bool_out_of_range() {
    let raw = Raw::header(3, 0, 1)
        .str("b")
        .u32(ValueType::Bool as u32)
        .bytes(&[2]);
    assert_err(&raw, &["metadata key 'b'", "expected 0 or 1"]);
}

#[test]
fn duplicate_key() {
    let raw = Raw::header(3, 0, 2).kv_u32("dup", 1).kv_u32("dup", 2);
    assert_err(&raw, &["duplicate metadata key 'dup'"]);
}

#[test]
fn bad_alignment() {
    let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", 24);
    assert_err(&raw, &["'general.alignment' is u32 24", "power of two"]);
    let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", 0);
    assert_err(&raw, &["'general.alignment' is u32 0"]);
    let raw = Raw::header(3, 0, 1)
        .str("general.alignment")
        .u32(ValueType::String as u32)
        .str("32");
    assert_err(&raw, &["'general.alignment' is string"]);
}

#[test]
fn truncated_in_tensor_info() {
    let full = Raw::header(3, 1, 0).tensor("w", &[32, 4, 1, 1], GgmlType::F32 as u32, 0);
    // Cut inside the last dimension.
    let cut = Raw(full.0[..full.0.len() - 24].to_vec());
    assert_err(
        &cut,
        &[
            "tensor info 0 ('w')",
            "reading tensor dimension",
            "need 8 bytes, 4 remain",
        ],
    );
}

#[test]
fn too_many_dims() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[1, 1, 1, 1, 1], 0, 0)
        .data(32, 4);
    assert_err(&raw, &["tensor 'w' has 5 dimensions, expected 1 to 4"]);
}

#[test]
fn zero_dims() {
    let raw = Raw::header(3, 1, 0).tensor("s", &[], 0, 0).data(32, 4);
    assert_err(&raw, &["tensor 's' has 0 dimensions"]);
}

#[test]
fn dim_product_overflows() {
    let raw = Raw::header(3, 1, 0)
        .tensor("big", &[1 << 32, 1 << 32, 4], GgmlType::F32 as u32, 0)
        .data(32, 4);
    assert_err(
        &raw,
        &[
            "tensor 'big' shape [4294967296, 4294967296, 4]",
            "overflows",
        ],
    );
    // Elements fit u64 but not ggml's int64.
    let raw = Raw::header(3, 1, 0)
        .tensor("big", &[1 << 32, 1 << 31], GgmlType::F32 as u32, 0)
        .data(32, 4);
    assert_err(&raw, &["overflows"]);
}

#[test]
fn unknown_tensor_type() {
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], 99, 0).data(32, 32);
    assert_err(&raw, &["tensor 'w' has unknown type 99"]);
    // 4 was Q4_2, long retired.
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], 4, 0).data(32, 32);
    assert_err(&raw, &["tensor 'w' has unknown type 4"]);
}

#[test]
fn row_not_whole_blocks() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[33, 2], GgmlType::Q8_0 as u32, 0)
        .data(32, 100);
    assert_err(
        &raw,
        &["tensor 'w' (Q8_0) row length 33 is not a multiple of the block size 32"],
    );
}

#[test]
fn tensor_past_end_of_file() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[32, 2], GgmlType::F32 as u32, 0)
        .data(32, 255);
    assert_err(
        &raw,
        &["tensor 'w' data [96, 352) extends past the end of the file (351 bytes)"],
    );
}

#[test]
fn tensor_offset_overflows() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[32], GgmlType::F32 as u32, u64::MAX - 31)
        .data(32, 128);
    assert_err(&raw, &["tensor 'w'", "extends past the end of the file"]);
}

#[test]
fn misaligned_tensor_offset() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[8], GgmlType::F32 as u32, 16)
        .data(32, 64);
    assert_err(
        &raw,
        &["tensor 'w' offset 16 is not a multiple of the alignment 32"],
    );
    // With a declared alignment of 64, offset 32 is misaligned too.
    let raw = Raw::header(3, 1, 1)
        .kv_u32("general.alignment", 64)
        .tensor("w", &[8], GgmlType::F32 as u32, 32)
        .data(64, 128);
    assert_err(&raw, &["offset 32 is not a multiple of the alignment 64"]);
}

#[test]
fn duplicate_tensor_names() {
    let raw = Raw::header(3, 2, 0)
        .tensor("w", &[8], GgmlType::F32 as u32, 0)
        .tensor("w", &[8], GgmlType::F32 as u32, 32)
        .data(32, 64);
    assert_err(&raw, &["duplicate tensor name 'w'"]);
}

#[test]
fn truncated_in_data_section() {
    let mut w = GgufWriter::new(32);
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_tensor("a", GgmlType::F32, &[16], vec![0; 64])
        .unwrap();
    w.add_tensor("b", GgmlType::F32, &[16], vec![0; 64])
        .unwrap();
    let bytes = w.to_bytes();
    assert!(Gguf::parse(&bytes).is_ok());
    let e = Gguf::parse(&bytes[..bytes.len() - 40]).unwrap_err();
    assert!(
        e.to_string().contains("tensor 'b'") && e.to_string().contains("past the end"),
        "{e}"
    );
}

#[test]
fn every_truncation_of_a_small_file_is_an_error() {
    let mut w = GgufWriter::new(32);
    w.add_metadata(
        "k",
        Value::Array(ValueType::String, vec![Value::String("x".into())]),
    );
    w.add_metadata("general.alignment", Value::U32(32));
    w.add_tensor("t", GgmlType::Q4_0, &[32], vec![0; 18])
        .unwrap();
    let bytes = w.to_bytes();
    Gguf::parse(&bytes).unwrap();
    for n in 0..bytes.len() - 14 {
        // The last tensor's trailing padding (14 bytes) is not required.
        assert!(
            Gguf::parse(&bytes[..n]).is_err(),
            "truncation to {n} bytes parsed"
        );
    }
}

#[test]
fn accessor_errors_name_the_key() {
    let raw = Raw::header(3, 0, 2)
        .kv_u32("n", 5)
        .str("s")
        .u32(ValueType::String as u32)
        .str("hi");
    let g = Gguf::parse(&raw.0).unwrap();
    assert_eq!(
        g.get_u32("missing").unwrap_err().to_string(),
        "missing metadata key 'missing'"
    );
    assert_eq!(
        g.get_str("n").unwrap_err().to_string(),
        "metadata key 'n' is u32, expected string"
    );
    assert!(g
        .get_f32("s")
        .unwrap_err()
        .to_string()
        .contains("'s' is string, expected f32"));
    assert!(g
        .get_str_array("s")
        .unwrap_err()
        .to_string()
        .contains("expected array"));
    assert!(matches!(
        g.architecture().unwrap_err(),
        GgufError::MissingKey { key } if key == "general.architecture"
    ));
    assert!(g.get_i32("n").is_ok() && g.get_u64("n").is_ok());
}

#[test]
fn overlapping_tensor_data_is_refused_naming_both() {
    // Aliases of one tensor's bytes made `convert` write each alias.
    let raw = Raw::header(3, 3, 0)
        .tensor("a", &[16], GgmlType::F32 as u32, 0)
        .tensor("b", &[8], GgmlType::F32 as u32, 64)
        .tensor("alias", &[8], GgmlType::F32 as u32, 32)
        .data(32, 96);
    let e = Gguf::parse(&raw.0).unwrap_err();
    assert!(
        matches!(e.root(), GgufError::OverlappingTensors { first, second, .. }
            if first == "a" && second == "alias"),
        "{e:?}"
    );
    assert_err(&raw, &["'a'", "'alias'", "overlap"]);
    // The same offset twice, as in the reproducer.
    let raw = Raw::header(3, 2, 0)
        .tensor("token_embd.weight", &[8], GgmlType::F32 as u32, 0)
        .tensor("copy", &[8], GgmlType::F32 as u32, 0)
        .data(32, 32);
    assert_err(&raw, &["'token_embd.weight'", "'copy'", "overlap"]);
    // Adjacent tensors and empty ones are fine.
    let raw = Raw::header(3, 3, 0)
        .tensor("a", &[8], GgmlType::F32 as u32, 0)
        .tensor("empty", &[0], GgmlType::F32 as u32, 0)
        .tensor("b", &[8], GgmlType::F32 as u32, 32)
        .data(32, 64);
    Gguf::parse(&raw.0).unwrap();
}

#[test]
fn scalar_arrays_read_back_compact_and_bool_elements_are_checked() {
    let raw = Raw::header(3, 0, 2)
        .str("u8s")
        .u32(ValueType::Array as u32)
        .u32(ValueType::U8 as u32)
        .u64(3)
        .bytes(&[1, 2, 255])
        .str("bools")
        .u32(ValueType::Array as u32)
        .u32(ValueType::Bool as u32)
        .u64(2)
        .bytes(&[1, 7]);
    assert_err(&raw, &["metadata key 'bools'", "0 or 1", "7"]);
    let raw = Raw::header(3, 0, 1)
        .str("u8s")
        .u32(ValueType::Array as u32)
        .u32(ValueType::U8 as u32)
        .u64(3)
        .bytes(&[1, 2, 255]);
    let g = Gguf::parse(&raw.0).unwrap();
    assert_eq!(
        g.get("u8s").unwrap().as_scalars(),
        Some(&gguf::ScalarArray::U8(vec![1, 2, 255]))
    );
    assert_eq!(g.get_u32_array("u8s").unwrap(), vec![1, 2, 255]);
    assert!(g.get_str_array("u8s").is_err());
}
