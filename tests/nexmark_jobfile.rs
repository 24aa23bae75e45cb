//! Nexmark's events in job files (`type = "nexmark"`): tests/jobs/nexmark-q2.toml's rows are
//! exactly a single-threaded reference's over the same generator's events, at p = 1, 2 and 4,
//! in order and out of order; a bad setting is refused by name.

use std::path::{Path, PathBuf};
use weir::graph::jobfile;
use weir::io::nexmark::{NexmarkConfig, NexmarkEvent};

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-nexmark-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Every line of every finished part file in `dir`, sorted.
fn rows(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the sink's directory") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("part-") && !name.ends_with(".inprogress"), "{name}: a part, finished");
        out.extend(std::fs::read_to_string(&path).unwrap().lines().map(str::to_owned));
    }
    out.sort();
    out
}

/// q2 by hand over the generator's events, in sequence order: bids on every 123rd auction.
fn q2_reference(config: &NexmarkConfig) -> Vec<String> {
    let mut out: Vec<String> = config
        .events_in_order(u64::MAX)
        .enumerate()
        .filter_map(|(offset, e)| match e {
            NexmarkEvent::Bid(b) if b.auction % 123 == 0 => {
                Some(format!("key={} value={} time_ns={} seq={offset}", b.auction, b.price, b.date_time * 1_000_000))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// tests/jobs/nexmark-q2.toml with `events`, `p` and the out-of-order group size set.
fn run_q2(events: u64, rate: u64, group: u64, p: u32, out: &Path) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/nexmark-q2.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("rate = 10000000 ", &format!("rate = {rate}\nout_of_order_group_size = {group}\n#"));
    let out = out.to_string_lossy().into_owned();
    let vars = move |name: &str| match name {
        "NEXMARK_EVENTS" => Some(events.to_string()),
        "NEXMARK_P" => Some(p.to_string()),
        "Q2_OUT" => Some(out.clone()),
        _ => None,
    };
    let loaded = jobfile::parse_with(&path, &text, &vars).unwrap_or_else(|e| panic!("{e}"));
    loaded.job.run().expect("the job file runs");
}

/// q2 from its job file: every row the reference's, none twice, at p = 1, 2, 4, with the
/// suite's rate and with a slow rate and out-of-order groups.
#[test]
fn q2_job_file_is_exact() {
    for (events, rate, group) in [(200_000u64, 10_000_000u64, 1u64), (123_457, 7_000, 37)] {
        let config = NexmarkConfig {
            out_of_order_group_size: group,
            ..NexmarkConfig::new(Some(events), rate, 1_735_689_600_000)
        };
        let expected = q2_reference(&config);
        assert!(expected.len() > 50, "the reference has rows: {}", expected.len());
        for p in [1u32, 2, 4] {
            let dir = scratch(&format!("q2-{events}-{p}"));
            run_q2(events, rate, group, p, &dir);
            let got = rows(&dir);
            assert_eq!(got.len(), expected.len(), "events={events} group={group} p={p}: row count");
            assert!(got == expected, "events={events} group={group} p={p}: rows differ from the reference");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// A setting the generator cannot use is refused with its key; so is an unknown field.
#[test]
fn bad_settings_are_refused_by_name() {
    let path = Path::new("nexmark.toml");
    let job = |extra: &str| {
        format!(
            "[job]\nname = \"n\"\n[[source]]\nid = \"bids\"\ntype = \"nexmark\"\nevents = 1000\n{extra}\n\
             [[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"bids\"\n"
        )
    };
    let ok = jobfile::parse(path, &job("rate = 1000")).unwrap_or_else(|e| panic!("{e}"));
    ok.job.run().expect("runs");
    let e = jobfile::parse(path, &job("hot_auction_ratio = 0")).expect_err("a zero ratio");
    assert!(e.field.ends_with("hot_auction_ratio"), "{e}");
    let e = jobfile::parse(path, &job("key = \"colour\"")).expect_err("no such field");
    assert!(e.field.ends_with("key") && e.message.contains("bidder"), "{e}");
    let e = jobfile::parse(path, &job("emit = \"cars\"")).expect_err("no such events");
    assert!(e.field.ends_with("emit"), "{e}");
}
