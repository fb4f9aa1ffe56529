//! Writer -> reader round trips: every value type, nested arrays, tensors and alignment.

use gguf::{GgmlType, Gguf, GgufError, GgufWriter, Value, ValueType};

fn all_values() -> Vec<(String, Value)> {
    let s = |x: &str| Value::String(x.to_string());
    vec![
        ("u8".into(), Value::U8(250)),
        ("i8".into(), Value::I8(-120)),
        ("u16".into(), Value::U16(65000)),
        ("i16".into(), Value::I16(-32000)),
        ("u32".into(), Value::U32(4_000_000_000)),
        ("i32".into(), Value::I32(-2_000_000_000)),
        ("f32".into(), Value::F32(-1.5e-5)),
        ("bool.t".into(), Value::Bool(true)),
        ("bool.f".into(), Value::Bool(false)),
        ("string".into(), s("héllo ✓ <|im_start|>")),
        ("string.empty".into(), s("")),
        ("u64".into(), Value::U64(u64::MAX - 1)),
        ("i64".into(), Value::I64(i64::MIN + 1)),
        ("f64".into(), Value::F64(std::f64::consts::PI)),
        (
            "array.str".into(),
            Value::Array(ValueType::String, vec![s("a"), s(""), s("Ġthe")]),
        ),
        (
            "array.f32".into(),
            Value::Array(ValueType::F32, vec![Value::F32(1.0), Value::F32(-0.0)]),
        ),
        (
            "array.i32".into(),
            Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)]),
        ),
        ("array.empty".into(), Value::Array(ValueType::U64, vec![])),
        (
            "array.bool".into(),
            Value::Array(ValueType::Bool, vec![Value::Bool(true), Value::Bool(false)]),
        ),
        (
            "array.nested".into(),
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                    Value::Array(
                        ValueType::Array,
                        vec![Value::Array(ValueType::String, vec![s("deep")])],
                    ),
                    Value::Array(ValueType::F64, vec![]),
                ],
            ),
        ),
    ]
}

#[test]
fn every_value_type_round_trips() {
    let mut w = GgufWriter::new(32);
    for (k, v) in all_values() {
        w.add_metadata(k, v);
    }
    let bytes = w.to_bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    // Default alignment: no general.alignment key is written.
    assert!(g.get("general.alignment").is_none());
    assert_eq!(g.metadata, all_values(), "values or their order changed");
    assert!(g.tensors.is_empty());
    assert_eq!(g.get_str_array("array.str").unwrap(), vec!["a", "", "Ġthe"]);
    assert_eq!(g.get_f32_array("array.f32").unwrap(), vec![1.0, -0.0]);
    assert_eq!(g.get_i32_array("array.i32").unwrap(), vec![-1, 7]);
    assert_eq!(g.get_u32("u8").unwrap(), 250);
    assert!(g.get_u32("i8").is_err(), "a negative value is not a u32");
    assert_eq!(g.get_u64("u64").unwrap(), u64::MAX - 1);
    assert!(g.get_bool("bool.t").unwrap());
    assert_eq!(g.get_f32("f64").unwrap(), std::f32::consts::PI);
}

#[test]
fn tensors_round_trip_with_alignment() {
    for align in [1u64, 8, 32, 64, 4096] {
        let mut w = GgufWriter::try_new(align).unwrap();
        w.add_metadata("general.architecture", Value::String("llama".into()));
        let a: Vec<u8> = (0..34 * 3).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..4 * 5).map(|i| (i * 7) as u8).collect();
        let c: Vec<u8> = vec![0xAB; 2 * 6];
        w.add_tensor("a", GgmlType::Q8_0, &[32, 3], a.clone())
            .unwrap();
        w.add_tensor("b", GgmlType::F32, &[5], b.clone()).unwrap();
        w.add_tensor("c", GgmlType::F16, &[1, 2, 3], c.clone())
            .unwrap();
        let bytes = w.to_bytes();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.alignment, align);
        assert_eq!(g.get("general.alignment").is_some(), align != 32);
        assert_eq!(g.data_offset % align, 0);
        for (name, data) in [("a", &a), ("b", &b), ("c", &c)] {
            let t = g.tensor(name).unwrap();
            assert_eq!(
                g.tensor_range(t).start % align,
                0,
                "{name} at align {align}"
            );
            assert_eq!(g.tensor_data(&bytes, t), &data[..]);
        }
        let c = g.tensor("c").unwrap();
        assert_eq!((c.row_len(), c.n_rows(), c.n_elements()), (1, 6, 6));
        assert_eq!(bytes.len() as u64 % align, 0, "file ends padded");
    }
}

#[test]
fn explicit_alignment_key_is_kept_in_place_and_made_consistent() {
    let mut w = GgufWriter::new(32);
    w.add_metadata("a", Value::U8(1));
    w.add_metadata("general.alignment", Value::U32(4096));
    w.add_metadata("b", Value::U8(2));
    let g = Gguf::parse(&w.to_bytes()).unwrap();
    let keys: Vec<_> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "general.alignment", "b"]);
    assert_eq!(g.get_u32("general.alignment").unwrap(), 32);
}

#[test]
fn add_metadata_twice_replaces_the_value_in_place() {
    let mut w = GgufWriter::new(32);
    w.add_metadata("x", Value::U8(1));
    w.add_metadata("y", Value::U8(2));
    w.add_metadata("x", Value::String("three".into()));
    let g = Gguf::parse(&w.to_bytes()).unwrap();
    assert_eq!(
        g.metadata[0],
        ("x".to_string(), Value::String("three".into()))
    );
    assert_eq!(g.metadata.len(), 2);
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new(32);
    let e = w
        .add_tensor("q", GgmlType::Q8_0, &[32], vec![0; 33])
        .unwrap_err();
    assert!(
        e.to_string().contains("tensor 'q'") && e.to_string().contains("must be 34 bytes"),
        "{e}"
    );
    let e = w
        .add_tensor("r", GgmlType::Q4_0, &[16], vec![0; 9])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not a multiple of the block size 32"),
        "{e}"
    );
    let e = w
        .add_tensor("s", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
        .unwrap_err();
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    w.add_tensor("t", GgmlType::F32, &[1], vec![0; 4]).unwrap();
    let e = w
        .add_tensor("t", GgmlType::F32, &[1], vec![0; 4])
        .unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
    assert!(GgufWriter::try_new(24).is_err());
    assert_eq!(GgufWriter::new(24).alignment(), 32);
    assert_eq!(GgufWriter::new(0).alignment(), 32);
}

#[test]
fn ill_typed_array_is_a_write_error() {
    let mut w = GgufWriter::new(32);
    w.add_metadata("bad", Value::Array(ValueType::U8, vec![Value::I32(1)]));
    let mut out = Vec::new();
    let e = w.write_to(&mut out).unwrap_err();
    assert!(e.to_string().contains("metadata key 'bad'"), "{e}");
    assert!(w.to_bytes().is_empty());
}
