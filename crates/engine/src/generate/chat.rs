//! A chat prompt as token ids, where only the template's own markup becomes special
//! tokens: message text (user and system alike) is tokenized as plain text unless the
//! caller asks for special-token parsing.
//!
//! The template is rendered once with a unique marker in place of each message's text;
//! the rendered text is cut at the markers, the template's parts are tokenized with
//! special tokens parsed and the messages' parts without.

use tokenizer::{ChatTemplate, Message, Tokenizer};

use crate::generate::GenerateError;

/// Renders `messages` with `template` (ending where the assistant's reply begins) and
/// tokenizes the result, adding BOS as the model's metadata says. `parse_special`: let
/// control-token text inside messages (`<|im_end|>`) become control tokens.
pub fn chat_prompt_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    parse_special: bool,
) -> Result<Vec<u32>, GenerateError> {
    let piece = |id: Option<u32>| id.and_then(|i| tok.piece(i)).unwrap_or("").to_string();
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    if parse_special {
        let text = template.render(messages, true, &bos, &eos)?;
        return Ok(tok.encode(&text, true, true)?);
    }
    let mut mark = String::from("\u{F8FF}vkd");
    while messages.iter().any(|m| m.content.contains(&mark)) {
        mark.push('\u{F8FF}');
    }
    let marker = |i: usize| format!("{mark}{i}\u{F8FE}");
    let marked: Vec<Message> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| Message::new(m.role.clone(), marker(i)))
        .collect();
    let rendered = template.render(&marked, true, &bos, &eos)?;

    // BOS (and EOS) as `encode` adds them for any text, here around the whole prompt.
    let specials = tok.encode("", true, false)?;
    let n_bos = specials
        .iter()
        .take_while(|&&id| Some(id) == tok.bos())
        .count()
        .min(1);
    let mut ids: Vec<u32> = specials[..n_bos].to_vec();
    let mut rest = rendered.as_str();
    loop {
        // the earliest marker left in the text
        let next = (0..messages.len())
            .filter_map(|i| rest.find(&marker(i)).map(|at| (at, i)))
            .min();
        let Some((at, i)) = next else {
            ids.extend(tok.encode(rest, false, true)?);
            break;
        };
        ids.extend(tok.encode(&rest[..at], false, true)?);
        ids.extend(tok.encode(&messages[i].content, false, false)?);
        rest = &rest[at + marker(i).len()..];
    }
    ids.extend_from_slice(&specials[n_bos..]);
    Ok(ids)
}
