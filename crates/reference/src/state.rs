//! Activations and the KV cache of the reference forward pass (llama2.c's `RunState`),
//! sized with checked arithmetic and allocated fallibly: a context length read from a
//! file or a flag (2^58, 2^64-1, ...) is an error naming the context and the bytes it
//! would take, never a wrapped size, a panic or an abort on allocation.

use std::collections::TryReserveError;

use crate::RefError;
use arch::Config;
use half::f16;

/// Activations and the KV cache, allocated once.
#[derive(Clone, Debug)]
pub struct State {
    /// Positions the KV cache holds.
    pub ctx_len: usize,
    /// `[dim]` the residual stream.
    pub x: Vec<f32>,
    /// `[dim]` normed input of a sub-block, then its output before the residual add.
    pub xb: Vec<f32>,
    /// `[dim]` a sub-block's output after its post-norm (gemma3).
    pub xb2: Vec<f32>,
    /// `[q_dim]` query.
    pub q: Vec<f32>,
    /// `[kv_dim]` key of the current position.
    pub k: Vec<f32>,
    /// `[kv_dim]` value of the current position.
    pub v: Vec<f32>,
    /// `[q_dim]` attention output (all heads).
    pub att: Vec<f32>,
    /// `[hidden_dim]` gate projection.
    pub hb: Vec<f32>,
    /// `[hidden_dim]` up projection.
    pub hb2: Vec<f32>,
    /// `[hidden_dim]` act(gate)·up.
    pub hb3: Vec<f32>,
    /// `[vocab]`
    pub logits: Vec<f32>,
    /// Per layer `[ctx_len][kv_dim]` (position-major).
    pub key_cache: Vec<Vec<f16>>,
    /// Per layer `[ctx_len][kv_dim]` (position-major).
    pub value_cache: Vec<Vec<f16>>,
}

/// Bytes the KV cache of `ctx_len` positions takes for `cfg` (keys and values, every
/// layer, f16 as the engine's): one position's ([`Config::kv_cache_bytes`]) times
/// `ctx_len`, exact in u128 (no overflow for any `usize` context).
pub fn kv_cache_bytes(cfg: &Config, ctx_len: usize) -> u128 {
    let position = cfg.kv_cache_bytes(1).map_or(u128::MAX, u128::from);
    position.saturating_mul(ctx_len as u128)
}

impl State {
    /// Buffers for `cfg` with a KV cache of `ctx_len` positions.
    ///
    /// # Errors
    /// [`RefError::ContextTooLarge`] when the cache's size overflows `usize`, exceeds the
    /// memory the system reports available, or its allocation fails.
    pub fn try_new(cfg: &Config, ctx_len: usize) -> Result<State, RefError> {
        let bytes = kv_cache_bytes(cfg, ctx_len);
        let too_large = |reason: String| RefError::ContextTooLarge {
            ctx_len,
            bytes,
            reason,
        };
        let per_layer = ctx_len
            .checked_mul(cfg.kv_dim())
            .filter(|n| n.checked_mul(arch::KV_ELEMENT_BYTES as usize).is_some())
            .ok_or_else(|| too_large("larger than the address space".into()))?;
        if let Some(avail) = available_memory() {
            if bytes > u128::from(avail) {
                return Err(too_large(format!(
                    "the system has {avail} bytes of memory available"
                )));
            }
        }
        let refused = |e: TryReserveError| too_large(format!("allocation failed: {e}"));
        let zeros = |n: usize| try_filled(n, 0.0f32).map_err(refused);
        let cache = |n: usize| try_filled(n, f16::ZERO).map_err(refused);
        let mut key_cache = Vec::new();
        let mut value_cache = Vec::new();
        for _ in 0..cfg.n_layers {
            key_cache.push(cache(per_layer)?);
            value_cache.push(cache(per_layer)?);
        }
        let (dim, q, kv, h) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.hidden_dim);
        Ok(State {
            ctx_len,
            x: zeros(dim)?,
            xb: zeros(dim)?,
            xb2: zeros(dim)?,
            q: zeros(q)?,
            k: zeros(kv)?,
            v: zeros(kv)?,
            att: zeros(q)?,
            hb: zeros(h)?,
            hb2: zeros(h)?,
            hb3: zeros(h)?,
            logits: zeros(cfg.vocab_size)?,
            key_cache,
            value_cache,
        })
    }

    /// [`State::try_new`] for sizes a test or program chose itself.
    ///
    /// # Panics
    /// When the context does not fit (see [`State::try_new`]); use `try_new` for any size
    /// that comes from a file or a flag.
    pub fn new(cfg: &Config, ctx_len: usize) -> State {
        State::try_new(cfg, ctx_len).unwrap_or_else(|e| panic!("State::new: {e}"))
    }

    /// Whether every buffer has the size [`State::try_new`] gives for `cfg`.
    pub(crate) fn fits(&self, cfg: &Config) -> bool {
        let (dim, q, kv, h) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.hidden_dim);
        let sizes = [
            (self.x.len(), dim),
            (self.xb.len(), dim),
            (self.xb2.len(), dim),
            (self.q.len(), q),
            (self.k.len(), kv),
            (self.v.len(), kv),
            (self.att.len(), q),
            (self.hb.len(), h),
            (self.hb2.len(), h),
            (self.hb3.len(), h),
            (self.logits.len(), cfg.vocab_size),
            (self.key_cache.len(), cfg.n_layers),
            (self.value_cache.len(), cfg.n_layers),
        ];
        sizes.iter().all(|(a, b)| a == b)
            && self
                .key_cache
                .iter()
                .chain(&self.value_cache)
                .all(|c| Some(c.len()) == self.ctx_len.checked_mul(kv))
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes; `None` where it cannot be read (then
/// only the allocation itself can refuse).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `n` copies of `value`, or the allocator's refusal (no abort on a huge `n`).
fn try_filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.resize(n, value);
    Ok(v)
}
