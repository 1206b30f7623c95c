//! [`TraceContext`]: the tree of delegations a delegation joins (contract 8.4), fresh or
//! read from the environment an instance gives its engine.

use crate::protocol::{
    parse_traceparent, RequestId, TraceId, REQUEST_ID_VAR, TRACEPARENT_VAR, TRACE_ID_VAR,
};
use crate::secret;
use std::fmt;

/// The trace a delegation belongs to: its trace id, and the request id of the turn that
/// makes it, if any (sent as `ext.traceId` and `ext.parentRequestId`, contract 8.4, to
/// a peer whose health lists `trace-context`). Every delegation of one workflow shares
/// one context, each with its own request id.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceContext {
    /// The tree of delegations.
    pub trace_id: TraceId,
    /// The request id of the turn making the delegation (`None` at a tree's root).
    pub parent_request_id: Option<RequestId>,
}

/// A variable of the environment that [`TraceContext::from_env`] ignored: set, but not
/// of its form. Its value is never shown (it may be anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEnvWarning {
    /// The variable's name.
    pub variable: &'static str,
}

impl fmt::Display for TraceEnvWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let form = match self.variable {
            TRACE_ID_VAR => "32 lowercase hex digits, not all zeros",
            REQUEST_ID_VAR => "16 to 64 characters of A-Z, a-z, 0-9, '_' and '-'",
            _ => "00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>",
        };
        write!(f, "ignoring {}: it is not {form}", self.variable)
    }
}

impl TraceContext {
    /// A new tree: a fresh trace id (128 random bits from the OS), no parent.
    ///
    /// # Errors
    /// The OS's randomness could not be read.
    pub fn new() -> std::io::Result<TraceContext> {
        // 32 hex digits of random bytes: all zeros has odds of 2^-128, and is refused.
        let trace_id =
            TraceId::new(secret::random_hex(TRACE_ID_BYTES)?).map_err(std::io::Error::other)?;
        Ok(TraceContext::joined(trace_id, None))
    }

    /// The context of a delegation made inside the turn `parent_request_id` of the tree
    /// `trace_id`.
    pub fn joined(trace_id: TraceId, parent_request_id: Option<RequestId>) -> TraceContext {
        TraceContext {
            trace_id,
            parent_request_id,
        }
    }

    /// The tree the environment names, as an instance gives it to its engine
    /// (contract 8.4): `LOOPBUS_TRACE_ID` with `LOOPBUS_REQUEST_ID` as the parent;
    /// else the trace id of `TRACEPARENT` (no parent); else a new tree
    /// ([`TraceContext::new`]). An empty variable counts as unset; a malformed one is
    /// ignored and named in the warnings, for the caller to print.
    ///
    /// # Errors
    /// A new tree was needed and the OS's randomness could not be read.
    pub fn from_env() -> std::io::Result<(TraceContext, Vec<TraceEnvWarning>)> {
        let (joined, warnings) =
            from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()));
        Ok((joined.map_or_else(TraceContext::new, Ok)?, warnings))
    }
}

/// Random bytes in a trace id made by [`TraceContext::new`]: 128 bits.
const TRACE_ID_BYTES: usize = 16;

/// The pure part of [`TraceContext::from_env`]: the context the three variables that
/// `var` reads name (`None`: start a new tree), and the ones ignored.
/// `LOOPBUS_REQUEST_ID` is read only with a valid `LOOPBUS_TRACE_ID`, `TRACEPARENT` only
/// without one.
fn from_vars(var: impl Fn(&str) -> Option<String>) -> (Option<TraceContext>, Vec<TraceEnvWarning>) {
    let set = |name| var(name).filter(|v: &String| !v.is_empty());
    let mut warnings = Vec::new();
    let mut warn = |variable| warnings.push(TraceEnvWarning { variable });
    let trace_id =
        set(TRACE_ID_VAR).and_then(|v| TraceId::new(v).map_err(|_| warn(TRACE_ID_VAR)).ok());
    let context = match trace_id {
        Some(trace_id) => {
            let parent = set(REQUEST_ID_VAR)
                .and_then(|v| RequestId::new(v).map_err(|_| warn(REQUEST_ID_VAR)).ok());
            Some(TraceContext::joined(trace_id, parent))
        }
        None => set(TRACEPARENT_VAR)
            .and_then(|v| {
                parse_traceparent(&v)
                    .ok_or_else(|| warn(TRACEPARENT_VAR))
                    .ok()
            })
            .map(|trace_id| TraceContext::joined(trace_id, None)),
    };
    (context, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_table() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let other = "0af7651916cd43dd8448eb211c80319c";
        let r = "r".repeat(16);
        let parent = format!("00-{other}-00f067aa0ba902b7-01");
        let zeros = "0".repeat(32);
        let ctx = |trace: &str, parent: Option<&str>| {
            Some(TraceContext::joined(
                TraceId::new(trace).unwrap(),
                parent.map(|p| RequestId::new(p).unwrap()),
            ))
        };
        let warn = |variable| TraceEnvWarning { variable };
        type Case<'a> = (
            (Option<&'a str>, Option<&'a str>, Option<&'a str>),
            Option<TraceContext>,
            Vec<TraceEnvWarning>,
        );
        let cases: Vec<Case<'_>> = vec![
            ((None, None, None), None, vec![]),
            ((Some(""), Some(""), Some("")), None, vec![]),
            ((Some(t), Some(&r), None), ctx(t, Some(&r)), vec![]),
            ((Some(t), None, None), ctx(t, None), vec![]),
            // LOOPBUS_TRACE_ID wins over TRACEPARENT, which is then not read.
            ((Some(t), Some(&r), Some("junk")), ctx(t, Some(&r)), vec![]),
            ((None, None, Some(&parent)), ctx(other, None), vec![]),
            // A request id alone names no tree.
            ((None, Some(&r), Some(&parent)), ctx(other, None), vec![]),
            (
                (Some(t), Some("short"), None),
                ctx(t, None),
                vec![warn(REQUEST_ID_VAR)],
            ),
            (
                (Some("XYZ"), Some(&r), Some(&parent)),
                ctx(other, None),
                vec![warn(TRACE_ID_VAR)],
            ),
            (
                (Some(&zeros), None, Some("00-bad")),
                None,
                vec![warn(TRACE_ID_VAR), warn(TRACEPARENT_VAR)],
            ),
        ];
        for ((trace_id, request_id, traceparent), want, warnings) in cases {
            let var = |name: &str| {
                let value = match name {
                    TRACE_ID_VAR => trace_id,
                    REQUEST_ID_VAR => request_id,
                    _ => traceparent,
                };
                value.map(str::to_owned)
            };
            assert_eq!(
                from_vars(var),
                (want, warnings),
                "{trace_id:?} {request_id:?} {traceparent:?}"
            );
        }
    }

    #[test]
    fn new_trees_differ_and_warnings_never_echo() {
        let a = TraceContext::new().unwrap();
        let b = TraceContext::new().unwrap();
        assert_ne!(a.trace_id, b.trace_id);
        assert_eq!(a.parent_request_id, None);
        for variable in [TRACE_ID_VAR, REQUEST_ID_VAR, TRACEPARENT_VAR] {
            let text = TraceEnvWarning { variable }.to_string();
            assert!(
                text.starts_with(&format!("ignoring {variable}: ")),
                "{text}"
            );
        }
    }
}
