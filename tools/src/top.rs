//! `weir top`: a live terminal view of a job's graph, from its counters file only (so it
//! works on a stuck job). Each stage (a chain of operators on its subtasks, named by its
//! head node) is a box, in topological order, with its busy / backpressured / idle / waiting
//! shares as bars and Flink's OK / LOW / HIGH level in Flink's colours; each edge between
//! stages shows the fill and credit of its channels; a stage busy most of the time behind a
//! full channel is marked SLOW, one waiting on the outside WAITING (the bottleneck: its
//! senders are the HIGH ones); what subtasks wait on; consumer lag per partition as a
//! sparkline of the last minute; checkpoints; RSS against the budget; the sinks'
//! acknowledgement and end-to-end latency.
//!
//! At any size: what does not fit goes, least important first, a whole column or line at a
//! time, so no number is ever cut into another number; below [`MIN_WIDTH`] × [`MIN_HEIGHT`]
//! it says the terminal is too small.
//!
//! [`Top`] keeps what the screen needs between refreshes (the lag history) and draws a
//! [`StatView`] into any ratatui frame: the binary draws into the terminal, the tests into a
//! `TestBackend`.

use crate::stat::{StatView, SubtaskView};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline};
use std::collections::{BTreeMap, VecDeque};
use weir::telemetry::backpressure_level;
use weir::telemetry::counters::channel_fill;

/// The busy share from which a stage with a full input channel is called the bottleneck.
const BOTTLENECK_BUSY: f64 = 0.8;

/// Lag samples kept per partition (one per refresh: a minute at the default second).
const HISTORY: usize = 60;

/// One stage: the subtasks of a chain, by its head node.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The head node.
    pub name: String,
    /// Its subtasks.
    pub parallelism: usize,
    /// Mean shares over its subtasks.
    pub busy: f64,
    /// Mean backpressured share.
    pub backpressured: f64,
    /// Mean idle share.
    pub idle: f64,
    /// Mean share waiting on the outside.
    pub waiting: f64,
    /// The most backpressured subtask's share: its level is the stage's (as Flink shows it).
    pub worst_backpressured: f64,
    /// Records into the stage per second, all subtasks.
    pub records_per_s: f64,
    /// Busy (or waiting on the outside) most of the time with a full channel in front of it:
    /// the stage that holds the job back (its senders show HIGH backpressure).
    pub bottleneck: bool,
}

/// The channels from one stage to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    /// Sending stage.
    pub from: String,
    /// Receiving stage.
    pub to: String,
    /// Channels (rings).
    pub channels: usize,
    /// Used slots over the room of the fullest channel: its slots, or the receiver's
    /// announced limit when that is lower (credit by time).
    pub fill: f64,
    /// Free slots, all channels.
    pub credit: u64,
    /// Slots, all channels.
    pub slots: u64,
}

/// The stage of a subtask named `head#index`.
fn stage_of(subtask: &str) -> &str {
    subtask.rsplit_once('#').map_or(subtask, |(head, _)| head)
}

/// Stages in topological order (sources first; ties by name) and the edges between them.
pub fn graph(view: &StatView) -> (Vec<Stage>, Vec<Edge>) {
    let mut by_stage: BTreeMap<&str, Vec<&SubtaskView>> = BTreeMap::new();
    for s in &view.subtasks {
        by_stage.entry(stage_of(&s.owner)).or_default().push(s);
    }
    // A channel is named by the node that sends into it, the last of its chain: its stage is
    // the subtask that runs it (the chain's head; older jobs' files do not say: the node).
    let chained: BTreeMap<&str, &str> = view.chained.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    let subtask_of = |node: &'_ str| -> String { stage_of(chained.get(node).copied().unwrap_or(node)).to_owned() };
    let mut edges: BTreeMap<(String, String), Edge> = BTreeMap::new();
    for c in &view.channels {
        let Some((from, to)) = c.owner.split_once("->") else { continue };
        let (from, to) = (subtask_of(from), subtask_of(to));
        let e = edges.entry((from.clone(), to.clone())).or_insert(Edge {
            from,
            to,
            channels: 0,
            fill: 0.0,
            credit: 0,
            slots: 0,
        });
        e.channels += 1;
        // Under credit by time the receiver announces a limit below the slots: full is there.
        e.fill = e.fill.max(channel_fill(c.slots, c.announced, c.backlog).unwrap_or(0.0));
        e.credit += c.credit;
        e.slots += c.slots;
    }
    // Kahn's order over the stages (a job's graph has no cycle; any left over go last).
    let names: Vec<&str> = by_stage.keys().copied().collect();
    let mut indegree: BTreeMap<&str, usize> = names.iter().map(|n| (*n, 0)).collect();
    // An edge from another process (an ipc publisher, `ipc:<endpoint>`) is no stage's: it
    // holds no stage back.
    for e in edges.values().filter(|e| by_stage.contains_key(e.from.as_str())) {
        if let Some(d) = indegree.get_mut(e.to.as_str()) {
            *d += 1;
        }
    }
    let mut order: Vec<&str> = Vec::new();
    let mut ready: Vec<&str> = indegree.iter().filter(|(_, d)| **d == 0).map(|(n, _)| *n).collect();
    while let Some(n) = (!ready.is_empty()).then(|| ready.remove(0)) {
        order.push(n);
        for e in edges.values().filter(|e| e.from == n) {
            if let Some(d) = indegree.get_mut(e.to.as_str()) {
                *d -= 1;
                if *d == 0 {
                    let at = ready.partition_point(|r| *r < e.to.as_str());
                    ready.insert(at, names.iter().copied().find(|x| *x == e.to).expect("a stage"));
                }
            }
        }
    }
    order.extend(names.iter().filter(|n| !order.contains(n)).copied().collect::<Vec<_>>());
    let stages = order
        .iter()
        .map(|name| {
            let subtasks = &by_stage[name];
            let n = subtasks.len() as f64;
            let mean = |f: fn(&SubtaskView) -> f64| subtasks.iter().map(|s| f(s)).sum::<f64>() / n;
            Stage {
                name: (*name).to_owned(),
                parallelism: subtasks.len(),
                busy: mean(|s| s.busy),
                backpressured: mean(|s| s.backpressured),
                idle: mean(|s| s.idle),
                waiting: mean(|s| s.waiting),
                worst_backpressured: subtasks.iter().map(|s| s.backpressured).fold(0.0, f64::max),
                records_per_s: subtasks.iter().map(|s| s.records_in_per_s).sum(),
                bottleneck: false,
            }
        })
        .collect::<Vec<Stage>>();
    let mut edges: Vec<Edge> = edges.into_values().collect();
    let mut stages = stages;
    for s in &mut stages {
        s.bottleneck = s.busy + s.waiting >= BOTTLENECK_BUSY && edges.iter().any(|e| e.to == s.name && e.fill >= 0.9);
    }
    // Edges in from other processes first, then in stage order.
    edges.sort_by_key(|e| {
        (order.iter().position(|n| *n == e.from).map_or(0, |p| p + 1), order.iter().position(|n| *n == e.to))
    });
    (stages, edges)
}

/// Flink's colours for a backpressure level.
fn level_color(level: &str) -> Color {
    match level {
        "OK" => Color::Green,
        "LOW" => Color::Yellow,
        _ => Color::Red,
    }
}

/// A bar of `width` cells for a share in 0..=1, and the share in per cent.
fn bar(share: f64, width: usize) -> String {
    let full = ((share.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{} {:>3.0}%", "█".repeat(full), "░".repeat(width - full), 100.0 * share)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The smallest terminal `weir top` draws into; below it says so instead.
pub const MIN_WIDTH: u16 = 40;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u16 = 10;
/// The narrowest stage box (below it, stages are lines).
const MIN_BOX_WIDTH: u16 = 24;

/// How a piece of a line may be shown when the line is too wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Whole or not at all (anything with a number in it).
    Never,
    /// A name: may lose its end, marked with `…`.
    Name,
    /// Free text: may lose words at its end, marked with `…` (never half a word).
    Words,
}

/// A piece of a line: its text, how much it matters (0: the line is nothing without it;
/// higher numbers go first when the line is too wide), how it may be cut, its style.
#[derive(Clone, Debug)]
struct Piece {
    text: String,
    rank: u8,
    cut: Cut,
    style: Style,
}

fn piece(text: impl Into<String>, rank: u8) -> Piece {
    Piece { text: text.into(), rank, cut: Cut::Never, style: Style::default() }
}

fn width_of(s: &str) -> usize {
    s.chars().count()
}

/// `text` in at most `width` columns as `cut` allows (None: it does not fit at all).
fn shorten(text: &str, width: usize, cut: Cut) -> Option<String> {
    if width_of(text) <= width {
        return Some(text.to_owned());
    }
    match cut {
        Cut::Never => None,
        Cut::Name if width >= 2 => Some(text.chars().take(width - 1).chain(['…']).collect()),
        Cut::Words if width >= 2 => {
            let room: String = text.chars().take(width - 1).collect();
            let end = room.trim_end().rfind(' ')?;
            Some(format!("{}…", room[..end].trim_end()))
        }
        _ => None,
    }
}

/// The pieces that fit in `width` columns: the least important go first (the later of two
/// equals first); what remains may be cut as its pieces allow. None when even the pieces of
/// rank 0 do not fit: the line is not drawn. A number is never cut.
fn fit(pieces: &[Piece], width: usize) -> Option<Line<'static>> {
    let mut keep: Vec<bool> = vec![true; pieces.len()];
    let total =
        |keep: &[bool]| pieces.iter().zip(keep).filter(|(_, k)| **k).map(|(p, _)| width_of(&p.text)).sum::<usize>();
    let mut order: Vec<usize> = (0..pieces.len()).filter(|i| pieces[*i].rank > 0).collect();
    order.sort_by_key(|i| (std::cmp::Reverse(pieces[*i].rank), std::cmp::Reverse(*i)));
    let mut order = order.into_iter();
    while total(&keep) > width {
        match order.next() {
            Some(i) => keep[i] = false,
            None => break,
        }
    }
    let mut over = total(&keep).saturating_sub(width);
    let mut spans = Vec::new();
    for (p, _) in pieces.iter().zip(&keep).filter(|(_, k)| **k) {
        let mut text = p.text.clone();
        if over > 0 && p.cut != Cut::Never {
            let w = width_of(&text);
            let short = shorten(&text, w.saturating_sub(over), p.cut)?;
            over = over.saturating_sub(w - width_of(&short));
            text = short;
        }
        spans.push(Span::styled(text, p.style));
    }
    (over == 0).then(|| Line::from(spans))
}

/// A table whose columns go, least important first, until it fits: `(header, rank,
/// right-aligned)` per column (rank 0: the first, a name, may be cut), rows of cells.
fn table(columns: &[(&str, u8, bool)], rows: &[Vec<String>], width: usize) -> Vec<Line<'static>> {
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(c, (head, _, _))| rows.iter().map(|r| width_of(&r[c])).chain([width_of(head)]).max().unwrap_or(0))
        .collect();
    let mut keep = vec![true; columns.len()];
    let total = |keep: &[bool]| -> usize {
        let shown: Vec<usize> = widths.iter().zip(keep).filter(|(_, k)| **k).map(|(w, _)| *w).collect();
        shown.iter().sum::<usize>() + shown.len().saturating_sub(1)
    };
    let mut order: Vec<usize> = (0..columns.len()).filter(|c| columns[*c].1 > 0).collect();
    order.sort_by_key(|c| (std::cmp::Reverse(columns[*c].1), std::cmp::Reverse(*c)));
    for c in order {
        if total(&keep) <= width {
            break;
        }
        keep[c] = false;
    }
    // The first column (a name) gives up what is still missing.
    let first = widths[0].saturating_sub(total(&keep).saturating_sub(width));
    if first < 2 && total(&keep) > width {
        return Vec::new();
    }
    let line = |cells: Vec<String>| -> Line<'static> {
        let mut out = String::new();
        for (c, cell) in cells.iter().enumerate().filter(|(c, _)| keep[*c]) {
            let w = if c == 0 { first } else { widths[c] };
            let cell = if c == 0 { shorten(cell, w, Cut::Name).unwrap_or_default() } else { cell.clone() };
            if !out.is_empty() {
                out.push(' ');
            }
            let pad = w.saturating_sub(width_of(&cell));
            if columns[c].2 {
                out += &" ".repeat(pad);
                out += &cell;
            } else {
                out += &cell;
                out += &" ".repeat(pad);
            }
        }
        Line::from(out.trim_end().to_owned())
    };
    let mut out = vec![line(columns.iter().map(|(h, _, _)| (*h).to_owned()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out
}

/// The screen's state between refreshes.
#[derive(Debug, Default)]
pub struct Top {
    lags: BTreeMap<String, VecDeque<u64>>,
    waits: Vec<String>,
}

impl Top {
    /// Remember what this refresh's view says that later frames draw (lag history).
    pub fn update(&mut self, view: &StatView) {
        for (partition, lag) in &view.lags {
            let h = self.lags.entry(partition.clone()).or_default();
            if h.len() == HISTORY {
                h.pop_front();
            }
            h.push_back(*lag);
        }
    }

    /// What the job's subtasks wait on now, one line each ("sink#0 waiting 12.3 s: ..."):
    /// drawn under the header while there are any.
    pub fn set_waits(&mut self, waits: Vec<String>) {
        self.waits = waits;
    }

    /// Draw `view` of job `job` (`alive`: its process runs) into `frame`, at any size: what
    /// does not fit goes, least important first (the help line, lag history, latency, sinks,
    /// channels; columns within a line the same way), and no number is ever cut. Below
    /// [`MIN_WIDTH`] × [`MIN_HEIGHT`] it says the terminal is too small.
    pub fn draw(&self, frame: &mut Frame, job: &str, alive: bool, view: &StatView) {
        let area = frame.area();
        if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
            let text = [
                "terminal too small".to_owned(),
                format!("{}×{}: weir top needs {MIN_WIDTH}×{MIN_HEIGHT}", area.width, area.height),
                "(or use weir-stat)".to_owned(),
            ];
            let lines: Vec<Line> =
                text.iter().filter_map(|t| fit(&[piece(t.clone(), 0)], area.width as usize)).collect();
            frame.render_widget(Paragraph::new(lines), area);
            return;
        }
        let (stages, edges) = graph(view);
        let inner = area.width.saturating_sub(2) as usize;
        let mut header = header_lines(job, alive, view, inner);
        header.extend(self.waits.iter().filter_map(|w| {
            fit(
                &[Piece { text: w.clone(), rank: 0, cut: Cut::Words, style: Style::default().fg(Color::Yellow) }],
                inner,
            )
        }));
        let boxes = stages.len() as u16 * MIN_BOX_WIDTH <= area.width;
        let stage_rows = if stages.is_empty() {
            3
        } else if boxes {
            7
        } else {
            stages.len() as u16 + 2
        };
        let edge_lines = edge_lines(&edges, inner);
        let sink_lines = sink_lines(view, inner);
        let lag_rows = self.lags.len().min(8) as u16;
        // What each section wants, and what it may shrink to (0: it may go).
        let head_rows = header.len() as u16 + 2;
        let mut want = [
            head_rows,
            stage_rows,
            edge_lines.len().max(1) as u16 + 2,
            if sink_lines.is_empty() { 0 } else { sink_lines.len() as u16 + 2 },
            if lag_rows == 0 { 0 } else { lag_rows * 2 + 2 },
            1,
        ];
        // Give up rows, least important first: help, lag history, sink lines, channel lines,
        // header lines; a section too small to say anything goes whole.
        let mut over = want.iter().sum::<u16>().saturating_sub(area.height);
        for (section, floor, useful) in [(5, 0, 1), (4, 0, 4), (3, 0, 3), (2, 3, 3), (0, 3, 3)] {
            let give = over.min(want[section].saturating_sub(floor));
            want[section] -= give;
            over -= give;
            if want[section] < useful {
                want[section] = 0;
            }
        }
        let [head, boxes_area, channels, sinks, lags, help] =
            Layout::vertical(want.map(Constraint::Length)).areas(area);
        let header_shown = (head.height.saturating_sub(2)) as usize;
        header.truncate(header_shown.max(1));
        frame.render_widget(Paragraph::new(header).block(Block::bordered().title(" weir top ")), head);
        self.draw_stages(frame, boxes_area, &stages, boxes);
        if channels.height > 0 {
            let rows = channels.height.saturating_sub(2) as usize;
            let mut lines = edge_lines;
            if lines.len() > rows && rows > 0 {
                let more = lines.len() - rows + 1;
                lines.truncate(rows - 1);
                lines.push(Line::from(format!("… {more} more")));
            }
            frame.render_widget(Paragraph::new(lines).block(Block::bordered().title(" channels ")), channels);
        }
        if sinks.height > 0 {
            let mut lines = sink_lines;
            lines.truncate(sinks.height.saturating_sub(2) as usize);
            frame.render_widget(Paragraph::new(lines).block(Block::bordered().title(" sinks ")), sinks);
        }
        if lags.height > 0 {
            self.draw_lags(frame, lags);
        }
        if help.height > 0
            && let Some(line) =
                fit(&[piece(" q: quit", 0), piece("   refreshed from the counters file", 1)], help.width as usize)
        {
            frame.render_widget(Paragraph::new(line), help);
        }
    }

    fn draw_stages(&self, frame: &mut Frame, area: Rect, stages: &[Stage], boxes: bool) {
        if area.height == 0 {
            return;
        }
        if stages.is_empty() {
            frame.render_widget(Paragraph::new("no subtasks yet").block(Block::bordered()), area);
            return;
        }
        if !boxes {
            let width = area.width.saturating_sub(2) as usize;
            let lines: Vec<Line> = stages.iter().filter_map(|s| stage_line(s, width)).collect();
            frame.render_widget(Paragraph::new(lines).block(Block::bordered().title(" stages ")), area);
            return;
        }
        let cells = Layout::horizontal(stages.iter().map(|_| Constraint::Ratio(1, stages.len() as u32))).split(area);
        for (i, (s, cell)) in stages.iter().zip(cells.iter()).enumerate() {
            let level = backpressure_level(s.worst_backpressured);
            let color = level_color(level);
            let bold = Style::default().add_modifier(Modifier::BOLD);
            let mut title = vec![
                Piece { text: format!(" {}", s.name), rank: 0, cut: Cut::Name, style: bold },
                Piece { text: format!(" ×{}", s.parallelism), rank: 2, cut: Cut::Never, style: bold },
                Piece { text: format!(" {level} "), rank: 0, cut: Cut::Never, style: bold.fg(color) },
            ];
            if let Some(mark) = s.mark() {
                let red = Style::default().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD);
                title.push(Piece { text: mark.to_owned(), rank: 1, cut: Cut::Never, style: red });
            }
            if i + 1 < stages.len() {
                title.push(piece(" ▶", 3));
            }
            let title = fit(&title, cell.width.saturating_sub(2) as usize).unwrap_or_default();
            let width = (cell.width as usize).saturating_sub(12).clamp(4, 30);
            let lines = vec![
                Line::from(format!("busy {}", bar(s.busy, width))),
                Line::from(Span::styled(format!("bp   {}", bar(s.backpressured, width)), Style::default().fg(color))),
                Line::from(format!("idle {}", bar(s.idle, width))),
                Line::from(Span::styled(
                    format!("wait {}", bar(s.waiting, width)),
                    Style::default().fg(if s.waiting > 0.5 { Color::Yellow } else { Color::Reset }),
                )),
                fit(&[piece(format!("{:.0} rec/s", s.records_per_s), 0)], cell.width.saturating_sub(2) as usize)
                    .unwrap_or_default(),
            ];
            let border = if s.bottleneck { Color::Red } else { color };
            let block = Block::bordered().title(title).border_style(Style::default().fg(border));
            frame.render_widget(Paragraph::new(lines).block(block), *cell);
        }
    }

    fn draw_lags(&self, frame: &mut Frame, area: Rect) {
        let block = Block::bordered().title(" consumer lag per partition (last minute) ");
        let inner = block.inner(area);
        frame.render_widget(block, area);
        let shown = (inner.height / 2) as usize;
        let rows = Layout::vertical(self.lags.iter().take(shown).map(|_| Constraint::Length(2))).split(inner);
        let label_width = inner.width.min(28);
        for ((partition, h), row) in self.lags.iter().zip(rows.iter()) {
            let [label, line] = Layout::horizontal([Constraint::Length(label_width), Constraint::Min(0)]).areas(*row);
            let now = h.back().copied().unwrap_or(0);
            let text = [
                Piece { text: partition.clone(), rank: 0, cut: Cut::Name, style: Style::default() },
                piece(format!(" {now}"), 0),
            ];
            if let Some(l) = fit(&text, label.width as usize) {
                frame.render_widget(Paragraph::new(l), label);
            }
            let data: Vec<u64> = h.iter().copied().collect();
            let max = data.iter().copied().max().unwrap_or(0).max(1);
            frame
                .render_widget(Sparkline::default().data(&data).max(max).style(Style::default().fg(Color::Cyan)), line);
        }
    }
}

impl Stage {
    /// What marks the stage that holds the job back: SLOW (busy behind a full channel) or
    /// WAITING (waiting on the outside behind a full channel).
    fn mark(&self) -> Option<&'static str> {
        if !self.bottleneck {
            None
        } else if self.waiting > self.busy {
            Some("WAITING")
        } else {
            Some("SLOW")
        }
    }
}

/// A stage as one line (the terminal is too narrow for its box).
fn stage_line(s: &Stage, width: usize) -> Option<Line<'static>> {
    let level = backpressure_level(s.worst_backpressured);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut pieces = vec![
        Piece { text: s.name.clone(), rank: 0, cut: Cut::Name, style: bold },
        piece(format!(" ×{}", s.parallelism), 6),
        Piece { text: format!(" {level}"), rank: 0, cut: Cut::Never, style: bold.fg(level_color(level)) },
    ];
    if let Some(mark) = s.mark() {
        pieces.push(Piece {
            text: format!(" {mark}"),
            rank: 1,
            cut: Cut::Never,
            style: Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        });
    }
    pieces.extend([
        piece(format!("  busy {:.0}%", 100.0 * s.busy), 2),
        piece(format!(" bp {:.0}%", 100.0 * s.backpressured), 2),
        piece(format!(" idle {:.0}%", 100.0 * s.idle), 4),
        piece(format!(" wait {:.0}%", 100.0 * s.waiting), 3),
        piece(format!("  {:.0} rec/s", s.records_per_s), 5),
    ]);
    fit(&pieces, width)
}

fn header_lines(job: &str, alive: bool, v: &StatView, width: usize) -> Vec<Line<'static>> {
    let state = match (v.job_state, alive) {
        (2, _) => "finished",
        (3, _) => "failed",
        (_, false) => "dead (process gone)",
        _ => "running",
    };
    let ratio = v.rss_bytes as f64 / v.budget_bytes.max(1) as f64;
    let k = &v.checkpoints;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut pieces = vec![
        Piece { text: format!("job {job}"), rank: 0, cut: Cut::Name, style: bold },
        Piece { text: format!(" ({state})"), rank: 0, cut: Cut::Never, style: bold },
        piece(format!("   RSS {:.1} of {:.1} MiB budget", mib(v.rss_bytes), mib(v.budget_bytes)), 1),
        Piece {
            text: format!(" ({:.0} %)", 100.0 * ratio),
            rank: 1,
            cut: Cut::Never,
            style: Style::default().fg(if ratio > 1.0 { Color::Red } else { Color::Green }),
        },
    ];
    if k.completed + k.failed == 0 {
        pieces.push(piece("   no checkpoints", 5));
    } else {
        pieces.extend([
            piece(format!("   checkpoint #{} {:.0} ms", k.last_id, k.duration_ns as f64 / 1e6), 2),
            piece(format!(" (alignment {:.0} ms, {:.1} MiB)", k.alignment_ns as f64 / 1e6, mib(k.bytes)), 4),
            piece(format!(", {} done, {} failed", k.completed, k.failed), 3),
        ]);
    }
    let mut lines: Vec<Line> = fit(&pieces, width).into_iter().collect();
    if let Some(line) = crate::stat::instance_line(v) {
        lines.extend(fit(&[Piece { text: line, rank: 0, cut: Cut::Words, style: Style::default() }], width));
    }
    lines
}

fn edge_lines(edges: &[Edge], width: usize) -> Vec<Line<'static>> {
    if edges.is_empty() {
        return vec![Line::from("no channels (one chain)")];
    }
    let name_width = edges.iter().map(|e| width_of(&e.from) + width_of(&e.to) + 3).max().unwrap_or(0).min(28);
    edges
        .iter()
        .filter_map(|e| {
            let color = if e.fill >= 1.0 {
                Color::Red
            } else if e.fill >= 0.5 {
                Color::Yellow
            } else {
                Color::Green
            };
            let name = format!("{} → {}", e.from, e.to);
            let pad = name_width.saturating_sub(width_of(&name));
            let share = |bar_width: usize| Piece {
                text: if bar_width > 0 {
                    format!(" fill {}", bar(e.fill, bar_width))
                } else {
                    format!(" fill {:.0}%", 100.0 * e.fill)
                },
                rank: 1,
                cut: Cut::Never,
                style: Style::default().fg(color),
            };
            let line = |bar_width: usize| {
                [
                    Piece {
                        text: format!("{name}{}", " ".repeat(pad)),
                        rank: 0,
                        cut: Cut::Name,
                        style: Style::default(),
                    },
                    share(bar_width),
                    piece(format!("   credit {} of {} slots", e.credit, e.slots), 2),
                    piece(format!(", {} channel(s)", e.channels), 3),
                ]
            };
            // The widest bar with which the whole line fits; else no bar, and pieces go.
            let whole = |pieces: &[Piece]| pieces.iter().map(|p| width_of(&p.text)).sum::<usize>() <= width;
            [20, 10].into_iter().map(&line).find(|l| whole(l)).map_or_else(|| fit(&line(0), width), |l| fit(&l, width))
        })
        .collect()
}

/// The sinks' figures and their end-to-end latency, as tables that fit `width`.
fn sink_lines(v: &StatView, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    if !v.sinks.is_empty() {
        let columns = [
            ("sink", 0, false),
            ("blocked%", 1, true),
            ("acked/s", 2, true),
            ("in flight", 3, true),
            ("ack ms p50/p99/max", 4, true),
            ("last ack", 5, true),
            ("acked", 6, true),
            ("retries", 7, true),
            ("dead", 8, true),
        ];
        let rows: Vec<Vec<String>> = v
            .sinks
            .iter()
            .map(|s| {
                vec![
                    s.node.clone(),
                    format!("{:.1}", 100.0 * s.blocked),
                    format!("{:.0}", s.acked_per_s),
                    s.in_flight.to_string(),
                    crate::stat::ms_figures(&[s.ack_p50_us, s.ack_p99_us, s.ack_max_us]),
                    crate::stat::age_text(s.ack_newest_ms, v.at_ms),
                    s.acked.to_string(),
                    s.retries.to_string(),
                    s.dead_letters.to_string(),
                ]
            })
            .collect();
        lines.extend(table(&columns, &rows, width));
    }
    let timed: Vec<_> = v.latencies.iter().filter(|l| l.markers > 0).collect();
    if !timed.is_empty() {
        let columns = [
            ("e2e latency", 0, false),
            ("ingest->ack ms p50/p99/max", 1, true),
            ("newest", 2, true),
            ("event->ack ms p50/p99/max", 3, true),
            ("since start p99/max", 4, true),
            ("markers", 5, true),
        ];
        let rows: Vec<Vec<String>> = timed
            .iter()
            .map(|l| {
                vec![
                    l.owner.clone(),
                    crate::stat::ms_figures(&[l.ingest[0], l.ingest[1], l.ingest[3]]),
                    crate::stat::age_text(l.newest_ms, v.at_ms),
                    crate::stat::ms_figures(&[l.event[0], l.event[1], l.event[3]]),
                    crate::stat::ms_figures(&[l.ingest[5], l.ingest[7]]),
                    l.markers.to_string(),
                ]
            })
            .collect();
        lines.extend(table(&columns, &rows, width));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::{ChannelView, SubtaskView};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn subtask(owner: &str, busy: f64, bp: f64) -> SubtaskView {
        SubtaskView {
            owner: owner.into(),
            busy,
            backpressured: bp,
            idle: 1.0 - busy - bp,
            waiting: 0.0,
            records_in_per_s: 100.0,
            records_in: 1,
            state: 1,
        }
    }

    fn channel(owner: &str, backlog: u64) -> ChannelView {
        ChannelView {
            owner: owner.into(),
            slots: 64,
            backlog,
            credit: 64 - backlog,
            blocked: 0.0,
            announced: 64,
            drain_rate: 0,
            drain_ms: 0.0,
        }
    }

    fn view() -> StatView {
        StatView {
            interval_s: 1.0,
            // Named out of order: the graph orders them.
            subtasks: vec![
                subtask("sink#0", 1.0, 0.0),
                subtask("gen#0", 0.05, 0.9),
                subtask("m#0", 0.2, 0.7),
                subtask("m#1", 0.5, 0.3),
            ],
            channels: vec![
                channel("gen#0->m#0", 64),
                channel("gen#0->m#1", 10),
                channel("tail#0->sink#0", 64),
                channel("tail#1->sink#0", 64),
            ],
            rss_bytes: 40 << 20,
            budget_bytes: 100 << 20,
            job_state: 1,
            checkpoints: Default::default(),
            lags: vec![("clicks[0]".into(), 500), ("clicks[1]".into(), 700)],
            sinks: Vec::new(),
            latencies: Vec::new(),
            instance: None,
            // m's chain ends in node `tail`, which names the channels into the sink.
            chained: vec![("tail#0".into(), "m#0".into()), ("tail#1".into(), "m#1".into())],
            at_ms: 0,
        }
    }

    /// The view with large numbers everywhere a narrow terminal used to cut them.
    fn big_view() -> StatView {
        let mut v = view();
        for c in &mut v.channels {
            (c.slots, c.announced, c.backlog, c.credit) = (16384, 16384, 8192, 8192);
        }
        v.checkpoints = crate::stat::CheckpointView {
            last_id: 1048,
            duration_ns: 48_000_000,
            alignment_ns: 3_000_000,
            bytes: 5 << 20,
            completed: 1047,
            failed: 1,
        };
        v.at_ms = 1_700_000_000_000;
        v.sinks = vec![crate::stat::SinkView {
            node: "api".into(),
            records: 123_456_789,
            acked: 123_456_000,
            acked_per_s: 98_765.0,
            in_flight: 4,
            retries: 17,
            dead_letters: 0,
            blocked: 0.25,
            ack_p50_us: 71_000,
            ack_p99_us: 99_800,
            ack_max_us: 120_000,
            ack_newest_ms: v.at_ms - 1_500,
        }];
        v.latencies = vec![crate::stat::LatencyView {
            owner: "api#0".into(),
            ingest: [71_000, 99_000, 99_500, 120_000, 60_000, 98_000, 99_000, 130_000],
            event: [1_071_000, 1_099_000, 1_099_500, 1_120_000, 0, 1_098_000, 0, 1_130_000],
            markers: 31_337,
            window_end_ms: v.at_ms - 100,
            newest_ms: v.at_ms - 200,
        }];
        v
    }

    fn render(top: &Top, v: &StatView, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| top.draw(f, "clicks", true, v)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| (0..buffer.area.width).map(|x| buffer[(x, y)].symbol().to_owned()).collect::<String>() + "\n")
            .collect()
    }

    fn numbers(text: &str) -> std::collections::BTreeSet<String> {
        text.split(|c: char| !c.is_ascii_digit() && c != '.')
            .map(|t| t.trim_matches('.'))
            .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
            .map(str::to_owned)
            .collect()
    }

    /// At every size from the smallest it draws to a large one, every number on the screen is
    /// one the full screen shows: nothing is cut into another number ("credit 64 of 1638" for
    /// 16384). At 80×24 the essentials are there, whole.
    #[test]
    fn no_number_is_ever_cut() {
        let v = big_view();
        let mut top = Top::default();
        top.update(&v);
        top.set_waits(vec![
            "api#0 waiting 12.3 s: http sink api: 4 batches outstanding to http://127.0.0.1:8080/ingest".into(),
        ]);
        let full = render(&top, &v, 400, 80);
        let allowed = numbers(&full);
        for want in ["credit 16384 of 32768 slots", "checkpoint #1048 48 ms", "98765", "12.3 s"] {
            assert!(full.contains(want), "no {want:?} in:\n{full}");
        }
        for width in (MIN_WIDTH..=200).step_by(3) {
            for height in (MIN_HEIGHT..=44).step_by(3) {
                let text = render(&top, &v, width, height);
                for n in numbers(&text) {
                    assert!(allowed.contains(&n), "{width}×{height}: {n} is not a number of the view:\n{text}");
                }
            }
        }
        let small = render(&top, &v, 80, 24);
        for want in ["job clicks (running)", "gen ×1 HIGH", "sink", "gen → m", "credit 16384 of 32768 slots"] {
            assert!(small.contains(want), "80×24: no {want:?} in:\n{small}");
        }
        assert!(!small.contains("terminal too small"), "{small}");
    }

    /// Below the minimum it says so, and nothing else.
    #[test]
    fn a_too_small_terminal_says_so() {
        let v = big_view();
        let text = render(&Top::default(), &v, 30, 8);
        assert!(text.contains("terminal too small"), "{text}");
        assert!(text.contains("30×8"), "{text}");
        assert!(!text.contains("credit"), "{text}");
    }

    /// Stages in topological order, each with the worst subtask's backpressure; edges with
    /// the fullest channel's fill.
    #[test]
    fn stages_in_topological_order() {
        let (stages, edges) = graph(&view());
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["gen", "m", "sink"]);
        assert_eq!(stages[1].parallelism, 2);
        assert!((stages[1].worst_backpressured - 0.7).abs() < 1e-9 && (stages[1].backpressured - 0.5).abs() < 1e-9);
        assert_eq!(edges.len(), 2);
        assert_eq!((edges[0].from.as_str(), edges[0].to.as_str(), edges[0].channels), ("gen", "m", 2));
        assert_eq!(edges[0].fill, 1.0);
        assert_eq!(edges[0].credit, 54);
        // The sink: busy behind a full channel. The m stage is not (busy 35 %).
        assert_eq!(stages.iter().map(|s| s.bottleneck).collect::<Vec<_>>(), [false, false, true]);
    }

    /// A channel in from another process (an ipc publisher) is an edge of its own, first,
    /// and holds no stage back: the source stays first in the order.
    #[test]
    fn an_edge_from_another_process_comes_first_and_orders_nothing() {
        let mut v = view();
        v.channels.push(channel("ipc:ticks->gen#0", 64));
        let (stages, edges) = graph(&v);
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["gen", "m", "sink"]);
        assert_eq!((edges[0].from.as_str(), edges[0].to.as_str()), ("ipc:ticks", "gen"));
    }

    /// Drawn into a buffer: each stage's box with its level, HIGH for the backpressured
    /// ones, the edges' fill and the lag of each partition.
    #[test]
    fn draws_the_graph() {
        let mut top = Top::default();
        let v = view();
        top.update(&v);
        let mut terminal = Terminal::new(TestBackend::new(140, 30)).unwrap();
        terminal.draw(|f| top.draw(f, "clicks", true, &v)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        let text: String = (0..buffer.area.height)
            .map(|y| (0..buffer.area.width).map(|x| buffer[(x, y)].symbol().to_owned()).collect::<String>() + "\n")
            .collect();
        for want in ["job clicks (running)", "gen ×1 HIGH", "m ×2 HIGH", "sink ×1 OK SLOW", "gen → m", "clicks[1] 700"]
        {
            assert!(text.contains(want), "no {want:?} in:\n{text}");
        }
    }
}
