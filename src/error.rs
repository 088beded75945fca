//! The one table that turns every failure into an answer.
//!
//! Any module on the request path fails with an [`Error`]: a [`Kind`] saying *who*
//! caused it (client, gateway, backend) and a message written for the person who must
//! act on it. The doors never pick status codes themselves: they ask [`Kind::status`],
//! [`Kind::grpc_code`], [`Kind::retry_after`] and [`Kind::outcome`], so HTTP and gRPC
//! answers and the `outcome` metric label always agree. The table is covered by one table test.

use std::time::Duration;

use http::StatusCode;

/// What went wrong, classified by who caused it and whether a retry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The client sent something malformed; the message says what to fix.
    BadRequest,
    /// No route serves the model or path the client named.
    NotFound,
    /// The method is not allowed on this path.
    MethodNotAllowed,
    /// The request body is larger than the configured limit.
    TooLarge,
    /// The client took too long to send its request body.
    ClientTimeout,
    /// The tier's concurrency limit is reached; shed at once rather than queued.
    Shed,
    /// The micro-batch queue is full (bounded in rows).
    QueueFull,
    /// The offline store holds its limit of unfinished jobs.
    StoreFull,
    /// The deadline cannot be met: the request was refused before any work was done.
    DeadlineUnmeetable,
    /// The route has no enabled tier that can meet the request's budget.
    NoTier,
    /// The request asks for what its door cannot do (an offline acceptance, which
    /// answers later, over gRPC; a transfer coding other than chunked); the message
    /// says how to ask instead.
    Unsupported,
    /// The data plane needs an API key and the request has none it knows.
    Unauthenticated,
    /// An `Idempotency-Key` the tenant already used on this endpoint came with another
    /// request.
    KeyReused,
    /// The deadline passed while the backend was working; the backend call was dropped.
    Deadline,
    /// The backend could not be reached, or answered with something that is not HTTP.
    Backend,
    /// The gateway is shutting down or not ready.
    Unavailable,
    /// A rate limit of the route or of the caller's tenant is reached.
    RateLimited,
    /// The gateway is at a global limit (requests or body bytes in flight, memory) and
    /// sheds new work before the process is at risk.
    Overloaded,
}

/// A rate limit that refused a request, for the `RateLimit-*` response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Requests allowed per window (the burst).
    pub limit: u32,
    /// The window in seconds over which `limit` refills.
    pub window_secs: u64,
}

/// A failure on the request path: its [`Kind`] and a message for operators and clients.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// Who caused it and how the doors answer it.
    pub kind: Kind,
    /// What happened and, for client mistakes, what to change.
    pub message: String,
    /// How long to wait before retrying, when it is known better than the kind's default.
    pub retry_after: Option<Duration>,
    /// The rate limit that refused the request, if one did.
    pub quota: Option<Quota>,
    /// The setting whose limit refused the request, when a limit did (`max_concurrency`,
    /// `queue_capacity`, `deadline`: the learned cost, ...): the `knob` label of
    /// `tiergate_refusals_total`.
    pub knob: Option<&'static str>,
}

impl Kind {
    /// The HTTP status a door answers with.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
            Kind::Shed | Kind::DeadlineUnmeetable | Kind::NoTier | Kind::Unavailable | Kind::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Kind::Unsupported => StatusCode::NOT_IMPLEMENTED,
            Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
            Kind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::QueueFull | Kind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Kind::StoreFull => StatusCode::INSUFFICIENT_STORAGE,
            Kind::Deadline => StatusCode::GATEWAY_TIMEOUT,
            Kind::Backend => StatusCode::BAD_GATEWAY,
        }
    }

    /// How long a client should wait before retrying, when waiting can help.
    ///
    /// Overload answers always carry one; a misconfigured route or a malformed
    /// request does not, because retrying the same request would fail the same way.
    pub fn retry_after(self) -> Option<Duration> {
        match self {
            Kind::Shed
            | Kind::QueueFull
            | Kind::DeadlineUnmeetable
            | Kind::Unavailable
            | Kind::RateLimited
            | Kind::Overloaded => Some(Duration::from_secs(1)),
            Kind::StoreFull => Some(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// The gRPC status code the gRPC door answers with.
    pub fn grpc_code(self) -> tonic::Code {
        use tonic::Code;
        match self {
            Kind::BadRequest => Code::InvalidArgument,
            Kind::NotFound => Code::NotFound,
            Kind::MethodNotAllowed | Kind::Unsupported => Code::Unimplemented,
            Kind::Unauthenticated => Code::Unauthenticated,
            Kind::KeyReused => Code::FailedPrecondition,
            Kind::TooLarge | Kind::Shed | Kind::QueueFull | Kind::StoreFull | Kind::RateLimited => {
                Code::ResourceExhausted
            }
            Kind::ClientTimeout | Kind::Deadline => Code::DeadlineExceeded,
            Kind::DeadlineUnmeetable | Kind::NoTier | Kind::Backend | Kind::Unavailable | Kind::Overloaded => {
                Code::Unavailable
            }
        }
    }

    /// The `outcome` metric label.
    pub fn outcome(self) -> &'static str {
        match self {
            Kind::BadRequest => "bad_request",
            Kind::NotFound => "not_found",
            Kind::MethodNotAllowed => "method_not_allowed",
            Kind::TooLarge => "too_large",
            Kind::ClientTimeout => "client_timeout",
            Kind::Shed => "shed",
            Kind::QueueFull => "queue_full",
            Kind::StoreFull => "store_full",
            Kind::DeadlineUnmeetable => "deadline_unmeetable",
            Kind::NoTier => "no_tier",
            Kind::Unsupported => "unsupported",
            Kind::Unauthenticated => "unauthenticated",
            Kind::KeyReused => "key_reused",
            Kind::Deadline => "deadline",
            Kind::Backend => "backend_error",
            Kind::Unavailable => "unavailable",
            Kind::RateLimited => "rate_limited",
            Kind::Overloaded => "overloaded",
        }
    }
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            retry_after: None,
            quota: None,
            knob: None,
        }
    }

    /// The same error, saying `knob`'s limit refused the request.
    pub fn knob(mut self, knob: &'static str) -> Self {
        self.knob = Some(knob);
        self
    }

    /// The same error, its message saying the call was tried on `endpoints` endpoints
    /// (when more than one).
    pub fn tried(mut self, endpoints: usize) -> Self {
        if endpoints > 1 {
            self.message = format!("{} (tried on {endpoints} endpoints)", self.message);
        }
        self
    }

    /// The same error, saying to retry after `after` (rounded up to whole seconds on HTTP).
    pub fn retry_in(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The same error, naming the rate limit that refused the request.
    pub fn with_quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// How long a client should wait before retrying, if waiting can help.
    pub fn retry(&self) -> Option<Duration> {
        self.retry_after.or(self.kind.retry_after())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use tonic::Code;
        use Kind::*;
        let rows: &[(Kind, u16, Code, Option<u64>, &str)] = &[
            (BadRequest, 400, Code::InvalidArgument, None, "bad_request"),
            (NotFound, 404, Code::NotFound, None, "not_found"),
            (MethodNotAllowed, 405, Code::Unimplemented, None, "method_not_allowed"),
            (TooLarge, 413, Code::ResourceExhausted, None, "too_large"),
            (ClientTimeout, 408, Code::DeadlineExceeded, None, "client_timeout"),
            (Shed, 503, Code::ResourceExhausted, Some(1), "shed"),
            (QueueFull, 429, Code::ResourceExhausted, Some(1), "queue_full"),
            (StoreFull, 507, Code::ResourceExhausted, Some(30), "store_full"),
            (
                DeadlineUnmeetable,
                503,
                Code::Unavailable,
                Some(1),
                "deadline_unmeetable",
            ),
            (NoTier, 503, Code::Unavailable, None, "no_tier"),
            (Unsupported, 501, Code::Unimplemented, None, "unsupported"),
            (Unauthenticated, 401, Code::Unauthenticated, None, "unauthenticated"),
            (KeyReused, 422, Code::FailedPrecondition, None, "key_reused"),
            (Deadline, 504, Code::DeadlineExceeded, None, "deadline"),
            (Backend, 502, Code::Unavailable, None, "backend_error"),
            (Unavailable, 503, Code::Unavailable, Some(1), "unavailable"),
            (RateLimited, 429, Code::ResourceExhausted, Some(1), "rate_limited"),
            (Overloaded, 503, Code::Unavailable, Some(1), "overloaded"),
        ];
        for &(kind, status, code, retry, outcome) in rows {
            assert_eq!(kind.status().as_u16(), status, "{kind:?}");
            assert_eq!(kind.grpc_code(), code, "{kind:?}");
            assert_eq!(kind.retry_after().map(|d| d.as_secs()), retry, "{kind:?}");
            assert_eq!(kind.outcome(), outcome, "{kind:?}");
        }
    }
}
