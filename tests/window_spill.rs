//! Window state far larger than the cache, on RocksDB: nearly every record starts a partial
//! slot (no read), evicted as merge operands, so one window's partials for one key are spread
//! over the cache, the memtable and several SST files when it fires. Results are exact.

mod common;

use common::counting::{counting_job_spilling, run_until_checkpoints, temp_dir};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::graph::{Job, StateBackendKind};
use weir::operators::builtin::{CollectSink, Generator};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, MIN_CACHE_BYTES, Window, WindowResult};

const KEYS: u64 = 20_000;
const N: u64 = 600_000;
/// 1 µs of event time per record: two windows, the second partly filled.
const WINDOW_NS: u64 = 400_000_000;

#[test]
fn partials_spread_over_cache_memtable_and_sst_files_fire_exactly() {
    let dir = std::env::temp_dir().join(format!("weir-window-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out: Arc<Mutex<Vec<WindowResult>>> = Arc::default();
    let job = Job::new("window-spill");
    job.configure(|c| {
        c.pinning = false;
        c.state.backend = StateBackendKind::RocksDb;
        c.state.dir = Some(dir.clone());
        // The smallest memtables: the operands of one window flush to many SST files.
        c.state.memtable_bytes = 1 << 20;
    });
    let sink_out = out.clone();
    job.source("gen", 1, |info| Generator::events(info, N, KEYS).with_time_jitter(50_000))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_micros(50)))
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_nanos(WINDOW_NS)))
        .cache_bytes(MIN_CACHE_BYTES)
        .aggregate("w", 1, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |_| CollectSink::new(sink_out.clone()));
    let summary = job.run().expect("the job runs");
    let w = summary.node("w").unwrap();
    assert!(w.evicted_keys > N / 2, "most records missed the cache: {} keys evicted", w.evicted_keys);
    assert_eq!(w.late_records, 0);
    let ssts = std::fs::read_dir(dir.join("shard-0"))
        .map(|d| d.filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sst"))).count())
        .unwrap_or(0);
    println!("{} keys evicted, {ssts} SST files left in the shard", w.evicted_keys);
    // Each eviction writes an operand of ~70 bytes: far more than the 1 MiB of memtables, so
    // the partials of the first window were flushed to SST files before it fired.
    assert!(w.evicted_keys * 70 > 8 << 20, "operands outgrow the memtables many times");
    // The model: (key, window start) -> (count, sum, min, max), from the generator's formulas.
    let mut want: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for seq in 0..N {
        let key = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
        let t = (seq * 1_000).saturating_sub(weir::record::hash_key(&seq) % 50_001);
        let e = want.entry((key, t / WINDOW_NS * WINDOW_NS)).or_default();
        e.0 += 1;
        e.1 += seq % 100 + 1;
    }
    let got: BTreeMap<(u64, u64), (u64, u64)> =
        out.lock().unwrap().iter().map(|r| ((r.key, r.start_ns), (r.count, r.sum))).collect();
    assert_eq!(out.lock().unwrap().len(), got.len(), "each window fires once");
    assert_eq!(got.len(), want.len());
    assert!(got == want, "every window exact");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bytes flipped in the middle of every SST file of the newest checkpoint (the files the
/// shards are restored from, hard links shared with older checkpoints): the restarted job
/// fails with an error that names the operator, the shard and the key group being read (or
/// the key groups being restored, when RocksDB meets the damage as the shard is rebuilt, or
/// those the shard holds, when it meets it as the rebuilt shard opens) — no panic, no
/// result from the corrupt state.
#[test]
fn a_corrupted_sst_fails_the_job_naming_shard_and_key_group() {
    // Bytes inside the first data block (an SST opens with its data blocks; filter, index
    // and footer come last). Its first entry alone is over 20 bytes (three varints, a key of
    // key group, key and RocksDB's 8-byte sequence, a value), so bytes 4..16 are in it
    // whatever the file's size: 64 bytes from 16 once reached the filter block of a file
    // holding one entry.
    corrupted_files_fail_the_job("spill-corrupt", "sst", |_| std::iter::once(4..16).collect());
}

/// The same for the blob files that hold a merging window's runs (RocksDB's BlobDB): bytes
/// flipped every 512 bytes between the file's 30-byte header and its 32-byte footer, so in
/// every run (each is 1 KiB or more; the record checksum covers it). Not only in the first
/// record: without blob garbage collection a file keeps runs that were replaced, which no
/// read meets (flipped bytes there are harmless, rightly).
#[test]
fn a_corrupted_blob_file_fails_the_job_naming_shard_and_key_group() {
    corrupted_files_fail_the_job("spill-corrupt-blob", "blob", |len| {
        (40..len.saturating_sub(40)).step_by(512).map(|at| at..at + 8).collect()
    });
}

/// Restart over the newest checkpoint with the bytes `at(file length)` of each of its
/// `.extension` files flipped.
fn corrupted_files_fail_the_job(name: &str, extension: &str, at: fn(usize) -> Vec<std::ops::Range<usize>>) {
    let dir = temp_dir(name);
    const N: u64 = 400_000;
    run_until_checkpoints(counting_job_spilling(&dir, N, Some(60_000.0), Duration::from_millis(50)), 4);
    let newest = weir::checkpoint::restore::find(&dir.join("chk")).unwrap().manifest.unwrap().id;
    let mut flipped = 0;
    let mut stack = vec![dir.join("chk").join(format!("chk-{newest}"))];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()) {
            if e.is_dir() {
                stack.push(e);
            } else if e.extension().is_some_and(|x| x == extension) {
                let mut bytes = std::fs::read(&e).unwrap();
                for range in at(bytes.len()) {
                    for b in &mut bytes[range] {
                        *b ^= 0x5A;
                    }
                }
                std::fs::write(&e, bytes).unwrap();
                flipped += 1;
            }
        }
    }
    assert!(flipped > 0, "the checkpoint holds .{extension} files");
    // Watchdog: this once hung (a stop posted before the sink's thread began was missed).
    let text = match counting_job_spilling(&dir, N, None, Duration::from_millis(50)).start() {
        Err(e) => e.to_string(),
        Ok(running) => {
            let t = std::time::Instant::now();
            while !running.is_finished() && !running.has_failed() {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "watchdog: the restart over corrupt state neither failed nor ended"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            running.wait().expect_err("corrupt state fails").to_string()
        }
    };
    println!("{flipped} .{extension} files corrupted; the job says: {text}");
    assert!(text.contains("count"), "names the operator: {text}");
    assert!(text.contains("shard"), "names the shard: {text}");
    assert!(text.contains("key group"), "names the key group: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
