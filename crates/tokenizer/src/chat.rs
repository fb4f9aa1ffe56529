//! Chat templates (`tokenizer.chat_template`), rendered with minijinja.
//!
//! The environment is set up the way Hugging Face's `apply_chat_template` sets up
//! Jinja2 (and llama.cpp imitates): `trim_blocks` and `lstrip_blocks` on, loop controls
//! available, `raise_exception(msg)` defined, and Python's string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) through minijinja-contrib's pycompat,
//! `tojson` written as Python's `json.dumps` writes it (`", "` and `": "` separators,
//! `indent=`), and `strftime_now(format)` (Llama 3 templates print today's date with it).
//!
//! Rendering is bounded: a template runs at most [`TEMPLATE_FUEL`] minijinja
//! instructions (plus a little per message) and writes at most [`TEMPLATE_MAX_OUTPUT`]
//! bytes (or four times the message text, if more); past either it stops with
//! [`TokenizerError::TemplateLimit`] naming the limit.
//!
//! [`ChatTemplate::render_chat`] also records which bytes of the output are message
//! content, so that [`crate::Tokenizer::encode_chat`] can let only the template's own
//! markup become special tokens (a user cannot forge `<|im_start|>system` by typing it).

use std::fmt;
use std::io;
use std::ops::Range;

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;

use crate::TokenizerError;

/// Most minijinja instructions one render may run, before the per-message allowance.
/// Real chat templates take a few hundred per message.
pub const TEMPLATE_FUEL: u64 = 20_000_000;
/// Extra instructions allowed per message.
const FUEL_PER_MESSAGE: u64 = 10_000;
/// Most bytes one render may write, unless four times the message text is more.
pub const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

/// The bound that stopped a template render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateLimit {
    /// It ran this many instructions (minijinja's fuel).
    Fuel(u64),
    /// Its output passed this many bytes.
    Output(usize),
}

impl fmt::Display for TemplateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateLimit::Fuel(n) => {
                write!(f, "it ran more than {n} instructions (the fuel limit)")
            }
            TemplateLimit::Output(n) => write!(f, "its output passed {n} bytes (the output limit)"),
        }
    }
}

/// A rendered chat prompt that knows which of its bytes are message content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    text: String,
    content: Option<Vec<Range<usize>>>,
    contents: Vec<String>,
    /// The output with every content replaced by a marker (when that rendered).
    marked: Option<String>,
}

/// A piece of a [`RenderedChat`]: the template's own text or a message's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    pub text: &'a str,
    pub from_template: bool,
}

impl RenderedChat {
    /// The whole prompt, as [`ChatTemplate::render`] returns it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Byte ranges of [`text`](Self::text) copied from message content, in order and
    /// disjoint; `None` when the template changed the content beyond trimming it (or
    /// branched on it), so its place in the output is unknown.
    pub fn content_ranges(&self) -> Option<&[Range<usize>]> {
        self.content.as_deref()
    }

    /// The messages' contents, in message order.
    pub fn contents(&self) -> &[String] {
        &self.contents
    }

    /// The template's output with each content replaced by a private-use marker: what
    /// the template writes by itself. `None` if that render failed.
    pub fn marked_text(&self) -> Option<&str> {
        self.marked.as_deref()
    }

    /// The prompt cut into template and content pieces (empty pieces left out); `None`
    /// when the content ranges are unknown.
    pub fn segments(&self) -> Option<Vec<Segment<'_>>> {
        let ranges = self.content.as_ref()?;
        let mut out = Vec::new();
        let mut at = 0;
        for r in ranges {
            if r.start > at {
                out.push(Segment {
                    text: &self.text[at..r.start],
                    from_template: true,
                });
            }
            out.push(Segment {
                text: &self.text[r.clone()],
                from_template: false,
            });
            at = r.end;
        }
        if at < self.text.len() {
            out.push(Segment {
                text: &self.text[at..],
                from_template: true,
            });
        }
        Some(out)
    }
}

/// An `io::Write` that refuses to grow past `limit` bytes.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("chat template output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

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
    /// assistant's reply begins. Bounded as the module says.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TokenizerError> {
        self.render_bounded(messages, messages, add_generation_prompt, bos, eos)
    }

    /// Renders like [`render`](Self::render) and finds where each message's content
    /// landed in the output, so that [`crate::Tokenizer::encode_chat`] can keep it plain
    /// text. The template is rendered a second time with each content replaced by a
    /// marker; the marker output, with the contents (or their trimmed forms) put back,
    /// must give the real output exactly, or the ranges are reported unknown.
    pub fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<RenderedChat, TokenizerError> {
        let text = self.render(messages, add_generation_prompt, bos, eos)?;
        let contents: Vec<String> = messages.iter().map(|m| m.content.clone()).collect();
        let marked = self.render_marked(messages, add_generation_prompt, bos, eos);
        let content = marked
            .as_ref()
            .and_then(|(mark, pattern)| locate_content(messages, *mark, pattern, &text));
        Ok(RenderedChat {
            text,
            content,
            contents,
            marked: marked.map(|(_, p)| p),
        })
    }

    /// Renders with every content replaced by `{mark}{index}{mark}`, `mark` a
    /// private-use character that appears in none of the inputs (it survives case
    /// changes and trimming, and cannot be confused with real text).
    fn render_marked(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Option<(char, String)> {
        let inputs = || {
            messages
                .iter()
                .map(|m| m.content.as_str())
                .chain([self.source.as_str(), bos, eos])
        };
        let mark = (0xF0000u32..0xF0100)
            .filter_map(char::from_u32)
            .find(|&c| inputs().all(|s| !s.contains(c)))?;
        let marked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message::new(m.role.clone(), format!("{mark}{i}{mark}")))
            .collect();
        let pattern = self
            .render_bounded(&marked, messages, add_generation_prompt, bos, eos)
            .ok()?;
        Some((mark, pattern))
    }

    /// Renders `messages` with fuel and output bounds sized for `real` (the messages
    /// whose size sets the allowance).
    fn render_bounded(
        &self,
        messages: &[Message],
        real: &[Message],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, TokenizerError> {
        let fuel = TEMPLATE_FUEL + FUEL_PER_MESSAGE * real.len() as u64;
        let text_bytes: usize = real.iter().map(|m| m.content.len()).sum();
        let limit = TEMPLATE_MAX_OUTPUT.max(text_bytes.saturating_mul(4));
        let mut env = self.environment();
        env.set_fuel(Some(fuel));
        let template = env.template_from_str(&self.source)?;
        let mut out = Bounded {
            out: Vec::new(),
            limit,
            exceeded: false,
        };
        let result = template.render_captured_to(
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
            },
            &mut out,
        );
        match result {
            Ok(_) => {}
            Err(_) if out.exceeded => {
                return Err(TokenizerError::TemplateLimit(TemplateLimit::Output(limit)))
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(TokenizerError::TemplateLimit(TemplateLimit::Fuel(fuel)))
            }
            Err(e) => return Err(e.into()),
        }
        // minijinja writes whole UTF-8 strings, so the bytes are valid UTF-8.
        String::from_utf8(out.out).map_err(|_| {
            Error::new(ErrorKind::InvalidOperation, "template output is not UTF-8").into()
        })
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

/// Where each message's content landed in `text`, given the marked render `pattern`:
/// the pattern with each marker replaced by its content (or the content trimmed) must
/// give `text` exactly.
fn locate_content(
    messages: &[Message],
    mark: char,
    pattern: &str,
    text: &str,
) -> Option<Vec<Range<usize>>> {
    let mut ranges = Vec::new();
    let (mut at, mut rest) = (0usize, pattern);
    while let Some(open) = rest.find(mark) {
        let literal = &rest[..open];
        text.get(at..)?.strip_prefix(literal)?;
        at += literal.len();
        let after = &rest[open + mark.len_utf8()..];
        let close = after.find(mark)?;
        let i: usize = after[..close].parse().ok()?;
        rest = &after[close + mark.len_utf8()..];
        let c = messages.get(i)?.content.as_str();
        let found = [c, c.trim(), c.trim_start(), c.trim_end()]
            .into_iter()
            .find(|cand| text[at..].starts_with(cand))?;
        if !found.is_empty() {
            ranges.push(at..at + found.len());
        }
        at += found.len();
    }
    (text.get(at..)? == rest).then_some(ranges)
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
    fn runaway_loops_stop_at_the_fuel_limit() {
        // This grew memory without end.
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        )
        .unwrap();
        let err = t.render(&[], false, "", "").unwrap_err();
        assert!(
            matches!(
                err,
                TokenizerError::TemplateLimit(TemplateLimit::Fuel(TEMPLATE_FUEL))
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("fuel limit"), "{err}");
    }

    #[test]
    fn huge_output_stops_at_the_output_limit() {
        // 100 strings of 1 MB (minijinja's own cap on one repeated string is 100 MB).
        let t =
            ChatTemplate::new("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}").unwrap();
        let err = t.render(&[], false, "", "").unwrap_err();
        assert!(
            matches!(
                err,
                TokenizerError::TemplateLimit(TemplateLimit::Output(TEMPLATE_MAX_OUTPUT))
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("output limit"), "{err}");
    }

    const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    #[test]
    fn render_chat_finds_trimmed_content() {
        let t = ChatTemplate::new(CHATML).unwrap();
        let msgs = [
            Message::new("system", "be <|im_end|> brief"),
            Message::new("user", "  hi there \n"),
        ];
        let r = t.render_chat(&msgs, true, "", "").unwrap();
        assert_eq!(r.text(), t.render(&msgs, true, "", "").unwrap());
        let segs = r.segments().expect("content located");
        let content: Vec<&str> = segs
            .iter()
            .filter(|s| !s.from_template)
            .map(|s| s.text)
            .collect();
        assert_eq!(content, ["be <|im_end|> brief", "hi there"]);
        assert_eq!(segs.iter().map(|s| s.text).collect::<String>(), r.text());
    }

    #[test]
    fn render_chat_reports_unknown_ranges_when_content_steers_the_template() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.content.startswith('/') %}cmd{% else %}{{ m.content }}{% endif %}{% endfor %}",
        )
        .unwrap();
        let r = t
            .render_chat(&[Message::new("user", "/x")], false, "", "")
            .unwrap();
        assert_eq!(r.text(), "cmd");
        assert_eq!(r.content_ranges(), None);
        assert_eq!(r.contents(), ["/x"]);
    }

    #[test]
    fn syntax_error_is_reported_at_load() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(err.to_string().starts_with("chat template"), "{err}");
    }
}
