//! The architecture table (docs/architecture.md), held against the code: every `crate::` path in a
//! library module's files must name a module that table lets it import, so no arrow
//! runs back up; the binary (`src/bin/loopbus/`) names library items only through
//! `loopbus::`, never `crate::`; and no `#[doc(hidden)]` item hides in `src/`. The
//! table is read from docs/architecture.md (up to its next section), so a new module
//! or a new edge fails here until that page says so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The binary's row in the table, relative to `src/`.
const BINARY: &str = "bin/loopbus";

/// The first backticked text of `cell`, without a trailing `/` or `.rs`.
fn module_cell(cell: &str) -> Option<String> {
    let name = cell.trim().strip_prefix('`')?.split('`').next()?;
    Some(
        name.trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_owned(),
    )
}

/// Every backticked module name (`[a-z_]+`) in `cell`.
fn module_names(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_owned)
        .collect()
}

/// The architecture table, in its order: each row's module and the modules
/// its "may import" column names.
/// The page that holds the architecture table, from the repository root.
const ARCHITECTURE: &str = "docs/architecture.md";

fn readme_table() -> Vec<(String, Vec<String>)> {
    let page =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(ARCHITECTURE)).unwrap();
    // The page up to its next section (Dependencies).
    let section = page.split("\n## ").next().unwrap();
    let rows: Vec<(String, Vec<String>)> = section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {line}");
            (module_cell(cells[0]).unwrap(), module_names(cells[2]))
        })
        .collect();
    assert!(
        rows.len() > 10,
        "the architecture table was not found: {rows:?}"
    );
    rows
}

/// The library's rows: the table without the binary's.
fn library_table() -> Vec<(String, Vec<String>)> {
    let table = readme_table();
    assert!(
        table.iter().any(|(module, _)| module == BINARY),
        "the table has a row for `{BINARY}/`"
    );
    table
        .into_iter()
        .filter(|(module, _)| module != BINARY)
        .collect()
}

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
    let table = library_table();
    let allowed: BTreeMap<&str, BTreeSet<&str>> = table
        .iter()
        .map(|(m, deps)| (m.as_str(), deps.iter().map(String::as_str).collect()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|file| !file.starts_with(src.join(BINARY)));
    files.sort();
    let mut violations = Vec::new();
    let mut modules_seen = BTreeSet::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" {
            continue; // the crate root re-exports everything
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
    let listed: BTreeSet<String> = table.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(
        listed, modules_seen,
        "the table and src/ list different modules"
    );
}

#[test]
fn the_table_itself_has_no_cycle() {
    // A module may only import modules listed after it: the table is in layer order.
    let table = library_table();
    let order: Vec<&str> = table.iter().map(|(m, _)| m.as_str()).collect();
    for (i, (module, deps)) in table.iter().enumerate() {
        for dep in deps {
            let at = order
                .iter()
                .position(|m| m == dep)
                .unwrap_or_else(|| panic!("`{module}` may import `{dep}`, which has no row"));
            assert!(
                at > i,
                "`{module}` may import `{dep}`, which is listed above it"
            );
        }
    }
}

#[test]
fn the_binary_uses_the_library_only_through_its_public_api() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bin = src.join(BINARY);
    // The binary's own modules: what `crate::` may name in its files.
    let own: BTreeSet<String> = fs::read_dir(&bin)
        .unwrap()
        .map(|entry| module_of(&bin, &entry.unwrap().path()))
        .filter(|module| module != "main")
        .collect();
    let library: BTreeSet<String> = library_table().into_iter().map(|(m, _)| m).collect();
    let mut files = Vec::new();
    rust_files(&bin, &mut files);
    files.sort();
    assert!(
        files.len() > 10,
        "the binary's files were not found under {}",
        bin.display()
    );
    let mut violations = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for target in crate_paths(line) {
                if !own.contains(&target) || library.contains(&target) {
                    violations.push(format!(
                        "{}:{}: the binary names `crate::{target}`; use the library's public \
                         API (`loopbus::...`)",
                        file.display(),
                        n + 1
                    ));
                }
            }
            if line.contains("loopbus::__") {
                violations.push(format!("{}:{}: a hidden item", file.display(), n + 1));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn no_hidden_item_in_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let hidden: Vec<String> = files
        .iter()
        .filter(|file| fs::read_to_string(file).unwrap().contains("#[doc(hidden)]"))
        .map(|file| file.display().to_string())
        .collect();
    assert!(hidden.is_empty(), "#[doc(hidden)] in {hidden:?}: every item is documented API, private, or behind the `fuzzing` feature");
}

#[test]
fn readme_table_parsing() {
    assert_eq!(module_cell(" `server/` "), Some("server".to_owned()));
    assert_eq!(module_cell("`usage.rs`"), Some("usage".to_owned()));
    assert_eq!(module_cell("`bin/loopbus/`"), Some(BINARY.to_owned()));
    assert_eq!(
        module_names("`http`, `turns`, `engine` (preflight)"),
        ["http", "turns", "engine"]
    );
    assert!(module_names("nothing of ours").is_empty());
    assert!(module_names("the crate root only (`loopbus::`)").is_empty());
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
