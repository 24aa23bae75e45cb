//! Windows in job files: the example runs with exact results, and a bad window is refused
//! with the line and field.

use std::collections::HashSet;
use std::path::Path;
use weir::graph::jobfile::{self, JobFileError};
use weir::record::hash_key;

/// tests/jobs/windowed-counts.toml: every event counted once, none late, one result per
/// (key, second) that has events — computed here from the generator's formulas.
#[test]
fn windowed_job_file_is_exact() {
    let loaded = jobfile::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/windowed-counts.toml")).unwrap();
    loaded.job.configure(|c| c.pinning = false);
    let plan = loaded.job.describe().unwrap();
    assert!(plan.contains("events (source) -> events.wm (watermark)"), "the assigner chains into the source:\n{plan}");
    let summary = loaded.job.run().unwrap();
    const N: u64 = 2_000_000;
    let w = summary.node("per_second").unwrap();
    assert_eq!((w.records_in, w.late_records), (N, 0), "out of order within the bound: nothing late");
    let mut windows = HashSet::new();
    for seq in 0..N {
        let key = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 10_000;
        let time_ns = (seq * 1_000).saturating_sub(hash_key(&seq) % (2_000_000 + 1));
        windows.insert((key, time_ns / 1_000_000_000));
    }
    let (_, tally) = &loaded.tallies[0];
    let (results, records, _) = tally.totals();
    assert_eq!(records, N, "the results' counts add up to every event");
    assert_eq!(results, windows.len() as u64, "one result per key and second");
}

fn parse(text: &str) -> Result<jobfile::LoadedJob, JobFileError> {
    jobfile::parse(Path::new("job.toml"), text)
}

const HEAD: &str = "[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 10\ntimestamp = \"time_ns\"\n\
[[operator]]\nid = \"k\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"gen\"\n";

/// Window errors carry the line, column and field, and say what to write.
#[test]
fn window_errors_name_line_and_field() {
    let window = |body: &str| format!("{HEAD}[[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"k\"\n{body}");
    let sink = "[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"w\"\n";
    let cases: Vec<(String, usize, &str, &str)> = vec![
        // (file, line, field, words the message must hold)
        (window(&format!("window = \"hopping\"\nsize_ms = 5\naggregate = [\"count\"]\n{sink}")), 15, "operator[1].window", "unknown window `hopping`"),
        (window(&format!("window = \"sliding\"\nsize_ms = 5\naggregate = [\"count\"]\n{sink}")), 15, "operator[1].slide_ms", "needs `slide_ms`"),
        (window(&format!("window = \"sliding\"\nsize_ms = 5\nslide_ms = 9\naggregate = [\"count\"]\n{sink}")), 17, "operator[1].slide_ms", "at most size_ms"),
        (window(&format!("window = \"tumbling\"\nsize_ms = 0\naggregate = [\"count\"]\n{sink}")), 16, "operator[1].size_ms", "at least 1"),
        (window(&format!("window = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\", \"median\"]\n{sink}")), 17, "operator[1].aggregate", "unknown aggregate `median`"),
        (window(&format!("window = \"session\"\ngap_ms = 5\n{sink}")), 13, "operator[1].aggregate", "needs `aggregate`"),
        (window(&format!("window = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\"]\nvalue = \"price\"\n{sink}")), 18, "operator[1].value", "unknown field `price`"),
        (
            window("window = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\"]\n[[operator]]\nid = \"m\"\ntype = \"map\"\nfunction = \"identity\"\ninput = \"w\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"m\"\n"),
            22,
            "operator[2].input",
            "emits window results",
        ),
        (
            format!("[[source]]\nid = \"gen\"\ntype = \"generator\"\n[[operator]]\nid = \"k\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"gen\"\n[[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"k\"\nwindow = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\"]\n{sink}"),
            11,
            "operator[1].event_time",
            "set `timestamp = \"time_ns\"` on the source",
        ),
        (
            format!("[[source]]\nid = \"gen\"\ntype = \"generator\"\n[[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"gen\"\nwindow = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\"]\n{sink}"),
            7,
            "operator[0].input",
            "put a key_by",
        ),
        (
            "[[source]]\nid = \"gen\"\ntype = \"generator\"\ntimestamp = \"created_at\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"gen\"\n".to_owned(),
            4,
            "source[0].timestamp",
            "unknown timestamp field `created_at`",
        ),
    ];
    for (text, line, field, words) in &cases {
        let err = match parse(text) {
            Ok(_) => panic!("accepted a bad file:\n{text}"),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert_eq!(err.line, *line, "line of: {shown}\n{text}");
        assert_eq!(err.field, *field, "field of: {shown}");
        assert!(shown.contains(words), "message `{shown}` should say `{words}`");
    }
    // Processing-time windows need no event time.
    let ok = format!(
        "[[source]]\nid = \"gen\"\ntype = \"generator\"\n[[operator]]\nid = \"k\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"gen\"\n[[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"k\"\nwindow = \"tumbling\"\nsize_ms = 5\naggregate = [\"count\"]\nevent_time = false\n{sink}"
    );
    parse(&ok).unwrap_or_else(|e| panic!("{e}"));
}
