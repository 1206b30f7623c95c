//! The budget check with reservations (contract 8 "Budget"): a turn is admitted only
//! while usage.json's total plus an estimate for every turn running now stays under
//! `budgetUsd`, so concurrent turns cannot each see the same unspent budget.
//!
//! The estimate of a running turn is `engine.maxTurnCostUsd` when set, else the mean
//! cost of the last [`RECENT_COSTS`] turns (of this process, else of usage.json's
//! totals). What remains of an overshoot: with `maxTurnCostUsd` (and turns that cost no
//! more), the spend stays under `budgetUsd + maxTurnCostUsd`, one turn's worth; with
//! the mean, each running turn may exceed its estimate by its distance from the mean,
//! and an instance with no recorded cost yet estimates 0.

use crate::protocol::{ErrorCode, Failure};
use crate::usage::{self, UsageFileError, UsageStore};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many recent turn costs the mean estimate is taken over.
pub const RECENT_COSTS: usize = 16;

/// The estimates of the turns running now, and recent costs.
#[derive(Debug, Default)]
pub struct Reservations {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The sum of the estimates of the turns running now.
    reserved: f64,
    running: usize,
    recent: VecDeque<f64>,
}

/// One admitted turn's reservation; released when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    owner: &'a Reservations,
    estimate: f64,
}

impl Reservation<'_> {
    /// Releases the reservation, noting what the turn cost (when it reported one) for
    /// the mean.
    pub fn finish(self, cost: Option<f64>) {
        if let Some(cost) = cost.filter(|c| c.is_finite() && *c >= 0.0) {
            let mut state = self.owner.lock();
            if state.recent.len() == RECENT_COSTS {
                state.recent.pop_front();
            }
            state.recent.push_back(cost);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut state = self.owner.lock();
        state.running = state.running.saturating_sub(1);
        state.reserved = if state.running == 0 {
            // No drift from float subtraction survives an idle moment.
            0.0
        } else {
            (state.reserved - self.estimate).max(0.0)
        };
    }
}

impl Reservations {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a turn against `budget`, reserving its estimate (`max_turn_cost` when
    /// set, else the recent mean), or refuses it: `budget_exhausted` when the total
    /// spent plus the running turns' estimates reach the budget (or the total cannot
    /// be known).
    ///
    /// # Errors
    /// The refusal, as the turn's failure.
    pub fn admit(
        &self,
        usage: &UsageStore,
        budget: f64,
        max_turn_cost: Option<f64>,
    ) -> Result<Reservation<'_>, Failure> {
        // Held across the read and the reservation, so admissions are one at a time.
        let mut state = self.lock();
        let spent = usage.current().map_err(|e| match e {
            UsageFileError::Corrupt(_) => {
                Failure::new(ErrorCode::BudgetExhausted, format!("Budget unknown: {e}."))
            }
            _ => Failure::new(ErrorCode::InternalError, format!("cannot read usage: {e}")),
        })?;
        let total = spent.total_cost_usd;
        if total + state.reserved >= budget {
            let mut message = usage::budget_message(total, budget);
            if state.running > 0 {
                message = format!(
                    "{} (${:.4} more is reserved by {} running turn(s).)",
                    message.trim_end_matches('.'),
                    state.reserved,
                    state.running
                );
            }
            return Err(Failure::new(ErrorCode::BudgetExhausted, message));
        }
        let recent = &state.recent;
        let estimate = max_turn_cost.unwrap_or(match (recent.len(), spent.request_count) {
            (0, 0) => 0.0,
            (0, n) => total / n as f64,
            (len, _) => recent.iter().sum::<f64>() / len as f64,
        });
        state.reserved += estimate;
        state.running += 1;
        Ok(Reservation {
            owner: self,
            estimate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;
    use crate::usage::TurnUsage;

    fn turn(cost: f64) -> TurnUsage {
        TurnUsage {
            cost_usd: cost,
            ..TurnUsage::default()
        }
    }

    #[test]
    fn bug_concurrent_turns_overshot_the_budget() {
        let dir = TestDir::new("budget-reserve");
        let usage = UsageStore::new(dir.path());
        let reservations = Reservations::default();
        // With maxTurnCostUsd 0.60 against $1.00: two are admitted, the third waits
        // for nothing and is refused.
        let first = reservations.admit(&usage, 1.0, Some(0.6)).unwrap();
        let second = reservations.admit(&usage, 1.0, Some(0.6)).unwrap();
        let refused = reservations.admit(&usage, 1.0, Some(0.6)).unwrap_err();
        assert_eq!(refused.code, ErrorCode::BudgetExhausted);
        assert!(
            refused.error.contains("reserved by 2 running"),
            "{refused:?}"
        );
        usage.record(&turn(0.6)).unwrap();
        first.finish(Some(0.6));
        // 0.60 spent + 0.60 reserved >= 1.00.
        assert!(reservations.admit(&usage, 1.0, Some(0.6)).is_err());
        usage.record(&turn(0.6)).unwrap();
        second.finish(Some(0.6));
        // Spent: 1.20 of 1.00, under budget + one turn.
        let refused = reservations.admit(&usage, 1.0, Some(0.6)).unwrap_err();
        assert_eq!(refused.error, usage::budget_message(1.2, 1.0));
    }

    #[test]
    fn max_turn_cost_usd_is_read_from_config() {
        let parse = |text: &str| crate::config::parse(text.as_bytes());
        let engine = parse(r#"{"engine":{"command":["a"],"maxTurnCostUsd":0.6}}"#).unwrap();
        assert_eq!(engine.engine.unwrap().max_turn_cost_usd, Some(0.6));
        let engine = parse(r#"{"engine":{"command":["a"]}}"#).unwrap();
        assert_eq!(engine.engine.unwrap().max_turn_cost_usd, None);
        for bad in ["-1", "\"1\"", "true"] {
            let text = format!(r#"{{"engine":{{"command":["a"],"maxTurnCostUsd":{bad}}}}}"#);
            assert!(parse(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_cap_the_recent_mean_is_reserved() {
        let dir = TestDir::new("budget-mean");
        let usage = UsageStore::new(dir.path());
        usage.record(&turn(0.25)).unwrap();
        let reservations = Reservations::default();
        // usage.json's mean (0.25) before this process saw a turn.
        let a = reservations.admit(&usage, 1.0, None).unwrap();
        let b = reservations.admit(&usage, 1.0, None).unwrap();
        let c = reservations.admit(&usage, 1.0, None).unwrap();
        assert!(reservations.admit(&usage, 1.0, None).is_err());
        drop((b, c));
        a.finish(Some(0.125));
        // The mean is now this process's: 0.125.
        let held: Vec<_> = (0..6)
            .map(|_| reservations.admit(&usage, 1.0, None).unwrap())
            .collect();
        assert!(reservations.admit(&usage, 1.0, None).is_err());
        drop(held);
        assert!(reservations.admit(&usage, 1.0, None).is_ok());
    }
}
