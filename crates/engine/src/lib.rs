//! engine: weight residency (import / copy / auto) on crates/vk, the Llama graph,
//! sampling, memory statistics. This file is a list of modules only.
//!
//! `unsafe` is confined to `residency::sys` (mmap/mincore/mlock and the host-pointer
//! import call) and `pagecache` (fadvise/mincore), each block with a SAFETY comment.

mod error;
pub mod memstats;
pub mod residency;

pub use error::EngineError;
pub use memstats::MemStats;
pub use residency::{
    auto_decision, plan_shards, AutoDecision, ResidencyOptions, ResidencyReport, ShardPlan,
    TensorView, ViewPart, Weights, WeightsMode,
};

pub mod forward;
pub mod generate;
pub mod kernels;
pub mod model;
pub mod pagecache;
pub mod sampling;
pub mod session;
pub use generate::{
    Event, GenStats, GenerateError, GenerateOptions, Generation, Generator, StopReason,
};
pub use sampling::{Sampler, SamplerOptions};
pub use session::{Counters, KernelTime, Session, SessionOptions};
