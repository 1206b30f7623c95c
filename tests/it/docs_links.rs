//! The README, PROTOCOL.md, SECURITY.md and every page of docs/ link only inside the
//! repository: every relative link names a file of this checkout (and a heading that
//! exists, for `#anchor`s), nothing leaves the repository (`../shared/...` is broken in
//! a clone), and the only web addresses are loopback examples.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The documents at the top held to these rules, relative to the repository root;
/// every `.md` file of [`DOCS`] is held to them too.
const DOCUMENTS: [&str; 3] = ["README.md", "PROTOCOL.md", "SECURITY.md"];

/// The directory of the reference pages the README links to.
const DOCS: &str = "docs";

/// Every document held to these rules: [`DOCUMENTS`] and the pages of [`DOCS`].
fn documents() -> Vec<String> {
    let mut all: Vec<String> = DOCUMENTS.iter().map(|d| (*d).to_owned()).collect();
    let mut pages: Vec<String> = std::fs::read_dir(repo().join(DOCS))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("{DOCS}/{name}"))
        .collect();
    assert!(!pages.is_empty(), "no pages in {DOCS}/");
    pages.sort();
    all.extend(pages);
    all
}

/// The hosts a web address in these documents may name: examples of a local instance.
const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`'s prose.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim().to_owned());
            rest = &rest[end..];
        }
    }
    targets
}

/// GitHub's anchor for a heading's text: lowercase, spaces to hyphens, and nothing but
/// letters, digits, `-` and `_` kept.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' | '-' => Some('-'),
            '_' => Some('_'),
            c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
            _ => None,
        })
        .collect()
}

/// Every anchor the headings of `text` define, repeats numbered as GitHub does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// Why `target`, linked from `document`, is not a link inside this repository.
fn check_target(document: &str, text: &str, target: &str) -> Result<(), String> {
    if target.starts_with("http://") || target.starts_with("https://") {
        return Ok(()); // web addresses: see the loopback test
    }
    if target.contains(':') {
        return Err(format!("{document}: link {target:?} leaves the repository"));
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let linked_text = if path.is_empty() {
        text.to_owned()
    } else {
        // Relative to the linking document's own directory, as a browser reads it.
        let base = repo().join(document);
        let file = base.parent().unwrap_or(&repo()).join(path);
        let real = file
            .canonicalize()
            .map_err(|e| format!("{document}: link {target:?}: {}: {e}", file.display()))?;
        if !real.starts_with(repo().canonicalize().unwrap()) {
            return Err(format!("{document}: link {target:?} leaves the repository"));
        }
        if anchor.is_none() || !path.ends_with(".md") {
            return Ok(());
        }
        std::fs::read_to_string(&real).unwrap()
    };
    match anchor {
        Some(anchor) if !anchors(&linked_text).contains(anchor) => Err(format!(
            "{document}: link {target:?}: no heading makes the anchor #{anchor}"
        )),
        _ => Ok(()),
    }
}

fn read(document: &str) -> String {
    std::fs::read_to_string(repo().join(document))
        .unwrap_or_else(|e| panic!("cannot read {document}: {e}"))
}

#[test]
fn readme_and_protocol_links_name_files_and_headings_of_this_repository() {
    let mut problems = Vec::new();
    for document in documents() {
        let text = read(&document);
        for target in link_targets(&text) {
            if let Err(problem) = check_target(&document, &text, &target) {
                problems.push(problem);
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn readme_and_protocol_name_no_web_address_but_loopback_examples() {
    let mut problems = Vec::new();
    for document in documents() {
        let text = read(&document);
        for scheme in ["http://", "https://"] {
            for (at, _) in text.match_indices(scheme) {
                let authority: String = text[at + scheme.len()..]
                    .chars()
                    .take_while(|c| !matches!(c, '/' | ' ' | ')' | '`' | '"' | '\'' | '>' | '\n'))
                    .collect();
                let host = match authority.rfind(':') {
                    Some(colon) if !authority.ends_with(']') => &authority[..colon],
                    _ => authority.as_str(),
                };
                if !LOOPBACK_HOSTS.contains(&host) {
                    problems.push(format!("{document}: {scheme}{authority}"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "web addresses outside loopback:\n{}",
        problems.join("\n")
    );
}

/// The link checker itself: a broken path, a path out of the repository and a
/// missing anchor are caught; good ones pass.
#[test]
fn the_link_checker_catches_what_a_clone_would_break() {
    let text = "# Title\n\n## Two words `code`\n\n## Two words `code`\n";
    assert!(check_target("t", text, "#title").is_ok());
    assert!(check_target("t", text, "#two-words-code").is_ok());
    assert!(check_target("t", text, "#two-words-code-1").is_ok());
    assert!(check_target("t", text, "#nope").is_err());
    assert!(check_target("t", text, "PROTOCOL.md#limits").is_ok());
    assert!(check_target("t", text, "PROTOCOL.md#no-such-heading").is_err());
    assert!(check_target("t", text, "examples/clients/").is_ok());
    assert!(check_target("t", text, "../shared/spec/contract.md").is_err());
    assert!(check_target("t", text, "no/such/file.md").is_err());
    assert!(check_target("t", text, "mailto:someone").is_err());
    // From a page of docs/, links are relative to docs/.
    assert!(check_target("docs/t.md", text, "../PROTOCOL.md#limits").is_ok());
    assert!(check_target("docs/t.md", text, "PROTOCOL.md").is_err());
    assert!(check_target("docs/t.md", text, "commands.md#commands").is_ok());
    assert!(check_target("docs/t.md", text, "../../x.md").is_err());
    assert_eq!(
        link_targets("see [a](x.md) and `[b](y.md)`\n```\n[c](z.md)\n```\n"),
        ["x.md"]
    );
    assert!(Path::new(&repo()).join("README.md").exists());
}
