//! A request's generated text as it streams: token bytes decoded as characters complete,
//! stop strings found across token boundaries, and the text that might begin a stop
//! string held back until it is known not to (so a client never sees part of a stop
//! string). The same rules as the engine's generator, for a scheduler that steps
//! tokens itself.

use tokenizer::{StreamDecoder, Tokenizer};

/// The text of one generation so far.
pub struct TextOut {
    text: String,
    /// Bytes of `text` already handed out.
    shown: usize,
    stream: StreamDecoder,
    stop: Vec<String>,
}

/// What pushing a token gave.
#[derive(Debug, PartialEq, Eq)]
pub struct Pushed {
    /// Text that can be shown now (possibly empty).
    pub text: String,
    /// A stop string appeared: the text ends before it.
    pub stopped: bool,
}

impl TextOut {
    /// Empty stop strings are ignored.
    pub fn new(stop: &[String]) -> TextOut {
        TextOut {
            text: String::new(),
            shown: 0,
            stream: StreamDecoder::new(),
            stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
        }
    }

    /// Adds token `id`'s text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Pushed {
        let piece = self.stream.push(tok, id);
        self.push_text(&piece)
    }

    /// Adds `piece` and returns what can be shown.
    pub fn push_text(&mut self, piece: &str) -> Pushed {
        // a stop string can start at most (longest stop - 1) bytes before the new piece
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        self.text.push_str(piece);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = self
            .stop
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|at| from + at))
            .min();
        if let Some(at) = found {
            self.text.truncate(at.max(self.shown));
            return Pushed {
                text: self.take(self.text.len()),
                stopped: true,
            };
        }
        let safe = self.text.len() - self.held_back();
        Pushed {
            text: self.take(safe),
            stopped: false,
        }
    }

    /// Everything not yet shown, the decoder's unfinished character included (at the
    /// end of a generation that no stop string ended).
    pub fn finish(&mut self) -> String {
        let rest = self.stream.finish();
        self.text.push_str(&rest);
        self.take(self.text.len())
    }

    /// The whole text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Bytes at the end of the text that could begin a stop string.
    fn held_back(&self) -> usize {
        let mut hold = 0;
        for s in &self.stop {
            for n in (hold + 1..s.len()).rev() {
                if s.is_char_boundary(n) && self.text.ends_with(&s[..n]) {
                    hold = n;
                    break;
                }
            }
        }
        hold.min(self.text.len() - self.shown)
    }

    fn take(&mut self, upto: usize) -> String {
        if upto <= self.shown {
            return String::new();
        }
        let out = self.text[self.shown..upto].to_string();
        self.shown = upto;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str], stop: &[&str]) -> (String, String, bool) {
        let mut out = TextOut::new(&stop.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut shown = String::new();
        for p in pieces {
            let r = out.push_text(p);
            shown.push_str(&r.text);
            if r.stopped {
                return (out.text().to_string(), shown, true);
            }
        }
        shown.push_str(&out.finish());
        (out.text().to_string(), shown, false)
    }

    #[test]
    fn a_stop_string_across_pieces_cuts_the_text_before_it() {
        let (text, shown, stopped) = run(&["Paris", ".\n", "\nThe"], &["\n\n"]);
        assert!(stopped);
        assert_eq!(text, "Paris.");
        assert_eq!(shown, "Paris.");
    }

    #[test]
    fn a_possible_stop_prefix_is_held_back_then_released() {
        let mut out = TextOut::new(&["<end>".to_string()]);
        assert_eq!(out.push_text("ab<").text, "ab");
        assert_eq!(out.push_text("en").text, "");
        // "<enx" cannot begin "<end>" any more: all of it shows
        assert_eq!(out.push_text("x").text, "<enx");
        let (_, shown, stopped) = run(&["a", "b", "<", "end"], &["<end>"]);
        assert!(!stopped);
        assert_eq!(shown, "ab<end", "the held text is released at the end");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (text, _, stopped) = run(&["one two three"], &["three", "two"]);
        assert!(stopped);
        assert_eq!(text, "one ");
    }

    #[test]
    fn without_stop_strings_everything_shows_at_once() {
        let mut out = TextOut::new(&[]);
        assert_eq!(out.push_text("héllo").text, "héllo");
        assert_eq!(out.finish(), "");
    }
}
