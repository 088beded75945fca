//! The token limits' counts in a Redis every replica shares: each check is one Lua
//! script that reads every count a call is held to, and takes from all of them or none,
//! atomically, on Redis's clock; a settlement is another. The arithmetic is the
//! replica's own (`check`, `take` and `given_back` of [`super`]) written
//! again in Lua.
//!
//! Keys are `PREFIX:tok:{ROUTE}:SCOPE:WHAT[:PERIOD]`: the route is the hash tag, so a
//! call's keys are in one slot of a Redis Cluster. A Redis that does not answer within
//! `usage.redis_timeout` is left alone for a second, and the replica holds the limits
//! on its own calls meanwhile (one log line each way).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Left, Limit, Taken, Unit, Window};

/// Reads each count, and takes from them all when every one has enough. ARGV: for
/// each key, its kind (0: a minute's bucket, 1: a period's count), limit, amount, and
/// the period's end (ms). Returns the index of the count that refused (0: none), how
/// long until it has enough (ms), each count's level (as strings), and Redis's now.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local levels, refused, wait = {}, 0, 0
for i = 1, #KEYS do
  local b = (i - 1) * 4
  local kind, cap, asked, e = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if kind == 0 then
    local s = redis.call('HMGET', KEYS[i], 'l', 't')
    local level = cap
    if s[1] then level = math.min(cap, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * cap / 60000) end
    levels[i] = level
    if refused == 0 and asked > level then refused = i; wait = math.ceil((asked - level) * 60000 / cap) end
  else
    local used = tonumber(redis.call('GET', KEYS[i]) or '0')
    levels[i] = used
    if refused == 0 and used + asked > cap then refused = i; wait = e - now end
  end
end
local out = {refused, wait}
for i = 1, #KEYS do
  local b = (i - 1) * 4
  local kind, asked, e = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local level = levels[i]
  if refused == 0 then
    if kind == 0 then
      level = level - asked
      redis.call('HSET', KEYS[i], 'l', tostring(level), 't', tostring(now))
      redis.call('PEXPIRE', KEYS[i], 120000)
    else
      level = level + asked
      redis.call('SET', KEYS[i], tostring(level))
      redis.call('PEXPIREAT', KEYS[i], e + 86400000)
    end
  end
  out[#out + 1] = tostring(level)
end
out[#out + 1] = tostring(now)
return out
";

/// Gives tokens back to each count (takes them, when negative). ARGV: for each key,
/// its kind, limit and the tokens.
const GIVE_BACK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local b = (i - 1) * 3
  local kind, cap, tokens = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  if kind == 0 then
    local s = redis.call('HMGET', KEYS[i], 'l', 't')
    if s[1] then
      local level = math.min(cap, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * cap / 60000)
      redis.call('HSET', KEYS[i], 'l', tostring(math.min(cap, level + tokens)), 't', tostring(now))
    end
  else
    local used = redis.call('GET', KEYS[i])
    if used then redis.call('SET', KEYS[i], tostring(math.max(0, tonumber(used) - tokens)), 'KEEPTTL') end
  end
end
return 1
";

/// A Redis holding every replica's counts.
pub struct Shared {
    conn: ConnectionManager,
    /// `host:port`, for log lines (the URL may hold a password).
    addr: String,
    prefix: String,
    timeout: Duration,
    take: ::redis::Script,
    give_back: ::redis::Script,
    /// Redis is in use.
    up: AtomicBool,
    /// While not in use: until when (unix ms) it is left alone.
    down_until: AtomicI64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("addr", &self.addr).finish()
    }
}

impl Shared {
    /// The Redis at `url` (connected on first use), its keys under `prefix`, each call
    /// waiting at most `timeout`; an error when the URL does not parse.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Shared, String> {
        let client = ::redis::Client::open(url).map_err(|e| format!("usage.redis: {}", e.category()))?;
        let addr = client.get_connection_info().addr().to_string();
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client, settings)
            .map_err(|e| format!("usage.redis ({addr}): {}", e.category()))?;
        Ok(Shared {
            conn,
            addr,
            prefix: prefix.to_owned(),
            timeout,
            take: ::redis::Script::new(TAKE),
            give_back: ::redis::Script::new(GIVE_BACK),
            up: AtomicBool::new(true),
            down_until: AtomicI64::new(0),
        })
    }

    /// Checks and takes `amounts` of `limits` for every replica; `None` when Redis
    /// cannot be asked (the caller holds them on its own counts).
    pub(super) async fn take(&self, limits: &[Limit], amounts: &[u64]) -> Option<Taken> {
        if !self.may_ask() {
            return None;
        }
        let mut invocation = self.take.prepare_invoke();
        for (limit, asked) in limits.iter().zip(amounts) {
            let (kind, end) = kind(limit.window);
            invocation
                .key(self.name(&limit.key))
                .arg(kind)
                .arg(limit.limit)
                .arg(*asked)
                .arg(end);
        }
        let mut conn = self.conn.clone();
        let answer = tokio::time::timeout(self.timeout, invocation.invoke_async::<Vec<String>>(&mut conn)).await;
        let out = match answer {
            Ok(Ok(out)) if out.len() == limits.len() + 3 => out,
            Ok(Ok(out)) => return self.failed(&format!("an answer of {} fields", out.len())),
            Ok(Err(e)) => return self.failed(&e.to_string()),
            Err(_) => return self.failed(&self.late()),
        };
        self.answered();
        let number = |s: &String| s.parse::<f64>().unwrap_or(0.0);
        let refused = out[0].parse::<usize>().unwrap_or(0);
        let wait = number(&out[1]).max(0.0);
        let now = number(&out[out.len() - 1]) as i64;
        let lefts: Vec<Left> = limits
            .iter()
            .zip(&out[2..out.len() - 1])
            .map(|(limit, level)| super::left(limit, number(level), now))
            .collect();
        Some(Taken {
            refused: refused.checked_sub(1),
            lefts,
            retry_after: Duration::from_millis(wait as u64),
        })
    }

    /// Gives `tokens` back to the token limits of `taken` for every replica; false
    /// when Redis cannot be asked.
    pub(super) async fn give_back(&self, taken: &[Limit], tokens: i64) -> bool {
        if !self.may_ask() {
            return false;
        }
        let mut invocation = self.give_back.prepare_invoke();
        for limit in taken.iter().filter(|l| l.unit == Unit::Tokens) {
            invocation
                .key(self.name(&limit.key))
                .arg(kind(limit.window).0)
                .arg(limit.limit)
                .arg(tokens);
        }
        let mut conn = self.conn.clone();
        let failed = match tokio::time::timeout(self.timeout, invocation.invoke_async::<i64>(&mut conn)).await {
            Ok(Ok(_)) => {
                self.answered();
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => self.late(),
        };
        let _: Option<()> = self.failed(&failed);
        false
    }

    /// `key` as Redis keeps it: under the prefix, its route the hash tag.
    fn name(&self, key: &str) -> String {
        let (route, rest) = key.split_once(':').unwrap_or((key, ""));
        format!("{}:tok:{{{route}}}:{rest}", self.prefix)
    }

    fn may_ask(&self) -> bool {
        self.up.load(Ordering::Relaxed) || now_ms() >= self.down_until.load(Ordering::Relaxed)
    }

    fn answered(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!(redis = %self.addr, "the token limits' Redis answers again: limits shared by every replica");
        }
    }

    /// Why a call that did not answer in time failed.
    fn late(&self) -> String {
        format!("no answer within {:?}", self.timeout)
    }

    /// Leaves Redis alone for a second after a call failed `why`: `None`, what a caller
    /// that could not ask it answers.
    fn failed<T>(&self, why: &str) -> Option<T> {
        self.down_until.store(now_ms() + 1000, Ordering::Relaxed);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(redis = %self.addr, error = why,
                "the token limits' Redis cannot be asked: each replica holds them on its own calls meanwhile");
        }
        None
    }
}

/// A window's kind in the scripts (0: a minute's bucket, 1: a period's count) and the
/// period's end (ms).
fn kind(window: Window) -> (u8, i64) {
    match window {
        Window::Minute => (0, 0),
        Window::Period(_, end) => (1, end),
    }
}

fn now_ms() -> i64 {
    super::unix_ms(SystemTime::now())
}
