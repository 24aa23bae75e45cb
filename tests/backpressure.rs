//! Hop-by-hop backpressure (its own test binary, so the RSS it samples is this job's alone).

use std::sync::Arc;
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::record::Event;
use weir::ring::counters::CountersReader;
use weir_tools::stat::StatView;

/// generator -> map -> key_by -> 4 sinks, sink #2 slow, every hop a ring. Proves that a slow
/// stage slows the whole job through local credit only: the slow sink's input rings stay
/// full up to the credit it announces, the map (the key_by sender) and the generator are backpressured most of the time,
/// RSS stays flat after warm-up (< 2 % growth), and every record arrives exactly once.
#[test]
fn slow_sink_backpressures_hop_by_hop() {
    // The slow sink (200 µs a record, so 5,000/s for its quarter: 20,000/s for the job) must be
    // the bottleneck by a wide margin even when the machine is busy with other work, or the
    // stages upstream of it are the slow part and nothing backs up.
    const N: u64 = 100_000;
    let tally = Arc::new(Tally::default());
    let job = Job::new("hop-by-hop");
    job.configure(|c| {
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
    });
    let t = tally.clone();
    job.source("gen", 1, |info| Generator::events(info, N, 10_000))
        .rebalance()
        .map("map", |e: &Event| *e)
        .key_by("by_key", |e: &Event| e.key)
        .sink("sink", 4, move |info| {
            let sink = CountingSink::new(t.clone());
            if info.index == 2 { sink.with_delay(Duration::from_micros(200)) } else { sink }
        });
    let running = job.start().expect("job starts");
    let reader = CountersReader::open(running.counters_path()).expect("counters file");

    // Watchdog: the job must end; the slow sink needs ~5 s for its quarter of the records.
    let deadline = Instant::now() + Duration::from_secs(120);
    let warm_up = Instant::now() + Duration::from_millis(500);
    let mut before = reader.snapshot();
    let mut at = Instant::now();
    let (mut fills, mut map_bp, mut gen_bp, mut rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not finish in 120 s");
        std::thread::sleep(Duration::from_millis(100));
        let sample_rss = running.sample_rss();
        let after = reader.snapshot();
        let now = Instant::now();
        let v = StatView::between(&before, &after, (now - at).as_secs_f64());
        (before, at) = (after, now);
        // Only samples from the steady slow state: after warm-up, while the slow sink still works.
        let slow_sink_running = v.subtasks.iter().any(|s| s.owner == "sink#2" && s.state == 1);
        let others_done = v.subtasks.iter().filter(|s| s.owner.starts_with("gen#")).all(|s| s.state == 2);
        if now < warm_up || !slow_sink_running || others_done {
            continue;
        }
        let into_slow: Vec<f64> = v
            .channels
            .iter()
            .filter(|c| c.owner.ends_with("->sink#2"))
            .map(|c| c.backlog as f64 / c.announced.max(1) as f64)
            .collect();
        assert_eq!(into_slow.len(), 1, "one ring from the map subtask");
        fills.push(into_slow[0]);
        let bp = |p: &str| {
            let s: Vec<f64> = v.subtasks.iter().filter(|s| s.owner.starts_with(p)).map(|s| s.backpressured).collect();
            s.iter().sum::<f64>() / s.len() as f64
        };
        map_bp.push(bp("map#"));
        gen_bp.push(bp("gen#"));
        rss.push(sample_rss);
    }
    let summary = running.wait().expect("job finishes");
    assert_eq!(tally.totals(), Tally::expected(N), "every record exactly once");
    assert!(fills.len() >= 5, "too few steady-state samples ({}) to judge; summary:\n{summary}", fills.len());

    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let fill = median(&mut fills);
    let (map, source) = (median(&mut map_bp), median(&mut gen_bp));
    println!(
        "slow sink input fill (median) {fill:.2}, map backpressured {map:.2}, generator backpressured {source:.2}"
    );
    // Full up to what the slow sink announced (credit by time), not up to the ring's size.
    assert!(fill >= 0.9, "the slow sink's input rings should stay full up to its credit: median fill {fill:.2}");
    assert!(map > 0.5, "the key_by sender should be backpressured most of the time: {map:.2}");
    assert!(source > 0.5, "the generator should be backpressured most of the time: {source:.2}");
    let (first, max) = (rss[0] as f64, *rss.iter().max().unwrap() as f64);
    let growth = (max - first) / first;
    println!("RSS after warm-up {first} B, max {max} B, growth {:.3} %", growth * 100.0);
    assert!(growth < 0.02, "RSS grew {:.2} % after warm-up (must stay < 2 %)", growth * 100.0);
    assert!(summary.max_rss_bytes <= summary.budget.total_bytes(), "RSS over budget: {summary}");
}
