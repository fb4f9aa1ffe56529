//! JSON schema to GBNF, for the subset below. Anything that would constrain values but is
//! not enforced is a [`SchemaError`], never silently ignored.
//!
//! Covered:
//! - `type` as a name or a list (`object`, `array`, `string`, `integer`, `number`,
//!   `boolean`, `null`); without `type`, the type is taken from the keywords present
//!   (`properties` means object, `items` array, `minLength` string, `minimum` number) or
//!   any JSON value when there are none.
//! - `object`: `properties` in the order given (the text's order with
//!   [`json_schema_to_gbnf`], the `Value`'s with [`json_schema_value_to_gbnf`]), `required`
//!   ones always present, optional
//!   ones omissible; no other keys are generated (a valid subset whatever
//!   `additionalProperties` says). `additionalProperties` as a schema (or `true`) is
//!   supported only without `properties`: then keys are any strings, values that schema.
//! - `array`: `items` (one schema; absent means any value), `minItems`, `maxItems`.
//! - `string`: `minLength`, `maxLength` (in characters; an escape is one character).
//! - `integer`: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numeric
//!   forms), enforced exactly by the digit grammar, for bounds within `i64`.
//! - `number`: `minimum` and `maximum` enforced exactly when they are integers (the
//!   grammar then generates no exponent); other bounds are refused.
//! - `enum`, `const` (any JSON values, generated in compact form; a `type` beside them
//!   keeps only the values of that type), `anyOf`, `oneOf`
//!   (both as alternation: `oneOf`'s "exactly one" is not enforced), `$ref` to
//!   `#/$defs/...` or `#/definitions/...` (recursion allowed).
//! - Annotations are ignored: `title`, `description`, `$schema`, `$id`, `$comment`,
//!   `default`, `examples`, `deprecated`, `readOnly`, `writeOnly`.
//!
//! `$ref`, `anyOf`, `oneOf`, `enum` and `const` must otherwise stand alone (annotations
//! aside): an intersection with other keywords is refused rather than half-applied.
//!
//! Everything else is refused, e.g. `pattern`, `format`, `uniqueItems`, `multipleOf`,
//! `patternProperties`, `allOf`, `not`, `if`, `prefixItems`, `minProperties`.
//!
//! Generated text stays within a subset of JSON so that padding cannot run on forever
//! (string contents and array lengths are as unbounded as the schema says): whitespace is
//! at most one optional run (a space, tab or newline followed by up to 20 spaces or tabs)
//! between tokens, and numbers have at most 19 integer digits, 16 fraction digits and a
//! 2-digit exponent (so every number is finite as an `f64`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::compile::CompiledGrammar;
use crate::error::SchemaError;
use crate::key_order::{key_order, KeyOrder};
use crate::parse::MAX_REPEAT;

mod numbers;
use numbers::{integer, number};

/// Rules shared by every generated grammar: whitespace, strings, numbers, any value.
/// A macro so the built-in grammars below can `concat!` it.
macro_rules! primitives {
    () => {
        r#"ws ::= ([ \t\n] [ \t]{0,20})?
char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
uint ::= "0" | [1-9] [0-9]{0,18}
frac ::= "." [0-9]{1,16}
exp ::= [eE] [-+]? [0-9]{1,2}
integer ::= "-"? uint
number ::= "-"? uint frac? exp?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
"#
    };
}
const PRIMITIVES: &str = primitives!();

/// GBNF for any JSON value, with the whitespace and number limits described above.
pub const ANY_JSON_VALUE_GBNF: &str = concat!("root ::= value\n", primitives!());

/// GBNF for any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
pub const ANY_JSON_OBJECT_GBNF: &str = concat!("root ::= object\n", primitives!());

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];
const SUPPORTED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
    "$defs",
    "definitions",
];

impl CompiledGrammar {
    /// Compiles a JSON schema given as text (the subset described in
    /// [`crate::json_schema`]); properties are generated in the order the text lists them.
    pub fn from_json_schema(schema: &str) -> Result<Self, SchemaError> {
        Ok(CompiledGrammar::from_gbnf(&json_schema_to_gbnf(schema)?)?)
    }

    /// Compiles a parsed JSON schema; properties come in the order the `Value` iterates
    /// them, which with serde_json's default features is sorted by key. Prefer
    /// [`from_json_schema`](Self::from_json_schema) when the text is at hand.
    pub fn from_json_schema_value(schema: &Value) -> Result<Self, SchemaError> {
        Ok(CompiledGrammar::from_gbnf(&json_schema_value_to_gbnf(
            schema,
        )?)?)
    }

    /// The grammar of any JSON object, for `response_format: json_object`.
    pub fn any_json_object() -> Self {
        CompiledGrammar::from_gbnf(ANY_JSON_OBJECT_GBNF)
            .expect("the built-in JSON grammar compiles")
    }
}

/// Converts a JSON schema, given as text, to GBNF whose `root` matches the valid
/// instances the converter can generate (see the module docs for the subset). Object
/// properties are generated in the order the text lists them.
pub fn json_schema_to_gbnf(schema: &str) -> Result<String, SchemaError> {
    let value: Value =
        serde_json::from_str(schema).map_err(|e| SchemaError::Json(e.to_string()))?;
    let order = key_order(schema).map_err(|e| SchemaError::Json(e.to_string()))?;
    convert(&value, order)
}

/// Like [`json_schema_to_gbnf`] for a parsed schema, with properties in the order the
/// `Value` iterates them (sorted by key under serde_json's default features).
pub fn json_schema_value_to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    convert(schema, KeyOrder::new())
}

fn convert(schema: &Value, order: KeyOrder) -> Result<String, SchemaError> {
    let mut c = Converter {
        root: schema,
        order,
        rules: Vec::new(),
        taken: HashSet::new(),
        refs: HashMap::new(),
    };
    let body = c.visit(schema, "#")?;
    let mut out = format!("root ::= {body}\n");
    for (name, body) in &c.rules {
        let _ = writeln!(out, "{name} ::= {body}");
    }
    out.push_str(PRIMITIVES);
    Ok(out)
}

struct Converter<'a> {
    root: &'a Value,
    order: KeyOrder,
    rules: Vec<(String, String)>,
    taken: HashSet<String>,
    refs: HashMap<String, String>,
}

fn unsupported(keyword: &str, path: &str) -> SchemaError {
    SchemaError::Unsupported {
        keyword: keyword.to_string(),
        path: path.to_string(),
    }
}

fn invalid(keyword: &str, path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        keyword: keyword.to_string(),
        path: path.to_string(),
        message: message.into(),
    }
}

/// A GBNF literal matching exactly `text`.
pub(crate) fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7F}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The GBNF for a JSON value given literally (`const`, `enum`).
fn json_literal(v: &Value) -> String {
    literal(&v.to_string())
}

impl Converter<'_> {
    fn rule(&mut self, hint: &str, body: String) -> String {
        let base: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        let base = if base.is_empty() {
            "schema".to_string()
        } else {
            format!("s-{base}")
        };
        // Numbered suffixes can meet another hint's name ("object-2"): probe until free.
        let mut name = base.clone();
        let mut n = 1;
        while self.taken.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        self.taken.insert(name.clone());
        self.rules.push((name.clone(), body));
        name
    }

    /// Returns a GBNF expression matching the schema's instances.
    fn visit(&mut self, schema: &Value, path: &str) -> Result<String, SchemaError> {
        let obj = match schema {
            Value::Bool(true) => return Ok("value".into()),
            Value::Bool(false) => {
                return Err(invalid("false", path, "a schema that matches nothing"))
            }
            Value::Object(obj) => obj,
            _ => return Err(invalid("schema", path, "expected an object or a boolean")),
        };
        for key in obj.keys() {
            if !SUPPORTED.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
                return Err(unsupported(key, path));
            }
        }
        let constraining: Vec<&str> = obj
            .keys()
            .map(String::as_str)
            .filter(|k| !ANNOTATIONS.contains(k) && !["$defs", "definitions"].contains(k))
            .collect();
        // Combinators and literals must stand alone: mixing them with other constraints
        // would need an intersection the grammar cannot express.
        for kw in ["$ref", "anyOf", "oneOf", "enum", "const"] {
            // `type` next to `enum`/`const` is common and cheap: it filters the values.
            let allowed_with =
                |k: &str| k == kw || (k == "type" && (kw == "enum" || kw == "const"));
            if let Some(other) = constraining
                .iter()
                .find(|&&k| !allowed_with(k))
                .filter(|_| obj.contains_key(kw))
            {
                return Err(invalid(
                    other,
                    path,
                    format!("cannot be combined with `{kw}`"),
                ));
            }
        }
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, path);
        }
        let listed = match (obj.get("const"), obj.get("enum")) {
            (Some(v), _) => Some(("const", std::slice::from_ref(v))),
            (None, Some(e)) => {
                let items = e.as_array().filter(|a| !a.is_empty());
                Some((
                    "enum",
                    items
                        .ok_or_else(|| invalid("enum", path, "expected a non-empty array"))?
                        .as_slice(),
                ))
            }
            (None, None) => None,
        };
        if let Some((kw, values)) = listed {
            let types = match obj.get("type") {
                None => None,
                Some(t) => Some(type_names(t, path)?),
            };
            let kept: Vec<String> = values
                .iter()
                .filter(|v| {
                    types
                        .as_ref()
                        .is_none_or(|ts| ts.iter().any(|t| has_type(v, t)))
                })
                .map(json_literal)
                .collect();
            if kept.is_empty() {
                return Err(invalid(kw, path, "no listed value has the given `type`"));
            }
            return Ok(format!("({})", kept.join(" | ")));
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(list) = obj.get(kw) {
                let list = list
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| invalid(kw, path, "expected a non-empty array"))?;
                let mut alts = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    alts.push(self.visit(s, &format!("{path}/{kw}/{i}"))?);
                }
                return Ok(format!("({})", alts.join(" | ")));
            }
        }
        let types: Vec<&str> = match obj.get("type") {
            None => infer_type(obj),
            Some(t) => type_names(t, path)?,
        };
        let mut alts = Vec::new();
        for t in types {
            let expr = match t {
                "any" => "value".to_string(),
                "string" => self.string(obj, path)?,
                "integer" => integer(obj, path)?,
                "number" => number(obj, path)?,
                "boolean" => "boolean".into(),
                "null" => "null".into(),
                "object" => self.object(obj, path)?,
                "array" => self.array(obj, path)?,
                other => return Err(invalid("type", path, format!("unknown type `{other}`"))),
            };
            alts.push(expr);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or_default()
        } else {
            format!("({})", alts.join(" | "))
        })
    }

    fn reference(&mut self, r: &Value, path: &str) -> Result<String, SchemaError> {
        let r = r
            .as_str()
            .ok_or_else(|| invalid("$ref", path, "expected a string"))?;
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let bad = || SchemaError::BadRef {
            reference: r.to_string(),
            path: path.to_string(),
        };
        let pointer = r.strip_prefix('#').ok_or_else(bad)?;
        if !(pointer.starts_with("/$defs/") || pointer.starts_with("/definitions/")) {
            return Err(bad());
        }
        let target = self.root.pointer(pointer).ok_or_else(bad)?;
        let hint = pointer.rsplit('/').next().unwrap_or("ref").to_string();
        // Name the rule before visiting it, so recursive references resolve to it.
        let name = self.rule(&hint, String::new());
        self.refs.insert(r.to_string(), name.clone());
        let body = self.visit(target, r)?;
        if let Some(rule) = self.rules.iter_mut().find(|(n, _)| *n == name) {
            rule.1 = body;
        }
        Ok(name)
    }

    fn string(&mut self, obj: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let min = count(obj, "minLength", path)?.unwrap_or(0);
        let max = count(obj, "maxLength", path)?;
        let reps = repetition(min, max, "maxLength", path)?;
        if reps == "*" {
            return Ok("string".into());
        }
        Ok(self.rule("string", format!("\"\\\"\" char{reps} \"\\\"\"")))
    }

    fn array(&mut self, obj: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let item = match obj.get("items") {
            None => "value".to_string(),
            Some(Value::Array(_)) => {
                return Err(invalid(
                    "items",
                    path,
                    "tuple form (an array of schemas) is not supported",
                ))
            }
            Some(s) => self.visit(s, &format!("{path}/items"))?,
        };
        let min = count(obj, "minItems", path)?.unwrap_or(0);
        let max = count(obj, "maxItems", path)?;
        let body = match (min, max) {
            (_, Some(0)) => "\"[\" ws \"]\"".to_string(),
            (0, max) => {
                let rest = repetition(0, max.map(|m| m - 1), "maxItems", path)?;
                format!("\"[\" ws ( {item} ws ( \",\" ws {item} ws ){rest} )? \"]\"")
            }
            (min, max) => {
                let rest = repetition(min - 1, max.map(|m| m - 1), "maxItems", path)?;
                format!("\"[\" ws {item} ws ( \",\" ws {item} ws ){rest} \"]\"")
            }
        };
        Ok(self.rule("array", body))
    }

    fn object(&mut self, obj: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let empty = Map::new();
        let props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(invalid("properties", path, "expected an object")),
        };
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| invalid("required", path, "expected property names"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("required", path, "expected an array")),
        };
        for r in &required {
            if !props.contains_key(*r) {
                return Err(invalid(
                    "required",
                    path,
                    format!("`{r}` is not in `properties`"),
                ));
            }
        }
        let additional = obj.get("additionalProperties");
        if props.is_empty() {
            let value = match additional {
                None | Some(Value::Bool(true)) => return Ok("object".into()),
                Some(Value::Bool(false)) => return Ok("(\"{\" ws \"}\")".into()),
                Some(s) => self.visit(s, &format!("{path}/additionalProperties"))?,
            };
            let kv = format!("string ws \":\" ws {value} ws");
            return Ok(self.rule(
                "object",
                format!("\"{{\" ws ( {kv} ( \",\" ws {kv} )* )? \"}}\""),
            ));
        }
        match additional {
            None | Some(Value::Bool(_)) => {}
            Some(_) => {
                return Err(invalid(
                    "additionalProperties",
                    path,
                    "a schema together with `properties` is not supported",
                ))
            }
        }
        let mut keys: Vec<String> = props.keys().cloned().collect();
        if let Some(order) = self.order.get(&format!("{path}/properties")) {
            if order.len() == keys.len() && order.iter().all(|k| props.contains_key(k)) {
                keys.clone_from(order);
            }
        }
        let mut kvs = Vec::new();
        for key in keys {
            let schema = &props[&key];
            let value = self.visit(schema, &format!("{path}/properties/{key}"))?;
            let key_lit = literal(&Value::String(key.clone()).to_string());
            kvs.push((
                required.contains(&key.as_str()),
                format!("{key_lit} ws \":\" ws {value} ws"),
            ));
        }
        // rest(i, comma): properties i.. given whether a comma must precede the next one;
        // built back to front so each rule names the ones after it.
        let mut next: [String; 2] = [String::new(), String::new()];
        for (i, (req, kv)) in kvs.iter().enumerate().rev() {
            let mut cur: [String; 2] = [String::new(), String::new()];
            for comma in [false, true] {
                let sep = if comma { "\",\" ws " } else { "" };
                let take = format!("{sep}{kv} {}", next[1]);
                let body = if *req {
                    take
                } else {
                    format!("{take} | {}", next[comma as usize])
                };
                let body = if body.trim().is_empty() {
                    "\"\"".to_string()
                } else {
                    body
                };
                cur[comma as usize] = self.rule(&format!("object-{i}"), body);
            }
            next = cur;
        }
        Ok(self.rule("object", format!("\"{{\" ws {} \"}}\"", next[0])))
    }
}

fn type_names<'v>(t: &'v Value, path: &str) -> Result<Vec<&'v str>, SchemaError> {
    match t {
        Value::String(t) => Ok(vec![t.as_str()]),
        Value::Array(ts) if !ts.is_empty() => ts
            .iter()
            .map(|t| {
                t.as_str()
                    .ok_or_else(|| invalid("type", path, "expected type names"))
            })
            .collect(),
        _ => Err(invalid(
            "type",
            path,
            "expected a type name or a non-empty list",
        )),
    }
}

/// Whether a JSON value is an instance of the named type.
fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => false,
    }
}

fn infer_type(obj: &Map<String, Value>) -> Vec<&'static str> {
    let has = |ks: &[&str]| ks.iter().any(|k| obj.contains_key(*k));
    let mut t = Vec::new();
    if has(&["properties", "required", "additionalProperties"]) {
        t.push("object");
    }
    if has(&["items", "minItems", "maxItems"]) {
        t.push("array");
    }
    if has(&["minLength", "maxLength"]) {
        t.push("string");
    }
    if has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) {
        t.push("number");
    }
    if t.is_empty() {
        t.push("any");
    }
    t
}

fn count(obj: &Map<String, Value>, kw: &str, path: &str) -> Result<Option<u32>, SchemaError> {
    match obj.get(kw) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(kw, path, "expected a non-negative integer")),
    }
}

/// GBNF repetition suffix for `min..=max` occurrences.
fn repetition(min: u32, max: Option<u32>, kw: &str, path: &str) -> Result<String, SchemaError> {
    if max.unwrap_or(min) > MAX_REPEAT {
        return Err(invalid(
            kw,
            path,
            format!("bounds above {MAX_REPEAT} are not supported"),
        ));
    }
    match max {
        Some(max) if max < min => Err(invalid(
            kw,
            path,
            format!("{max} is below the minimum {min}"),
        )),
        Some(max) if max == min => Ok(format!("{{{min}}}")),
        Some(max) => Ok(format!("{{{min},{max}}}")),
        None if min == 0 => Ok("*".into()),
        None => Ok(format!("{{{min},}}")),
    }
}
