//! `vkdecode serve`: an OpenAI-compatible HTTP server (tokio + axum) over one loaded
//! model, with `--parallel` slots and a bounded queue.
//!
//! - [`http`]: the router, the API key, graceful shutdown; [`state`] what the handlers
//!   share (the options and limits, reading a body); [`conn`] the
//!   connections (deadlines, the cap, half-closed clients); [`guard`] what keeps web pages
//!   out (Host, Origin and CORS, JSON bodies);
//!   [`handlers`] the two generation endpoints, `answer` their answers (JSON or
//!   server-sent events), `logprobs`
//!   their log-probabilities in OpenAI's shapes, `constrain` the grammar a request's
//!   `response_format`, `json_schema` or `grammar` asks for, `tools` tool calls,
//!   `native` llama-server's own `/completion`, `status` (`/health`, `/v1/models`,
//!   `/metrics`) and `tokens` (`/tokenize`, `/detokenize`) the small routes, `page` the
//!   chat page at `/` (crates/server/assets/chat.html); [`params`]
//!   the request bodies and their checks;
//!   [`error`] OpenAI's error shape.
//! - [`scheduler`]: the engine thread (slots, queue, chunked prefill between decode
//!   steps, disconnects), written against the [`backend::SlotEngine`] trait, which
//!   `engine::Slots` implements (one mapping of the weights, every decoding slot
//!   advanced in one submit).
//! - [`metrics`]: counters and the Prometheus text.
#![forbid(unsafe_code)]

mod answer;
pub mod backend;
pub mod conn;
mod constrain;
pub mod error;
pub mod guard;
pub mod handlers;
pub mod http;
pub mod job;
mod logprobs;
pub mod metrics;
mod native;
mod page;
pub mod params;
pub mod scheduler;
pub mod state;
mod status;
mod tokens;
mod tools;

pub use crate::backend::{Completion, Request, SlotEngine, SlotEvent, StepReport, Usage};
pub use crate::conn::ConnLimits;
pub use crate::error::ApiError;
pub use crate::guard::Access;
pub use crate::http::{router, serve};
pub use crate::metrics::Metrics;
pub use crate::scheduler::Scheduler;
pub use crate::state::{AppState, ServerOptions};
pub use engine::{Slots, SlotsInfo, SlotsOptions};
