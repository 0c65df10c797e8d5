//! SVG charts for userbpf, drawn with plotters' SVG backend: the log2 histograms of the tools
//! (`userbpf tool funclatency/iolatency --svg`) and of `userbpf map dump --svg`, the bar
//! charts of `userbpf tool calls --svg`, and the charts `make bench` draws from its tables
//! (bench/src/plot.rs). Every chart of one call goes into one SVG file, stacked top to bottom
//! (one panel per histogram or table), so a tool's histograms stay together.
//!
//! - [`Log2Hist`]: one horizontal bar per log2 slot from the first to the last non-empty one,
//!   as bpftrace prints `hist()`: slot 0 holds 0 and 1, slot k the values in [2^k, 2^(k+1));
//!   the bucket ranges label the vertical axis (with the unit as its title), the count the
//!   horizontal one, each bar carries its count. Empty slots inside the range get no bar (so
//!   the bars in the file are the non-empty slots), but keep their row and label.
//! - [`Bars`]: grouped horizontal bars, one group per category (a table row, a function), one
//!   bar per series (a table column) with its value written at its end and a legend when
//!   there are several series. The value axis turns logarithmic when the values span more
//!   than [`AUTO_LOG_SPAN`] (the kernel's 9 µs uprobe beside userbpf's 10 ns), by drawing
//!   log10 of the values on a linear axis labelled with the values themselves.
//!
//! Text goes out as SVG `<text>` elements sized by plotters' estimate (the crate is built
//! without its font features), so no font file, fontconfig or freetype is involved. Bars are
//! `<rect>` elements filled with [`SERIES_COLORS`] (histograms: the first one), which tests
//! count. The SVG is built in memory and written in one go: a bad path is an error naming the
//! file, and no half-written file is left.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use std::ops::Range;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The fills of the series' bars, in order (histogram bars: the first); tests count the
/// `<rect>` elements of these colours.
pub const SERIES_COLORS: [RGBColor; 10] = [
    RGBColor(0x3B, 0x6E, 0xA8),
    RGBColor(0xE0, 0x7B, 0x39),
    RGBColor(0x4C, 0x9A, 0x5A),
    RGBColor(0xB8, 0x4A, 0x62),
    RGBColor(0x7A, 0x5C, 0xA8),
    RGBColor(0x8C, 0x7A, 0x4A),
    RGBColor(0xD0, 0x6E, 0xB0),
    RGBColor(0x6E, 0x6E, 0x6E),
    RGBColor(0xA8, 0xA0, 0x2E),
    RGBColor(0x2E, 0xA8, 0xB0),
];

/// The SVG `fill` value of series `i`'s bars (`#RRGGBB`, as plotters writes it).
pub fn series_fill(i: usize) -> String {
    let RGBColor(r, g, b) = SERIES_COLORS[i % SERIES_COLORS.len()];
    format!("#{r:02X}{g:02X}{b:02X}")
}

/// When the largest positive value of a bar chart is more than this many times its smallest,
/// the value axis is logarithmic (unless [`Bars::log`] says otherwise).
pub const AUTO_LOG_SPAN: f64 = 50.0;

const WIDTH: u32 = 960;
const FONT: &str = "sans-serif";

/// A log2 histogram: `slots[k]` counts the values in [2^k, 2^(k+1)) (slot 0: 0 and 1).
#[derive(Clone, Debug)]
pub struct Log2Hist {
    /// The panel's title (which function, process, map key).
    pub title: String,
    /// What the values measure ("nsecs", "usecs", or "value" for a map of unknown meaning).
    pub unit: String,
    pub slots: Vec<u64>,
}

/// One series of a bar chart: a value per category (`None`: no bar, e.g. a table's empty cell).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Grouped horizontal bars.
#[derive(Clone, Debug)]
pub struct Bars {
    pub title: String,
    /// The value axis's title ("calls", "ns per call").
    pub unit: String,
    /// The groups, top to bottom.
    pub categories: Vec<String>,
    pub series: Vec<Series>,
    /// Logarithmic value axis: `None` decides from the values ([`AUTO_LOG_SPAN`]).
    pub log: Option<bool>,
}

/// One panel of an SVG file.
#[derive(Clone, Debug)]
pub enum Chart {
    Hist(Log2Hist),
    Bars(Bars),
}

/// Fails, naming the file, when an SVG file could not be written at `path` (a missing
/// directory, no permission): the tools check before they run, not after. Leaves an existing
/// file as it is and no new one behind.
pub fn check_writable(path: &Path) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot write SVG file {}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The label of log2 slot `k`: `[0, 2)`, `[2, 4)`, ..., `[1K, 2K)`, as bpftrace prints them.
pub fn log2_range(k: usize) -> String {
    fn bound(k: usize) -> String {
        match 1u128.checked_shl(k as u32).unwrap_or(0) {
            v if v >= 1 << 60 && v % (1 << 60) == 0 => format!("{}E", v >> 60),
            v if v >= 1 << 50 && v % (1 << 50) == 0 => format!("{}P", v >> 50),
            v if v >= 1 << 40 && v % (1 << 40) == 0 => format!("{}T", v >> 40),
            v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
            v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
            v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
            v => v.to_string(),
        }
    }
    if k == 0 { "[0, 2)".to_string() } else { format!("[{}, {})", bound(k), bound(k + 1)) }
}

impl Log2Hist {
    /// The slots drawn: first to last non-empty (empty when there are no counts).
    fn shown(&self) -> &[u64] {
        let Some(first) = self.slots.iter().position(|&c| c > 0) else { return &[] };
        let last = self.slots.iter().rposition(|&c| c > 0).unwrap_or(first);
        &self.slots[first..=last]
    }

    fn first(&self) -> usize {
        self.slots.iter().position(|&c| c > 0).unwrap_or(0)
    }

    /// The number of bars drawn: the non-empty slots.
    pub fn bars(&self) -> usize {
        self.slots.iter().filter(|&&c| c > 0).count()
    }
}

impl Bars {
    /// The number of bars drawn (cells with a value; on a log axis, positive values).
    pub fn bars(&self) -> usize {
        let log = self.is_log();
        self.series.iter().flat_map(|s| s.values.iter()).filter(|v| v.is_some_and(|v| !log || v > 0.0)).count()
    }

    /// The legend's layout below the chart: (entries per line, entry width, lines); no
    /// legend for a single series.
    fn legend_layout(&self) -> (usize, u32, usize) {
        if self.series.len() < 2 {
            return (0, 0, 0);
        }
        let chars = self.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(1) as u32;
        let entry = (chars * 7 + 34).min(WIDTH - 40);
        let per_line = ((WIDTH - 40) / entry).max(1) as usize;
        (per_line, entry, self.series.len().div_ceil(per_line))
    }

    fn legend_height(&self) -> u32 {
        let (_, _, lines) = self.legend_layout();
        if lines == 0 { 0 } else { 20 * lines as u32 + 12 }
    }

    fn is_log(&self) -> bool {
        if let Some(l) = self.log {
            return l;
        }
        let vals: Vec<f64> = self.series.iter().flat_map(|s| s.values.iter().flatten().copied()).collect();
        let (min, max) = vals.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        vals.iter().all(|&v| v > 0.0) && !vals.is_empty() && max / min > AUTO_LOG_SPAN
    }
}

impl Chart {
    fn height(&self) -> u32 {
        match self {
            Chart::Hist(h) => 110 + 24 * (h.shown().len().max(1) as u32),
            Chart::Bars(b) => {
                let per_group = 16 * b.series.len().max(1) as u32 + 12;
                110 + per_group * b.categories.len().max(1) as u32 + b.legend_height()
            }
        }
    }
}

/// A number as a bar's label: three significant figures at most, thousands separated.
pub fn format_value(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 || (v.fract() == 0.0 && a >= 1.0) {
        format!("{:.0}", v)
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.2e}")
    };
    // Thousands separators in the integer part.
    let (sign, rest) = s.strip_prefix('-').map_or(("", s.as_str()), |r| ("-", r));
    let (int, frac) = rest.split_once('.').map_or((rest, None), |(i, f)| (i, Some(f)));
    if int.len() <= 3 || rest.contains('e') {
        return s;
    }
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{out}.{f}"),
        None => format!("{sign}{out}"),
    }
}

/// The rows axis: `n` rows, row `i` (from the top) spanning [n - i - 1, n - i), a tick (and
/// label) at each row's centre.
struct Rows(usize);

impl Ranged for Rows {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (a, b) = limit;
        a + ((b - a) as f64 * (*v / self.0.max(1) as f64)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0 as f64
    }
}

// The charts give their own row labels (`y_label_formatter`); this one is never used.
impl ValueFormatter<f64> for Rows {
    fn format(v: &f64) -> String {
        format!("{v}")
    }
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e:?}")
}

/// The charts as one SVG document, stacked top to bottom.
pub fn svg(charts: &[Chart]) -> Result<String> {
    let heights: Vec<u32> = charts.iter().map(Chart::height).collect();
    let total = heights.iter().sum::<u32>().max(60);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, total)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        if charts.is_empty() {
            root.draw(&Text::new("(nothing to plot)", (20, 20), (FONT, 16).into_font())).map_err(err)?;
        }
        let mut rest = root.clone();
        for (chart, h) in charts.iter().zip(&heights) {
            let (area, below) = rest.split_vertically(*h);
            match chart {
                Chart::Hist(hist) => draw_hist(&area, hist)?,
                Chart::Bars(bars) => draw_bars(&area, bars)?,
            }
            rest = below;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// Writes the charts to `path` (see [`svg`]).
pub fn write_svg(path: &Path, charts: &[Chart]) -> Result<()> {
    let doc = svg(charts)?;
    std::fs::write(path, doc).with_context(|| format!("writing SVG file {}", path.display()))
}

/// The room the longest of `labels` takes at `size` px (plotters' estimate: 0.7 em a char).
fn label_room(labels: impl Iterator<Item = usize>, size: u32) -> u32 {
    let chars = labels.max().unwrap_or(4) as f64;
    ((chars * size as f64 * 0.48) as u32 + 16).clamp(50, WIDTH / 2)
}

fn draw_hist(area: &DrawingArea<SVGBackend<'_>, Shift>, h: &Log2Hist) -> Result<()> {
    let shown = h.shown();
    let first = h.first();
    let n = shown.len().max(1);
    let labels: Vec<String> = (0..shown.len()).map(|i| log2_range(first + i)).collect();
    let max = shown.iter().copied().max().unwrap_or(0).max(1) as f64;
    // Row i (slot first + i) from the top: the lowest slot at the top, as bpftrace prints.
    let mut chart = ChartBuilder::on(area)
        .caption(h.title.as_str(), (FONT, 17))
        .margin(12)
        .margin_right(40)
        .x_label_area_size(42)
        .y_label_area_size(label_room(labels.iter().map(String::len), 13) + 24)
        .build_cartesian_2d(0f64..max * 1.12, Rows(n))
        .map_err(err)?;
    let row_label = |y: &f64| -> String {
        let i = n as f64 - 0.5 - *y;
        labels.get(i.round().max(0.0) as usize).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("count")
        .y_desc(h.unit.as_str())
        .y_label_formatter(&row_label)
        .x_label_formatter(&|v| format_value(*v))
        .label_style((FONT, 13))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    if shown.is_empty() {
        chart
            .draw_series(std::iter::once(Text::new("(no counts)", (max * 0.02, n as f64 / 2.0), (FONT, 15))))
            .map_err(err)?;
        return Ok(());
    }
    let fill = SERIES_COLORS[0].filled();
    chart
        .draw_series(shown.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, &c)| {
            let top = n as f64 - i as f64;
            let mut r = Rectangle::new([(0.0, top - 0.1), (c as f64, top - 0.9)], fill);
            r.set_margin(0, 0, 0, 0);
            r
        }))
        .map_err(err)?;
    let style = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(shown.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, &c)| {
            Text::new(format!(" {}", format_value(c as f64)), (c as f64, n as f64 - i as f64 - 0.5), style.clone())
        }))
        .map_err(err)?;
    Ok(())
}

fn draw_bars(panel: &DrawingArea<SVGBackend<'_>, Shift>, b: &Bars) -> Result<()> {
    let (_, h) = panel.dim_in_pixel();
    let (area, legend) = panel.split_vertically(h.saturating_sub(b.legend_height()));
    draw_bars_chart(&area, b)?;
    // The legend under the chart, never over its bars (and after them in the file): a swatch
    // and the series' name each.
    let (per_line, entry, _) = b.legend_layout();
    for (j, series) in b.series.iter().enumerate().filter(|_| per_line > 0) {
        let (x, y) = (20 + (j % per_line) as i32 * entry as i32, 6 + (j / per_line) as i32 * 20);
        let color = SERIES_COLORS[j % SERIES_COLORS.len()];
        legend.draw(&Rectangle::new([(x, y + 3), (x + 14, y + 13)], color.filled())).map_err(err)?;
        let style = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        legend.draw(&Text::new(series.name.clone(), (x + 20, y + 8), style)).map_err(err)?;
    }
    Ok(())
}

fn draw_bars_chart(area: &DrawingArea<SVGBackend<'_>, Shift>, b: &Bars) -> Result<()> {
    let log = b.is_log();
    let n = b.categories.len().max(1);
    let s = b.series.len().max(1);
    let vals: Vec<f64> = b.series.iter().flat_map(|s| s.values.iter().flatten().copied()).collect();
    let pos: Vec<f64> = vals.iter().copied().filter(|&v| v > 0.0).collect();
    // The axis: log10 of the values on a log axis (whole decades), else from min(0, min) to max.
    let map = |v: f64| if log { v.log10() } else { v };
    let (lo, hi) = if log {
        let lo = pos.iter().copied().fold(f64::INFINITY, f64::min).log10().floor();
        let hi = pos.iter().copied().fold(0f64, f64::max).log10().ceil();
        (lo, if hi > lo { hi + 0.15 } else { lo + 1.0 })
    } else {
        let lo = vals.iter().copied().fold(0f64, f64::min);
        let hi = vals.iter().copied().fold(0f64, f64::max);
        let span = (hi - lo).max(f64::MIN_POSITIVE);
        (if lo < 0.0 { lo - span * 0.05 } else { 0.0 }, if hi > 0.0 { hi + span * 0.15 } else { 1.0 })
    };
    let base = if log { lo } else { 0f64.clamp(lo, hi) };
    let unit = if log { format!("{} (log scale)", b.unit) } else { b.unit.clone() };
    let mut chart = ChartBuilder::on(area)
        .caption(b.title.as_str(), (FONT, 17))
        .margin(12)
        .margin_right(56)
        .x_label_area_size(42)
        .y_label_area_size(label_room(b.categories.iter().map(|c| c.chars().count()), 13))
        .build_cartesian_2d(lo..hi, Rows(n))
        .map_err(err)?;
    let cat_label = |y: &f64| -> String {
        let i = n as f64 - 0.5 - *y;
        b.categories.get(i.round().max(0.0) as usize).cloned().unwrap_or_default()
    };
    let value_label = |x: &f64| if log { format_value(10f64.powf(*x)) } else { format_value(*x) };
    let decades = (hi - lo).floor().max(1.0) as usize + 1;
    let mut mesh = chart.configure_mesh();
    mesh.disable_y_mesh()
        .x_desc(unit.as_str())
        .y_label_formatter(&cat_label)
        .x_label_formatter(&value_label)
        .label_style((FONT, 13))
        .light_line_style(TRANSPARENT);
    if log {
        mesh.x_labels(decades);
    }
    mesh.draw().map_err(err)?;
    // Within a category's unit of height: 0.1 free at each end, the rest shared by the series.
    let slot = 0.8 / s as f64;
    let style = TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (j, series) in b.series.iter().enumerate() {
        let color = SERIES_COLORS[j % SERIES_COLORS.len()];
        let bars: Vec<(usize, f64)> = series
            .values
            .iter()
            .enumerate()
            .take(n)
            .filter_map(|(i, v)| v.filter(|&v| !log || v > 0.0).map(|v| (i, v)))
            .collect();
        let top = |i: usize| n as f64 - i as f64 - 0.1 - slot * j as f64;
        chart
            .draw_series(bars.iter().map(|&(i, v)| {
                Rectangle::new([(base, top(i) - slot * 0.08), (map(v), top(i) - slot * 0.92)], color.filled())
            }))
            .map_err(err)?;
        chart
            .draw_series(bars.iter().map(|&(i, v)| {
                Text::new(format!(" {}", format_value(v)), (map(v).max(base), top(i) - slot / 2.0), style.clone())
            }))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rects_of(doc: &str, fill: &str) -> usize {
        let xml = roxmltree::Document::parse(doc).expect("valid XML");
        assert_eq!(xml.root_element().tag_name().name(), "svg");
        xml.descendants().filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(fill)).count()
    }

    #[test]
    fn slot_labels_as_bpftrace_prints_them() {
        assert_eq!(log2_range(0), "[0, 2)");
        assert_eq!(log2_range(3), "[8, 16)");
        assert_eq!(log2_range(9), "[512, 1K)");
        assert_eq!(log2_range(20), "[1M, 2M)");
        assert_eq!(log2_range(63), "[8E, 16E)");
    }

    #[test]
    fn a_bar_per_non_empty_slot_and_labelled_axes() {
        let mut slots = vec![0u64; 64];
        slots[3] = 5;
        slots[4] = 120;
        slots[7] = 1; // slots 5 and 6 are empty: rows without bars
        let h = Log2Hist { title: "f".into(), unit: "nsecs".into(), slots };
        assert_eq!(h.bars(), 3);
        let doc = svg(&[Chart::Hist(h)]).unwrap();
        assert_eq!(rects_of(&doc, &series_fill(0)), 3);
        let xml = roxmltree::Document::parse(&doc).unwrap();
        let texts: Vec<&str> =
            xml.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::trim).collect();
        for want in ["f", "[8, 16)", "[16, 32)", "[32, 64)", "[64, 128)", "[128, 256)", "nsecs", "count", "120"] {
            assert!(texts.contains(&want), "no text {want:?} in {texts:?}");
        }
        assert!(!texts.contains(&"[256, 512)"), "rows beyond the last non-empty slot: {texts:?}");
    }

    #[test]
    fn grouped_bars_with_a_legend_and_a_log_axis() {
        let b = Bars {
            title: "hit <cost> & more".into(),
            unit: "ns".into(),
            categories: vec!["uprobe".into(), "uretprobe".into()],
            series: vec![
                Series { name: "kernel".into(), values: vec![Some(9332.0), Some(9661.0)] },
                Series { name: "userbpf".into(), values: vec![Some(11.6), None] },
            ],
            log: None,
        };
        assert!(b.is_log());
        assert_eq!(b.bars(), 3);
        let doc = svg(&[Chart::Bars(b)]).unwrap();
        // Two bars and the legend's swatch in the first colour, one bar and a swatch in the second.
        assert_eq!(rects_of(&doc, &series_fill(0)), 3);
        assert_eq!(rects_of(&doc, &series_fill(1)), 2);
        assert!(doc.contains("hit &lt;cost&gt; &amp; more"));
        assert!(doc.contains("(log scale)"));
    }

    #[test]
    fn several_panels_in_one_file_and_a_bad_path_named() {
        let h = |c| Chart::Hist(Log2Hist { title: "h".into(), unit: "usecs".into(), slots: vec![0, c, c] });
        let doc = svg(&[h(1), h(2), h(0)]).unwrap();
        assert_eq!(rects_of(&doc, &series_fill(0)), 4);
        assert!(doc.contains("(no counts)"));
        let e = check_writable(Path::new("/nonexistent-dir/x.svg")).unwrap_err();
        assert!(format!("{e:#}").contains("cannot write SVG file /nonexistent-dir/x.svg"), "{e:#}");
        let e = write_svg(Path::new("/nonexistent-dir/x.svg"), &[h(1)]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("writing SVG file /nonexistent-dir/x.svg") && msg.contains("No such file"), "{msg}");
    }

    #[test]
    fn values_formatted_for_labels() {
        assert_eq!(format_value(9332.0), "9,332");
        assert_eq!(format_value(932.0), "932");
        assert_eq!(format_value(18014029.0), "18,014,029");
        assert_eq!(format_value(11.63), "11.6");
        assert_eq!(format_value(0.068), "0.07");
        assert_eq!(format_value(-0.0), "0");
    }
}
