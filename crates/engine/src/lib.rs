//! engine: the model graph on Vulkan over resident weights (the `residency` crate),
//! kernels, sampling and generation. This file is a list of modules only.
#![deny(unsafe_code)]

mod error;

pub use error::EngineError;
pub use residency::{
    auto_decision, plan_shards, AutoDecision, MemStats, ResidencyOptions, ResidencyReport,
    ShardPlan, TensorView, ViewPart, Weights, WeightsMode,
};

pub mod activations;
pub mod forward;
pub mod generate;
pub mod graph;
pub mod kernels;
pub mod model;
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
