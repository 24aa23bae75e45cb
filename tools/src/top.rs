//! `weir top`: a live terminal view of a job's graph, from its counters file only (so it
//! works on a stuck job). Each stage (a chain of operators on its subtasks, named by its
//! head node) is a box, in topological order, with its busy / backpressured / idle shares
//! as bars and Flink's OK / LOW / HIGH level in Flink's colours; each edge between stages
//! shows the fill and credit of its channels; a stage busy most of the time behind a full
//! channel is marked SLOW (the bottleneck: its senders are the HIGH ones); consumer lag per partition as a sparkline of
//! the last minute; checkpoints; RSS against the budget; the sinks' acknowledgement and end-to-end latency.
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
    /// The most backpressured subtask's share: its level is the stage's (as Flink shows it).
    pub worst_backpressured: f64,
    /// Records into the stage per second, all subtasks.
    pub records_per_s: f64,
    /// Busy most of the time with a full channel in front of it: the stage that holds the
    /// job back (its senders show HIGH backpressure).
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
                worst_backpressured: subtasks.iter().map(|s| s.backpressured).fold(0.0, f64::max),
                records_per_s: subtasks.iter().map(|s| s.records_in_per_s).sum(),
                bottleneck: false,
            }
        })
        .collect::<Vec<Stage>>();
    let mut edges: Vec<Edge> = edges.into_values().collect();
    let mut stages = stages;
    for s in &mut stages {
        s.bottleneck = s.busy >= BOTTLENECK_BUSY && edges.iter().any(|e| e.to == s.name && e.fill >= 0.9);
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

/// The screen's state between refreshes.
#[derive(Debug, Default)]
pub struct Top {
    lags: BTreeMap<String, VecDeque<u64>>,
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

    /// Draw `view` of job `job` (`alive`: its process runs) into `frame`.
    pub fn draw(&self, frame: &mut Frame, job: &str, alive: bool, view: &StatView) {
        let (stages, edges) = graph(view);
        let lag_rows = self.lags.len().min(8) as u16;
        let sink_lines = sink_lines(view);
        let sink_rows = if sink_lines.is_empty() { 0 } else { sink_lines.len() as u16 + 2 };
        let header = header_lines(job, alive, view);
        let [head, boxes, channels, lags, sinks, help] = Layout::vertical([
            Constraint::Length(header.len() as u16 + 2),
            Constraint::Length(7),
            Constraint::Length(edges.len().max(1) as u16 + 2),
            Constraint::Length(if lag_rows == 0 { 0 } else { lag_rows * 2 + 2 }),
            Constraint::Length(sink_rows),
            Constraint::Min(1),
        ])
        .areas(frame.area());
        frame.render_widget(Paragraph::new(header).block(Block::bordered().title(" weir top ")), head);
        self.draw_stages(frame, boxes, &stages);
        frame.render_widget(Paragraph::new(edge_lines(&edges)).block(Block::bordered().title(" channels ")), channels);
        if lag_rows > 0 {
            self.draw_lags(frame, lags);
        }
        if sink_rows > 0 {
            frame.render_widget(Paragraph::new(sink_lines).block(Block::bordered().title(" sinks ")), sinks);
        }
        frame.render_widget(Paragraph::new(Line::from(" q: quit   refreshed from the counters file")), help);
    }

    fn draw_stages(&self, frame: &mut Frame, area: Rect, stages: &[Stage]) {
        if stages.is_empty() {
            frame.render_widget(Paragraph::new("no subtasks yet").block(Block::bordered()), area);
            return;
        }
        let cells = Layout::horizontal(stages.iter().map(|_| Constraint::Ratio(1, stages.len() as u32))).split(area);
        for (i, (s, cell)) in stages.iter().zip(cells.iter()).enumerate() {
            let level = backpressure_level(s.worst_backpressured);
            let color = level_color(level);
            let arrow = if i + 1 < stages.len() { " ▶" } else { "" };
            let mut title = vec![
                Span::styled(format!(" {} ×{} ", s.name, s.parallelism), Style::default().add_modifier(Modifier::BOLD)),
                Span::styled(format!("{level} "), Style::default().fg(color).add_modifier(Modifier::BOLD)),
            ];
            if s.bottleneck {
                let red = Style::default().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD);
                title.push(Span::styled("SLOW", red));
            }
            title.push(Span::raw(arrow));
            let title = Line::from(title);
            let width = (cell.width as usize).saturating_sub(12).clamp(4, 30);
            let lines = vec![
                Line::from(format!("busy {}", bar(s.busy, width))),
                Line::from(Span::styled(format!("bp   {}", bar(s.backpressured, width)), Style::default().fg(color))),
                Line::from(format!("idle {}", bar(s.idle, width))),
                Line::from(format!("{:.0} rec/s", s.records_per_s)),
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
        let rows = Layout::vertical(self.lags.iter().take(8).map(|_| Constraint::Length(2))).split(inner);
        for ((partition, h), row) in self.lags.iter().zip(rows.iter()) {
            let [label, line] = Layout::horizontal([Constraint::Length(28), Constraint::Min(10)]).areas(*row);
            let now = h.back().copied().unwrap_or(0);
            frame.render_widget(Paragraph::new(format!("{partition} {now}")), label);
            let data: Vec<u64> = h.iter().copied().collect();
            let max = data.iter().copied().max().unwrap_or(0).max(1);
            frame
                .render_widget(Sparkline::default().data(&data).max(max).style(Style::default().fg(Color::Cyan)), line);
        }
    }
}

fn header_lines(job: &str, alive: bool, v: &StatView) -> Vec<Line<'static>> {
    let state = match (v.job_state, alive) {
        (2, _) => "finished",
        (3, _) => "failed",
        (_, false) => "dead (process gone)",
        _ => "running",
    };
    let ratio = v.rss_bytes as f64 / v.budget_bytes.max(1) as f64;
    let k = &v.checkpoints;
    let checkpoint = if k.completed + k.failed == 0 {
        "no checkpoints".to_owned()
    } else {
        format!(
            "checkpoint #{} {:.0} ms (alignment {:.0} ms, {:.1} MiB), {} done, {} failed",
            k.last_id,
            k.duration_ns as f64 / 1e6,
            k.alignment_ns as f64 / 1e6,
            mib(k.bytes),
            k.completed,
            k.failed
        )
    };
    let mut lines = vec![Line::from(vec![
        Span::styled(format!("job {job} ({state})"), Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!("   RSS {:.1} of {:.1} MiB budget ", mib(v.rss_bytes), mib(v.budget_bytes))),
        Span::styled(
            format!("({:.0} %)", 100.0 * ratio),
            Style::default().fg(if ratio > 1.0 { Color::Red } else { Color::Green }),
        ),
        Span::raw(format!("   {checkpoint}")),
    ])];
    if let Some(line) = crate::stat::instance_line(v) {
        lines.push(Line::from(line));
    }
    lines
}

fn edge_lines(edges: &[Edge]) -> Vec<Line<'static>> {
    if edges.is_empty() {
        return vec![Line::from("no channels (one chain)")];
    }
    edges
        .iter()
        .map(|e| {
            let color = if e.fill >= 1.0 {
                Color::Red
            } else if e.fill >= 0.5 {
                Color::Yellow
            } else {
                Color::Green
            };
            Line::from(vec![
                Span::raw(format!("{:<28}", format!("{} → {}", e.from, e.to))),
                Span::styled(format!("fill {}", bar(e.fill, 20)), Style::default().fg(color)),
                Span::raw(format!("   credit {} of {} slots, {} channel(s)", e.credit, e.slots, e.channels)),
            ])
        })
        .collect()
}

fn sink_lines(v: &StatView) -> Vec<Line<'static>> {
    crate::stat::sink_rows(v).into_iter().chain(crate::stat::latency_rows(v)).map(Line::from).collect()
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
        }
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
