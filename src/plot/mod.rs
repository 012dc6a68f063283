//! Line charts written by hand, with no plotting dependency: series over a shared x axis on a
//! left and a right y axis, point markers (transitions, events) and a legend, rendered to SVG.
//! Generic on purpose: the simulator's Fig. 11-style plot and the live run's timeline are both
//! one [`Chart`].

use std::fmt::Write as _;

/// Which y axis a series is read against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// The left axis.
    Left,
    /// The right axis.
    Right,
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// CSS colour.
    pub color: String,
    /// The axis it is read against.
    pub axis: Axis,
    /// Drawn dashed (context, e.g. length and pool, against solid measurements).
    pub dashed: bool,
    /// `(x, y)` in x order; non-finite `y` breaks the line.
    pub points: Vec<(f64, f64)>,
}

/// A marked point on a series (a transition): drawn as a small filled shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// Where.
    pub x: f64,
    /// Its value on the left axis.
    pub y: f64,
    /// CSS colour.
    pub color: String,
    /// Triangle (true) or circle.
    pub triangle: bool,
}

/// A chart: title, axis labels, series and markers; the SVG is `width × height` pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the left axis.
    pub left_label: String,
    /// Label of the right axis (empty: no right axis).
    pub right_label: String,
    /// Lines.
    pub series: Vec<Series>,
    /// Marks.
    pub markers: Vec<Marker>,
    /// Legend entries for marker kinds: `(text, colour, triangle)`.
    pub marker_legend: Vec<(String, String, bool)>,
    /// Width, pixels.
    pub width: f64,
    /// Height, pixels.
    pub height: f64,
}

const MARGIN: (f64, f64, f64, f64) = (80.0, 80.0, 40.0, 110.0); // left, right, top, bottom

/// `[lo, hi]` of finite values, widened when flat, starting at 0 when all are positive.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let lo = if lo >= 0.0 { 0.0 } else { lo };
    if hi - lo < 1e-12 {
        (lo, lo + 1.0)
    } else {
        (lo, hi * 1.05)
    }
}

/// Round tick values covering `[lo, hi]` (about five).
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..=20).map(|k| first + k as f64 * step).take_while(|t| *t <= hi + 1e-9 * step).collect()
}

/// A tick label: integers plainly, the rest with the digits they need.
pub fn label(v: f64) -> String {
    if v.abs() >= 1000.0 || v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Chart {
    /// An empty chart of the usual size.
    pub fn new(title: &str, x_label: &str, left_label: &str, right_label: &str) -> Chart {
        Chart {
            title: title.into(),
            x_label: x_label.into(),
            left_label: left_label.into(),
            right_label: right_label.into(),
            series: Vec::new(),
            markers: Vec::new(),
            marker_legend: Vec::new(),
            width: 1000.0,
            height: 480.0,
        }
    }

    fn ranges(&self) -> [(f64, f64); 3] {
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
        let x = if x0.is_finite() && x1 > x0 { (x0, x1) } else { (0.0, 1.0) };
        let on = |axis: Axis| {
            let ys = self.series.iter().filter(move |s| s.axis == axis).flat_map(|s| s.points.iter().map(|p| p.1));
            let marks = self.markers.iter().filter(move |_| axis == Axis::Left).map(|m| m.y);
            range(ys.chain(marks))
        };
        [x, on(Axis::Left), on(Axis::Right)]
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let (l, r, t, b) = MARGIN;
        let (w, h) = (self.width - l - r, self.height - t - b);
        let [xr, yl, yr] = self.ranges();
        let px = |x: f64| l + (x - xr.0) / (xr.1 - xr.0) * w;
        let py = |y: f64, (lo, hi): (f64, f64)| t + h - (y - lo) / (hi - lo) * h;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">"#,
            self.width, self.height
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            self.width / 2.0,
            escape(&self.title)
        );
        let _ = writeln!(s, r#"<rect x="{l}" y="{t}" width="{w}" height="{h}" fill="none" stroke="black"/>"#);
        for x in ticks(xr.0, xr.1) {
            let _ = writeln!(
                s,
                r#"<line x1="{0}" x2="{0}" y1="{1}" y2="{2}" stroke="black"/><text x="{0}" y="{3}" text-anchor="middle">{4}</text>"#,
                px(x),
                t + h,
                t + h + 5.0,
                t + h + 18.0,
                label(x)
            );
        }
        for y in ticks(yl.0, yl.1) {
            let _ = writeln!(
                s,
                r##"<line x1="{l}" x2="{0}" y1="{1}" y2="{1}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
                l + w,
                py(y, yl),
                l - 6.0,
                py(y, yl) + 4.0,
                label(y)
            );
        }
        if !self.right_label.is_empty() {
            for y in ticks(yr.0, yr.1) {
                let _ = writeln!(
                    s,
                    r#"<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="black"/><text x="{3}" y="{4}">{5}</text>"#,
                    l + w,
                    l + w + 5.0,
                    py(y, yr),
                    l + w + 8.0,
                    py(y, yr) + 4.0,
                    label(y)
                );
            }
            let _ = writeln!(
                s,
                r#"<text transform="translate({},{}) rotate(90)" text-anchor="middle">{}</text>"#,
                self.width - 18.0,
                t + h / 2.0,
                escape(&self.right_label)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            l + w / 2.0,
            t + h + 36.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(20,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            t + h / 2.0,
            escape(&self.left_label)
        );
        for series in &self.series {
            let range = if series.axis == Axis::Left { yl } else { yr };
            let dash = if series.dashed { r#" stroke-dasharray="5,4""# } else { "" };
            for run in series.points.split(|p| !p.1.is_finite()).filter(|run| !run.is_empty()) {
                let pts: Vec<String> = run.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y, range))).collect();
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"/>"#,
                    series.color,
                    pts.join(" ")
                );
            }
        }
        for m in &self.markers {
            let (x, y) = (px(m.x), py(m.y, yl));
            let _ = if m.triangle {
                writeln!(
                    s,
                    r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{}"/>"#,
                    x,
                    y - 6.0,
                    x - 5.0,
                    y + 3.0,
                    x + 5.0,
                    y + 3.0,
                    m.color
                )
            } else {
                writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{}"/>"#, m.color)
            };
        }
        self.legend(&mut s, l, t + h + 52.0);
        s + "</svg>\n"
    }

    fn legend(&self, s: &mut String, mut x: f64, mut y: f64) {
        for series in &self.series {
            let dash = if series.dashed { r#" stroke-dasharray="5,4""# } else { "" };
            let _ = writeln!(
                s,
                r#"<line x1="{x}" x2="{}" y1="{y}" y2="{y}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
                x + 20.0,
                series.color,
                x + 24.0,
                y + 4.0,
                escape(&series.name)
            );
            x += 34.0 + 7.0 * series.name.chars().count() as f64;
            if x > self.width - 150.0 {
                x = MARGIN.0;
                y += 16.0;
            }
        }
        for (text, color, triangle) in &self.marker_legend {
            let shape = if *triangle {
                format!(
                    r#"<polygon points="{},{} {},{} {},{}" fill="{color}"/>"#,
                    x + 6.0,
                    y - 6.0,
                    x + 1.0,
                    y + 3.0,
                    x + 11.0,
                    y + 3.0
                )
            } else {
                format!(r#"<circle cx="{}" cy="{y}" r="4" fill="{color}"/>"#, x + 6.0)
            };
            let _ = writeln!(s, r#"{shape}<text x="{}" y="{}">{}</text>"#, x + 16.0, y + 4.0, escape(text));
            x += 30.0 + 7.0 * text.chars().count() as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 1050.0), vec![0.0, 500.0, 1000.0]);
        assert_eq!(label(2.0), "2");
        assert_eq!(label(0.25), "0.25");
    }

    #[test]
    fn a_chart_draws_every_series_marker_and_axis() {
        let mut c = Chart::new("t <1>", "step", "seconds", "tokens");
        c.series.push(Series {
            name: "a".into(),
            color: "red".into(),
            axis: Axis::Left,
            dashed: false,
            points: vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0), (3.0, 2.0)],
        });
        c.series.push(Series {
            name: "len".into(),
            color: "gray".into(),
            axis: Axis::Right,
            dashed: true,
            points: vec![(0.0, 100.0), (3.0, 800.0)],
        });
        c.markers.push(Marker { x: 2.0, y: 3.0, color: "blue".into(), triangle: true });
        let svg = c.svg();
        // The NaN splits the first series in two; the second is one line.
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("<polygon").count(), 1);
        assert!(svg.contains("t &lt;1&gt;") && svg.contains("rotate(90)") && svg.contains(">800<"));
    }
}
