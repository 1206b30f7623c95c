//! The README's architecture table, held against the code: every `crate::` path in a
//! module's files must name a module that table lets it import, so no arrow runs back
//! up. A new module or a new edge fails here until the table (and the README) say so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// module -> the modules it may import (the README's "may import" column).
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "commands",
        &[
            "cli", "server", "client", "engine", "usage", "audit", "registry", "config",
            "protocol", "files", "secret", "time", "text",
        ],
    ),
    ("cli", &["server"]),
    (
        "server",
        &[
            "http", "turns", "engine", "audit", "usage", "registry", "config", "protocol", "files",
            "secret",
        ],
    ),
    (
        "client",
        &["registry", "http", "engine", "config", "protocol", "secret"],
    ),
    ("registry", &["http", "protocol", "files", "time", "secret"]),
    ("engine", &["usage", "config", "protocol", "files"]),
    ("usage", &["files", "time"]),
    ("audit", &["files", "time"]),
    ("config", &["protocol", "files", "secret"]),
    ("http", &["secret"]),
    ("turns", &[]),
    ("protocol", &[]),
    ("files", &[]),
    ("time", &[]),
    ("secret", &[]),
    ("text", &[]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/server/bus.rs` -> `server`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// The first path segment after every `crate::` in `line`, including each item of a
/// `crate::{a, b::c}` group.
fn crate_paths(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != "self" {
                    found.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

#[test]
fn every_crate_import_points_down_the_readme_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut modules_seen = BTreeSet::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" || module == "main" {
            continue; // the crate root re-exports everything; main uses the root only
        }
        modules_seen.insert(module.clone());
        let Some(may) = allowed.get(module.as_str()) else {
            violations.push(format!(
                "{}: module `{module}` is not in the table",
                file.display()
            ));
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // Skip comments and docs; intra-doc links are not imports.
            if line.trim_start().starts_with("//") {
                continue;
            }
            for target in crate_paths(line) {
                if target != module && !may.contains(target.as_str()) {
                    violations.push(format!(
                        "{}:{}: `{module}` imports `{target}`, which the table does not allow",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // Every module of the table exists, so that the table cannot go stale.
    let listed: BTreeSet<String> = ALLOWED.iter().map(|(m, _)| (*m).to_owned()).collect();
    assert_eq!(
        listed, modules_seen,
        "the table and src/ list different modules"
    );
}

#[test]
fn the_table_itself_has_no_cycle() {
    // A module may only import modules listed after it: the table is in layer order.
    let order: Vec<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    for (i, (module, deps)) in ALLOWED.iter().enumerate() {
        for dep in *deps {
            let at = order.iter().position(|m| m == dep).unwrap();
            assert!(
                at > i,
                "`{module}` may import `{dep}`, which is listed above it"
            );
        }
    }
}

#[test]
fn crate_path_parsing() {
    assert_eq!(crate_paths("use crate::http::Head;"), ["http"]);
    assert_eq!(
        crate_paths("use crate::{files, registry::store, self};"),
        ["files", "registry"]
    );
    assert_eq!(
        crate_paths("let x = crate::time::now(); crate::secret::Secret::generate()"),
        ["time", "secret"]
    );
    assert!(crate_paths("no imports here").is_empty());
}
