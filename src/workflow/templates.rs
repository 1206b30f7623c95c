//! The prompts a workflow builds and the verdict it reads (contract 9), pure: the
//! chain stage's prompt, the verifier's prompt, and the verifier's first line parsed.

use crate::protocol::{ErrorCode, Failure};

/// What the verifier said of the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `VERDICT: PASS`.
    Pass,
    /// `VERDICT: FAIL`.
    Fail,
}

/// The prompt of the chain stage after stage `before` (from 1) of `stages`: the
/// original prompt, then that stage's reply under a line naming it (contract 9).
pub(super) fn chain_prompt(
    prompt: &str,
    previous: &str,
    before: usize,
    stages: usize,
    reply: &str,
) -> String {
    format!("{prompt}\n\n--- output of {previous} (stage {before} of {stages}) ---\n{reply}")
}

/// The verifier's prompt: the instruction, the question and `answerer`'s answer
/// (contract 9).
pub(super) fn verify_prompt(prompt: &str, answerer: &str, answer: &str) -> String {
    format!(
        "Check the answer below to the question below. Reply with a first line that is exactly\n\
         VERDICT: PASS or VERDICT: FAIL, then your reasons.\n\
         \n\
         --- question ---\n\
         {prompt}\n\
         \n\
         --- answer from {answerer} ---\n\
         {answer}"
    )
}

/// The verdict of a verifier's reply: its first non-empty line, trimmed, compared
/// case-insensitively with `VERDICT: PASS` and `VERDICT: FAIL`. Anything else is an
/// `invalid_handler_response` failure (retryable: asking again may get a verdict).
///
/// # Errors
/// The first non-empty line is neither, or there is none.
pub(super) fn parse_verdict(reply: &str) -> Result<Verdict, Failure> {
    let first = reply.lines().map(str::trim).find(|line| !line.is_empty());
    match first {
        Some(line) if line.eq_ignore_ascii_case("VERDICT: PASS") => Ok(Verdict::Pass),
        Some(line) if line.eq_ignore_ascii_case("VERDICT: FAIL") => Ok(Verdict::Fail),
        _ => {
            let mut failure = Failure::new(
                ErrorCode::InvalidHandlerResponse,
                "the verifier's first line is neither `VERDICT: PASS` nor `VERDICT: FAIL`",
            );
            failure.retryable = true;
            Err(failure)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_table() {
        let cases = [
            ("VERDICT: PASS", Some(Verdict::Pass)),
            ("VERDICT: FAIL\nwrong sum", Some(Verdict::Fail)),
            ("\n  \n  verdict: pass  \nfine", Some(Verdict::Pass)),
            ("\r\nVerdict: Fail\r\n", Some(Verdict::Fail)),
            ("VERDICT:PASS", None),
            ("VERDICT: PASSED", None),
            ("The answer is right.\nVERDICT: PASS", None),
            ("", None),
            ("\n \n", None),
        ];
        for (reply, want) in cases {
            let got = parse_verdict(reply);
            assert_eq!(got.as_ref().ok().copied(), want, "{reply:?}");
            if let Err(failure) = got {
                assert_eq!(failure.code, ErrorCode::InvalidHandlerResponse);
                assert!(failure.retryable);
            }
        }
    }

    #[test]
    fn chain_prompt_is_the_contract_template() {
        assert_eq!(
            chain_prompt("Sum it up", "a", 1, 3, "It is 4."),
            "Sum it up\n\n--- output of a (stage 1 of 3) ---\nIt is 4."
        );
        assert_eq!(
            chain_prompt("p", "b", 2, 3, ""),
            "p\n\n--- output of b (stage 2 of 3) ---\n"
        );
    }

    #[test]
    fn verify_prompt_is_the_contract_template() {
        assert_eq!(
            verify_prompt("What is 2+2?", "worker", "4"),
            "Check the answer below to the question below. Reply with a first line that is \
             exactly\nVERDICT: PASS or VERDICT: FAIL, then your reasons.\n\n--- question ---\n\
             What is 2+2?\n\n--- answer from worker ---\n4"
        );
    }
}
