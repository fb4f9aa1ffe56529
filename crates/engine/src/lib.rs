//! engine: weight residency (import / copy / auto) on crates/vk, the Llama graph,
//! sampling, memory statistics. This file is a list of modules only.
//!
//! `unsafe` is denied here and allowed in three named modules only, each block with a
//! SAFETY comment: `residency::sys` (sysconf, mincore, the host-pointer import calls),
//! `residency::sigbus` (the SIGBUS handler: sigaction, write, _exit) and `pagecache`
//! (fadvise, and the read-only map of a file that is only passed to mincore).
#![deny(unsafe_code)]

mod error;
pub mod memstats;
pub mod residency;

pub use error::EngineError;
pub use memstats::MemStats;
pub use residency::{
    auto_decision, plan_shards, AutoDecision, ResidencyOptions, ResidencyReport, ShardPlan,
    TensorView, ViewPart, Weights, WeightsMode,
};

pub mod activations;
pub mod forward;
pub mod generate;
pub mod graph;
pub mod kernels;
pub mod model;
pub mod pagecache;
pub mod profile;
pub mod sampling;
pub mod session;
pub mod slots;
mod step;
pub mod support;
mod views;
pub use generate::{Event, GenerateError, StopReason};
pub use sampling::{grammar_vocab, Constraint, Sampler, SamplerOptions, TokenLogprob};
pub use session::{Counters, KernelTime, Session, SessionOptions};
pub use slots::{
    Admission, BatchKernel, Completion, GenStats, GenerateOptions, Generation, Generator, Request,
    SlotCounters, SlotEvent, Slots, SlotsInfo, SlotsOptions, StepReport, Usage,
};
