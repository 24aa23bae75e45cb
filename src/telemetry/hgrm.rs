//! HdrHistogram's percentile distribution text format (`.hgrm`), as Java's
//! `Histogram::outputPercentileDistribution` prints it (5 percentile ticks per half distance),
//! so the files load into the usual plotters (HdrHistogram's `plotFiles.html`, `hdr-plot`).

use hdrhistogram::Histogram;
use std::fmt::Write as _;

/// The distribution of `h` (recorded in ns) with values divided by `scale` (1000.0: µs).
pub fn percentile_distribution(h: &Histogram<u64>, scale: f64) -> String {
    let digits = h.sigfig() as usize;
    let mut out = String::new();
    let _ = write!(out, "{:>12} {:>14} {:>10} {:>14}\n\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)");
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64 / scale;
        if q < 1.0 {
            let _ = writeln!(out, "{value:12.digits$} {q:2.12} {total:10} {:14.2}", 1.0 / (1.0 - q));
        } else {
            let _ = writeln!(out, "{value:12.digits$} {q:2.12} {total:10}");
        }
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:12.digits$}, StdDeviation   = {:12.digits$}]",
        h.mean() / scale,
        h.stdev() / scale
    );
    let _ = writeln!(out, "#[Max     = {:12.digits$}, Total count    = {:12}]", h.max() as f64 / scale, h.len());
    let _ = writeln!(out, "#[Buckets = {:12}, SubBuckets     = {:12}]", h.buckets(), sub_buckets(h.sigfig()));
    out
}

/// Sub-buckets per bucket for `sigfig` significant digits (as HdrHistogram sizes them: the
/// power of two at or above 2 × 10^sigfig).
fn sub_buckets(sigfig: u8) -> u64 {
    (2 * 10u64.pow(sigfig as u32)).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format's header, a line per tick ending at percentile 1.0, and the three footer lines.
    #[test]
    fn prints_the_java_layout() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let text = percentile_distribution(&h, 1000.0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].trim_start().starts_with("Value"), "{text}");
        assert!(lines[1].is_empty());
        assert!(lines.iter().any(|l| l.contains("1.000000000000") && l.split_whitespace().count() == 3));
        assert!(lines[lines.len() - 3].starts_with("#[Mean"), "{text}");
        assert!(lines[lines.len() - 1].contains("SubBuckets     =         2048"), "{text}");
    }
}
