//! One exchange with the target, the part every attempt and every cancel request
//! shares: the caller's local checks, the registry lookup, the health probe (with the
//! proof, contract 6.1), the same-user check, and the one `POST /api/talk` on the
//! connection whose probe matched; then the mapping of what came back to a
//! [`DelegateError`] or a [`Reply`].

use super::{DelegateError, DelegateOptions, PeerProtocol, Reply};
use crate::http::client::{ClientError, Connection, ReceivedResponse};
use crate::protocol::{
    self, encode_talk_request_with, RequestExt, RequestId, TalkRequest, TraceId, MAX_BODY_BYTES,
    TRACE_CONTEXT,
};
use crate::registry::owner::OwnerRefusal;
use crate::registry::{self, ProbeError};
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

/// A target found in the registry and proven: the connection the secret may go out
/// on, and the capabilities its health listed.
pub(super) struct Proven {
    entry: registry::RegistryEntry,
    connection: Connection,
    /// The capabilities the target's health listed.
    pub capabilities: Vec<String>,
}

/// Looks the target up in the registry and proves it: the connection whose health
/// probe of exactly the entry's address matched (name, kind, and for an entry with
/// `proof: true` a valid proof of the entry's secret, contract 6.1), and, for an entry
/// without, whose other end belongs to our own uid. Nothing of the secret or the
/// prompt has been sent when this fails.
///
/// # Errors
/// A [`DelegateError`] for every row of contract section 5's table from "registry
/// unreadable" to a connection that could not be made (the local checks are
/// [`local_checks`], the size [`check_size`]).
pub(super) fn prove(options: &DelegateOptions) -> Result<Proven, DelegateError> {
    let target = &options.target;
    let entry = registry::lookup(&options.root, target)
        .map_err(|error| DelegateError::Registry {
            path: registry::registry_path(&options.root),
            error,
        })?
        .ok_or_else(|| DelegateError::NotRegistered {
            target: target.to_string(),
        })?;
    let port = entry.port;
    let refused = |reason| DelegateError::ProbeFailed {
        target: target.to_string(),
        port,
        reason,
    };
    let (mut connection, answer) =
        registry::probe(target, &entry, Some(&options.bus.accept_kinds)).map_err(refused)?;
    if !connection.is_reusable() {
        if entry.proof {
            // The proof holds for the connection it came on only.
            return Err(DelegateError::Connection {
                target: target.to_string(),
                reason: ClientError::Closed,
            });
        }
        connection = Connection::open_at(entry.host, port, Instant::now() + PROVE_CONNECT)
            .map_err(|e| transport_error(target, PROVE_CONNECT, e, false))?;
        // The probe checked its own connection's other end; this one is checked anew:
        // where the tables are readable but do not list that end, nothing goes out.
        let (peer, local) = connection.addresses().map_err(|e| {
            log::debug!("owner of port {port} unknown: {e}");
            refused(ProbeError::NotSameUser(OwnerRefusal::Unknown { port }))
        })?;
        registry::check_owner(peer, Some(local))
            .map_err(|refusal| refused(ProbeError::NotSameUser(refusal)))?;
    }
    let capabilities = answer.health.capabilities;
    Ok(Proven {
        entry,
        connection,
        capabilities,
    })
}

/// Sends `request` on the proven connection and waits `timeout` for the answer. The
/// request lists the base two capabilities plus the extensions the target's health
/// listed that this build implements (contract 4.1: the original accepts no other
/// string), and trace context only when it listed `trace-context` (8.4).
///
/// # Errors
/// The body is too large, or the exchange failed (contract section 5's table).
pub(super) fn send(
    options: &DelegateOptions,
    mut peer: Proven,
    mut request: TalkRequest,
    timeout: Duration,
) -> Result<ReceivedResponse, DelegateError> {
    if !peer.capabilities.iter().any(|c| c == TRACE_CONTEXT) {
        request.ext.trace_id = None;
        request.ext.parent_request_id = None;
    }
    let body = encode_talk_request_with(&request, &protocol::negotiate(&peer.capabilities));
    check_size(&body)?;
    let target = &options.target;
    log::debug!(
        "sending to {target} on port {} ({} prompt chars, depth {})",
        peer.entry.port,
        request.prompt.chars().count(),
        request.depth,
    );
    // A timeout too large for the clock means "no deadline worth the name": a year.
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    let connection = &mut peer.connection;
    connection
        .post_talk(&peer.entry.secret, &body, deadline)
        .map_err(|e| transport_error(target, timeout, e, connection.request_sent()))
}

/// The request the caller sends (`depth + 1`: `depth < max_depth <= u64::MAX` by the
/// local checks, so it cannot overflow).
pub(super) fn request(options: &DelegateOptions, prompt: &str, ext: RequestExt) -> TalkRequest {
    let depth = options.depth.saturating_add(1);
    TalkRequest {
        ext,
        ..TalkRequest::new(options.caller.to_string(), prompt, depth)
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

/// Longest wait for the second connection to a peer that closed the probe's (one
/// without proof, contract 6.1): the client's connect bound.
const PROVE_CONNECT: Duration = crate::http::client::CONNECT_TIMEOUT;

/// Maps a failed exchange to the table's row; `sent`: the whole request had gone out.
pub(super) fn transport_error(
    target: &str,
    timeout: Duration,
    error: ClientError,
    sent: bool,
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
        reason @ (ClientError::Io(_) | ClientError::Closed) if sent => {
            DelegateError::Broken { target, reason }
        }
        reason => DelegateError::Connection { target, reason },
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
    let mut envelope = protocol::parse_answer(response.status, &response.body).map_err(|e| {
        DelegateError::InvalidResponse {
            target: target.to_owned(),
            reason: format!("HTTP {}: {e}", response.status),
        }
    })?;
    // The probe established that `target` answers on this port.
    if envelope.from_instance.is_empty() {
        envelope.from_instance = target.to_owned();
    }
    let peer = PeerProtocol {
        protocol_version: envelope.protocol_version,
        capabilities: envelope.capabilities,
    };
    match envelope.failure {
        Some(failure) => Err(DelegateError::Remote {
            from_instance: envelope.from_instance,
            failure,
            duration_ms: envelope.duration_ms,
            peer: Box::new(peer),
            usage: envelope.usage.map(Box::new),
        }),
        None if response.status == 200 => Ok(Reply {
            text: envelope.text,
            from_instance: envelope.from_instance,
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
