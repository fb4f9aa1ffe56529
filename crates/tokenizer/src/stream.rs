//! Streaming detokenization: text that is safe to print token by token.

use crate::Tokenizer;

/// Turns ids into text one at a time, holding back the bytes of a character that is
/// split across tokens until it is complete.
///
/// Concatenating every [`push`](Self::push) and the final [`finish`](Self::finish)
/// gives exactly [`Tokenizer::decode`] of the same ids: invalid byte sequences become
/// U+FFFD the same way `String::from_utf8_lossy` replaces them.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_bytes_ref(id));
        self.take_complete()
    }

    /// Adds raw bytes (as a token contributes them) and returns the completed text.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// Whether bytes of an unfinished character are being held.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Flushes what is held: an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid` bytes are valid UTF-8, so this copies them as is.
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        // An invalid sequence: replaced now, exactly as the lossy
                        // decoding of the whole text would replace it.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                        // A character cut short by the end: wait for more bytes.
                        None => {
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_a_split_character() {
        let mut d = StreamDecoder::new();
        let snow = "☃".as_bytes(); // e2 98 83
        assert_eq!(d.push_bytes(b"a"), "a");
        assert_eq!(d.push_bytes(&snow[..1]), "");
        assert!(d.has_pending());
        assert_eq!(d.push_bytes(&snow[1..2]), "");
        assert_eq!(d.push_bytes(&[snow[2], b'b']), "☃b");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_match_lossy_decoding() {
        let chunks: [&[u8]; 4] = [b"x\xff", b"\xe2\x98", b"y", b"\xf0\x9f"];
        let mut d = StreamDecoder::new();
        let mut streamed = String::new();
        for c in chunks {
            streamed += &d.push_bytes(c);
        }
        streamed += &d.finish();
        assert_eq!(streamed, String::from_utf8_lossy(&chunks.concat()));
    }
}
