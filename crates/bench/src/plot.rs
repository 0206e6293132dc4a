//! `memlab plot`: draw any JSON-lines result file.
//!
//! Rows are grouped into panels by `bench` plus the sub-keys that tell
//! configurations apart (`size_frames`, `order`, `phase`, `workload`,
//! `distribution`, ... or `--by`). Within a panel there is one line per
//! `system`. x is, per row, the first of `t_ms` (time series),
//! `utilization` (`fill`), `pair_index` (`frag`) and `threads` that the
//! row has (or `--x`); y the first of `ops_per_sec`, `bloat` and `ratio`
//! (or `--y`). When the rows carry `<y>_min` and `<y>_max` they are drawn
//! as error bars. Thread counts are spaced evenly (1, 2, 4, 8 ... read like
//! a log axis); `pair_index` is categorical too, labelled with the row's
//! `pair`, and drawn as grouped bars (one per system) since its categories
//! are not a sequence; other x fields are linear. Panels whose y is a
//! ratio or a bloat get a grey reference line at 1. Groups without the y
//! field are skipped with a note on stderr. One legend at the top (wrapped
//! over as many lines as it needs) serves all panels: a system has the
//! same colour everywhere.
//!
//! The output format follows the extension: `.png` (bitmap) or `.svg`.
//! Text needs a sans-serif font through fontconfig; if none loads, the
//! command fails with a message saying so, before drawing anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontFamily, FontStyle};
use serde_json::{Map, Value};

use crate::error::{BenchError, Context, Result};

/// Fields that split one bench into several panels, when present.
pub const DEFAULT_SUBKEYS: [&str; 11] = [
    "size_frames",
    "order",
    "queue_frames",
    "phase",
    "workload",
    "distribution",
    "mix",
    "key_bytes",
    "value_bytes",
    "protocol",
    "region_pages",
];

/// Default y fields, in order of preference, when `--y` is not given.
pub const DEFAULT_Y: [&str; 4] = ["ops_per_sec", "bloat", "ratio", "fault_ns"];
/// Default x fields, in order of preference, when `--x` is not given.
pub const DEFAULT_X: [&str; 5] = [
    "t_ms",
    "utilization",
    "pair_index",
    "map_fraction",
    "threads",
];

const PANEL_W: u32 = 640;
const PANEL_H: u32 = 440;
/// Height of the title line; each legend line adds `LEGEND_LINE_H`.
const TITLE_H: u32 = 40;
const LEGEND_LINE_H: u32 = 28;
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(128, 128, 0),
];

/// What `memlab plot` was asked to do.
pub struct PlotOpts {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub x: Option<String>,
    pub y: Option<String>,
    pub by: Option<Vec<String>>,
    pub bench: Option<String>,
    pub title: Option<String>,
}

/// One point: x, y (mean of the rows at that x), optional (min, max).
#[derive(Clone, Copy)]
struct Point {
    x: f64,
    y: f64,
    range: Option<(f64, f64)>,
    /// A row at this point says `completed: false` (drawn with a `*`).
    incomplete: bool,
}

struct Series {
    system: String,
    points: Vec<Point>,
}

struct Panel {
    title: String,
    xfield: String,
    yfield: String,
    /// Thread counts and pair indices: plotted at their index among `xs`,
    /// labelled with `labels`.
    categorical: bool,
    /// Grouped bars instead of lines (categories that are not a sequence).
    bars: bool,
    xs: Vec<f64>,
    labels: Vec<String>,
    series: Vec<Series>,
}

/// Rows of one panel before averaging: title, axes, per-system accumulators.
struct Group {
    title: String,
    xfield: String,
    yfield: String,
    /// x (as bits) -> label, where the rows name their x (`pair`).
    labels: BTreeMap<u64, String>,
    systems: Vec<(String, Acc)>,
}

/// Accumulates rows of one (panel, system) before averaging.
#[derive(Default)]
struct Acc {
    // x (as bits, for exact grouping) -> (sum y, n, min, max)
    at: BTreeMap<u64, (f64, f64, f64, f64)>,
    /// x (as bits) of rows with `completed: false`.
    incomplete: Vec<u64>,
}

fn num(row: &Map<String, Value>, key: &str) -> Option<f64> {
    row.get(key)?.as_f64().filter(|v| v.is_finite())
}

fn label(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn load(paths: &[PathBuf]) -> Result<Vec<Map<String, Value>>> {
    let mut rows = Vec::new();
    for p in paths {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(m)) => rows.push(m),
                Ok(_) => return Err(format!("{}:{}: not a JSON object", p.display(), i + 1).into()),
                Err(e) => return Err(e).with_context(|| format!("{}:{}", p.display(), i + 1)),
            }
        }
    }
    Ok(rows)
}

/// Field that labels a categorical x, if any.
fn label_field(xfield: &str) -> Option<&'static str> {
    (xfield == "pair_index").then_some("pair")
}

/// Group rows into panels. Returns the panels and notes about what was skipped.
fn panels(rows: &[Map<String, Value>], o: &PlotOpts) -> (Vec<Panel>, Vec<String>) {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let subkeys: Vec<String> = match &o.by {
        Some(v) => v.clone(),
        None => DEFAULT_SUBKEYS.iter().map(|s| s.to_string()).collect(),
    };
    let mut has_range: BTreeMap<String, bool> = BTreeMap::new();
    for row in rows {
        let bench = row.get("bench").map(label).unwrap_or_else(|| "?".into());
        if let Some(f) = &o.bench {
            if !bench.contains(f.as_str()) {
                continue;
            }
        }
        let xfield = o.x.clone().unwrap_or_else(|| {
            DEFAULT_X
                .iter()
                .find(|k| row.contains_key(**k))
                .unwrap_or(&"threads")
                .to_string()
        });
        let yfield = o.y.clone().unwrap_or_else(|| {
            DEFAULT_Y
                .iter()
                .find(|k| num(row, k).is_some())
                .unwrap_or(&DEFAULT_Y[0])
                .to_string()
        });
        let (Some(x), Some(y)) = (num(row, &xfield), num(row, &yfield)) else {
            *skipped.entry(bench).or_default() += 1;
            continue;
        };
        // A time series (or any x other than threads) is one panel per thread count.
        let threads_key = (xfield != "threads").then(|| "threads".to_string());
        let subs: Vec<String> = subkeys
            .iter()
            .chain(threads_key.iter())
            .filter(|k| **k != xfield)
            .filter_map(|k| {
                row.get(k)
                    .filter(|v| !v.is_null())
                    .map(|v| format!("{k}={}", label(v)))
            })
            .collect();
        let title = if subs.is_empty() {
            bench.clone()
        } else {
            format!("{bench}, {}", subs.join(", "))
        };
        let key = format!("{title}\u{0}{xfield}\u{0}{yfield}");
        let system = row.get("system").map(label).unwrap_or_else(|| "?".into());
        let (ymin_key, ymax_key) = (format!("{yfield}_min"), format!("{yfield}_max"));
        if row.contains_key(&ymin_key) && row.contains_key(&ymax_key) {
            has_range.insert(key.clone(), true);
        }
        let g = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            Group {
                title,
                xfield: xfield.clone(),
                yfield: yfield.clone(),
                labels: BTreeMap::new(),
                systems: Vec::new(),
            }
        });
        if let Some(lf) = label_field(&xfield) {
            if let Some(l) = row.get(lf) {
                g.labels.entry(x.to_bits()).or_insert_with(|| label(l));
            }
        }
        let i = match g.systems.iter().position(|(s, _)| *s == system) {
            Some(i) => i,
            None => {
                g.systems.push((system, Acc::default()));
                g.systems.len() - 1
            }
        };
        let lo = num(row, &ymin_key).unwrap_or(y).min(y);
        let hi = num(row, &ymax_key).unwrap_or(y).max(y);
        let e = g.systems[i].1.at.entry(x.to_bits()).or_insert((
            0.0,
            0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ));
        e.0 += y;
        e.1 += 1.0;
        e.2 = e.2.min(lo);
        e.3 = e.3.max(hi);
        if row.get("completed").and_then(Value::as_bool) == Some(false) {
            g.systems[i].1.incomplete.push(x.to_bits());
        }
    }
    let mut out = Vec::new();
    for key in order {
        let ranged = has_range.get(&key).copied().unwrap_or(false);
        let Group {
            title,
            xfield,
            yfield,
            labels,
            systems,
        } = groups.remove(&key).expect("key recorded");
        let mut xs: Vec<f64> = systems
            .iter()
            .flat_map(|(_, acc)| acc.at.keys().map(|b| f64::from_bits(*b)))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        // Categories that are not a sequence, or a lone thread count: bars.
        let bars = label_field(&xfield).is_some() || (xfield == "threads" && xs.len() == 1);
        let categorical = xfield == "threads" || bars;
        let labels = xs
            .iter()
            .map(|x| {
                labels
                    .get(&x.to_bits())
                    .cloned()
                    .unwrap_or_else(|| format!("{x}"))
            })
            .collect();
        let series = systems
            .into_iter()
            .map(|(system, acc)| {
                let mut points: Vec<Point> = acc
                    .at
                    .iter()
                    .map(|(b, &(sum, n, lo, hi))| Point {
                        x: f64::from_bits(*b),
                        y: sum / n,
                        range: ranged.then_some((lo, hi)),
                        incomplete: acc.incomplete.contains(b),
                    })
                    .collect();
                points.sort_by(|a, b| a.x.total_cmp(&b.x));
                Series { system, points }
            })
            .collect();
        out.push(Panel {
            title,
            xfield,
            yfield,
            categorical,
            bars,
            xs,
            labels,
            series,
        });
    }
    let what = o.y.clone().unwrap_or_else(|| DEFAULT_Y.join(" or "));
    let notes = skipped
        .into_iter()
        .map(|(bench, n)| format!("skipped {n} row(s) of {bench}: no numeric {what} (try --y)"))
        .collect();
    (out, notes)
}

/// Draw `o.inputs` into `o.output`.
pub fn plot(o: &PlotOpts) -> Result<()> {
    let ext = o
        .output
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if ext != "png" && ext != "svg" {
        return Err(format!(
            "unsupported output format {ext:?} for {}: use .png or .svg",
            o.output.display()
        )
        .into());
    }
    let rows = load(&o.inputs)?;
    let (panels, notes) = panels(&rows, o);
    for n in &notes {
        eprintln!("memlab plot: {n}");
    }
    if panels.is_empty() {
        return Err(format!(
            "nothing to plot: no row has a numeric {} and x field ({} rows read)",
            o.y.clone().unwrap_or_else(|| DEFAULT_Y.join(" or ")),
            rows.len()
        )
        .into());
    }
    check_font()?;
    let cols = match panels.len() {
        1 => 1,
        2..=4 => 2,
        _ => 3,
    };
    let nrows = panels.len().div_ceil(cols);
    // A lone panel of grouped bars needs the room.
    let wide = panels.len() == 1 && panels[0].bars && panels[0].xs.len() > 3;
    let width = if wide {
        2 * PANEL_W
    } else {
        cols as u32 * PANEL_W
    };
    let mut systems: Vec<String> = Vec::new();
    for p in &panels {
        for s in &p.series {
            if !systems.contains(&s.system) {
                systems.push(s.system.clone());
            }
        }
    }
    let legend = legend_layout(&systems, width);
    let legend_lines = legend.iter().map(|l| l.1).max().map_or(1, |m| m + 1);
    let header_h = TITLE_H + legend_lines as u32 * LEGEND_LINE_H;
    let size = (width, header_h + nrows as u32 * PANEL_H);
    let title = o.title.clone().unwrap_or_else(|| {
        let names: Vec<String> = o
            .inputs
            .iter()
            .map(|p| {
                p.file_name()
                    .map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into())
            })
            .collect();
        match &o.y {
            Some(y) => format!("memlab: {}  (y = {y})", names.join(", ")),
            None => format!("memlab: {}", names.join(", ")),
        }
    });
    let fig = Figure {
        title,
        panels: &panels,
        systems: &systems,
        legend: &legend,
        header_h,
        cols,
        nrows,
    };
    let path: &Path = &o.output;
    // plotters may panic on odd input deep inside; turn that into an error too.
    let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match ext.as_str() {
        "png" => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            render(&root, &fig)?;
            root.present()
                .with_context(|| format!("cannot write {}", path.display()))
        }
        "svg" => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            render(&root, &fig)?;
            root.present()
                .with_context(|| format!("cannot write {}", path.display()))
        }
        other => Err(format!(
            "unsupported output format {other:?} for {}: use .png or .svg",
            path.display()
        )
        .into()),
    }));
    match drawn {
        Ok(r) => r,
        Err(p) => Err(format!("plotting failed: {}", crate::util::panic_message(&*p)).into()),
    }
}

/// Fail early and clearly when no font can be loaded.
fn check_font() -> Result<()> {
    FontDesc::new(FontFamily::SansSerif, 14.0, FontStyle::Normal)
        .box_size("memlab 0123456789")
        .map(|_| ())
        .map_err(|e| {
            BenchError::Run(format!(
                "cannot load a sans-serif font for the plot text ({e:?}); \
                 install one that fontconfig finds (e.g. the Debian package fonts-dejavu-core)"
            ))
        })
}

struct Figure<'a> {
    title: String,
    panels: &'a [Panel],
    systems: &'a [String],
    /// Per system: x offset and line of its legend entry.
    legend: &'a [(i32, usize)],
    header_h: u32,
    cols: usize,
    nrows: usize,
}

/// Width of a legend label in pixels (an estimate if the font cannot tell).
fn legend_text_w(s: &str) -> i32 {
    ("sans-serif", 17)
        .into_font()
        .box_size(s)
        .map(|(w, _)| w as i32)
        .unwrap_or(9 * s.len() as i32)
}

/// Place legend entries left to right, wrapping at `width`.
fn legend_layout(systems: &[String], width: u32) -> Vec<(i32, usize)> {
    let mut out = Vec::new();
    let (mut x, mut line) = (20i32, 0usize);
    for s in systems {
        let w = 36 + legend_text_w(s) + 32;
        if x > 20 && x + w > width as i32 - 10 {
            x = 20;
            line += 1;
        }
        out.push((x, line));
        x += w;
    }
    out
}

fn color_of(systems: &[String], s: &str) -> RGBColor {
    let i = systems.iter().position(|x| x == s).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("drawing failed: {e}");
    root.fill(&WHITE).map_err(err)?;
    let (header, body) = root.split_vertically(fig.header_h);
    // Title and the one legend.
    let title_style = ("sans-serif", 22)
        .into_font()
        .style(FontStyle::Bold)
        .color(&BLACK);
    header
        .draw_text(&fig.title, &title_style, (16, 10))
        .map_err(err)?;
    let legend_font = ("sans-serif", 17).into_font().color(&BLACK);
    for (s, &(x, line)) in fig.systems.iter().zip(fig.legend) {
        let y = TITLE_H as i32 + 8 + (line as u32 * LEGEND_LINE_H) as i32;
        let c = color_of(fig.systems, s);
        header
            .draw(&PathElement::new(
                vec![(x, y), (x + 28, y)],
                c.stroke_width(3),
            ))
            .map_err(err)?;
        header
            .draw(&Circle::new((x + 14, y), 4, c.filled()))
            .map_err(err)?;
        header
            .draw_text(s, &legend_font, (x + 36, y - 9))
            .map_err(err)?;
    }
    let areas = body.split_evenly((fig.nrows, fig.cols));
    for (panel, area) in fig.panels.iter().zip(areas.iter()) {
        draw_panel(area, panel, fig).map_err(err)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    fig: &Figure,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let xpos = |x: f64| -> f64 {
        if p.categorical {
            p.xs.iter().position(|&v| v == x).unwrap_or(0) as f64
        } else {
            x
        }
    };
    let (x0, x1) = if p.bars {
        (-0.6, p.xs.len() as f64 - 0.4)
    } else if p.categorical {
        (-0.4, p.xs.len() as f64 - 0.6)
    } else {
        let (lo, hi) = (p.xs[0], p.xs[p.xs.len() - 1]);
        let lo = if lo >= 0.0 { 0.0 } else { lo };
        if hi > lo {
            (lo, hi + (hi - lo) * 0.02)
        } else {
            (lo - 1.0, hi + 1.0)
        }
    };
    // The y range covers every point and error bar, and 0.
    let (ymin, ymax) =
        p.series
            .iter()
            .flat_map(|s| &s.points)
            .fold((0.0f64, 0.0f64), |(lo, hi), q| {
                let (a, b) = q.range.unwrap_or((q.y, q.y));
                (lo.min(a.min(q.y)), hi.max(b.max(q.y)))
            });
    let unit_line = matches!(p.yfield.as_str(), "ratio" | "bloat") || p.yfield.ends_with("ratio");
    let ymax = if unit_line { ymax.max(1.0) } else { ymax };
    let (y0, y1) = if ymax > ymin {
        (ymin * 1.08, ymax * 1.08)
    } else {
        (0.0, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 19))
        .margin(14)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    let labels = p.labels.clone();
    let categorical = p.categorical;
    let xfmt = move |v: &f64| -> String {
        if categorical {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        } else {
            axis_num(*v)
        }
    };
    let yfmt = |v: &f64| axis_num(*v);
    let xdesc = match p.xfield.as_str() {
        "t_ms" => "time (ms)".to_string(),
        "utilization" => "capacity utilization (%)".to_string(),
        "pair_index" => "size pair (bytes, first -> second); * = target not reached".to_string(),
        other => other.to_string(),
    };
    let ydesc = match p.yfield.as_str() {
        "ops_per_sec" => "ops/s (median; bars: min-max)".to_string(),
        "bloat" => "bloat = RSS / live data (median; min-max)".to_string(),
        "ratio" => "ratio (median; bars: min-max)".to_string(),
        other => other.to_string(),
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(xdesc)
        .y_desc(ydesc)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(238, 238, 238))
        .max_light_lines(2);
    if p.categorical {
        mesh.x_labels(p.xs.len().max(2)).disable_x_mesh();
    }
    mesh.draw()?;
    if unit_line {
        chart.draw_series(LineSeries::new(
            vec![(x0, 1.0), (x1, 1.0)],
            RGBColor(150, 150, 150).stroke_width(1),
        ))?;
    }
    if p.bars {
        // Grouped bars: system j of n at category i sits in [i-0.4, i+0.4].
        let n = p.series.len().max(1) as f64;
        let w = 0.8 / n;
        for (j, s) in p.series.iter().enumerate() {
            let c = color_of(fig.systems, &s.system);
            let off = -0.4 + w * (j as f64 + 0.5);
            chart.draw_series(s.points.iter().map(|q| {
                let x = xpos(q.x) + off;
                Rectangle::new([(x - w * 0.45, 0.0), (x + w * 0.45, q.y)], c.filled())
            }))?;
            let bars: Vec<_> = s
                .points
                .iter()
                .filter_map(|q| {
                    let (lo, hi) = q.range?;
                    (hi > lo).then(|| {
                        ErrorBar::new_vertical(
                            xpos(q.x) + off,
                            lo,
                            q.y,
                            hi,
                            BLACK.stroke_width(1),
                            4,
                        )
                    })
                })
                .collect();
            chart.draw_series(bars)?;
            let star = ("sans-serif", 16).into_font().color(&BLACK);
            chart.draw_series(s.points.iter().filter(|q| q.incomplete).map(|q| {
                let top = q.range.map_or(q.y, |r| r.1.max(q.y));
                Text::new(
                    "*",
                    (xpos(q.x) + off - w * 0.2, top + (y1 - y0) * 0.05),
                    star.clone(),
                )
            }))?;
        }
        return Ok(());
    }
    let many = p.series.iter().map(|s| s.points.len()).max().unwrap_or(0) > 30;
    for s in &p.series {
        let c = color_of(fig.systems, &s.system);
        let pts: Vec<(f64, f64)> = s.points.iter().map(|q| (xpos(q.x), q.y)).collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        if !many {
            chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled())))?;
        }
        let bars: Vec<_> = s
            .points
            .iter()
            .filter_map(|q| {
                let (lo, hi) = q.range?;
                (hi > lo)
                    .then(|| ErrorBar::new_vertical(xpos(q.x), lo, q.y, hi, c.stroke_width(1), 8))
            })
            .collect();
        chart.draw_series(bars)?;
    }
    Ok(())
}

/// Axis tick label: `140000000` → `140M`, `2500` → `2.5k`, `0.25` → `0.25`.
fn axis_num(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PlotOpts {
        PlotOpts {
            inputs: vec![],
            output: "x.png".into(),
            x: None,
            y: None,
            by: None,
            bench: None,
            title: None,
        }
    }

    #[test]
    fn groups_by_bench_and_subkey() {
        let rows: Vec<Map<String, Value>> = [
            r#"{"bench":"b","system":"a","threads":1,"size_frames":1,"ops_per_sec":10}"#,
            r#"{"bench":"b","system":"a","threads":2,"size_frames":1,"ops_per_sec":20}"#,
            r#"{"bench":"b","system":"c","threads":1,"size_frames":8,"ops_per_sec":5}"#,
            r#"{"bench":"t","system":"a","threads":2,"t_ms":100,"ops_per_sec":5}"#,
            r#"{"bench":"x","system":"a","threads":2,"ratio":1.5}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let (p, notes) = panels(&rows, &opts());
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].title, "b, size_frames=1");
        assert_eq!(p[0].series[0].points.len(), 2);
        assert_eq!(p[2].xfield, "t_ms");
        // A row without ops_per_sec falls back to ratio.
        assert_eq!(p[3].yfield, "ratio");
        assert!(notes.is_empty());
        let mut o = opts();
        o.y = Some("ops_per_sec".into());
        let (p, notes) = panels(&rows, &o);
        assert_eq!(p.len(), 3);
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn kv_benches_pick_their_axes() {
        let rows: Vec<Map<String, Value>> = [
            r#"{"bench":"frag","system":"a","threads":1,"pair":"64->128","pair_index":0,"bloat":1.5,"bloat_min":1.4,"bloat_max":1.6}"#,
            r#"{"bench":"frag","system":"b","threads":1,"pair":"1K->4K","pair_index":1,"bloat":1.1}"#,
            r#"{"bench":"fill","system":"a","threads":2,"utilization":10,"ops_per_sec":5}"#,
            r#"{"bench":"ycsb","system":"a","threads":2,"workload":"A","distribution":"zipfian","ops_per_sec":5}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let (p, _) = panels(&rows, &opts());
        assert_eq!(p.len(), 3);
        assert!(p[0].bars && p[0].categorical);
        assert_eq!(p[0].yfield, "bloat");
        assert_eq!(p[0].labels, vec!["64->128", "1K->4K"]);
        assert_eq!(p[1].xfield, "utilization");
        assert_eq!(p[1].title, "fill, threads=2");
        assert_eq!(p[2].title, "ycsb, workload=A, distribution=zipfian");
        assert_eq!(p[2].xfield, "threads");
    }

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(axis_num(140e6), "140M");
        assert_eq!(axis_num(2500.0), "2500");
        assert_eq!(axis_num(25000.0), "25k");
        assert_eq!(axis_num(0.25), "0.25");
        assert_eq!(axis_num(0.0), "0");
    }
}
