//! What a generation runs on: the Vulkan [`Session`] here, or what another crate plugs in
//! (`cpu-backend`: the CPU reference, and the session checked against it for `--check`).
//! One small trait is the switch, and [`crate::Slots`] drives any of them: a backend
//! with one sequence is one slot.

use crate::generate::GenerateError;
use crate::session::{Counters, Session};

/// A forward pass with a KV cache: feed tokens, read the next-token prediction.
///
/// Positions advance by the number of tokens fed; [`Forward::reset`] starts over. A
/// backend may hold several sequences (slots, each with its own position); the calls
/// work on the selected one. The defaults describe a backend of one sequence.
pub trait Forward: Send {
    /// Most tokens one [`Forward::prefill`] call should take: the generator checks for
    /// cancellation between calls.
    fn chunk_len(&self) -> usize;
    /// Feeds `tokens` at positions `pos()..pos()+n`.
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError>;
    /// Argmax of the logits after the last token fed.
    fn last_argmax(&mut self) -> Result<u32, GenerateError>;
    /// Logits after the last token fed.
    fn last_logits(&mut self) -> Result<&[f32], GenerateError>;
    /// Feeds one token and returns the argmax of the next-token logits.
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError>;
    /// Feeds one token and returns the next-token logits.
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError>;
    /// Tokens in the cache.
    fn pos(&self) -> usize;
    /// Positions the cache holds.
    fn ctx_len(&self) -> usize;
    /// Starts a new sequence.
    fn reset(&mut self);
    /// Keeps positions `0..pos` and feeds the next token at `pos`; past `pos()` is an error.
    fn truncate(&mut self, pos: usize) -> Result<(), GenerateError>;
    /// Sequences (slots) the backend holds.
    fn slots(&self) -> usize {
        1
    }
    /// Makes `slot` the sequence the other calls work on.
    fn select_slot(&mut self, slot: usize) -> Result<(), GenerateError> {
        match slot < self.slots() {
            true => Ok(()),
            false => Err(GenerateError::Input(format!(
                "slot {slot} does not exist (the backend has {})",
                self.slots()
            ))),
        }
    }
    /// Gives slot `to` the first `len` positions of slot `from` (see
    /// `Session::copy_prefix`); only a backend of several slots can.
    fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> Result<(), GenerateError> {
        let _ = (from, to, len);
        Err(GenerateError::Input(
            "this backend holds one sequence: nothing to copy between slots".into(),
        ))
    }
    /// The Vulkan session when it alone computes the forward pass: then the slots' tokens
    /// of a decode step go in one batched submit ([`Session::decode_batch`]); otherwise
    /// (the reference, `--check`) each slot decodes on its own.
    fn batch_session(&mut self) -> Option<&mut Session> {
        None
    }
    /// True when the generator must read logits even when greedy (`--check` compares them).
    fn wants_logits(&self) -> bool {
        false
    }
    /// With `--check`: the largest |gpu - reference| logit difference of the last step.
    fn take_check_diff(&mut self) -> Option<f32> {
        None
    }
    /// The Vulkan session's counters, if this is one.
    fn counters(&self) -> Option<Counters> {
        None
    }
    /// The Vulkan session underneath, if any (profiles, weights report).
    fn session(&self) -> Option<&Session> {
        None
    }
}

impl Forward for Session {
    fn chunk_len(&self) -> usize {
        self.prefill_chunk()
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError> {
        Ok(Session::prefill(self, tokens)?)
    }
    fn last_argmax(&mut self) -> Result<u32, GenerateError> {
        Ok(Session::last_argmax(self)?)
    }
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        Ok(Session::last_logits(self)?)
    }
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError> {
        Ok(Session::decode_argmax(self, token)?)
    }
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError> {
        Ok(Session::decode_logits(self, token)?)
    }
    fn pos(&self) -> usize {
        Session::pos(self)
    }
    fn ctx_len(&self) -> usize {
        Session::ctx_len(self)
    }
    fn reset(&mut self) {
        Session::reset(self)
    }
    fn truncate(&mut self, pos: usize) -> Result<(), GenerateError> {
        Ok(Session::truncate(self, pos)?)
    }
    fn slots(&self) -> usize {
        Session::slots(self)
    }
    fn select_slot(&mut self, slot: usize) -> Result<(), GenerateError> {
        Ok(Session::select_slot(self, slot)?)
    }
    fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> Result<(), GenerateError> {
        Ok(Session::copy_prefix(self, from, to, len)?)
    }
    fn batch_session(&mut self) -> Option<&mut Session> {
        Some(self)
    }
    fn counters(&self) -> Option<Counters> {
        Some(Session::counters(self))
    }
    fn session(&self) -> Option<&Session> {
        Some(self)
    }
}

/// An error when `logits` hold a NaN or +inf, or nothing but -inf; `pos` names the
/// position in the message.
pub fn check_finite(logits: &[f32], pos: usize) -> Result<(), GenerateError> {
    let bad = |what| Err(GenerateError::NonFiniteLogits { pos, what });
    if logits.iter().any(|l| l.is_nan()) {
        return bad("NaN");
    }
    if logits.contains(&f32::INFINITY) {
        return bad("+inf");
    }
    if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
        return bad("every logit -inf");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_finite;

    #[test]
    fn non_finite_logits_are_errors() {
        assert!(check_finite(&[0.0, 1.0, -3.0], 0).is_ok());
        assert!(check_finite(&[f32::NEG_INFINITY, 1.0], 0).is_ok());
        for bad in [
            vec![0.0, f32::NAN],
            vec![f32::INFINITY, 0.0],
            vec![f32::NEG_INFINITY; 3],
        ] {
            let e = check_finite(&bad, 7).unwrap_err().to_string();
            assert!(e.contains("non-finite") && e.contains("position 7"), "{e}");
        }
    }
}
