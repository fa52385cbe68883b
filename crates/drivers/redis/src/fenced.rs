//! Fenced batches ([`Backend::execute_fenced`](flowstate_state::Backend::execute_fenced)): the
//! fence's check and the batch's operations as one Lua script, in one round trip.
//!
//! Promises:
//! * Atomic: Redis runs a script whole, no other client's command between its calls
//!   (Redis documentation, "Scripting with Lua", atomicity). The script reads the fence's key
//!   first; if it does not hold exactly the fence's value (another value, another type, no
//!   key), the script answers the error `FENCED` before any operation ran.
//! * Each operation runs as the plain [`execute`](flowstate_state::Backend::execute) path runs
//!   it: the same command, or the same script of [`ops::Script`] as a Lua function. A failing
//!   call (`WRONGTYPE`, a counter that is not an integer) is caught (`redis.pcall`, Lua's
//!   `pcall`) and becomes that operation's error reply; the others run, in order. The replies
//!   come back as one array, which [`answers`] turns into the same [`Answer`]s, hence the same
//!   [`Reply`](flowstate_state::Reply)s, as the plain path's.
//! * The script's `KEYS` are the fence's key and every key the operations touch (helper keys
//!   included), as Redis Cluster requires of a script: all in one hash slot, the fence's
//!   partition's ([`ops::key`]). The caller chooses which operations go in (`inside`).
//! * Once: a numbered batch ([`Fence::batch`](flowstate_state::Fence::batch)) sets its mark
//!   in the same script: a key on the fence's slot, one per writer (`{tag}@~batch~@` and the
//!   fence's key), holding the fence's value and the number. Sent again (its answer lost with
//!   a connection or a failed-over master), a batch whose mark is there runs nothing and
//!   answers `APPLIED`, even if the fence has moved on since: the mark is checked first, so
//!   `FENCED` means the batch never ran. On Redis Cluster, what a batch left on other slots runs the same way,
//!   without the check: one script per slot, each with its own mark there. Each part of a
//!   batch runs once, however often it is sent; marks are bounded by writers × slots.
//! * It is sent by its SHA-1 (`EVALSHA`); a server that answers `NOSCRIPT` (a restart, a
//!   failover, a node new to the slot: nothing ran) is sent the same call with the script's
//!   text (`EVAL`, [`with_text`]), which cannot answer `NOSCRIPT` and leaves the script cached
//!   for the next `EVALSHA`.
//! * Counters: Lua numbers are doubles, which would round a counter beyond 2^53 on its way back,
//!   so `INCRBY` and `HINCRBY` answer the stored decimal text, read back inside the script.

use crate::ops::{self, Answer, Call};
use flowstate_state::{Op, Reply};
use redis::{Cmd, Value};
use std::sync::LazyLock;

/// The script's check and its table of functions; then each of [`ops::Script`] is added to
/// `S` (see [`SCRIPT`]), then [`COUNTERS`] and [`RUN`].
const CHECK: &str = r"
-- A fenced batch (crates/drivers/redis/src/fenced.rs). KEYS[2] is the batch's mark, ARGV[2]
-- its value ('': none): a batch whose mark is there already ran (its fence held then), and
-- does not run again. KEYS[1] is the fence's key, ARGV[1] the value it must hold, else
-- nothing runs ('': no check, for what a batch whose fence held left).
if ARGV[2] ~= '' and redis.pcall('GET', KEYS[2]) == ARGV[2] then
  return redis.error_reply('APPLIED the batch ran before')
end
if ARGV[1] ~= '' and redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED the fence key does not hold the expected value')
end
if ARGV[2] ~= '' then
  redis.pcall('SET', KEYS[2], ARGV[2])
end
local S = {}
";

/// Counter additions that answer the stored text (exact, unlike a Lua number).
const COUNTERS: &str = r"
S.incrby = function(KEYS, ARGV)
  redis.call('INCRBY', KEYS[1], ARGV[1])
  return redis.call('GET', KEYS[1])
end
S.hincrby = function(KEYS, ARGV)
  redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
  return redis.call('HGET', KEYS[1], ARGV[1])
end
";

/// Runs the operations and answers their replies in order.
const RUN: &str = r"
-- Each operation, in ARGV[3..]: its name (a Redis command, or a function of S), its number
-- of keys (the next ones of KEYS), its number of arguments, its arguments.
local out, k, a, n = {}, 3, 3, #ARGV
while a <= n do
  local name, nk, na = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local r
  if S[name] then
    local ok, e = pcall(S[name], {unpack(KEYS, k, k + nk - 1)}, {unpack(ARGV, a + 3, a + 2 + na)})
    if ok then r = e
    elseif type(e) == 'table' then r = e
    else r = redis.error_reply(tostring(e)) end
  else
    -- A command: its one key, then its arguments.
    r = redis.pcall(name, KEYS[k], unpack(ARGV, a + 3, a + 2 + na))
  end
  -- A nil would end the answer's array here.
  if r == nil then r = false end
  out[#out + 1] = r
  k, a = k + nk, a + 3 + na
end
return out
";

/// The whole script: [`CHECK`], each of [`ops::Script`] as `S.<name>`, [`COUNTERS`], [`RUN`].
static SCRIPT: LazyLock<String> = LazyLock::new(|| {
    let mut s = String::from(CHECK);
    for f in ops::Script::ALL {
        s.push_str(&format!(
            "S.{} = function(KEYS, ARGV)\n{}\nend\n",
            f.name(),
            f.text()
        ));
    }
    s.push_str(COUNTERS);
    s.push_str(RUN);
    s
});

/// The script's SHA-1 in hexadecimal, as `EVALSHA` takes it.
static SHA: LazyLock<String> = LazyLock::new(|| {
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, SCRIPT.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
});

/// The script's digest.
pub(crate) fn sha() -> &'static str {
    &SHA
}

/// `call` (an `EVALSHA` of [`call`]) with the script's text instead of its digest (`EVAL`).
pub(crate) fn with_text(call: &Cmd) -> Cmd {
    let mut c = redis::cmd("EVAL");
    c.arg(SCRIPT.as_str());
    for a in call.args_iter().skip(2) {
        if let redis::Arg::Simple(w) = a {
            c.arg(w);
        }
    }
    c
}

/// The error code of a fence that does not hold.
const FENCED: &str = "FENCED";
/// The error code of a marked batch that ran before.
const APPLIED: &str = "APPLIED";

/// The key marking the batches a writer fenced by `fence_key` (a Redis key) ran on the hash
/// slot of `tag` (`{...}`, a Redis key's hash tag): in that slot, one per writer and slot.
pub(crate) fn mark_key(tag: &[u8], fence_key: &[u8]) -> Vec<u8> {
    let mut k = tag.to_vec();
    k.extend_from_slice(b"@~batch~@");
    k.extend_from_slice(fence_key);
    k
}

/// A mark's value: the fence's value (its writer) and the batch's number.
pub(crate) fn mark_value(fence_value: &[u8], batch: u64) -> Vec<u8> {
    let mut v = fence_value.to_vec();
    v.push(b'#');
    v.extend_from_slice(batch.to_string().as_bytes());
    v
}

/// One fenced call: the `EVALSHA` and the operations it runs.
pub(crate) struct Fenced {
    /// `EVALSHA`.
    pub(crate) cmd: Cmd,
    /// Indexes of the operations it runs, in batch order.
    pub(crate) inside: Vec<usize>,
}

/// The call that checks `fence_key` (a Redis key) holds `value` (no check if empty), then,
/// given a `mark` (key, value), runs nothing if the mark is there already and sets it
/// otherwise, then runs the operations whose calls `inside` accepts (given their keys), in
/// order. Operations without a call (answered without Redis) are never inside.
pub(crate) fn call(
    fence_key: &[u8],
    value: &[u8],
    mark: Option<(&[u8], &[u8])>,
    calls: &[Result<Call, Reply>],
    inside: impl Fn(&[&[u8]]) -> bool,
) -> Fenced {
    let parts: Vec<(usize, ops::Parts<'_>)> = calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((i, c.as_ref().ok()?.parts())))
        .filter(|(_, p)| inside(&p.keys))
        .collect();
    let mut cmd = redis::cmd("EVALSHA");
    let keys: usize = parts.iter().map(|(_, p)| p.keys.len()).sum();
    let (mark_key, mark_value) = mark.unwrap_or((fence_key, b""));
    cmd.arg(sha()).arg(2 + keys).arg(fence_key).arg(mark_key);
    for (_, p) in &parts {
        for k in &p.keys {
            cmd.arg(*k);
        }
    }
    cmd.arg(value).arg(mark_value);
    for (_, p) in &parts {
        let name = match p.name {
            b"INCRBY" => &b"incrby"[..],
            b"HINCRBY" => &b"hincrby"[..],
            other => other,
        };
        cmd.arg(name).arg(p.keys.len()).arg(p.args.len());
        for a in &p.args {
            cmd.arg(*a);
        }
    }
    Fenced {
        cmd,
        inside: parts.into_iter().map(|(i, _)| i).collect(),
    }
}

/// What the script answered.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The fence held: one answer per operation inside, in order.
    Ran(Vec<Answer>),
    /// The fence did not hold; nothing ran.
    Fenced,
    /// The batch's mark was there: it ran before, nothing ran now.
    Applied,
    /// The server does not have the script; nothing ran.
    NoScript,
    /// An answer of the wrong shape.
    Bad(String),
}

/// Reads the script's answer for the operations `inside` of `ops`. An error that is neither
/// `FENCED` nor `NOSCRIPT` (Redis refused the whole script: out of memory, a read-only
/// replica) is every operation's answer, as each command of a plain batch would get it.
pub(crate) fn answers(answer: Answer, ops: &[Op], inside: &[usize]) -> Outcome {
    let values = match answer {
        Answer::Error { code, .. } if code == FENCED => return Outcome::Fenced,
        Answer::Error { code, .. } if code == APPLIED => return Outcome::Applied,
        Answer::Error { code, .. } if code == "NOSCRIPT" => return Outcome::NoScript,
        e @ Answer::Error { .. } => return Outcome::Ran(vec![e; inside.len()]),
        Answer::Value(Value::Array(v)) if v.len() == inside.len() => v,
        Answer::Value(v) => {
            let mut shown = format!("{v:?}");
            shown.truncate(200);
            return Outcome::Bad(format!(
                "a fenced batch of {} operations was answered {shown}",
                inside.len()
            ));
        }
    };
    let exact = |op: &Op, v: Value| match (op, v) {
        // The counters' decimal text (see the module's documentation).
        (Op::Add { .. } | Op::MapAdd { .. }, Value::BulkString(b)) => {
            match std::str::from_utf8(&b).ok().and_then(|t| t.parse().ok()) {
                Some(n) => Value::Int(n),
                None => Value::BulkString(b),
            }
        }
        (_, v) => v,
    };
    Outcome::Ran(
        inside
            .iter()
            .zip(values)
            .map(|(&i, v)| crate::answer(exact(&ops[i], v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::{Kind, ObjectKey, Owner};

    #[test]
    fn a_call_lists_the_fence_then_every_key_then_the_operations() {
        let o = Owner::new("nat", 0, 5);
        let n = ObjectKey::partitioned(&o, Kind::Counter, "n");
        let m = ObjectKey::partitioned(&o, Kind::Map, "m");
        let ops = [
            Op::Add {
                key: n.clone(),
                delta: -3,
            },
            Op::Len {
                key: n.clone(),
                kind: Kind::Value,
            },
            Op::MapGet {
                key: m,
                field: b"f".to_vec(),
            },
        ];
        let calls: Vec<_> = ops.iter().map(ops::command).collect();
        let mark = mark_key(b"{0@5}", b"{0@5}@cluster@Value@owner");
        assert_eq!(mark, b"{0@5}@~batch~@{0@5}@cluster@Value@owner");
        let f = call(
            b"{0@5}@cluster@Value@owner",
            b"id",
            Some((&mark, b"id#7")),
            &calls,
            |_| true,
        );
        // The Len of a value is answered without Redis.
        assert_eq!(f.inside, vec![0, 2]);
        let words: Vec<Vec<u8>> = f
            .cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(w) => Some(w.to_vec()),
                _ => None,
            })
            .collect();
        let text: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        assert_eq!(
            text,
            [
                &b"EVALSHA"[..],
                sha().as_bytes(),
                b"5",
                b"{0@5}@cluster@Value@owner",
                b"{0@5}@~batch~@{0@5}@cluster@Value@owner",
                b"{0@5}@nat@Counter@n",
                b"{0@5}@nat@Map@m",
                b"~ttl~{0@5}@nat@Map@m",
                b"id",
                b"id#7",
                b"incrby",
                b"1",
                b"1",
                b"-3",
                b"map_get",
                b"2",
                b"1",
                b"f",
            ]
        );
        assert_eq!(sha().len(), 40);
        let eval: Vec<Vec<u8>> = with_text(&f.cmd)
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(w) => Some(w.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(eval[0], b"EVAL");
        assert_eq!(eval[1], SCRIPT.as_bytes());
        assert_eq!(eval[2..], words[2..]);
    }

    #[test]
    fn answers_keep_counters_exact_and_name_a_refusal() {
        let n = ObjectKey::shared("nat", Kind::Counter, "n");
        let ops = [
            Op::Add {
                key: n.clone(),
                delta: 1,
            },
            Op::Get { key: n },
        ];
        let big = (i64::MIN + 1).to_string().into_bytes();
        let got = answers(
            Answer::Value(Value::Array(vec![
                Value::BulkString(big),
                Value::BulkString(b"7".to_vec()),
            ])),
            &ops,
            &[0, 1],
        );
        let Outcome::Ran(a) = got else {
            panic!("{got:?}")
        };
        assert!(matches!(a[0], Answer::Value(Value::Int(n)) if n == i64::MIN + 1));
        assert!(matches!(&a[1], Answer::Value(Value::BulkString(b)) if b == b"7"));
        let fenced = Answer::Error {
            code: "FENCED".into(),
            detail: String::new(),
        };
        assert!(matches!(answers(fenced, &ops, &[0]), Outcome::Fenced));
        let short = Answer::Value(Value::Array(vec![]));
        assert!(matches!(answers(short, &ops, &[0]), Outcome::Bad(_)));
    }
}
