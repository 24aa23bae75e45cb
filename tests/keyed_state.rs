//! Keyed state for user operators (`process_with_state`): value, list and map state, end to
//! end. A keyed operator keeps per key a running count (value state), the values seen (list
//! state) and a count per bucket of the value (map state), and emits one record per input
//! record saying what its state said then. Runs are cancelled after a few checkpoints and
//! restored, at another parallelism each time (1 → 2 → 4 → 1), with the state in RocksDB
//! and in memory; the exactly-once file sink's committed output must then be exactly what
//! one run without failures gives: per key, counts 1..n once each, list sums that are the
//! prefix sums of the values in count order, per-bucket counts 1..m once each.

mod common;

use common::counting::{run_until_checkpoints, temp_dir};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use weir::checkpoint::CheckpointSettings;
use weir::graph::{Job, StateBackendKind};
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::Generator;
use weir::operators::{Halt, KeyedProcess};
use weir::record::Event;
use weir::state::{KeyedState, ListState, MapState, ValueState};

const N: u64 = 60_000;
const KEYS: u64 = 500;

/// Per key: how many records so far, their values, and how many per `value % 4`.
struct Tally {
    count: ValueState<u64, u64>,
    values: ListState<u64, u64>,
    buckets: MapState<u64, u32, u64>,
}

impl Tally {
    fn new(state: &KeyedState) -> Tally {
        Tally { count: state.value("count"), values: state.list("values"), buckets: state.map("buckets") }
    }
}

impl KeyedProcess<Event, Event> for Tally {
    fn process(&mut self, e: &Event, kg: u32, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        let count = self.count.get(kg, &e.key)?.unwrap_or(0) + 1;
        self.count.put(kg, &e.key, &count)?;
        self.values.push(kg, &e.key, &e.value)?;
        let list_sum: u64 = self.values.get(kg, &e.key)?.iter().sum();
        let bucket = (e.value % 4) as u32;
        let in_bucket = self.buckets.get(kg, &e.key, &bucket)?.unwrap_or(0) + 1;
        self.buckets.put(kg, &e.key, &bucket, &in_bucket)?;
        // At most 4 buckets whatever happened before.
        assert!(self.buckets.entries(kg, &e.key)?.len() <= 4);
        // key, seq: the input; value: count and bucket count; time_ns: the list's sum.
        out(&Event { key: e.key, seq: e.seq, value: count * 1_000_000 + in_bucket, time_ns: list_sum })
    }
}

fn job(dir: &Path, parallelism: (u32, u32), backend: StateBackendKind, rate: Option<f64>) -> Job {
    let job = Job::new("keyed-state");
    let chk = dir.join("chk");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(30),
            timeout: Duration::from_secs(20),
            ..CheckpointSettings::new(&chk)
        });
        c.state.backend = backend;
    });
    let out = dir.join("out");
    job.source("gen", 2, move |info| {
        let g = Generator::events(info, N, KEYS);
        match rate {
            Some(r) => g.with_rate(r),
            None => g,
        }
    })
    .key_by("k", |e: &Event| e.key)
    .process_with_state("tally", parallelism.0, |_info, state| Tally::new(state))
    .sink("out", parallelism.1, move |info| FileSink::new(FileSinkConfig::new(&out), info));
    job
}

/// Every committed output record, by input sequence number (each once).
fn committed(out: &Path) -> BTreeMap<u64, Event> {
    let mut by_seq = BTreeMap::new();
    for f in std::fs::read_dir(out).unwrap().map(|e| e.unwrap().path()) {
        if f.to_string_lossy().ends_with(".inprogress") {
            continue;
        }
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            // key=K value=V time_ns=T seq=S
            let field = |name: &str| -> u64 {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{}: bad line {line:?}", f.display()))
            };
            let e = Event { key: field("key"), value: field("value"), time_ns: field("time_ns"), seq: field("seq") };
            assert!(by_seq.insert(e.seq, e).is_none(), "input record {} emitted twice: state restored wrong", e.seq);
        }
    }
    by_seq
}

/// The output is what one run without failures gives (see the module docs).
fn check(out: &BTreeMap<u64, Event>) {
    assert_eq!(out.len() as u64, N, "one output per input record");
    let mut per_key: BTreeMap<u64, Vec<&Event>> = BTreeMap::new();
    for (seq, e) in out {
        assert_eq!(e.key, seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS, "record {seq}: key");
        per_key.entry(e.key).or_default().push(e);
    }
    for (key, mut records) in per_key {
        records.sort_by_key(|e| e.value / 1_000_000);
        let mut sum = 0;
        let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
        for (i, e) in records.iter().enumerate() {
            let value = e.seq % 100 + 1;
            sum += value;
            let in_bucket = buckets.entry(value % 4).or_default();
            *in_bucket += 1;
            assert_eq!(e.value / 1_000_000, i as u64 + 1, "key {key}: counts 1..n, each once");
            assert_eq!(e.time_ns, sum, "key {key}, count {}: the list held exactly the values before", i + 1);
            assert_eq!(e.value % 1_000_000, *in_bucket, "key {key}, count {}: the bucket's count", i + 1);
        }
    }
}

/// Run at each (operator, sink) parallelism of `steps` in turn, each run restoring the last
/// one's checkpoint; all but the last are cancelled after three checkpoints.
fn rescale_loop(name: &str, backend: StateBackendKind, steps: &[(u32, u32)]) {
    let dir = temp_dir(&format!("keyed-state-{name}"));
    let (last, runs) = steps.split_last().unwrap();
    for (i, &step) in runs.iter().enumerate() {
        let restored = run_until_checkpoints(job(&dir, step, backend, Some(20_000.0)), 3);
        assert_eq!(restored.is_some(), i > 0, "{name} at {step:?}: restored");
    }
    let summary = job(&dir, *last, backend, None).run().unwrap();
    assert!(summary.checkpoints.restored_from.is_some(), "{name}: the last run restored");
    check(&committed(&dir.join("out")));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// State in RocksDB: restored from the shards' snapshots, key groups moving between shards
/// as the operator's parallelism changes.
#[test]
fn value_list_and_map_state_restore_exactly_on_rocksdb_at_any_parallelism() {
    rescale_loop("rocksdb", StateBackendKind::RocksDb, &[(1, 1), (2, 2), (4, 3), (1, 1)]);
}

/// State in memory: in the checkpoint's bytes, each subtask taking its key groups.
#[test]
fn value_list_and_map_state_restore_exactly_in_memory_at_any_parallelism() {
    rescale_loop("memory", StateBackendKind::Memory, &[(1, 1), (2, 2), (4, 3), (1, 1)]);
}

/// Without failures the output is the same (the check itself is right).
#[test]
fn one_run_gives_the_expected_output() {
    let dir = temp_dir("keyed-state-once");
    job(&dir, (2, 1), StateBackendKind::RocksDb, None).run().unwrap();
    check(&committed(&dir.join("out")));
    std::fs::remove_dir_all(&dir).unwrap();
}
