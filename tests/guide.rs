//! The user documentation cannot lie about job files or links: every job file the guide
//! (`src/guide/**/*.md`) and the README show is parsed and built by the job-file parser, every
//! fragment is TOML, every Cargo.toml fragment names only features weir has, and every link
//! of the README points at a file or heading that exists.
//! (The guide's Rust examples are compiled and run by `cargo test --doc`; the reference pages
//! are checked by `tests/reference.rs`.)

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown page of the guide, and the README.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("src/guide"), &mut out);
    out.sort();
    out
}

/// The fenced code blocks of a Markdown text: (info string, first line number, body).
fn code_blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((info.trim().to_owned(), n + 2, String::new()));
                }
            }
            Some((_, _, body)) => {
                if trimmed.starts_with("```") {
                    blocks.push(open.take().expect("open"));
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "a code block is not closed");
    blocks
}

/// What `${VAR}` reads in the examples: an instance name, and nothing else from the
/// environment (a page must not depend on the reader's).
fn example_vars(var: &str) -> Option<String> {
    (var == "WEIR_INSTANCE").then(|| "a".to_owned())
}

/// The features weir's own `Cargo.toml` declares.
fn weir_features() -> Vec<String> {
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml")).unwrap().parse().unwrap();
    manifest["features"].as_table().expect("[features]").keys().cloned().collect()
}

/// The features a Cargo.toml fragment asks of the `weir` dependency that weir does not have.
fn unknown_features(manifest: &toml::Table, features: &[String]) -> Vec<String> {
    let deps = manifest.get("dependencies").and_then(|d| d.as_table()).unwrap_or(manifest);
    let Some(weir) = deps.get("weir").and_then(|w| w.as_table()) else { return Vec::new() };
    let asked = weir.get("features").and_then(|f| f.as_array()).cloned().unwrap_or_default();
    asked
        .iter()
        .filter_map(|f| f.as_str())
        .filter(|f| !features.iter().any(|have| have == f))
        .map(|f| format!("weir has no feature `{f}`"))
        .collect()
}

/// Every ` ```toml ` block of the guide and the README is a whole job file the parser
/// accepts and builds (types, keys, inputs, settings); every ` ```toml fragment ` is TOML;
/// every ` ```toml cargo ` block (a program's `Cargo.toml`) is TOML and names only features
/// weir has.
#[test]
#[cfg(all(feature = "kafka", feature = "registry", feature = "rocksdb", feature = "postgres"))] // the pages show them all
fn every_job_file_in_the_documentation_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let features = weir_features();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let rel = page.strip_prefix(root()).unwrap().display().to_string();
        for (info, line, body) in code_blocks(&text) {
            let mut words = info.split(|c: char| c == ',' || c.is_whitespace()).filter(|w| !w.is_empty());
            if words.next() != Some("toml") {
                continue;
            }
            let words: Vec<&str> = words.collect();
            if words.contains(&"cargo") {
                match body.parse::<toml::Table>() {
                    Ok(manifest) => failures.extend(
                        unknown_features(&manifest, &features).into_iter().map(|f| format!("{rel}:{line}: {f}")),
                    ),
                    Err(e) => failures.push(format!("{rel}:{line}: a Cargo.toml fragment that is not TOML: {e}")),
                }
                continue;
            }
            if words.contains(&"fragment") {
                if let Err(e) = body.parse::<toml::Table>() {
                    failures.push(format!("{rel}:{line}: a toml fragment that is not TOML: {e}"));
                }
                continue;
            }
            let name = format!("{rel}:{line}");
            match weir::graph::jobfile::parse_with(Path::new(&name), &body, &example_vars) {
                Ok(loaded) => {
                    if let Err(e) = loaded.job.describe() {
                        failures.push(format!("{name}: the job does not plan: {e}"));
                    }
                    checked += 1;
                }
                Err(e) => failures.push(format!("{e}")),
            }
        }
    }
    assert!(failures.is_empty(), "job files in the documentation that weir refuses:\n{}", failures.join("\n"));
    assert!(checked >= 6, "only {checked} job files found: is the scan reading the guide?");
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation other than `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a Markdown text's links and images (`[text](target)`), outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut in_code = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// The README is short (≤ 300 lines), and every link in it is alive: a relative file or
/// folder that exists, a `#heading` of the README or of the Markdown file it names.
#[test]
fn the_readme_is_short_and_its_links_are_alive() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; keep it at most 300 (the rest belongs in the guide)");
    let found = links(&readme);
    assert!(found.len() >= 10, "only {} links found in the README: is the scan reading it?", found.len());
    let mut dead = Vec::new();
    for (line, target) in found {
        if target.starts_with("http://") || target.starts_with("https://") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let text = if file.is_empty() {
            readme.clone()
        } else {
            let path = root().join(file);
            if !path.exists() {
                dead.push(format!("README.md:{line}: `{target}`: no such file"));
                continue;
            }
            if path.is_dir() || fragment.is_none() {
                continue;
            }
            std::fs::read_to_string(&path).unwrap()
        };
        if let Some(a) = fragment
            && !anchors(&text).iter().any(|h| h == a)
        {
            dead.push(format!("README.md:{line}: `{target}`: no heading with that anchor"));
        }
    }
    assert!(dead.is_empty(), "dead links in the README:\n{}", dead.join("\n"));
}

/// The checker itself: anchors follow GitHub's rule, and a dead link would be seen.
#[test]
fn the_link_checker_reads_links_and_anchors() {
    assert_eq!(anchor(" Where to go next"), "where-to-go-next");
    assert_eq!(anchor(" `[job]` keys"), "job-keys");
    assert_eq!(anchor(" Build times"), "build-times");
    let text = "# Title\n\nSee [the part](#title) and ![pic](a/b.png).\n```\n[not](a link)\n```\n";
    assert_eq!(links(text), vec![(3, "#title".to_owned()), (3, "a/b.png".to_owned())]);
    assert_eq!(anchors(text), vec!["title".to_owned()]);
}
