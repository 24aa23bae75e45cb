//! The demo's timeline as a PNG: rates, consumer lag, RSS against the budget, and checkpoint
//! durations over time, with the API's latency phases shaded.

use plotters::prelude::*;
use std::path::Path;

/// One second of the demo.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t_s: f64,
    /// The API's latency phase (index).
    pub phase: usize,
    /// Records per second into the job (source).
    pub in_rate: f64,
    /// Records per second the API counted (window results' counts).
    pub sink_rate: f64,
    /// Records produced per second into Kafka.
    pub produce_rate: f64,
    /// Consumer lag, records (all partitions).
    pub lag: u64,
    /// Resident set size, MiB.
    pub rss_mib: f64,
    /// Duration of the last checkpoint completed in this second, ms.
    pub checkpoint_ms: Option<f64>,
}

/// One line of a panel: its name, colour, and its value in a sample (if any).
type Series<'a> = (&'a str, RGBColor, &'a dyn Fn(&Sample) -> Option<f64>);

/// Where the font comes from (Debian's fonts-dejavu-core, installed by .ci/setup).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT)
            .map_err(|e| format!("cannot read the font {FONT}: {e} (install fonts-dejavu-core: bash .ci/setup)"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a usable font"))
    })
    .clone()
}

/// One latency phase of the API: its label, start and end (s), and its latency (ms).
pub type Phase = (String, f64, f64, f64);

/// The shade of a phase by its latency among the run's: the fastest green, the slowest red,
/// any between orange — so a recovery at 2 ms is green again, whatever came before.
fn shade_of(latency_ms: f64, phases: &[Phase]) -> RGBColor {
    let (lo, hi) = phases.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.3), hi.max(p.3)));
    if latency_ms <= lo {
        RGBColor(235, 245, 235)
    } else if latency_ms >= hi {
        RGBColor(255, 228, 225)
    } else {
        RGBColor(255, 245, 225)
    }
}

/// Draw the timeline into `path` (PNG, 1200 × 1000), with the API's latency `phases`
/// shaded by latency; `budget_mib` is drawn as a line in the RSS panel.
pub fn timeline(path: &Path, samples: &[Sample], phases: &[Phase], budget_mib: f64) -> Result<(), String> {
    register_font()?;
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let root = BitMapBackend::new(path, (1200, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let t_end = samples.last().map_or(1.0, |s| s.t_s).max(phases.last().map_or(1.0, |p| p.2)).max(1.0);
    let panels = root.split_evenly((4, 1));

    let max = |f: &dyn Fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max).max(1.0) * 1.1;
    let draw = |area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
                title: &str,
                y_label: &str,
                y_max: f64,
                series: &[Series<'_>],
                hline: Option<(&str, f64)>|
     -> Result<(), String> {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_end, 0.0..y_max)
            .map_err(|x| e(&x))?;
        chart.configure_mesh().x_desc("seconds").y_desc(y_label).light_line_style(WHITE).draw().map_err(|x| e(&x))?;
        for (label, a, b, latency) in phases {
            let c = shade_of(*latency, phases);
            chart
                .draw_series(std::iter::once(Rectangle::new([(*a, 0.0), (*b, y_max)], c.filled())))
                .map_err(|x| e(&x))?;
            chart
                .draw_series(std::iter::once(Text::new(label.clone(), (*a + 0.3, y_max * 0.93), ("sans-serif", 13))))
                .map_err(|x| e(&x))?;
        }
        for (name, color, f) in series {
            let points: Vec<(f64, f64)> = samples.iter().filter_map(|s| f(s).map(|v| (s.t_s, v))).collect();
            let color = *color;
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        if let Some((name, y)) = hline {
            chart
                .draw_series(LineSeries::new([(0.0, y), (t_end, y)], BLACK.stroke_width(1)))
                .map_err(|x| e(&x))?
                .label(name)
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))
    };
    let rate_max = max(&|s| s.in_rate.max(s.sink_rate).max(s.produce_rate));
    draw(
        &panels[0],
        "records per second: produced into Kafka, read by the job, counted at the API",
        "records/s",
        rate_max,
        &[
            ("produced", RGBColor(120, 120, 120), &|s| Some(s.produce_rate)),
            ("job input", BLUE, &|s| Some(s.in_rate)),
            ("at the API", RGBColor(0, 150, 0), &|s| Some(s.sink_rate)),
        ],
        None,
    )?;
    draw(
        &panels[1],
        "consumer lag: the records waiting in Kafka (not in the job's heap)",
        "records",
        max(&|s| s.lag as f64),
        &[("lag", RED, &|s| Some(s.lag as f64))],
        None,
    )?;
    draw(
        &panels[2],
        "resident memory against the declared budget",
        "MiB",
        max(&|s| s.rss_mib).max(budget_mib * 1.1),
        &[("RSS", MAGENTA, &|s| Some(s.rss_mib))],
        Some(("budget", budget_mib)),
    )?;
    draw(
        &panels[3],
        "checkpoint duration (each completed checkpoint)",
        "ms",
        max(&|s| s.checkpoint_ms.unwrap_or(0.0)),
        &[("checkpoint", RGBColor(200, 120, 0), &|s| s.checkpoint_ms)],
        None,
    )?;
    root.present().map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline of made-up seconds renders to a PNG file.
    #[test]
    fn renders_a_png() {
        let samples: Vec<Sample> = (0..60)
            .map(|i| Sample {
                t_s: i as f64,
                phase: i / 15,
                in_rate: 10_000.0,
                sink_rate: if (20..40).contains(&i) { 2_000.0 } else { 10_000.0 },
                produce_rate: 10_000.0,
                lag: if (20..45).contains(&i) { 1000 * (i as u64 - 19) } else { 0 },
                rss_mib: 40.0,
                checkpoint_ms: Some(5.0 + (i % 7) as f64),
            })
            .collect();
        let phases = vec![
            ("2 ms".to_owned(), 0.0, 20.0, 2.0),
            ("200 ms".to_owned(), 20.0, 40.0, 200.0),
            ("2 ms".to_owned(), 40.0, 60.0, 2.0),
        ];
        // The recovery is shaded as the first fast phase, not as the slow one.
        assert_eq!(shade_of(phases[2].3, &phases), shade_of(phases[0].3, &phases));
        assert_ne!(shade_of(phases[1].3, &phases), shade_of(phases[2].3, &phases));
        let path = std::env::temp_dir().join(format!("weir-demo-plot-{}.png", std::process::id()));
        timeline(&path, &samples, &phases, 120.0).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_file(&path).unwrap();
    }
}
