//! The simulator's plot in the style of the paper's Fig. 11: step latency per policy over the
//! steps, every transition marked (urgent: triangle, opportunistic: circle, in the policy's
//! colour), the mean response length and the pool dashed on the right axis.

use crate::policy::TransitionKind;

use super::run::SimStep;
use crate::plot::{Axis, Chart, Marker, Series};

/// Colours of the policies' lines, in the order runs are given.
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// The chart of `runs` (each a policy's steps, labelled by the policy and γ) over one trace.
pub fn chart(title: &str, runs: &[(String, Vec<SimStep>)]) -> Chart {
    let mut c = Chart::new(title, "step", "step latency (s)", "response tokens (mean) / GPUs");
    for (k, (name, steps)) in runs.iter().enumerate() {
        let color = COLORS[k % COLORS.len()].to_string();
        let points = steps.iter().map(|s| (s.step as f64, if s.step_s > 0.0 { s.step_s } else { f64::NAN })).collect();
        c.series.push(Series { name: name.clone(), color: color.clone(), axis: Axis::Left, dashed: false, points });
        for s in steps.iter().filter(|s| s.restart_s > 0.0) {
            c.markers.push(Marker { x: s.step as f64, y: s.step_s, color: "#000000".into(), triangle: false });
        }
        for (s, t) in steps.iter().filter_map(|s| Some((s, s.transition?))) {
            let triangle = t.kind == TransitionKind::Urgent;
            c.markers.push(Marker { x: s.step as f64, y: s.step_s, color: color.clone(), triangle });
        }
    }
    if let Some((_, steps)) = runs.first() {
        let line = |f: fn(&SimStep) -> f64| steps.iter().map(|s| (s.step as f64, f(s))).collect();
        c.series.push(Series {
            name: "length".into(),
            color: "#555555".into(),
            axis: Axis::Right,
            dashed: true,
            points: line(|s| s.seq_len_mean),
        });
        // The pool, scaled by a power of ten to read against the lengths.
        let longest = steps.iter().map(|s| s.seq_len_mean).fold(1.0, f64::max);
        let most = steps.iter().map(|s| f64::from(s.gpus)).fold(1.0, f64::max);
        let scale = 10f64.powf((longest / most / 2.0).log10().floor().max(0.0));
        let points = steps.iter().map(|s| (s.step as f64, f64::from(s.gpus) * scale)).collect();
        let name = if scale > 1.0 { format!("GPUs ×{scale}") } else { "GPUs".into() };
        c.series.push(Series { name, color: "#000000".into(), axis: Axis::Right, dashed: true, points });
    }
    c.marker_legend.push(("urgent".into(), "#444444".into(), true));
    c.marker_legend.push(("opportunistic".into(), "#444444".into(), false));
    c.marker_legend.push(("checkpoint/restart".into(), "#000000".into(), false));
    c
}
