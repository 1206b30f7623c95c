//! One exchange with the target, the part every attempt and every cancel request
//! shares: the caller's local checks, the registry lookup, the health probe (with the
//! proof, contract 6.1), the same-user check, and the one `POST /api/talk` on the
//! connection whose probe matched; then the mapping of what came back to a
//! [`DelegateError`] or a [`Reply`].

use super::{DelegateError, DelegateOptions, PeerProtocol, Reply};
use crate::http::client::{ClientError, Connection, ReceivedResponse};
use crate::protocol::{
    self, encode_talk_request_with, InstanceName, RequestExt, RequestId, TalkRequest, TraceId,
    MAX_BODY_BYTES, TRACE_CONTEXT,
};
use crate::registry::owner::OwnerRefusal;
use crate::registry::{self, ProbeError, Target};
use std::time::{Duration, Instant};

/// The caller's own checks, in the table's order: own bus enabled, target among own
/// peers, depth below own `maxDepth` (contract 5).
///
/// # Errors
/// The first that fails.
pub(super) fn local_checks(options: &DelegateOptions) -> Result<(), DelegateError> {
    let bus = &options.bus;
    let caller = options.caller.to_string();
    if !bus.enabled {
        return Err(DelegateError::BusDisabled { caller });
    }
    if !bus.peers.allows(&options.target) {
        return Err(DelegateError::PeerNotAllowed {
            caller,
            target: options.target.to_string(),
        });
    }
    if options.depth >= bus.max_depth {
        return Err(DelegateError::MaxDepth {
            caller,
            depth: options.depth,
            max: bus.max_depth,
        });
    }
    Ok(())
}

/// What one exchange sends: the prompt, the `ext` fields, how long to wait for the
/// answer once the request is sent, and a capability the target's health must list
/// for the request to go out at all.
pub(super) struct Exchange<'a> {
    /// The prompt sent.
    pub prompt: &'a str,
    /// The `ext` fields sent.
    pub ext: RequestExt,
    /// How long to wait for the answer once the request is sent.
    pub timeout: Duration,
    /// A capability the target's health must list, else nothing is sent.
    pub required: Option<&'static str>,
}

/// How an exchange ended without a failure.
pub(super) enum Sent {
    /// The peer answered (any status).
    Answer(ReceivedResponse),
    /// The target's health did not list the required capability: nothing was sent.
    NotListed,
}

/// Runs one exchange. `listed` gets the capabilities the target's health listed as
/// soon as a probe matched (also when the request then fails), so that the caller
/// knows whether the peer deduplicates.
///
/// # Errors
/// A [`DelegateError`] for every row of contract section 5's table from "registry
/// unreadable" on (the local checks are [`local_checks`], the size [`check_size`]).
pub(super) fn exchange(
    options: &DelegateOptions,
    what: &Exchange<'_>,
    listed: &mut Option<Vec<String>>,
) -> Result<Sent, DelegateError> {
    let target = &options.target;
    let entry = registry::lookup(&options.root, target)
        .map_err(|error| DelegateError::Registry {
            path: registry::registry_path(&options.root),
            error,
        })?
        .ok_or_else(|| DelegateError::NotRegistered {
            target: target.to_string(),
        })?;
    let (mut connection, capabilities) = prove(options, &entry)?;
    *listed = Some(capabilities.clone());
    if what
        .required
        .is_some_and(|required| !capabilities.iter().any(|c| c == required))
    {
        return Ok(Sent::NotListed);
    }
    let mut request = request(options, what);
    // Trace context goes only to a peer that said it reads it (contract 8.4).
    if !capabilities.iter().any(|c| c == TRACE_CONTEXT) {
        request.ext.trace_id = None;
        request.ext.parent_request_id = None;
    }
    // The request lists the base two plus the extensions the target's health listed
    // that this build implements (contract 4.1): the original accepts no other string.
    let body = encode_talk_request_with(&request, &protocol::negotiate(&capabilities));
    check_size(&body)?;
    log::debug!(
        "sending to {target} on port {} ({} prompt chars, depth {})",
        entry.port,
        what.prompt.chars().count(),
        request.depth,
    );
    // A timeout too large for the clock means "no deadline worth the name": a year.
    let deadline = Instant::now()
        .checked_add(what.timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    match connection.post_talk(&entry.secret, &body, deadline) {
        Ok(response) => Ok(Sent::Answer(response)),
        Err(e @ (ClientError::Io(_) | ClientError::Closed)) if connection.request_sent() => {
            Err(DelegateError::Broken {
                target: target.to_string(),
                reason: e,
            })
        }
        Err(e) => Err(transport_error(target, what.timeout, e)),
    }
}

/// The request one exchange sends (`depth + 1`: `depth < max_depth <= u64::MAX` by
/// the local checks, so it cannot overflow).
pub(super) fn request(options: &DelegateOptions, what: &Exchange<'_>) -> TalkRequest {
    TalkRequest {
        ext: what.ext.clone(),
        ..TalkRequest::new(
            options.caller.to_string(),
            what.prompt,
            options.depth.saturating_add(1),
        )
    }
}

/// The "body too large" row of contract section 5's table.
///
/// # Errors
/// [`DelegateError::TooLarge`] for a body over [`MAX_BODY_BYTES`].
pub(super) fn check_size(body: &[u8]) -> Result<(), DelegateError> {
    if body.len() as u64 > MAX_BODY_BYTES {
        return Err(DelegateError::TooLarge { bytes: body.len() });
    }
    Ok(())
}

/// A connection the secret may go out on, proven now, with the capabilities its
/// health listed: the one whose health probe of exactly the entry's address matched
/// (name, kind, and for an entry with `proof: true` a valid proof of the entry's
/// secret, contract 6.1), and, for an entry without, whose other end belongs to our
/// own uid. Nothing of the secret or the prompt has been sent when this fails.
///
/// # Errors
///
/// [`DelegateError::Unproven`] (not retryable) when the port's holder fails the proof;
/// [`DelegateError::ProbeFailed`] for any other probe failure; the same-user check's
/// refusals; a connection that could not be made.
fn prove(
    options: &DelegateOptions,
    entry: &registry::RegistryEntry,
) -> Result<(Connection, Vec<String>), DelegateError> {
    let target = &options.target;
    let probed = registry::probe(
        Target::Entry(target, entry),
        Some(&options.bus.accept_kinds),
    )
    .map_err(|reason| match reason {
        ProbeError::NotSameUser(refusal) => owner_refused(target, refusal),
        reason if reason.is_failed_proof() => DelegateError::Unproven {
            target: target.to_string(),
            port: entry.port,
            reason,
        },
        reason => DelegateError::ProbeFailed {
            target: target.to_string(),
            reason,
        },
    })?;
    let mut connection = probed.connection;
    if !connection.is_reusable() {
        if entry.proof {
            // The proof holds for the connection it came on only.
            return Err(DelegateError::Connection {
                target: target.to_string(),
                reason: ClientError::Closed,
            });
        }
        connection = Connection::open_at(entry.host, entry.port, Instant::now() + PROVE_CONNECT)
            .map_err(|e| transport_error(target, PROVE_CONNECT, e))?;
        // The probe checked its own connection's other end; this one is checked anew.
        same_user(target, entry, &connection)?;
    }
    Ok((connection, probed.answer.health.capabilities))
}

/// Longest wait for the second connection to a peer that closed the probe's (one
/// without proof, contract 6.1): the client's connect bound.
const PROVE_CONNECT: Duration = crate::http::client::CONNECT_TIMEOUT;

/// The same-user check (contract section 6.1): a peer that cannot prove itself gets
/// the secret only when the socket at the other end of the connection the secret goes
/// out on, and the listener on its port, belong to our own uid; where the tables are
/// readable but do not list that end, it gets nothing either.
fn same_user(
    target: &InstanceName,
    entry: &registry::RegistryEntry,
    connection: &Connection,
) -> Result<(), DelegateError> {
    let (peer, local) = connection.addresses().map_err(|e| {
        log::debug!("owner of port {} unknown: {e}", entry.port);
        owner_refused(target, OwnerRefusal::Unknown { port: entry.port })
    })?;
    registry::check_owner(peer, Some(local)).map_err(|refusal| owner_refused(target, refusal))
}

/// The delegation failure of a same-user check's refusal.
fn owner_refused(target: &InstanceName, refusal: OwnerRefusal) -> DelegateError {
    DelegateError::NotSameUser {
        target: target.to_string(),
        refusal,
    }
}

/// Maps a failed exchange to the table's row.
pub(super) fn transport_error(
    target: &str,
    timeout: Duration,
    error: ClientError,
) -> DelegateError {
    let target = target.to_owned();
    match error {
        ClientError::Timeout => DelegateError::Timeout {
            target,
            after: timeout,
        },
        ClientError::Malformed(what) => DelegateError::InvalidResponse {
            target,
            reason: what.to_owned(),
        },
        reason @ (ClientError::NotLoopback(_)
        | ClientError::Connect(_)
        | ClientError::Io(_)
        | ClientError::Closed
        | ClientError::UnsendableSecret) => DelegateError::Connection { target, reason },
    }
}

/// Turns a complete answer into a reply or an error. Any status may carry a failure
/// envelope (refusals come as 4xx/5xx); a success envelope counts only with 200.
pub(super) fn interpret(
    target: &str,
    response: ReceivedResponse,
    request_id: &RequestId,
    trace_id: &TraceId,
) -> Result<Reply, DelegateError> {
    let envelope = protocol::parse_answer(response.status, &response.body).map_err(|e| {
        DelegateError::InvalidResponse {
            target: target.to_owned(),
            reason: format!("HTTP {}: {e}", response.status),
        }
    })?;
    // The probe established that `target` answers on this port.
    let from_instance = if envelope.from_instance.is_empty() {
        target.to_owned()
    } else {
        envelope.from_instance
    };
    let peer = PeerProtocol {
        protocol_version: envelope.protocol_version,
        capabilities: envelope.capabilities,
    };
    match envelope.failure {
        Some(failure) => Err(DelegateError::Remote {
            from_instance,
            failure,
            duration_ms: envelope.duration_ms,
            peer: Box::new(peer),
            usage: envelope.usage.map(Box::new),
        }),
        None if response.status == 200 => Ok(Reply {
            text: envelope.text,
            from_instance,
            duration_ms: envelope.duration_ms,
            peer,
            usage: envelope.usage,
            request_id: request_id.clone(),
            trace_id: trace_id.clone(),
        }),
        None => Err(DelegateError::InvalidResponse {
            target: target.to_owned(),
            reason: format!("a success envelope with HTTP {}", response.status),
        }),
    }
}
