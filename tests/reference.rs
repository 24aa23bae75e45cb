//! The reference pages of the guide are the code's own tables, printed: every job-file key
//! (`weir::graph::jobfile::reference`), every Prometheus series
//! (`weir::telemetry::prometheus::reference`), every exit code (`weir::util::exit::Exit`).
//! Each test regenerates its page and fails when the committed copy in
//! `src/guide/reference/` differs, so docs and code cannot drift. To regenerate them:
//!
//! ```sh
//! WEIR_BLESS=1 cargo test --release -p weir --test reference
//! ```
//!
//! (Needs every feature, as CI builds: the Kafka and registry keys are in the page.)

#![cfg(all(
    feature = "kafka",
    feature = "registry",
    feature = "prometheus",
    feature = "postgres",
    feature = "nexmark"
))]

use std::path::PathBuf;

/// Compare `generated` with the committed page `name` (or write it, with `WEIR_BLESS=1`).
fn check(name: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/guide/reference").join(name);
    if std::env::var_os("WEIR_BLESS").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| committed.lines().count().min(generated.lines().count()) + 1, |i| i + 1);
        panic!(
            "{} differs from what the code generates (first at line {line}); regenerate it with\n  \
             WEIR_BLESS=1 cargo test --release -p weir --test reference\nand commit it",
            path.display()
        );
    }
}

/// The job-file reference: `[job]`, every node type and every key the parser reads.
#[test]
fn job_file_reference_is_current() {
    let page = weir::graph::jobfile::reference();
    for must in [
        "## `[job]`",
        "### `type = \"kafka\"`",
        "### `type = \"postgres\"`",
        "### `type = \"nexmark\"`",
        "| `modulus` |",
        "| `max_in_flight` | integer | 4 |",
        "| `timestamp` |",
        "| `stop_timeout_ms` |",
        "| `max_pending_bytes` |",
    ] {
        assert!(page.contains(must), "the generated page lacks {must}");
    }
    check("job_file.md", &page);
}

/// The metrics reference: every series with its type and labels.
#[test]
fn metrics_reference_is_current() {
    let page = weir::telemetry::prometheus::reference();
    for must in ["`weir_subtask_backpressured_seconds_total` | counter | subtask", "`weir_channel_fill_ratio`"] {
        assert!(page.contains(must), "the generated page lacks {must}");
    }
    check("metrics.md", &page);
}

/// The exit codes.
#[test]
fn exit_code_reference_is_current() {
    let page = weir::util::exit::Exit::reference();
    for code in ["| 0 |", "| 1 |", "| 2 |", "| 69 |", "| 75 |", "| 78 |", "| 130 |", "| 143 |"] {
        assert!(page.contains(code), "the generated page lacks {code}");
    }
    check("exit_codes.md", &page);
}
