//! [`DelegateError`]: every way one delegation can fail, each with its wire code and
//! `retryable` flag (the one place where client failures get them) and a message that
//! never carries the secret or the prompt.

use super::PeerProtocol;
use crate::http::client::ClientError;
use crate::protocol::{Envelope, ErrorCode, Failure, UsageReport, MAX_BODY_BYTES};
use crate::registry::ProbeError;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Why a delegation failed. Every variant has a wire code ([`DelegateError::code`]) and
/// a `retryable` flag; messages never contain the secret or the prompt.
#[derive(Debug)]
#[non_exhaustive]
pub enum DelegateError {
    /// The caller's own bus is disabled.
    BusDisabled {
        /// The calling instance.
        caller: String,
    },
    /// The target is not among the caller's `peers`.
    PeerNotAllowed {
        /// The calling instance.
        caller: String,
        /// The target asked for.
        target: String,
    },
    /// The caller's depth already reached its own `maxDepth`.
    MaxDepth {
        /// The calling instance.
        caller: String,
        /// The caller's depth.
        depth: u64,
        /// The caller's `maxDepth`.
        max: u64,
    },
    /// The serialized request is larger than [`MAX_BODY_BYTES`].
    TooLarge {
        /// Its size in bytes.
        bytes: usize,
    },
    /// The registry could not be read.
    Registry {
        /// The registry file.
        path: PathBuf,
        /// Why not.
        error: std::io::Error,
    },
    /// The target has no valid registry entry.
    NotRegistered {
        /// The target asked for.
        target: String,
    },
    /// The target's health probe did not match, or whatever holds its registered
    /// address did not prove it holds the target's secret (contract 6.1), or failed the
    /// same-user check (its port is held by another user's process, or who holds it
    /// cannot be told). The secret was not sent. A failed proof or same-user check is
    /// not retryable: trying again reaches the same squatter, so someone must look.
    ProbeFailed {
        /// The target asked for.
        target: String,
        /// The port it is registered on.
        port: u16,
        /// What the probe found (a same-user refusal names the port, and the uid
        /// holding it when known).
        reason: ProbeError,
    },
    /// The connection for the request could not be made, or broke.
    Connection {
        /// The target asked for.
        target: String,
        /// What happened.
        reason: ClientError,
    },
    /// The connection broke after the whole request was sent: the peer may have run
    /// the turn.
    Broken {
        /// The target asked for.
        target: String,
        /// What happened.
        reason: ClientError,
    },
    /// No complete answer within the timeout.
    Timeout {
        /// The target asked for.
        target: String,
        /// The timeout that passed.
        after: Duration,
    },
    /// The answer is not an envelope (not HTTP, not JSON, or not the right shape).
    InvalidResponse {
        /// The target asked for.
        target: String,
        /// What was wrong with it (never the answer itself).
        reason: String,
    },
    /// The OS's randomness could not be read, so no request id could be made; nothing
    /// was sent.
    NoRandomness {
        /// Why not.
        error: std::io::Error,
    },
    /// A retryable failure that was not retried although retries were left: it may
    /// have run the turn, and the target's health did not list `idempotent-requests`,
    /// so a retry could run it a second time (contract 8.2). Code and flag are the
    /// failure's own.
    NotRetried {
        /// The target asked for.
        target: String,
        /// The failure.
        error: Box<DelegateError>,
    },
    /// The delegation was stopped (a workflow's stop handle) before it was sent:
    /// nothing reached the target. Code `cancelled`.
    Stopped {
        /// The target it was meant for.
        target: String,
    },
    /// The peer answered with a failure envelope; its code is kept as it is.
    Remote {
        /// The answering instance (the target's name when a legacy peer left it out).
        from_instance: String,
        /// The peer's failure.
        failure: Failure,
        /// How long the peer says it took.
        duration_ms: u64,
        /// What the peer's envelope said of its protocol.
        peer: Box<PeerProtocol>,
        /// What the failed turn cost, when the peer reported it (`usage-report`,
        /// contract 8.3): an engine may spend before it fails.
        usage: Option<Box<UsageReport>>,
    },
}

impl DelegateError {
    /// The wire code of this failure: the one table of client failures (contract
    /// section 5).
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BusDisabled { .. } => ErrorCode::BusDisabled,
            Self::PeerNotAllowed { .. } => ErrorCode::PeerNotAllowed,
            Self::MaxDepth { .. } => ErrorCode::MaxDepthExceeded,
            Self::TooLarge { .. } => ErrorCode::RequestTooLarge,
            Self::Registry { .. }
            | Self::NotRegistered { .. }
            | Self::ProbeFailed { .. }
            | Self::Connection { .. }
            | Self::Broken { .. } => ErrorCode::InstanceUnavailable,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::InvalidResponse { .. } => ErrorCode::InvalidResponse,
            Self::NoRandomness { .. } => ErrorCode::InternalError,
            Self::Stopped { .. } => ErrorCode::Cancelled,
            Self::NotRetried { error, .. } => error.code(),
            Self::Remote { failure, .. } => failure.code.clone(),
        }
    }

    /// Whether the peer may have run the turn although this failure came back: a
    /// timeout (ours, or one the peer answered: its engine ran until it was stopped),
    /// a connection broken after the request was sent, an answer that is no envelope,
    /// or the peer's own `unknown` failure. Such a failure is retried only against a
    /// peer that deduplicates requests (contract 8.2).
    pub fn may_have_run(&self) -> bool {
        match self.cause() {
            Self::Timeout { .. } | Self::Broken { .. } | Self::InvalidResponse { .. } => true,
            Self::Remote { failure, .. } => {
                matches!(failure.code, ErrorCode::Unknown | ErrorCode::Timeout)
            }
            _ => false,
        }
    }

    /// What the failed turn cost, when the peer reported it (a remote failure only).
    pub fn usage(&self) -> Option<&UsageReport> {
        match self.cause() {
            Self::Remote { usage, .. } => usage.as_deref(),
            _ => None,
        }
    }

    /// The failure behind a [`Self::NotRetried`], or this one.
    pub fn cause(&self) -> &DelegateError {
        match self {
            Self::NotRetried { error, .. } => error.cause(),
            other => other,
        }
    }

    /// Whether the same delegation may be tried again without operator action: the
    /// peer's own flag for a remote failure, the retry table otherwise.
    pub fn retryable(&self) -> bool {
        match self.cause() {
            Self::Remote { failure, .. } => failure.retryable,
            // Trying again reaches the same squatter: an operator must look.
            Self::ProbeFailed {
                reason: ProbeError::NoProof | ProbeError::WrongProof | ProbeError::NotSameUser(_),
                ..
            } => false,
            // A registry we may not read, or may not trust (another user's, or
            // writable by others: contract 1), stays so until someone fixes it.
            Self::Registry { error, .. } => error.kind() != std::io::ErrorKind::PermissionDenied,
            other => other.code().retryable(),
        }
    }

    /// The failure as an envelope, as `loopbus talk --json` prints it. A remote
    /// failure keeps the peer's name, message, code, flag, `protocolVersion` and
    /// `capabilities` (absent ones absent: a legacy peer's); a failure decided here
    /// names `caller` (the instance that produced it) and took `duration_ms`.
    pub fn to_envelope(&self, caller: &str, duration_ms: u64) -> Envelope {
        match self.cause() {
            Self::Remote {
                from_instance,
                failure,
                duration_ms,
                peer,
                usage,
            } => Envelope {
                protocol_version: peer.protocol_version,
                capabilities: peer.capabilities.clone(),
                ..Envelope::failure(from_instance, failure.clone(), *duration_ms)
            }
            .with_usage(usage.as_deref().copied()),
            _ => {
                let mut failure = Failure::new(self.code(), self.to_string());
                failure.retryable = self.retryable();
                Envelope::failure(caller, failure, duration_ms)
            }
        }
    }
}

impl fmt::Display for DelegateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BusDisabled { caller } => {
                write!(f, "the bus is disabled in {caller}'s own config")
            }
            Self::PeerNotAllowed { caller, target } => {
                write!(f, "{target} is not among {caller}'s own peers")
            }
            Self::MaxDepth { caller, depth, max } => {
                write!(f, "depth {depth} reaches {caller}'s own maxDepth of {max}")
            }
            Self::TooLarge { bytes } => write!(
                f,
                "request body is {bytes} bytes, more than the limit of {MAX_BODY_BYTES}"
            ),
            Self::Registry { path, error } => {
                write!(f, "cannot read the registry {}: {error}", path.display())
            }
            Self::NotRegistered { target } => {
                write!(f, "instance {target} is not registered (is it running?)")
            }
            Self::ProbeFailed {
                target,
                port,
                reason: reason @ (ProbeError::NoProof | ProbeError::WrongProof),
            } => write!(
                f,
                "instance {target} is not available on port {port}: {reason}"
            ),
            Self::ProbeFailed { target, reason, .. } => {
                write!(f, "instance {target} is not available: {reason}")
            }
            Self::Connection { target, reason } => {
                write!(f, "instance {target} is not available: {reason}")
            }
            Self::Broken { target, reason } => write!(
                f,
                "instance {target} is not available: {reason} after the request was sent"
            ),
            Self::NoRandomness { error } => write!(
                f,
                "cannot make a request id from the OS's randomness: {error}"
            ),
            Self::NotRetried { target, error } => write!(
                f,
                "{error}; not retried: the turn may have run, and {target} does not \
                 advertise idempotent-requests, so a retry could run it twice"
            ),
            Self::Timeout { target, after } => write!(
                f,
                "instance {target} did not answer within {} s",
                after.as_secs_f64()
            ),
            Self::InvalidResponse { target, reason } => {
                write!(f, "instance {target} gave an invalid answer: {reason}")
            }
            Self::Stopped { target } => write!(
                f,
                "the delegation to {target} was stopped before it was sent"
            ),
            // `from_instance` is never empty: a legacy peer's is the target's name.
            Self::Remote {
                from_instance,
                failure,
                ..
            } => write!(
                f,
                "{from_instance} answered with a failure: {}",
                failure.error
            ),
        }
    }
}

impl std::error::Error for DelegateError {}
