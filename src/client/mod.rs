//! The client side of the bus: one delegation to another instance, exactly as contract
//! section 5 tables it, with its request id, its retries and its cancel (contract 8).
//!
//! [`delegate`] runs the caller's local checks first (own bus enabled, target among own
//! peers, depth below own `maxDepth`, body within
//! [`MAX_BODY_BYTES`](crate::protocol::MAX_BODY_BYTES)), then looks the
//! target up in the registry and probes its health, and only on the connection whose
//! probe matched sends `POST /api/talk` with the bearer secret and `depth + 1`. The
//! answer becomes a [`Reply`] or a [`DelegateError`]; [`DelegateError::code`] is the
//! one place where client failures get their wire code.
//!
//! Every delegation carries `ext.requestId` (128 random bits, contract 8.2), the same
//! across its retries ([`DelegateOptions::with_retries`]); [`cancel`] cancels it by
//! that id. It also belongs to a tree of delegations, a [`TraceContext`] (contract
//! 8.4), sent as `ext.traceId` and `ext.parentRequestId` to a peer whose health lists
//! `trace-context`. Each attempt reads the registry, probes and talks on a fresh
//! connection.
//!
//! ```no_run
//! use loopbus::{delegate, BusConfig, DelegateOptions, InstanceName};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), loopbus::InvalidInstanceName> {
//! let bus = BusConfig::open();
//! let options = DelegateOptions::new(
//!     "/home/me/.loopbus",
//!     InstanceName::new("reviewer")?,
//!     bus,
//!     InstanceName::new("worker")?,
//!     "Please verify this answer",
//! )
//! .with_timeout(Duration::from_secs(60))
//! .with_retries(2);
//! match delegate(&options) {
//!     Ok(reply) => println!("{}", reply.text),
//!     Err(e) => eprintln!("{} (retryable: {}): {e}", e.code(), e.retryable()),
//! }
//! # Ok(())
//! # }
//! ```

use crate::config::BusConfig;
use crate::protocol::{
    encode_talk_request, Envelope, InstanceName, RequestExt, RequestId, TraceId, UsageReport,
    IDEMPOTENT_REQUESTS,
};
use crate::secret;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

mod attempt;
mod cancel;
mod error;
mod retry;
mod trace;

pub use cancel::{cancel, CancelOutcome, CANCEL_TIMEOUT};
pub use error::DelegateError;
pub use retry::{DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP};
pub use trace::{TraceContext, TraceEnvWarning};

/// How long `loopbus talk` waits for an answer unless told otherwise (contract
/// section 5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// One delegation, built with [`DelegateOptions::new`] and the `with_` setters.
/// `Debug` shows the prompt's length, never its text.
#[derive(Clone)]
#[non_exhaustive]
pub struct DelegateOptions {
    /// The channel root whose registry names the target.
    pub root: PathBuf,
    /// The calling instance's name, sent as `fromInstance`.
    pub caller: InstanceName,
    /// The caller's own `bus` config: `enabled`, `peers`, `maxDepth`, `acceptKinds`.
    pub bus: BusConfig,
    /// The instance to ask.
    pub target: InstanceName,
    /// The prompt.
    pub prompt: String,
    /// The caller's current depth; the request carries `depth + 1`.
    pub depth: u64,
    /// How long each attempt waits for the answer once its request is sent.
    pub timeout: Duration,
    /// The delegation's `ext.requestId`; `None`: [`delegate`] makes a fresh one per
    /// call (and [`cancel`] cannot name it).
    pub request_id: Option<RequestId>,
    /// The tree of delegations this one belongs to (contract 8.4); `None`: [`delegate`]
    /// starts a new tree per call ([`TraceContext::new`]).
    pub trace: Option<TraceContext>,
    /// How many times a retryable failure is tried again (0: never).
    pub retries: u32,
    /// The first retry's backoff ceiling ([`DEFAULT_BACKOFF_BASE`]).
    pub backoff_base: Duration,
    /// The largest backoff ceiling ([`DEFAULT_BACKOFF_CAP`]).
    pub backoff_cap: Duration,
    /// Set by a workflow's [`crate::StopHandle`]: no retry is sent once it is, and the
    /// backoff before one ends there.
    pub(crate) stop: Option<Arc<AtomicBool>>,
}

impl DelegateOptions {
    /// A delegation of `prompt` from `caller` to `target`, found in the registry of
    /// the channel root `root`, checked against the caller's own `bus` config; at
    /// depth 0, with [`DEFAULT_TIMEOUT`], no retries and a fresh request id per call
    /// until set otherwise.
    pub fn new(
        root: impl Into<PathBuf>,
        caller: InstanceName,
        bus: BusConfig,
        target: InstanceName,
        prompt: impl Into<String>,
    ) -> DelegateOptions {
        DelegateOptions {
            root: root.into(),
            caller,
            bus,
            target,
            prompt: prompt.into(),
            depth: 0,
            timeout: DEFAULT_TIMEOUT,
            request_id: None,
            trace: None,
            retries: 0,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_cap: DEFAULT_BACKOFF_CAP,
            stop: None,
        }
    }

    /// The caller's current delegation depth (the request carries `depth + 1`).
    pub fn with_depth(self, depth: u64) -> DelegateOptions {
        DelegateOptions { depth, ..self }
    }

    /// How long each attempt waits for the answer once its request is sent.
    pub fn with_timeout(self, timeout: Duration) -> DelegateOptions {
        DelegateOptions { timeout, ..self }
    }

    /// The delegation's request id (contract 8.2), sent with every attempt: the same
    /// id names the same turn, to a retry, to another `delegate` call that attaches to
    /// it, and to [`cancel`]. Make one with [`new_request_id`].
    pub fn with_request_id(mut self, request_id: RequestId) -> DelegateOptions {
        self.request_id = Some(request_id);
        self
    }

    /// The tree of delegations this one joins (contract 8.4): its trace id, and the
    /// request id of the turn making it as `parentRequestId`. Give every delegation of
    /// one workflow the same context (each keeps its own request id); take it from
    /// [`TraceContext::from_env`] inside an engine, so that the delegation hangs under
    /// the turn that runs it. To know the ids of a delegation that fails, set both this
    /// and [`DelegateOptions::with_request_id`] before [`delegate`]; a [`Reply`] names
    /// them too.
    pub fn with_trace(mut self, trace: TraceContext) -> DelegateOptions {
        self.trace = Some(trace);
        self
    }

    /// Retries a failure whose `retryable` is true up to `retries` times, with the
    /// same request id, after an exponential backoff with full jitter (retry `n`, from
    /// 0, waits a uniform random time in `[0, min(backoff_cap, backoff_base * 2^n)]`).
    /// A failure that may have run the turn (a
    /// timeout, a connection broken after the request was sent, an answer that is no
    /// envelope, an `unknown` failure) is retried only when the target's health listed
    /// `idempotent-requests`; otherwise the error is a
    /// [`DelegateError::NotRetried`] that says why.
    pub fn with_retries(self, retries: u32) -> DelegateOptions {
        DelegateOptions { retries, ..self }
    }
}

impl fmt::Debug for DelegateOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelegateOptions")
            .field("root", &self.root)
            .field("caller", &self.caller)
            .field("bus", &self.bus)
            .field("target", &self.target)
            .field("prompt_chars", &self.prompt.chars().count())
            .field("depth", &self.depth)
            .field("timeout", &self.timeout)
            .field("request_id", &self.request_id)
            .field("trace", &self.trace)
            .field("retries", &self.retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_cap", &self.backoff_cap)
            .finish()
    }
}

/// A successful delegation.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Reply {
    /// The reply text.
    pub text: String,
    /// The answering instance (the target's name when a legacy peer left it out).
    pub from_instance: String,
    /// How long the peer says the answer took.
    pub duration_ms: u64,
    /// What the peer's envelope said of its protocol.
    pub peer: PeerProtocol,
    /// What the turn cost, when the peer reported it (`usage-report`, contract 8.3).
    pub usage: Option<UsageReport>,
    /// The delegation's request id (contract 8.2).
    pub request_id: RequestId,
    /// The tree the delegation belongs to (contract 8.4): `loopbus trace` shows it. The
    /// peer got it only if its health listed `trace-context`.
    pub trace_id: TraceId,
}

/// What a peer's envelope said of its protocol, kept so that `loopbus talk --json`
/// prints the peer's own answer, not ours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerProtocol {
    /// The peer's `protocolVersion` (`None`: a legacy peer left it out).
    pub protocol_version: Option<u64>,
    /// The peer's `capabilities` (`None`: a legacy peer left them out).
    pub capabilities: Option<Vec<String>>,
}

impl Reply {
    /// The reply as the peer's success envelope, as `loopbus talk --json` prints it:
    /// with the peer's own `protocolVersion`, `capabilities` and `usage`, absent ones
    /// absent.
    pub fn to_envelope(&self) -> Envelope {
        Envelope {
            protocol_version: self.peer.protocol_version,
            capabilities: self.peer.capabilities.clone(),
            ..Envelope::success(&self.from_instance, self.text.clone(), self.duration_ms)
        }
        .with_usage(self.usage)
    }
}

/// A fresh request id: 128 random bits from the OS as 32 lowercase hex digits
/// (contract 8.2).
///
/// # Errors
///
/// The OS's randomness could not be read.
pub fn new_request_id() -> std::io::Result<RequestId> {
    // 32 hex digits are always a request id.
    RequestId::new(secret::random_hex(REQUEST_ID_BYTES)?).map_err(std::io::Error::other)
}

/// Random bytes in a request id made by [`new_request_id`]: 128 bits (contract 8.2).
const REQUEST_ID_BYTES: usize = 16;

/// Delegates `options.prompt` to `options.target` and waits for the answer, retrying
/// as [`DelegateOptions::with_retries`] says, with one request id for every attempt
/// (`options.request_id`, else a fresh one).
///
/// # Errors
///
/// A [`DelegateError`] for every row of contract section 5's table, decided in this
/// order: own bus disabled, target not among own peers, depth at own `maxDepth`, body
/// too large, registry unreadable, target not registered, health probe not matching
/// (the secret is then never sent), the target's port held by another user's process
/// (nor then), connection refused or broken, no answer within
/// `options.timeout`, an answer that is not an envelope, a failure envelope. After
/// retries, the last attempt's; [`DelegateError::NotRetried`] when a retry could have
/// run the turn twice.
pub fn delegate(options: &DelegateOptions) -> Result<Reply, DelegateError> {
    attempt::local_checks(options)?;
    let no_randomness = |error| DelegateError::NoRandomness { error };
    let request_id = options.request_id.clone().map_or_else(new_request_id, Ok);
    let request_id = request_id.map_err(no_randomness)?;
    let trace = options.trace.clone().map_or_else(TraceContext::new, Ok);
    let trace = trace.map_err(no_randomness)?;
    let ext = RequestExt {
        request_id: Some(request_id.clone()),
        trace_id: Some(trace.trace_id.clone()),
        parent_request_id: trace.parent_request_id,
        cancel: false,
    };
    let request = attempt::request(options, &options.prompt, ext);
    // Before the registry is read (the table's order), with the base capabilities;
    // each attempt checks again what it sends to the peer it found.
    attempt::check_size(&encode_talk_request(&request))?;
    let mut retries_done = 0;
    let mut dedupes = false;
    loop {
        let outcome = attempt::prove(options).and_then(|peer| {
            dedupes = peer.capabilities.iter().any(|c| c == IDEMPOTENT_REQUESTS);
            let response = attempt::send(options, peer, request.clone(), options.timeout)?;
            attempt::interpret(&options.target, response, &request_id, &trace.trace_id)
        });
        let Err(error) = outcome else {
            return outcome;
        };
        match retry::decide(&error, options.retries - retries_done, dedupes) {
            retry::Decision::GiveUp => return Err(error),
            retry::Decision::WouldRunTwice => {
                return Err(DelegateError::NotRetried {
                    target: options.target.to_string(),
                    error: Box::new(error),
                })
            }
            retry::Decision::Retry => {
                let after = options.backoff_delay(retries_done, jitter_random());
                retries_done += 1;
                log::info!(
                    "retry {retries_done} of {} to {} in {} ms, after: {error} [{}]",
                    options.retries,
                    options.target,
                    after.as_millis(),
                    error.code()
                );
                if stopped_during(options, after) {
                    return Err(error);
                }
            }
        }
    }
}

/// How often a backoff looks whether its delegation was stopped.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Waits `after` before a retry: `true`, and sooner, when the delegation's stop flag
/// is set meanwhile (or already was).
fn stopped_during(options: &DelegateOptions, after: Duration) -> bool {
    let stop = options.stop.as_deref();
    let until = Instant::now() + after;
    while !stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(STOP_POLL));
    }
    true
}

/// A random number for the retry jitter, from the OS (from the clock if that fails:
/// jitter only spreads retries apart).
fn jitter_random() -> u64 {
    let clock = |_| UNIX_EPOCH.elapsed().map_or(0, |d| d.subsec_nanos().into());
    secret::random_bytes::<8>().map_or_else(clock, u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::attempt::{interpret, transport_error};
    use super::*;
    use crate::http::client::{ClientError, ReceivedResponse};
    use crate::protocol::{ErrorCode, Failure, MAX_BODY_BYTES};
    use crate::registry::owner::OwnerRefusal;
    use crate::registry::ProbeError;

    fn io(kind: std::io::ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, "x")
    }

    fn health(instance: &str) -> crate::protocol::Health {
        crate::protocol::Health::new("loopbus", instance, "ok", 1)
    }

    #[test]
    fn error_mapping_table() {
        let t = || "worker".to_owned();
        let remote = |code: &str, retryable| DelegateError::Remote {
            from_instance: "worker".into(),
            failure: Failure {
                error: "e".into(),
                code: ErrorCode::from_wire(code),
                retryable,
            },
            duration_ms: 1,
            peer: Box::new(PeerProtocol {
                protocol_version: Some(1),
                capabilities: None,
            }),
            usage: None,
        };
        let cases: Vec<(DelegateError, &str, bool)> = vec![
            (
                DelegateError::BusDisabled { caller: t() },
                "bus_disabled",
                false,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::NoProof,
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::WrongProof,
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::PeerNotAllowed {
                    caller: t(),
                    target: t(),
                },
                "peer_not_allowed",
                false,
            ),
            (
                DelegateError::MaxDepth {
                    caller: t(),
                    depth: 3,
                    max: 3,
                },
                "max_depth_exceeded",
                false,
            ),
            (
                DelegateError::TooLarge { bytes: 300_000 },
                "request_too_large",
                false,
            ),
            (
                DelegateError::Registry {
                    path: "/r/.bus-registry.json".into(),
                    error: io(std::io::ErrorKind::PermissionDenied),
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::Registry {
                    path: "/r/.bus-registry.json".into(),
                    error: io(std::io::ErrorKind::Interrupted),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::NotRegistered { target: t() },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::Http(ClientError::Timeout),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::OtherInstance(Box::new(health("impostor"))),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::Connection {
                    target: t(),
                    reason: ClientError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::NotSameUser(OwnerRefusal::Foreign {
                        port: 7701,
                        uid: 65534,
                    }),
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::NotSameUser(OwnerRefusal::TablesUnreadable { port: 7701 }),
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::Connection {
                    target: t(),
                    reason: ClientError::Closed,
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::Timeout {
                    target: t(),
                    after: Duration::from_secs(1),
                },
                "timeout",
                true,
            ),
            (
                DelegateError::InvalidResponse {
                    target: t(),
                    reason: "x".into(),
                },
                "invalid_response",
                true,
            ),
            (remote("budget_exhausted", false), "budget_exhausted", false),
            (remote("timeout", false), "timeout", false),
            (remote("rate_limited", true), "rate_limited", true),
            (remote("server_busy", true), "server_busy", true),
        ];
        for (error, code, retryable) in cases {
            assert_eq!(error.code().as_str(), code, "{error:?}");
            assert_eq!(error.retryable(), retryable, "{error:?}");
            let envelope = error.to_envelope("caller", 7);
            let failure = envelope.failure.as_ref().unwrap();
            assert_eq!(
                (failure.code.as_str(), failure.retryable),
                (code, retryable)
            );
            let from = if matches!(error, DelegateError::Remote { .. }) {
                "worker"
            } else {
                "caller"
            };
            assert_eq!(envelope.from_instance, from);
            assert_eq!(envelope.protocol_version, Some(1));
            assert!(!failure.error.is_empty());
        }
    }

    #[test]
    fn failures_that_may_have_run_the_turn_table() {
        let t = || "worker".to_owned();
        let remote = |code: &str| DelegateError::Remote {
            from_instance: t(),
            failure: Failure::new(ErrorCode::from_wire(code), "e"),
            duration_ms: 1,
            peer: Box::default(),
            usage: None,
        };
        let broken = || DelegateError::Broken {
            target: t(),
            reason: ClientError::Closed,
        };
        let timeout = || DelegateError::Timeout {
            target: t(),
            after: Duration::from_secs(1),
        };
        // (failure, code, retryable, may have run the turn)
        let cases: Vec<(DelegateError, &str, bool, bool)> = vec![
            (timeout(), "timeout", true, true),
            (broken(), "instance_unavailable", true, true),
            (
                DelegateError::InvalidResponse {
                    target: t(),
                    reason: "x".into(),
                },
                "invalid_response",
                true,
                true,
            ),
            (remote("unknown"), "unknown", true, true),
            // Regression: the peer's own timeout was retried against a peer without
            // idempotent-requests, running its engine a second time.
            (remote("timeout"), "timeout", true, true),
            (remote("server_busy"), "server_busy", true, false),
            (remote("engine_cli"), "engine_cli", true, false),
            (
                DelegateError::Connection {
                    target: t(),
                    reason: ClientError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
                },
                "instance_unavailable",
                true,
                false,
            ),
            (
                DelegateError::NotRegistered { target: t() },
                "instance_unavailable",
                true,
                false,
            ),
            (
                DelegateError::NoRandomness {
                    error: io(std::io::ErrorKind::NotFound),
                },
                "internal_error",
                true,
                false,
            ),
            (
                DelegateError::NotRetried {
                    target: t(),
                    error: Box::new(timeout()),
                },
                "timeout",
                true,
                true,
            ),
        ];
        for (error, code, retryable, may_have_run) in cases {
            assert_eq!(error.code().as_str(), code, "{error:?}");
            assert_eq!(error.retryable(), retryable, "{error:?}");
            assert_eq!(error.may_have_run(), may_have_run, "{error:?}");
        }
        let not_retried = DelegateError::NotRetried {
            target: t(),
            error: Box::new(broken()),
        };
        assert!(matches!(not_retried.cause(), DelegateError::Broken { .. }));
        assert_eq!(
            not_retried.to_string(),
            "instance worker is not available: connection closed before a complete answer \
             after the request was sent; not retried: the turn may have run, and worker does \
             not advertise idempotent-requests, so a retry could run it twice"
        );
        // The peer's own failure keeps its envelope when it was not retried.
        let kept = DelegateError::NotRetried {
            target: t(),
            error: Box::new(remote("unknown")),
        };
        assert_eq!(kept.to_envelope("me", 9).from_instance, "worker");
    }

    #[test]
    fn transport_errors_map_to_table_rows() {
        let cases: Vec<(ClientError, &str)> = vec![
            (ClientError::Timeout, "timeout"),
            (ClientError::Malformed("x"), "invalid_response"),
            (ClientError::Closed, "instance_unavailable"),
            (
                ClientError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
                "instance_unavailable",
            ),
            (
                ClientError::Io(io(std::io::ErrorKind::ConnectionReset)),
                "instance_unavailable",
            ),
        ];
        for (error, code) in cases {
            let shown = format!("{error:?}");
            assert_eq!(
                transport_error("w", Duration::from_secs(1), error, false)
                    .code()
                    .as_str(),
                code,
                "{shown}"
            );
        }
        // After the whole request went out, a broken connection may have run the turn.
        let after = |error| transport_error("w", Duration::from_secs(1), error, true);
        assert!(matches!(
            after(ClientError::Closed),
            DelegateError::Broken { .. }
        ));
        let reset = after(ClientError::Io(io(std::io::ErrorKind::ConnectionReset)));
        assert!(reset.may_have_run());
        assert!(matches!(
            after(ClientError::Timeout),
            DelegateError::Timeout { .. }
        ));
    }

    #[test]
    fn answers_are_interpreted_table() {
        // (status, body, Ok(text) or Err((code, retryable)))
        type Row = (
            u16,
            &'static str,
            Result<&'static str, (&'static str, bool)>,
        );
        let cases: &[Row] = &[
            (
                200,
                r#"{"success":true,"text":"hi","fromInstance":"worker","durationMs":3,"protocolVersion":1,"capabilities":[]}"#,
                Ok("hi"),
            ),
            (200, r#"{"success":true,"text":"legacy"}"#, Ok("legacy")),
            (
                200,
                r#"{"success":false,"error":"boom"}"#,
                Err(("unknown", true)),
            ),
            (
                200,
                r#"{"success":false,"text":"","error":"Budget exhausted","errorCode":"budget_exhausted","retryable":false,"protocolVersion":1}"#,
                Err(("budget_exhausted", false)),
            ),
            (
                200,
                r#"{"success":false,"error":"x","errorCode":"rate_limited"}"#,
                Err(("rate_limited", true)),
            ),
            (
                401,
                r#"{"success":false,"text":"","error":"no","errorCode":"auth_failed","retryable":false}"#,
                Err(("auth_failed", false)),
            ),
            (
                429,
                r#"{"success":false,"error":"deep","errorCode":"max_depth_exceeded","retryable":false}"#,
                Err(("max_depth_exceeded", false)),
            ),
            (
                503,
                r#"{"success":false,"error":"busy","errorCode":"server_busy","retryable":true}"#,
                Err(("server_busy", true)),
            ),
            (200, "<html>hello</html>", Err(("invalid_response", true))),
            (200, "", Err(("invalid_response", true))),
            (
                200,
                r#"{"text":"no success field"}"#,
                Err(("invalid_response", true)),
            ),
            (502, "Bad Gateway", Err(("invalid_response", true))),
            (
                500,
                r#"{"success":true,"text":"odd"}"#,
                Err(("invalid_response", true)),
            ),
        ];
        for (status, body, want) in cases {
            let got = interpret(
                "worker",
                ReceivedResponse {
                    status: *status,
                    body: body.as_bytes().to_vec(),
                },
                &RequestId::new("r".repeat(16)).unwrap(),
                &TraceId::new("7".repeat(32)).unwrap(),
            );
            match (got, want) {
                (Ok(reply), Ok(text)) => {
                    assert_eq!(reply.text, *text);
                    assert_eq!(reply.from_instance, "worker");
                }
                (Err(e), Err((code, retryable))) => {
                    assert_eq!(
                        (e.code().as_str(), e.retryable()),
                        (*code, *retryable),
                        "{body}"
                    );
                }
                (got, want) => panic!("{status} {body}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn local_checks_come_first_in_table_order() {
        use crate::config::Peers;
        let name = |s: &str| InstanceName::new(s).unwrap();
        let bus = BusConfig {
            enabled: true,
            ..BusConfig::default()
        };
        // Nothing is registered here; no check below gets as far as the registry.
        let root = std::env::temp_dir().join("loopbus-no-such-root");
        let base = DelegateOptions::new(root, name("me"), bus, name("worker"), "p")
            .with_timeout(Duration::from_secs(1));
        assert_eq!((base.depth, base.prompt.as_str()), (0, "p"));
        let disabled = DelegateOptions {
            bus: BusConfig {
                enabled: false,
                peers: Peers::Only(vec![]),
                max_depth: 1,
                ..base.bus.clone()
            },
            depth: 5,
            ..base.clone()
        };
        let not_peer = DelegateOptions {
            bus: BusConfig {
                peers: Peers::Only(vec!["other".into()]),
                max_depth: 1,
                ..base.bus.clone()
            },
            depth: 5,
            ..base.clone()
        };
        let deep = DelegateOptions {
            depth: 3,
            prompt: "x".repeat(300_000),
            ..base.clone()
        };
        let big = DelegateOptions {
            prompt: "x".repeat(MAX_BODY_BYTES as usize),
            ..base.clone()
        };
        let quote_heavy = DelegateOptions {
            // Escaping doubles every quote: the serialized body is what counts.
            prompt: "\"".repeat(MAX_BODY_BYTES as usize / 2),
            ..base.clone()
        };
        let cases = [
            (disabled, "bus_disabled"),
            (not_peer, "peer_not_allowed"),
            (deep, "max_depth_exceeded"),
            (big, "request_too_large"),
            (quote_heavy, "request_too_large"),
            (base, "instance_unavailable"),
        ];
        for (options, code) in cases {
            let error = delegate(&options).unwrap_err();
            assert_eq!(error.code().as_str(), code, "{error}");
        }
    }

    #[test]
    fn debug_and_errors_never_show_the_prompt() {
        let name = |s: &str| InstanceName::new(s).unwrap();
        let options = DelegateOptions::new(
            "/r",
            name("me"),
            BusConfig::default(),
            name("w"),
            "TOP-SECRET-PROMPT",
        );
        assert_eq!(options.timeout, DEFAULT_TIMEOUT);
        let shown = format!("{options:?}");
        assert!(!shown.contains("TOP-SECRET-PROMPT"), "{shown}");
        assert!(shown.contains("prompt_chars: 17"), "{shown}");
    }

    #[test]
    fn owner_unknown_says_who_holds_the_port_cannot_be_told() {
        let e = DelegateError::ProbeFailed {
            target: "b".into(),
            port: 7701,
            reason: ProbeError::NotSameUser(OwnerRefusal::Unknown { port: 7701 }),
        };
        assert_eq!(
            e.to_string(),
            "instance b is not available: cannot tell who holds port 7701; not sending the secret"
        );
    }
}
