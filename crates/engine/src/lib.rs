//! engine: the model graph on Vulkan over resident weights (the `residency` crate),
//! kernels, sampling and generation. This file is a list of modules only.
#![deny(unsafe_code)]

mod error;

pub use error::EngineError;
pub use residency::{
    auto_decision, plan_shards, AutoDecision, MemStats, ResidencyOptions, ResidencyReport,
    ShardPlan, TensorView, ViewPart, Weights, WeightsMode,
};

mod activations;
pub mod generate;
mod graph;
pub mod kernels;
mod model;
mod profile;
pub mod sampling;
mod session;
mod slots;
mod step;
pub mod support;
mod views;
pub use activations::ActivationSizes;
pub use generate::{Event, GenerateError, StopReason};
pub use sampling::{grammar_vocab, Constraint, SamplerOptions, TokenLogprob};
pub use session::{Counters, KernelTime, Session, SessionOptions};
pub use slots::{
    Admission, BatchKernel, Completion, GenStats, GenerateOptions, Generation, Generator, Guard,
    Request, SlotCounters, SlotEvent, Slots, SlotsInfo, SlotsOptions, StepReport, Usage,
};
