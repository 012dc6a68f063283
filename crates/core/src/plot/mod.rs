//! Line charts with no plotting dependency: series over a shared x axis on a left and a right y
//! axis, point markers (transitions, events) and a legend. A [`Chart`] is laid out once into a
//! list of [`Shape`]s, which [`Chart::svg`] writes as SVG and [`Chart::png`] rasterizes
//! (`raster`: lines, disks, triangles and the public-domain 8×8 bitmap font of `font8x8`,
//! encoded by the `png` crate). Generic on purpose: the simulator's Fig. 11-style plot and the
//! live run's timeline are both one chart.

mod raster;

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
    /// Colour, `#rrggbb`.
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
    /// Colour, `#rrggbb`.
    pub color: String,
    /// Triangle (true) or disk.
    pub triangle: bool,
}

/// A chart: title, axis labels, series and markers; the image is `width × height` pixels.
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

/// How text sits on its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The point is the text's start.
    Start,
    /// Its middle.
    Middle,
    /// Its end.
    End,
}

/// What a chart is drawn with (pixels; y grows downwards).
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A line through `points`, `width` pixels wide.
    Line {
        /// The vertices.
        points: Vec<(f64, f64)>,
        /// Colour.
        color: String,
        /// Stroke width.
        width: f64,
        /// Dashed (5 on, 4 off).
        dashed: bool,
    },
    /// A filled disk.
    Disk {
        /// Centre.
        at: (f64, f64),
        /// Radius.
        radius: f64,
        /// Colour.
        color: String,
    },
    /// A filled triangle.
    Triangle {
        /// Corners.
        corners: [(f64, f64); 3],
        /// Colour.
        color: String,
    },
    /// Text on its baseline, turned `rotate` degrees (0, 90 or -90).
    Text {
        /// Anchor point.
        at: (f64, f64),
        /// The text.
        text: String,
        /// How it sits on the point.
        anchor: Anchor,
        /// Degrees.
        rotate: i32,
    },
}

const MARGIN: (f64, f64, f64, f64) = (80.0, 80.0, 40.0, 110.0); // left, right, top, bottom
const BLACK: &str = "#000000";
const GRID: &str = "#dddddd";

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

fn line(points: Vec<(f64, f64)>, color: &str, width: f64, dashed: bool) -> Shape {
    Shape::Line { points, color: color.into(), width, dashed }
}

fn text(at: (f64, f64), text: &str, anchor: Anchor, rotate: i32) -> Shape {
    Shape::Text { at, text: text.into(), anchor, rotate }
}

/// A triangle pointing up, centred on `(x, y)`.
fn up_triangle(x: f64, y: f64, color: &str) -> Shape {
    Shape::Triangle { corners: [(x, y - 6.0), (x - 5.0, y + 3.0), (x + 5.0, y + 3.0)], color: color.into() }
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

    /// The chart laid out: frame, ticks, labels, series, markers, legend.
    pub fn shapes(&self) -> Vec<Shape> {
        let (l, r, t, b) = MARGIN;
        let (w, h) = (self.width - l - r, self.height - t - b);
        let [xr, yl, yr] = self.ranges();
        let px = |x: f64| l + (x - xr.0) / (xr.1 - xr.0) * w;
        let py = |y: f64, (lo, hi): (f64, f64)| t + h - (y - lo) / (hi - lo) * h;
        let mut out = vec![text((self.width / 2.0, 22.0), &self.title, Anchor::Middle, 0)];
        for y in ticks(yl.0, yl.1) {
            out.push(line(vec![(l, py(y, yl)), (l + w, py(y, yl))], GRID, 1.0, false));
            out.push(text((l - 6.0, py(y, yl) + 4.0), &label(y), Anchor::End, 0));
        }
        out.push(line(vec![(l, t), (l + w, t), (l + w, t + h), (l, t + h), (l, t)], BLACK, 1.0, false));
        for x in ticks(xr.0, xr.1) {
            out.push(line(vec![(px(x), t + h), (px(x), t + h + 5.0)], BLACK, 1.0, false));
            out.push(text((px(x), t + h + 18.0), &label(x), Anchor::Middle, 0));
        }
        if !self.right_label.is_empty() {
            for y in ticks(yr.0, yr.1) {
                out.push(line(vec![(l + w, py(y, yr)), (l + w + 5.0, py(y, yr))], BLACK, 1.0, false));
                out.push(text((l + w + 8.0, py(y, yr) + 4.0), &label(y), Anchor::Start, 0));
            }
            out.push(text((self.width - 18.0, t + h / 2.0), &self.right_label, Anchor::Middle, 90));
        }
        out.push(text((l + w / 2.0, t + h + 36.0), &self.x_label, Anchor::Middle, 0));
        out.push(text((20.0, t + h / 2.0), &self.left_label, Anchor::Middle, -90));
        for series in &self.series {
            let range = if series.axis == Axis::Left { yl } else { yr };
            for run in series.points.split(|p| !p.1.is_finite()).filter(|run| !run.is_empty()) {
                let pts = run.iter().map(|&(x, y)| (px(x), py(y, range))).collect();
                out.push(line(pts, &series.color, 1.5, series.dashed));
            }
        }
        for m in &self.markers {
            let (x, y) = (px(m.x), py(m.y, yl));
            out.push(if m.triangle {
                up_triangle(x, y, &m.color)
            } else {
                Shape::Disk { at: (x, y), radius: 4.0, color: m.color.clone() }
            });
        }
        self.legend(&mut out, t + h + 52.0);
        out
    }

    fn legend(&self, out: &mut Vec<Shape>, mut y: f64) {
        let mut x = MARGIN.0;
        let advance = |x: &mut f64, y: &mut f64, width: f64| {
            *x += width;
            if *x > self.width - 150.0 {
                *x = MARGIN.0;
                *y += 16.0;
            }
        };
        for series in &self.series {
            out.push(line(vec![(x, y), (x + 20.0, y)], &series.color, 2.0, series.dashed));
            out.push(text((x + 24.0, y + 4.0), &series.name, Anchor::Start, 0));
            advance(&mut x, &mut y, 34.0 + 8.0 * series.name.chars().count() as f64);
        }
        for (name, color, triangle) in &self.marker_legend {
            out.push(if *triangle {
                up_triangle(x + 6.0, y, color)
            } else {
                Shape::Disk { at: (x + 6.0, y), radius: 4.0, color: color.clone() }
            });
            out.push(text((x + 16.0, y + 4.0), name, Anchor::Start, 0));
            advance(&mut x, &mut y, 30.0 + 8.0 * name.chars().count() as f64);
        }
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="monospace" font-size="12">"#,
            self.width, self.height
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        for shape in self.shapes() {
            let _ = writeln!(s, "{}", svg_shape(&shape));
        }
        s + "</svg>\n"
    }

    /// The chart as a PNG image (RGB, 8 bits).
    pub fn png(&self) -> Vec<u8> {
        raster::render(self.width as u32, self.height as u32, &self.shapes())
    }
}

/// One shape as an SVG element.
fn svg_shape(shape: &Shape) -> String {
    match shape {
        Shape::Line { points, color, width, dashed } => {
            let pts: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let dash = if *dashed { r#" stroke-dasharray="5,4""# } else { "" };
            format!(
                r#"<polyline fill="none" stroke="{color}" stroke-width="{width}"{dash} points="{}"/>"#,
                pts.join(" ")
            )
        }
        Shape::Disk { at, radius, color } => {
            format!(r#"<circle cx="{:.1}" cy="{:.1}" r="{radius}" fill="{color}"/>"#, at.0, at.1)
        }
        Shape::Triangle { corners: [a, b, c], color } => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{color}"/>"#,
            a.0, a.1, b.0, b.1, c.0, c.1
        ),
        Shape::Text { at, text, anchor, rotate } => {
            let anchor = match anchor {
                Anchor::Start => "start",
                Anchor::Middle => "middle",
                Anchor::End => "end",
            };
            let place = if *rotate == 0 {
                format!(r#"x="{:.1}" y="{:.1}""#, at.0, at.1)
            } else {
                format!(r#"transform="translate({:.1},{:.1}) rotate({rotate})""#, at.0, at.1)
            };
            format!(r#"<text {place} text-anchor="{anchor}">{}</text>"#, escape(text))
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

    fn chart() -> Chart {
        let mut c = Chart::new("t <1>", "step", "seconds", "tokens");
        let points = vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0), (3.0, 2.0)];
        c.series.push(Series { name: "a".into(), color: "#ff0000".into(), axis: Axis::Left, dashed: false, points });
        let points = vec![(0.0, 100.0), (3.0, 800.0)];
        c.series.push(Series { name: "len".into(), color: "#808080".into(), axis: Axis::Right, dashed: true, points });
        c.markers.push(Marker { x: 2.0, y: 3.0, color: "#0000ff".into(), triangle: true });
        c
    }

    #[test]
    fn a_chart_draws_every_series_marker_and_axis() {
        let svg = chart().svg();
        // The NaN splits the first series in two; the second is one line; the legend adds two.
        assert_eq!(svg.matches(r#"stroke-width="1.5""#).count(), 3);
        assert_eq!(svg.matches(r#"stroke-width="2""#).count(), 2);
        assert_eq!(svg.matches("<polygon").count(), 1);
        assert!(svg.contains("t &lt;1&gt;") && svg.contains("rotate(90)") && svg.contains(">800<"));
    }

    #[test]
    fn the_png_has_the_charts_pixels() {
        let png = chart().png();
        assert_eq!(&png[1..4], b"PNG");
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1000, 480));
        let pixels: Vec<&[u8]> = buf.chunks(3).collect();
        let count = |rgb: [u8; 3]| pixels.iter().filter(|p| **p == rgb).count();
        // White ground, the red series, the blue marker, black frame and text.
        assert!(count([255, 255, 255]) > 400_000);
        assert!(count([255, 0, 0]) > 300 && count([0, 0, 255]) > 20 && count([0, 0, 0]) > 2000);
    }
}
