//! One [`Op`] as one Redis command, and its reply as a [`Reply`] (FlexState §IV-B: each state
//! type on the store's native type).
//!
//! | kind | Redis type | operations |
//! |---|---|---|
//! | value | string | `GET`, `SET .. GET` (refuses other types), compare-and-set in Lua |
//! | counter | string holding an integer | `INCRBY`, `GET`, `SET .. GET` |
//! | list | list | `RPUSH`, `LPOP`, `LLEN`, `LRANGE` |
//! | set | set | `SADD`, `SREM`, `SISMEMBER`, `SCARD`, `SMEMBERS` |
//! | map | hash (+ a sorted set of field deadlines) | Lua scripts that purge expired fields first |
//! | counter-map | hash of integers | `HINCRBY`, `HGET`, `HLEN`, `HGETALL` |
//!
//! Map-field time to live: Redis 7.0 has no `HPEXPIRE`, so each map with a field deadline has a
//! companion sorted set (`~ttl~<key>`, same hash slot) scoring fields by their deadline in
//! milliseconds of the server's clock; every map operation runs as a script that first deletes
//! the fields whose deadline has come. The companion expires with its map (whole-object
//! expiry applies to both) and disappears when its last deadline is purged. Locks are strings `~lock~<key>` holding the owner with a
//! `PX` lease; neither kind of helper key is one of ours, so [`partitions`](crate) never
//! lists them.

use flowstate_state::{Kind, Object, ObjectKey, Op, OpError, Reply};
use redis::{Cmd, Value};

/// Prefix of a map's companion sorted set of field deadlines.
pub(crate) const TTL_PREFIX: &str = "~ttl~";
/// Prefix of a lock's string.
pub(crate) const LOCK_PREFIX: &str = "~lock~";

/// The Redis key of an object: `{instance@core}@nf@Type@id` for an object of one partition,
/// `{nf}@Type@id` for a shared one; any other key as it is. The part in braces is the key's
/// hash tag (Redis Cluster specification, "Hash tags": only it is hashed), so every object
/// of one partition, whatever its NF, shares one hash slot with its helper keys (`~ttl~`,
/// `~lock~`) and with the partition's ownership record (`{stage@p}@cluster@Value@owner`): a
/// fenced batch ([`crate::fenced`]) is one script on one node. A partition's tag is two
/// decimal numbers and `@`, whatever the NF's name holds; a shared object's is its NF.
pub(crate) fn key(key: &ObjectKey) -> Vec<u8> {
    let Some(parts) = key.parse() else {
        return key.as_bytes().to_vec();
    };
    let (kind, id) = (parts.kind.name(), parts.id);
    match parts.partition {
        Some((i, c)) => format!("{{{i}@{c}}}@{}@{kind}@{id}", parts.nf),
        None => format!("{{{}}}@{kind}@{id}", parts.nf),
    }
    .into_bytes()
}

/// A Redis key's hash tag with its braces (`{...}`), when the key starts with one: every key
/// that starts with it is on the same hash slot.
pub(crate) fn tag(key: &[u8]) -> Option<&[u8]> {
    let close = key.iter().position(|&b| b == b'}')?;
    (key.first() == Some(&b'{') && close > 1).then(|| &key[..=close])
}

/// The object key a Redis key names, if it is one of ours ([`key`] of it is `raw`).
pub(crate) fn object(raw: &[u8]) -> Option<ObjectKey> {
    let text = std::str::from_utf8(raw).ok()?;
    let rest = text.strip_prefix('{')?;
    let ours = |k: String| ObjectKey::from_raw(&k).filter(|k| key(k) == raw);
    // A partition's: the tag `I@C`, then `@nf@Type@id` (an NF's name holds no `@`).
    if let Some((tag, tail)) = rest.split_once("}@") {
        if let (Some((i, c)), Some((nf, tail))) = (tag.split_once('@'), tail.split_once('@')) {
            if let Some(k) = ours(format!("{nf}@{i}@{c}@{tail}")) {
                return Some(k);
            }
        }
    }
    // A shared one: the NF may itself hold `}`: the split that encodes back to `raw`.
    rest.match_indices('}')
        .find_map(|(at, _)| ours(format!("{}{}", &rest[..at], &rest[at + 1..])))
}

/// The `SCAN MATCH` pattern that finds every partition of an object, `{I@C}@nf@Type@id` and
/// `{nf}@Type@id` (a superset: callers filter with [`object`]).
pub(crate) fn pattern(nf: &str, kind: Kind, id: &str) -> Vec<u8> {
    format!(
        "\\{{*{}*@{}@{}",
        glob_escape(nf),
        kind.name(),
        glob_escape(id)
    )
    .into_bytes()
}

/// `s` with Redis glob metacharacters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

fn prefixed(prefix: &str, key: &[u8]) -> Vec<u8> {
    let mut k = prefix.as_bytes().to_vec();
    k.extend_from_slice(key);
    k
}

/// Deletes the fields of map `KEYS[1]` whose deadline in `KEYS[2]` has come.
const PURGE: &str = r"
local function purge(k, t)
  if redis.call('EXISTS', t) == 0 then return end
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local gone = redis.call('ZRANGEBYSCORE', t, '-inf', now)
  for _, f in ipairs(gone) do redis.call('HDEL', k, f) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', t, '-inf', now) end
end
purge(KEYS[1], KEYS[2])
";

const DELETE: &str = "local n = redis.call('DEL', KEYS[1]) redis.call('DEL', KEYS[2]) return n";
const MAP_GET: &str = "return redis.call('HGET', KEYS[1], ARGV[1])";
const MAP_SET: &str = "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) \
     if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('ZREM', KEYS[2], ARGV[1]) end return 1";
const MAP_DELETE: &str = "local n = redis.call('HDEL', KEYS[1], ARGV[1]) \
     if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('ZREM', KEYS[2], ARGV[1]) end return n";
const MAP_LEN: &str = "return redis.call('HLEN', KEYS[1])";
const MAP_ALL: &str = "return redis.call('HGETALL', KEYS[1])";
const FIELD_EXPIRE: &str = r"
local ty = redis.call('TYPE', KEYS[1])['ok']
if ty ~= 'hash' and ty ~= 'none' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then redis.call('PEXPIRE', KEYS[2], left) end
return 1
";
/// Whole-object expiry; a map's deadlines go with it.
const EXPIRE: &str = "local n = redis.call('PEXPIRE', KEYS[1], ARGV[1]) \
     if n == 1 and redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end \
     return n";
const CAS: &str = r"
local ty = redis.call('TYPE', KEYS[1])['ok']
if ty ~= 'string' and ty ~= 'none' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if cur == false or cur ~= ARGV[2] then return 0 end
elseif cur ~= false then return 0 end
if ARGV[3] == '1' then redis.call('SET', KEYS[1], ARGV[4]) else redis.call('DEL', KEYS[1]) end
return 1
";
const LOCK: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";
const UNLOCK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('DEL', KEYS[1]) return 1 end return 0";

/// The scripts [`command`] runs, by name: with `EVAL`, or as functions of the fenced batch's
/// script ([`crate::fenced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    Delete,
    MapGet,
    MapSet,
    MapDelete,
    MapLen,
    MapAll,
    FieldExpire,
    Expire,
    Cas,
    Lock,
    Unlock,
}

impl Script {
    /// Every script, in the order of its variants.
    pub(crate) const ALL: [Script; 11] = [
        Script::Delete,
        Script::MapGet,
        Script::MapSet,
        Script::MapDelete,
        Script::MapLen,
        Script::MapAll,
        Script::FieldExpire,
        Script::Expire,
        Script::Cas,
        Script::Lock,
        Script::Unlock,
    ];

    /// Its name: a Lua identifier in lower case (the commands of [`command`] are in upper
    /// case: the fenced script tells a function from a command by it).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Script::Delete => "delete",
            Script::MapGet => "map_get",
            Script::MapSet => "map_set",
            Script::MapDelete => "map_delete",
            Script::MapLen => "map_len",
            Script::MapAll => "map_all",
            Script::FieldExpire => "field_expire",
            Script::Expire => "expire",
            Script::Cas => "cas",
            Script::Lock => "lock",
            Script::Unlock => "unlock",
        }
    }

    /// Its body, and whether expired map fields are purged first ([`PURGE`]).
    fn body(self) -> (&'static str, bool) {
        match self {
            Script::Delete => (DELETE, false),
            Script::MapGet => (MAP_GET, true),
            Script::MapSet => (MAP_SET, false),
            Script::MapDelete => (MAP_DELETE, true),
            Script::MapLen => (MAP_LEN, true),
            Script::MapAll => (MAP_ALL, true),
            Script::FieldExpire => (FIELD_EXPIRE, true),
            Script::Expire => (EXPIRE, false),
            Script::Cas => (CAS, false),
            Script::Lock => (LOCK, false),
            Script::Unlock => (UNLOCK, false),
        }
    }

    /// Its whole text (`KEYS[1..]`, `ARGV[1..]`).
    pub(crate) fn text(self) -> &'static str {
        static TEXTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
            Script::ALL
                .iter()
                .map(|s| match s.body() {
                    (body, true) => format!("{PURGE}{body}"),
                    (body, false) => body.to_owned(),
                })
                .collect()
        });
        &TEXTS[self as usize]
    }
}

/// A script run with `EVAL` (Redis caches it by its digest; no `SCRIPT LOAD` state to lose
/// when a server restarts or a slot moves).
fn eval(script: Script, keys: &[&[u8]], args: &[&[u8]]) -> Call {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.text()).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    Call {
        cmd,
        script: Some(script),
    }
}

/// The command that performs one operation.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// A Redis command whose first argument is the object's key, or `EVAL` of `script`.
    pub(crate) cmd: Cmd,
    /// The script `cmd` runs, if it is one.
    pub(crate) script: Option<Script>,
}

impl From<Cmd> for Call {
    fn from(cmd: Cmd) -> Call {
        Call { cmd, script: None }
    }
}

/// A [`Call`] taken apart: the command's (or script's) name, its keys and its arguments.
pub(crate) struct Parts<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) keys: Vec<&'a [u8]>,
    pub(crate) args: Vec<&'a [u8]>,
}

impl Call {
    /// Its name, keys and arguments.
    pub(crate) fn parts(&self) -> Parts<'_> {
        let mut words = self.cmd.args_iter().filter_map(|a| match a {
            redis::Arg::Simple(w) => Some(w),
            _ => None,
        });
        let name = words.next().unwrap_or_default();
        let (name, keys) = match self.script {
            // EVAL, the text, the number of keys, the keys.
            Some(script) => {
                let n = words
                    .nth(1)
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                    .unwrap_or(0);
                (script.name().as_bytes(), words.by_ref().take(n).collect())
            }
            None => (name, words.next().into_iter().collect()),
        };
        Parts {
            name,
            keys,
            args: words.collect(),
        }
    }
}

/// Whole milliseconds, rounded up: a time to live never ends early.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The command that performs `op`, or the reply when no command is needed.
pub(crate) fn command(op: &Op) -> Result<Call, Reply> {
    let redis_key = key(op.key());
    let k = redis_key.as_slice();
    let ttl_key = || prefixed(TTL_PREFIX, k);
    let one = |name: &str| {
        let mut c = redis::cmd(name);
        c.arg(k);
        c
    };
    let with = |name: &str, a: &[u8]| {
        let mut c = one(name);
        c.arg(a);
        c
    };
    Ok(match op {
        Op::Get { .. } | Op::GetCounter { .. } => one("GET").into(),
        Op::Set { value, .. } => {
            let mut c = with("SET", value);
            c.arg("GET");
            c.into()
        }
        Op::SetCounter { value, .. } => {
            let mut c = with("SET", value.to_string().as_bytes());
            c.arg("GET");
            c.into()
        }
        Op::Delete { .. } => eval(Script::Delete, &[k, &ttl_key()], &[]),
        Op::Add { delta, .. } => with("INCRBY", delta.to_string().as_bytes()).into(),
        Op::Push { item, .. } => with("RPUSH", item).into(),
        Op::Pop { .. } => one("LPOP").into(),
        Op::Insert { member, .. } => with("SADD", member).into(),
        Op::Remove { member, .. } => with("SREM", member).into(),
        Op::Contains { member, .. } => with("SISMEMBER", member).into(),
        Op::MapGet { field, .. } => eval(Script::MapGet, &[k, &ttl_key()], &[field]),
        Op::MapSet { field, value, .. } => eval(Script::MapSet, &[k, &ttl_key()], &[field, value]),
        Op::MapDelete { field, .. } => eval(Script::MapDelete, &[k, &ttl_key()], &[field]),
        Op::MapAdd { field, delta, .. } => {
            let mut c = with("HINCRBY", field);
            c.arg(delta.to_string());
            c.into()
        }
        Op::MapGetCounter { field, .. } => with("HGET", field).into(),
        Op::CompareAndSet { expected, new, .. } => {
            let flag = |o: &Option<Vec<u8>>| if o.is_some() { b"1" } else { b"0" };
            let empty: &[u8] = b"";
            eval(
                Script::Cas,
                &[k],
                &[
                    flag(expected),
                    expected.as_deref().unwrap_or(empty),
                    flag(new),
                    new.as_deref().unwrap_or(empty),
                ],
            )
        }
        Op::Expire {
            field: None, ttl, ..
        } => eval(
            Script::Expire,
            &[k, &ttl_key()],
            &[millis(*ttl).to_string().as_bytes()],
        ),
        Op::Expire {
            field: Some(field),
            ttl,
            ..
        } => eval(
            Script::FieldExpire,
            &[k, &ttl_key()],
            &[field, millis(*ttl).to_string().as_bytes()],
        ),
        Op::Len { kind, .. } => match kind {
            Kind::List => one("LLEN").into(),
            Kind::Set => one("SCARD").into(),
            Kind::Map => eval(Script::MapLen, &[k, &ttl_key()], &[]),
            Kind::CounterMap => one("HLEN").into(),
            Kind::Value | Kind::Counter => {
                return Err(Reply::Error(OpError::Refused(format!(
                    "{}: Len needs a collection kind, not {}",
                    op.key(),
                    kind.name()
                ))))
            }
        },
        Op::ReadAll { kind, .. } => match kind {
            Kind::Value | Kind::Counter => one("GET").into(),
            Kind::List => {
                let mut c = one("LRANGE");
                c.arg(0).arg(-1);
                c.into()
            }
            Kind::Set => one("SMEMBERS").into(),
            Kind::Map => eval(Script::MapAll, &[k, &ttl_key()], &[]),
            Kind::CounterMap => one("HGETALL").into(),
        },
        Op::Lock { owner, lease, .. } => eval(
            Script::Lock,
            &[&prefixed(LOCK_PREFIX, k)],
            &[
                owner.to_string().as_bytes(),
                millis(*lease).max(1).to_string().as_bytes(),
            ],
        ),
        Op::Unlock { owner, .. } => eval(
            Script::Unlock,
            &[&prefixed(LOCK_PREFIX, k)],
            &[owner.to_string().as_bytes()],
        ),
    })
}

/// A server's answer to one command.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// A reply.
    Value(Value),
    /// An error reply: its code (`WRONGTYPE`, `ERR`, `MOVED`, ...) and the rest of its text.
    Error {
        /// First word.
        code: String,
        /// The rest.
        detail: String,
    },
}

/// The kind `op` needs, for a `WRONGTYPE` answer.
pub(crate) fn wanted(op: &Op) -> Kind {
    match op {
        Op::Get { .. } | Op::Set { .. } | Op::CompareAndSet { .. } => Kind::Value,
        Op::Add { .. } | Op::GetCounter { .. } | Op::SetCounter { .. } => Kind::Counter,
        Op::Push { .. } | Op::Pop { .. } => Kind::List,
        Op::Insert { .. } | Op::Remove { .. } | Op::Contains { .. } => Kind::Set,
        Op::MapGet { .. } | Op::MapSet { .. } | Op::MapDelete { .. } | Op::Expire { .. } => {
            Kind::Map
        }
        Op::MapAdd { .. } | Op::MapGetCounter { .. } => Kind::CounterMap,
        Op::Len { kind, .. } | Op::ReadAll { kind, .. } => *kind,
        // Locks and deletes take any key; they never see WRONGTYPE.
        Op::Delete { .. } | Op::Lock { .. } | Op::Unlock { .. } => Kind::Value,
    }
}

/// The kind a Redis `TYPE` answer stands for, given the kind that was wanted (a string is a
/// value or a counter, a hash a map or a counter-map: the one that was not wanted).
pub(crate) fn found(redis_type: &str, wanted: Kind) -> Kind {
    match redis_type {
        "list" => Kind::List,
        "set" => Kind::Set,
        "hash" if wanted == Kind::Map => Kind::CounterMap,
        "hash" => Kind::Map,
        "string" if wanted == Kind::Value => Kind::Counter,
        _ => Kind::Value,
    }
}

fn wrong(op: &Op, found: Kind) -> Reply {
    Reply::Error(OpError::WrongKind {
        key: op.key().to_string(),
        wanted: wanted(op).name(),
        found: found.name(),
    })
}

fn unexpected(op: &Op, v: &Value) -> Reply {
    let mut shown = format!("{v:?}");
    shown.truncate(200);
    Reply::Error(OpError::Refused(format!(
        "{}: unexpected reply from Redis: {shown}",
        op.key()
    )))
}

fn bytes(v: Value) -> Result<Option<Vec<u8>>, Value> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        Value::Okay => Ok(Some(b"OK".to_vec())),
        other => Err(other),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn parse_int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A flat array of byte strings.
fn items(v: Value) -> Result<Vec<Vec<u8>>, Value> {
    match v {
        Value::Array(a) | Value::Set(a) => {
            let mut out = Vec::with_capacity(a.len());
            for x in a {
                match x {
                    Value::BulkString(b) => out.push(b),
                    other => return Err(other),
                }
            }
            Ok(out)
        }
        Value::Nil => Ok(Vec::new()),
        other => Err(other),
    }
}

/// A map field and its value.
type Field = (Vec<u8>, Vec<u8>);

/// Field/value pairs from an `HGETALL` reply (RESP2 array or RESP3 map), sorted by field.
fn pairs(v: Value) -> Result<Vec<Field>, Value> {
    let mut out = match v {
        Value::Map(m) => {
            let mut out = Vec::with_capacity(m.len());
            for (f, x) in m {
                match (f, x) {
                    (Value::BulkString(f), Value::BulkString(x)) => out.push((f, x)),
                    (f, _) => return Err(f),
                }
            }
            out
        }
        other => {
            let flat = items(other)?;
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(f), Some(x)) = (it.next(), it.next()) {
                out.push((f, x));
            }
            out
        }
    };
    out.sort();
    Ok(out)
}

/// The [`Reply`] to `op` from Redis's answer. `WRONGTYPE` answers become
/// [`OpError::WrongKind`] with `found` the kind `found_type` (Redis `TYPE`) stands for.
pub(crate) fn reply(op: &Op, answer: Answer, found_type: Option<&str>) -> Reply {
    let v = match answer {
        Answer::Value(v) => v,
        Answer::Error { code, detail } => {
            if code == "WRONGTYPE" || detail.contains("WRONGTYPE") {
                let w = wanted(op);
                return wrong(op, found(found_type.unwrap_or("string"), w));
            }
            // A hash field or a string that is not a number under a counter op: the object
            // is a map or a value.
            if detail.contains("hash value is not an integer") {
                return wrong(op, Kind::Map);
            }
            if detail.contains("value is not an integer") {
                return wrong(op, Kind::Value);
            }
            return Reply::Error(OpError::Refused(format!(
                "{}: Redis refused {}: {code} {detail}",
                op.key(),
                op_name(op)
            )));
        }
    };
    let shown = v.clone();
    let bad = |_: Value| unexpected(op, &shown);
    match op {
        Op::Get { .. } | Op::Pop { .. } | Op::MapGet { .. } => match bytes(v) {
            Ok(b) => Reply::Value(b),
            Err(v) => bad(v),
        },
        Op::Set { .. } | Op::SetCounter { .. } | Op::MapSet { .. } => Reply::Done,
        Op::GetCounter { .. } | Op::MapGetCounter { .. } => match bytes(v) {
            Ok(None) => Reply::Int(0),
            Ok(Some(b)) => match parse_int(&b) {
                Some(n) => Reply::Int(n),
                None if matches!(op, Op::GetCounter { .. }) => wrong(op, Kind::Value),
                None => wrong(op, Kind::Map),
            },
            Err(v) => bad(v),
        },
        Op::Add { .. } | Op::MapAdd { .. } => match int(&v) {
            Some(n) => Reply::Int(n),
            None => bad(v),
        },
        Op::Push { .. } | Op::Len { .. } => match int(&v).and_then(|n| u64::try_from(n).ok()) {
            Some(n) => Reply::Len(n),
            None => bad(v),
        },
        Op::Delete { .. }
        | Op::Insert { .. }
        | Op::Remove { .. }
        | Op::Contains { .. }
        | Op::MapDelete { .. }
        | Op::CompareAndSet { .. }
        | Op::Expire { .. }
        | Op::Lock { .. }
        | Op::Unlock { .. } => match v {
            Value::Int(n) => Reply::Bool(n > 0),
            Value::Boolean(b) => Reply::Bool(b),
            other => bad(other),
        },
        Op::ReadAll { kind, .. } => read_all(op, *kind, v),
    }
}

fn read_all(op: &Op, kind: Kind, v: Value) -> Reply {
    let shown = v.clone();
    let bad = || unexpected(op, &shown);
    let object = match kind {
        Kind::Value => match bytes(v) {
            Ok(b) => b.map(Object::Value),
            Err(_) => return bad(),
        },
        Kind::Counter => match bytes(v) {
            Ok(None) => None,
            Ok(Some(b)) => match parse_int(&b) {
                Some(n) => Some(Object::Counter(n)),
                None => return wrong(op, Kind::Value),
            },
            Err(_) => return bad(),
        },
        Kind::List => match items(v) {
            Ok(l) => (!l.is_empty()).then_some(Object::List(l)),
            Err(_) => return bad(),
        },
        Kind::Set => match items(v) {
            Ok(mut s) => {
                s.sort();
                (!s.is_empty()).then_some(Object::Set(s))
            }
            Err(_) => return bad(),
        },
        Kind::Map => match pairs(v) {
            Ok(m) => (!m.is_empty()).then_some(Object::Map(m)),
            Err(_) => return bad(),
        },
        Kind::CounterMap => match pairs(v) {
            Ok(m) => {
                let mut out = Vec::with_capacity(m.len());
                for (f, x) in m {
                    match parse_int(&x) {
                        Some(n) => out.push((f, n)),
                        None => return wrong(op, Kind::Map),
                    }
                }
                (!out.is_empty()).then_some(Object::CounterMap(out))
            }
            Err(_) => return bad(),
        },
    };
    Reply::Object(object)
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Get { .. } => "Get",
        Op::Set { .. } => "Set",
        Op::Delete { .. } => "Delete",
        Op::Add { .. } => "Add",
        Op::GetCounter { .. } => "GetCounter",
        Op::SetCounter { .. } => "SetCounter",
        Op::Push { .. } => "Push",
        Op::Pop { .. } => "Pop",
        Op::Insert { .. } => "Insert",
        Op::Remove { .. } => "Remove",
        Op::Contains { .. } => "Contains",
        Op::MapGet { .. } => "MapGet",
        Op::MapSet { .. } => "MapSet",
        Op::MapDelete { .. } => "MapDelete",
        Op::MapAdd { .. } => "MapAdd",
        Op::MapGetCounter { .. } => "MapGetCounter",
        Op::CompareAndSet { .. } => "CompareAndSet",
        Op::Expire { .. } => "Expire",
        Op::Len { .. } => "Len",
        Op::ReadAll { .. } => "ReadAll",
        Op::Lock { .. } => "Lock",
        Op::Unlock { .. } => "Unlock",
    }
}

/// CRC16/XMODEM of a key's hash tag modulo 16384: the Redis Cluster slot (Redis Cluster
/// specification, "Keys distribution model").
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::Owner;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag does not count; only the first tag does.
        assert_eq!(slot(b"foo{}{bar}"), 8363);
        assert_eq!(slot(b"{}x"), 10595);
        assert_eq!(slot(b"foo{bar}{zap}"), 5061);
        assert_eq!(slot(b"{nat@1@3}@Map@flows"), 6239);
        assert_eq!(slot(b"{1@3}@nat@Map@flows"), 14697);
        assert_eq!(slot(b"~ttl~{1@3}@nat@Map@flows"), 14697);
    }

    #[test]
    fn a_partitions_keys_share_a_slot_whatever_the_nf() {
        let o = Owner::new("nat", 1, 3);
        let a = ObjectKey::partitioned(&o, Kind::Map, "flows");
        let b = ObjectKey::partitioned(&o, Kind::Counter, "bytes@x");
        let record = ObjectKey::partitioned(&Owner::new("cluster", 1, 3), Kind::Value, "owner");
        let odd = ObjectKey::partitioned(&Owner::new("n}f{", 1, 3), Kind::Map, "}@x");
        let (ka, kb) = (key(&a), key(&b));
        assert_eq!(ka, b"{1@3}@nat@Map@flows");
        assert_eq!(key(&record), b"{1@3}@cluster@Value@owner");
        assert_eq!(key(&odd), b"{1@3}@n}f{@Map@}@x");
        for k in [&kb, &key(&record), &key(&odd), &prefixed(TTL_PREFIX, &ka)] {
            assert_eq!(slot(k), slot(&ka), "{}", String::from_utf8_lossy(k));
        }
        assert_eq!(object(&kb), Some(b));
        assert_eq!(object(&key(&odd)), Some(odd));
        let s = ObjectKey::shared("nat", Kind::Set, "p}o{ol");
        assert_eq!(key(&s), b"{nat}@Set@p}o{ol");
        assert_eq!(object(&key(&s)), Some(s));
        let s = ObjectKey::shared("n}f", Kind::Value, "@1@2}@x");
        assert_eq!(object(&key(&s)), Some(s));
        // Another partition: another tag.
        let other = ObjectKey::partitioned(&Owner::new("nat", 1, 4), Kind::Map, "flows");
        assert_eq!(key(&other), b"{1@4}@nat@Map@flows");
        // Helper keys and others' keys are never an NF's objects.
        for raw in [
            &b"~lock~{nat}@Set@x"[..],
            b"~ttl~{1@3}@nat@Map@flows",
            b"nat@1@3@Map@flows",
            b"{01@3}@nat@Map@flows",
            b"{1@3}nat@Map@flows",
            b"{x}",
        ] {
            assert_eq!(object(raw), None, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn scripts_are_listed_in_order_under_lower_case_names() {
        for (i, s) in Script::ALL.into_iter().enumerate() {
            assert_eq!(s as usize, i);
            assert!(s
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert!(s.text().contains("KEYS[1]"), "{s:?}");
        }
    }

    #[test]
    fn times_round_up_to_whole_milliseconds() {
        use std::time::Duration;
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(150)), 150);
        assert_eq!(millis(Duration::from_micros(150_001)), 151);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(
            pattern("n*", Kind::Counter, "a[b]?"),
            b"\\{*n\\**@Counter@a\\[b\\]\\?"
        );
        assert_eq!(pattern("n", Kind::Map, "x"), b"\\{*n*@Map@x");
    }

    #[test]
    fn wrongtype_names_the_other_kind() {
        let k = ObjectKey::shared("n", Kind::Value, "v");
        let op = Op::Push {
            key: k.clone(),
            item: vec![],
        };
        let e = Answer::Error {
            code: "WRONGTYPE".into(),
            detail: "Operation against a key holding the wrong kind of value".into(),
        };
        assert_eq!(
            reply(&op, e, Some("hash")),
            Reply::Error(OpError::WrongKind {
                key: k.to_string(),
                wanted: "List",
                found: "Map"
            })
        );
        let add = Op::Add { key: k, delta: 1 };
        let e = Answer::Error {
            code: "ERR".into(),
            detail: "value is not an integer or out of range".into(),
        };
        assert!(matches!(
            reply(&add, e, None),
            Reply::Error(OpError::WrongKind { found: "Value", .. })
        ));
    }
}
