//! What a benchmark hands the report: rows of figures (value, unit, baseline, ratio, target,
//! met?), the environment it ran in (pinning, idle strategy, ring and record sizes), details
//! as JSON, and extra markdown. Each benchmark writes one [`Section`] as JSON; the runner
//! (`weir-bench all`) collects them into `report.json` and `report.md`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// One figure of the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    /// What was measured, in words (`"stateless chain, chained: records per CPU-second"`).
    pub figure: String,
    /// The figure, in `unit`; `None`: not measured (see `note`).
    pub value: Option<f64>,
    /// The unit of `value` (`"M records/s"`, `"µs"`, `"%"`).
    pub unit: String,
    /// What the figure is compared with, in words and with its value (`"rtrb 95.1 M/s"`).
    pub baseline: Option<String>,
    /// value / baseline (for the ratio the target names).
    pub ratio: Option<f64>,
    /// The target, in words (`"≥ 1.0× rtrb"`).
    pub target: Option<String>,
    /// Whether the target was met; `None` when there is no target or no figure.
    pub met: Option<bool>,
    /// Why a figure is missing, or how to read it.
    pub note: Option<String>,
}

impl Row {
    /// A measured figure without baseline or target.
    pub fn new(figure: impl Into<String>, value: f64, unit: impl Into<String>) -> Row {
        Row { figure: figure.into(), value: Some(value), unit: unit.into(), ..Row::default() }
    }

    /// A figure that was not measured, and why.
    pub fn not_run(figure: impl Into<String>, why: impl Into<String>) -> Row {
        Row { figure: figure.into(), note: Some(why.into()), ..Row::default() }
    }

    /// Compare with a baseline: `ratio = value / baseline_value`.
    pub fn vs(mut self, baseline: impl Into<String>, baseline_value: f64) -> Row {
        self.baseline = Some(baseline.into());
        self.ratio = self.value.map(|v| v / baseline_value);
        self
    }

    /// A target on the ratio (or on the value when there is no baseline), checked by `met`.
    pub fn target(mut self, target: impl Into<String>, met: impl FnOnce(f64) -> bool) -> Row {
        self.target = Some(target.into());
        let subject = if self.baseline.is_some() { self.ratio } else { self.value };
        self.met = subject.map(met);
        self
    }

    /// A note on how to read the figure.
    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

/// One benchmark's part of the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Section {
    /// Short name: the subcommand (`"pipeline"`).
    pub name: String,
    /// Heading in the report.
    pub title: String,
    /// The figures.
    pub rows: Vec<Row>,
    /// How it ran: pinning map (subtask → CPU), idle strategy, ring slots and slot size,
    /// record size, durations.
    pub setup: Value,
    /// Raw measurements (every run, every counter), for scripts.
    pub details: Value,
    /// Markdown appended under the section's rows (latency percentile tables).
    pub markdown: String,
    /// Files written next to the report (`.hgrm` histograms), relative to the report folder.
    pub files: Vec<String>,
    /// CPU time and wall time of the whole section, and the load average around it.
    pub run: Value,
}

impl Section {
    /// An empty section.
    pub fn new(name: &str, title: &str) -> Section {
        Section { name: name.into(), title: title.into(), ..Section::default() }
    }

    /// Write this section as `<dir>/sections/<name>.json`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let dir = dir.join("sections");
        std::fs::create_dir_all(&dir)?;
        let text = serde_json::to_string_pretty(self).expect("a section serializes");
        std::fs::write(dir.join(format!("{}.json", self.name)), text + "\n")
    }

    /// Read `<dir>/sections/<name>.json`.
    pub fn read(dir: &Path, name: &str) -> Result<Section, String> {
        let path = dir.join("sections").join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The rows as a markdown table.
    pub fn table(&self) -> String {
        table(&self.rows)
    }
}

/// Rows as a markdown table: figure, value, unit, baseline, ratio, target, met?
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| figure | value | unit | baseline | ratio | target | met? |\n");
    s.push_str("|---|---:|---|---|---:|---|---|\n");
    for r in rows {
        let value = match (r.value, &r.note) {
            (Some(v), _) => fmt_num(v),
            (None, Some(_)) => "not run".into(),
            (None, None) => "–".into(),
        };
        let figure = match (&r.note, r.value) {
            (Some(n), _) => format!("{} ({n})", r.figure),
            (None, _) => r.figure.clone(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            figure,
            value,
            r.unit,
            r.baseline.as_deref().unwrap_or(""),
            r.ratio.map_or(String::new(), |x| format!("{x:.2}×")),
            r.target.as_deref().unwrap_or(""),
            match r.met {
                Some(true) => "yes",
                Some(false) => "**NO**",
                None => "",
            }
        );
    }
    s
}

/// A number for people: three significant digits, no exponent.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Records per second as a human string: `12.3 M/s`.
pub fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e6 { format!("{:.2} M/s", per_s / 1e6) } else { format!("{:.1} k/s", per_s / 1e3) }
}

/// Mebibytes.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
