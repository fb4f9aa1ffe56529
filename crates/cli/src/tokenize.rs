//! `vkdecode tokenize`: text to token ids with the model's own tokenizer, printed so
//! that they compare directly with llama.cpp's `llama-tokenize`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

/// Arguments of `tokenize`.
#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["text", "file"]))]
pub struct Args {
    /// GGUF model whose tokenizer metadata is used.
    #[arg(short = 'm', long)]
    pub model: PathBuf,

    /// Text to tokenize.
    #[arg(short = 'p', long, visible_alias = "prompt")]
    pub text: Option<String>,

    /// Read the text to tokenize from this file instead.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,

    /// Print each token as `id -> 'piece'`, one per line (like llama-tokenize's default).
    #[arg(long, conflicts_with = "ids")]
    pub pieces: bool,

    /// Print only the ids, as one JSON array on one line (like `llama-tokenize --ids`).
    #[arg(long)]
    pub ids: bool,

    /// Do not add the BOS/EOS tokens that the model's metadata asks for.
    #[arg(long)]
    pub no_bos: bool,

    /// Parse special-token text (`<|im_start|>` becomes the control token, as
    /// llama-tokenize does by default). Off by default, as for the main command's
    /// `--special`: text is tokenized as plain text.
    #[arg(long)]
    pub special: bool,

    /// The default (control-token text stays text); kept for llama-tokenize's spelling.
    #[arg(long, hide = true, conflicts_with = "special")]
    pub no_parse_special: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => crate::input::read_text_file(path, "--file")?,
        (None, None) => anyhow::bail!("give the text with --text or --file"),
    };
    let file = gguf::GgufFile::open(&args.model)
        .with_context(|| format!("cannot open model {}", args.model.display()))?;
    let tok = tokenizer::Tokenizer::from_gguf(file.gguf())
        .with_context(|| format!("cannot build the tokenizer of {}", args.model.display()))?;
    let ids = tok.encode(&text, !args.no_bos, args.special)?;
    out!("{}", format_ids(&tok, &ids, args.pieces, args.ids));
    Ok(())
}

/// The output for `ids`: a JSON array (`as_json`), `id -> 'piece'` lines (`pieces`),
/// or the ids separated by spaces.
pub fn format_ids(tok: &tokenizer::Tokenizer, ids: &[u32], pieces: bool, as_json: bool) -> String {
    let mut out = String::new();
    if as_json {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "[{}]", list.join(", "));
    } else if pieces {
        for &id in ids {
            let _ = writeln!(out, "{id:>6} -> '{}'", escape(tok.token_bytes_ref(id)));
        }
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "{}", list.join(" "));
    }
    out
}

/// A token's bytes made printable on one line: control characters escaped, and bytes
/// that are only part of a UTF-8 character written `\xNN`.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let _ = write!(out, "{}", c.escape_unicode());
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_control_and_partial_bytes() {
        assert_eq!(escape(b" the"), " the");
        assert_eq!(escape(b"\n\t'"), "\\n\\t\\'");
        assert_eq!(escape(&[0xe2, 0x98]), "\\xe2\\x98");
        assert_eq!(escape("ü".as_bytes()), "ü");
    }
}
