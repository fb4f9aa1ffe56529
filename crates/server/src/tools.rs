//! Tool calls: OpenAI's `tools` and `tool_choice` on `/v1/chat/completions`.
//!
//! The chat templates of the models vkdecode runs (SmolLM2, Gemma 3) do not render tools,
//! so the server uses one generic format, whatever the template:
//!
//! - The functions are described in a system message (added in front, or appended to the
//!   request's own first system message): a line saying how to call, then one JSON line
//!   per function (`name`, `description`, `parameters`).
//! - A call is the assistant's whole answer as one JSON object,
//!   `{"name": "<function>", "arguments": {...}}`. Earlier calls in the conversation
//!   (assistant messages with `tool_calls`) are rendered that way; a `role: "tool"` message
//!   becomes a user turn `Result of <function> (<tool_call_id>): <content>`.
//! - `tool_choice`: `none` leaves the tools out of the prompt; `auto` (the default with
//!   tools) lets the model choose, and an answer that is such an object naming one of the
//!   tools becomes a call; `required` and a named function constrain the answer with a
//!   grammar built from the functions' parameter schemas, so the arguments always parse
//!   and follow the schema (until `max_tokens` cuts them, `finish_reason: "length"`).
//!
//! One call per answer (`parallel_tool_calls` may be given; only `false` is exact). A
//! call's answer has `content: null`, `tool_calls` and `finish_reason: "tool_calls"`;
//! a stream with tools holds the text back and sends it (or the call) whole at the end.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::ApiError;

/// A request's tools, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    functions: Vec<Function>,
    choice: Choice,
}

#[derive(Debug, Clone, PartialEq)]
struct Function {
    name: String,
    description: Option<String>,
    /// The parameters' JSON schema as given (key order kept).
    parameters: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments object as the model wrote it.
    pub arguments: String,
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow)]
    tools: Option<Vec<ToolDef<'a>>>,
    tool_choice: Option<Value>,
}

#[derive(Deserialize)]
struct ToolDef<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    function: Option<FunctionDef<'a>>,
}

#[derive(Deserialize)]
struct FunctionDef<'a> {
    name: String,
    description: Option<String>,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallText<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

fn bad(param: &'static str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_param(param, format!("{param}: {message}"))
}

impl Tools {
    /// The tools of a chat request body, or `None` when it has none (or `tool_choice` is
    /// `none`).
    pub fn from_body(body: &[u8]) -> Result<Option<Tools>, ApiError> {
        let f: Fields = serde_json::from_slice(body).map_err(|e| bad("tools", e))?;
        let defs = f.tools.unwrap_or_default();
        let mut functions: Vec<Function> = Vec::with_capacity(defs.len());
        for d in defs {
            if d.kind != "function" {
                return Err(bad(
                    "tools",
                    format!(
                        "tools of type {:?} are not supported (function only)",
                        d.kind
                    ),
                ));
            }
            let f = d
                .function
                .ok_or_else(|| bad("tools", "a tool of type function needs a function object"))?;
            let name_ok = !f.name.is_empty()
                && f.name.len() <= 64
                && f.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !name_ok {
                return Err(bad(
                    "tools",
                    format!(
                        "function name {:?}: 1 to 64 letters, digits, _ or -",
                        f.name
                    ),
                ));
            }
            if functions.iter().any(|g| g.name == f.name) {
                return Err(bad(
                    "tools",
                    format!("function {:?} is defined twice", f.name),
                ));
            }
            let parameters = match f.parameters.map(RawValue::get) {
                None | Some("null") => r#"{"type": "object"}"#.to_string(),
                Some(p) => p.to_string(),
            };
            functions.push(Function {
                name: f.name,
                description: f.description,
                parameters,
            });
        }
        let choice = match &f.tool_choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => return Ok(None),
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!("tool_choice {other:?} is not none, auto, required or a function"),
                    ))
                }
            },
            Some(v @ Value::Object(_)) => {
                let name = v["function"]["name"].as_str().ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "tool_choice as an object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
                if !functions.iter().any(|f| f.name == name) {
                    return Err(bad(
                        "tool_choice",
                        format!("tool_choice names {name:?}, which is not among the tools"),
                    ));
                }
                Choice::Named(name.to_string())
            }
            Some(v) => {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice {v} is not none, auto, required or a function"),
                ))
            }
        };
        if functions.is_empty() {
            return match choice {
                Choice::Auto => Ok(None),
                _ => Err(bad(
                    "tool_choice",
                    "tool_choice requires a call but the request has no tools",
                )),
            };
        }
        Ok(Some(Tools { functions, choice }))
    }

    /// The system text that describes the functions.
    pub fn system_text(&self) -> String {
        let mut s = String::from(
            "You can call functions. To call one, answer with only a JSON object \
             {\"name\": <function name>, \"arguments\": <an object of its parameters>} \
             and nothing else. The functions:",
        );
        for f in self.offered() {
            // the parameters' own text: valid JSON, key order kept
            s.push_str(&format!(
                "\n{{\"name\": {}, \"description\": {}, \"parameters\": {}}}",
                Value::from(f.name.as_str()),
                Value::from(f.description.as_deref().unwrap_or("")),
                f.parameters.trim()
            ));
        }
        s
    }

    /// The functions the model may call (a named choice offers only that one).
    fn offered(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| match &self.choice {
            Choice::Named(n) => &f.name == n,
            _ => true,
        })
    }

    /// The JSON schema a forced call must follow (`required`, a named function); `None`
    /// for `auto`.
    pub fn call_schema(&self) -> Option<String> {
        if self.choice == Choice::Auto {
            return None;
        }
        let one = |f: &Function| {
            format!(
                r#"{{"type": "object", "properties": {{"name": {{"const": {}}}, "arguments": {}}}, "required": ["name", "arguments"], "additionalProperties": false}}"#,
                Value::from(f.name.as_str()),
                f.parameters.trim()
            )
        };
        let all: Vec<String> = self.offered().map(one).collect();
        Some(match all.len() {
            1 => all.into_iter().next().unwrap_or_default(),
            _ => format!(r#"{{"anyOf": [{}]}}"#, all.join(", ")),
        })
    }

    /// The call in an answer's text, if the text is one (a JSON object naming one of the
    /// offered functions, with an object of arguments).
    pub fn parse_call(&self, text: &str) -> Option<Call> {
        let c: CallText = serde_json::from_str(text.trim()).ok()?;
        let args = c.arguments.get();
        let is_object = serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object());
        (is_object && self.offered().any(|f| f.name == c.name)).then(|| Call {
            name: c.name,
            arguments: args.to_string(),
        })
    }
}

/// How an earlier call of the conversation is written in the prompt (the same shape the
/// model is asked to answer with).
pub fn render_call(name: &str, arguments: &str) -> String {
    let args = arguments.trim();
    let args = if serde_json::from_str::<Value>(args).is_ok() {
        args
    } else {
        "{}"
    };
    format!("{{\"name\": {}, \"arguments\": {args}}}", Value::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEATHER: &str = r#"{"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}}, {"type": "function", "function": {"name": "get_time"}}]"#;

    fn tools(choice: &str) -> Result<Option<Tools>, ApiError> {
        let body = format!("{WEATHER}, \"tool_choice\": {choice}}}");
        Tools::from_body(body.as_bytes())
    }

    #[test]
    fn tool_choice_decides_what_is_offered_and_forced() {
        assert_eq!(tools("\"none\"").unwrap(), None);
        assert_eq!(Tools::from_body(b"{}").unwrap(), None);
        assert_eq!(Tools::from_body(br#"{"tools": []}"#).unwrap(), None);
        let auto = tools("\"auto\"").unwrap().unwrap();
        assert_eq!(auto.call_schema(), None);
        let text = auto.system_text();
        assert!(text.contains(r#"{"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city""#), "{text}");
        assert!(
            text.contains(
                r#"{"name": "get_time", "description": "", "parameters": {"type": "object"}}"#
            ),
            "{text}"
        );
        let req = tools("\"required\"").unwrap().unwrap();
        let schema = req.call_schema().unwrap();
        assert!(
            schema.starts_with(
                r#"{"anyOf": [{"type": "object", "properties": {"name": {"const": "get_weather"}"#
            ),
            "{schema}"
        );
        grammar::CompiledGrammar::from_json_schema(&schema).unwrap();
        let named = tools(r#"{"type": "function", "function": {"name": "get_weather"}}"#)
            .unwrap()
            .unwrap();
        let schema = named.call_schema().unwrap();
        assert!(schema.starts_with(r#"{"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city""#), "{schema}");
        assert!(!named.system_text().contains("get_time"));
    }

    #[test]
    fn bad_tools_are_400s_naming_the_field() {
        for (body, param) in [
            (r#"{"tools": [{"type": "retrieval"}]}"#, "tools"),
            (r#"{"tools": [{"type": "function"}]}"#, "tools"),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#,
                "tools",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}"#,
                "tools",
            ),
            (r#"{"tool_choice": "required"}"#, "tool_choice"),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}"#,
                "tool_choice",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"}"#,
                "tool_choice",
            ),
        ] {
            let e = Tools::from_body(body.as_bytes()).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn an_answer_is_a_call_only_when_it_names_an_offered_function() {
        let t = tools("\"auto\"").unwrap().unwrap();
        let call = t
            .parse_call(r#" {"name": "get_weather", "arguments": {"unit": "C", "city": "Paris"}} "#)
            .unwrap();
        assert_eq!(call.name, "get_weather");
        // the model's own text, key order kept
        assert_eq!(call.arguments, r#"{"unit": "C", "city": "Paris"}"#);
        assert_eq!(
            t.parse_call(r#"{"name": "get_news", "arguments": {}}"#),
            None
        );
        assert_eq!(
            t.parse_call(r#"{"name": "get_time", "arguments": 3}"#),
            None
        );
        assert_eq!(t.parse_call("It is sunny."), None);
        assert_eq!(
            render_call("get_time", "not json"),
            r#"{"name": "get_time", "arguments": {}}"#
        );
    }
}
