//! Per-layer attention options: which layers see only a sliding window of past
//! positions, and the RoPE base and scale each layer rotates with.
//!
//! Gemma 3 interleaves local and global layers: with a pattern period `p` (metadata
//! `gemma3.attention.sliding_window_pattern`, default 6), layer `l` is global when
//! `l % p == p - 1` and sliding-window otherwise (llama.cpp's `set_swa_pattern`). A
//! sliding-window layer at position `pos` attends to positions `pos - window + 1 ..= pos`
//! (llama.cpp's `LLAMA_SWA_TYPE_STANDARD` masks `pos - p >= window`) and rotates with
//! its own base (`<arch>.rope.freq_base_swa`, default 10000) and no scaling; global
//! layers use `rope.freq_base` and the file's linear scaling.

use crate::Config;

/// A model's sliding-window layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a sliding-window layer sees, the current one included.
    pub window: usize,
    /// Every `period`-th layer (the last of each group) is global; `period` 0 makes every
    /// layer a sliding-window one (llama.cpp's convention).
    pub period: usize,
    /// The RoPE base of the sliding-window layers.
    pub rope_base: f32,
}

impl SlidingWindow {
    /// Whether layer `l` is a sliding-window layer.
    pub fn is_local(&self, l: usize) -> bool {
        self.period == 0 || l % self.period < self.period - 1
    }
}

/// How one layer's attention behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// `Some(w)`: the layer sees the last `w` positions only (the current one included).
    pub window: Option<usize>,
    /// RoPE base (θ) of this layer.
    pub rope_base: f32,
    /// RoPE position scale (`1/factor` of linear scaling; 1 without).
    pub rope_scale: f32,
}

impl LayerAttention {
    /// The first position a query at `pos` attends to.
    pub fn first_visible(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }
}

impl Config {
    /// The attention options of layer `l`.
    pub fn layer_attention(&self, l: usize) -> LayerAttention {
        match &self.sliding_window {
            Some(sw) if sw.is_local(l) => LayerAttention {
                window: Some(sw.window),
                rope_base: sw.rope_base,
                rope_scale: 1.0,
            },
            _ => LayerAttention {
                window: None,
                rope_base: self.rope_base,
                rope_scale: self.rope_scale,
            },
        }
    }
}
