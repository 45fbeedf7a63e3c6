//! The store's client: a few connections per process and address, kept for reuse; each
//! operation on one connection within one deadline. A failure drops only its own
//! connection (another thread's read goes on). What each operation may read is bounded
//! by what it asked (`resp::Budget`), so a lying server cannot fill memory.

use super::address::Address;
use super::connection::{self, extended, Conn, Late};
pub use super::connection::{MAX_EXTENSION, MIN_BYTES_PER_SECOND};
use super::resp::{Budget, Reply, WireError};
use crate::sync::{lock, Renewable};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A whole operation on a small reply has ten timeouts, at most this long (or three
/// timeouts, when the timeout is set above 2 s for a slow link): a store that trickles its
/// reply costs a node seconds, once (then the level leaves it alone).
pub const MAX_BASE_DEADLINE: Duration = Duration::from_secs(6);
/// A SCAN page's keys, together, and how many.
const SCAN_PAGE: Budget = Budget {
    bulk_bytes: 16 << 20,
    items: 100_000,
};
const KEEP_IDLE: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Values over the bound: never read past one byte over it (`size`: at least this
    /// many bytes).
    #[error("{key}: {size} bytes or more")]
    TooLarge { key: String, size: u64 },
    /// The server said no (an error reply), in Redis's words.
    #[error("{0}")]
    Server(String),
    #[error("no whole reply within {0} s")]
    Late(String),
    #[error("{0}")]
    Wire(WireError),
    #[error("{0}")]
    Setting(String),
}

impl StoreError {
    /// A name for the kind of failure, as redis-py's exception classes say it.
    pub fn name(&self) -> &'static str {
        match self {
            StoreError::TooLarge { .. } => "TooLarge",
            StoreError::Late(_) => "TimeoutError",
            StoreError::Setting(_) => "ConfigError",
            StoreError::Wire(WireError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                "TimeoutError"
            }
            StoreError::Wire(WireError::Io(_) | WireError::Closed) => "ConnectionError",
            StoreError::Wire(_) => "InvalidResponse",
            StoreError::Server(m) => match m.split(' ').next().unwrap_or("") {
                "OOM" => "OutOfMemoryError",
                "NOAUTH" | "WRONGPASS" => "AuthenticationError",
                "NOPERM" => "NoPermissionError",
                "READONLY" => "ReadOnlyError",
                _ => "ResponseError",
            },
        }
    }

    /// A reply about the key, not the store: a value of another type.
    pub fn about_the_key(&self) -> bool {
        matches!(self, StoreError::Server(m) if m.starts_with("WRONGTYPE"))
    }
}

/// Seconds as people write them: `3`, `0.5`.
pub fn seconds_text(d: Duration) -> String {
    let text = format!("{:.3}", d.as_secs_f64());
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub struct Client {
    address: Address,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Connect, and each read or write without progress.
    step: Duration,
    /// A whole operation on small replies.
    base: Duration,
    idle: Mutex<Vec<Conn>>,
}

fn forget_after_fork() {
    CLIENTS.renew();
}

/// A kept connection that failed this way was closed by the server while idle.
fn stale(e: &WireError) -> bool {
    use std::io::ErrorKind::*;
    match e {
        WireError::Closed => true,
        WireError::Io(io) => {
            matches!(
                io.kind(),
                ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof
            )
        }
        _ => false,
    }
}

/// Clients by address and timeout (in nanoseconds).
type Clients = HashMap<(String, u64), Arc<Client>>;

static CLIENTS: Renewable<Mutex<Clients>> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_after_fork);

/// This process's client of `url` with `timeout` (made once).
pub fn client(url: &str, timeout: Duration) -> Result<Arc<Client>, StoreError> {
    let id = (url.to_string(), timeout.as_nanos() as u64);
    if let Some(found) = lock(CLIENTS.get()).get(&id) {
        return Ok(found.clone());
    }
    let address = Address::parse(url).map_err(StoreError::Setting)?;
    let tls = match &address.tls {
        Some(t) => Some(connection::tls_config(t).map_err(StoreError::Setting)?),
        None => None,
    };
    let step = address.timeout.unwrap_or(timeout);
    let made = Arc::new(Client {
        address,
        tls,
        step,
        base: (step * 10).min(MAX_BASE_DEADLINE.max(step * 3)),
        idle: Mutex::new(Vec::new()),
    });
    Ok(lock(CLIENTS.get()).entry(id).or_insert(made).clone())
}

/// Every client this process made is dropped (tests start each case afresh).
pub fn forget_clients() {
    lock(CLIENTS.get()).clear();
}

impl Client {
    /// `work` on a connection within a deadline `base` from now (it may move it); the
    /// connection is kept for reuse only when the work ended in step with the server.
    fn with_conn<T>(
        &self,
        work: impl Fn(&mut Conn, Instant) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.base;
        if let Some(mut conn) = self.kept() {
            match self.run_on(&mut conn, deadline, &work) {
                // The server closed it since (its idle timeout, a restart): not the store
                // failing. Once more on a new connection (every operation may run twice).
                Err(StoreError::Wire(e)) if stale(&e) => {}
                result => return self.done(conn, result),
            }
        }
        let mut conn = connection::open(&self.address, self.tls.as_ref(), deadline, self.step)
            .map_err(|e| self.wire(e))?;
        let result = self.run_on(&mut conn, deadline, &work);
        self.done(conn, result)
    }

    /// A kept connection of this process that is still open, if any.
    fn kept(&self) -> Option<Conn> {
        let pid = std::process::id();
        let mut idle = lock(&self.idle);
        idle.retain(|c| c.pid == pid);
        while let Some(mut c) = idle.pop() {
            if c.alive() {
                return Some(c);
            }
        }
        None
    }

    /// `result` of work on `conn`, whose connection is kept for reuse only when the work
    /// ended in step with the server (a read refused as too large stopped mid-reply); a
    /// failure closes only this connection.
    fn done<T>(&self, conn: Conn, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Ok(_) | Err(StoreError::Server(_)) = &result {
            let mut idle = lock(&self.idle);
            if idle.len() < KEEP_IDLE {
                idle.push(conn);
            }
        }
        result.map_err(|e| match e {
            StoreError::Wire(w) => self.wire(w),
            other => other,
        })
    }

    fn run_on<T>(
        &self,
        conn: &mut Conn,
        deadline: Instant,
        work: &impl Fn(&mut Conn, Instant) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        conn.set_deadline(deadline);
        work(conn, deadline)
    }

    /// A wire error said as what it is: past the whole deadline, or not.
    fn wire(&self, e: WireError) -> StoreError {
        if let WireError::Io(io) = &e {
            if io.get_ref().is_some_and(|inner| inner.is::<Late>()) {
                return StoreError::Late(seconds_text(self.base));
            }
        }
        StoreError::Wire(e)
    }

    fn run(
        conn: &mut Conn,
        commands: &[Vec<&[u8]>],
        budget: Budget,
    ) -> Result<Vec<Reply>, StoreError> {
        let replies = conn.pipeline(commands, budget).map_err(StoreError::Wire)?;
        for r in &replies {
            if let Reply::Error(e) = r {
                return Err(StoreError::Server(e.clone()));
            }
        }
        Ok(replies)
    }

    /// The values at `keys` (None where absent or empty), in one round trip: each key's
    /// value read whole by one command (`GETRANGE` to one byte past the bound, a read
    /// permission enough), so a value replaced meanwhile is read old or new, never torn.
    /// `TooLarge` when together over `max_bytes`, said by the bulk's header before any of
    /// its bytes are taken (the connection is then dropped, mid-reply); a header that says
    /// more than a range of the bound can hold is the server's error. `all_or_none`: when
    /// one is absent, none is returned.
    pub fn read(
        &self,
        keys: &[&[u8]],
        max_bytes: u64,
        all_or_none: bool,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        // Redis reads the range's end as a signed number: a larger bound is every value.
        let end = max_bytes.min(i64::MAX as u64).to_string();
        let asks: Vec<Vec<&[u8]>> = keys
            .iter()
            .map(|k| vec![&b"GETRANGE"[..], k, b"0", end.as_bytes()])
            .collect();
        let too_large = |size: u64| StoreError::TooLarge {
            key: match keys {
                [one] => String::from_utf8_lossy(one).into_owned(),
                _ => format!("{} keys", keys.len()),
            },
            size,
        };
        let bad = |what: &str| StoreError::Wire(WireError::Protocol(what.to_string()));
        let values = self.with_conn(|conn, _| {
            conn.send(&asks).map_err(StoreError::Wire)?;
            let (mut values, mut total, mut refused) = (Vec::new(), 0u64, None);
            for _ in keys {
                let mut budget = Budget {
                    bulk_bytes: max_bytes - total,
                    items: 0,
                };
                match conn.reader.reply(&mut budget) {
                    Ok(Reply::Bulk(v)) => {
                        total = total.saturating_add(v.len() as u64);
                        values.push(Some(v).filter(|v| !v.is_empty()));
                    }
                    // Read on, so that the connection stays in step.
                    Ok(Reply::Error(e)) => {
                        refused.get_or_insert(e);
                        values.push(None);
                    }
                    Ok(_) => return Err(bad("the store answered something other than values")),
                    // More than is left, no more than a range of the bound holds: over it.
                    Err(WireError::BulkOverBound(n)) if n <= max_bytes.saturating_add(1) => {
                        return Err(too_large(total.saturating_add(n)));
                    }
                    Err(e) => return Err(StoreError::Wire(e)),
                }
            }
            if conn.reader.pending() > 0 {
                return Err(bad("more replies than commands"));
            }
            match refused {
                Some(e) => Err(StoreError::Server(e)),
                None => Ok(values),
            }
        })?;
        if all_or_none && values.iter().any(Option::is_none) {
            return Ok(vec![None; keys.len()]);
        }
        Ok(values)
    }

    /// `value` at `key`, living `ttl_seconds` (0: for ever).
    pub fn set(&self, key: &[u8], value: &[u8], ttl_seconds: u64) -> Result<(), StoreError> {
        let ttl = ttl_seconds.to_string();
        let mut set: Vec<&[u8]> = vec![b"SET", key, value];
        if ttl_seconds > 0 {
            set.extend([&b"EX"[..], ttl.as_bytes()]);
        }
        self.with_conn(|conn, deadline| {
            // Writing a large value takes time too.
            conn.set_deadline(extended(deadline, value.len() as u64));
            Self::run(conn, std::slice::from_ref(&set), Budget::SMALL).map(|_| ())
        })
    }

    /// One page of the keys matching `pattern` from `cursor`: the next cursor (0: done)
    /// and the keys.
    pub fn scan(&self, cursor: u64, pattern: &[u8]) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
        let at = cursor.to_string();
        let ask: Vec<&[u8]> = vec![b"SCAN", at.as_bytes(), b"MATCH", pattern, b"COUNT", b"256"];
        let bad = || StoreError::Wire(WireError::Protocol("not a SCAN reply".into()));
        self.with_conn(|conn, _| {
            let mut replies = Self::run(conn, std::slice::from_ref(&ask), SCAN_PAGE)?;
            let Some(Reply::Array(mut parts)) = replies.pop() else {
                return Err(bad());
            };
            let (Some(Reply::Array(keys)), Some(Reply::Bulk(next))) = (parts.pop(), parts.pop())
            else {
                return Err(bad());
            };
            let next = std::str::from_utf8(&next)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(bad)?;
            let keys = keys
                .into_iter()
                .map(|k| match k {
                    Reply::Bulk(k) => Ok(k),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((next, keys))
        })
    }

    /// Remove `key` only while it still holds `value` (a node may have published a good
    /// entry there meanwhile), or (`value` None) while it holds something other than a
    /// string (never one of ours); true when removed.
    pub fn delete_if_unchanged(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        const SCRIPT: &[u8] = b"if redis.call('GET', KEYS[1]) == ARGV[1] then \
            return redis.call('DEL', KEYS[1]) else return 0 end";
        const NOT_A_STRING: &[u8] = b"if redis.call('TYPE', KEYS[1]).ok ~= 'string' then \
            return redis.call('DEL', KEYS[1]) else return 0 end";
        let ask: Vec<&[u8]> = match value {
            Some(v) => vec![b"EVAL", SCRIPT, b"1", key, v],
            None => vec![b"EVAL", NOT_A_STRING, b"1", key],
        };
        self.with_conn(|conn, deadline| {
            conn.set_deadline(extended(deadline, value.map_or(0, |v| v.len() as u64)));
            match Self::run(conn, std::slice::from_ref(&ask), Budget::SMALL)?.pop() {
                Some(Reply::Int(n)) => Ok(n > 0),
                _ => Err(StoreError::Wire(WireError::Protocol("not a count".into()))),
            }
        })
    }

    /// Take the claim at `key` for `token` when nobody holds it (`SET NX`), living
    /// `expiry`, and (`take` false) only look: None when taken, else how many milliseconds
    /// the claim there lives on (`PTTL`: -1 for ever, -2 none).
    pub fn claim(
        &self,
        key: &[u8],
        token: &[u8],
        expiry: Duration,
        take: bool,
    ) -> Result<Option<i64>, StoreError> {
        let ms = expiry.as_millis().max(1).to_string();
        let set: Vec<&[u8]> = vec![b"SET", key, token, b"NX", b"PX", ms.as_bytes()];
        let pttl: Vec<&[u8]> = vec![b"PTTL", key];
        let asks = if take { vec![set, pttl] } else { vec![pttl] };
        let bad = || StoreError::Wire(WireError::Protocol("not a claim's reply".into()));
        self.with_conn(|conn, _| {
            let mut replies = Self::run(conn, &asks, Budget::SMALL)?.into_iter();
            if take {
                match replies.next() {
                    Some(Reply::Status(_)) => return Ok(None),
                    Some(Reply::Nil) => {}
                    _ => return Err(bad()),
                }
            }
            match replies.next() {
                Some(Reply::Int(ms)) => Ok(Some(ms)),
                _ => Err(bad()),
            }
        })
    }

    /// Live `expiry` more from now, the claim at `key` while it is still `token`'s; true
    /// when renewed.
    pub fn renew_claim(
        &self,
        key: &[u8],
        token: &[u8],
        expiry: Duration,
    ) -> Result<bool, StoreError> {
        const SCRIPT: &[u8] = b"if redis.call('GET', KEYS[1]) == ARGV[1] then \
            return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
        let ms = expiry.as_millis().max(1).to_string();
        let ask: Vec<&[u8]> = vec![b"EVAL", SCRIPT, b"1", key, token, ms.as_bytes()];
        self.with_conn(|conn, _| {
            match Self::run(conn, std::slice::from_ref(&ask), Budget::SMALL)?.pop() {
                Some(Reply::Int(n)) => Ok(n > 0),
                _ => Err(StoreError::Wire(WireError::Protocol("not a count".into()))),
            }
        })
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &[u8]) -> Result<bool, StoreError> {
        let ask: Vec<&[u8]> = vec![b"EXISTS", key];
        self.with_conn(|conn, _| {
            match Self::run(conn, std::slice::from_ref(&ask), Budget::SMALL)?.pop() {
                Some(Reply::Int(n)) => Ok(n > 0),
                _ => Err(StoreError::Wire(WireError::Protocol("not a count".into()))),
            }
        })
    }
}
