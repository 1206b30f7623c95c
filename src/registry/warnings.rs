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
/// yet, each after `prefix`: at most [`MAX_PROBLEMS_LISTED`] one per line, then one
/// line counting the rest. Returns how many were new.
pub(super) fn warn_once(path: &Path, prefix: &str, problems: &[String]) -> usize {
    let mut fresh = Vec::new();
    let mut this_read = BTreeSet::new();
    // A panic elsewhere while holding the set leaves it usable.
    let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    for problem in problems {
        let mut hasher = DefaultHasher::new();
        (path, prefix, problem).hash(&mut hasher);
        let key = hasher.finish();
        // Past MAX_PROBLEMS_REMEMBERED, a new problem is only kept for this read.
        if (warned.len() < MAX_PROBLEMS_REMEMBERED && warned.insert(key))
            || (!warned.contains(&key) && this_read.insert(key))
        {
            fresh.push(problem);
        }
    }
    drop(warned);
    let shown = path.display();
    for problem in fresh.iter().take(MAX_PROBLEMS_LISTED) {
        log::warn!("{shown}: {prefix}{problem}");
    }
    let more = fresh.len().saturating_sub(MAX_PROBLEMS_LISTED);
    if more > 0 {
        log::warn!("{shown}: {more} more problems not listed (each is reported once)");
    }
    fresh.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bug_invalid_entries_flooded_the_log_at_every_read() {
        let path = Path::new("/r/.bus-registry.json");
        let problems: Vec<String> = (0..10_000)
            .map(|i| format!("e{i}: pid must be a positive integer"))
            .chain(std::iter::repeat_n("invalid instance name".to_owned(), 500))
            .collect();
        assert_eq!(
            warn_once(path, "ignoring an entry: ", &problems),
            10_001,
            "repeats within one read count once"
        );
        assert_eq!(warn_once(path, "ignoring an entry: ", &problems), 0);
        // Another problem, or the same one in another file, is new.
        let other = ["not valid JSON; treating it as empty".to_owned()];
        assert_eq!(warn_once(path, "", &other), 1);
        assert_eq!(warn_once(Path::new("/s/.bus-registry.json"), "", &other), 1);
        // The memory is bounded; past it, new problems are reported but not kept.
        let many: Vec<String> = (0..MAX_PROBLEMS_REMEMBERED)
            .map(|i| format!("m{i}"))
            .collect();
        assert_eq!(warn_once(path, "", &many), MAX_PROBLEMS_REMEMBERED);
        let warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(warned.len(), MAX_PROBLEMS_REMEMBERED);
    }
}
