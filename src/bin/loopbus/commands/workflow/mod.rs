//! `loopbus fan`, `loopbus chain` and `loopbus verify` (contract 9): the caller's
//! options as `talk` takes them, the library's workflow, and its results printed as
//! sections and a summary, or as JSON.

use super::talk::{self, Prompt, Settings, CALLER_OPTIONS};
use super::terminal::{self, escape_for_terminal, escape_line};
use crate::cli::{local, usage, Args, CommandError, EXIT_FAILURE, EXIT_OK, EXIT_RETRYABLE};
use loopbus::{
    Conclusion, InstanceName, Outcome, Stage, StopHandle, TraceContext, Verdict, WorkflowError,
    WorkflowOptions,
};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::sync::Arc;

mod live;

/// What all three help texts end with: the caller's options, as `talk` has them, the
/// cancel and the exit status.
macro_rules! common_help {
    () => {
        "
Caller options, as `loopbus talk --help` describes them:
  --state-dir DIR, --name NAME, --as NAME, --root ROOT, --depth N,
  --timeout SECS (per delegation), --retries N (per delegation, same request id:
  a turn never runs twice), --json
  -v, --verbose: print the trace id (contract 8.4) on stderr. Every delegation of
  the workflow joins that one tree, each with its own request id; a workflow run
  by an engine joins the engine's tree.

Each delegation is an ordinary talk: its own request id, retries, a cancel request
when it times out for good. SIGINT, SIGTERM or SIGHUP cancels every delegation in flight
(and so their subtrees) and sends no new one; the results so far are printed and
the exit status is 130, 143 or 129.

Exit status: 0 every delegation succeeded (verify: PASS); 1 a failure that is not
retryable (verify: FAIL); 75 failures, every one retryable; 2 usage or local
configuration error, including a list that is empty, names the caller itself or
names an instance the caller's peers do not allow (nothing is sent then).
"
    };
}

/// Help text of `fan`.
pub const FAN_HELP: &str = concat!(
    "\
loopbus fan [PROMPT] [--to A,B,C] [caller options]

Send PROMPT (read from stdin when absent or `-`) to every instance of the list at
once (at most 8 at a time), each at the same depth, and print one section per
instance in the list's order (its reply, or its error with code), then a summary:
successes, failures, total cost when reported, wall time. On a terminal, stderr
shows one live status line per instance while they run. The list is --to (names
separated by commas), else bus.parallel in the caller's config.json.

--json prints {\"results\": [ITEM...], \"summary\": SUMMARY, \"traceId\"}; each
ITEM is {\"target\", \"requestId\", \"elapsedMs\", \"envelope\"} (the peer's
envelope, or a failure envelope decided here), SUMMARY {\"succeeded\",
\"failed\", \"costUsd\" (null when none reported), \"inputTokens\", \"outputTokens\",
\"cachedTokens\", \"wallMs\", \"conclusion\" (\"success\", \"failure\" or
\"retryable\")}.

Example:
  loopbus fan 'Name one risk in this plan' --to reviewer,tester
",
    common_help!()
);

/// Help text of `chain`.
pub const CHAIN_HELP: &str = concat!(
    "\
loopbus chain [PROMPT] [--to A,B,C] [caller options]

Send PROMPT (read from stdin when absent or `-`) through the instances of the list
in order: stage 1 gets PROMPT, stage k gets PROMPT followed by

  --- output of PREVIOUS (stage k-1 of N) ---
  PREVIOUS'S REPLY

after a blank line. The first failure ends the chain. Prints one section per stage
run (its reply, or its error with code) and a summary. The list is --to, else
bus.chain in the caller's config.json.

--json prints {\"stages\": [ITEM...], \"planned\": N, \"summary\": SUMMARY,
\"traceId\"}, with ITEM
and SUMMARY as in `loopbus fan --help`.

Example:
  git diff | loopbus chain --to writer,editor --state-dir ~/.loopbus/lead
",
    common_help!()
);

/// Help text of `verify`.
pub const VERIFY_HELP: &str = concat!(
    "\
loopbus verify [PROMPT] --answerer NAME [--verifier NAME] [caller options]

Ask the answerer PROMPT (read from stdin when absent or `-`), then ask the
verifier to check the answer, with the prompt

  Check the answer below to the question below. Reply with a first line that is exactly
  VERDICT: PASS or VERDICT: FAIL, then your reasons.

  --- question ---
  PROMPT

  --- answer from ANSWERER ---
  ANSWER

Prints the answer, the verifier's reply and the verdict: the first non-empty line
of the reply, trimmed, compared without case with VERDICT: PASS / VERDICT: FAIL;
anything else is invalid_handler_response (retryable). If the verifier fails, the
answer is still printed, with the verifier's error. The verifier is --verifier,
else bus.verifier in the caller's config.json. --answerer has no default: no
config key names one, and the caller never asks itself.

--json prints {\"answer\": ITEM, \"verifier\": ITEM or null, \"verdict\": \"pass\",
\"fail\" or null, \"verdictError\": {\"error\", \"errorCode\", \"retryable\"} or null,
\"summary\": SUMMARY, \"traceId\"}, with ITEM and SUMMARY as in `loopbus fan --help`.

Example:
  loopbus verify 'What is 17 * 23?' --answerer worker --verifier checker
",
    common_help!()
);

/// Which workflow.
#[derive(Clone, Copy)]
enum Kind {
    Fan,
    Chain,
    Verify,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fan => "fan",
            Kind::Chain => "chain",
            Kind::Verify => "verify",
        }
    }
}

/// Runs `fan`.
///
/// # Errors
/// Bad arguments, a bad list, a missing or invalid config.json, a prompt on stdin
/// that is not UTF-8 or too large. Delegation failures are exit statuses 1 and 75.
pub fn run_fan(args: &[String]) -> Result<i32, CommandError> {
    run(Kind::Fan, args)
}

/// Runs `chain`. Errors as [`run_fan`]'s.
///
/// # Errors
/// As [`run_fan`].
pub fn run_chain(args: &[String]) -> Result<i32, CommandError> {
    run(Kind::Chain, args)
}

/// Runs `verify`.
///
/// # Errors
/// As [`run_fan`].
pub fn run_verify(args: &[String]) -> Result<i32, CommandError> {
    run(Kind::Verify, args)
}

fn run(kind: Kind, args: &[String]) -> Result<i32, CommandError> {
    let own: &[&'static str] = match kind {
        Kind::Fan | Kind::Chain => &["to"],
        Kind::Verify => &["answerer", "verifier"],
    };
    let valued: Vec<&'static str> = CALLER_OPTIONS.iter().chain(own).copied().collect();
    let args = Args::parse(args, &valued, &["json", "verbose"])?;
    if args.help {
        let help = match kind {
            Kind::Fan => FAN_HELP,
            Kind::Chain => CHAIN_HELP,
            Kind::Verify => VERIFY_HELP,
        };
        super::output::print(help)?;
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let settings = Settings::from_args(&args)?;
    let names = targets(kind, &args, &settings)?;
    let prompt = match talk::prompt(args.positionals.first(), kind.name())? {
        Prompt::Whole(prompt) => prompt,
        Prompt::Cut { .. } => {
            return Err(usage(format!(
                "the prompt on stdin is longer than {} bytes: no instance would take it",
                loopbus::MAX_BODY_BYTES
            ))
            .into())
        }
    };
    let (trace, warnings) =
        TraceContext::from_env().map_err(|e| local(format!("cannot make a trace id: {e}")))?;
    for warning in warnings {
        terminal::eprint_line(&format!("loopbus: {}: {warning}", kind.name()));
    }
    if args.switch("verbose") {
        terminal::eprint_line(&format!(
            "loopbus: {}: trace {}",
            kind.name(),
            trace.trace_id
        ));
    }
    let stop = StopHandle::new();
    let live = Arc::new(live::Live::new(&names));
    let caller = settings.caller.clone();
    let options = WorkflowOptions::new(settings.root, settings.caller, settings.bus)
        .with_depth(settings.depth)
        .with_timeout(settings.timeout)
        .with_retries(settings.retries)
        .with_trace(trace)
        .with_stop(stop.clone())
        .with_observer(live.clone());
    let watch = live::watch(stop, live.clone(), kind.name())?;
    let outcome = match kind {
        Kind::Fan => loopbus::fan(&options, &names, &prompt),
        Kind::Chain => loopbus::chain(&options, &names, &prompt),
        // `targets` gives verify its answerer and its verifier.
        Kind::Verify => loopbus::verify(&options, &names[0], &names[1], &prompt),
    };
    let signalled = watch.finish();
    live.clear();
    let outcome = outcome.map_err(|e| refused(kind, &e))?;
    let json = args.switch("json");
    let shown = if json {
        to_json(kind, &outcome, caller.as_str()).to_string()
    } else {
        to_text(kind, &outcome)
    };
    let terminal = std::io::stdout().is_terminal();
    super::output::println(&if terminal {
        escape_for_terminal(&shown).into_owned()
    } else {
        shown
    })?;
    Ok(signalled.unwrap_or(match outcome.conclusion() {
        Conclusion::Success => EXIT_OK,
        Conclusion::Failure => EXIT_FAILURE,
        Conclusion::Retryable => EXIT_RETRYABLE,
    }))
}

/// A list the library refused, as the command's error (exit 2).
fn refused(kind: Kind, error: &WorkflowError) -> CommandError {
    match error {
        WorkflowError::NoRandomness { .. } => local(format!("{}: {error}", kind.name())),
        _ => usage(format!("{}: {error}; nothing was sent", kind.name())).into(),
    }
}

/// The instances asked: fan's and chain's list (`--to`, else the config's), verify's
/// answerer and verifier.
fn targets(
    kind: Kind,
    args: &Args,
    settings: &Settings,
) -> Result<Vec<InstanceName>, CommandError> {
    let bus = &settings.bus;
    let (key, default) = match kind {
        Kind::Fan => ("bus.parallel", &bus.parallel),
        Kind::Chain => ("bus.chain", &bus.chain),
        Kind::Verify => {
            let answerer = args
                .value("answerer")
                .ok_or_else(|| usage("verify: missing --answerer NAME (it has no default)"))
                .and_then(super::parse_name)?;
            let verifier = match (args.value("verifier"), &bus.verifier) {
                (Some(name), _) => super::parse_name(name)?,
                (None, Some(name)) => name.clone(),
                (None, None) => {
                    return Err(usage(
                        "verify: missing --verifier NAME, and the caller's config.json sets no bus.verifier",
                    )
                    .into())
                }
            };
            return Ok(vec![answerer, verifier]);
        }
    };
    match args.value("to") {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| super::parse_name(name).map_err(CommandError::from))
            .collect(),
        None if default.is_empty() => Err(usage(format!(
            "{}: no instances: pass --to A,B or set {key} in the caller's config.json",
            kind.name()
        ))
        .into()),
        None => Ok(default.clone()),
    }
}

/// The text output: one section per delegation, then the summary.
fn to_text(kind: Kind, outcome: &Outcome) -> String {
    let mut out = String::new();
    let planned = outcome.planned;
    for (index, stage) in outcome.stages.iter().enumerate() {
        let place = match kind {
            Kind::Fan => format!("{} of {planned}", index + 1),
            Kind::Chain => format!("stage {} of {planned}", index + 1),
            Kind::Verify if index == 0 => "answerer".to_owned(),
            Kind::Verify => "verifier".to_owned(),
        };
        out.push_str(&section(stage, &place));
    }
    if let (Kind::Chain, Some(last)) = (kind, outcome.stages.last()) {
        if last.outcome.is_err() && outcome.stages.len() < planned {
            let stopped = outcome.stages.len();
            out.push_str(&format!(
                "chain stopped at stage {stopped} of {planned} ({}); later stages were not run\n\n",
                last.target
            ));
        }
    }
    if let Some(verdict) = &outcome.verdict {
        out.push_str(&match verdict {
            Ok(Verdict::Pass) => "verdict: PASS\n".to_owned(),
            Ok(Verdict::Fail) => "verdict: FAIL\n".to_owned(),
            Err(f) => format!("verdict: none: {} [{}, retryable]\n", f.error, f.code),
        });
    }
    out.push_str(&summary_line(kind, outcome));
    out
}

/// One delegation's section: a heading, then its reply or its error.
fn section(stage: &Stage, place: &str) -> String {
    let took = stage.elapsed.as_secs_f64();
    match &stage.outcome {
        Ok(reply) => {
            let cost = reply
                .usage
                .and_then(|u| u.cost_usd)
                .map_or_else(String::new, |c| format!(", ${c:.4}"));
            let text = reply.text.trim_end_matches('\n');
            format!(
                "--- {} ({place}): answered in {took:.1} s{cost} ---\n{text}\n\n",
                stage.target
            )
        }
        Err(e) => {
            let flag = if e.retryable() {
                "retryable"
            } else {
                "not retryable"
            };
            // A peer's error text and code: no line of theirs may read as a heading.
            format!(
                "--- {} ({place}): failed after {took:.1} s ---\nerror: {} [{}, {flag}]\n\n",
                stage.target,
                e.to_string().replace('\n', "\n    "),
                escape_line(e.code().as_str())
            )
        }
    }
}

/// The summary: `fan: 2 succeeded, 1 failed; cost $0.8000, 200 in / 40 out tokens; 1.3 s`.
fn summary_line(kind: Kind, outcome: &Outcome) -> String {
    let failed = outcome.stages.iter().filter(|s| s.outcome.is_err()).count();
    let succeeded = outcome.stages.len() - failed;
    let cost = match &outcome.usage {
        Some(usage) => format!(
            "; cost {}, {} in / {} out tokens",
            usage
                .cost_usd
                .map_or_else(|| "unknown".to_owned(), |c| format!("${c:.4}")),
            talk::thousands(usage.input_tokens),
            talk::thousands(usage.output_tokens)
        ),
        None => String::new(),
    };
    format!(
        "{}: {succeeded} succeeded, {failed} failed{cost}; {:.1} s",
        kind.name(),
        outcome.elapsed.as_secs_f64()
    )
}

/// One delegation as JSON: its target, request id, time and envelope.
fn item(stage: &Stage, caller: &str) -> Value {
    let elapsed_ms = u64::try_from(stage.elapsed.as_millis()).unwrap_or(u64::MAX);
    let envelope = match &stage.outcome {
        Ok(reply) => reply.to_envelope(),
        Err(e) => e.to_envelope(caller, elapsed_ms),
    };
    json!({
        "target": stage.target.as_str(),
        "requestId": stage.request_id.as_str(),
        "elapsedMs": elapsed_ms,
        "envelope": serde_json::from_slice::<Value>(&envelope.to_json()).unwrap_or(Value::Null),
    })
}

/// The `--json` output (the shapes the help texts give).
fn to_json(kind: Kind, outcome: &Outcome, caller: &str) -> Value {
    let failed = outcome.stages.iter().filter(|s| s.outcome.is_err()).count();
    let usage = outcome.usage.unwrap_or_default();
    let summary = json!({
        "succeeded": outcome.stages.len() - failed,
        "failed": failed,
        "costUsd": usage.cost_usd,
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cachedTokens": usage.cached_tokens,
        "wallMs": u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
        "conclusion": match outcome.conclusion() {
            Conclusion::Success => "success",
            Conclusion::Failure => "failure",
            Conclusion::Retryable => "retryable",
        },
    });
    let items: Vec<Value> = outcome.stages.iter().map(|s| item(s, caller)).collect();
    let trace_id = outcome.trace_id.as_str();
    match kind {
        Kind::Fan => json!({"results": items, "summary": summary, "traceId": trace_id}),
        Kind::Chain => json!({
            "stages": items,
            "planned": outcome.planned,
            "summary": summary,
            "traceId": trace_id,
        }),
        Kind::Verify => {
            let (verdict, error) = match &outcome.verdict {
                Some(Ok(Verdict::Pass)) => (json!("pass"), Value::Null),
                Some(Ok(Verdict::Fail)) => (json!("fail"), Value::Null),
                Some(Err(f)) => (
                    Value::Null,
                    json!({"error": f.error, "errorCode": f.code.as_str(), "retryable": f.retryable}),
                ),
                None => (Value::Null, Value::Null),
            };
            let mut items = items.into_iter();
            json!({
                "answer": items.next().unwrap_or(Value::Null),
                "verifier": items.next().unwrap_or(Value::Null),
                "verdict": verdict,
                "verdictError": error,
                "summary": summary,
                "traceId": trace_id,
            })
        }
    }
}
