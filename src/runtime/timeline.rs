//! The run at a glance (rank 0): a summary table at the end of `nereus train` and
//! `<output_dir>/timeline.svg` — step latency, response length and pool size per step, every
//! transition marked (urgent red, opportunistic blue).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

/// One step as the timeline shows it.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    step: u64,
    seconds: f64,
    response_len: f64,
    pool: u32,
    tokens: u64,
    /// `urgent` or `opportunistic` when a transition followed the step.
    transition: Option<String>,
    transition_seconds: f64,
}

/// The steps of this run.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    points: Vec<Point>,
}

/// One panel of the plot: its title and the value it shows per step.
type Panel = (&'static str, fn(&Point) -> f64);

/// Plot size and margins, pixels.
const WIDTH: f64 = 900.0;
const PANEL: f64 = 150.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 30.0;

impl Timeline {
    /// Adds a step: its seconds, mean response length, tokens generated, the pool, and the
    /// transition record that followed it (`null` if none).
    pub fn push(&mut self, step: u64, seconds: f64, response_len: f64, tokens: u64, pool: u32, transition: &Value) {
        let kind = (!transition.is_null()).then(|| transition["kind"].as_str().unwrap_or("transition").to_string());
        self.points.push(Point {
            step,
            seconds,
            response_len,
            pool,
            tokens,
            transition: kind,
            transition_seconds: transition["seconds"].as_f64().unwrap_or(0.0),
        });
    }

    /// Steps, transitions by kind, seconds in transitions, whole-run tokens per second.
    pub fn summary(&self) -> String {
        let steps = self.points.len();
        let count = |k: &str| self.points.iter().filter(|p| p.transition.as_deref() == Some(k)).count();
        let in_transitions: f64 = self.points.iter().map(|p| p.transition_seconds).sum();
        let wall: f64 = self.points.iter().map(|p| p.seconds).sum::<f64>() + in_transitions;
        let tokens: u64 = self.points.iter().map(|p| p.tokens).sum();
        let mut out = String::new();
        let _ = writeln!(out, "{:<32} {:>12}", "steps", steps);
        let _ = writeln!(out, "{:<32} {:>12}", "transitions (urgent)", count("urgent"));
        let _ = writeln!(out, "{:<32} {:>12}", "transitions (opportunistic)", count("opportunistic"));
        let _ = writeln!(out, "{:<32} {:>12.3}", "seconds in transitions", in_transitions);
        let _ = writeln!(out, "{:<32} {:>12.3}", "seconds in steps and transitions", wall);
        let _ = write!(out, "{:<32} {:>12.0}", "tokens/s over the run", tokens as f64 / wall.max(1e-9));
        out
    }

    /// Writes the timeline as SVG.
    pub fn write_svg(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.svg())
    }

    fn svg(&self) -> String {
        let panels: [Panel; 3] = [
            ("step seconds", |p| p.seconds),
            ("mean response length (tokens)", |p| p.response_len),
            ("pool (ranks)", |p| f64::from(p.pool)),
        ];
        let height = TOP + panels.len() as f64 * (PANEL + 40.0) + 20.0;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let (first, last) = match (self.points.first(), self.points.last()) {
            (Some(f), Some(l)) => (f.step as f64, (l.step as f64).max(f.step as f64 + 1.0)),
            _ => return s + "</svg>\n",
        };
        let x = |step: f64| LEFT + (step - first) / (last - first) * (WIDTH - LEFT - 20.0);
        for (k, (title, value)) in panels.iter().enumerate() {
            let top = TOP + k as f64 * (PANEL + 40.0);
            let values: Vec<f64> = self.points.iter().map(*value).collect();
            let hi = values.iter().copied().fold(f64::MIN, f64::max).max(1e-9) * 1.05;
            let y = |v: f64| top + PANEL - v / hi * PANEL;
            let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"{}\" font-weight=\"bold\">{title}</text>", top - 8.0);
            let _ = writeln!(
                s,
                "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{}\" height=\"{PANEL}\" fill=\"none\" stroke=\"#888\"/>",
                WIDTH - LEFT - 20.0
            );
            let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{hi:.3}</text>", LEFT - 4.0, top + 10.0);
            let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>", LEFT - 4.0, top + PANEL);
            for p in self.points.iter().filter(|p| p.transition.is_some()) {
                let colour = if p.transition.as_deref() == Some("urgent") { "#d62728" } else { "#1f77b4" };
                let tx = x(p.step as f64 + 0.5);
                let _ = writeln!(
                    s,
                    "<line x1=\"{tx:.1}\" y1=\"{top}\" x2=\"{tx:.1}\" y2=\"{}\" stroke=\"{colour}\" stroke-dasharray=\"4 3\"/>",
                    top + PANEL
                );
            }
            let path: Vec<String> =
                self.points.iter().zip(&values).map(|(p, v)| format!("{:.1},{:.1}", x(p.step as f64), y(*v))).collect();
            let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"black\" points=\"{}\"/>", path.join(" "));
        }
        let bottom = TOP + panels.len() as f64 * (PANEL + 40.0) - 25.0;
        let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"{bottom}\">step {first}</text>");
        let _ = writeln!(s, "<text x=\"{}\" y=\"{bottom}\" text-anchor=\"end\">step {last}</text>", WIDTH - 20.0);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">dashed: transitions after a step (red urgent, blue opportunistic)</text>",
            WIDTH / 2.0,
            bottom + 15.0
        );
        s + "</svg>\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_summary_counts_transitions_and_tokens_over_steps_and_transitions() {
        let mut t = Timeline::default();
        t.push(0, 1.0, 4.0, 100, 8, &Value::Null);
        t.push(1, 1.0, 6.0, 100, 8, &json!({"kind": "urgent", "seconds": 0.5}));
        t.push(2, 1.5, 9.0, 200, 8, &json!({"kind": "opportunistic", "seconds": 0.5}));
        let s = t.summary();
        assert!(s.contains("transitions (urgent)                        1"), "{s}");
        assert!(s.contains("transitions (opportunistic)                 1"), "{s}");
        // 400 tokens over 3.5 s of steps and 1 s of transitions.
        assert!(s.ends_with(&format!("{:>12.0}", 400.0 / 4.5)), "{s}");
        let svg = t.svg();
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("#d62728").count(), 3, "one urgent mark per panel");
        assert_eq!(svg.matches("#1f77b4").count(), 3);
    }
}
