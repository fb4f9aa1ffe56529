//! JSON schema to grammar: random walks produce JSON that satisfies the schema, integer
//! and number bounds are exact, unsupported keywords are refused with their path.

mod common;

use std::sync::Arc;

use common::{accepts, random_walk, synthetic_vocab, EOS};
use grammar::{
    json_schema_to_gbnf, json_schema_value_to_gbnf, CompiledGrammar, SchemaError, Vocab,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

fn compile(schema: &Value) -> Arc<CompiledGrammar> {
    let gbnf = json_schema_value_to_gbnf(schema).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(CompiledGrammar::from_gbnf(&gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}")))
}

/// A validator for the supported subset, written independently of the converter.
fn valid(schema: &Value, root: &Value, v: &Value) -> bool {
    let s = match schema {
        Value::Bool(b) => return *b,
        Value::Object(s) => s,
        _ => panic!("bad schema"),
    };
    if let Some(r) = s.get("$ref") {
        let target = root
            .pointer(r.as_str().unwrap().trim_start_matches('#'))
            .expect("ref");
        return valid(target, root, v);
    }
    if let Some(c) = s.get("const") {
        return c == v;
    }
    if let Some(e) = s.get("enum") {
        return e.as_array().unwrap().contains(v);
    }
    for kw in ["anyOf", "oneOf"] {
        if let Some(list) = s.get(kw) {
            return list
                .as_array()
                .unwrap()
                .iter()
                .any(|sub| valid(sub, root, v));
        }
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
            _ => panic!("bad type"),
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => panic!("bad type"),
        });
        if !ok {
            return false;
        }
    }
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(x) = v.as_f64() {
        if num("minimum").is_some_and(|m| x < m)
            || num("maximum").is_some_and(|m| x > m)
            || num("exclusiveMinimum").is_some_and(|m| x <= m)
            || num("exclusiveMaximum").is_some_and(|m| x >= m)
        {
            return false;
        }
    }
    if let Some(text) = v.as_str() {
        let n = text.chars().count() as u64;
        if num("minLength").is_some_and(|m| (n as f64) < m)
            || num("maxLength").is_some_and(|m| (n as f64) > m)
        {
            return false;
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as f64;
        if num("minItems").is_some_and(|m| n < m) || num("maxItems").is_some_and(|m| n > m) {
            return false;
        }
        if let Some(item) = s.get("items") {
            if !items.iter().all(|i| valid(item, root, i)) {
                return false;
            }
        }
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !obj.contains_key(r.as_str().unwrap()) {
                return false;
            }
        }
        for (k, val) in obj {
            let ok = match props.and_then(|p| p.get(k)) {
                Some(sub) => valid(sub, root, val),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => false,
                    Some(sub) if !sub.is_boolean() => valid(sub, root, val),
                    _ => true,
                },
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

fn schemas() -> Vec<Value> {
    vec![
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "email": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
                "active": {"type": "boolean"},
                "nick": {"type": ["string", "null"]}
            },
            "required": ["name", "age", "tags"],
            "additionalProperties": false
        }),
        json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer"}, "b": {"type": "number", "minimum": 0}, "c": {"enum": ["x", 1, null, [true]]}
            }
        }),
        json!({"type": "array", "items": {"type": "integer", "minimum": -20, "maximum": 7}, "minItems": 2, "maxItems": 4}),
        json!({"anyOf": [{"type": "number", "minimum": -3, "maximum": 12}, {"const": {"k": "v"}}, {"type": "boolean"}]}),
        json!({
            "$defs": {"node": {"type": "object", "properties": {
                "value": {"type": "integer", "exclusiveMinimum": 0},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
            }, "required": ["value"]}},
            "$ref": "#/$defs/node"
        }),
        json!({"type": "object", "additionalProperties": {"type": "integer", "maximum": -5}}),
        json!({"definitions": {"p": {"type": "string", "minLength": 2}}, "type": "object",
               "properties": {"first": {"$ref": "#/definitions/p"}, "second": {"$ref": "#/definitions/p"}},
               "required": ["second"], "title": "pair"}),
        // Nested objects whose generated rule names could collide ("object-2").
        json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}, "z": {"type": "object", "properties": {"q": {"type": "null"}}}}},
            "b": {"type": "null"}, "c": {"type": "null"}
        }}),
        json!({"oneOf": [{"type": "null"}, {"type": "array"}, {"type": "object", "properties": {}}]}),
        json!(true),
    ]
}

#[test]
fn random_walks_satisfy_the_schema() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let mut rng = StdRng::seed_from_u64(3);
    for schema in schemas() {
        let g = compile(&schema);
        let mut finished = 0;
        for _ in 0..30 {
            let Some(text) = random_walk(&g, &vocab, &mut rng, 150) else {
                continue;
            };
            finished += 1;
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{e}: {text:?}\nschema {schema}"));
            assert!(
                valid(&schema, &schema, &v),
                "{text} does not satisfy {schema}"
            );
        }
        assert!(finished >= 5, "only {finished} walks finished for {schema}");
    }
}

#[test]
fn any_json_object_walks_parse_as_objects() {
    let vocab = Arc::new(Vocab::new(&synthetic_vocab(), &[EOS]));
    let mut rng = StdRng::seed_from_u64(5);
    let g = Arc::new(CompiledGrammar::any_json_object());
    for _ in 0..30 {
        if let Some(text) = random_walk(&g, &vocab, &mut rng, 100) {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object(), "{text}");
        }
    }
}

/// Exhaustive over a window: the integer grammar accepts exactly the values in range.
#[test]
fn integer_bounds_are_exact() {
    let cases: &[(Option<i64>, Option<i64>)] = &[
        (Some(0), Some(150)),
        (Some(-123), Some(45)),
        (Some(-300), Some(-7)),
        (Some(17), None),
        (None, Some(-11)),
        (None, Some(99)),
        (Some(-5), None),
        (Some(0), Some(0)),
        (Some(100), Some(1000)),
        (Some(199), Some(201)),
    ];
    for &(lo, hi) in cases {
        let mut schema = json!({"type": "integer"});
        if let Some(lo) = lo {
            schema["minimum"] = json!(lo);
        }
        if let Some(hi) = hi {
            schema["maximum"] = json!(hi);
        }
        let g = compile(&schema);
        for n in -1100i64..=1100 {
            let want = lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h);
            assert_eq!(accepts(&g, &n.to_string()), want, "{n} against {schema}");
        }
        for bad in ["01", "-0", "+1", "1.0", ""] {
            if bad != "-0" || lo.is_some_and(|l| l > 0) || hi.is_some_and(|h| h < 0) {
                assert!(!accepts(&g, bad), "{bad:?} against {schema}");
            }
        }
    }
    let g = compile(&json!({"type": "integer", "minimum": 1000000, "maximum": 1099511627776i64}));
    for (s, ok) in [
        ("1000000", true),
        ("999999", false),
        ("1099511627776", true),
        ("1099511627777", false),
        ("54321987", true),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
    let g = compile(&json!({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 5.5}));
    let got: Vec<i64> = (-10..10).filter(|n| accepts(&g, &n.to_string())).collect();
    assert_eq!(got, vec![3, 4, 5]);
}

#[test]
fn number_bounds_are_exact_for_integral_bounds() {
    let g = compile(&json!({"type": "number", "minimum": -2, "maximum": 3}));
    for (s, ok) in [
        ("0", true),
        ("-2", true),
        ("-2.0", true),
        ("-2.01", false),
        ("-1.99", true),
        ("3", true),
        ("3.000", true),
        ("3.5", false),
        ("2.999", true),
        ("-0.5", true),
        ("4", false),
        ("1e2", false),
        ("12", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
    let g = compile(&json!({"type": "number", "minimum": 0}));
    for (s, ok) in [
        ("0", true),
        ("0.5", true),
        ("12.25", true),
        ("-0.5", false),
        ("-1", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
    let g = compile(&json!({"type": "number", "maximum": -1}));
    for (s, ok) in [
        ("-1", true),
        ("-1.5", true),
        ("-0.5", false),
        ("0", false),
        ("-1.0", true),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
}

#[test]
fn type_filters_enum_values() {
    let g = compile(&json!({"type": ["string", "integer"], "enum": ["a", 1, 2.5, null, 3.0]}));
    for (s, ok) in [
        ("\"a\"", true),
        ("1", true),
        ("3.0", true),
        ("2.5", false),
        ("null", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
}

#[test]
fn strings_count_characters_and_escapes() {
    let g = compile(&json!({"type": "string", "minLength": 2, "maxLength": 3}));
    for (s, ok) in [
        ("\"ab\"", true),
        ("\"日本\"", true),
        ("\"a\\n\"", true),
        ("\"a\"", false),
        ("\"abcd\"", false),
        ("\"a\nb\"", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
}

#[test]
fn optional_properties_keep_order_and_commas() {
    let g = compile(
        &json!({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}}, "required": ["b"]}),
    );
    for (s, ok) in [
        ("{\"b\":null}", true),
        ("{\"a\":null,\"b\":null}", true),
        ("{\"b\":null,\"c\":null}", true),
        ("{\"a\":null, \"b\":null,\n  \"c\":null}", true),
        ("{}", false),
        ("{\"a\":null}", false),
        ("{\"b\":null,}", false),
        ("{,\"b\":null}", false),
        ("{\"b\":null,\"a\":null}", false),
    ] {
        assert_eq!(accepts(&g, s), ok, "{s}");
    }
}

#[test]
fn whitespace_is_bounded() {
    let g = compile(&json!({"type": "array"}));
    assert!(accepts(&g, "[ 1,\n    2 ]"));
    assert!(!accepts(&g, "[  \n 1]"), "two runs of whitespace");
    assert!(!accepts(&g, &format!("[\n{}1]", " ".repeat(21))));
}

#[test]
fn unsupported_keywords_name_keyword_and_path() {
    let cases = [
        (json!({"type": "string", "pattern": "^a"}), "pattern", "#"),
        (
            json!({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}),
            "format",
            "#/properties/d",
        ),
        (
            json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
            "uniqueItems",
            "#",
        ),
        (
            json!({"type": "object", "patternProperties": {"^x": {}}}),
            "patternProperties",
            "#",
        ),
        (
            json!({"type": "array", "items": {"if": {"type": "string"}}}),
            "if",
            "#/items",
        ),
        (
            json!({"anyOf": [{"type": "integer", "multipleOf": 3}]}),
            "multipleOf",
            "#/anyOf/0",
        ),
        (json!({"allOf": [{"type": "integer"}]}), "allOf", "#"),
    ];
    for (schema, keyword, path) in cases {
        let err = json_schema_value_to_gbnf(&schema).expect_err("must be refused");
        assert_eq!(
            err,
            SchemaError::Unsupported {
                keyword: keyword.into(),
                path: path.into()
            },
            "{schema}"
        );
    }
    assert!(matches!(
        json_schema_value_to_gbnf(&json!({"$ref": "http://example.com/x"})),
        Err(SchemaError::BadRef { .. })
    ));
    assert!(matches!(
        json_schema_value_to_gbnf(&json!({"type": "number", "minimum": 0.5})),
        Err(SchemaError::Invalid { keyword, .. }) if keyword == "minimum"
    ));
    assert!(matches!(
        json_schema_value_to_gbnf(&json!({"type": "string", "enum": ["a"], "minLength": 3})),
        Err(SchemaError::Invalid { keyword, .. }) if keyword == "minLength"
    ));
    assert!(matches!(
        json_schema_value_to_gbnf(&json!({"type": "string", "enum": [1, 2]})),
        Err(SchemaError::Invalid { keyword, .. }) if keyword == "enum"
    ));
}

#[test]
fn properties_follow_the_text_order() {
    let text = r#"{"type": "object", "properties": {"zeta": {"type": "null"}, "alpha": {"type": "null"}}, "required": ["zeta", "alpha"]}"#;
    let g = Arc::new(CompiledGrammar::from_json_schema(text).unwrap());
    assert!(accepts(&g, r#"{"zeta":null,"alpha":null}"#));
    assert!(!accepts(&g, r#"{"alpha":null,"zeta":null}"#));
    // Nested, and under $defs.
    let text = r##"{"$defs": {"p": {"properties": {"y": {"const": 1}, "x": {"const": 2}}, "required": ["y", "x"]}},
                   "type": "object", "properties": {"in": {"$ref": "#/$defs/p"}}, "required": ["in"]}"##;
    let g = Arc::new(CompiledGrammar::from_json_schema(text).unwrap());
    assert!(accepts(&g, r#"{"in":{"y":1,"x":2}}"#));
    assert!(!accepts(&g, r#"{"in":{"x":2,"y":1}}"#));
    assert!(matches!(
        json_schema_to_gbnf("{"),
        Err(SchemaError::Json(_))
    ));
}
