//! Chat templates (`tokenizer.chat_template`), rendered with minijinja.
//!
//! The environment is set up the way Hugging Face's `apply_chat_template` sets up
//! Jinja2 (and llama.cpp imitates): `trim_blocks` and `lstrip_blocks` on, loop controls
//! available, `raise_exception(msg)` defined, and Python's string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) through minijinja-contrib's pycompat,
//! `tojson` written as Python's `json.dumps` writes it (`", "` and `": "` separators,
//! `indent=`), and `strftime_now(format)` (Llama 3 templates print today's date with it).

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;

use crate::TokenizerError;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `"system"`, `"user"` or `"assistant"`.
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A model's chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
}

const KEY: &str = "tokenizer.chat_template";

impl ChatTemplate {
    /// The template in the file's metadata, `None` when the file has none.
    pub fn from_gguf(g: &gguf::Gguf) -> Result<Option<ChatTemplate>, TokenizerError> {
        if g.get(KEY).is_none() {
            return Ok(None);
        }
        ChatTemplate::new(g.get_str(KEY)?).map(Some)
    }

    /// A template from its Jinja source; syntax errors are reported here.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate, TokenizerError> {
        let t = ChatTemplate {
            source: source.into(),
        };
        t.environment().template_from_str(&t.source)?;
        Ok(t)
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TokenizerError> {
        let env = self.environment();
        let template = env.template_from_str(&self.source)?;
        let out = template.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos,
            eos_token => eos,
        })?;
        Ok(out)
    }

    fn environment(&self) -> Environment<'_> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson(indent=None)` with Python's `json.dumps` layout (non-ASCII kept, as the
/// Hugging Face chat-template environment passes `ensure_ascii=False`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot convert to JSON").with_source(e)
    })?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    // Python: item separator ", " without indent, "," with it (then a newline).
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Python's `strftime` on the current UTC time, for the directives chat templates use
/// (`%Y %m %d %B %b %H %M %S %%`); other directives are kept as written.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn strftime(format: &str, unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('B') => out += name,
            Some('b') => out += &name[..3],
            Some('H') => out += &format!("{:02}", secs_of_day / 3600),
            Some('M') => out += &format!("{:02}", secs_of_day / 60 % 60),
            Some('S') => out += &format!("{:02}", secs_of_day % 60),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_exception_reports_the_message() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
        )
        .unwrap();
        let err = t
            .render(&[Message::new("system", "x")], false, "", "")
            .unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
        assert_eq!(
            t.render(&[Message::new("user", "x")], false, "", "")
                .unwrap(),
            "ok"
        );
    }

    #[test]
    fn python_string_methods_and_trim_blocks() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}\n  {% if m.content.startswith('/') %}cmd{% else %}{{ m.content.strip() | upper }}{% endif %}\n{% endfor %}{{ eos_token }}",
        )
        .unwrap();
        let msgs = [Message::new("user", "  hi "), Message::new("user", "/x")];
        assert_eq!(
            t.render(&msgs, false, "<s>", "</s>").unwrap(),
            "<s>HIcmd</s>"
        );
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %B %m %% %q", 1_709_211_909),
            "29 Feb 2024 13:05:09 February 02 % %q"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        let now = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
        let year: i32 = now.render(&[], false, "", "").unwrap().parse().unwrap();
        assert!(year >= 2024);
    }

    #[test]
    fn chatml_style_template_with_namespace_and_tojson() {
        let src = r#"{%- set ns = namespace(n=0) -%}
{%- if messages[0]['role'] == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\nDefault.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {%- set ns.n = ns.n + 1 -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content.split('|')[0] | trim + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{{- ns.n }} {{ messages | length }} {{ {'k': 'v'} | tojson }}
{%- if add_generation_prompt %}{{ '\n<|im_start|>assistant\n' }}{% endif -%}"#;
        let t = ChatTemplate::new(src).unwrap();
        let out = t
            .render(&[Message::new("user", " hi | ignored")], true, "", "")
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n1 1 {\"k\": \"v\"}\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ {'b': [1, 2.5, 'é\"'], 'a': none, 'c': {}} | tojson }}|{{ [1, {'x': true}] | tojson(indent=2) }}",
        )
        .unwrap();
        assert_eq!(
            t.render(&[], false, "", "").unwrap(),
            "{\"a\": null, \"b\": [1, 2.5, \"é\\\"\"], \"c\": {}}|[\n  1,\n  {\n    \"x\": true\n  }\n]"
        );
    }

    #[test]
    fn syntax_error_is_reported_at_load() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(err.to_string().starts_with("chat template"), "{err}");
    }
}
