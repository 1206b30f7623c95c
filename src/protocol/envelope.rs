//! `/api/talk` answers: the [`Envelope`] (v1 or legacy), its [`Failure`], and
//! serializing it. Parsing a peer's is the client's, in `response.rs`.

use super::{truncate_chars, ErrorCode, BASE_CAPABILITIES, MAX_ERROR_CHARS, PROTOCOL_VERSION};

/// The failure part of an envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// Human-readable message (surfaced directly by CLI paths).
    pub error: String,
    /// The stable machine-readable code.
    pub code: ErrorCode,
    /// Whether the same delegation may be tried again without operator action.
    pub retryable: bool,
}

impl Failure {
    /// A failure whose `retryable` comes from the retry table. The message is cut to
    /// 2,000 characters (`protocol::MAX_ERROR_CHARS`).
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Failure {
        Failure {
            retryable: code.retryable(),
            error: truncate_chars(error.into(), MAX_ERROR_CHARS),
            code,
        }
    }
}

/// What one turn cost, as an envelope reports it (`usage-report`, contract 8.3), in
/// the wire's field order.
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct UsageReport {
    /// Cost in US dollars, `None` when the engine reported tokens but no cost.
    pub cost_usd: Option<f64>,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache-read input tokens.
    pub cached_tokens: u64,
}

/// A `/api/talk` response envelope, v1 or legacy.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Envelope {
    /// The reply text (`""` on failure).
    pub text: String,
    /// The answering instance's name (empty when a legacy peer left it out).
    pub from_instance: String,
    /// How long the answer took, in milliseconds (0 when a legacy peer left it out).
    pub duration_ms: u64,
    /// `Some(1)` for v1 envelopes, `None` for legacy ones.
    pub protocol_version: Option<u64>,
    /// The advertised capabilities: always `Some` in this build's envelopes, `None`
    /// when a legacy peer left the field out (and then it is left out again).
    pub capabilities: Option<Vec<String>>,
    /// `None` on success.
    pub failure: Option<Failure>,
    /// What the turn cost, when the request listed `usage-report` and the engine
    /// reported usage (contract 8.3).
    pub usage: Option<UsageReport>,
}

impl Envelope {
    /// A v1 success envelope from this build, listing the base capabilities; an answer
    /// to a request lists what [`Envelope::with_capabilities`] gives it.
    pub fn success(from_instance: &str, text: String, duration_ms: u64) -> Envelope {
        Envelope {
            text,
            from_instance: from_instance.to_owned(),
            duration_ms,
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: Some(BASE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
            failure: None,
            usage: None,
        }
    }

    /// The same envelope listing `capabilities`: for an answer, the base two plus
    /// those of the request's that this server implements on `/api/talk` (contract 4.1,
    /// `negotiate`).
    pub fn with_capabilities(mut self, capabilities: Vec<String>) -> Envelope {
        self.capabilities = Some(capabilities);
        self
    }

    /// The same envelope carrying `usage` (contract 8.3).
    pub fn with_usage(self, usage: Option<UsageReport>) -> Envelope {
        Envelope { usage, ..self }
    }

    /// A v1 failure envelope from this build.
    pub fn failure(from_instance: &str, failure: Failure, duration_ms: u64) -> Envelope {
        Envelope {
            failure: Some(failure),
            ..Envelope::success(from_instance, String::new(), duration_ms)
        }
    }

    /// The envelope as JSON, fields in the order `bus-protocol.md` shows them.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing strings, numbers and booleans into a Vec cannot fail.
        serde_json::to_vec(&Wire(self)).unwrap_or_default()
    }
}

/// The wire form of an [`Envelope`]: its fields in protocol order, those it lacks
/// (a legacy envelope's, or a success's `error`, `errorCode` and `retryable`) left out.
struct Wire<'a>(&'a Envelope);

impl serde::Serialize for Wire<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let envelope = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("success", &envelope.failure.is_none())?;
        map.serialize_entry("text", &envelope.text)?;
        map.serialize_entry("fromInstance", &envelope.from_instance)?;
        if let Some(failure) = &envelope.failure {
            map.serialize_entry("error", &failure.error)?;
            map.serialize_entry("errorCode", failure.code.as_str())?;
            map.serialize_entry("retryable", &failure.retryable)?;
        }
        map.serialize_entry("durationMs", &envelope.duration_ms)?;
        if let Some(version) = envelope.protocol_version {
            map.serialize_entry("protocolVersion", &version)?;
        }
        if let Some(capabilities) = &envelope.capabilities {
            map.serialize_entry("capabilities", capabilities)?;
        }
        if let Some(usage) = &envelope.usage {
            map.serialize_entry("usage", usage)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn envelope_json_shapes() {
        let ok = Envelope::success("worker", "done".into(), 241);
        let v: Value = serde_json::from_slice(&ok.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success":true,"text":"done","fromInstance":"worker","durationMs":241,
                "protocolVersion":1,"capabilities":["structured-errors","retryable-errors"]})
        );
        let failure = Failure::new(
            ErrorCode::BudgetExhausted,
            "Budget exhausted: $1.2000 used of $1.00.",
        );
        let bad = Envelope::failure("worker", failure, 12);
        let v: Value = serde_json::from_slice(&bad.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success":false,"text":"","fromInstance":"worker",
                "error":"Budget exhausted: $1.2000 used of $1.00.","errorCode":"budget_exhausted",
                "retryable":false,"durationMs":12,"protocolVersion":1,
                "capabilities":["structured-errors","retryable-errors"]})
        );
    }

    #[test]
    fn long_errors_are_cut_on_char_boundaries() {
        let f = Failure::new(ErrorCode::EngineCli, "é".repeat(MAX_ERROR_CHARS + 10));
        assert_eq!(f.error.chars().count(), MAX_ERROR_CHARS);
    }
}
