//! Where the usage ledger is kept: `usage.db` in the data directory (SQLite, `0600`),
//! one row per minute, route, source and tenant; minutes older than a day rolled into
//! hours, hours older than the retention (90 days by default) deleted. Its own file, so
//! the ledger's writes never wait on the offline queue's and the other way round.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params_from_iter, Connection};

use super::{Field, Figures, Pending, Source, FIELDS};

/// Minutes are kept this long before they are rolled into hours.
const MINUTES_FOR: i64 = 24 * 3600;
/// Hours are kept this long unless the settings say.
pub const KEEP_DAYS: u32 = 90;

/// One kept row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its length: 60 (a minute) or 3600 (an hour), seconds.
    pub span: i64,
    /// The start of its minute or hour, unix seconds.
    pub period: i64,
    /// Its route.
    pub route: String,
    /// Where the answers came from.
    pub source: Source,
    /// Its tenant ("" for the anonymous one).
    pub tenant: String,
    /// What it counts.
    pub figures: Figures,
}

/// The periods (span, start) a write changed: written (their rows now as the store
/// has them), and gone (rolled into hours, or past the retention).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Changed {
    /// Written.
    pub written: std::collections::BTreeSet<(i64, i64)>,
    /// No longer kept.
    pub gone: std::collections::BTreeSet<(i64, i64)>,
}

/// The ledger's file.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
    keep_days: u32,
    /// Its statements' text, written once.
    sql: Sql,
    /// The hour whose old minutes were last rolled up (they roll once an hour).
    rolled: std::sync::atomic::AtomicI64,
}

/// The periods of one span before a time.
const PERIODS: &str = "SELECT DISTINCT period FROM usage WHERE span = ?1 AND period < ?2";
/// Minutes rolled into hours.
const DELETE_MINUTES: &str = "DELETE FROM usage WHERE span = 60 AND period < ?1";
/// Hours past the retention.
const DELETE_HOURS: &str = "DELETE FROM usage WHERE span = 3600 AND period < ?1";

#[derive(Debug)]
struct Sql {
    upsert: String,
    roll_up: String,
    since: String,
    period: String,
}

impl Store {
    /// Opens (creating it `0600`) `usage.db` in `dir`, keeping hours `keep_days` days.
    pub fn open(dir: &Path, keep_days: u32) -> Result<Store, String> {
        crate::files::private_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("usage.db");
        crate::files::private_touch(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let conn = Connection::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let columns: Vec<String> = Field::ALL
            .iter()
            .map(|f| format!("{} INTEGER NOT NULL DEFAULT 0", f.column()))
            .collect();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS usage (
                 span INTEGER NOT NULL,
                 period INTEGER NOT NULL,
                 route TEXT NOT NULL,
                 source TEXT NOT NULL,
                 tenant TEXT NOT NULL,
                 {},
                 PRIMARY KEY (span, period, route, source, tenant)
             );
             CREATE INDEX IF NOT EXISTS usage_period ON usage (period);",
            columns.join(",\n                 ")
        ))
        .map_err(|e| format!("{}: {e}", path.display()))?;
        add_columns(&conn, "usage").map_err(|e| format!("{}: {e}", path.display()))?;
        let names: Vec<&str> = Field::ALL.iter().map(|f| f.column()).collect();
        let sums: Vec<String> = names.iter().map(|c| format!("sum({c})")).collect();
        let adds: Vec<String> = names.iter().map(|c| format!("{c} = {c} + excluded.{c}")).collect();
        let sql = Sql {
            upsert: upsert(),
            roll_up: format!(
                "INSERT INTO usage (span, period, route, source, tenant, {names})
                 SELECT 3600, (period / 3600) * 3600, route, source, tenant, {sums}
                 FROM usage WHERE span = 60 AND period < ?1
                 GROUP BY (period / 3600) * 3600, route, source, tenant
                 ON CONFLICT (span, period, route, source, tenant) DO UPDATE SET {adds}",
                names = names.join(", "),
                sums = sums.join(", "),
                adds = adds.join(", "),
            ),
            since: format!(
                "SELECT span, period, route, source, tenant, {} FROM usage WHERE period + span > ?1",
                names.join(", ")
            ),
            period: format!(
                "SELECT span, period, route, source, tenant, {} FROM usage WHERE span = ?1 AND period = ?2",
                names.join(", ")
            ),
        };
        // Compiled now, once, rather than on the ticker's first write.
        for statement in [&sql.upsert, &sql.roll_up, PERIODS, DELETE_MINUTES, DELETE_HOURS] {
            conn.prepare_cached(statement)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(Store {
            conn: Mutex::new(conn),
            keep_days,
            sql,
            rolled: std::sync::atomic::AtomicI64::new(i64::MIN),
        })
    }

    /// Adds `rows` (per minute) in one transaction, then rolls minutes older than a
    /// day into hours and deletes hours past the retention, as of `now`.
    pub(super) fn add(&self, rows: &Pending, now: i64) -> Result<Changed, String> {
        let mut changed = Changed::default();
        changed.written.extend(rows.keys().map(|(minute, ..)| (60, *minute)));
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        {
            let mut insert = tx.prepare_cached(&self.sql.upsert).map_err(|e| e.to_string())?;
            for ((minute, route, source, tenant), figures) in rows {
                let mut values: Vec<rusqlite::types::Value> = vec![
                    60i64.into(),
                    (*minute).into(),
                    route.to_string().into(),
                    source.as_str().to_owned().into(),
                    tenant.clone().into(),
                ];
                values.extend(figures.0.iter().map(|v| i64::try_from(*v).unwrap_or(i64::MAX).into()));
                insert.execute(params_from_iter(values)).map_err(|e| e.to_string())?;
            }
        }
        // Whole hours older than a day: rolled up, so an hour is never split; once an
        // hour, or when a row older than that came.
        let cutoff = (now - MINUTES_FOR).div_euclid(3600) * 3600;
        let stale = rows.keys().any(|(minute, ..)| *minute < cutoff);
        let rolled = self.rolled.load(std::sync::atomic::Ordering::Relaxed);
        if cutoff > rolled || stale {
            let periods = |tx: &rusqlite::Transaction<'_>, span: i64, before: i64| -> Result<Vec<i64>, String> {
                let mut select = tx.prepare_cached(PERIODS).map_err(|e| e.to_string())?;
                let found = select
                    .query_map([span, before], |r| r.get(0))
                    .and_then(Iterator::collect)
                    .map_err(|e| e.to_string());
                found
            };
            for minute in periods(&tx, 60, cutoff)? {
                changed.written.remove(&(60, minute));
                changed.gone.insert((60, minute));
                changed.written.insert((3600, minute.div_euclid(3600) * 3600));
            }
            let keep = i64::from(self.keep_days) * 86_400;
            for hour in periods(&tx, 3600, now - keep)? {
                changed.gone.insert((3600, hour));
            }
            tx.prepare_cached(&self.sql.roll_up)
                .and_then(|mut s| s.execute([cutoff]))
                .map_err(|e| e.to_string())?;
            tx.prepare_cached(DELETE_MINUTES)
                .and_then(|mut s| s.execute([cutoff]))
                .map_err(|e| e.to_string())?;
            tx.prepare_cached(DELETE_HOURS)
                .and_then(|mut s| s.execute([now - keep]))
                .map_err(|e| e.to_string())?;
            self.rolled.store(cutoff, std::sync::atomic::Ordering::Relaxed);
        }
        changed
            .written
            .retain(|(span, period)| *span == 60 || *period >= now - i64::from(self.keep_days) * 86_400);
        tx.commit().map_err(|e| e.to_string())?;
        Ok(changed)
    }

    /// The rows of `periods` (span, start), as the store has them now.
    pub fn periods(&self, periods: &std::collections::BTreeSet<(i64, i64)>) -> Result<Vec<Row>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut select = conn.prepare_cached(&self.sql.period).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for (span, period) in periods {
            let rows = select.query_map([span, period], row).map_err(|e| e.to_string())?;
            for found in rows {
                out.extend(found.map_err(|e| e.to_string())?);
            }
        }
        Ok(out)
    }

    /// Every row whose minute or hour ends after `since` (unix seconds).
    pub fn since(&self, since: i64) -> Result<Vec<Row>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut select = conn.prepare_cached(&self.sql.since).map_err(|e| e.to_string())?;
        let rows = select.query_map([since], row).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for found in rows {
            out.extend(found.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }
}

/// A row read back (`SELECT span, period, route, source, tenant, FIELDS...`); `None`
/// for a source this build does not know (a later one's file), left out.
pub fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Row>> {
    let mut figures = Figures::default();
    for (i, value) in figures.0.iter_mut().enumerate() {
        *value = u64::try_from(r.get::<_, i64>(5 + i)?).unwrap_or(0);
    }
    let (span, period, route, source, tenant): (i64, i64, String, String, String) =
        (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
    Ok(Source::parse(&source).map(|source| Row {
        span,
        period,
        route,
        source,
        tenant,
        figures,
    }))
}

/// The statement adding one minute's figures.
fn upsert() -> String {
    let names: Vec<&str> = Field::ALL.iter().map(|f| f.column()).collect();
    let marks = vec!["?"; 5 + FIELDS].join(", ");
    let adds: Vec<String> = names.iter().map(|c| format!("{c} = {c} + excluded.{c}")).collect();
    format!(
        "INSERT INTO usage (span, period, route, source, tenant, {}) VALUES ({marks})
         ON CONFLICT (span, period, route, source, tenant) DO UPDATE SET {}",
        names.join(", "),
        adds.join(", ")
    )
}

/// Adds to `table` the columns of fields a ledger kept by an earlier version lacks
/// (zero in its rows): a ledger's file outlives upgrades.
pub fn add_columns(conn: &Connection, table: &str) -> rusqlite::Result<()> {
    let mut have = std::collections::HashSet::new();
    {
        let mut info = conn.prepare(&format!("PRAGMA table_info({table})"))?;
        let names = info.query_map([], |r| r.get::<_, String>(1))?;
        for name in names {
            have.insert(name?);
        }
    }
    for field in Field::ALL.iter().filter(|f| !have.contains(f.column())) {
        conn.execute_batch(&format!(
            "ALTER TABLE {table} ADD COLUMN {} INTEGER NOT NULL DEFAULT 0",
            field.column()
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn one(minute: i64, tenant: &str, used: u64) -> Pending {
        let mut rows = Pending::default();
        let figures = Figures::default().with(Field::Requests, 1).with(Field::UsedNs, used);
        rows.insert((minute, Arc::from("r"), Source::MicroBatch, tenant.to_owned()), figures);
        rows
    }

    #[test]
    fn adds_rolls_up_and_forgets() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), 2).expect("open");
        let now = 10 * 86_400;
        store.add(&one(now - 120, "a", 5), now).expect("add");
        store.add(&one(now - 120, "a", 7), now).expect("add");
        let rows = store.since(now - 3600).expect("read");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].figures.get(Field::UsedNs), 12);
        assert_eq!(rows[0].figures.get(Field::Requests), 2);
        // Two minutes of an hour more than a day old: one hour row.
        let old = now - 2 * 86_400;
        let hour = old.div_euclid(3600) * 3600;
        store.add(&one(hour + 60, "b", 1), now).expect("add");
        store.add(&one(hour + 120, "b", 2), now).expect("add");
        let rows = store.since(0).expect("read");
        let b: Vec<_> = rows.iter().filter(|r| r.tenant == "b").collect();
        assert_eq!(b.len(), 1, "{rows:?}");
        assert_eq!(b[0].period, hour);
        assert_eq!(b[0].figures.get(Field::UsedNs), 3);
        // Past the retention (2 days here): gone.
        store.add(&one(now - 3 * 86_400, "c", 1), now).expect("add");
        assert!(store.since(0).expect("read").iter().all(|r| r.tenant != "c"));
        // Reopened: still there.
        drop(store);
        let store = Store::open(dir.path(), 2).expect("reopen");
        assert_eq!(store.since(0).expect("read").len(), 2);
    }

    #[test]
    fn a_ledger_kept_before_token_columns_gains_them_and_keeps_its_rows() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let conn = Connection::open(dir.path().join("usage.db")).expect("open");
            conn.execute_batch(
                "CREATE TABLE usage (span INTEGER NOT NULL, period INTEGER NOT NULL, route TEXT NOT NULL,
                     source TEXT NOT NULL, tenant TEXT NOT NULL, requests INTEGER NOT NULL DEFAULT 0,
                     used_ns INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (span, period, route, source, tenant));
                 INSERT INTO usage (span, period, route, source, tenant, requests, used_ns)
                     VALUES (60, 600, 'r', 'micro_batch', 'a', 4, 9);",
            )
            .expect("an old ledger");
        }
        let store = Store::open(dir.path(), 2).expect("open");
        let mut tokens = Pending::default();
        let figures = Figures::default()
            .with(Field::PromptTokens, 30)
            .with(Field::CompletionTokens, 12);
        tokens.insert((600, Arc::from("r"), Source::MicroBatch, "a".to_owned()), figures);
        store.add(&tokens, 700).expect("add");
        let rows = store.since(0).expect("read");
        assert_eq!(rows.len(), 1);
        let f = rows[0].figures;
        assert_eq!((f.get(Field::Requests), f.get(Field::UsedNs)), (4, 9));
        assert_eq!((f.get(Field::PromptTokens), f.get(Field::CompletionTokens)), (30, 12));
    }
}
