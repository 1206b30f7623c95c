//! `usage.json`: accumulated engine usage, which the budget check (`engine::budget`)
//! reads.
//!
//! Every read and update runs under the file's advisory lock ([`files::with_lock`]);
//! an update writes the new totals atomically, then mirrors them to `usage.json.bak`.
//! A corrupt `usage.json` (unparsable, over [`MAX_USAGE_BYTES`], or not a regular
//! file) is moved aside (renamed with a `.corrupt-<millis>` suffix) and the last good
//! copy (in memory, else the backup) takes its place; a missing one is restored from
//! the last good copy too. When no good copy exists, reads and updates fail with
//! [`UsageFileError::Corrupt`] and the file is left for an operator to repair or remove; the
//! engine then refuses budgeted turns: the budget never resets silently.

use crate::{files, time};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The usage file's name inside the state directory.
pub const USAGE_FILE: &str = "usage.json";
/// The last good copy, rewritten after every update.
pub const USAGE_BACKUP_FILE: &str = "usage.json.bak";
/// A usage file larger than this is treated as corrupt rather than read.
pub const MAX_USAGE_BYTES: u64 = 64 * 1024;
/// The largest total cost recorded, in US dollars: far above any real bill, far below
/// where adding to an `f64` loses cents or overflows to infinity (which JSON would
/// carry as `null`).
pub const MAX_TOTAL_COST_USD: f64 = 1e12;
/// The precision a total cost is stored to, as steps per US dollar (a billionth of a
/// dollar): each sum is rounded to it, so that repeated additions never leave float
/// noise (`1.2000000000000002`) in `usage.json`. Far finer than any engine's reported
/// cost; an exact power of ten, so the rounding itself adds no noise.
pub const COST_STEPS_PER_USD: f64 = 1e9;

/// `cost` rounded to a whole number of billionths of a dollar (`COST_STEPS_PER_USD`):
/// the double nearest to that short decimal, which serializes as it.
pub fn round_cost(cost: f64) -> f64 {
    // Both operations are correctly rounded and 1e9 is exact, so a total of up to
    // 2^53 steps (about $9 million) comes out as the nearest double to its decimal.
    (cost * COST_STEPS_PER_USD).round() / COST_STEPS_PER_USD
}

/// Accumulated usage of one instance, as `usage.json` holds it (fields in the file's
/// order). `totalCostUsd` and `requestCount` must be present; other missing counters
/// count as 0, and a missing or null `lastUpdatedAt` is `None`. A value of the wrong
/// type (a counter that is not a non-negative integer, a cost that is not a finite
/// non-negative number) makes the whole file invalid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Usage {
    /// When the file was last updated (ISO-8601), if ever.
    pub last_updated_at: Option<String>,
    /// Number of engine turns recorded.
    pub request_count: u64,
    /// Sum of cache-read input tokens.
    #[serde(default)]
    pub total_cached_tokens: u64,
    /// Sum of reported cost, in US dollars.
    pub total_cost_usd: f64,
    /// Sum of input tokens.
    #[serde(default)]
    pub total_input_tokens: u64,
    /// Sum of output tokens.
    #[serde(default)]
    pub total_output_tokens: u64,
}

/// What one turn used, as the engine reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnUsage {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache-read input tokens.
    pub cached_tokens: u64,
    /// Cost in US dollars (finite, non-negative).
    pub cost_usd: f64,
    /// Whether the engine reported a cost (`cost_usd` is 0 otherwise).
    pub cost_reported: bool,
    /// Whether the engine reported any token count (the counts are 0 otherwise).
    pub tokens_reported: bool,
}

impl TurnUsage {
    /// Whether the engine reported anything at all: a turn of a text engine, or of a
    /// JSON engine that said nothing of its usage, counts with zeros, but reports none.
    pub fn is_reported(&self) -> bool {
        self.cost_reported || self.tokens_reported
    }
}

impl Usage {
    fn to_json(&self) -> Vec<u8> {
        // Serializing numbers, strings and null into a Vec cannot fail.
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Parses a usage file (see [`Usage`] for what makes one invalid).
    fn from_json(bytes: &[u8]) -> Option<Usage> {
        serde_json::from_slice::<Usage>(bytes)
            .ok()
            .filter(|usage| usage.total_cost_usd.is_finite() && usage.total_cost_usd >= 0.0)
    }

    /// Adds `turn`. Token counts saturate; a cost that is not finite and
    /// non-negative, or a total cost that would pass [`MAX_TOTAL_COST_USD`], is refused
    /// (the totals are left as they were), so the file never holds `null` or `inf`.
    fn add(&mut self, turn: &TurnUsage) -> Result<(), UsageFileError> {
        let total = round_cost(self.total_cost_usd + turn.cost_usd);
        // A cost that is not finite makes the total not finite too.
        if turn.cost_usd < 0.0 || !(total.is_finite() && total <= MAX_TOTAL_COST_USD) {
            return Err(UsageFileError::Overflow {
                total: self.total_cost_usd,
                cost: turn.cost_usd,
            });
        }
        self.total_cost_usd = total;
        self.total_input_tokens = self.total_input_tokens.saturating_add(turn.input_tokens);
        self.total_output_tokens = self.total_output_tokens.saturating_add(turn.output_tokens);
        self.total_cached_tokens = self.total_cached_tokens.saturating_add(turn.cached_tokens);
        self.request_count = self.request_count.saturating_add(1);
        self.last_updated_at = Some(time::now_iso8601());
        Ok(())
    }
}

/// Why usage could not be read or recorded.
#[derive(Debug)]
#[non_exhaustive]
pub enum UsageFileError {
    /// `usage.json` is corrupt and no good copy exists; it was left in place.
    Corrupt(PathBuf),
    /// Reading or writing failed.
    Io(io::Error),
    /// Adding this turn's cost would take the total past $10^12 (`MAX_TOTAL_COST_USD`)
    /// (or the cost is not a finite, non-negative number); nothing was written.
    Overflow {
        /// The total before this turn, in US dollars.
        total: f64,
        /// The turn's cost.
        cost: f64,
    },
}

impl fmt::Display for UsageFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageFileError::Corrupt(path) => write!(
                f,
                "{} is corrupt and no good copy exists; repair or remove it",
                path.display()
            ),
            UsageFileError::Io(e) => write!(f, "usage file: {e}"),
            UsageFileError::Overflow { total, cost } => write!(
                f,
                "a cost of ${cost} on a total of ${total} passes the bound of ${MAX_TOTAL_COST_USD}; not recorded"
            ),
        }
    }
}

impl std::error::Error for UsageFileError {}

/// The budget refusal text the contract fixes: used to 4 places, budget to 2.
pub fn budget_message(used: f64, budget: f64) -> String {
    format!("Budget exhausted: ${used:.4} used of ${budget:.2}.")
}

/// One instance's `usage.json`, shared by its turn workers.
#[derive(Debug)]
pub struct UsageStore {
    path: PathBuf,
    backup: PathBuf,
    last_good: Mutex<Option<Usage>>,
}

impl UsageStore {
    /// The store of the state directory `state_dir`.
    pub fn new(state_dir: &Path) -> UsageStore {
        UsageStore {
            path: state_dir.join(USAGE_FILE),
            backup: state_dir.join(USAGE_BACKUP_FILE),
            last_good: Mutex::new(None),
        }
    }

    /// The current totals. Like every read, this may set a corrupt file aside or
    /// restore a missing one from the last good copy.
    ///
    /// # Errors
    /// The file is corrupt with no good copy, or can't be read.
    pub fn current(&self) -> Result<Usage, UsageFileError> {
        files::with_lock(&self.path, || Ok(self.load())).map_err(UsageFileError::Io)?
    }

    /// Adds one turn's usage and writes the new totals.
    ///
    /// # Errors
    /// The file is corrupt with no good copy, or can't be read or written.
    pub fn record(&self, turn: &TurnUsage) -> Result<Usage, UsageFileError> {
        let update = || {
            let mut usage = self.load()?;
            usage.add(turn)?;
            let bytes = usage.to_json();
            for path in [&self.path, &self.backup] {
                files::write_atomic(path, &bytes, files::PRIVATE_FILE_MODE)
                    .map_err(UsageFileError::Io)?;
            }
            *self.cache() = Some(usage.clone());
            Ok(usage)
        };
        files::with_lock(&self.path, || Ok(update())).map_err(UsageFileError::Io)?
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Option<Usage>> {
        // Nothing panics while holding this lock; a poisoned value is still whole.
        self.last_good
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the file (the caller holds the file lock). A corrupt one is set aside and
    /// replaced by the last good copy, if there is one. A missing one is replaced by it
    /// too: a new instance starts from zero, but one that had usage gets it back, loudly
    /// (deleting the file alone does not reset the budget; resetting takes removing both
    /// files while stopped).
    fn load(&self) -> Result<Usage, UsageFileError> {
        let bytes = read_small(&self.path).map_err(UsageFileError::Io)?;
        if let Some(usage) = bytes.as_deref().and_then(Usage::from_json) {
            *self.cache() = Some(usage.clone());
            return Ok(usage);
        }
        let Some(good) = self.last_good() else {
            if bytes.is_none() {
                return Ok(Usage::default());
            }
            log::error!(
                "{} is corrupt and no good copy exists; budgeted turns are refused until it is repaired or removed",
                self.path.display()
            );
            return Err(UsageFileError::Corrupt(self.path.clone()));
        };
        let aside = bytes
            .map(|_| files::set_aside(&self.path, "corrupt"))
            .transpose()
            .map_err(UsageFileError::Io)?;
        files::write_atomic(&self.path, &good.to_json(), files::PRIVATE_FILE_MODE)
            .map_err(UsageFileError::Io)?;
        match aside {
            Some(aside) => log::error!(
                "{} was corrupt: moved to {} and restored from the last good copy (${:.4} used)",
                self.path.display(),
                aside.display(),
                good.total_cost_usd
            ),
            None => log::error!(
                "{} was missing: restored from the last good copy (${:.4} used); to reset usage, stop the instance and remove it and {}",
                self.path.display(),
                good.total_cost_usd,
                self.backup.display()
            ),
        }
        Ok(good)
    }

    /// The last good totals: in memory, else the backup file.
    fn last_good(&self) -> Option<Usage> {
        self.cache().clone().or_else(|| {
            read_small(&self.backup)
                .ok()
                .flatten()
                .and_then(|b| Usage::from_json(&b))
        })
    }
}

/// The totals of the instance in `state_dir` as the files say, for reports: never
/// locks, repairs or writes anything (updates replace the file atomically, so a read
/// sees a whole one). `usage.json` when it is valid, else its backup; zero usage when
/// neither exists.
///
/// # Errors
/// [`UsageFileError::Corrupt`] when `usage.json` (or, without it, the backup) exists but is
/// not valid and no valid copy exists; [`UsageFileError::Io`] when a file can't be read.
pub fn peek(state_dir: &Path) -> Result<Usage, UsageFileError> {
    let mut corrupt = None;
    for path in [USAGE_FILE, USAGE_BACKUP_FILE].map(|name| state_dir.join(name)) {
        if let Some(bytes) = read_small(&path).map_err(UsageFileError::Io)? {
            if let Some(usage) = Usage::from_json(&bytes) {
                return Ok(usage);
            }
            corrupt = corrupt.or(Some(path));
        }
    }
    corrupt.map_or(Ok(Usage::default()), |path| {
        Err(UsageFileError::Corrupt(path))
    })
}

/// Reads a usage file of at most [`MAX_USAGE_BYTES`]; `None` if it does not exist.
/// One too large or not a regular file reads as empty, that is, as corrupt.
fn read_small(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match files::read_regular_file(path, MAX_USAGE_BYTES) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // Too large, or not a file: not ours, so corrupt content.
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(Some(Vec::new())),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;
    use serde_json::{json, Value};

    fn turn(cost: f64) -> TurnUsage {
        TurnUsage {
            input_tokens: 10,
            output_tokens: 5,
            cached_tokens: 2,
            cost_usd: cost,
            ..TurnUsage::default()
        }
    }

    #[test]
    fn budget_message_format() {
        assert_eq!(
            budget_message(1.2, 1.0),
            "Budget exhausted: $1.2000 used of $1.00."
        );
        assert_eq!(
            budget_message(0.123456, 0.1),
            "Budget exhausted: $0.1235 used of $0.10."
        );
    }

    #[test]
    fn totals_add_up_and_persist() {
        let dir = TestDir::new("usage-add");
        let store = UsageStore::new(dir.path());
        assert_eq!(store.current().unwrap(), Usage::default());
        store.record(&turn(0.25)).unwrap();
        let usage = store.record(&turn(0.5)).unwrap();
        assert_eq!(usage.request_count, 2);
        assert_eq!(usage.total_input_tokens, 20);
        assert_eq!(usage.total_output_tokens, 10);
        assert_eq!(usage.total_cached_tokens, 4);
        assert!((usage.total_cost_usd - 0.75).abs() < 1e-12);
        // A new store (a restarted process) reads the same totals.
        let again = UsageStore::new(dir.path()).current().unwrap();
        assert_eq!(again, usage);
        let v: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(USAGE_FILE)).unwrap()).unwrap();
        for field in [
            "totalInputTokens",
            "totalOutputTokens",
            "totalCachedTokens",
            "totalCostUsd",
            "requestCount",
            "lastUpdatedAt",
        ] {
            assert!(v.get(field).is_some(), "{field}");
        }
        assert_eq!(
            crate::files::mode_is_wider(&dir.path().join(USAGE_FILE), 0o600).unwrap(),
            None
        );
    }

    #[test]
    fn corrupt_file_is_set_aside_and_last_good_copy_used() {
        let dir = TestDir::new("usage-corrupt");
        let store = UsageStore::new(dir.path());
        store.record(&turn(1.5)).unwrap();
        std::fs::write(dir.path().join(USAGE_FILE), b"{torn").unwrap();
        // A fresh process has no memory: the backup is the good copy.
        let fresh = UsageStore::new(dir.path());
        let usage = fresh.current().unwrap();
        assert!((usage.total_cost_usd - 1.5).abs() < 1e-12);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("usage.json.corrupt-")
            })
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(std::fs::read(aside[0].path()).unwrap(), b"{torn");
        // usage.json holds the good totals again.
        assert_eq!(UsageStore::new(dir.path()).current().unwrap(), usage);
    }

    #[test]
    fn corrupt_without_any_good_copy_is_an_error_not_a_reset() {
        let dir = TestDir::new("usage-nogood");
        std::fs::write(dir.path().join(USAGE_FILE), b"[1,2]").unwrap();
        let store = UsageStore::new(dir.path());
        assert!(matches!(store.current(), Err(UsageFileError::Corrupt(_))));
        assert!(matches!(
            store.record(&turn(0.1)),
            Err(UsageFileError::Corrupt(_))
        ));
        // Left in place for the operator.
        assert_eq!(
            std::fs::read(dir.path().join(USAGE_FILE)).unwrap(),
            b"[1,2]"
        );
    }

    #[test]
    fn a_deleted_or_emptied_file_does_not_reset_the_budget() {
        let dir = TestDir::new("usage-deleted");
        UsageStore::new(dir.path()).record(&turn(2.5)).unwrap();
        for damage in [None, Some(&b"{}"[..])] {
            match damage {
                None => std::fs::remove_file(dir.path().join(USAGE_FILE)).unwrap(),
                Some(bytes) => std::fs::write(dir.path().join(USAGE_FILE), bytes).unwrap(),
            }
            // A fresh process: only the backup remembers.
            let usage = UsageStore::new(dir.path()).current().unwrap();
            assert!((usage.total_cost_usd - 2.5).abs() < 1e-12, "{damage:?}");
        }
        // Removing both (the documented reset) starts from zero.
        std::fs::remove_file(dir.path().join(USAGE_FILE)).unwrap();
        std::fs::remove_file(dir.path().join(USAGE_BACKUP_FILE)).unwrap();
        assert_eq!(
            UsageStore::new(dir.path()).current().unwrap(),
            Usage::default()
        );
    }

    #[test]
    fn bug_totals_overflowed_to_null() {
        let dir = TestDir::new("usage-overflow");
        std::fs::write(
            dir.path().join(USAGE_FILE),
            format!(
                r#"{{"totalCostUsd":{},"requestCount":1}}"#,
                MAX_TOTAL_COST_USD - 1.0
            ),
        )
        .unwrap();
        let store = UsageStore::new(dir.path());
        for cost in [2.0, f64::MAX, f64::INFINITY, f64::NAN, -1.0] {
            assert!(
                matches!(
                    store.record(&turn(cost)),
                    Err(UsageFileError::Overflow { .. })
                ),
                "{cost}"
            );
        }
        // The file is unchanged and valid, and smaller costs still add up.
        let usage = store.record(&turn(0.5)).unwrap();
        assert_eq!(usage.request_count, 2);
        let bytes = std::fs::read(dir.path().join(USAGE_FILE)).unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(v["totalCostUsd"].is_f64(), "{v}");
        // Token totals saturate instead of wrapping.
        let mut huge = turn(0.0);
        huge.input_tokens = u64::MAX;
        store.record(&huge).unwrap();
        let usage = store.record(&huge).unwrap();
        assert_eq!(usage.total_input_tokens, u64::MAX);
    }

    #[test]
    fn bug_twelve_dimes_were_stored_as_1_2000000000000002() {
        let dir = TestDir::new("usage-noise");
        let store = UsageStore::new(dir.path());
        let mut usage = Usage::default();
        let mut naive = 0.0;
        let mut noisy = 0;
        for dimes in 1..=12 {
            usage = store.record(&turn(0.1)).unwrap();
            naive += 0.1;
            noisy += usize::from(format!("{naive}").len() > 4);
            // Each stored total is the short decimal, never 0.30000000000000004.
            let text = std::fs::read_to_string(dir.path().join(USAGE_FILE)).unwrap();
            let want = format!("\"totalCostUsd\": {},", json!(f64::from(dimes) / 10.0));
            assert!(text.contains(&want), "{dimes}: {text}");
        }
        assert!(noisy > 0, "plain sums of 0.1 carry noise");
        assert_eq!(usage.total_cost_usd, 1.2);
        let text = std::fs::read_to_string(dir.path().join(USAGE_FILE)).unwrap();
        assert!(text.contains("\"totalCostUsd\": 1.2,"), "{text}");
        assert_eq!(peek(dir.path()).unwrap(), usage);
        for (cost, want) in [(0.1 + 0.2, 0.3), (1e-10, 0.0), (2.6e-9, 3e-9), (7.0, 7.0)] {
            assert_eq!(round_cost(cost), want, "{cost}");
        }
    }

    #[test]
    fn peek_reads_without_repairing() {
        let dir = TestDir::new("usage-peek");
        assert_eq!(peek(dir.path()).unwrap(), Usage::default());
        UsageStore::new(dir.path()).record(&turn(0.5)).unwrap();
        std::fs::write(dir.path().join(USAGE_FILE), b"{torn").unwrap();
        // The backup is read, and the corrupt file is left as it is.
        assert_eq!(peek(dir.path()).unwrap().total_cost_usd, 0.5);
        assert_eq!(
            std::fs::read(dir.path().join(USAGE_FILE)).unwrap(),
            b"{torn"
        );
        std::fs::remove_file(dir.path().join(USAGE_BACKUP_FILE)).unwrap();
        assert!(matches!(peek(dir.path()), Err(UsageFileError::Corrupt(_))));
    }

    #[test]
    fn parse_table() {
        let cases: &[(&[u8], bool)] = &[
            (br#"{"totalCostUsd":1.5,"requestCount":3}"#, true),
            (br#"{}"#, false),
            (br#"{"totalCostUsd":0.5}"#, false),
            (br#"{"totalCostUsd":0,"requestCount":0}"#, true),
            (br#"{"totalCostUsd":-1,"requestCount":1}"#, false),
            (br#"{"totalCostUsd":"1","requestCount":1}"#, false),
            (br#"{"totalCostUsd":1,"requestCount":1.5}"#, false),
            (
                br#"{"totalCostUsd":1,"requestCount":1,"lastUpdatedAt":5}"#,
                false,
            ),
            (b"null", false),
            (b"", false),
        ];
        for (bytes, ok) in cases {
            assert_eq!(
                Usage::from_json(bytes).is_some(),
                *ok,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn concurrent_records_lose_nothing() {
        let dir = TestDir::new("usage-threads");
        let store = std::sync::Arc::new(UsageStore::new(dir.path()));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        store.record(&turn(0.01)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(
            UsageStore::new(dir.path()).current().unwrap().request_count,
            40
        );
    }
}
