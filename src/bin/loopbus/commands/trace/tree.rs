//! The tree of one trace's turns, pure: who delegated to whom (a turn's children are
//! the turns whose `parentRequestId` is its request id), in start order, with what
//! each turn and each subtree cost.

use serde::Serialize;

/// One turn of a trace, as the audit line of the instance that ran it tells it. Never
/// a prompt's text: audit lines carry none.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceTurn {
    /// The instance that ran (or refused) the turn.
    pub instance: String,
    /// Who asked: the `fromInstance` of the request.
    pub from_instance: String,
    /// The turn's request id.
    pub request_id: Option<String>,
    /// The request id of the turn that made this delegation (`None` at a root).
    pub parent_request_id: Option<String>,
    /// The audit outcome: `success`, `failure`, `refused`, `cancelled` or `abandoned`.
    pub outcome: String,
    /// The error code of a failure or refusal.
    pub error_code: Option<String>,
    /// When the request arrived, in milliseconds since 1970 (the line's timestamp less
    /// its `durationMs`).
    pub started_ms: u64,
    /// How long the turn took until its answer.
    pub duration_ms: u64,
    /// The request's depth.
    pub depth: Option<u64>,
    /// What the turn alone cost, as its engine reported it.
    pub own: TraceTotals,
}

/// Cost and tokens summed over turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceTotals {
    /// How many turns are summed (1 for a turn's own figures).
    pub turns: u64,
    /// Their cost in US dollars; `None` when none of them reported one.
    pub cost_usd: Option<f64>,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache-read input tokens.
    pub cached_tokens: u64,
}

impl TraceTotals {
    /// Adds `other` to these totals (saturating).
    pub fn add(&mut self, other: &TraceTotals) {
        self.turns = self.turns.saturating_add(other.turns);
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
    }
}

/// A turn in its place in the tree.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceNode {
    /// The turn.
    #[serde(flatten)]
    pub turn: TraceTurn,
    /// 0 for a root (a turn without a parent among the trace's turns), else its
    /// parent's level plus one.
    pub level: usize,
    /// The turn and every turn below it, summed.
    pub subtree: TraceTotals,
}

/// The turns as a tree, flattened in pre-order (each node followed by its subtree,
/// siblings and roots in start order), so that no walk of it recurses. A turn without
/// a parent request id hangs under its caller's turn that was running when it started
/// (an engine that passed on only `TRACEPARENT`), if there is one. A turn whose
/// parent is not among `turns` is a root; so is the earliest turn of a cycle of
/// parents (only a forged log has one). When one request id names several turns (a
/// retry after a retryable failure ran it again), a child hangs under the last of
/// them that started no later than it did.
pub fn build(mut turns: Vec<TraceTurn>) -> Vec<TraceNode> {
    turns.sort_by(|a, b| {
        (a.started_ms, &a.instance, &a.request_id).cmp(&(b.started_ms, &b.instance, &b.request_id))
    });
    let mut by_id: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    let mut by_instance: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    for (i, turn) in turns.iter().enumerate() {
        if let Some(id) = &turn.request_id {
            by_id.entry(id.as_str()).or_default().push(i);
        }
        by_instance.entry(&turn.instance).or_default().push(i);
    }
    let parent: Vec<Option<usize>> = turns
        .iter()
        .enumerate()
        .map(|(i, turn)| {
            let Some(parent_id) = turn.parent_request_id.as_deref() else {
                let theirs = by_instance.get(turn.from_instance.as_str())?;
                return enclosing_turn_of_caller(&turns, theirs, i);
            };
            let candidates = by_id.get(parent_id)?;
            let earlier = candidates
                .iter()
                .rev()
                .find(|&&c| turns[c].started_ms <= turn.started_ms);
            earlier.or(candidates.first()).copied().filter(|&p| p != i)
        })
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); turns.len()];
    for (i, p) in parent.iter().enumerate() {
        if let Some(p) = p {
            children[*p].push(i);
        }
    }
    // The roots: turns without a parent, then the earliest turn of each cycle.
    let mut is_root: Vec<bool> = parent.iter().map(Option::is_none).collect();
    let mut seen = vec![false; turns.len()];
    let walk = |start: usize, seen: &mut Vec<bool>, order: &mut Vec<(usize, usize)>| {
        let mut stack = vec![(start, 0)];
        while let Some((i, level)) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                order.push((i, level));
                stack.extend(children[i].iter().rev().map(|&c| (c, level + 1)));
            }
        }
    };
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(turns.len());
    for i in (0..turns.len()).filter(|&i| is_root[i]) {
        walk(i, &mut seen, &mut order);
    }
    for i in 0..turns.len() {
        if !seen[i] {
            is_root[i] = true;
            walk(i, &mut seen, &mut order);
        }
    }
    // Pre-order, roots in start order.
    let mut seen = vec![false; turns.len()];
    order.clear();
    for i in (0..turns.len()).filter(|&i| is_root[i]) {
        walk(i, &mut seen, &mut order);
    }
    // Subtree totals: each node's, added into its parent's, from the last node back.
    let mut position = vec![0; turns.len()];
    for (at, (i, _)) in order.iter().enumerate() {
        position[*i] = at;
    }
    let mut subtree: Vec<TraceTotals> = order.iter().map(|(i, _)| turns[*i].own).collect();
    for at in (0..order.len()).rev() {
        let (i, level) = order[at];
        if let Some(p) = parent[i].filter(|_| level > 0) {
            let own = subtree[at];
            subtree[position[p]].add(&own);
        }
    }
    let mut turns: Vec<Option<TraceTurn>> = turns.into_iter().map(Some).collect();
    order
        .iter()
        .zip(subtree)
        .filter_map(|((i, level), subtree)| {
            Some(TraceNode {
                turn: turns[*i].take()?,
                level: *level,
                subtree,
            })
        })
        .collect()
}

/// The parent of turn `i` that came without a parent request id (its caller's engine
/// passed on only `TRACEPARENT`, contract 8.4): of its caller's turns (`theirs`, in start
/// order), the latest-starting one that was running when it started, looked for among
/// the last [`MAX_CALLER_TURNS_LOOKED_AT`] that started no later, if any.
fn enclosing_turn_of_caller(turns: &[TraceTurn], theirs: &[usize], i: usize) -> Option<usize> {
    let started = turns[i].started_ms;
    let before = theirs.partition_point(|&j| turns[j].started_ms <= started);
    theirs[..before]
        .iter()
        .rev()
        .filter(|&&j| j != i)
        .take(MAX_CALLER_TURNS_LOOKED_AT)
        .find(|&&j| started <= turns[j].started_ms.saturating_add(turns[j].duration_ms))
        .copied()
}

/// How many of its caller's turns are looked at for the parent of a turn without a
/// parent request id: an instance runs at most 64 turns at once
/// (`bus.maxConcurrentTurns`), and the bound keeps a forged log of many such turns
/// from costing time quadratic in its size.
const MAX_CALLER_TURNS_LOOKED_AT: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(instance: &str, id: &str, parent: Option<&str>, started: u64, cost: f64) -> TraceTurn {
        TraceTurn {
            instance: instance.to_owned(),
            from_instance: "x".to_owned(),
            request_id: Some(id.to_owned()),
            parent_request_id: parent.map(str::to_owned),
            outcome: "success".to_owned(),
            started_ms: started,
            own: TraceTotals {
                turns: 1,
                cost_usd: Some(cost),
                input_tokens: 10,
                ..TraceTotals::default()
            },
            ..TraceTurn::default()
        }
    }

    /// (instance, level, subtree turns, subtree cost) of a node.
    type Shape = (String, usize, u64, Option<f64>);

    /// The shape of each node, in order.
    fn shape(nodes: &[TraceNode]) -> Vec<Shape> {
        nodes
            .iter()
            .map(|n| {
                (
                    n.turn.instance.clone(),
                    n.level,
                    n.subtree.turns,
                    n.subtree.cost_usd,
                )
            })
            .collect()
    }

    #[test]
    fn tree_table() {
        let s = |v: &[(&str, usize, u64, f64)]| {
            v.iter()
                .map(|(i, l, t, c)| ((*i).to_owned(), *l, *t, Some(*c)))
                .collect::<Vec<_>>()
        };
        let cases: Vec<(Vec<TraceTurn>, Vec<Shape>)> = vec![
            (vec![], vec![]),
            // a -> b -> c, and a -> d; given in any order, shown in start order.
            (
                vec![
                    turn("d", "rd", Some("ra"), 30, 0.5),
                    turn("c", "rc", Some("rb"), 20, 0.25),
                    turn("a", "ra", None, 0, 1.0),
                    turn("b", "rb", Some("ra"), 10, 0.125),
                ],
                s(&[
                    ("a", 0, 4, 1.875),
                    ("b", 1, 2, 0.375),
                    ("c", 2, 1, 0.25),
                    ("d", 1, 1, 0.5),
                ]),
            ),
            // Two roots (a fan from the operator), by start; an orphan is a root too.
            (
                vec![
                    turn("d", "rd", None, 5, 2.0),
                    turn("b", "rb", None, 1, 1.0),
                    turn("e", "re", Some("gone-elsewhere"), 3, 4.0),
                ],
                s(&[("b", 0, 1, 1.0), ("e", 0, 1, 4.0), ("d", 0, 1, 2.0)]),
            ),
            // A cycle of parents (a forged log) and a turn that is its own parent.
            (
                vec![
                    turn("p", "rp", Some("rq"), 1, 1.0),
                    turn("q", "rq", Some("rp"), 2, 2.0),
                    turn("s", "rs", Some("rs"), 3, 4.0),
                ],
                s(&[("p", 0, 2, 3.0), ("q", 1, 1, 2.0), ("s", 0, 1, 4.0)]),
            ),
            // One id run twice (a retry): the child hangs under the run before it.
            (
                vec![
                    turn("a", "ra", None, 0, 1.0),
                    turn("a", "ra", None, 10, 2.0),
                    turn("b", "rb", Some("ra"), 12, 4.0),
                ],
                s(&[("a", 0, 1, 1.0), ("a", 0, 2, 6.0), ("b", 1, 1, 4.0)]),
            ),
            // Joined by TRACEPARENT alone (no parent id): under its caller's turn that
            // was running when it started; after that turn ended, a root.
            (
                vec![
                    TraceTurn {
                        duration_ms: 100,
                        ..turn("p", "rp", None, 0, 1.0)
                    },
                    TraceTurn {
                        from_instance: "p".to_owned(),
                        ..turn("c", "rc", None, 50, 2.0)
                    },
                    TraceTurn {
                        from_instance: "p".to_owned(),
                        ..turn("c", "rl", None, 150, 4.0)
                    },
                ],
                s(&[("p", 0, 2, 3.0), ("c", 1, 1, 2.0), ("c", 0, 1, 4.0)]),
            ),
        ];
        for (turns, want) in cases {
            assert_eq!(shape(&build(turns.clone())), want, "{turns:?}");
        }
    }

    #[test]
    fn unknown_costs_stay_unknown_and_tokens_add_up() {
        let mut a = turn("a", "ra", None, 0, 0.0);
        a.own.cost_usd = None;
        let mut b = turn("b", "rb", Some("ra"), 1, 0.0);
        b.own.cost_usd = None;
        let nodes = build(vec![a, b]);
        assert_eq!(nodes[0].subtree.cost_usd, None);
        assert_eq!(nodes[0].subtree.input_tokens, 20);
        let mut total = TraceTotals::default();
        total.add(&nodes[0].subtree);
        total.add(&TraceTotals {
            cost_usd: Some(0.5),
            input_tokens: u64::MAX,
            ..TraceTotals::default()
        });
        assert_eq!(total.cost_usd, Some(0.5));
        assert_eq!(total.input_tokens, u64::MAX);
    }

    #[test]
    fn a_deep_chain_builds_without_recursion() {
        let depth = 20_000;
        let turns = (0..depth)
            .map(|i| {
                let parent = (i > 0).then(|| format!("r{:015}", i - 1));
                turn("n", &format!("r{i:015}"), parent.as_deref(), i, 1.0)
            })
            .collect();
        let nodes = build(turns);
        assert_eq!(nodes.len(), depth as usize);
        assert_eq!(nodes[0].subtree.turns, depth);
        assert_eq!(nodes[depth as usize - 1].level, depth as usize - 1);
    }

    /// Regression: each turn without a parent request id looked at every turn of its
    /// caller, so a forged log of many such turns took time quadratic in its size
    /// (minutes for 100,000); only the caller's last turns before it are looked at.
    #[test]
    fn bug_turns_without_a_parent_id_looked_at_every_turn_of_their_caller() {
        let level_of_late_turn = |short_turns: usize| {
            let long = TraceTurn {
                duration_ms: 10_000,
                ..turn("p", "rp", None, 0, 1.0)
            };
            let mut turns = vec![long];
            for k in 0..short_turns {
                turns.push(turn("p", &format!("r{k:015}"), None, 1 + k as u64, 1.0));
            }
            turns.push(TraceTurn {
                from_instance: "p".to_owned(),
                ..turn("c", "rc", None, 5_000, 1.0)
            });
            let nodes = build(turns);
            nodes.iter().find(|n| n.turn.instance == "c").unwrap().level
        };
        assert_eq!(level_of_late_turn(MAX_CALLER_TURNS_LOOKED_AT - 1), 1);
        assert_eq!(level_of_late_turn(MAX_CALLER_TURNS_LOOKED_AT), 0);
    }
}
