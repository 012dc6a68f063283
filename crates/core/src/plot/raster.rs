//! A small rasterizer for [`Shape`]s: RGB pixels, lines stamped with a square pen (dashes
//! measured along the line), filled disks and triangles, and text from the public-domain 8×8
//! bitmap font of `font8x8` (basic Latin, Latin-1 and Greek; anything else a `?`), turned by
//! ±90° for vertical labels; encoded as PNG by the `png` crate.

use font8x8::{UnicodeFonts, BASIC_FONTS, GREEK_FONTS, LATIN_FONTS};

use super::{Anchor, Shape};

/// Pixels of one glyph cell.
const GLYPH: i64 = 8;

/// An RGB image being drawn.
struct Canvas {
    width: i64,
    height: i64,
    pixels: Vec<u8>,
}

/// `#rrggbb` as RGB (black for anything else).
fn rgb(color: &str) -> [u8; 3] {
    let hex = color.strip_prefix('#').filter(|h| h.len() == 6);
    let channel = |k: usize| hex.and_then(|h| u8::from_str_radix(&h[2 * k..2 * k + 2], 16).ok()).unwrap_or(0);
    [channel(0), channel(1), channel(2)]
}

impl Canvas {
    fn new(width: u32, height: u32) -> Canvas {
        Canvas { width: width.into(), height: height.into(), pixels: vec![255; width as usize * height as usize * 3] }
    }

    fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if (0..self.width).contains(&x) && (0..self.height).contains(&y) {
            let k = 3 * (y * self.width + x) as usize;
            self.pixels[k..k + 3].copy_from_slice(&color);
        }
    }

    /// A polyline with a square pen of `width` pixels; dashes of 5 on and 4 off.
    fn line(&mut self, points: &[(f64, f64)], width: f64, dashed: bool, color: [u8; 3]) {
        let pen = width.round().max(1.0) as i64;
        let mut walked = 0.0;
        for pair in points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            let length = ((x1 - x0).powi(2) + (y1 - y0).powi(2)).sqrt();
            let samples = (length * 2.0).ceil().max(1.0) as usize;
            for k in 0..=samples {
                let f = k as f64 / samples as f64;
                if dashed && (walked + f * length) % 9.0 >= 5.0 {
                    continue;
                }
                let (x, y) = ((x0 + f * (x1 - x0)).round() as i64, (y0 + f * (y1 - y0)).round() as i64);
                for dx in 0..pen {
                    for dy in 0..pen {
                        self.set(x + dx - pen / 2, y + dy - pen / 2, color);
                    }
                }
            }
            walked += length;
        }
    }

    fn disk(&mut self, (cx, cy): (f64, f64), radius: f64, color: [u8; 3]) {
        let r = radius.ceil() as i64;
        for dy in -r..=r {
            for dx in -r..=r {
                if ((dx * dx + dy * dy) as f64) <= radius * radius {
                    self.set(cx.round() as i64 + dx, cy.round() as i64 + dy, color);
                }
            }
        }
    }

    fn triangle(&mut self, [a, b, c]: [(f64, f64); 3], color: [u8; 3]) {
        let cross = |p: (f64, f64), q: (f64, f64), r: (f64, f64)| (q.0 - p.0) * (r.1 - p.1) - (q.1 - p.1) * (r.0 - p.0);
        let (x0, x1) = (a.0.min(b.0).min(c.0).floor() as i64, a.0.max(b.0).max(c.0).ceil() as i64);
        let (y0, y1) = (a.1.min(b.1).min(c.1).floor() as i64, a.1.max(b.1).max(c.1).ceil() as i64);
        for y in y0..=y1 {
            for x in x0..=x1 {
                let p = (x as f64, y as f64);
                let (d1, d2, d3) = (cross(a, b, p), cross(b, c, p), cross(c, a, p));
                let inside = (d1 >= 0.0 && d2 >= 0.0 && d3 >= 0.0) || (d1 <= 0.0 && d2 <= 0.0 && d3 <= 0.0);
                if inside {
                    self.set(x, y, color);
                }
            }
        }
    }

    /// Text on its baseline at `at`, turned `rotate` degrees (0, 90 clockwise, -90).
    fn text(&mut self, at: (f64, f64), text: &str, anchor: Anchor, rotate: i32) {
        let glyphs: Vec<[u8; 8]> = text.chars().map(glyph).collect();
        let length = GLYPH * glyphs.len() as i64;
        let start = match anchor {
            Anchor::Start => 0,
            Anchor::Middle => -length / 2,
            Anchor::End => -length,
        };
        let (ax, ay) = (at.0.round() as i64, at.1.round() as i64);
        for (k, rows) in glyphs.iter().enumerate() {
            for (row, bits) in rows.iter().enumerate() {
                for col in 0..GLYPH {
                    if bits & (1 << col) == 0 {
                        continue;
                    }
                    // Along the text u, across it v (the baseline at v = 0, glyphs above it).
                    let (u, v) = (start + GLYPH * k as i64 + col, row as i64 - GLYPH + 1);
                    let (x, y) = match rotate {
                        90 => (ax - v, ay + u),
                        -90 => (ax + v, ay - u),
                        _ => (ax + u, ay + v),
                    };
                    self.set(x, y, [0, 0, 0]);
                }
            }
        }
    }
}

/// The 8×8 bitmap of `c` (rows top down, bit 0 the leftmost pixel).
fn glyph(c: char) -> [u8; 8] {
    BASIC_FONTS
        .get(c)
        .or_else(|| LATIN_FONTS.get(c))
        .or_else(|| GREEK_FONTS.get(c))
        .or_else(|| BASIC_FONTS.get('?'))
        .unwrap_or([0; 8])
}

/// `shapes` drawn on a white `width × height` canvas, as PNG bytes.
pub fn render(width: u32, height: u32, shapes: &[Shape]) -> Vec<u8> {
    let mut canvas = Canvas::new(width, height);
    for shape in shapes {
        match shape {
            Shape::Line { points, color, width, dashed } => canvas.line(points, *width, *dashed, rgb(color)),
            Shape::Disk { at, radius, color } => canvas.disk(*at, *radius, rgb(color)),
            Shape::Triangle { corners, color } => canvas.triangle(*corners, rgb(color)),
            Shape::Text { at, text, anchor, rotate } => canvas.text(*at, text, *anchor, *rotate),
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Writing into memory cannot fail; the header and data sizes agree by construction.
    let mut writer = encoder.write_header().expect("PNG header into memory");
    writer.write_image_data(&canvas.pixels).expect("PNG data into memory");
    writer.finish().expect("PNG end into memory");
    out
}
