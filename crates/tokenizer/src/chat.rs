//! Chat templates (`tokenizer.chat_template`), rendered with minijinja.
//!
//! The environment is set up the way Hugging Face's `apply_chat_template` sets up
//! Jinja2 (and llama.cpp imitates): `trim_blocks` and `lstrip_blocks` on, loop controls
//! available, `raise_exception(msg)` defined, and Python's string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) through minijinja-contrib's pycompat.

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
        env
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
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
    fn syntax_error_is_reported_at_load() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(err.to_string().starts_with("chat template"), "{err}");
    }
}
