//! The io sinks in job files: `file`, `tcp` and `http` sink types, their settings, and errors
//! that name the line, the column and the field.

use std::path::Path;
use std::time::{Duration, Instant};
use weir::graph::jobfile::{self, JobFileError};
use weir::operators::builtin::Tally;
use weir_tools::slow_api::{SlowApi, SlowApiConfig};

const SOURCE: &str = "[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 5000\nkeys = 10\n\n";

fn parse(text: &str) -> Result<jobfile::LoadedJob, JobFileError> {
    jobfile::parse(Path::new("io.toml"), text)
}

fn error(sink: &str) -> JobFileError {
    parse(&format!("{SOURCE}[[sink]]\nid = \"out\"\ninput = \"gen\"\n{sink}")).expect_err("a bad sink")
}

/// Each mistake is refused with its line, column and field, and what to write instead.
#[test]
fn io_sink_settings_are_checked_with_line_and_field() {
    let cases: &[(&str, usize, &str, &str)] = &[
        ("type = \"http\"\n", 10, "sink[0].url", "needs `url`"),
        ("type = \"http\"\nurl = \"ftp://api\"\n", 11, "sink[0].url", "not an http:// or https:// URL"),
        (
            "type = \"http\"\nurl = \"https://api\"\nca_file = \"/nonexistent/ca.pem\"\n",
            12,
            "sink[0].ca_file",
            "cannot read the CA file /nonexistent/ca.pem",
        ),
        ("type = \"http\"\nurl = \"https://api\"\nclient_cert = \"c.pem\"\n", 12, "sink[0].client_cert", "together"),
        ("type = \"http\"\nurl = \"http://h:1/\"\nmax_in_flight = 0\n", 12, "sink[0].max_in_flight", "1 to 256"),
        ("type = \"http\"\nurl = \"http://h:1/\"\nbody = \"xml\"\n", 12, "sink[0].body", "json_lines or json_array"),
        ("type = \"http\"\nurl = \"http://h:1/\"\nbatch_records = 0\n", 12, "sink[0].batch_records", "1 to"),
        ("type = \"file\"\n", 10, "sink[0].path", "needs `path`"),
        ("type = \"file\"\npath = \"d\"\nformat = \"csv\"\n", 12, "sink[0].format", "lines, raw or length_prefixed"),
        ("type = \"file\"\npath = \"d\"\nurl = \"http://h/\"\n", 12, "sink[0].url", "belongs to http sinks"),
        ("type = \"tcp\"\naddress = \"localhost\"\n", 11, "sink[0].address", "not host:port"),
        ("type = \"count\"\nmax_in_flight = 4\n", 11, "sink[0].max_in_flight", "not a setting of a count sink"),
        ("type = \"kinesis\"\n", 10, "sink[0].type", "file, tcp, http, postgres, kafka or ipc"),
        ("type = \"ipc\"\non_poison = \"ignore\"\n", 11, "sink[0].on_poison", "use \"fail\" or \"reset\""),
        ("type = \"ipc\"\nslots = 3\n", 11, "sink[0].slots", "power of two"),
        ("type = \"kafka\"\n", 10, "sink[0].bootstrap", "needs `bootstrap`"),
    ];
    for &(sink, line, field, says) in cases {
        let e = error(sink);
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
        assert!(e.column > 0 && e.message.contains(says), "{sink:?}: {e}");
    }
}

/// A job file with a file sink and an HTTP sink runs: the part files hold every record once,
/// the slow API counts every record once, and the idempotency keys start with the job name.
#[test]
fn job_file_with_file_and_http_sinks_runs() {
    let api = SlowApi::start(SlowApiConfig {
        latency: Duration::from_millis(1),
        fail_every: Some(9),
        log: Some(std::env::temp_dir().join(format!("weir-io-jobfile-api-{}.jsonl", std::process::id()))),
        max_run: Duration::from_secs(300),
        ..Default::default()
    })
    .unwrap();
    let dir = std::env::temp_dir().join(format!("weir-io-jobfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "[job]\nname = \"io-job\"\n\n{SOURCE}\
         [[sink]]\nid = \"files\"\ntype = \"file\"\ninput = \"gen\"\npath = \"{}\"\n\n\
         [[sink]]\nid = \"api\"\ntype = \"http\"\ninput = \"gen\"\npartitioning = \"rebalance\"\nparallelism = 2\n\
         url = \"{}\"\nmax_in_flight = 2\nbatch_records = 64\nbody = \"json_array\"\nmax_retries = 20\n",
        dir.display(),
        api.url("/events")
    );
    let loaded = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let running = loaded.job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().expect("job finishes");
    let seen = api.stop();
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), Tally::expected(5000));
    assert!(seen.failed > 0, "503s were injected and retried");

    let text = std::fs::read_to_string(dir.join("part-0-0")).unwrap();
    assert_eq!(text.lines().count(), 5000);
    let log =
        std::fs::read_to_string(std::env::temp_dir().join(format!("weir-io-jobfile-api-{}.jsonl", std::process::id())))
            .unwrap();
    assert!(
        log.contains("\"key\":\"io-job/api-0/0/0\"") && log.contains("\"key\":\"io-job/api-1/0/0\""),
        "keys name job, node, subtask, epoch, batch"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ =
        std::fs::remove_file(std::env::temp_dir().join(format!("weir-io-jobfile-api-{}.jsonl", std::process::id())));
}

/// Credit by time in job files: `inflight_target_ms` in `[job]` (0 turns it off) and on a
/// node (its inputs' own; 0: they announce nothing); a source reads no rings, so the key is
/// refused there, as is a target over an hour.
#[test]
fn inflight_targets_in_job_files() {
    let sink = "[[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"gen\"\n";
    let job = |head: &str, sink_extra: &str| parse(&format!("{head}{SOURCE}{sink}{sink_extra}"));
    let default = job("", "").expect("a job without the key");
    assert_eq!(default.job.config().inflight_target, Some(weir::graph::DEFAULT_INFLIGHT_TARGET));
    let off = job("[job]\ninflight_target_ms = 0\n", "").expect("0 turns it off");
    assert_eq!(off.job.config().inflight_target, None);
    let set = job("[job]\ninflight_target_ms = 250\n", "inflight_target_ms = 20\n").expect("both set");
    let c = set.job.config();
    assert_eq!(c.inflight_target, Some(Duration::from_millis(250)));
    assert_eq!(c.node_inflight_targets.get("out"), Some(&Some(Duration::from_millis(20))));
    let node_off = job("", "inflight_target_ms = 0\n").expect("0 on a node");
    assert_eq!(node_off.job.config().node_inflight_targets.get("out"), Some(&None));
    set.job.validate().expect("a valid plan");

    let e = job("[job]\ninflight_target_ms = 3600001\n", "").expect_err("over an hour");
    assert_eq!((e.line, e.field.as_str()), (2, "job.inflight_target_ms"), "{e}");
    let e = job("", "inflight_target_ms = 99999999\n").expect_err("over an hour on a node");
    assert_eq!(e.field, "sink[0].inflight_target_ms", "{e}");
    let e = parse(&format!("{}\ninflight_target_ms = 5\n\n{sink}", SOURCE.trim_end())).expect_err("on a source");
    assert!(e.field.ends_with("inflight_target_ms") && e.message.contains("reads no rings"), "{e}");
}

/// An `ipc` source in a job file: a publisher (here, in this process) connects by job and
/// endpoint name under the user's root, sends events, closes; the job counts them all and
/// removes its endpoint when it ends.
#[test]
fn job_file_with_an_ipc_source_runs() {
    use weir::record::{Event, Record};
    let job_name = format!("ipc-jobfile-{}", std::process::id());
    let text = format!(
        "[job]\nname = \"{job_name}\"\npinning = false\n\n[[source]]\nid = \"ticks\"\ntype = \"ipc\"\nslots = 64\n\n\
         [[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"ticks\"\n"
    );
    let loaded = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let tally = loaded.tallies[0].1.clone();
    let running = loaded.job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut publisher = loop {
        match weir_ring::ipc::Publisher::connect_to(&job_name, "ticks", 0) {
            Ok(p) => break p,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let mut idler = weir_ring::Idler::new(weir_ring::IdleStrategy::default());
    for seq in 0..5000u64 {
        let e = Event { key: seq % 10, value: seq % 100 + 1, time_ns: seq * 1000, seq };
        let mut bytes = vec![0u8; e.encoded_len()];
        e.encode(&mut bytes);
        publisher.send(&bytes, &mut idler).unwrap();
    }
    publisher.close();
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().expect("job finishes");
    assert_eq!(tally.totals(), Tally::expected(5000));
    let endpoint = weir_ring::ipc::endpoint_path(&weir_ring::ipc::user_root(), &job_name, "ticks", 0);
    assert!(!endpoint.exists(), "the endpoint goes with the job");
    assert!(!endpoint.parent().unwrap().exists(), "and the directory it made for it");
}

/// A filter's side output in a job file (`tests/jobs/side-output.toml`): what it keeps and
/// what it drops reach their own sinks, each record exactly once in one of them; a sink
/// reading a side output nobody declared, or a bad side output name, is refused with the
/// line and the field.
#[test]
fn a_filters_side_output_goes_to_its_own_sink() {
    use std::sync::atomic::Ordering::Acquire;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/side-output.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let loaded = jobfile::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let summary = loaded.job.run().expect("the job file runs");
    let tally = |id: &str| {
        let t = &loaded.tallies.iter().find(|(i, _)| i == id).expect("a count sink").1;
        (t.count.load(Acquire), t.seq_sum.load(Acquire), t.value_sum.load(Acquire))
    };
    // The generator's events: seq 0..100 000, value seq % 100 + 1.
    let (mut kept, mut dropped) = ((0u64, 0u64, 0u64), (0u64, 0u64, 0u64));
    for seq in 0..100_000u64 {
        let value = seq % 100 + 1;
        let t = if value < 30 { &mut kept } else { &mut dropped };
        *t = (t.0 + 1, t.1.wrapping_add(seq), t.2.wrapping_add(value));
    }
    assert_eq!(tally("kept"), kept, "the filter's main output");
    assert_eq!(tally("dropped"), dropped, "its side output");
    // The window's late records: as many as it counted late, each once, the rest in windows
    // (the count sink sums window results' counts into its seq checksum).
    let late = summary.node("per_key").expect("the window").late_records;
    assert!(late > 0, "the jitter makes some records late");
    assert_eq!(tally("late").0, late, "the late stream holds what was counted late");
    assert_eq!(tally("windows").1 + late, 100_000, "every event in a window or late, once");

    let undeclared = text.replace("side_output = \"dropped\"", "");
    let e = jobfile::parse(&path, &undeclared).expect_err("no such side output");
    assert!(e.message.contains("`small` has no side output `dropped`") && e.field.ends_with("input"), "{e}");
    let bad = text.replace("side_output = \"dropped\"", "side_output = \"a.b\"");
    let e = jobfile::parse(&path, &bad).expect_err("a bad name");
    assert_eq!(e.line, 20, "{e}");
    assert!(e.field.ends_with("side_output") && e.message.contains("letters, digits"), "{e}");
}
