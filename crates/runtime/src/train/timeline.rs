//! The run at a glance (rank 0): a summary table at the end of `nereus train` and
//! `<output_dir>/timeline.svg` and `.png` — measured and predicted step seconds, mean response
//! length and pool size per step, every transition marked (urgent red triangles, opportunistic
//! green disks). One [`Chart`], written both ways.

use std::fmt::Write as _;
use std::path::Path;

use nereus_core::record::TransitionRecord;

use nereus_core::plot::{Axis, Chart, Marker, Series};

/// One step as the timeline shows it.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    step: u64,
    seconds: f64,
    predicted_seconds: f64,
    response_len: f64,
    pool: u32,
    tokens: u64,
    /// `urgent` or `opportunistic` when a transition followed the step.
    transition: Option<&'static str>,
    transition_seconds: f64,
}

/// The steps of this run.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    points: Vec<Point>,
}

/// Transition marks: urgent, opportunistic.
const URGENT: &str = "#d62728";
const OPPORTUNISTIC: &str = "#2ca02c";

impl Timeline {
    /// Adds a step: its measured and predicted seconds, mean response length, tokens
    /// generated, the pool, and the transition record that followed it (`null` if none).
    pub fn push(
        &mut self,
        step: u64,
        seconds: (f64, f64),
        response_len: f64,
        tokens: u64,
        pool: u32,
        transition: Option<&TransitionRecord>,
    ) {
        let kind = transition.map(|t| t.kind.map_or("transition", |k| k.name()));
        self.points.push(Point {
            step,
            seconds: seconds.0,
            predicted_seconds: seconds.1,
            response_len,
            pool,
            tokens,
            transition: kind,
            transition_seconds: transition.map_or(0.0, |t| t.seconds),
        });
    }

    /// Steps, transitions by kind, seconds in transitions, whole-run tokens per second.
    pub fn summary(&self) -> String {
        let steps = self.points.len();
        let count = |k: &str| self.points.iter().filter(|p| p.transition == Some(k)).count();
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

    /// Writes the timeline as `<stem>.svg` and `<stem>.png` in `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> std::io::Result<()> {
        let chart = self.chart();
        std::fs::write(dir.join(format!("{stem}.svg")), chart.svg())?;
        std::fs::write(dir.join(format!("{stem}.png")), chart.png())
    }

    /// Step seconds (measured, predicted) on the left; length and pool on the right; a mark
    /// on the measured line at every step a transition followed.
    fn chart(&self) -> Chart {
        let mut c =
            Chart::new("nereus train: the run", "step", "step seconds", "response tokens (mean) / ranks in the pool");
        let line = |name: &str, color: &str, axis, dashed, value: fn(&Point) -> f64| Series {
            name: name.into(),
            color: color.into(),
            axis,
            dashed,
            points: self.points.iter().map(|p| (p.step as f64, value(p))).collect(),
        };
        c.series.push(line("measured step seconds", "#000000", Axis::Left, false, |p| p.seconds));
        c.series.push(line("predicted step seconds", "#7f7f7f", Axis::Left, true, |p| p.predicted_seconds));
        c.series.push(line("mean response length", "#1f77b4", Axis::Right, true, |p| p.response_len));
        c.series.push(line("pool", "#ff7f0e", Axis::Right, true, |p| f64::from(p.pool)));
        for p in self.points.iter().filter(|p| p.transition.is_some()) {
            let urgent = p.transition == Some("urgent");
            let color = if urgent { URGENT } else { OPPORTUNISTIC };
            c.markers.push(Marker { x: p.step as f64, y: p.seconds, color: color.into(), triangle: urgent });
        }
        c.marker_legend.push(("urgent transition".into(), URGENT.into(), true));
        c.marker_legend.push(("opportunistic transition".into(), OPPORTUNISTIC.into(), false));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereus_core::policy::TransitionKind;

    fn transition(kind: TransitionKind, seconds: f64) -> TransitionRecord {
        TransitionRecord {
            kind: Some(kind),
            seconds,
            predicted_seconds: seconds,
            bytes: 0,
            staged_bytes: 0,
            primitives: 1,
            from: String::new(),
            to: String::new(),
            digests_before: Default::default(),
            digests_after: Default::default(),
        }
    }

    #[test]
    fn the_summary_counts_transitions_and_tokens_over_steps_and_transitions() {
        let mut t = Timeline::default();
        t.push(0, (1.0, 0.9), 4.0, 100, 8, None);
        t.push(1, (1.0, 0.9), 6.0, 100, 8, Some(&transition(TransitionKind::Urgent, 0.5)));
        t.push(2, (1.5, 1.2), 9.0, 200, 8, Some(&transition(TransitionKind::Opportunistic, 0.5)));
        let s = t.summary();
        assert!(s.contains("transitions (urgent)                        1"), "{s}");
        assert!(s.contains("transitions (opportunistic)                 1"), "{s}");
        // 400 tokens over 3.5 s of steps and 1 s of transitions.
        assert!(s.ends_with(&format!("{:>12.0}", 400.0 / 4.5)), "{s}");
        let chart = t.chart();
        assert_eq!(chart.series.len(), 4);
        assert_eq!(chart.series[1].points, [(0.0, 0.9), (1.0, 0.9), (2.0, 1.2)]);
        let marks: Vec<(f64, bool)> = chart.markers.iter().map(|m| (m.x, m.triangle)).collect();
        assert_eq!(marks, [(1.0, true), (2.0, false)], "an urgent triangle after step 1, a disk after step 2");
        assert!(chart.png().starts_with(b"\x89PNG"));
    }
}
