//! What a generation runs on: the Vulkan [`Session`], the CPU reference, or the Vulkan
//! session checked against the reference (`--check`). One small trait is the switch.

use crate::generate::GenerateError;
use crate::session::{Counters, Session};

/// A forward pass with a KV cache: feed tokens, read the next-token prediction.
///
/// Positions advance by the number of tokens fed; [`Forward::reset`] starts over.
pub trait Forward {
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
    fn counters(&self) -> Option<Counters> {
        Some(Session::counters(self))
    }
    fn session(&self) -> Option<&Session> {
        Some(self)
    }
}

/// The plain f32 CPU reference as a backend (slow; one token at a time).
pub struct ReferenceForward {
    model: reference::Model,
    state: reference::State,
    pos: usize,
}

impl ReferenceForward {
    /// A reference decoder with a KV cache of `ctx_len` positions; a cache that cannot be
    /// sized or allocated is an error naming the context and the bytes.
    pub fn new(
        model: reference::Model,
        ctx_len: usize,
    ) -> Result<ReferenceForward, reference::RefError> {
        let state = reference::State::try_new(model.config(), ctx_len)?;
        Ok(ReferenceForward {
            model,
            state,
            pos: 0,
        })
    }

    fn feed(&mut self, token: u32) -> Result<(), GenerateError> {
        reference::forward(
            &self.model,
            &mut self.state,
            token,
            self.pos,
            &mut |_, _| {},
        )?;
        self.pos += 1;
        Ok(())
    }

    fn logits(&self) -> Result<&[f32], GenerateError> {
        if self.pos == 0 {
            return Err(GenerateError::Input(
                "no token fed yet: nothing to predict from".into(),
            ));
        }
        Ok(&self.state.logits)
    }
}

impl Forward for ReferenceForward {
    /// One token: the reference runs a token at a time, so Ctrl-C is seen between tokens.
    fn chunk_len(&self) -> usize {
        1
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError> {
        tokens.iter().try_for_each(|&t| self.feed(t))
    }
    fn last_argmax(&mut self) -> Result<u32, GenerateError> {
        let pos = self.pos.saturating_sub(1);
        finite_argmax(self.logits()?, pos)
    }
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        self.logits()
    }
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError> {
        self.feed(token)?;
        self.last_argmax()
    }
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError> {
        self.feed(token)?;
        self.logits()
    }
    fn pos(&self) -> usize {
        self.pos
    }
    fn ctx_len(&self) -> usize {
        self.state.ctx_len
    }
    fn reset(&mut self) {
        self.pos = 0;
    }
}

/// `--check`: the Vulkan session with the reference run beside it on the same tokens;
/// every step's logits are compared.
pub struct Checked {
    inner: Session,
    reference: ReferenceForward,
    last_diff: Option<f32>,
}

impl Checked {
    /// Runs `reference` beside `inner`; both must have the same context length.
    pub fn new(inner: Session, reference: ReferenceForward) -> Checked {
        Checked {
            inner,
            reference,
            last_diff: None,
        }
    }

    fn compare(diff: &mut Option<f32>, gpu: &[f32], cpu: &[f32]) {
        let d = gpu
            .iter()
            .zip(cpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        *diff = Some(d);
    }
}

impl Forward for Checked {
    fn chunk_len(&self) -> usize {
        self.inner.prefill_chunk()
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), GenerateError> {
        self.reference.prefill(tokens)?;
        Ok(self.inner.prefill(tokens)?)
    }
    fn last_argmax(&mut self) -> Result<u32, GenerateError> {
        let pos = self.inner.pos().saturating_sub(1);
        finite_argmax(self.last_logits()?, pos)
    }
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        let gpu = self.inner.last_logits()?;
        Self::compare(&mut self.last_diff, gpu, self.reference.logits()?);
        Ok(gpu)
    }
    fn decode_argmax(&mut self, token: u32) -> Result<u32, GenerateError> {
        let pos = self.inner.pos();
        finite_argmax(self.decode_logits(token)?, pos)
    }
    fn decode_logits(&mut self, token: u32) -> Result<&[f32], GenerateError> {
        self.reference.feed(token)?;
        let gpu = self.inner.decode_logits(token)?;
        Self::compare(&mut self.last_diff, gpu, self.reference.logits()?);
        Ok(gpu)
    }
    fn pos(&self) -> usize {
        self.inner.pos()
    }
    fn ctx_len(&self) -> usize {
        self.inner.ctx_len()
    }
    fn reset(&mut self) {
        self.inner.reset();
        self.reference.reset();
    }
    fn wants_logits(&self) -> bool {
        true
    }
    fn take_check_diff(&mut self) -> Option<f32> {
        self.last_diff.take()
    }
    fn counters(&self) -> Option<Counters> {
        Some(self.inner.counters())
    }
    fn session(&self) -> Option<&Session> {
        Some(&self.inner)
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

/// The first maximum of `logits`, once they are known to be finite (see [`check_finite`]).
fn finite_argmax(logits: &[f32], pos: usize) -> Result<u32, GenerateError> {
    check_finite(logits, pos)?;
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

#[cfg(test)]
mod tests {
    use super::{check_finite, finite_argmax};

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
        assert_eq!(finite_argmax(&[1.0, 3.0, 3.0, 2.0], 0).unwrap(), 1);
        assert!(finite_argmax(&[1.0, f32::NAN], 0).is_err());
    }
}
