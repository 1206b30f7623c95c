//! What a finished delegation or workflow answers: the text (the tool result's
//! content, paged by `maxChars`) and the `structuredContent` fields beside it. Pure.

use loopbus::{
    Conclusion, DelegateError, ErrorCode, Outcome, Reply, Stage, Verdict, WorkflowError,
};
use serde_json::{json, Map, Value};

/// A finished job's answer.
#[derive(Debug, Default)]
pub struct Answer {
    /// The text.
    pub text: String,
    /// Whether the work failed (`isError`).
    pub is_error: bool,
    /// `structuredContent` fields: `replies`, `errorCode` and `retryable` on failure,
    /// `usage` and `verdict` for workflows.
    pub fields: Map<String, Value>,
}

/// One delegation's outcome as a `replies` item: the target, the request id, and the
/// envelope without its text (the text is the content, paged), with the text's
/// length as `textChars`.
fn reply_item(
    target: &str,
    request_id: &str,
    outcome: &Result<Reply, DelegateError>,
    caller: &str,
    took_ms: u64,
) -> Value {
    let (envelope, chars) = match outcome {
        Ok(reply) => (reply.to_envelope(), reply.text.chars().count()),
        Err(error) => (error.to_envelope(caller, took_ms), 0),
    };
    let mut envelope: Value = serde_json::from_slice(&envelope.to_json()).unwrap_or_default();
    if let Some(fields) = envelope.as_object_mut() {
        fields.remove("text");
        fields.insert("textChars".to_owned(), json!(chars));
    }
    json!({"target": target, "requestId": request_id, "envelope": envelope})
}

/// The text shown for a failed delegation.
fn failure_text(target: &str, error: &DelegateError) -> String {
    let flag = if error.retryable() {
        "retryable"
    } else {
        "not retryable"
    };
    format!(
        "talk to {target} failed: {error} [{}, {flag}]",
        error.code()
    )
}

/// The answer of a list the library refused before sending anything: with a code, as
/// every failure, and not retryable (the same list is refused again).
pub fn refused(error: &WorkflowError) -> Answer {
    let code = match error {
        WorkflowError::PeerNotAllowed { .. } => ErrorCode::PeerNotAllowed,
        WorkflowError::NoRandomness { .. } => ErrorCode::InternalError,
        _ => ErrorCode::InvalidRequest,
    };
    let mut answer = Answer {
        text: format!(
            "{error}; nothing was sent [{}, not retryable]",
            code.as_str()
        ),
        is_error: true,
        ..Answer::default()
    };
    answer
        .fields
        .insert("errorCode".to_owned(), json!(code.as_str()));
    answer.fields.insert("retryable".to_owned(), json!(false));
    answer
}

/// The answer of `work`, or a failure when it panicked: a job always ends, so no
/// handle stays running for good.
pub fn caught(work: impl FnOnce() -> Answer) -> Answer {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| Answer {
        text: "the delegation failed: loopbus mcp hit a bug (its log has the details)".into(),
        is_error: true,
        ..Answer::default()
    })
}

fn millis(elapsed: std::time::Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// The answer of `talk`: the reply's text, or the failure with its code.
pub fn talk(stage: &Stage, caller: &str) -> Answer {
    let mut answer = Answer::default();
    let target = stage.target.as_str();
    match &stage.outcome {
        Ok(reply) => answer.text = reply.text.clone(),
        Err(error) => {
            answer.text = failure_text(target, error);
            answer.is_error = true;
            answer
                .fields
                .insert("errorCode".to_owned(), json!(error.code().as_str()));
            answer
                .fields
                .insert("retryable".to_owned(), json!(error.retryable()));
        }
    }
    let item = reply_item(
        target,
        stage.request_id.as_str(),
        &stage.outcome,
        caller,
        millis(stage.elapsed),
    );
    answer.fields.insert("replies".to_owned(), json!([item]));
    answer
}

/// Which tool delegates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `talk`: a fan to one target, answered by its reply alone.
    Talk,
    /// `fan`.
    Fan,
    /// `chain`.
    Chain,
    /// `verify`.
    Verify,
}

/// The answer of a workflow: one section per delegation, headed by its target and
/// place (verify: the verdict first); every envelope in `replies`, the summed usage,
/// the verdict. A failure of any delegation (or a verifier's reply without a verdict)
/// is an error, with the first failure's code; `retryable` when every failure is.
pub fn workflow(kind: Kind, outcome: &Outcome, caller: &str) -> Answer {
    let mut answer = Answer::default();
    let mut sections = Vec::new();
    if kind == Kind::Verify {
        sections.push(match &outcome.verdict {
            Some(Ok(Verdict::Pass)) => "VERDICT: PASS".to_owned(),
            Some(Ok(Verdict::Fail)) => "VERDICT: FAIL".to_owned(),
            Some(Err(failure)) => format!("no verdict: {} [{}]", failure.error, failure.code),
            None => "no verdict: the verifier was not asked or failed".to_owned(),
        });
    }
    let planned = outcome.planned;
    for (i, stage) in outcome.stages.iter().enumerate() {
        let target = stage.target.as_str();
        let head = match (kind, i) {
            (Kind::Talk | Kind::Fan, _) => format!("--- {target} ({} of {planned}) ---", i + 1),
            (Kind::Chain, _) => format!("--- {target} (stage {} of {planned}) ---", i + 1),
            (Kind::Verify, 0) => format!("--- answer from {target} ---"),
            (Kind::Verify, _) => format!("--- check by {target} ---"),
        };
        let body = match &stage.outcome {
            Ok(reply) => reply.text.clone(),
            Err(error) => failure_text(target, error),
        };
        sections.push(format!("{head}\n{body}"));
    }
    if kind == Kind::Chain && outcome.stages.len() < planned {
        sections.push(format!(
            "(the chain ended after stage {} of {planned}: its first failure ends it)",
            outcome.stages.len()
        ));
    }
    answer.text = sections.join("\n\n");
    let first_failure = outcome
        .stages
        .iter()
        .find_map(|s| s.outcome.as_ref().err().map(|e| e.code().to_string()))
        .or_else(|| match &outcome.verdict {
            Some(Err(failure)) => Some(failure.code.to_string()),
            _ => None,
        });
    if let Some(code) = first_failure {
        answer.is_error = true;
        answer.fields.insert("errorCode".to_owned(), json!(code));
        let retryable = outcome.conclusion() == Conclusion::Retryable;
        answer
            .fields
            .insert("retryable".to_owned(), json!(retryable));
    }
    let items: Vec<Value> = outcome
        .stages
        .iter()
        .map(|s| {
            reply_item(
                s.target.as_str(),
                s.request_id.as_str(),
                &s.outcome,
                caller,
                millis(s.elapsed),
            )
        })
        .collect();
    answer.fields.insert("replies".to_owned(), json!(items));
    if let Some(usage) = &outcome.usage {
        answer.fields.insert("usage".to_owned(), json!(usage));
    }
    if let Some(Ok(verdict)) = &outcome.verdict {
        let verdict = if *verdict == Verdict::Pass {
            "PASS"
        } else {
            "FAIL"
        };
        answer.fields.insert("verdict".to_owned(), json!(verdict));
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_list_has_a_code_and_is_not_retryable() {
        let name = |n: &str| loopbus::InstanceName::new(n).unwrap();
        let cases = [
            (
                WorkflowError::PeerNotAllowed {
                    caller: name("boss"),
                    target: name("w"),
                },
                "peer_not_allowed",
            ),
            (
                WorkflowError::CallerInList {
                    caller: name("boss"),
                },
                "invalid_request",
            ),
        ];
        for (error, code) in cases {
            let answer = refused(&error);
            assert!(answer.is_error);
            assert_eq!(answer.fields["errorCode"], code);
            assert_eq!(answer.fields["retryable"], false);
            assert!(answer.text.ends_with(&format!("[{code}, not retryable]")));
        }
    }

    #[test]
    fn work_that_panics_still_ends_its_job_with_a_failure() {
        let answer = caught(|| panic!("a bug"));
        assert!(
            answer.is_error && answer.text.contains("a bug"),
            "{answer:?}"
        );
        assert_eq!(caught(Answer::default).text, "");
    }
}
