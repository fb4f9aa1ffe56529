//! The generated ids and text of one generation, with stop strings and streaming: text
//! that may still become a stop string is held back until it cannot.

use std::ops::ControlFlow;

use tokenizer::{StreamDecoder, Tokenizer};

use super::{Event, StopReason};

pub(crate) enum Push {
    Continue,
    Stop(StopReason),
}

/// The generated ids and text, and the part of the text not yet shown (held back while
/// it may be the start of a stop string).
pub(crate) struct Output {
    pub ids: Vec<u32>,
    pub text: String,
    shown: usize,
    stream: StreamDecoder,
    stop: Vec<String>,
}

impl Output {
    pub fn new(stop: &[String]) -> Output {
        Output {
            ids: Vec::new(),
            text: String::new(),
            shown: 0,
            stream: StreamDecoder::new(),
            stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
        }
    }

    pub fn push(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Push {
        self.ids.push(id);
        let piece = self.stream.push(tok, id);
        self.push_text(&piece, on_event)
    }

    /// Appends `piece` to the text and shows what can be shown.
    pub(crate) fn push_text(
        &mut self,
        piece: &str,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Push {
        // a stop string can start at most (longest stop - 1) bytes before the new piece
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest);
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
            self.text.truncate(at);
            let _ = self.show(self.text.len(), on_event);
            return Push::Stop(StopReason::StopString);
        }
        let safe = self.text.len() - self.held_back();
        match self.show(safe, on_event) {
            ControlFlow::Continue(()) => Push::Continue,
            ControlFlow::Break(()) => Push::Stop(StopReason::Cancelled),
        }
    }

    /// Bytes at the end of the text that could begin a stop string.
    fn held_back(&self) -> usize {
        let mut hold = 0;
        for s in &self.stop {
            for n in (1..s.len()).rev() {
                if n <= hold {
                    break;
                }
                if s.is_char_boundary(n) && self.text.ends_with(&s[..n]) {
                    hold = n;
                    break;
                }
            }
        }
        hold
    }

    fn show(
        &mut self,
        upto: usize,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        if upto <= self.shown {
            return ControlFlow::Continue(());
        }
        let flow = on_event(Event::Text(&self.text[self.shown..upto]));
        self.shown = upto;
        flow
    }

    /// Shows everything left, the decoder's partial character included.
    pub fn flush(&mut self, on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>) {
        let rest = self.stream.finish();
        self.text.push_str(&rest);
        let _ = self.show(self.text.len(), on_event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_stops(pieces: &[&str], stop: &[&str]) -> (String, String, bool) {
        let mut out = Output::new(&stop.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut shown = String::new();
        let mut on_event = |e: Event<'_>| {
            if let Event::Text(t) = e {
                shown.push_str(t)
            }
            ControlFlow::Continue(())
        };
        let mut stopped = false;
        for p in pieces {
            if let Push::Stop(r) = out.push_text(p, &mut on_event) {
                assert_eq!(r, StopReason::StopString);
                stopped = true;
                break;
            }
        }
        (out.text, shown, stopped)
    }

    #[test]
    fn stop_strings_cut_the_text_and_hold_back_their_prefix() {
        let (text, shown, stopped) = run_stops(&["Paris", ".\n", "\nThe"], &["\n\n"]);
        assert!(stopped);
        assert_eq!(text, "Paris.");
        assert_eq!(shown, "Paris.");
        let (text, shown, stopped) = run_stops(&["a", "b", "<", "end"], &["<end>"]);
        assert!(!stopped);
        assert_eq!(text, "ab<end");
        // "<end" may still become "<end>": held back
        assert_eq!(shown, "ab");
    }
}
