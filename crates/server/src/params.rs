//! The request bodies of `/v1/chat/completions` and `/v1/completions`, and their checks:
//! every sampling value in range, `max_tokens` positive and capped by the context.
//!
//! Defaults are the CLI's (llama.cpp's): temperature 0.8, top_k 40, top_p 0.95,
//! min_p 0.05. `response_format`, `json_schema` and `grammar` are read by
//! `crate::constrain`, `tools` and `tool_choice` by `crate::tools`. OpenAI parameters the
//! server does not implement (the legacy `functions`, ...) are
//! accepted at their default values only: any other value is a 400 naming the
//! parameter, never an answer that silently ignored it. A `max_tokens` above what the
//! context leaves after the prompt is capped to it (as llama-server does), and the answer
//! ends with `finish_reason: "length"`.
//!
//! Penalties follow llama.cpp's sampler (see `engine::sampling`): `frequency_penalty`
//! and `presence_penalty` count the last `repeat_last_n` tokens (64 by default), prompt
//! included, like `repeat_penalty`. A `logit_bias` of -100 bans the token (its logit
//! becomes -inf), any other value is added to the logit.

use engine::SamplerOptions;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The generation fields both endpoints share (wide integer and float types, so that an
/// out-of-range value is reported as out of range, not as a type error).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    pub max_tokens: Option<i64>,
    /// The newer name of `max_tokens` in OpenAI's chat API.
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    /// llama-server's: keep going past end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    pub repeat_penalty: Option<f64>,
    /// llama.cpp's: how many recent tokens the penalties look at (-1: the whole context).
    pub repeat_last_n: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    /// Token id (as a string) to a bias from -100 to 100.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Chat: `true` or `false`; completions: how many alternatives per token (0 to 5).
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0 to 20), with `logprobs: true`.
    pub top_logprobs: Option<i64>,
    /// Completions: the answer's text starts with the prompt.
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Choices to generate (1 to [`MAX_N`]).
    pub n: Option<i64>,
    /// Not implemented: see [`UNSUPPORTED`].
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// OpenAI parameters the server does not implement, kept as given so that a value other
/// than the default is refused by name.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unsupported {
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub best_of: Option<Value>,
    pub suffix: Option<Value>,
}

/// Each unimplemented parameter and the values that mean "not used" (`null` always
/// does).
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("functions", "[]"),
    ("function_call", "\"none\" or \"auto\""),
    ("best_of", "1"),
    ("suffix", "\"\""),
];

impl Unsupported {
    fn get(&self, name: &str) -> Option<&Value> {
        match name {
            "functions" => self.functions.as_ref(),
            "function_call" => self.function_call.as_ref(),
            "best_of" => self.best_of.as_ref(),
            "suffix" => self.suffix.as_ref(),
            _ => None,
        }
    }

    /// A 400 for the first parameter set to something other than its default.
    fn check(&self) -> Result<(), ApiError> {
        for &(name, default) in UNSUPPORTED {
            let Some(v) = self.get(name) else { continue };
            let unused = match v {
                Value::Null => true,
                Value::Bool(b) => !b,
                Value::Number(n) => {
                    let one = name == "best_of";
                    n.as_f64() == Some(if one { 1.0 } else { 0.0 })
                }
                Value::String(t) => t.is_empty() || t == "none" || t == "auto",
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
            };
            if !unused {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} is not supported by this server (got {v}): leave it out or at its default ({default})"),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    pub include_usage: Option<bool>,
}

/// One chat message; `content` is a string or a list of text parts. An assistant message
/// may carry the calls it made, a `tool` message the result of one.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
}

/// A call an earlier assistant message made.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCall {
    pub id: Option<String>,
    pub function: ToolCallFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallFunction {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt`: a string, a list of one string, or a list of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// The checked generation settings of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// Asked-for most tokens (`None`: until the end or the context is full).
    pub max_tokens: Option<usize>,
    pub sampler: SamplerOptions,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate; choice `i` samples with seed `seed + i` (so choice 0 is the
    /// `n = 1` answer).
    pub n: usize,
    /// Completions: the text starts with the prompt.
    pub echo: bool,
}

/// Most stop strings a request may give.
pub const MAX_STOP: usize = 16;

/// Most choices a request may ask for (each takes a slot or a place in the queue).
pub const MAX_N: i64 = 16;

/// Which endpoint a request came to: their `logprobs` differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Sampling {
    /// Checks every field; `seed_default` is used when the request has no seed, `vocab`
    /// bounds `logit_bias`'s token ids.
    pub fn check(
        &self,
        seed_default: u64,
        endpoint: Endpoint,
        vocab: usize,
    ) -> Result<Checked, ApiError> {
        self.unsupported.check()?;
        let defaults = SamplerOptions::default();
        let max = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => Some(("max_completion_tokens", m)),
            (None, Some(m)) => Some(("max_tokens", m)),
            (None, None) => None,
        };
        let max_tokens = match max {
            None => None,
            Some((name, m)) if m < 1 => {
                return Err(ApiError::bad_param(
                    if name == "max_tokens" {
                        "max_tokens"
                    } else {
                        "max_completion_tokens"
                    },
                    format!("{name} must be at least 1 (got {m})"),
                ))
            }
            Some((_, m)) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        };
        let float = |param: &'static str,
                     v: Option<f64>,
                     default: f32,
                     ok: fn(f64) -> bool,
                     range: &str|
         -> Result<f32, ApiError> {
            match v {
                None => Ok(default),
                Some(v) if v.is_finite() && ok(v) => Ok(v as f32),
                Some(v) => Err(ApiError::bad_param(
                    param,
                    format!("{param} {v} is out of range: {range}"),
                )),
            }
        };
        let temperature = float(
            "temperature",
            self.temperature,
            defaults.temperature,
            |v| (0.0..=2.0).contains(&v),
            "0 to 2 (0 is greedy)",
        )?;
        let top_p = float(
            "top_p",
            self.top_p,
            defaults.top_p,
            |v| (0.0..=1.0).contains(&v),
            "0 to 1 (1 disables)",
        )?;
        let min_p = float(
            "min_p",
            self.min_p,
            defaults.min_p,
            |v| (0.0..=1.0).contains(&v),
            "0 to 1 (0 disables)",
        )?;
        let repeat_penalty = float(
            "repeat_penalty",
            self.repeat_penalty,
            defaults.repeat_penalty,
            |v| v > 0.0,
            "above 0 (1 disables)",
        )?;
        let frequency_penalty = float(
            "frequency_penalty",
            self.frequency_penalty,
            0.0,
            |v| (-2.0..=2.0).contains(&v),
            "-2 to 2 (0 disables)",
        )?;
        let presence_penalty = float(
            "presence_penalty",
            self.presence_penalty,
            0.0,
            |v| (-2.0..=2.0).contains(&v),
            "-2 to 2 (0 disables)",
        )?;
        let repeat_last_n = match self.repeat_last_n {
            None => defaults.repeat_last_n,
            Some(-1) => usize::MAX,
            Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(ApiError::bad_param(
                    "repeat_last_n",
                    format!(
                        "repeat_last_n must be -1 (the context), 0 (disabled) or more (got {n})"
                    ),
                ))
            }
        };
        let logit_bias = self.logit_bias_checked(vocab)?;
        let logprobs = self.logprobs_checked(endpoint)?;
        let echo = self.echo.unwrap_or(false);
        if echo && endpoint == Endpoint::Chat {
            return Err(ApiError::bad_param(
                "echo",
                "echo is a completions parameter (chat answers never repeat the messages)",
            ));
        }
        let top_k = match self.top_k {
            None => defaults.top_k,
            Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(ApiError::bad_param(
                    "top_k",
                    format!("top_k must be 0 (disabled) or more (got {k})"),
                ))
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= MAX_STOP => v.clone(),
            Some(Stop::Many(v)) => {
                return Err(ApiError::bad_param(
                    "stop",
                    format!("at most {MAX_STOP} stop strings (got {})", v.len()),
                ))
            }
        };
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::bad_param(
                    "n",
                    format!("n must be 1 to {MAX_N} (got {n})"),
                ))
            }
        };
        Ok(Checked {
            max_tokens,
            sampler: SamplerOptions {
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                repeat_last_n,
                frequency_penalty,
                presence_penalty,
                logit_bias,
                logprobs,
                seed: self.seed.map_or(seed_default, |s| s as u64),
                // set by the handler from the body's text (crate::constrain)
                grammar: None,
            },
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            n,
            echo,
        })
    }

    /// `logit_bias` as (token, bias) pairs: ids inside the vocabulary, biases -100 to
    /// 100, -100 a ban (as OpenAI documents: "should result in a ban").
    fn logit_bias_checked(&self, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        let bad = |m: String| ApiError::bad_param("logit_bias", m);
        let mut out = Vec::with_capacity(map.len());
        for (k, &v) in map {
            let id: u32 = k
                .parse()
                .map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            if id as usize >= vocab {
                return Err(bad(format!(
                    "logit_bias token id {id} is outside the vocabulary of {vocab}"
                )));
            }
            if !(-100.0..=100.0).contains(&v) {
                return Err(bad(format!(
                    "logit_bias {v} for token {id} is out of range: -100 to 100"
                )));
            }
            out.push((
                id,
                if v <= -100.0 {
                    f32::NEG_INFINITY
                } else {
                    v as f32
                },
            ));
        }
        Ok(out)
    }

    /// How many alternatives to report per token, if logprobs are asked for: chat's
    /// `logprobs: true` with `top_logprobs` 0 to 20, completions' `logprobs` 0 to 5.
    fn logprobs_checked(&self, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
        let lp = self.logprobs.as_ref().unwrap_or(&Value::Null);
        match endpoint {
            Endpoint::Chat => {
                let on = match lp {
                    Value::Null => false,
                    Value::Bool(b) => *b,
                    v => {
                        return Err(ApiError::bad_param(
                            "logprobs",
                            format!("chat logprobs is true or false (got {v}): top_logprobs says how many alternatives"),
                        ))
                    }
                };
                match self.top_logprobs {
                    None => Ok(on.then_some(0)),
                    Some(t) if !(0..=20).contains(&t) => Err(ApiError::bad_param(
                        "top_logprobs",
                        format!("top_logprobs {t} is out of range: 0 to 20"),
                    )),
                    Some(t) if t > 0 && !on => Err(ApiError::bad_param(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    )),
                    Some(t) => Ok(on.then_some(t as usize)),
                }
            }
            Endpoint::Completions => {
                if self.top_logprobs.is_some_and(|t| t != 0) {
                    return Err(ApiError::bad_param(
                        "top_logprobs",
                        "top_logprobs is a chat parameter: completions take logprobs: 0 to 5",
                    ));
                }
                match lp {
                    Value::Null | Value::Bool(false) => Ok(None),
                    Value::Number(n) => match n.as_i64() {
                        Some(k) if (0..=5).contains(&k) => Ok(Some(k as usize)),
                        _ => Err(ApiError::bad_param(
                            "logprobs",
                            format!("logprobs {n} is out of range: 0 to 5"),
                        )),
                    },
                    v => Err(ApiError::bad_param(
                        "logprobs",
                        format!("completions logprobs is a number, 0 to 5 (got {v})"),
                    )),
                }
            }
        }
    }
}

/// The most tokens a request may generate: what it asked for, capped by what the context
/// leaves after its prompt. A prompt that leaves no room is a 400 naming `param`, the
/// field the prompt came in (`messages` or `prompt`).
pub fn cap_max_tokens(
    asked: Option<usize>,
    n_prompt: usize,
    ctx_len: usize,
    param: &'static str,
) -> Result<usize, ApiError> {
    if n_prompt >= ctx_len {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_param(
                param,
                format!(
                    "the prompt is {n_prompt} tokens but a slot's context holds {ctx_len}: shorten it (or start the server with a larger --ctx-size)"
                ),
            )
        });
    }
    let room = ctx_len - n_prompt;
    Ok(asked.map_or(room, |m| m.min(room)))
}

impl ChatMessage {
    /// The message's text: a string, or its text parts joined by newlines (as
    /// llama-server does: parts are paragraphs, not fragments of one).
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => {
                            if !out.is_empty() {
                                out.push('\n');
                            }
                            out.push_str(t);
                        }
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                "messages",
                                format!(
                                    "content parts of type {kind:?} are not supported (text only)"
                                ),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests;
