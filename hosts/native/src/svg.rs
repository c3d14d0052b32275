//! Standalone SVG pictures, written by hand (no plotting dependency):
//! - [`arena_svg`]: where each tensor lives in the arena over the execution order (x = execution
//!   order, y = byte address, 0 at the bottom), like Fig. 6 of the Melon paper;
//! - [`curves_svg`]: training loss and accuracy per epoch.
//! - [`timeline_svg`]: arena bytes in use per instruction against the budget in force, with
//!   recomputations, swaps and budget changes marked; one panel per plan.
//!
//! Write them with [`write_atomic`](crate::fsutil::write_atomic).
use std::fmt::Write as _;

/// One tensor's rectangle in the arena picture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaRect {
    /// Tensor name (shown in the tooltip).
    pub name: String,
    /// `weight`, `gradient`, `activation`, `derivative`, `scratch`, `opt_state` or `stat`; decides the
    /// colour (anything else is grey).
    pub kind: &'static str,
    /// First execution order at which the tensor is live.
    pub first_eo: u32,
    /// Last execution order at which it is live (inclusive).
    pub last_eo: u32,
    /// Byte offset in the arena.
    pub offset: usize,
    /// Size in bytes.
    pub bytes: usize,
}

/// One epoch's numbers for [`curves_svg`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochPoint {
    /// Epoch number (as shown; usually 1-based).
    pub epoch: u32,
    /// Mean training loss over the epoch.
    pub train_loss: f32,
    /// Training accuracy as a fraction in [0, 1].
    pub train_acc: f32,
    /// Test accuracy as a fraction in [0, 1], when there is a test set.
    pub test_acc: Option<f32>,
}

/// Kinds in legend order, with their fill colours.
const KINDS: &[(&str, &str)] = &[
    ("weight", "#4e79a7"),
    ("gradient", "#f28e2b"),
    ("activation", "#59a14f"),
    ("derivative", "#e15759"),
    ("opt_state", "#b07aa1"),
    ("stat", "#edc948"),
    ("scratch", "#9c9c9c"),
];
const OTHER_COLOUR: &str = "#d4d4d4";

fn colour(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(OTHER_COLOUR, |(_, c)| c)
}

/// Escapes text for XML content and attribute values.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Characters XML 1.0 forbids.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

/// Bytes in human units: `512 B`, `1.5 KiB`, `2.25 MiB`.
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        let s = format!("{v:.2}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        format!("{s} {}", UNITS[u])
    }
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving at most about `target` ticks over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let f = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// Trims a tick label: `0.5`, `2`, `1.25`.
fn num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

const FONT: &str = "font-family=\"Helvetica, Arial, sans-serif\"";

fn svg_open(out: &mut String, w: u32, h: u32, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" {FONT} font-size=\"12\">\n\
         <title>{}</title>\n<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n",
        esc(title)
    );
}

/// The arena over time: x = execution order (`0..n_eo`), y = byte address (0 at the bottom, the top
/// of the plot is `arena_bytes`). One rectangle (`class="tensor"`) per tensor, coloured by kind, with a
/// tooltip giving its name, kind, size, EO range and offset; plus axes, ticks, a legend of the kinds
/// present, and a dashed line at the arena size.
pub fn arena_svg(tensors: &[ArenaRect], arena_bytes: usize, n_eo: u32, title: &str) -> String {
    const W: f64 = 1000.0;
    const H: f64 = 600.0;
    const LEFT: f64 = 90.0;
    const RIGHT: f64 = 170.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 60.0;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let top_addr = tensors
        .iter()
        .map(|t| t.offset.saturating_add(t.bytes))
        .fold(arena_bytes, usize::max)
        .max(1) as f64;
    let eo_end = tensors
        .iter()
        .map(|t| t.last_eo.saturating_add(1))
        .fold(n_eo, u32::max)
        .max(1) as f64;
    let x = |eo: f64| LEFT + eo / eo_end * pw;
    let y = |addr: f64| TOP + ph - addr / top_addr * ph;

    let mut s = String::with_capacity(512 + tensors.len() * 256);
    svg_open(&mut s, W as u32, H as u32, title);
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>",
        LEFT + pw / 2.0,
        esc(title)
    );
    // Plot frame.
    let _ = writeln!(
        s,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fafafa\" stroke=\"#444\"/>"
    );

    // Y ticks in a unit that suits the arena size.
    let (unit, unit_name) = if top_addr >= 4.0 * 1024.0 * 1024.0 {
        (1024.0 * 1024.0, "MiB")
    } else if top_addr >= 4.0 * 1024.0 {
        (1024.0, "KiB")
    } else {
        (1.0, "B")
    };
    let ystep = nice_step(top_addr / unit, 8.0);
    let mut v = 0.0;
    while v * unit <= top_addr * (1.0 + 1e-9) {
        let yy = y(v * unit);
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{LEFT}\" y2=\"{yy:.1}\" stroke=\"#444\"/>\
             <line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 5.0,
            LEFT + pw,
            LEFT - 8.0,
            yy + 4.0,
            num(v)
        );
        v += ystep;
    }
    // X ticks: integer execution orders.
    let xstep = nice_step(eo_end, 12.0).max(1.0);
    let mut e = 0.0;
    while e <= eo_end + 1e-9 {
        let xx = x(e);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#444\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 19.0,
            num(e)
        );
        e += xstep;
    }
    // Axis labels.
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">execution order</text>\n\
         <text transform=\"translate(24 {:.1}) rotate(-90)\" text-anchor=\"middle\">address ({unit_name})</text>",
        LEFT + pw / 2.0,
        H - 18.0,
        TOP + ph / 2.0
    );

    // Tensors.
    let _ = writeln!(s, "<g stroke-width=\"0.6\">");
    for t in tensors {
        let x0 = x(t.first_eo as f64);
        let x1 = x(t.last_eo.max(t.first_eo) as f64 + 1.0);
        let y_top = y(t.offset.saturating_add(t.bytes) as f64);
        let y_bot = y(t.offset as f64);
        let h = (y_bot - y_top).max(0.5);
        let c = colour(t.kind);
        let _ = writeln!(
            s,
            "<rect class=\"tensor\" x=\"{x0:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{h:.2}\" fill=\"{c}\" fill-opacity=\"0.85\" stroke=\"#222\">\
             <title>{} ({}): {} B = {}, EO {}–{}, offset {}</title></rect>",
            y_bot - h,
            (x1 - x0).max(0.5),
            esc(&t.name),
            esc(t.kind),
            t.bytes,
            human_bytes(t.bytes),
            t.first_eo,
            t.last_eo,
            t.offset
        );
    }
    let _ = writeln!(s, "</g>");

    // Arena size.
    if arena_bytes > 0 {
        let ya = y(arena_bytes as f64);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{ya:.1}\" x2=\"{:.1}\" y2=\"{ya:.1}\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c00\">arena {}</text>",
            LEFT + pw,
            LEFT + pw + 6.0,
            ya + 4.0,
            esc(&human_bytes(arena_bytes))
        );
    }

    // Legend: kinds present, in a fixed order, then any unknown kinds.
    let mut present: Vec<(&str, &str)> = KINDS
        .iter()
        .filter(|(k, _)| tensors.iter().any(|t| t.kind == *k))
        .copied()
        .collect();
    for t in tensors {
        if colour(t.kind) == OTHER_COLOUR && !present.iter().any(|(k, _)| *k == t.kind) {
            present.push((t.kind, OTHER_COLOUR));
        }
    }
    let lx = LEFT + pw + 20.0;
    for (i, (k, c)) in present.iter().enumerate() {
        let ly = TOP + 30.0 + i as f64 * 22.0;
        let bytes: usize = tensors
            .iter()
            .filter(|t| t.kind == *k)
            .map(|t| t.bytes)
            .sum();
        let _ = writeln!(
            s,
            "<rect class=\"legend\" x=\"{lx:.1}\" y=\"{:.1}\" width=\"14\" height=\"14\" fill=\"{c}\" stroke=\"#222\" stroke-width=\"0.6\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}<title>{} in all</title></text>",
            ly - 11.0,
            lx + 20.0,
            ly,
            esc(k),
            esc(&human_bytes(bytes))
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Training curves: loss per epoch (left panel) and train/test accuracy in % (right panel).
/// Non-finite values are left out (the line breaks there). An empty slice gives a valid, empty chart.
pub fn curves_svg(epochs: &[EpochPoint]) -> String {
    const W: f64 = 960.0;
    const H: f64 = 380.0;
    let mut s = String::with_capacity(4096 + epochs.len() * 64);
    svg_open(&mut s, W as u32, H as u32, "training curves");
    let xs: Vec<f64> = epochs.iter().map(|p| p.epoch as f64).collect();
    let loss: Vec<f64> = epochs.iter().map(|p| p.train_loss as f64).collect();
    let tr: Vec<f64> = epochs.iter().map(|p| p.train_acc as f64 * 100.0).collect();
    let te: Vec<f64> = epochs
        .iter()
        .map(|p| p.test_acc.map_or(f64::NAN, |a| a as f64 * 100.0))
        .collect();
    let max_loss = loss
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    panel(
        &mut s,
        &Panel {
            frame: (60.0, 50.0, 380.0, 270.0),
            title: "training loss",
            ylabel: "loss",
            yr: (0.0, if max_loss > 0.0 { max_loss * 1.05 } else { 1.0 }),
            legend_bottom: false,
        },
        &xs,
        &[("train", "#4e79a7", &loss)],
    );
    let mut series: Vec<(&str, &str, &[f64])> = vec![("train", "#4e79a7", &tr)];
    if te.iter().any(|v| v.is_finite()) {
        series.push(("test", "#e15759", &te));
    }
    panel(
        &mut s,
        &Panel {
            frame: (540.0, 50.0, 380.0, 270.0),
            title: "accuracy",
            ylabel: "accuracy (%)",
            yr: (0.0, 100.0),
            legend_bottom: true,
        },
        &xs,
        &series,
    );
    s.push_str("</svg>\n");
    s
}

/// One chart's frame and labels.
struct Panel<'a> {
    /// `(x, y, w, h)` of the plot area.
    frame: (f64, f64, f64, f64),
    title: &'a str,
    ylabel: &'a str,
    /// The y range shown.
    yr: (f64, f64),
    /// Legend in the bottom right corner instead of the top right (accuracy curves rise to the top).
    legend_bottom: bool,
}

/// One chart: x = epoch, and line series `(label, colour, ys)`.
fn panel(s: &mut String, p: &Panel<'_>, xs: &[f64], series: &[(&str, &str, &[f64])]) {
    let (px, py, pw, ph) = p.frame;
    let (title, ylabel, yr, legend_bottom) = (p.title, p.ylabel, p.yr, p.legend_bottom);
    let xmin = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let xmax = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (xmin, xmax) = if xmin.is_finite() && xmax > xmin {
        (xmin, xmax)
    } else if xmin.is_finite() {
        (xmin - 1.0, xmin + 1.0)
    } else {
        (0.0, 1.0)
    };
    let fx = |v: f64| px + (v - xmin) / (xmax - xmin) * pw;
    let fy = |v: f64| py + ph - (v - yr.0) / (yr.1 - yr.0) * ph;
    let _ = writeln!(
        s,
        "<g class=\"panel\"><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <rect x=\"{px}\" y=\"{py}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fafafa\" stroke=\"#444\"/>",
        px + pw / 2.0,
        py - 18.0,
        esc(title)
    );
    // Y ticks and grid.
    let ystep = nice_step(yr.1 - yr.0, 6.0);
    let mut v = yr.0;
    while v <= yr.1 + ystep * 1e-9 {
        let yy = fy(v);
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            px,
            px + pw,
            px - 6.0,
            yy + 4.0,
            num(v)
        );
        v += ystep;
    }
    // X ticks: whole epochs.
    let xstep = nice_step(xmax - xmin, 10.0).max(1.0);
    let mut e = (xmin / xstep).ceil() * xstep;
    while e <= xmax + 1e-9 {
        let xx = fx(e);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#444\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            py + ph,
            py + ph + 5.0,
            py + ph + 19.0,
            num(e)
        );
        e += xstep;
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">epoch</text>\n\
         <text transform=\"translate({:.1} {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        px + pw / 2.0,
        py + ph + 40.0,
        px - 42.0,
        py + ph / 2.0,
        esc(ylabel)
    );
    if xs.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#888\">no data</text>",
            px + pw / 2.0,
            py + ph / 2.0
        );
    }
    for (i, (label, c, ys)) in series.iter().enumerate() {
        let mut d = String::new();
        let mut pen_down = false;
        let mut dots = String::new();
        for (&xv, &yv) in xs.iter().zip(ys.iter()) {
            if !(xv.is_finite() && yv.is_finite()) {
                pen_down = false;
                continue;
            }
            let yv = yv.clamp(yr.0, yr.1);
            let (xx, yy) = (fx(xv), fy(yv));
            let _ = write!(d, "{}{xx:.1} {yy:.1} ", if pen_down { "L" } else { "M" });
            pen_down = true;
            let _ = write!(
                dots,
                "<circle cx=\"{xx:.1}\" cy=\"{yy:.1}\" r=\"2.5\" fill=\"{c}\"><title>{} epoch {}: {}</title></circle>",
                esc(label),
                num(xv),
                num(yv)
            );
        }
        if !d.is_empty() {
            let _ = writeln!(
                s,
                "<path d=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
                d.trim_end()
            );
        }
        s.push_str(&dots);
        s.push('\n');
        // Legend entry, inside the frame.
        let ly = if legend_bottom {
            py + ph - 10.0 - (series.len() - 1 - i) as f64 * 18.0
        } else {
            py + 16.0 + i as f64 * 18.0
        };
        let lx = px + pw - 80.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            lx + 26.0,
            ly,
            esc(label)
        );
    }
    s.push_str("</g>\n");
}

/// What an instruction of the timeline did besides running, for [`timeline_svg`]'s markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// An ordinary instruction (no marker).
    Normal,
    /// Recomputes an activation that was dropped to save memory.
    Recompute,
    /// Moves a tensor out of the arena.
    SwapOut,
    /// Brings a swapped-out tensor back.
    SwapIn,
    /// The memory budget changed at this instruction.
    BudgetChange,
}

impl Mark {
    /// The marked kinds, in legend order.
    const MARKED: [Mark; 4] = [
        Mark::Recompute,
        Mark::SwapOut,
        Mark::SwapIn,
        Mark::BudgetChange,
    ];

    /// `(class, legend label, colour)`; `None` for [`Mark::Normal`].
    fn style(self) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            Mark::Normal => None,
            Mark::Recompute => Some(("mark-recompute", "recompute", "#f28e2b")),
            Mark::SwapOut => Some(("mark-swapout", "swap out", "#b07aa1")),
            Mark::SwapIn => Some(("mark-swapin", "swap in", "#59a14f")),
            Mark::BudgetChange => Some(("mark-budget", "budget change", "#17becf")),
        }
    }
}

/// One execution order of a step for [`timeline_svg`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Execution order of the instruction.
    pub eo: u32,
    /// Arena bytes in use after this instruction.
    pub bytes: usize,
    /// What the instruction is, e.g. `F(conv1)` (shown in the tooltip).
    pub label: String,
    /// Marker drawn for it.
    pub mark: Mark,
}

/// One plan's timeline: a panel of [`timeline_svg`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelinePanel {
    /// Panel heading (e.g. the plan and its budget).
    pub title: String,
    /// The instructions, in any order (they are sorted by execution order).
    pub points: Vec<TimelinePoint>,
    /// The budget in force, piecewise: `(from_eo, budget_bytes)`, each in force until the next one's
    /// `from_eo`. Empty: no budget line.
    pub budgets: Vec<(u32, usize)>,
}

const IN_USE_COLOUR: &str = "#4e79a7";
const BUDGET_COLOUR: &str = "#c00";

/// A marker symbol (circle, triangles, diamond) centred on `(cx, cy)` with radius `r`; `attrs` go
/// into the element and `title`, when given, becomes its tooltip.
fn mark_symbol(
    s: &mut String,
    mark: Mark,
    (cx, cy, r): (f64, f64, f64),
    attrs: &str,
    title: Option<&str>,
) {
    let Some((_, _, c)) = mark.style() else {
        return;
    };
    let paint = format!("fill=\"{c}\" stroke=\"white\" stroke-width=\"0.8\"");
    let (open, name) = match mark {
        Mark::Recompute => (
            format!("<circle {attrs} cx=\"{cx:.2}\" cy=\"{cy:.2}\" r=\"{:.2}\" {paint}", r * 0.9),
            "circle",
        ),
        Mark::SwapOut | Mark::SwapIn => {
            // Out points down (leaving the arena), in points up.
            let k = if mark == Mark::SwapOut { 1.0 } else { -1.0 };
            (
                format!(
                    "<path {attrs} d=\"M{:.2} {:.2}L{:.2} {:.2}L{cx:.2} {:.2}Z\" {paint}",
                    cx - r,
                    cy - k * r * 0.8,
                    cx + r,
                    cy - k * r * 0.8,
                    cy + k * r
                ),
                "path",
            )
        }
        _ => (
            format!(
                "<path {attrs} d=\"M{cx:.2} {:.2}L{:.2} {cy:.2}L{cx:.2} {:.2}L{:.2} {cy:.2}Z\" {paint}",
                cy - r * 1.1,
                cx + r,
                cy + r * 1.1,
                cx - r
            ),
            "path",
        ),
    };
    s.push_str(&open);
    match title {
        Some(t) => {
            let _ = write!(s, "><title>{}</title></{name}>", esc(t));
        }
        None => s.push_str("/>"),
    }
}

/// A power-of-two tick step in bytes giving at most `target` ticks up to `top`, so that
/// [`human_bytes`] labels stay short (`256 KiB`, `1.5 MiB`).
fn byte_step(top: f64, target: f64) -> f64 {
    let mut step = 1.0;
    while top / step > target {
        step *= 2.0;
    }
    step
}

/// The memory timeline of one or more plans, as small multiples stacked vertically (each panel with
/// its own scales, same style): bytes in use after each instruction as a filled step line; the budget
/// in force as a dashed red line (`class="budget"`, one per panel with budgets; a budget change
/// mid-step shows as a step), with the bytes over it shaded (`class="over"`); recomputations, swaps
/// out and in and budget changes as coloured markers (`class="mark-recompute"`, `mark-swapout`,
/// `mark-swapin`, `mark-budget`, one element per marked instruction) over tinted bands, with a legend;
/// and a tooltip per instruction giving its EO, label, bytes and budget. An empty slice or panel gives
/// a valid picture.
pub fn timeline_svg(panels: &[TimelinePanel]) -> String {
    const W: f64 = 1000.0;
    const LEFT: f64 = 82.0;
    const RIGHT: f64 = 24.0;
    const TOP: f64 = 44.0;
    const HEAD: f64 = 28.0; // panel title above the frame
    const FOOT: f64 = 40.0; // x tick labels and the gap to the next panel
    let pw = W - LEFT - RIGHT;
    let ph = if panels.len() <= 1 { 320.0 } else { 170.0 };
    let h = TOP + panels.len().max(1) as f64 * (HEAD + ph + FOOT) + 10.0;

    let mut s =
        String::with_capacity(2048 + panels.iter().map(|p| p.points.len() * 300).sum::<usize>());
    svg_open(&mut s, W as u32, h as u32, "memory timeline");
    s.push_str("<style>.hit{fill:#000;fill-opacity:0}.hit:hover{fill-opacity:0.08}</style>\n");

    // Legend: what is present anywhere, in one row above the panels.
    let any_budget = panels.iter().any(|p| !p.budgets.is_empty());
    let any_over = panels.iter().any(|p| {
        p.points
            .iter()
            .any(|q| budget_at(&p.budgets, q.eo).is_some_and(|b| q.bytes > b))
    });
    let mut lx = LEFT;
    let ly = 22.0;
    let item = |s: &mut String, lx: &mut f64, swatch: String, label: &str| {
        s.push_str(&swatch);
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            *lx + 24.0,
            ly + 4.0,
            esc(label)
        );
        *lx += 24.0 + label.chars().count() as f64 * 6.6 + 22.0;
    };
    let _ = writeln!(s, "<g class=\"legend\">");
    let sw = format!(
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"18\" height=\"8\" fill=\"{IN_USE_COLOUR}\" fill-opacity=\"0.22\"/>\
             <line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{IN_USE_COLOUR}\" stroke-width=\"1.6\"/>",
            ly - 3.0,
            ly - 3.0,
            lx + 18.0,
            ly - 3.0
        );
    item(&mut s, &mut lx, sw, "in use");
    if any_budget {
        let sw = format!(
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{BUDGET_COLOUR}\" stroke-width=\"1.6\" stroke-dasharray=\"6 4\"/>",
            lx + 18.0
        );
        item(&mut s, &mut lx, sw, "budget");
    }
    if any_over {
        let sw = format!(
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"18\" height=\"10\" fill=\"{BUDGET_COLOUR}\" fill-opacity=\"0.45\"/>",
            ly - 5.0
        );
        item(&mut s, &mut lx, sw, "over budget");
    }
    for m in Mark::MARKED {
        if panels.iter().any(|p| p.points.iter().any(|q| q.mark == m)) {
            let (_, label, c) = m.style().unwrap_or_default();
            let mut sw = format!(
                "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"18\" height=\"16\" fill=\"{c}\" fill-opacity=\"0.15\"/>",
                ly - 8.0
            );
            mark_symbol(&mut sw, m, (lx + 9.0, ly, 4.5), "", None);
            item(&mut s, &mut lx, sw, label);
        }
    }
    let _ = writeln!(s, "</g>");

    if panels.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#888\">no data</text>",
            LEFT + pw / 2.0,
            TOP + HEAD + ph / 2.0
        );
    }
    for (i, p) in panels.iter().enumerate() {
        let py = TOP + i as f64 * (HEAD + ph + FOOT) + HEAD;
        timeline_panel(&mut s, p, (LEFT, py, pw, ph), i + 1 == panels.len());
    }
    s.push_str("</svg>\n");
    s
}

/// The budget in force at `eo`: the last entry whose `from_eo` is at or before it.
fn budget_at(budgets: &[(u32, usize)], eo: u32) -> Option<usize> {
    budgets
        .iter()
        .filter(|(from, _)| *from <= eo)
        .max_by_key(|(from, _)| *from)
        .map(|&(_, b)| b)
}

/// One panel of [`timeline_svg`] in the plot area `(px, py, pw, ph)`.
fn timeline_panel(
    s: &mut String,
    p: &TimelinePanel,
    (px, py, pw, ph): (f64, f64, f64, f64),
    last: bool,
) {
    let mut pts: Vec<&TimelinePoint> = p.points.iter().collect();
    pts.sort_by_key(|q| q.eo);
    let mut budgets = p.budgets.clone();
    budgets.sort_by_key(|&(from, _)| from);

    let (xmin, xmax) = match (pts.first(), pts.last()) {
        (Some(a), Some(b)) => (a.eo as f64, b.eo as f64 + 1.0),
        _ => (0.0, 1.0),
    };
    let top = pts
        .iter()
        .map(|q| q.bytes)
        .chain(budgets.iter().map(|&(_, b)| b))
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.12;
    let x = |eo: f64| px + (eo - xmin) / (xmax - xmin) * pw;
    let y = |b: f64| py + ph - b.min(top) / top * ph;
    // Where each instruction's column ends: at the next instruction (the bytes hold until then).
    let end = |i: usize| pts.get(i + 1).map_or(xmax, |q| q.eo as f64);
    let colw = pw / (xmax - xmin);

    // Heading: title on the left, peak and counts on the right.
    let mut stats = String::new();
    if let Some(peak) = pts
        .iter()
        .max_by_key(|q| (q.bytes, std::cmp::Reverse(q.eo)))
    {
        let _ = write!(stats, "peak {} at EO {}", human_bytes(peak.bytes), peak.eo);
    }
    let mut counts = String::new();
    for m in Mark::MARKED {
        let n = pts.iter().filter(|q| q.mark == m).count();
        if n > 0 {
            let (_, label, _) = m.style().unwrap_or_default();
            let _ = write!(counts, " · {label} ×{n}");
        }
    }
    // The counts only where they fit beside the title (they are in the tooltips anyway).
    let width = |t: &str, per_char: f64| t.chars().count() as f64 * per_char;
    if width(&p.title, 8.5) + width(&stats, 6.6) + width(&counts, 6.6) + 150.0 <= pw {
        stats.push_str(&counts);
    }
    let over: Vec<(usize, usize)> = pts
        .iter()
        .enumerate()
        .filter_map(|(i, q)| {
            budget_at(&budgets, q.eo)
                .filter(|&b| q.bytes > b)
                .map(|b| (i, b))
        })
        .collect();
    let _ = writeln!(
        s,
        "<g class=\"panel\"><text x=\"{px:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"bold\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{}{}</text>\n\
         <rect x=\"{px:.1}\" y=\"{py:.1}\" width=\"{pw:.1}\" height=\"{ph:.1}\" fill=\"#fafafa\" stroke=\"#444\"/>",
        py - 9.0,
        esc(&p.title),
        px + pw,
        py - 9.0,
        esc(&stats),
        if over.is_empty() {
            String::new()
        } else {
            format!(" · <tspan fill=\"{BUDGET_COLOUR}\">over budget ×{}</tspan>", over.len())
        }
    );

    // Y ticks (bytes) and grid.
    let ystep = byte_step(top, 5.0);
    let mut v = 0.0;
    while v <= top {
        let yy = y(v);
        let _ = writeln!(
            s,
            "<line x1=\"{px:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/>\
             <line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{px:.1}\" y2=\"{yy:.1}\" stroke=\"#444\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            px + pw,
            px - 5.0,
            px - 8.0,
            yy + 4.0,
            human_bytes(v as usize)
        );
        v += ystep;
    }
    // X ticks: execution orders.
    let xstep = nice_step(xmax - xmin, 12.0).max(1.0);
    let mut e = (xmin / xstep).ceil() * xstep;
    while e <= xmax + 1e-9 {
        let xx = x(e);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#444\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            py + ph,
            py + ph + 5.0,
            py + ph + 18.0,
            num(e)
        );
        e += xstep;
    }
    if last {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">execution order</text>",
            px + pw / 2.0,
            py + ph + 36.0
        );
    }
    if pts.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#888\">no data</text>",
            px + pw / 2.0,
            py + ph / 2.0
        );
    }

    // Tinted bands behind runs of the same mark.
    let mut i = 0;
    while i < pts.len() {
        let m = pts[i].mark;
        let mut j = i + 1;
        while j < pts.len() && pts[j].mark == m && pts[j].eo <= pts[j - 1].eo + 1 {
            j += 1;
        }
        if let Some((_, _, c)) = m.style() {
            let (x0, x1) = (x(pts[i].eo as f64), x(end(j - 1)));
            let _ = writeln!(
                s,
                "<rect class=\"band\" x=\"{x0:.2}\" y=\"{py:.1}\" width=\"{:.2}\" height=\"{ph:.1}\" fill=\"{c}\" fill-opacity=\"0.13\"/>",
                (x1 - x0).max(0.5)
            );
        }
        i = j;
    }

    // Bytes in use: a filled step line.
    if !pts.is_empty() {
        let mut d = String::new();
        for (i, q) in pts.iter().enumerate() {
            let yy = y(q.bytes as f64);
            if i == 0 {
                let _ = write!(d, "M{:.2} {yy:.2}", x(q.eo as f64));
            } else {
                let _ = write!(d, "V{yy:.2}");
            }
            let _ = write!(d, "H{:.2}", x(end(i)));
        }
        let _ = writeln!(
            s,
            "<path class=\"in-use-area\" d=\"{d}V{:.2}H{:.2}Z\" fill=\"{IN_USE_COLOUR}\" fill-opacity=\"0.22\"/>\n\
             <path class=\"in-use\" d=\"{d}\" fill=\"none\" stroke=\"{IN_USE_COLOUR}\" stroke-width=\"1.6\" stroke-linejoin=\"round\"/>",
            py + ph,
            x(pts[0].eo as f64)
        );
    }
    // Bytes over the budget in force: one path (adjacent columns then render without seams).
    if !over.is_empty() {
        let mut d = String::new();
        for &(i, b) in &over {
            let (x0, x1) = (x(pts[i].eo as f64), x(end(i)));
            let (y0, y1) = (y(pts[i].bytes as f64), y(b as f64));
            let _ = write!(
                d,
                "M{x0:.2} {y0:.2}H{:.2}V{:.2}H{x0:.2}Z",
                x1.max(x0 + 0.5),
                y1.max(y0 + 0.5)
            );
        }
        let worst = over
            .iter()
            .map(|&(i, b)| pts[i].bytes - b)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            s,
            "<path class=\"over\" d=\"{d}\" fill=\"{BUDGET_COLOUR}\" fill-opacity=\"0.45\"><title>over budget at {} instructions, by up to {}</title></path>",
            over.len(),
            human_bytes(worst)
        );
    }
    // The budget line, piecewise.
    let segs: Vec<(f64, f64, usize)> = budgets
        .iter()
        .enumerate()
        .map(|(k, &(from, b))| {
            let to = budgets
                .get(k + 1)
                .map_or(xmax, |&(f, _)| (f as f64).min(xmax));
            ((from as f64).max(xmin), to, b)
        })
        .filter(|&(a, b, _)| b > a)
        .collect();
    if !segs.is_empty() {
        let mut d = String::new();
        for (k, &(a, b, bytes)) in segs.iter().enumerate() {
            let yy = y(bytes as f64);
            if k == 0 || segs[k - 1].1 < a {
                let _ = write!(d, "M{:.2} {yy:.2}", x(a));
            } else {
                let _ = write!(d, "V{yy:.2}");
            }
            let _ = write!(d, "H{:.2}", x(b));
        }
        let tip: Vec<String> = budgets
            .iter()
            .map(|&(from, b)| format!("{} from EO {from}", human_bytes(b)))
            .collect();
        let _ = writeln!(
            s,
            "<path class=\"budget\" d=\"{d}\" fill=\"none\" stroke=\"{BUDGET_COLOUR}\" stroke-width=\"1.6\" stroke-dasharray=\"6 4\"><title>budget: {}</title></path>",
            esc(&tip.join(", "))
        );
        for &(a, b, bytes) in &segs {
            if x(b) - x(a) >= 90.0 {
                // Above the line, or below it where the bytes in use would hide the label.
                let (l0, l1) = (a, a + 90.0 / colw);
                let crowded = pts.iter().enumerate().any(|(i, q)| {
                    (q.eo as f64) < l1 && end(i) > l0 && y(q.bytes as f64) < y(bytes as f64) - 2.0
                });
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{BUDGET_COLOUR}\" font-size=\"11\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">budget {}</text>",
                    x(a) + 4.0,
                    y(bytes as f64) + if crowded { 14.0 } else { -5.0 },
                    esc(&human_bytes(bytes))
                );
            }
        }
    }
    // Markers, one per marked instruction, on the line.
    let r = (colw * 0.6).clamp(3.5, 5.0);
    for (i, q) in pts.iter().enumerate() {
        if let Some((class, label, _)) = q.mark.style() {
            let cx = (x(q.eo as f64) + x(end(i))) / 2.0;
            let tip = format!(
                "EO {} {}: {} ({label})",
                q.eo,
                q.label,
                human_bytes(q.bytes)
            );
            mark_symbol(
                s,
                q.mark,
                (cx, y(q.bytes as f64), r),
                &format!("class=\"{class}\""),
                Some(&tip),
            );
            s.push('\n');
        }
    }
    // Tooltips: one transparent column per instruction.
    for (i, q) in pts.iter().enumerate() {
        let (x0, x1) = (x(q.eo as f64), x(end(i)));
        let mut tip = format!(
            "EO {} {}: {} ({} B)",
            q.eo,
            q.label,
            human_bytes(q.bytes),
            q.bytes
        );
        if let Some((_, label, _)) = q.mark.style() {
            let _ = write!(tip, ", {label}");
        }
        if let Some(b) = budget_at(&budgets, q.eo) {
            let _ = write!(tip, "; budget {}", human_bytes(b));
        }
        let _ = writeln!(
            s,
            "<rect class=\"hit\" x=\"{x0:.2}\" y=\"{py:.1}\" width=\"{:.2}\" height=\"{ph:.1}\"><title>{}</title></rect>",
            (x1 - x0).max(0.5),
            esc(&tip)
        );
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small well-formedness check: balanced, properly nested tags; no stray `<` or `&`.
    fn assert_well_formed(svg: &str) {
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "starts with <svg"
        );
        assert!(svg.trim_end().ends_with("</svg>"));
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            check_text(text);
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "'<' inside tag {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap();
                stack.push(name);
            }
            // Attribute quotes balance.
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes in {tag:?}"
            );
            check_text(tag);
            rest = &rest[close + 1..];
        }
        check_text(rest);
        assert!(stack.is_empty(), "unclosed tags: {stack:?}");
        assert!(
            !svg.contains("NaN") && !svg.contains("inf"),
            "non-finite coordinates"
        );
    }

    fn check_text(t: &str) {
        for (i, _) in t.match_indices('&') {
            let ent = &t[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| ent.starts_with(e)),
                "bare & in {t:?}"
            );
        }
    }

    fn rect(
        name: &str,
        kind: &'static str,
        eo: (u32, u32),
        offset: usize,
        bytes: usize,
    ) -> ArenaRect {
        ArenaRect {
            name: name.into(),
            kind,
            first_eo: eo.0,
            last_eo: eo.1,
            offset,
            bytes,
        }
    }

    #[test]
    fn arena_picture() {
        let ts = vec![
            rect("fc1.weight", "weight", (0, 9), 0, 4096),
            rect("fc1.out", "activation", (1, 7), 4096, 2048),
            rect("<odd & \"name\">", "derivative", (7, 8), 4096, 1024),
            rect("adam.m", "opt_state", (0, 9), 6144, 4096),
            rect("im2col", "scratch", (2, 2), 10240, 512),
            rect("bn.mean", "stat", (0, 9), 10752, 0),
            rect("mystery", "unknown_kind", (3, 4), 10752, 16),
        ];
        let svg = arena_svg(&ts, 12 * 1024, 10, "digits CNN: 12 KiB");
        assert_well_formed(&svg);
        assert_eq!(svg.matches("<rect class=\"tensor\"").count(), ts.len());
        assert!(svg.contains("&lt;odd &amp; &quot;name&quot;&gt;"));
        assert!(
            svg.contains("<title>fc1.weight (weight): 4096 B = 4 KiB, EO 0–9, offset 0</title>")
        );
        for label in [
            "execution order",
            "address (KiB)",
            "arena 12 KiB",
            ">weight<",
            ">unknown_kind<",
        ] {
            assert!(svg.contains(label), "missing {label}");
        }
        assert!(
            !svg.contains(">gradient<"),
            "legend lists only kinds present"
        );
    }

    #[test]
    fn arena_degenerate_inputs() {
        for svg in [
            arena_svg(&[], 0, 0, ""),
            arena_svg(
                &[rect("a", "weight", (5, 2), usize::MAX - 1, 10)],
                0,
                0,
                "x",
            ),
            arena_svg(&[rect("a", "weight", (0, u32::MAX), 0, 1)], 1, 1, "x"),
        ] {
            assert_well_formed(&svg);
        }
    }

    #[test]
    fn curves_picture() {
        let pts: Vec<EpochPoint> = (1..=20)
            .map(|e| EpochPoint {
                epoch: e,
                train_loss: 2.3 / e as f32,
                train_acc: 1.0 - 0.5 / e as f32,
                test_acc: Some(0.95 - 0.5 / e as f32),
            })
            .collect();
        let svg = curves_svg(&pts);
        assert_well_formed(&svg);
        assert_eq!(
            svg.matches("<path ").count(),
            3,
            "loss, train acc, test acc"
        );
        for label in [
            "training loss",
            "accuracy (%)",
            "epoch",
            ">test<",
            ">train<",
        ] {
            assert!(svg.contains(label), "missing {label}");
        }
        // No test set, a diverged epoch, a single epoch, none at all.
        let mut p = pts[..3].to_vec();
        p.iter_mut().for_each(|p| p.test_acc = None);
        p[1].train_loss = f32::NAN;
        p[2].train_loss = f32::INFINITY;
        for svg in [curves_svg(&p), curves_svg(&pts[..1]), curves_svg(&[])] {
            assert_well_formed(&svg);
        }
        assert!(!curves_svg(&p).contains(">test<"));
        assert!(curves_svg(&[]).contains("no data"));
    }

    /// A plausible step: forward, backward with recomputes, swaps, and a budget drop half way.
    fn sample_panel(n: u32, seed: u32, title: &str) -> TimelinePanel {
        let budget = 3 * 1024 * 1024;
        let mut points = Vec::new();
        let mut bytes: i64 = 600 * 1024;
        for eo in 0..n {
            let fwd = eo < n / 2;
            let h = eo
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                >> 7;
            let delta = (h % 90) as i64 * 1024;
            bytes += if fwd {
                delta - 30 * 1024 + seed as i64 * 12 * 1024
            } else {
                25 * 1024 - delta
            };
            bytes = bytes.clamp(256 * 1024, 4 * 1024 * 1024);
            let mark = match (h % 23, fwd) {
                (0, false) | (1, false) => Mark::Recompute,
                (2, true) => Mark::SwapOut,
                (3, false) => Mark::SwapIn,
                _ if eo == n * 3 / 4 => Mark::BudgetChange,
                _ => Mark::Normal,
            };
            points.push(TimelinePoint {
                eo,
                bytes: bytes as usize,
                label: format!("{}(layer{})", if fwd { "F" } else { "B" }, eo % 17),
                mark,
            });
        }
        TimelinePanel {
            title: title.into(),
            points,
            budgets: vec![(0, budget), (n * 3 / 4, budget * 3 / 4)],
        }
    }

    #[test]
    fn timeline_picture() {
        let one = vec![sample_panel(200, 1, "digits CNN, 3 MiB → 2.25 MiB")];
        let four: Vec<TimelinePanel> = (0..4)
            .map(|k| sample_panel(60 + 40 * k, k, &format!("plan {k} <&>")))
            .collect();
        for panels in [&one, &four] {
            let svg = timeline_svg(panels);
            assert_well_formed(&svg);
            for (m, class) in [
                (Mark::Recompute, "mark-recompute"),
                (Mark::SwapOut, "mark-swapout"),
                (Mark::SwapIn, "mark-swapin"),
                (Mark::BudgetChange, "mark-budget"),
            ] {
                let n: usize = panels
                    .iter()
                    .map(|p| p.points.iter().filter(|q| q.mark == m).count())
                    .sum();
                assert!(n > 0, "sample has {class}");
                assert_eq!(
                    svg.matches(&format!("class=\"{class}\"")).count(),
                    n,
                    "{class}"
                );
            }
            assert_eq!(svg.matches("class=\"budget\"").count(), panels.len());
            assert_eq!(svg.matches("class=\"panel\"").count(), panels.len());
            let n: usize = panels.iter().map(|p| p.points.len()).sum();
            assert_eq!(svg.matches("<rect class=\"hit\"").count(), n);
            for label in [
                "execution order",
                ">in use<",
                ">budget<",
                ">recompute<",
                ">swap out<",
            ] {
                assert!(svg.contains(label), "missing {label}");
            }
        }
        let svg = timeline_svg(&four);
        assert!(svg.contains("plan 0 &lt;&amp;&gt;"));
        // Tooltip of the first instruction.
        let q = &four[0].points[0];
        assert!(svg.contains(&format!(
            "<title>EO 0 F(layer0): {} ({} B)",
            human_bytes(q.bytes),
            q.bytes
        )));
        // Budget drop shows as a step: the path goes down (V) at the change.
        let d = svg.split("class=\"budget\" d=\"").nth(1).unwrap();
        assert_eq!(d[..d.find('"').unwrap()].matches('V').count(), 1);
    }

    #[test]
    fn timeline_degenerate_inputs() {
        let pt = |eo, bytes, mark| TimelinePoint {
            eo,
            bytes,
            label: "x".into(),
            mark,
        };
        let panel = |points, budgets| TimelinePanel {
            title: String::new(),
            points,
            budgets,
        };
        for svg in [
            timeline_svg(&[]),
            timeline_svg(&[panel(vec![], vec![])]),
            timeline_svg(&[panel(vec![], vec![(0, 100)])]),
            timeline_svg(&[panel(vec![pt(7, 0, Mark::SwapIn)], vec![])]),
            timeline_svg(&[panel(
                vec![
                    pt(3, usize::MAX, Mark::Normal),
                    pt(1, 5, Mark::Recompute),
                    pt(1, 9, Mark::Normal),
                ],
                vec![(9, 1), (0, 10), (u32::MAX, 2)],
            )]),
        ] {
            assert_well_formed(&svg);
        }
        let svg = timeline_svg(&[panel(vec![pt(0, 10, Mark::Normal)], vec![])]);
        assert!(!svg.contains("class=\"budget\""));
        assert!(!svg.contains(">budget<"), "no budget in the legend");
        assert!(timeline_svg(&[]).contains("no data"));
        // Over budget is shaded and counted.
        let svg = timeline_svg(&[panel(
            vec![pt(0, 10, Mark::Normal), pt(1, 30, Mark::Normal)],
            vec![(0, 20)],
        )]);
        assert_eq!(svg.matches("class=\"over\"").count(), 1);
        assert!(svg.contains("over budget ×1"));
    }

    #[test]
    fn helpers() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3 MiB");
        assert_eq!(nice_step(100.0, 10.0), 10.0);
        assert_eq!(nice_step(7.0, 12.0), 1.0);
        assert_eq!(num(0.30000000000000004), "0.3");
    }
}
