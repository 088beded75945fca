//! The OpenAI door's token step, on a route with `[tokens]`: a call's `max_tokens` and
//! `n` held to the route's ceilings (refused with a 400 naming the ceiling, or sent at
//! it where the route says `clamp = true`), the route's `default_max_tokens` sent when
//! the call names none, and what the call may use reserved against the route's and its
//! tenant's limits before it is sent ([`crate::usage::limits`]). A refused call gets
//! OpenAI's 429: its error object naming the limit, `Retry-After`, and the
//! `x-ratelimit-*` fields, which every answer on such a route carries.
//!
//! A call sent `Prefer: respond-async` reserves nothing here: it is an offline job,
//! which waits in the queue for its tenant's tokens rather than being refused.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::body::Answered;
use crate::policy::tokens::TokenRules;
use crate::policy::Route;
use crate::usage::limits::{Call, Headroom, Left, Refused, Reservation, Unit};
use crate::usage::Ledger;

/// What the step let through: the body to send (rewritten to a ceiling or a default),
/// the reservation the call holds, and what the caller is told of its limits.
pub(super) struct Held {
    pub body: Bytes,
    pub reservation: Option<Reservation>,
    pub headroom: Headroom,
}

/// Holds a call to `path` on `route` with `body` to the route's token rules, as
/// `tenant`'s (`offline`: it is an offline job, which reserves when it is sent).
pub(super) async fn hold(
    ledger: &std::sync::Arc<Ledger>,
    (route, rules): (&Route, &TokenRules),
    (path, tenant, offline): (&str, &str, bool),
    body: Bytes,
) -> Result<Held, Response<Answered>> {
    let fitted = crate::usage::limits::fit(rules, &route.name, path, body).map_err(|unfit| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            unfit.param,
            &unfit.message,
        )
    })?;
    if offline || !rules.limits_anything() {
        return Ok(Held {
            body: fitted.body,
            reservation: None,
            headroom: Headroom::default(),
        });
    }
    let (body, tokens) = (fitted.body, fitted.tokens);
    let call = Call {
        route: &route.name,
        tenant,
        rules,
        tokens,
    };
    match ledger.limits.reserve(call).await {
        Ok((reservation, headroom)) => Ok(Held {
            body,
            reservation,
            headroom,
        }),
        Err(refused) => Err(refusal(&route.name, tenant, refused)),
    }
}

/// The answer to a call `refused` on `route`.
fn refusal(route: &str, tenant: &str, refused: Refused) -> Response<Answered> {
    let whose = match tenant {
        "" => "the anonymous tenant".to_owned(),
        name => format!("tenant {name}"),
    };
    match refused {
        Refused::TooLarge { asked, limit } => {
            count(route, &limit.knob, "too_large");
            let why = format!(
                "this call reserves {asked} {} (its prompt's estimate, and max_tokens for each choice), more than \
                 {} = {} ever allows {whose} on route {route}: lower max_tokens or n, or shorten the prompt",
                unit(limit.unit),
                limit.knob,
                limit.limit
            );
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("max_tokens"),
                &why,
            )
        }
        Refused::Spent {
            limit,
            asked,
            left,
            retry_after,
            headroom,
        } => {
            count(route, &limit.knob, "spent");
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            let why = format!(
                "rate limit reached for {whose} on route {route}: {} = {}, {left} {} left, this call reserves {asked}; \
                 try again in {}",
                limit.knob,
                limit.limit,
                unit(limit.unit),
                humantime::format_duration(std::time::Duration::from_secs(secs.max(1)))
            );
            let kind = match limit.unit {
                Unit::Tokens => "tokens",
                Unit::Requests => "requests",
            };
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, kind, None, &why);
            let headers = response.headers_mut();
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            headers_of(headers, &headroom);
            response
        }
    }
}

/// Counts a refusal by `route`'s token limit `knob` (its table and key, without a
/// tenant's name).
fn count(route: &str, knob: &str, why: &'static str) {
    let limit = knob.rsplit('.').next().unwrap_or(knob).to_owned();
    ::metrics::counter!(crate::metrics::TOKEN_LIMITED, "route" => route.to_owned(), "limit" => limit, "why" => why)
        .increment(1);
}

fn unit(unit: Unit) -> &'static str {
    match unit {
        Unit::Tokens => "tokens",
        Unit::Requests => "requests",
    }
}

/// OpenAI's `x-ratelimit-*` fields of `headroom` in `headers`.
pub(super) fn headers_of(headers: &mut HeaderMap, headroom: &Headroom) {
    let pairs: [(&Option<Left>, [&'static str; 3]); 2] = [
        (
            &headroom.requests,
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
        ),
        (
            &headroom.tokens,
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ),
    ];
    for (left, [limit, remaining, reset]) in pairs {
        let Some(left) = left else { continue };
        headers.insert(limit, HeaderValue::from(left.limit));
        headers.insert(remaining, HeaderValue::from(left.remaining));
        if let Ok(value) = HeaderValue::from_str(&openai_duration(left.reset)) {
            headers.insert(reset, value);
        }
    }
}

/// A duration as OpenAI writes its resets: `1m30s`, `6s`, `250ms`.
fn openai_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        _ => {
            let secs = ms.div_ceil(1000);
            match (secs / 3600, secs / 60 % 60, secs % 60) {
                (0, 0, s) => format!("{s}s"),
                (0, m, s) => format!("{m}m{s}s"),
                (h, m, s) => format!("{h}h{m}m{s}s"),
            }
        }
    }
}

/// OpenAI's error answer.
fn error(status: StatusCode, kind: &str, param: Option<&str>, message: &str) -> Response<Answered> {
    let code = match status {
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
        _ => "invalid_request",
    };
    let body = serde_json::json!({"error": {
        "message": message, "type": kind, "param": param, "code": code,
    }});
    let mut response = Response::new(Answered::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_read_as_openai_writes_them() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(openai_duration(ms(250)), "250ms");
        assert_eq!(openai_duration(ms(5_200)), "6s");
        assert_eq!(openai_duration(ms(90_000)), "1m30s");
        assert_eq!(openai_duration(ms(3_600_000 + 61_000)), "1h1m1s");
    }
}
