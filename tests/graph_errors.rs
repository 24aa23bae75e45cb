//! A bad graph is refused before anything runs, and the message names the node (builder) or
//! the line and field (job file) and says what to change. `weir validate` exits 78.

use std::path::Path;
use std::process::Command;
use weir::graph::jobfile::{self, JobFileError};
use weir::graph::{GraphError, Job};
use weir::operators::builtin::{Generator, NullSink};
use weir::record::Event;

fn events(job: &Job, id: &str, p: u32) -> weir::graph::Stream<Event> {
    job.source(id, p, |info| Generator::events(info, 10, 10))
}

/// Builder errors: parallelism 0, duplicate and bad ids, forward across parallelism,
/// too many keyed subtasks, an output going nowhere, no source.
#[test]
fn builder_errors_name_the_node() {
    let job = Job::new("p0");
    events(&job, "gen", 0).sink("out", 1, |_| NullSink);
    assert_eq!(job.validate(), Err(GraphError::Parallelism { node: "gen".into() }));

    let job = Job::new("dup");
    let s = events(&job, "x", 1);
    s.sink("x", 1, |_| NullSink);
    assert_eq!(job.validate(), Err(GraphError::DuplicateId { node: "x".into() }));

    let job = Job::new("badid");
    events(&job, "has space", 1).sink("out", 1, |_| NullSink);
    assert!(matches!(job.validate(), Err(GraphError::BadId { .. })));

    let job = Job::new("fwd");
    events(&job, "gen", 2).forward().sink("out", 3, |_| NullSink);
    let err = job.validate().unwrap_err();
    assert_eq!(
        err,
        GraphError::ForwardParallelism { from: "gen".into(), to: "out".into(), from_parallelism: 2, to_parallelism: 3 }
    );
    assert!(err.to_string().contains("use rebalance"), "{err}");

    let job = Job::new("kg");
    job.configure(|c| c.max_key_groups = 4);
    events(&job, "gen", 1).key_by("k", |e: &Event| e.key).sink("out", 8, |_| NullSink);
    assert!(matches!(job.validate(), Err(GraphError::KeyGroups { parallelism: 8, max_key_groups: 4, .. })));

    let job = Job::new("dangling");
    let s = events(&job, "gen", 1);
    s.map("lost", |e: &Event| *e);
    s.sink("out", 1, |_| NullSink);
    assert_eq!(job.validate(), Err(GraphError::Dangling { node: "lost".into() }));

    let job = Job::new("ring");
    job.configure(|c| c.ring_slots = 1000);
    events(&job, "gen", 1).sink("out", 1, |_| NullSink);
    let err = job.validate().unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
}

fn parse(text: &str) -> Result<jobfile::LoadedJob, JobFileError> {
    jobfile::parse(Path::new("job.toml"), text)
}

const HEAD: &str = "[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 10\n";

/// Job-file errors carry the line, column and field.
#[test]
fn job_file_errors_name_line_and_field() {
    let cases: &[(&str, usize, &str, &str)] = &[
        // (file, line, field, words the message must hold)
        ("[[source]]\nid = \"gen\"\ntype = \n", 3, "", "string"),
        ("[job]\nnmae = \"x\"\n", 2, "", "unknown field `nmae`"),
        (
            &format!("{HEAD}[[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"gne\"\n"),
            8,
            "sink[0].input",
            "`gne` is not a node",
        ),
        (
            &format!("{HEAD}parallelism = 0\n[[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"gen\"\n"),
            5,
            "source[0].parallelism",
            "parallelism 0",
        ),
        (
            &format!(
                "{HEAD}[[operator]]\nid = \"a\"\ntype = \"map\"\nfunction = \"identity\"\ninput = \"b\"\n[[operator]]\nid = \"b\"\ntype = \"map\"\nfunction = \"identity\"\ninput = \"a\"\n[[sink]]\nid = \"out\"\ntype = \"null\"\ninput = \"b\"\n"
            ),
            9,
            "operator[0].input",
            "cycle",
        ),
        (
            &format!(
                "{HEAD}[[operator]]\nid = \"s\"\ntype = \"sum_per_key\"\ninput = \"gen\"\n[[sink]]\nid = \"out\"\ntype = \"null\"\ninput = \"s\"\n"
            ),
            8,
            "operator[0].input",
            "put a key_by",
        ),
        (
            &format!("{HEAD}[[sink]]\nid = \"out\"\ntype = \"kinesis\"\ninput = \"gen\"\n"),
            7,
            "sink[0].type",
            "unknown sink type `kinesis`",
        ),
        (
            &format!(
                "{HEAD}parallelism = 2\n[[sink]]\nid = \"out\"\ntype = \"null\"\ninput = \"gen\"\nparallelism = 3\npartitioning = \"forward\"\n"
            ),
            11,
            "sink[0].partitioning",
            "is forward",
        ),
        (
            &format!(
                "{HEAD}[[operator]]\nid = \"m\"\ntype = \"map\"\ninput = \"gen\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"m\"\n"
            ),
            7,
            "operator[0].function",
            "needs `function`",
        ),
        (
            "[job]\nring_slots = 100\n[[source]]\nid = \"g\"\ntype = \"generator\"\n",
            2,
            "job.ring_slots",
            "power of two",
        ),
        ("[job]\nname = \"x\"\n", 0, "source", "no [[source]]"),
        (
            &format!(
                "[job]\nidle = \"latency\"\npinning = false\n{HEAD}[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"gen\"\n"
            ),
            2,
            "job.idle",
            "pins every subtask",
        ),
        (&format!("[job]\nidle = \"spin\"\n{HEAD}"), 2, "job.idle", "use park, latency"),
    ];
    for (text, line, field, words) in cases {
        let err = match parse(text) {
            Ok(_) => panic!("accepted a bad file:\n{text}"),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert_eq!(err.line, *line, "line of: {shown}\n{text}");
        assert_eq!(err.field, *field, "field of: {shown}");
        assert!(shown.contains(words), "message `{shown}` should say `{words}`");
        assert!(shown.starts_with("job.toml:"), "{shown}");
    }
}

/// Every example job file in tests/jobs validates; `weir validate` prints the plan and
/// exits 0 for them, and exits 78 with line and field for a bad file.
#[test]
fn example_jobs_validate_and_cli_exit_codes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            jobfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            let out = Command::new(env!("CARGO_BIN_EXE_weir")).arg("validate").arg(&path).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert!(String::from_utf8_lossy(&out.stdout).contains("chain 0:"));
            seen += 1;
        }
    }
    assert!(seen >= 2, "example job files in {}", dir.display());

    let bad = std::env::temp_dir().join(format!("weir-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, format!("{HEAD}[[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"nope\"\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weir")).arg("validate").arg(&bad).output().unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(":8:9: field `sink[0].input`: `nope` is not a node"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_weir")).arg("validate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}

/// A job file runs, with exact results.
#[test]
fn job_file_runs() {
    let loaded = jobfile::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/keyed-sum.toml")).unwrap();
    loaded.job.configure(|c| c.pinning = false);
    let summary = loaded.job.run().unwrap();
    assert_eq!(summary.node("events").unwrap().records_out, 2_000_000);
    let (_, tally) = &loaded.tallies[0];
    // One result per key; the sums were checked by keyed_sum_is_exact.
    assert_eq!(tally.totals().0, 10_000);
}

/// An in-flight target for a node the job does not have, or one of zero, is refused before
/// anything starts, naming the setting.
#[test]
fn inflight_target_settings_are_checked() {
    use std::time::Duration;
    use weir::operators::builtin::{CountingSink, Generator};
    let build = |f: &dyn Fn(&mut weir::graph::JobConfig)| {
        let job = weir::graph::Job::new("targets");
        job.configure(|c| f(c));
        job.source("gen", 1, |info| Generator::events(info, 10, 1)).sink("out", 1, |_| CountingSink::default());
        job.validate()
    };
    build(&|_| {}).expect("the default");
    let e = build(&|c| {
        c.node_inflight_targets.insert("nope".into(), Some(Duration::from_millis(5)));
    })
    .expect_err("an unknown node");
    assert!(e.to_string().contains("`nope`"), "{e}");
    let e = build(&|c| c.inflight_target = Some(Duration::ZERO)).expect_err("zero");
    assert!(e.to_string().contains("inflight_target"), "{e}");
}

/// Busy-spin (the latency profile) with more subtasks than CPUs is refused at validate: a
/// spinner would take the CPU from the subtasks it waits for. Parking, the same job is fine.
#[test]
fn busy_spin_needs_a_cpu_per_subtask() {
    let cpus = core_affinity::get_core_ids().map_or(1, |c| c.len()) as u32;
    let build = |idle| {
        let job = Job::new("spin");
        job.configure(|c| c.idle = idle);
        events(&job, "gen", cpus).rebalance().sink("out", 1, |_| NullSink);
        job
    };
    let err = build(weir::ring::IdleStrategy::BusySpin).validate().unwrap_err();
    assert!(matches!(err, GraphError::Setting { field: "idle", .. }), "{err}");
    let shown = err.to_string();
    assert!(shown.contains(&format!("{} subtasks and {cpus} CPUs", cpus + 1)), "{shown}");
    assert!(shown.contains("idle = \"park\""), "says what to use instead: {shown}");
    assert_eq!(build(weir::ring::IdleStrategy::default()).validate(), Ok(()));
}
