//! Standalone SVG pictures, written by hand (no plotting dependency):
//! - [`arena_svg`]: where each tensor lives in the arena over the execution order (x = execution
//!   order, y = byte address, 0 at the bottom), like Fig. 6 of the Melon paper;
//! - [`curves_svg`]: training loss and accuracy per epoch.
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
