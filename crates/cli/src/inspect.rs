//! `vkdecode inspect`: a GGUF file's hyper-parameters, tokenizer, tensors and totals, as
//! text or (`--json`) one JSON object. Each tensor says whether the GPU path reads it
//! (the engine's own rule, `engine::support::tensor_support`: its type and row length),
//! and the whole file whether a load would refuse it (`check_gpu_readable`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use gguf::{GgmlType, Gguf, GgufFile, Value};
use serde::Serialize;

/// Arguments of `inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file to inspect.
    pub model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list every metadata key with a short rendering of its value.
    #[arg(long)]
    pub metadata: bool,
    /// Also print the shard plan of the import path on the chosen Vulkan device.
    #[arg(long)]
    pub plan: bool,
    /// Device for `--plan` (index as in `vkdecode info`); default: the one `run` picks.
    #[arg(long, requires = "plan")]
    pub device: Option<usize>,
    /// Per-shard cap for `--plan`, as `--import-cap` of the main command (e.g. 256MiB).
    #[arg(long = "import-cap", value_name = "SIZE", value_parser = crate::stats::parse_size, requires = "plan")]
    pub import_cap: Option<u64>,
}

/// Model hyper-parameters (`<arch>.*` keys); absent keys are `None`.
#[derive(Serialize, Debug, Default)]
pub struct HyperParams {
    pub block_count: Option<u64>,
    pub embedding_length: Option<u64>,
    pub feed_forward_length: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    pub rope_freq_base: Option<f32>,
    pub rms_eps: Option<f32>,
    pub context_length: Option<u64>,
    pub vocab_size: Option<u64>,
}

/// What the tokenizer metadata says.
#[derive(Serialize, Debug, Default)]
pub struct TokenizerSummary {
    pub model: Option<String>,
    pub pre: Option<String>,
    pub vocab_size: Option<u64>,
    pub bos_token_id: Option<u64>,
    pub eos_token_id: Option<u64>,
    pub has_chat_template: bool,
}

/// One row of the tensor table.
#[derive(Serialize, Debug)]
pub struct TensorRow {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub shape: Vec<u64>,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    pub bytes: u64,
    /// Whether the GPU kernels read this tensor (type and row length).
    pub gpu: bool,
    /// Why not, when they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_why: Option<String>,
}

/// Tensors of one type, summed.
#[derive(Serialize, Debug, Default)]
pub struct TypeTotal {
    pub count: usize,
    pub elements: u64,
    pub bytes: u64,
}

/// Everything `inspect` reports (the `--json` object).
#[derive(Serialize, Debug)]
pub struct Report {
    pub path: String,
    pub file_size: u64,
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub file_type: Option<u64>,
    pub hyperparameters: HyperParams,
    pub tokenizer: TokenizerSummary,
    pub metadata_count: usize,
    /// Present with `--metadata`: key -> short rendering of the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Vec<(String, String)>>,
    pub tensor_count: usize,
    pub tensors: Vec<TensorRow>,
    /// Keyed by type name.
    pub totals_by_type: BTreeMap<String, TypeTotal>,
    pub tensor_bytes: u64,
    pub parameters: u64,
    /// Whether the GPU path reads every tensor the forward pass needs: `None` when it
    /// does, else why not (the refusal a load would give; also when the architecture is
    /// not known).
    pub gpu_refusal: Option<String>,
    /// The shard plan (`--plan`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanReport>,
}

/// `--plan`: how the weights would be cut into import shards on a device.
#[derive(Serialize, Debug)]
pub struct PlanReport {
    pub device: String,
    pub device_index: usize,
    /// What `--weights auto` picks there, and why.
    pub auto: engine::AutoDecision,
    pub plan: engine::ShardPlan,
}

/// Plans the shards of `file` on device `device` (or the default one).
fn plan_report(
    file: &GgufFile,
    device: Option<usize>,
    import_cap: Option<u64>,
) -> Result<PlanReport> {
    let all = vk::enumerate_devices().context("listing Vulkan devices for --plan")?;
    let index = match device {
        Some(d) => d,
        None => vk::default_device(&all).context("no usable Vulkan device for --plan")?,
    };
    let caps = all
        .get(index)
        .with_context(|| format!("--device {index}: only {} device(s) found", all.len()))?;
    let plan = residency::plan_for(caps, file, import_cap).context("planning shards")?;
    Ok(PlanReport {
        device: caps.name.clone(),
        device_index: index,
        auto: engine::auto_decision(caps),
        plan,
    })
}

fn print_plan(p: &PlanReport, r: &Report) {
    let plan = &p.plan;
    outln!("shard plan on device {} ({})", p.device_index, p.device);
    outln!(
        "  auto                 {:?}: {}",
        p.auto.mode,
        p.auto.reason
    );
    outln!("  alignment            {}", plan.align);
    outln!("  cap                  {}", plan.cap);
    outln!(
        "  shards               {} ({} bytes)",
        plan.shards.len(),
        plan.total_bytes()
    );
    for (i, s) in plan.shards.iter().enumerate() {
        let past = if s.past_mapping {
            "  (past the mapping: imported from anonymous memory)"
        } else {
            ""
        };
        outln!("  shard {i:<4} {:>12} + {:>12}{past}", s.start, s.len);
    }
    for (t, parts) in r.tensors.iter().zip(&plan.placements) {
        if parts.len() > 1 {
            outln!("  {} split into {} row ranges", t.name, parts.len());
        }
    }
}

fn uint(g: &Gguf, key: &str) -> Option<u64> {
    g.get_u64(key).ok()
}

fn float(g: &Gguf, key: &str) -> Option<f32> {
    g.get_f32(key).ok()
}

impl HyperParams {
    /// The `{arch}.*` hyper-parameters, as the file states them.
    fn of(g: &Gguf, arch: &str, n_tokens: Option<u64>) -> HyperParams {
        let key = |k: &str| format!("{arch}.{k}");
        HyperParams {
            block_count: uint(g, &key("block_count")),
            embedding_length: uint(g, &key("embedding_length")),
            feed_forward_length: uint(g, &key("feed_forward_length")),
            head_count: uint(g, &key("attention.head_count")),
            head_count_kv: uint(g, &key("attention.head_count_kv"))
                .or_else(|| uint(g, &key("attention.head_count"))),
            rope_freq_base: float(g, &key("rope.freq_base")),
            rms_eps: float(g, &key("attention.layer_norm_rms_epsilon")),
            context_length: uint(g, &key("context_length")),
            vocab_size: uint(g, &key("vocab_size")).or(n_tokens),
        }
    }
}

impl TokenizerSummary {
    /// The `tokenizer.*` keys, as the file states them.
    fn of(g: &Gguf, n_tokens: Option<u64>) -> TokenizerSummary {
        TokenizerSummary {
            model: g.get_str("tokenizer.ggml.model").ok().map(str::to_owned),
            pre: g.get_str("tokenizer.ggml.pre").ok().map(str::to_owned),
            vocab_size: n_tokens,
            bos_token_id: uint(g, "tokenizer.ggml.bos_token_id"),
            eos_token_id: uint(g, "tokenizer.ggml.eos_token_id"),
            has_chat_template: g.get_str("tokenizer.chat_template").is_ok(),
        }
    }
}

/// A row per tensor (with whether the GPU kernels read it), and the totals per type.
fn tensor_rows(g: &Gguf) -> (Vec<TensorRow>, BTreeMap<String, TypeTotal>) {
    let mut totals: BTreeMap<String, TypeTotal> = BTreeMap::new();
    let tensors = g
        .tensors
        .iter()
        .map(|t| {
            let tot = totals.entry(t.ty.name().to_string()).or_default();
            tot.count += 1;
            tot.elements += t.n_elements();
            tot.bytes += t.n_bytes();
            let gpu = engine::support::tensor_support(t);
            TensorRow {
                name: t.name.clone(),
                ty: t.ty.name().to_string(),
                shape: t.shape.clone(),
                offset: g.tensor_range(t).start,
                bytes: t.n_bytes(),
                gpu: gpu.is_ok(),
                gpu_why: gpu.err(),
            }
        })
        .collect();
    (tensors, totals)
}

/// Builds the report from a parsed file.
pub fn report(path: &str, g: &Gguf, with_metadata: bool) -> Report {
    let arch = g.architecture().ok().map(str::to_owned);
    let n_tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(|v| v.len() as u64);
    let hyperparameters = HyperParams::of(g, arch.as_deref().unwrap_or_default(), n_tokens);
    let tokenizer = TokenizerSummary::of(g, n_tokens);
    let (tensors, totals) = tensor_rows(g);
    Report {
        path: path.to_string(),
        file_size: g.file_size,
        version: g.version,
        alignment: g.alignment,
        data_offset: g.data_offset,
        architecture: arch,
        name: g.get_str("general.name").ok().map(str::to_owned),
        file_type: uint(g, "general.file_type"),
        hyperparameters,
        tokenizer,
        metadata_count: g.metadata.len(),
        metadata: with_metadata.then(|| {
            g.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.summary(60)))
                .collect()
        }),
        tensor_count: g.tensors.len(),
        tensor_bytes: totals.values().map(|t| t.bytes).sum(),
        parameters: totals.values().map(|t| t.elements).sum(),
        tensors,
        totals_by_type: totals,
        gpu_refusal: match arch::Config::from_gguf(g) {
            Ok(cfg) => engine::support::check_gpu_readable(&cfg, g)
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        },
        plan: None,
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

fn print_text(r: &Report) {
    outln!("file          {} ({} bytes)", r.path, r.file_size);
    outln!(
        "format        GGUF v{}, alignment {}, data at offset {}",
        r.version,
        r.alignment,
        r.data_offset
    );
    outln!(
        "model         {} ({}), file_type {}",
        opt(&r.architecture),
        opt(&r.name),
        opt(&r.file_type)
    );
    let h = &r.hyperparameters;
    outln!("hyper-parameters");
    outln!("  block_count          {}", opt(&h.block_count));
    outln!("  embedding_length     {}", opt(&h.embedding_length));
    outln!("  feed_forward_length  {}", opt(&h.feed_forward_length));
    outln!("  head_count           {}", opt(&h.head_count));
    outln!("  head_count_kv        {}", opt(&h.head_count_kv));
    outln!("  rope_freq_base       {}", opt(&h.rope_freq_base));
    outln!("  rms_eps              {}", opt(&h.rms_eps));
    outln!("  context_length       {}", opt(&h.context_length));
    outln!("  vocab_size           {}", opt(&h.vocab_size));
    let t = &r.tokenizer;
    outln!("tokenizer");
    outln!("  model                {}", opt(&t.model));
    outln!("  pre                  {}", opt(&t.pre));
    outln!("  vocab_size           {}", opt(&t.vocab_size));
    outln!("  bos_token_id         {}", opt(&t.bos_token_id));
    outln!("  eos_token_id         {}", opt(&t.eos_token_id));
    outln!(
        "  chat_template        {}",
        if t.has_chat_template { "yes" } else { "no" }
    );
    if let Some(md) = &r.metadata {
        outln!("metadata ({} keys)", r.metadata_count);
        for (k, v) in md {
            outln!("  {k:<40} {v}");
        }
    }
    print_tensors(r);
    match &r.gpu_refusal {
        None => outln!("gpu           reads every tensor the forward pass needs"),
        Some(why) => outln!("gpu           refused: {why}"),
    }
}

/// The tensor table, then the totals per type.
fn print_tensors(r: &Report) {
    outln!("tensors ({})", r.tensor_count);
    let width = r
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "  {:<width$}  {:<6} {:<20} {:>12} {:>12}  gpu",
        "name",
        "type",
        "shape",
        "offset",
        "bytes"
    );
    for t in &r.tensors {
        let shape = t
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" x ");
        let gpu = match &t.gpu_why {
            None => "yes".to_string(),
            Some(why) => format!("no: {why}"),
        };
        outln!(
            "  {:<width$}  {:<6} {:<20} {:>12} {:>12}  {gpu}",
            t.name,
            t.ty,
            shape,
            t.offset,
            t.bytes
        );
    }
    outln!("totals by type");
    for (ty, tot) in &r.totals_by_type {
        let bpw = GgmlType::from_name(ty)
            .map(|g| 8.0 * g.type_size() as f64 / g.block_size() as f64)
            .unwrap_or(0.0);
        outln!(
            "  {:<6} {:>4} tensors {:>12} elements {:>12} bytes ({bpw:.2} bits/weight)",
            ty,
            tot.count,
            tot.elements,
            tot.bytes
        );
    }
    outln!(
        "  all    {:>4} tensors {:>12} elements {:>12} bytes",
        r.tensor_count,
        r.parameters,
        r.tensor_bytes
    );
}

pub fn run(args: Args) -> Result<()> {
    let file = GgufFile::open(&args.model)
        .with_context(|| format!("inspecting {}", args.model.display()))?;
    let mut r = report(
        &args.model.display().to_string(),
        file.gguf(),
        args.metadata,
    );
    if args.plan {
        r.plan = Some(plan_report(&file, args.device, args.import_cap)?);
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_text(&r);
        if let Some(p) = &r.plan {
            print_plan(p, &r);
        }
    }
    Ok(())
}
