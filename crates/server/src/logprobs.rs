//! Log-probabilities in OpenAI's answer shapes: chat's `logprobs.content[]` of
//! `{token, logprob, bytes, top_logprobs}` and completions' `logprobs` with `tokens`,
//! `token_logprobs`, `top_logprobs` (one `{token: logprob}` object per token) and
//! `text_offset`.
//!
//! The values are the engine sampler's (`engine::sampling`): the log-softmax of the logits
//! after `logit_bias` and the penalties, before temperature and truncation, so they do
//! not depend on `temperature`, `top_k`, `top_p` or `min_p`.

use engine::TokenLogprob;
use serde_json::{json, Map, Value};
use tokenizer::Tokenizer;

/// A token's text as the answer shows it (a piece of a UTF-8 character shows as U+FFFD,
/// its `bytes` keep the truth).
fn text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_bytes_ref(id)).into_owned()
}

fn entry(tok: &Tokenizer, id: u32, logprob: f32) -> Value {
    json!({
        "token": text(tok, id),
        "logprob": logprob,
        "bytes": tok.token_bytes_ref(id),
    })
}

/// Chat's `logprobs` object for `lps`.
pub fn chat(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(tok, lp.token, lp.logprob);
            e["top_logprobs"] = lp
                .top
                .iter()
                .map(|&(t, l)| entry(tok, t, l))
                .collect::<Vec<_>>()
                .into();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The columns of completions' `logprobs`, filled token by token.
#[derive(Default)]
pub struct CompletionLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl CompletionLogprobs {
    /// A token at character `offset` of the answer's text; `lp` is `None` for the first
    /// token of an echoed prompt (nothing predicts it), whose values are `null`. Returns
    /// the offset after the token.
    pub fn push(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        lp: Option<&TokenLogprob>,
        offset: usize,
    ) -> usize {
        let t = text(tok, id);
        let end = offset + t.chars().count();
        self.tokens.push(t.into());
        self.text_offset.push(offset.into());
        match lp {
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
            Some(lp) => {
                self.token_logprobs.push(lp.logprob.into());
                let mut top = Map::new();
                for &(t, l) in &lp.top {
                    top.entry(text(tok, t)).or_insert(l.into());
                }
                self.top_logprobs.push(top.into());
            }
        }
        end
    }

    /// The `logprobs` object; the columns start over.
    pub fn take(&mut self) -> Value {
        let s = std::mem::take(self);
        json!({
            "tokens": s.tokens,
            "token_logprobs": s.token_logprobs,
            "top_logprobs": s.top_logprobs,
            "text_offset": s.text_offset,
        })
    }
}
