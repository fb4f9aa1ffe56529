//! A chat prompt: the model's template rendered over the messages, then tokenized so that
//! only the template's own markup becomes control tokens. The
//! splitting is the tokenizer's (`ChatTemplate::render_chat`, `Tokenizer::encode_chat`);
//! this is the one call the generation API and the CLI share.

use tokenizer::{ChatTemplate, Message, Tokenizer};

use super::GenerateError;

/// The ids of `messages` rendered by `template` with the generation prompt appended.
/// With `parse_special`, special-token text inside message content is parsed too (the
/// `--special` flag); without it, user and system text is always plain text.
pub fn chat_prompt_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    parse_special: bool,
) -> Result<Vec<u32>, GenerateError> {
    let piece = |id: Option<u32>| id.and_then(|i| tok.piece(i)).unwrap_or("").to_string();
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    let chat = template.render_chat(messages, true, &bos, &eos)?;
    Ok(tok.encode_chat(&chat, true, parse_special)?)
}
