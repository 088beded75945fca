//! `GET /admin/usage`: the usage ledger's table (`since`, `by`, `format=json|csv`),
//! and `GET /admin/capacity`: each pool's capacity signal now.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

use crate::policy::Policy;
use crate::usage::report::{self, By};
use crate::usage::{unix, Ledger};

/// What a bad query gets: its status, code and message.
type Refusal = (StatusCode, &'static str, String);

/// The table's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Csv,
}

/// What a usage query asks: from when, grouped by what, in which format.
struct Asked {
    since: SystemTime,
    by: Vec<By>,
    format: Format,
}

fn asked(query: Option<&str>) -> Result<Asked, Refusal> {
    let bad = |code, message: String| (StatusCode::BAD_REQUEST, code, message);
    let since = match super::shadow::since(query)? {
        Some(since) => since,
        None => SystemTime::now() - std::time::Duration::from_secs(24 * 3600),
    };
    let mut asked = Asked {
        since,
        by: vec![By::Route, By::Tier],
        format: Format::Json,
    };
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "since" => {}
            "by" => {
                asked.by =
                    By::parse_list(&value.replace("%2C", ",").replace("%2c", ",")).map_err(|m| bad("bad_by", m))?
            }
            "format" => {
                asked.format = match value {
                    "json" => Format::Json,
                    "csv" => Format::Csv,
                    other => return Err(bad("bad_format", format!("format={other:?}: json or csv"))),
                }
            }
            other => {
                return Err(bad(
                    "bad_query",
                    format!("{other:?} is not a usage query key: since, by, format"),
                ))
            }
        }
    }
    Ok(asked)
}

/// The table `query` asks for, from `ledger` (the fleet's, with the Kafka queue),
/// priced as `policy` prices its pools, the rows a batch pool sent before it had
/// learned its cost at `one`, its `t(1)` now by route.
pub(super) async fn table(
    ledger: &Arc<Ledger>,
    (policy, one): (&Policy, &report::OneRow<'_>),
    query: Option<&str>,
) -> Response<Full<Bytes>> {
    let asked = match asked(query) {
        Ok(asked) => asked,
        Err((status, code, message)) => return super::error(status, code, &message),
    };
    let since = unix(asked.since);
    let rows = match ledger.read(since).await {
        Ok(rows) => rows,
        Err(e) => {
            return super::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "usage_unreadable",
                &format!("the usage ledger cannot be read: {e}"),
            )
        }
    };
    let report = report::build(&rows, &asked.by, (policy, one), (since, unix(SystemTime::now())));
    match asked.format {
        Format::Json => super::ok(&json!(report)),
        Format::Csv => {
            let mut response = Response::new(Full::new(Bytes::from(report.csv())));
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            );
            headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
    }
}

/// Every pool's capacity signal now.
pub(super) fn capacity(ledger: &Ledger) -> Response<Full<Bytes>> {
    let pools: Vec<_> = ledger
        .capacity
        .all()
        .into_iter()
        .map(|(route, source, need)| json!({"route": route, "tier": source.as_str(), "signal": need}))
        .collect();
    super::ok(&json!({ "pools": pools }))
}
