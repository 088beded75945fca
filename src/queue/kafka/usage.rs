//! The usage ledgers of the replicas, shared on the state topic (see `crate::usage::fleet`):
//! each replica publishes each minute and hour it wrote as one record keyed
//! `usage/REPLICA/SPAN/PERIOD` (its rows as JSON in the value, the latest replacing the
//! earlier, so compaction keeps one per period), and a tombstone under the same key for
//! a period it rolled up or let go. Every view keeps them in `fleet_usage`, one row per
//! replica, period, route, source and tenant; a usage table sums the replicas.

use bytes::Bytes;
use rusqlite::{params_from_iter, Connection};
use serde::{Deserialize, Serialize};

use super::produce::Out;
use super::records::{Record, UsagePeriod};
use super::KafkaQueue;
use crate::queue::StoreError;
use crate::usage::fleet::{Answer, Fleet};
use crate::usage::quota::Use;
use crate::usage::store::Row;
use crate::usage::{Field, FIELDS};

/// One row of a published period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct UsageRow {
    route: String,
    source: String,
    tenant: String,
    figures: Vec<u64>,
}

/// Creates the view's table of every replica's usage.
pub(super) fn schema(conn: &Connection) -> Result<(), StoreError> {
    let columns: Vec<String> = Field::ALL
        .iter()
        .map(|f| format!("{} INTEGER NOT NULL DEFAULT 0", f.column()))
        .collect();
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS fleet_usage (
             replica TEXT NOT NULL, span INTEGER NOT NULL, period INTEGER NOT NULL,
             route TEXT NOT NULL, source TEXT NOT NULL, tenant TEXT NOT NULL,
             {},
             PRIMARY KEY (replica, span, period, route, source, tenant)
         )",
        columns.join(", ")
    ))?;
    crate::usage::store::add_columns(conn, "fleet_usage")?;
    Ok(())
}

/// Applies a published period (its rows replace the replica's earlier ones), or a
/// tombstone (`value` empty for [`Record::UsageGone`]).
pub(super) fn apply(conn: &Connection, period: &UsagePeriod, value: Option<&[u8]>) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM fleet_usage WHERE replica = ?1 AND span = ?2 AND period = ?3")?
        .execute(rusqlite::params![period.replica, period.span, period.period])?;
    let Some(value) = value else { return Ok(()) };
    let rows: Vec<UsageRow> = serde_json::from_slice(value)
        .map_err(|e| StoreError::Io(format!("a usage record of {} is unreadable: {e}", period.replica)))?;
    let names: Vec<&str> = Field::ALL.iter().map(|f| f.column()).collect();
    let sql = format!(
        "INSERT OR REPLACE INTO fleet_usage (replica, span, period, route, source, tenant, {}) VALUES ({})",
        names.join(", "),
        vec!["?"; 6 + FIELDS].join(", ")
    );
    let mut insert = conn.prepare_cached(&sql)?;
    for row in rows {
        let mut values: Vec<rusqlite::types::Value> = vec![
            period.replica.clone().into(),
            period.span.into(),
            period.period.into(),
            row.route.into(),
            row.source.into(),
            row.tenant.into(),
        ];
        values.extend((0..FIELDS).map(|i| {
            let v = row.figures.get(i).copied().unwrap_or(0);
            rusqlite::types::Value::from(i64::try_from(v).unwrap_or(i64::MAX))
        }));
        insert.execute(params_from_iter(values))?;
    }
    Ok(())
}

/// Every replica's rows whose period ends after `since`, summed over the replicas.
fn fleet_rows(conn: &Connection, since: i64) -> Result<Vec<Row>, StoreError> {
    let sums: Vec<String> = Field::ALL.iter().map(|f| format!("SUM({})", f.column())).collect();
    let mut select = conn.prepare_cached(&format!(
        "SELECT span, period, route, source, tenant, {} FROM fleet_usage WHERE period + span > ?1
         GROUP BY span, period, route, source, tenant",
        sums.join(", ")
    ))?;
    let rows = select.query_map([since], crate::usage::store::row)?;
    let mut out = Vec::new();
    for row in rows {
        out.extend(row?);
    }
    Ok(out)
}

/// Every other replica's use of each tenant on each route since `month`, and of it
/// since `day`.
fn others(conn: &Connection, me: &str, (day, month): (i64, i64)) -> Result<Vec<(String, String, Use)>, StoreError> {
    let answered = "MAX(requests - refused, 0)";
    let mut select = conn.prepare_cached(&format!(
        "SELECT tenant, route,
                SUM(CASE WHEN period >= ?2 THEN used_ns ELSE 0 END), SUM(CASE WHEN period >= ?2 THEN {answered} ELSE 0 END),
                SUM(used_ns), SUM({answered})
         FROM fleet_usage WHERE replica != ?1 AND period >= ?3 GROUP BY tenant, route"
    ))?;
    let rows = select.query_map(rusqlite::params![me, day, month], |r| {
        let n = |i: usize| r.get::<_, i64>(i).map(|v| u64::try_from(v).unwrap_or(0));
        let used = Use {
            day_ns: n(2)?,
            day_requests: n(3)?,
            month_ns: n(4)?,
            month_requests: n(5)?,
        };
        Ok((r.get(0)?, r.get(1)?, used))
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

impl Fleet for KafkaQueue {
    fn publish(&self, rows: Vec<Row>, gone: Vec<(i64, i64)>) -> Answer<'_, ()> {
        Box::pin(async move {
            let replica = self.inner.replica.clone();
            let mut periods: std::collections::BTreeMap<(i64, i64), Vec<UsageRow>> = Default::default();
            for row in rows {
                periods.entry((row.span, row.period)).or_default().push(UsageRow {
                    route: row.route,
                    source: row.source.as_str().to_owned(),
                    tenant: row.tenant,
                    figures: row.figures.0.to_vec(),
                });
            }
            let mut outs = Vec::new();
            for ((span, period), rows) in periods {
                let meta = UsagePeriod {
                    replica: replica.clone(),
                    span,
                    period,
                };
                let value = serde_json::to_vec(&rows).map_err(|e| e.to_string())?;
                outs.push(Out::state(
                    &Record::Usage(meta.clone()),
                    &meta.key(),
                    Bytes::from(value),
                ));
            }
            for (span, period) in gone {
                let meta = UsagePeriod {
                    replica: replica.clone(),
                    span,
                    period,
                };
                outs.push(Out::state(&Record::UsageGone(meta.clone()), &meta.key(), Bytes::new()));
            }
            self.write(outs).await.map_err(|e| e.to_string())
        })
    }

    fn others(&self, (day, month): (i64, i64)) -> Answer<'_, Vec<(String, String, Use)>> {
        Box::pin(async move {
            let me = self.inner.replica.clone();
            self.inner
                .view
                .store
                .call(move |conn| others(conn, &me, (day, month)))
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn rows(&self, since: i64) -> Answer<'_, Vec<Row>> {
        Box::pin(async move {
            self.inner
                .view
                .store
                .call(move |conn| fleet_rows(conn, since))
                .await
                .map_err(|e| e.to_string())
        })
    }
}
