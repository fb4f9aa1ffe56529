//! Admission and the prompt cache: which idle slot a prompt goes to, the prefix it keeps
//! there, and the busy slot whose prefill it can share instead of repeating it (the
//! module docs of `slots` say how the three fit).

use super::job::Job;
use super::{Admission, Request, Slots};
use crate::generate::GenerateError;

impl Slots {
    /// The prompt tokens slot `slot` would reuse for `prompt` (see the `slots` module docs).
    pub fn reusable(&self, slot: usize, prompt: &[u32]) -> usize {
        let lcp = common_prefix(&self.slots[slot].cached, prompt);
        // the last prompt token is always fed: its logits choose the first new token
        lcp.min(prompt.len().saturating_sub(1))
    }

    /// The idle slot that would reuse the most of `prompt`; among equals, the least
    /// recently used. `None` when every slot is busy.
    pub fn pick_slot(&self, prompt: &[u32]) -> Option<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].job.is_none())
            .max_by_key(|&i| {
                (
                    self.reusable(i, prompt),
                    std::cmp::Reverse(self.slots[i].last_used),
                    std::cmp::Reverse(i),
                )
            })
    }

    /// Starts `req` on idle slot `slot`: keeps the cached prefix it shares with the
    /// prompt and queues the rest for prefill (the next [`Slots::step`]s run it).
    /// Refused: a busy or missing slot, an empty prompt, a prompt that leaves no room to
    /// generate in the slot's context, a token outside the vocabulary.
    pub fn submit(&mut self, slot: usize, req: Request) -> Result<Admission, GenerateError> {
        let n = self.slots.len();
        let s = self.slots.get(slot).ok_or_else(|| {
            GenerateError::Input(format!("slot {slot} does not exist ({n} slots)"))
        })?;
        if s.job.is_some() {
            return Err(GenerateError::Input(format!("slot {slot} is busy")));
        }
        let ctx_len = self.fwd.ctx_len();
        if req.prompt.is_empty() {
            return Err(GenerateError::Input(
                "the prompt tokenized to nothing".into(),
            ));
        }
        if req.prompt.len() >= ctx_len {
            let whose = if n == 1 { "the" } else { "a slot's" };
            return Err(GenerateError::Input(format!(
                "the prompt is {} tokens but {whose} context holds {ctx_len}: raise -c or shorten the prompt",
                req.prompt.len()
            )));
        }
        if req.max_tokens == Some(0) {
            return Err(GenerateError::Input("max_tokens must be at least 1".into()));
        }
        let vocab = self.tok.vocab_size();
        if let Some(&bad) = req.prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::Input(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let reused = match req.prompt_logprobs {
            // a scored prompt is fed whole: every token's logits are needed
            Some(_) => 0,
            None => self.reusable(slot, &req.prompt),
        };
        self.fwd.select_slot(slot)?;
        self.fwd.truncate(reused)?;
        let share = match req.prompt_logprobs {
            Some(_) => None,
            None => self.share_source(slot, &req.prompt, reused),
        };
        let s = &mut self.slots[slot];
        s.cached.truncate(reused);
        let to_prefill = req.prompt.len() - reused;
        self.counters.requests += 1;
        s.last_used = self.counters.requests;
        self.counters.prompt_tokens += req.prompt.len() as u64;
        self.counters.reused_tokens += reused as u64;
        let mut job = Job::new(req, reused, &self.tok, self.fwd.wants_logits());
        job.share = share;
        s.job = Some(job);
        Ok(Admission {
            reused,
            to_prefill,
            shared_from: share.map(|(from, _)| from),
        })
    }

    /// A busy slot that holds, or is prefilling, more of `prompt` than slot `slot` keeps
    /// (`own` tokens): that slot, and how many prompt tokens to copy from it once it holds
    /// them (never the last: its logits choose the first new token). This is how the
    /// answers of one request (`n` > 1), or requests sent together with one system
    /// prompt, share one prefill. An idle slot is no source: [`Slots::pick_slot`] would
    /// have given it the request. Among equals, the lowest slot wins.
    fn share_source(&self, slot: usize, prompt: &[u32], own: usize) -> Option<(usize, usize)> {
        let cap = prompt.len().saturating_sub(1);
        (0..self.slots.len())
            .filter(|&i| i != slot)
            .filter_map(|i| {
                let s = &self.slots[i];
                let job = s.job.as_ref()?;
                // a job that waits on a third slot is no source (no waiting in circles)
                let coming = match job.prefilling() && job.share.is_none() {
                    true => common_prefix(job.prompt(), prompt),
                    false => 0,
                };
                Some((i, common_prefix(&s.cached, prompt).max(coming).min(cap)))
            })
            .filter(|&(_, n)| n > own)
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
    }

    /// For slot `i`'s job, waiting to share a prompt prefix (see [`Slots::share_source`]):
    /// copies what the other slot holds once it holds all that was promised, or once it
    /// no longer prefills that prompt itself. False while it is still worth waiting.
    pub(super) fn take_shared(&mut self, i: usize) -> Result<bool, GenerateError> {
        let job = self.slots[i].job.as_ref().expect("busy");
        let Some((from, want)) = job.share else {
            return Ok(true);
        };
        let prompt = job.prompt();
        let src = &self.slots[from];
        let have = common_prefix(&src.cached, prompt).min(want);
        let coming = (src.job.as_ref()).is_some_and(|j| {
            j.prefilling() && j.share.is_none() && common_prefix(j.prompt(), prompt) >= want
        });
        if have < want && coming {
            return Ok(false);
        }
        let slot = &mut self.slots[i];
        let own = slot.cached.len();
        let job = slot.job.as_mut().expect("busy");
        if have > own {
            self.fwd.copy_prefix(from, i, have)?;
            slot.cached = job.prompt()[..have].to_vec();
            self.counters.reused_tokens += (have - own) as u64;
            self.counters.shared_tokens += (have - own) as u64;
            job.shared(have);
        } else {
            job.share = None;
        }
        Ok(true)
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_counts_equal_leading_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[7], &[8]), 0);
    }
}
