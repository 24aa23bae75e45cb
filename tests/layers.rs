//! The engine's layers, kept by a test instead of a reviewer (TigerBeetle's `tidy` idea).
//!
//! `src/lib.rs` names the layers, bottom to top; each module may use only modules below it.
//! These tests read every `crate::…` and `super::…` path in `src/` (comments aside) and fail,
//! naming file and line, when a module names one above it, when a top-level module is in no
//! layer, or when an import circle spans two folders (`io/` and `io/kafka/`, say).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom to top: a module may use the modules of lower rows only. The same
/// table is in `src/lib.rs`'s docs and the README's layout.
const LAYERS: &[&str] = &[
    "util",       // errno texts
    "record",     // codecs, key groups, hashing, partitioning
    "telemetry",  // budget, gauges, counter kinds, histograms
    "state",      // RocksDB shards (a store; knows nothing of operators)
    "checkpoint", // the subtask side: snapshots, manifests, restore
    "operators",  // operator contracts, typed failures, built-in operators
    "chain",      // chain assembly: links, type erasure
    "exchange",   // both halves of a channel, mailbox, subtask context
    "time",       // event time, watermark generation
    "window",     // keyed windows and their state
    "io",         // connectors: file, TCP, HTTP, Kafka
    "graph",      // describing a job: builder, job files
    "runtime",    // planning, starting, the checkpoint coordinator
    "cluster",    // instances: group membership, checkpoint store, handover
    "guide",      // the user guide: documentation only, no code
];

/// A reference from one place in `src/` to a module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    file: String,
    line: usize,
    /// The module path named, from the crate root (`["runtime", "plan"]`).
    target: Vec<String>,
}

/// The module path of a file under `src/`: `io/kafka/sink.rs` → `[io, kafka, sink]`,
/// `io/mod.rs` → `[io]`, `lib.rs` → `[]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code of a line: its comment cut off, the insides of its string literals blanked
/// (a path in a message is not an import).
fn code_of(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_str = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
                out.push_str("  ");
            }
            '"' => {
                in_str = !in_str;
                out.push('"');
            }
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            _ if in_str => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// Identifier characters.
fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every module path a piece of code names through `crate::` or `super::`, resolved from
/// module `here`. Grouped imports (`crate::{a::x, b}`) name each of their heads.
fn references_in(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut pos = 0;
    while let Some(found_at) = code[pos..].find(['c', 's']) {
        let at = pos + found_at;
        let before_ok = !code[..at].ends_with(|c: char| is_ident(c) || c == '$');
        let tail = &code[at..];
        let (base, after): (Vec<String>, &str) = if before_ok && tail.starts_with("crate::") {
            (Vec::new(), &tail["crate::".len()..])
        } else if before_ok && tail.starts_with("super::") {
            // Each `super` is one module up (`module_path` already made `mod.rs` its folder).
            let mut base = here.to_vec();
            let mut after = tail;
            while let Some(t) = after.strip_prefix("super::") {
                base.pop();
                after = t;
            }
            (base, after)
        } else {
            pos = at + 1;
            continue;
        };
        let consumed = if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let path: Vec<String> =
                    item.trim().split("::").map(|s| s.trim().to_owned()).take_while(|s| !s.is_empty()).collect();
                let mut full = base.clone();
                full.extend(path.into_iter().take_while(|s| s.chars().all(is_ident)));
                found.push(full);
            }
            1 + end
        } else {
            let mut full = base.clone();
            let path_len = after.find(|c: char| !(is_ident(c) || c == ':')).unwrap_or(after.len());
            full.extend(after[..path_len].split("::").filter(|s| !s.is_empty()).map(str::to_owned));
            found.push(full);
            path_len
        };
        // Go on after the path (its own `super::`s are not new paths).
        pos = (at + tail.len() - after.len() + consumed).min(code.len());
    }
    found
}

/// Every reference in every `.rs` file under `src` (lines of comments skipped).
fn references(src: &Path) -> Vec<Reference> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().to_path_buf();
        let here = module_path(&rel);
        let name = rel.file_name().unwrap().to_string_lossy();
        let is_dir_module = name == "mod.rs" || name == "lib.rs" || name == "main.rs";
        for (i, line) in std::fs::read_to_string(&f).unwrap().lines().enumerate() {
            let code = code_of(line);
            let mut targets = references_in(&code, &here);
            // A folder module's private `use child::...` means its own code uses the child
            // folder (`io/mod.rs` using `kafka::`): part of the folder graph, so circles
            // through children are seen. A `pub use child::X` only re-exports (the facade
            // that shapes the public paths, as `weir::io::HttpSink`): the parent's code does
            // not depend on it, so it is no edge.
            if is_dir_module && let Some(path) = code.trim_start().strip_prefix("use ") {
                let head: String = path.chars().take_while(|&c| is_ident(c)).collect();
                if !head.is_empty() && f.parent().unwrap().join(&head).is_dir() {
                    targets.push(here.iter().cloned().chain([head]).collect());
                }
            }
            for target in targets {
                out.push(Reference { file: rel.display().to_string(), line: i + 1, target });
            }
        }
    }
    out
}

/// The layer of a module path (its first component), if it is in the table.
fn rank(path: &[String]) -> Option<usize> {
    let top = path.first()?;
    LAYERS.iter().position(|l| l == top)
}

/// Every reference that names a higher layer than the file it is in, as `file:line: ...`.
fn upward(refs: &[Reference]) -> Vec<String> {
    let mut bad = Vec::new();
    for r in refs {
        let here = module_path(Path::new(&r.file));
        let (Some(from), Some(to)) = (rank(&here), rank(&r.target)) else { continue };
        if to > from {
            bad.push(format!(
                "src/{}:{}: `{}` (layer {}) uses `crate::{}` (layer {}, above it)",
                r.file,
                r.line,
                here[0],
                from,
                r.target.join("::"),
                to
            ));
        }
    }
    bad
}

/// The folder of a module path: the longest prefix that is a directory under `src`.
fn folder_of(src: &Path, path: &[String]) -> String {
    let mut best = String::new();
    let mut dir = PathBuf::from(src);
    for (i, part) in path.iter().enumerate() {
        dir.push(part);
        if dir.is_dir() {
            best = path[..=i].join("/");
        } else {
            break;
        }
    }
    best
}

/// Folder → folders it uses (not itself).
fn folder_graph(src: &Path, refs: &[Reference]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in refs {
        let from = folder_of(src, &module_path(Path::new(&r.file)));
        let to = folder_of(src, &r.target);
        if from != to {
            g.entry(from).or_default().insert(to);
        }
    }
    g
}

/// A cycle through two or more folders, if there is one.
fn folder_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// No module of `src/` uses a module of a higher layer.
#[test]
fn every_module_uses_only_lower_layers() {
    let refs = references(&src());
    assert!(refs.len() > 100, "the scan found only {} references: is it reading src/?", refs.len());
    let bad = upward(&refs);
    assert!(bad.is_empty(), "imports against the layers (see src/lib.rs):\n{}", bad.join("\n"));
}

/// Every top-level module of the library is in a layer, and every layer exists.
#[test]
fn every_top_level_module_has_a_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    for m in &modules {
        assert!(LAYERS.contains(m), "src/lib.rs: module `{m}` is in no layer: add it to LAYERS here and in the docs");
    }
    for l in LAYERS {
        assert!(modules.contains(l), "layer `{l}` is not a module of src/lib.rs");
    }
    for l in LAYERS {
        assert!(lib.contains(&format!("`{l}`")), "src/lib.rs's docs do not name layer `{l}`");
    }
}

/// No import circle spans two folders (a folder is a directory under `src/`).
#[test]
fn no_import_circle_spans_two_folders() {
    let g = folder_graph(&src(), &references(&src()));
    if let Some(c) = folder_cycle(&g) {
        panic!("an import circle spans folders: {}", c.join(" -> "));
    }
}

/// The checker itself: an upward `use` in a low module is found and named (what a
/// `use crate::runtime::...;` added to `src/record/` would produce), grouped and `super`
/// paths resolve, and comments do not count.
#[test]
fn the_checker_finds_an_upward_import() {
    let here = vec!["record".to_owned()];
    let refs: Vec<Reference> = [
        "use crate::runtime::RunningJob;",
        "// use crate::graph::Job; (a comment)",
        "use crate::{util::errno_text, io::FileSink};",
        "let s = \"crate::runtime\"; let x = crate::state::Store::new();",
    ]
    .iter()
    .enumerate()
    .flat_map(|(i, l)| {
        references_in(&code_of(l), &here).into_iter().map(move |target| Reference {
            file: "record/mod.rs".into(),
            line: i + 1,
            target,
        })
    })
    .collect();
    let bad = upward(&refs);
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(bad[0].starts_with("src/record/mod.rs:1: `record` (layer 1) uses `crate::runtime::RunningJob`"), "{bad:?}");
    assert!(bad[1].contains("crate::io::FileSink"), "{bad:?}");
    assert!(bad[2].contains("crate::state::Store::new"), "{bad:?}");
    // `super::` from a file module is its folder's module; from a folder's `mod.rs`, the parent.
    let file = vec!["io".to_owned(), "kafka".to_owned(), "sink".to_owned()];
    assert_eq!(references_in("use super::Deliveries;", &file), vec![vec!["io", "kafka", "Deliveries"]]);
    assert_eq!(references_in("use super::super::uring;", &file), vec![vec!["io", "uring"]]);
    let dir = vec!["io".to_owned(), "kafka".to_owned()];
    assert_eq!(references_in("use super::Backoff;", &dir), vec![vec!["io", "Backoff"]]);
    // A circle between two folders is found.
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["a/c".to_owned()]));
    g.insert("a/c".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(folder_cycle(&g), Some(vec!["a".into(), "b".into(), "a/c".into(), "a".into()]));
}

/// What each Cargo feature gates, and the optional crates only it may name. The lean build
/// (`--no-default-features`) is everything else: pure Rust, no C/C++ build. The same list is in
/// `Cargo.toml`'s `[features]` comments and the guide's page on embedding.
///
/// `(feature, files and folders of src/ only it compiles, crates they name)`. A file or
/// folder is compiled only with its feature, by a `#[cfg(feature = "…")]` on its `mod` line;
/// a crate is an optional dependency of that feature.
const FEATURES: &[(&str, &[&str], &[&str])] = &[
    (
        "rocksdb",
        &["state/backend.rs", "state/cache.rs", "state/store.rs", "window/rocks.rs", "window/runs.rs"],
        &["rocksdb"],
    ),
    ("kafka", &["io/kafka/", "io/registry/", "cluster/"], &["rdkafka", "object_store", "futures", "bytes"]),
    ("tls", &["io/tls.rs"], &["rustls", "rustls_native_certs"]),
    (
        "registry",
        &["io/registry/avro.rs", "io/registry/client.rs", "io/registry/protobuf/"],
        &["serde_avro_fast", "prost", "prost_types", "prost_reflect", "protox", "ureq", "base64"],
    ),
    ("prometheus", &["telemetry/prometheus.rs"], &["prometheus_client", "tiny_http"]),
    ("postgres", &["io/postgres/"], &["postgres_protocol", "fallible_iterator"]),
    ("nexmark", &["io/nexmark/"], &["nexmark"]),
    ("s3", &[], &["tokio"]),
    // The `weir` command (src/main.rs: required-features = ["full"]).
    ("cli", &["main.rs"], &["clap", "indicatif", "signal_hook", "tracing_subscriber"]),
];

/// The features a feature turns on (its own name included), from the `[features]` table.
fn implied(features: &BTreeMap<String, Vec<String>>, name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_owned()];
    while let Some(f) = todo.pop() {
        if seen.insert(f.clone()) {
            todo.extend(features.get(&f).into_iter().flatten().filter(|d| features.contains_key(*d)).cloned());
        }
    }
    seen
}

/// `[features]` of the engine's Cargo.toml: name → what it turns on.
fn cargo_features() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let manifest: toml::Table = text.parse().expect("Cargo.toml parses");
    let table = manifest["features"].as_table().expect("a [features] table");
    table
        .iter()
        .map(|(k, v)| {
            let list = v.as_array().expect("a feature is a list");
            (k.clone(), list.iter().map(|s| s.as_str().expect("a string").to_owned()).collect())
        })
        .collect()
}

/// Every file under `src/`, relative, with `/` separators.
fn source_files(dir: &Path, base: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The features under which file `rel` is compiled (those whose list holds it or a folder
/// above it).
fn gates_of(rel: &str) -> Vec<&'static str> {
    FEATURES
        .iter()
        .filter(|(_, paths, _)| paths.iter().any(|p| if p.ends_with('/') { rel.starts_with(p) } else { rel == *p }))
        .map(|(f, _, _)| *f)
        .collect()
}

/// The lean build stays lean, and [`FEATURES`] says what is true: each listed file or folder
/// is declared under its feature's `cfg`; a file compiled in every build names an optional
/// crate only on a line under that crate's feature's `cfg` (the line itself or the one above);
/// every feature the code names is one of Cargo.toml's, and `full` has them all. (CI also
/// builds `--no-default-features`; this names the file and line that would break it.)
#[test]
fn optional_crates_are_named_only_where_their_feature_gates() {
    let features = cargo_features();
    for (f, _, _) in FEATURES {
        assert!(features.contains_key(*f), "FEATURES names `{f}`, which Cargo.toml's [features] does not have");
    }
    let full = implied(&features, "full");
    for (f, _, crates) in FEATURES {
        assert!(full.contains(*f), "`full` does not turn on `{f}`: the weir binary must have every feature");
        let turned_on: BTreeSet<String> = implied(&features, f)
            .iter()
            .flat_map(|g| features[g].iter())
            .map(|d| d.trim_start_matches("dep:").split('/').next().unwrap().replace('-', "_"))
            .collect();
        for c in *crates {
            assert!(
                turned_on.contains(*c),
                "FEATURES says `{f}` has crate `{c}`, and Cargo.toml's `{f}` does not turn it on"
            );
        }
    }
    assert!(features["default"].contains(&"full".to_owned()), "`default` is `full` (see Cargo.toml's [features])");

    let mut files = Vec::new();
    source_files(&src(), &src(), &mut files);
    let mut bad = Vec::new();
    // Each listed path is declared under its feature: `mod name;` after the cfg line.
    for (feature, paths, _) in FEATURES {
        for path in *paths {
            if *path == "main.rs" {
                continue; // a binary target, gated by required-features
            }
            let trimmed = path.trim_end_matches('/');
            let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
            let name = name.trim_end_matches(".rs");
            let declaring = if parent.is_empty() { "lib.rs".to_owned() } else { format!("{parent}/mod.rs") };
            let text = std::fs::read_to_string(src().join(&declaring))
                .unwrap_or_else(|e| panic!("FEATURES lists {path}: cannot read src/{declaring}: {e}"));
            let lines: Vec<&str> = text.lines().collect();
            let at = lines.iter().position(|l| {
                let l = l.trim();
                l == format!("mod {name};") || l == format!("pub mod {name};") || l == format!("pub(crate) mod {name};")
            });
            match at {
                Some(i) if i > 0 && lines[i - 1].trim() == format!("#[cfg(feature = \"{feature}\")]") => {}
                _ => bad.push(format!(
                    "src/{declaring}: FEATURES lists {path} under `{feature}`; declare it as \
                     #[cfg(feature = \"{feature}\")] mod {name};"
                )),
            }
        }
    }
    for rel in &files {
        let text = std::fs::read_to_string(src().join(rel)).unwrap();
        let gated = !gates_of(rel).is_empty();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if let Some(at) = line.find("feature = \"") {
                let name = &line[at + 11..];
                let name = &name[..name.find('"').unwrap_or(name.len())];
                if !features.contains_key(name) {
                    bad.push(format!("src/{rel}:{}: a cfg names feature `{name}`, which Cargo.toml lacks", n + 1));
                }
            }
            if gated {
                continue;
            }
            let code = code_of(line);
            for word in code.split(|c: char| !is_ident(c) && c != ':') {
                let Some((krate, _)) = word.split_once("::") else { continue };
                let Some((feature, _, _)) = FEATURES.iter().find(|(_, _, crates)| crates.contains(&krate)) else {
                    continue;
                };
                let attr = format!("#[cfg(feature = \"{feature}\")]");
                if !(line.contains(&attr) || n > 0 && lines[n - 1].contains(&attr)) {
                    bad.push(format!(
                        "src/{rel}:{}: names `{krate}` (an optional crate of feature `{feature}`) in a file every \
                         build compiles: put the line under #[cfg(feature = \"{feature}\")], or the file in FEATURES",
                        n + 1
                    ));
                }
            }
        }
    }
    bad.dedup();
    assert!(bad.is_empty(), "what the features gate is not what FEATURES says:\n{}", bad.join("\n"));
}
