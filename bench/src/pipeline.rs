//! Whole jobs, end to end, through the engine's own subtasks and rings.
//!
//! - **stateless chain**: generator → map → filter → map → null sink, parallelism 1, once
//!   chained (one thread, plain calls) and once unchained (five threads, four rings; and
//!   as fibers: the subtasks pinned to one CPU sharing its thread);
//! - **key_by exchange**: generator → key_by → counting sink, at parallelism 1 and 2 (the
//!   exchange is one ring at p=1 and four at p=2).
//!
//! Each reports records/s (wall) and records per CPU-second (see [`crate::measure`]).
//! Records are 32-byte fixed-layout `Event`s, read in place from the rings. Used by
//! `cargo bench --bench pipeline` and by `weir-bench pipeline` / `all`.

use crate::measure::{Cost, measure, pinning};
use crate::report::{Row, Section, fmt_rate};
use serde_json::{Value, json};
use std::sync::Arc;
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, NullSink, Tally};
use weir::record::Event;

/// One measured job.
#[derive(Debug)]
pub struct Outcome {
    /// Workload name.
    pub name: String,
    /// Records through the job.
    pub records: u64,
    /// What it cost (the whole `Job::run`, start and join included).
    pub cost: Cost,
    /// Subtasks (threads) of the job.
    pub subtasks: usize,
    /// subtask → CPU.
    pub pinning: Value,
    /// When this is the median of several runs: each run's M records per CPU-second, sorted.
    pub spread: Option<String>,
    /// Context switches of the process per 1,000 records (voluntary and involuntary).
    pub switches_per_k: f64,
    /// The cache-line round trip between CPUs 0 and 1, ns, measured just before the run
    /// (the default unchained chain's runs only): these vCPUs sit close or far apart from
    /// one minute to the next, which moves a run's figure by up to 2×.
    pub round_trip_ns: Option<f64>,
}

/// `measure(f)`, and the process's context switches during it (voluntary, involuntary).
fn measure_switching<R>(f: impl FnOnce() -> R) -> (R, Cost, (u64, u64)) {
    use weir::ring::process::{CpuScope, context_switches};
    let (v0, i0) = context_switches(CpuScope::Process);
    let (out, cost) = measure(f);
    let (v1, i1) = context_switches(CpuScope::Process);
    (out, cost, (v1 - v0, i1 - i0))
}

/// Run `job` to its end, then `check` its output.
pub fn run(name: &str, job: &Job, records: u64, check: impl FnOnce()) -> Outcome {
    let (summary, cost, (voluntary, involuntary)) =
        measure_switching(|| job.run().unwrap_or_else(|e| panic!("{name}: {e}")));
    check();
    Outcome {
        name: name.into(),
        records,
        cost,
        subtasks: summary.subtasks.len(),
        pinning: pinning(&summary),
        spread: None,
        switches_per_k: (voluntary + involuntary) as f64 * 1000.0 / records.max(1) as f64,
        round_trip_ns: None,
    }
}

/// The chain with its first three subtasks on CPU 1 and the last two on CPU 0 (instead of
/// round robin, which puts every hop across the two): one ring between the CPUs. (A sink
/// takes no `cpus`: round robin puts it, the fifth subtask, on CPU 0.)
pub fn chain_in_blocks(n: u64) -> Job {
    let job = Job::new("chain-blocks");
    job.configure(|c| c.chaining = false);
    job.source("gen", 1, move |info| Generator::events(info, n, 10_000))
        .cpus(&[1])
        .map("m1", |e: &Event| Event { value: e.value + 1, ..*e })
        .cpus(&[1])
        .filter("f", |e: &Event| e.value > 0)
        .cpus(&[1])
        .map("m2", |e: &Event| Event { key: e.key ^ 1, ..*e })
        .cpus(&[0])
        .sink("sink", 1, |_| NullSink);
    job
}

/// generator → map → filter → map → null sink, parallelism 1.
pub fn chain(n: u64, chaining: bool) -> Job {
    let job = Job::new(if chaining { "chain-chained" } else { "chain-unchained" });
    job.configure(|c| c.chaining = chaining);
    job.source("gen", 1, move |info| Generator::events(info, n, 10_000))
        .map("m1", |e: &Event| Event { value: e.value + 1, ..*e })
        .filter("f", |e: &Event| e.value > 0)
        .map("m2", |e: &Event| Event { key: e.key ^ 1, ..*e })
        .sink("sink", 1, |_| NullSink);
    job
}

/// generator → key_by → counting sink, source and sink at `parallelism`.
pub fn keyed(n: u64, parallelism: u32, tally: Arc<Tally>) -> Job {
    let job = Job::new(&format!("keyby-p{parallelism}"));
    job.source("gen", parallelism, move |info| Generator::events(info, n, 10_000)).key_by("k", |e: &Event| e.key).sink(
        "count",
        parallelism,
        move |_| CountingSink::new(tally.clone()),
    );
    job
}

/// Records per run.
pub fn records(smoke: bool) -> u64 {
    if smoke { 100_000 } else { 10_000_000 }
}

/// The same job without credit by time (`inflight_target = None`): its rings fill to their
/// size. The baseline of the "target on" rows.
fn target_off(job: Job) -> Job {
    job.configure(|c| c.inflight_target = None);
    job
}

/// Suffix of a workload run with the in-flight target off.
pub const TARGET_OFF: &str = ", in-flight target off";

/// The same job with a header per record instead of frames (`record_frames = false`): the
/// ring layout before frames, the baseline of the "records in frames" rows.
fn plain_records(job: Job) -> Job {
    job.configure(|c| c.record_frames = false);
    job
}

/// Suffix of a workload run with a header per record.
pub const PLAIN: &str = ", one header per record";

/// The same job without latency markers (`latency_interval = None`): the baseline of the
/// "markers on" rows — what timing end-to-end latency at every sink costs.
fn markers_off(job: Job) -> Job {
    job.configure(|c| c.latency_interval = None);
    job
}

/// Suffix of a workload run without latency markers.
pub const MARKERS_OFF: &str = ", latency markers off";

/// The same job with the subtasks pinned to one CPU run as fibers of one thread
/// (`fibers = true`): what a hand-over between co-located subtasks costs without the kernel.
fn fibers(job: Job) -> Job {
    job.configure(|c| c.fibers = true);
    job
}

/// Suffix of a workload run as fibers.
pub const FIBERS: &str = ", fibers";

/// Runs of each job with the in-flight target on and off: the two alternate (off, on, off,
/// on, ...) and the median of each is reported, since one run of a 4- or 5-thread job on two
/// vCPUs varies by ±10 % from the next.
const TARGET_REPEATS: usize = 5;

/// The run with the median records per CPU-second; its name gets every run's figure, so
/// the spread shows.
fn median(mut runs: Vec<Outcome>) -> Outcome {
    runs.sort_by(|a, b| a.cost.per_cpu_s(a.records).total_cmp(&b.cost.per_cpu_s(b.records)));
    let all: Vec<String> = runs
        .iter()
        .map(|o| {
            let per_cpu = o.cost.per_cpu_s(o.records) / 1e6;
            match o.round_trip_ns {
                Some(rtt) => format!("{per_cpu:.2} (round trip {rtt:.0} ns)"),
                None => format!("{per_cpu:.2}"),
            }
        })
        .collect();
    let mut m = runs.swap_remove(runs.len() / 2);
    m.spread = Some(all.join(", "));
    m
}

/// Every workload, in order. The unchained chain and the p=2 exchange also run with the
/// in-flight target off, with a header per record and with latency markers off, alternating
/// with runs of the default, so each pair differs by that alone; each is the median of
/// `TARGET_REPEATS` runs (one in a smoke run).
pub fn run_all(smoke: bool) -> Vec<Outcome> {
    let n = records(smoke);
    let repeats = if smoke { 1 } else { TARGET_REPEATS };
    let mut outcomes = vec![run("stateless chain, chained", &chain(n, true), n, || {})];
    let keyed_run = |p: u32, variant: fn(Job) -> Job, label: &str| {
        let tally = Arc::new(Tally::default());
        let t = tally.clone();
        let job = variant(keyed(n, p, tally));
        run(label, &job, n, move || {
            assert_eq!(t.totals(), Tally::expected(n), "key_by p={p}: every record exactly once");
        })
    };
    let as_is: fn(Job) -> Job = |job| job;
    let name = "stateless chain, unchained";
    let (mut off, mut on, mut plain, mut unmarked) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut fibered = Vec::new();
    for _ in 0..repeats {
        off.push(run(&format!("{name}{TARGET_OFF}"), &target_off(chain(n, false)), n, || {}));
        let rtt = crate::floor::measure((Some(0), Some(1)), if smoke { 20_000 } else { 100_000 }, 3).rtt_ns;
        on.push(Outcome { round_trip_ns: Some(rtt), ..run(name, &chain(n, false), n, || {}) });
        plain.push(run(&format!("{name}{PLAIN}"), &plain_records(chain(n, false)), n, || {}));
        unmarked.push(run(&format!("{name}{MARKERS_OFF}"), &markers_off(chain(n, false)), n, || {}));
        fibered.push(run(&format!("{name}{FIBERS}"), &fibers(chain(n, false)), n, || {}));
    }
    outcomes.extend([median(off), median(on), median(plain), median(unmarked), median(fibered)]);
    outcomes.push(keyed_run(1, as_is, "key_by exchange, p=1"));
    let name = "key_by exchange, p=2";
    let (mut off, mut on, mut plain, mut unmarked) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut fibered = Vec::new();
    for _ in 0..repeats {
        off.push(keyed_run(2, target_off, &format!("{name}{TARGET_OFF}")));
        on.push(keyed_run(2, as_is, name));
        plain.push(keyed_run(2, plain_records, &format!("{name}{PLAIN}")));
        unmarked.push(keyed_run(2, markers_off, &format!("{name}{MARKERS_OFF}")));
        fibered.push(keyed_run(2, fibers, &format!("{name}{FIBERS}")));
    }
    outcomes.extend([median(off), median(on), median(plain), median(unmarked), median(fibered)]);
    outcomes
}

/// The markdown table `cargo bench --bench pipeline` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s =
        String::from("| workload | subtasks | records | wall s | records/s | CPU s | records per CPU-second |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for o in outcomes {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |\n",
            o.name,
            o.subtasks,
            o.records,
            o.cost.wall_s,
            o.cost.per_s(o.records) / 1e6,
            o.cost.cpu_s,
            o.cost.per_cpu_s(o.records) / 1e6
        ));
    }
    s
}

/// How the jobs ran (ring shape, record, idle strategy).
pub fn setup() -> Value {
    let config = Job::new("probe").config();
    json!({
        "record": { "type": "Event", "bytes": 32, "codec": "fixed layout, read in place" },
        "ring": { "slots": config.ring_slots, "slot_bytes": config.slot_bytes },
        "idle_strategy": format!("{:?}", config.idle),
    })
}

/// The JSON `cargo bench --bench pipeline` writes (and the section's details).
pub fn details(outcomes: &[Outcome]) -> Value {
    json!(
        outcomes
            .iter()
            .map(|o| json!({
                "workload": o.name,
                "subtasks": o.subtasks,
                "pinning": o.pinning,
                "records": o.records,
                "wall_s": o.cost.wall_s,
                "cpu_s": o.cost.cpu_s,
                "records_per_s": o.cost.per_s(o.records),
                "records_per_cpu_s": o.cost.per_cpu_s(o.records),
                "context_switches_per_1k_records": o.switches_per_k,
            }))
            .collect::<Vec<_>>()
    )
}

/// The baselines a default run is compared with: (suffix of the baseline's name, what
/// differs, the baseline's label, how the note names each side's runs, whether the default
/// must stay within 3 % of it).
const BASELINES: [(&str, &str, &str, [&str; 2], bool); 3] = [
    (TARGET_OFF, "in-flight target on (the default) vs off", "target off", ["on", "off"], true),
    (MARKERS_OFF, "latency markers on (the default) vs off", "markers off", ["on", "off"], true),
    (
        PLAIN,
        "records in frames (the default) vs a header each",
        "a header per record",
        ["frames", "a header each"],
        false,
    ),
];

/// The report section: records/s and records per CPU-second of each workload; unchained is
/// compared with chained (what the rings cost), p=2 with p=1 (how the exchange scales).
pub fn section(smoke: bool) -> Section {
    let outcomes = run_all(smoke);
    let mut s = Section::new("pipeline", "Stateless chain and key_by exchange (whole jobs)");
    let find = |name: &str| outcomes.iter().find(|o| o.name == name).expect("workload ran");
    for o in &outcomes {
        let (rate, per_cpu) = (o.cost.per_s(o.records), o.cost.per_cpu_s(o.records));
        // A default run against its baseline (this one: the same job with one thing off).
        if let Some((default, &(_, what, base_label, [default_runs, base_runs], target))) =
            BASELINES.iter().find_map(|b| Some((o.name.strip_suffix(b.0)?, b)))
        {
            let default = find(default);
            let mut row = Row::new(
                format!("{}: records per CPU-second, {what}", default.name),
                default.cost.per_cpu_s(default.records) / 1e6,
                "M records/CPU-s",
            )
            .vs(format!("{base_label} {:.2} M/CPU-s", per_cpu / 1e6), per_cpu / 1e6);
            if target {
                row = row.target("≥ 0.97× off", |ratio| ratio >= 0.97);
            }
            s.rows.push(row.note(format!(
                "medians of {TARGET_REPEATS} alternating runs each; {default_runs}: {}, {base_runs}: {} M/CPU-s",
                default.spread.as_deref().unwrap_or("-"),
                o.spread.as_deref().unwrap_or("-")
            )));
            continue;
        }
        // Fibers against threads (the default), median against median.
        if let Some(threads) = o.name.strip_suffix(FIBERS) {
            let threads = find(threads);
            let t_cpu = threads.cost.per_cpu_s(threads.records);
            s.rows.push(
                Row::new(format!("{}: records per CPU-second", o.name), per_cpu / 1e6, "M records/CPU-s")
                    .vs(format!("a thread per subtask {:.2} M/CPU-s", t_cpu / 1e6), t_cpu / 1e6)
                    .note(format!(
                        "medians of {TARGET_REPEATS} alternating runs each; fibers: {}, threads: {} M/CPU-s; \
                         records/s {} vs {}; context switches per 1k records {:.2} vs {:.2}",
                        o.spread.as_deref().unwrap_or("-"),
                        threads.spread.as_deref().unwrap_or("-"),
                        fmt_rate(rate),
                        fmt_rate(threads.cost.per_s(threads.records)),
                        o.switches_per_k,
                        threads.switches_per_k
                    )),
            );
            continue;
        }
        let base = match o.name.as_str() {
            "stateless chain, unchained" => Some(find("stateless chain, chained")),
            "key_by exchange, p=2" => Some(find("key_by exchange, p=1")),
            _ => None,
        };
        let mut wall = Row::new(format!("{}: records/s ({} subtasks)", o.name, o.subtasks), rate / 1e6, "M records/s");
        let mut cpu = Row::new(format!("{}: records per CPU-second", o.name), per_cpu / 1e6, "M records/CPU-s");
        if let Some(b) = base {
            let (b_rate, b_cpu) = (b.cost.per_s(b.records), b.cost.per_cpu_s(b.records));
            wall = wall.vs(format!("{} {}", b.name, fmt_rate(b_rate)), b_rate / 1e6);
            cpu = cpu.vs(format!("{} {:.2} M/CPU-s", b.name, b_cpu / 1e6), b_cpu / 1e6);
        }
        s.rows.push(wall);
        s.rows.push(cpu);
    }
    // #15's bar for the unchained chain, with the distance between the two CPUs beside each
    // run: these vCPUs sit close (~45-60 ns round trip) or far apart (~250-400 ns) from one
    // minute to the next, which moves this row more than most code changes do.
    let chain = find("stateless chain, unchained");
    s.rows.push(
        Row::new(
            "stateless chain, unchained, a thread per subtask: records per CPU-second against the bar",
            chain.cost.per_cpu_s(chain.records) / 1e6,
            "M records/CPU-s",
        )
        .target("≥ 25 M/CPU-s", |v| v >= 25.0)
        .note(format!(
            "the median of the runs {} M/CPU-s, each with the cache-line round trip CPU 0-1 measured \
             just before it; far apart the chain runs at 0.5-0.6 of its close figure",
            chain.spread.as_deref().unwrap_or("-")
        )),
    );
    let mut setup = setup();
    setup["records_per_run"] = json!(records(smoke));
    setup["pinning"] = json!(outcomes.iter().map(|o| (o.name.clone(), o.pinning.clone())).collect::<Vec<_>>());
    s.setup = setup;
    s.details = details(&outcomes);
    s
}

/// Run `job` (`n` records) the way the profiling examples (`chain_unchained`, `keyed`) do,
/// after the settings they share from the environment — `WEIR_FIBERS=1` (the subtasks
/// pinned to one CPU run as fibers of one thread), `WEIR_TARGET_OFF=1` (no credit by time) —
/// and print its throughput, context switches and the cache-line round trip between CPUs 0
/// and 1 measured just before. These vCPUs are sometimes close (~60–100 ns) and sometimes far
/// (~250–400 ns), which moves every figure; `WEIR_FLOOR=0` skips the round trip (under
/// valgrind, which runs one thread at a time, it would take minutes). `summary`: print the
/// job's summary first.
pub fn run_example(job: &Job, n: u64, summary: bool) {
    let on = |var: &str| std::env::var(var).is_ok_and(|v| v == "1");
    if on("WEIR_FIBERS") {
        job.configure(|c| c.fibers = true);
    }
    if on("WEIR_TARGET_OFF") {
        job.configure(|c| c.inflight_target = None);
    }
    let floor = if std::env::var("WEIR_FLOOR").is_ok_and(|v| v == "0") {
        f64::NAN
    } else {
        crate::floor::measure((Some(0), Some(1)), 200_000, 5).rtt_ns
    };
    let (ran, cost, (voluntary, involuntary)) = measure_switching(|| job.run().expect("runs"));
    if summary {
        println!("{ran}");
    }
    println!(
        "{:.2} M records/s, {:.2} M records per CPU-second, {:.3} context switches per 1k records ({} voluntary, {} involuntary); cache-line round trip CPU 0-1 {:.0} ns",
        cost.per_s(n) / 1e6,
        cost.per_cpu_s(n) / 1e6,
        (voluntary + involuntary) as f64 * 1000.0 / n as f64,
        voluntary,
        involuntary,
        floor
    );
}
