//! SECURITY.md's reading guide, held against the code: every file of the library's
//! default build and of the binary is in its tables once, each `lines` figure is within
//! [`TOLERANCE_PERCENT`] of what `scripts/footprint --tsv` counts (so is each part's
//! stated total), the pre-auth surface stays within [`MAX_PRE_AUTH_LINES`], and every
//! test or fuzz target SECURITY.md cites anywhere exists.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

/// How far a figure may drift from the code before the guide must be updated.
const TOLERANCE_PERCENT: usize = 10;

/// Issue 17's measure: a reviewer reads the pre-auth surface (Part 1) in one sitting,
/// at most 3,000 non-test lines.
const MAX_PRE_AUTH_LINES: usize = 3_000;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn security_md() -> String {
    fs::read_to_string(repo().join("SECURITY.md")).unwrap()
}

/// `scripts/footprint --tsv`: each file of the default build and its non-test lines.
fn footprint() -> BTreeMap<String, usize> {
    let out = Command::new("sh")
        .arg(repo().join("scripts/footprint"))
        .arg("--tsv")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/footprint --tsv failed: {out:?}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let counts: BTreeMap<String, usize> = text
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split('\t').collect();
            (cells[0].to_owned(), cells[1].parse().unwrap())
        })
        .collect();
    assert!(counts.len() > 50, "footprint listed too few files: {text}");
    counts
}

/// A part of the guide: its heading, the total its opening states, and its rows.
struct Part {
    heading: String,
    stated_total: Option<usize>,
    rows: Vec<Row>,
}

struct Row {
    file: String,
    lines: usize,
}

fn number(text: &str) -> Option<usize> {
    text.trim().replace(',', "").parse().ok()
}

/// The "## Reading guide" section's parts, in order.
fn guide() -> Vec<Part> {
    let text = security_md();
    let section = text
        .split("\n## Reading guide\n")
        .nth(1)
        .expect("SECURITY.md has a \"## Reading guide\" section");
    let section = section.split("\n## ").next().unwrap();
    let mut parts = Vec::new();
    for chunk in section.split("\n### ").skip(1) {
        let heading = chunk.lines().next().unwrap().to_owned();
        // The opening's "**N lines**", before the table.
        let opening = chunk.split("\n|").next().unwrap();
        let stated_total = opening.split("**").skip(1).step_by(2).find_map(|bold| {
            let words: Vec<&str> = bold.split_whitespace().collect();
            match words[..] {
                [figure, "lines"] => number(figure),
                _ => None,
            }
        });
        let rows = chunk
            .lines()
            .filter(|line| line.starts_with("| `src/"))
            .map(|line| {
                let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
                assert_eq!(cells.len(), 4, "a row of four cells: {line}");
                let file = cells[0].trim().trim_matches('`').to_owned();
                let lines = number(cells[1]).unwrap_or_else(|| panic!("lines of {line}"));
                Row { file, lines }
            })
            .collect();
        parts.push(Part {
            heading,
            stated_total,
            rows,
        });
    }
    assert!(parts.len() >= 5, "the guide has its five parts");
    parts
}

fn within_tolerance(stated: usize, counted: usize) -> bool {
    stated.abs_diff(counted) * 100 <= counted * TOLERANCE_PERCENT
}

#[test]
fn every_file_of_the_build_is_in_the_guide_once() {
    let counts = footprint();
    let mut listed: BTreeMap<String, usize> = BTreeMap::new();
    for part in guide() {
        for row in part.rows {
            *listed.entry(row.file).or_default() += 1;
        }
    }
    for (file, times) in &listed {
        assert!(
            counts.contains_key(file),
            "SECURITY.md lists {file}, which is no file of the default build"
        );
        assert_eq!(*times, 1, "SECURITY.md lists {file} {times} times");
    }
    for file in counts.keys() {
        assert!(
            listed.contains_key(file),
            "{file} is missing from SECURITY.md's reading guide"
        );
    }
}

#[test]
fn the_guides_figures_are_the_codes() {
    let counts = footprint();
    let mut drifts = Vec::new();
    for part in guide() {
        let mut counted_total = 0;
        for row in &part.rows {
            let Some(&counted) = counts.get(&row.file) else {
                continue; // every_file_of_the_build_is_in_the_guide_once says so
            };
            counted_total += counted;
            if !within_tolerance(row.lines, counted) {
                drifts.push(format!(
                    "{}: SECURITY.md gives {} lines, scripts/footprint counts {counted}",
                    row.file, row.lines
                ));
            }
        }
        match part.stated_total {
            Some(stated) if within_tolerance(stated, counted_total) => {}
            stated => drifts.push(format!(
                "\"{}\": its opening states **{} lines**, scripts/footprint counts {counted_total}",
                part.heading,
                stated.map_or("no N".to_owned(), |n| n.to_string())
            )),
        }
    }
    assert!(
        drifts.is_empty(),
        "SECURITY.md's figures drifted more than {TOLERANCE_PERCENT}% from the code:\n{}",
        drifts.join("\n")
    );
}

#[test]
fn the_pre_auth_surface_fits_one_sitting() {
    let counts = footprint();
    let parts = guide();
    let part1 = parts
        .iter()
        .find(|p| p.heading.starts_with("Part 1"))
        .expect("the guide has a Part 1");
    let total: usize = part1.rows.iter().filter_map(|r| counts.get(&r.file)).sum();
    assert!(
        total <= MAX_PRE_AUTH_LINES,
        "the pre-auth surface is {total} non-test lines, over issue 17's {MAX_PRE_AUTH_LINES}"
    );
}

/// Every backticked citation in `text`: (path, name) for `path::name`,
/// `path::tests::name` and `::name` (the previous citation's path), and
/// ("fuzz", NAME) for `fuzz: NAME`.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut previous = String::new();
    // Lowercase, so that `::NAME` and `fuzz: NAME` in prose are no citations.
    let is_fn_name = |name: &str| {
        name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    for span in text.split('`').skip(1).step_by(2) {
        if let Some(target) = span.strip_prefix("fuzz: ").filter(|t| is_fn_name(t)) {
            found.push(("fuzz".to_owned(), target.to_owned()));
            continue;
        }
        let Some((path, name)) = span.split_once("::") else {
            continue;
        };
        let name = name.strip_prefix("tests::").unwrap_or(name);
        if !is_fn_name(name) {
            continue;
        }
        let path = if path.is_empty() {
            previous.clone()
        } else if path.ends_with(".rs") {
            path.to_owned()
        } else {
            continue; // a Rust path such as `loopbus::escape_for_terminal`
        };
        previous = path.clone();
        found.push((path, name.to_owned()));
    }
    found
}

#[test]
fn every_cited_test_exists() {
    let text = security_md();
    let cited = citations(&text);
    assert!(cited.len() > 100, "too few citations found: {cited:?}");
    let mut missing = Vec::new();
    for (path, name) in cited {
        let found = if path == "fuzz" {
            repo()
                .join(format!("fuzz/fuzz_targets/{name}.rs"))
                .is_file()
        } else {
            (path.starts_with("src/") || path.starts_with("tests/"))
                && fs::read_to_string(repo().join(&path))
                    .is_ok_and(|source| source.contains(&format!("fn {name}(")))
        };
        if !found {
            missing.push(format!("{path}::{name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "SECURITY.md cites tests that do not exist (a path is from the repository root, \
         `fuzz: NAME` is fuzz/fuzz_targets/NAME.rs):\n{}",
        missing.join("\n")
    );
}

#[test]
fn citation_parsing() {
    let text = "`tests/a.rs::one`, `::two`, `src/b.rs::tests::three`, `fuzz: head`, \
                `loopbus::escape_for_terminal`, `Secret::proof`, `::1`, `::NAME`, `fuzz: NAME`, `::four`";
    let want = [
        ("tests/a.rs", "one"),
        ("tests/a.rs", "two"),
        ("src/b.rs", "three"),
        ("fuzz", "head"),
        ("src/b.rs", "four"),
    ];
    let got = citations(text);
    let got: Vec<(&str, &str)> = got.iter().map(|(p, n)| (p.as_str(), n.as_str())).collect();
    assert_eq!(got, want);
}
