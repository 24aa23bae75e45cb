//! weir-top (`weir top`): a live terminal view of a running job's graph — stages as boxes
//! with busy / backpressured / idle bars and Flink's levels, channels with fill and credit,
//! lag per partition, checkpoints, RSS against the budget, sink latency. Reads the job's
//! counters file in shared memory, read-only: it works while the job is stuck. `q`, Esc or
//! Ctrl-C quits.

// The doc comments of the arguments below are the command's --help text, read as plain text:
// `weir-<uid>` is a path a user reads, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use clap::Parser;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir_tools::stat::{self, StatView};
use weir_tools::top::Top;

/// Live view of a weir job's graph.
#[derive(Parser, Debug)]
#[command(name = "weir-top", version, about)]
struct Args {
    /// The job's counters file or run directory (default: the newest job under /dev/shm/weir-<uid>).
    target: Option<PathBuf>,
    /// Milliseconds between refreshes.
    #[arg(short, long, default_value_t = 1000)]
    interval_ms: u64,
}

fn main() {
    let args = Args::parse();
    let (path, reader) = stat::open_or_exit(args.target.as_deref(), "weir-top");
    if !std::io::stdout().is_terminal() {
        eprintln!("weir-top: stdout is not a terminal; for scripts use `weir-stat --json`");
        std::process::exit(2);
    }
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let mut terminal = ratatui::init();
    let mut top = Top::default();
    let mut before = reader.snapshot();
    let mut at = Instant::now();
    let mut view: Option<StatView> = None;
    let mut run = || -> std::io::Result<()> {
        loop {
            // Wait for a key until the next refresh is due; a resize redraws at once.
            let due = at + interval;
            while let Some(left) = due.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                match event::read()? {
                    Event::Key(k)
                        if k.kind == KeyEventKind::Press
                            && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                                || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL))) =>
                    {
                        return Ok(());
                    }
                    Event::Resize(..) => {
                        if let Some(v) = &view {
                            terminal.draw(|f| top.draw(f, &reader.job, reader.job_alive(), v))?;
                        }
                    }
                    _ => {}
                }
            }
            let after = reader.snapshot();
            let now = Instant::now();
            let v = StatView::between(&before, &after, (now - at).as_secs_f64());
            top.update(&v);
            top.set_waits(stat::waits(&path, v.at_ms));
            (before, at) = (after, now);
            let alive = reader.job_alive();
            terminal.draw(|f| top.draw(f, &reader.job, alive, &v))?;
            view = Some(v);
        }
    };
    let result = run();
    ratatui::restore();
    if let Err(e) = result {
        eprintln!("weir-top: the terminal failed: {e}");
        std::process::exit(1);
    }
}
