//! Constrained output: OpenAI's `response_format` (`json_object`, `json_schema`) and
//! llama-server's `grammar` (GBNF text) and `json_schema` (a schema object), turned into
//! the grammar the engine's sampler masks the logits with.
//!
//! A schema is read from the request's text, not from a parsed `Value`: `properties` are
//! generated in the order the schema lists them (as OpenAI's structured outputs do), and
//! a `Value` would have sorted them. A grammar that does not compile, or a schema keyword
//! the converter does not enforce, is a 400 naming the parameter and the fault; nothing
//! is dropped silently.

use std::sync::Arc;

use engine::Constraint;
use grammar::CompiledGrammar;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::state::AppState;

/// The constraint fields of a request body, as raw JSON text.
#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow)]
    response_format: Option<&'a RawValue>,
    #[serde(borrow)]
    json_schema: Option<&'a RawValue>,
    grammar: Option<String>,
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema", ...}`.
#[derive(Deserialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: String,
    /// `json_schema`: `{"name": ..., "schema": {...}, "strict": ...}`.
    #[serde(borrow)]
    json_schema: Option<&'a RawValue>,
    /// llama-server's `{"type": "json_object", "schema": {...}}`.
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct JsonSchemaFormat<'a> {
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

/// What a request asks its output to follow, if anything.
enum Wanted<'a> {
    /// Any JSON object (`json_object` without a schema).
    AnyObject,
    /// A schema, as JSON text; `param` names where it came from.
    Schema(&'a str, &'static str),
    /// GBNF text.
    Gbnf(String),
}

/// The constraint of a request body (already parsed once as the endpoint's typed
/// request, so it is valid JSON), or `None` when it sets none.
pub fn from_body(st: &AppState, body: &[u8]) -> Result<Option<Constraint>, ApiError> {
    let Some(wanted) = wanted(body)? else {
        return Ok(None);
    };
    let grammar = match wanted {
        Wanted::AnyObject => CompiledGrammar::any_json_object(),
        Wanted::Schema(text, param) => CompiledGrammar::from_json_schema(text)
            .map_err(|e| ApiError::bad_param(param, format!("{param}: {e}")))?,
        Wanted::Gbnf(text) => CompiledGrammar::from_gbnf(&text)
            .map_err(|e| ApiError::bad_param("grammar", format!("grammar: {e}")))?,
    };
    Ok(Some(Constraint::new(Arc::new(grammar), st.grammar_vocab())))
}

/// The constraint of a JSON schema the server wrote itself (a forced tool call's);
/// `param` names the request field it came from.
pub fn from_schema(
    st: &AppState,
    schema: &str,
    param: &'static str,
) -> Result<Constraint, ApiError> {
    let grammar = CompiledGrammar::from_json_schema(schema)
        .map_err(|e| ApiError::bad_param(param, format!("{param}: {e}")))?;
    Ok(Constraint::new(Arc::new(grammar), st.grammar_vocab()))
}

fn wanted(body: &[u8]) -> Result<Option<Wanted<'_>>, ApiError> {
    let f: Fields = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("response_format, json_schema or grammar: {e}"))
    })?;
    let mut found = Vec::new();
    if let Some(rf) = f.response_format.and_then(|raw| non_null(raw)) {
        let rf: ResponseFormat = serde_json::from_str(rf.get())
            .map_err(|e| ApiError::bad_param("response_format", format!("response_format: {e}")))?;
        match rf.kind.as_str() {
            "text" => {}
            "json_object" => found.push(match rf.schema.and_then(non_null) {
                Some(s) => Wanted::Schema(s.get(), "response_format"),
                None => Wanted::AnyObject,
            }),
            "json_schema" => {
                let js = rf.json_schema.and_then(non_null).ok_or_else(|| {
                    ApiError::bad_param(
                        "response_format",
                        "response_format of type json_schema needs a json_schema object with a schema",
                    )
                })?;
                let js: JsonSchemaFormat = serde_json::from_str(js.get()).map_err(|e| {
                    ApiError::bad_param(
                        "response_format",
                        format!("response_format.json_schema: {e}"),
                    )
                })?;
                let schema = js.schema.and_then(non_null).ok_or_else(|| {
                    ApiError::bad_param(
                        "response_format",
                        "response_format.json_schema has no schema",
                    )
                })?;
                found.push(Wanted::Schema(schema.get(), "response_format"));
            }
            other => {
                return Err(ApiError::bad_param(
                    "response_format",
                    format!(
                    "response_format type {other:?} is not one of text, json_object, json_schema"
                ),
                ))
            }
        }
    }
    if let Some(s) = f.json_schema.and_then(non_null) {
        found.push(Wanted::Schema(s.get(), "json_schema"));
    }
    if let Some(g) = f.grammar.filter(|g| !g.trim().is_empty()) {
        found.push(Wanted::Gbnf(g));
    }
    if found.len() > 1 {
        return Err(ApiError::bad_request(
            "give one of response_format (json_object or json_schema), json_schema and grammar, not several",
        ));
    }
    Ok(found.pop())
}

fn non_null(raw: &RawValue) -> Option<&RawValue> {
    (raw.get().trim() != "null").then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(body: &str) -> Result<Option<String>, ApiError> {
        Ok(wanted(body.as_bytes())?.map(|w| match w {
            Wanted::AnyObject => "object".to_string(),
            Wanted::Schema(s, p) => format!("{p}:{s}"),
            Wanted::Gbnf(g) => format!("gbnf:{g}"),
        }))
    }

    #[test]
    fn each_way_to_ask_is_read() {
        assert_eq!(kind("{}").unwrap(), None);
        assert_eq!(
            kind(r#"{"response_format": {"type": "text"}}"#).unwrap(),
            None
        );
        assert_eq!(
            kind(r#"{"response_format": null, "grammar": ""}"#).unwrap(),
            None
        );
        assert_eq!(
            kind(r#"{"response_format": {"type": "json_object"}}"#).unwrap(),
            Some("object".into())
        );
        // the schema's own text, key order kept
        assert_eq!(
            kind(r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type":"object","properties":{"b":{},"a":{}}}}}}"#).unwrap(),
            Some(r#"response_format:{"type":"object","properties":{"b":{},"a":{}}}"#.into())
        );
        assert_eq!(
            kind(r#"{"response_format": {"type": "json_object", "schema": {"type": "integer"}}}"#)
                .unwrap(),
            Some(r#"response_format:{"type": "integer"}"#.into())
        );
        assert_eq!(
            kind(r#"{"json_schema": {"type": "boolean"}}"#).unwrap(),
            Some(r#"json_schema:{"type": "boolean"}"#.into())
        );
        assert_eq!(
            kind(r#"{"grammar": "root ::= \"yes\" | \"no\""}"#).unwrap(),
            Some(r#"gbnf:root ::= "yes" | "no""#.into())
        );
    }

    #[test]
    fn malformed_or_conflicting_asks_are_400s_naming_the_field() {
        for (body, param) in [
            (
                r#"{"response_format": {"type": "xml"}}"#,
                Some("response_format"),
            ),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                Some("response_format"),
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
                Some("response_format"),
            ),
            (r#"{"response_format": "json"}"#, Some("response_format")),
            (
                r#"{"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}"#,
                None,
            ),
        ] {
            let e = kind(body)
                .err()
                .unwrap_or_else(|| panic!("{body} accepted"));
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param, param, "{body}");
        }
    }
}
