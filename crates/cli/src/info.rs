//! `vkdecode info`: every Vulkan device with its capabilities record (read from the
//! driver), which one runs by default, what `--weights auto` picks on each and why, and
//! the kernel profile `--kernels auto` runs there and why, with its matmul shapes
//! (`engine::kernels::Shapes::for_profile`).

use std::fmt::Write as _;
use std::io::Write as _;

use anyhow::Context as _;
use engine::kernels::{KernelProfile, ProfileChoice, Shapes};
use engine::{auto_decision, WeightsMode};
use serde_json::json;

/// Arguments of `info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Show only device N (index as listed; the same N as `--device N`).
    #[arg(long)]
    device: Option<usize>,
    /// Print one JSON array instead of text.
    #[arg(long)]
    json: bool,
    // The kernel set to describe (the `--kernels` of run, chat, serve and bench).
    #[command(flatten)]
    kernels: crate::kernels_arg::KernelsArg,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let all = vk::enumerate_devices().context("listing Vulkan devices")?;
    if all.is_empty() {
        anyhow::bail!("no Vulkan device found (on Debian/Ubuntu, `apt install mesa-vulkan-drivers` gives lavapipe)");
    }
    if let Some(d) = args.device {
        anyhow::ensure!(
            d < all.len(),
            "--device {d}: only {} device(s) found",
            all.len()
        );
    }
    let chosen = vk::default_device(&all);
    let shown: Vec<&vk::Capabilities> = all
        .iter()
        .filter(|c| args.device.is_none_or(|d| d == c.index))
        .collect();
    let mut out = String::new();
    if args.json {
        let arr: Vec<serde_json::Value> = shown
            .iter()
            .map(|c| to_json(c, chosen == Some(c.index), args.kernels.profile))
            .collect();
        out = serde_json::to_string_pretty(&arr)? + "\n";
        return emit(&out);
    }
    for c in shown {
        write!(out, "{c}")?;
        let auto = auto_decision(c);
        let arrow = match auto.mode {
            WeightsMode::Import => "import",
            _ => "copy",
        };
        writeln!(
            out,
            "  weights                      auto → {arrow}: {}",
            auto.reason
        )?;
        let choice = Shapes::for_profile(c, args.kernels.profile);
        writeln!(
            out,
            "  8-lane workgroup = subgroup  {}",
            match c.one_subgroup_of(8) {
                Some(g) => g.as_str(),
                None => "no",
            }
        )?;
        writeln!(
            out,
            "  matmul shapes                {}",
            describe(&choice.shapes, c)
        )?;
        if chosen == Some(c.index) {
            writeln!(
                out,
                "  default                      yes (integrated, then discrete, then CPU; --device N overrides)"
            )?;
        }
        writeln!(out, "kernels: {} ({})", choice.profile.as_str(), choice.why)?;
        if let Some(defect) = c.known_defect() {
            writeln!(out, "warning: {defect}")?;
        }
        writeln!(out)?;
    }
    emit(&out)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// One line: the entry's name and its decode and prefill shapes.
fn describe(s: &Shapes, c: &vk::Capabilities) -> String {
    let split = match (s.split_lanes, s.split_guarantee(c)) {
        (Some(l), Some(g)) => format!("column split over {l} lanes (one subgroup: {})", g.as_str()),
        _ => "lanes own rows".to_string(),
    };
    let prefill = match s.gemm {
        Some(g) => format!("GEMM {} lanes x {} pairs x {} tokens", g.wg, g.pairs, g.tb),
        None => format!(
            "{} lanes x {} pairs x {} tokens",
            s.prefill.wg, s.prefill.pairs, s.prefill.tb
        ),
    };
    format!(
        "{}: decode {} lanes x {} row pairs, prefill {prefill}, {split}",
        s.name, s.decode.wg, s.decode.pairs,
    )
}

fn to_json(c: &vk::Capabilities, default: bool, profile: KernelProfile) -> serde_json::Value {
    let auto = auto_decision(c);
    let ProfileChoice {
        profile,
        shapes,
        why,
    } = Shapes::for_profile(c, profile);
    let shape =
        |m: &engine::kernels::MatmulShape| json!({"wg": m.wg, "pairs": m.pairs, "tb": m.tb});
    let mut v = json!({
        "index": c.index,
        "name": c.name,
        "device_type": c.device_type.as_str(),
        "default": default,
        "vendor_id": c.vendor_id,
        "device_id": c.device_id,
        "api_version": format!("{}.{}.{}", c.api_version.0, c.api_version.1, c.api_version.2),
        "driver_name": c.driver_name,
        "driver_info": c.driver_info,
        "external_memory_host": c.external_memory_host,
        "min_imported_host_pointer_alignment": c.min_imported_host_pointer_alignment,
        "max_memory_allocation_size": c.max_memory_allocation_size,
        "max_buffer_size": c.max_buffer_size,
        "max_storage_buffer_range": c.max_storage_buffer_range,
        "min_storage_buffer_offset_alignment": c.min_storage_buffer_offset_alignment,
        "max_push_constants_size": c.max_push_constants_size,
        "max_compute_work_group_count": c.max_compute_work_group_count,
        "max_compute_work_group_size": c.max_compute_work_group_size,
        "max_compute_work_group_invocations": c.max_compute_work_group_invocations,
        "max_compute_shared_memory_size": c.max_compute_shared_memory_size,
        "storage_buffer_8bit": c.storage_buffer_8bit,
        "storage_buffer_16bit": c.storage_buffer_16bit,
        "shader_int8": c.shader_int8,
        "shader_int16": c.shader_int16,
        "shader_int64": c.shader_int64,
        "shader_float16": c.shader_float16,
        "integer_dot_product": c.integer_dot_product,
        "integer_dot_product_accelerated": c.integer_dot_product_accelerated,
        "subgroup_size": c.subgroup_size,
        "subgroup_operations": c.subgroup_operations,
        "subgroup_in_compute": c.subgroup_in_compute,
        "timestamp_valid_bits": c.timestamp_valid_bits,
        "timestamp_period_ns": c.timestamp_period_ns,
        "memory_heaps": c.memory_heaps.iter().map(|h| json!({"size": h.size, "device_local": h.device_local})).collect::<Vec<_>>(),
        "memory_types": c.memory_types.iter().map(|t| json!({"heap": t.heap_index, "flags": t.flags})).collect::<Vec<_>>(),
        "unified_memory": c.unified_memory,
        "unsuitable": c.unsuitable,
        "auto": { "mode": auto.mode, "reason": auto.reason },
    });
    v["subgroup_size_control"] = json!(c.subgroup_size_control.map(|x| json!({
        "min": x.min,
        "max": x.max,
        "max_compute_workgroup_subgroups": x.max_compute_workgroup_subgroups,
        "required_in_compute": x.required_in_compute,
        "feature": x.feature,
        "full_subgroups": x.full_subgroups,
    })));
    v["one_subgroup_of_8"] = json!(c.one_subgroup_of(8).map(|g| g.as_str()));
    v["kernels"] = json!({"profile": profile.as_str(), "why": why});
    v["known_defect"] = json!(c.known_defect());
    v["shapes"] = json!({
        "name": shapes.name,
        "decode": shape(&shapes.decode),
        "prefill": shape(&shapes.prefill),
        "split_lanes": shapes.split_lanes,
        "split_guarantee": shapes.split_guarantee(c).map(|g| g.as_str()),
    });
    v
}
