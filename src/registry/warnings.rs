//! Registry warnings that can't flood: each problem of a registry file is warned about
//! once per process, and one read lists only a few new ones, counting the rest.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// How many new problems one read lists, one line each; the rest are counted in one
/// summary line. A running instance reads the registry every few seconds, so a file of
/// thousands of invalid entries must not become thousands of lines.
const MAX_PROBLEMS_LISTED: usize = 10;
/// How many distinct problems a process remembers having warned about (each is warned
/// about once). Past this many, further new ones are only counted in a summary line at
/// each read.
const MAX_PROBLEMS_REMEMBERED: usize = 16_384;

/// Problems already warned about in this process, by a hash of (file, problem).
static WARNED: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// Warns about each of `problems` in `path` that this process has not warned about
/// yet: at most [`MAX_PROBLEMS_LISTED`] one per line, then one line counting the rest.
pub(super) fn warn_once(path: &Path, problems: &[String]) {
    let fresh = {
        // A panic elsewhere while holding the set leaves it usable.
        let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
        fresh_problems(&mut warned, path, problems)
    };
    for problem in fresh.iter().take(MAX_PROBLEMS_LISTED) {
        log::warn!("{}: {problem}", path.display());
    }
    if fresh.len() > MAX_PROBLEMS_LISTED {
        log::warn!(
            "{}: {} more problems not listed (each is reported once)",
            path.display(),
            fresh.len() - MAX_PROBLEMS_LISTED
        );
    }
}

/// The distinct problems of `problems` not in `warned`, in order, which are added to
/// it (while it holds fewer than [`MAX_PROBLEMS_REMEMBERED`]).
fn fresh_problems<'a>(
    warned: &mut BTreeSet<u64>,
    path: &Path,
    problems: &'a [String],
) -> Vec<&'a str> {
    let mut fresh = Vec::new();
    let mut this_read = BTreeSet::new();
    for problem in problems {
        let mut hasher = DefaultHasher::new();
        (path, problem).hash(&mut hasher);
        let key = hasher.finish();
        if warned.contains(&key) || !this_read.insert(key) {
            continue;
        }
        if warned.len() < MAX_PROBLEMS_REMEMBERED {
            warned.insert(key);
        }
        fresh.push(problem.as_str());
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bug_invalid_entries_flooded_the_log_at_every_read() {
        let mut warned = BTreeSet::new();
        let path = Path::new("/r/.bus-registry.json");
        let problems: Vec<String> = (0..10_000)
            .map(|i| format!("ignoring an entry: e{i}: pid must be a positive integer"))
            .chain(std::iter::repeat_n("invalid instance name".to_owned(), 500))
            .collect();
        let first = fresh_problems(&mut warned, path, &problems);
        assert_eq!(first.len(), 10_001, "repeats within one read count once");
        assert!(fresh_problems(&mut warned, path, &problems).is_empty());
        // Another problem, or the same one in another file, is new.
        let other = ["not valid JSON; treating it as empty".to_owned()];
        assert_eq!(fresh_problems(&mut warned, path, &other).len(), 1);
        assert_eq!(
            fresh_problems(&mut warned, Path::new("/s/.bus-registry.json"), &other).len(),
            1
        );
        // The memory is bounded; past it, new problems are reported but not kept.
        let many: Vec<String> = (0..MAX_PROBLEMS_REMEMBERED)
            .map(|i| format!("m{i}"))
            .collect();
        fresh_problems(&mut warned, path, &many);
        assert_eq!(warned.len(), MAX_PROBLEMS_REMEMBERED);
    }
}
