//! `--plot FILE.svg`: the A/B drawn with plotters' SVG backend: decode tok/s, prefill
//! tok/s and time to first token per arm (median bar, min-max whisker), the memory split per arm (medians of RssAnon, RssFile,
//! Pss and device memory), and with `--procs`, the sum of Pss over N processes against N.

use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::report::{ProcsSummary, Summary};
use super::Bench;

const ARM_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];
const MEMORY: [(&str, &str, RGBColor); 4] = [
    ("rss_anon_kb", "RssAnon", RGBColor(214, 39, 40)),
    ("rss_file_kb", "RssFile", RGBColor(31, 119, 180)),
    ("pss_kb", "Pss", RGBColor(148, 103, 189)),
    ("device_bytes", "device memory", RGBColor(127, 127, 127)),
];

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Writes the SVG.
pub fn draw(b: &Bench, s: &Summary, path: &Path) -> Result<()> {
    draw_inner(b, s, path).map_err(|e| anyhow!("drawing {}: {e}", path.display()))
}

fn draw_inner(b: &Bench, s: &Summary, path: &Path) -> DrawResult {
    // decode, prefill, time to first token, memory (and Pss against N)
    let panels = if b.grouped { 5 } else { 4 };
    let root = SVGBackend::new(path, (480 * panels as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&title(b), ("sans-serif", 18))?;
    let areas = root.split_evenly((1, panels));
    let Some(first) = s.by_procs.first() else {
        root.present()?;
        return Ok(());
    };
    let arms = ArmAxis {
        names: b.arms.iter().map(|a| a.name.clone()).collect(),
    };
    let speed = speed_panels(b, first.n);
    for (area, (key, caption, unit)) in areas.iter().zip(&speed) {
        let spreads: Vec<_> = first.arms.iter().map(|a| a.get(key).copied()).collect();
        spread_panel(area, &spreads, caption, unit, &arms)?;
    }
    memory_panel(&areas[speed.len()], first, &arms)?;
    if b.grouped {
        pss_panel(&areas[speed.len() + 1], b, s, &arms)?;
    }
    root.present()?;
    Ok(())
}

/// The figure's title: the model, its size, the repetitions.
fn title(b: &Bench) -> String {
    format!(
        "vkdecode bench: {} ({:.0} MB), {} repetition(s) per arm{}",
        b.model
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        b.file_size as f64 / 1e6,
        b.args.repetitions,
        if b.args.cold { ", cold" } else { "" }
    )
}

/// The arms along x: arm i at x = i, labelled by its name.
struct ArmAxis {
    names: Vec<String>,
}

impl ArmAxis {
    fn len(&self) -> usize {
        self.names.len()
    }

    fn range(&self) -> Range<f64> {
        -0.5..(self.len() as f64 - 0.5)
    }

    /// The arm's name at a whole x, nothing between arms.
    fn label(&self, x: &f64) -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < self.len() {
            self.names[i as usize].clone()
        } else {
            String::new()
        }
    }
}

/// Decode tok/s, prefill tok/s and time to first token: (summary key, caption, unit).
fn speed_panels(b: &Bench, n: usize) -> [(&'static str, String, &'static str); 3] {
    let decode_caption = if b.grouped {
        format!("decode tok/s per process (N = {n})")
    } else {
        "decode tok/s (median, min-max)".to_string()
    };
    let prompt = b.args.prompt_tokens;
    [
        ("decode_tok_s", decode_caption, "tok/s"),
        (
            "prefill_tok_s",
            format!("prefill tok/s, {prompt}-token prompt (median, min-max)"),
            "tok/s",
        ),
        (
            "ttft_ms",
            format!("time to first token ms, {prompt} tokens (median, min-max)"),
            "ms",
        ),
    ]
}

/// The memory split per arm: a bar per figure of [`MEMORY`] at its median, in MiB.
fn memory_panel(area: &Area<'_>, first: &ProcsSummary, arms: &ArmAxis) -> DrawResult {
    let mib = |key: &str, v: f64| {
        if key == "device_bytes" {
            v / 1048576.0
        } else {
            v / 1024.0
        }
    };
    let medians: Vec<Vec<Option<f64>>> = first
        .arms
        .iter()
        .map(|a| {
            MEMORY
                .iter()
                .map(|(k, _, _)| a.get(k).map(|s| mib(k, s.median)))
                .collect()
        })
        .collect();
    let ymax = medians
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.45;
    let mut chart = arm_chart(area, "memory per process (median, MiB)", "MiB", ymax, arms)?;
    let width = 0.8 / MEMORY.len() as f64;
    for (m, (_, label, color)) in MEMORY.iter().enumerate() {
        let bars: Vec<Rectangle<(f64, f64)>> = medians
            .iter()
            .enumerate()
            .filter_map(|(i, row)| {
                let v = row[m]?;
                let x0 = i as f64 - 0.4 + m as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, v)],
                    color.filled(),
                ))
            })
            .collect();
        let color = *color;
        chart
            .draw_series(bars)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The sum of Pss over N processes against N, a line per arm, beside N x the model size.
fn pss_panel(area: &Area<'_>, b: &Bench, s: &Summary, arms: &ArmAxis) -> DrawResult {
    let series: Vec<(String, Vec<(f64, f64)>)> = arms
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let pts = s
                .by_procs
                .iter()
                .filter_map(|p| Some((p.n as f64, p.arms[i].get("sum_pss_kb")?.median / 1024.0)))
                .collect();
            (name.clone(), pts)
        })
        .collect();
    let nmax = b.procs.iter().copied().max().unwrap_or(1) as f64;
    let model_mib = b.file_size as f64 / 1048576.0;
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(model_mib * nmax, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption("sum of Pss over N processes (MiB)", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..nmax + 0.5, 0f64..ymax)?;
    let n_label = |x: &f64| {
        if (x - x.round()).abs() < 1e-6 && *x >= 1.0 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(2 * nmax as usize + 2)
        .x_label_formatter(&n_label)
        .x_desc("N processes")
        .y_desc("MiB")
        .draw()?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        let color = ARM_COLORS[i % ARM_COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 0.0), (nmax, model_mib * nmax)],
            BLACK.mix(0.4).stroke_width(1),
        ))?
        .label("N x model size")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK.mix(0.4)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A panel with the arms along x and `0..ymax` in `unit` up.
fn arm_chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    unit: &str,
    ymax: f64,
    arms: &ArmAxis,
) -> std::result::Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(arms.range(), 0f64..ymax)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(arms.len().max(2) * 2 + 1)
        .x_label_formatter(&|x| arms.label(x))
        .y_desc(unit)
        .draw()?;
    Ok(chart)
}

/// One bar per arm at its median with a min-max whisker, the median written above.
fn spread_panel(
    area: &Area<'_>,
    spreads: &[Option<super::stats::Spread>],
    caption: &str,
    unit: &str,
    arms: &ArmAxis,
) -> DrawResult {
    let ymax = spreads
        .iter()
        .flatten()
        .map(|s| s.max)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let mut chart = arm_chart(area, caption, unit, ymax, arms)?;
    for (i, sp) in spreads.iter().enumerate() {
        let Some(sp) = sp else { continue };
        let x = i as f64;
        let color = ARM_COLORS[i % ARM_COLORS.len()];
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x - 0.3, 0.0), (x + 0.3, sp.median)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, sp.min), (x, sp.max)],
            BLACK.stroke_width(2),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{:.2}", sp.median),
            (x - 0.27, sp.median + ymax * 0.07),
            ("sans-serif", 13),
        )))?;
    }
    Ok(())
}
