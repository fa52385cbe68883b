//! The `redis` and `redis-cluster` state backends: flowstate's state objects on Redis's native
//! types (FlexState §IV-B "Redis": counters with `INCRBY`, maps as hashes, lists, sets; keys
//! `nf@instance@core@Type@id`, §III-B2).
//!
//! Promises:
//! * Both backends pass the [`conformance`](flowstate_state::conformance) suite with
//!   `exact_found_kind: false` (a Redis string stands for values and counters, a hash for maps
//!   and counter-maps).
//! * One [`Backend::execute`] is one pipeline: one round trip to a single server, one per
//!   master touched in a cluster (FlexState §III-A2 batching of store requests). Operations
//!   that must be atomic on the server (compare-and-set, locks with leases, map-field time to
//!   live) run as Lua scripts inside that pipeline.
//! * Keys are `{instance@core}@nf@Type@id` for an object of one partition and `{nf}@Type@id`
//!   for a shared one, on a single server and on a cluster alike (`ops.rs`). The braces are
//!   the Redis Cluster hash tag: every object of one partition, whatever its NF, and the
//!   partition's ownership record (`{stage@p}@cluster@Value@owner`, a cluster instance's
//!   fence) share one hash slot.
//! * Both backends fence ([`Connector::fences`]): [`Backend::execute_fenced`] is one Lua
//!   script (`fenced.rs`) that checks the fence's key and runs the operations only if it holds,
//!   atomically, in one round trip (two for a server that lacks the script: `NOSCRIPT`, then
//!   the script's text); otherwise [`BackendError::Fenced`] and no operation ran. On
//!   a single server every operation of the batch is in the script. On a cluster the script
//!   holds the operations on the fence's hash slot (its partition's objects); the others
//!   (shared objects, another partition's) are sent after it, as [`Backend::execute`] sends
//!   them, only once the fence held: ordered after the check, not atomic with it (as our
//!   store's parts of a fenced batch on other shards are).
//! * **Durable commits** (`wait_replicas = N`, default 0): every pipeline ends with `ROLE` and
//!   `WAIT N` on its server (on a cluster, on each master it touched), so a batch is
//!   acknowledged only once N replicas hold it, and survives its master's loss (the replica
//!   promoted has it; Redis replication is otherwise asynchronous, and a failover loses what
//!   the master acknowledged last). A master that has fewer than N replicas connected (one
//!   promoted in place of a lost master has none until an operator adds one) acknowledges
//!   with those it has, logged once per master, rather than stopping every commit: durability
//!   degrades to what the cluster can give. A `WAIT` that counts fewer replicas than the
//!   master has is asked again until `timeout`; then the batch fails as unreachable though
//!   its master applied it, and it is sent again: its counter additions may count twice (as
//!   after a lost connection).
//! * Time to live uses Redis expiry (`PEXPIRE`); map fields, which Redis 7.0 cannot expire, get
//!   a companion sorted set of deadlines purged by the scripts of every map operation (see
//!   [`ops`]); locks are `~lock~<key>` strings with a `PX` lease.
//! * Errors: `WRONGTYPE` becomes [`OpError::WrongKind`](flowstate_state::OpError) for that
//!   operation alone; a lost connection, a timeout, or a server that refuses every command
//!   for now (`LOADING` after a restart, `BUSY`, `MASTERDOWN`: the batch was not applied)
//!   becomes [`BackendError::Unreachable`] and the next `execute` connects again. Cluster redirections (`MOVED`, `ASK`, `TRYAGAIN`) are
//!   followed: the slot map is refreshed and the redirected operations are sent again, in their
//!   batch order, to the node that now serves them. Map operations are two-key scripts (the
//!   map and its deadlines), which Redis answers `TRYAGAIN` while their slot is half migrated:
//!   they wait for the migration, up to `timeout`, then the batch fails as unreachable.
//! * Redis replies are never trusted: an answer of the wrong shape is an
//!   [`OpError::Refused`](flowstate_state::OpError) naming the key, never a panic.
//!
//! Why `redis-cluster` routes slots itself instead of using the redis crate's cluster client
//! (its `cluster` feature, `ClusterConnection` and `ClusterPipeline`): the state layer's contract
//! for a batch is the driver's, not the client's. Redirected operations are sent again in batch
//! order; `TRYAGAIN`/`CLUSTERDOWN` are waited out within this backend's `timeout`; a lost
//! connection, or a node still not ready (`LOADING`, `BUSY`), fails the whole batch as
//! unreachable, after which every connection is opened afresh so that no late reply is read as the next
//! batch's; `partitions` runs `SCAN` on every master. The crate's client has its own retry
//! count and backoff, and does not allow `SCAN` in a cluster pipeline, so each of these would
//! be an adapter around it. What routing here costs is the slot table from `CLUSTER SLOTS`,
//! `ops::slot` (CRC16, hash tags) and the `MOVED`/`ASK` loop, about 250 lines sharing the
//! single-server backend's pipeline and reply handling, tested against a live slot migration
//! (`tests/cluster_redirects.rs`) and by the conformance suite.
//!
//! Configuration (`[state]`): `backend = "redis"` with `url = "redis://host:port[/db]"`;
//! `backend = "redis-cluster"` with `nodes = ["redis://..", ..]` or a comma-separated `url`.
//! Both take:
//! * `timeout = "2s"`: connect, read and write timeout of every call.
//! * Credentials in the address: `redis://user:password@host:port` authenticates as an ACL
//!   user (`AUTH user password`), `redis://:password@host:port` with the legacy `requirepass`.
//!   `password_file = "/run/secrets/redis"` reads the password from a file instead (its first
//!   line; the address then carries only the user, if any), so that the configuration holds no
//!   secret. Both at once is an error naming `password_file`.
//! * TLS with `rediss://` addresses (all of a cluster's seeds alike): the server's certificate
//!   must chain to `ca_file` (PEM; without it, to the system's roots) and name the host of the
//!   address (an IP address or a DNS name); `cert_file` and `key_file` (PEM, both or neither)
//!   give a client certificate for servers that ask for one (mutual TLS); `tls_skip_verify =
//!   true` accepts any certificate, an explicit opt-in, off by default. A TLS key with a
//!   `redis://` address is an error naming it.
//!
//! On a cluster, every node the driver learns of (`CLUSTER SLOTS`, `MOVED`, `ASK`) is opened
//! with the seeds' TLS settings, user, password and database. The files are read when the
//! settings are (`flowstate check` finds a missing one). [`RedisConnector::check`] and
//! [`RedisClusterConnector::check`] connect once and name the key that is wrong: `password_file`
//! or `url` for a refused password, `ca_file` for a server certificate not trusted, `cert_file`
//! for a client certificate the server refuses, `url` (or `nodes`) for a server that does not
//! answer.

mod durable;

mod fenced;

mod ops;

mod security;

use durable::Replication;
use flowstate_state::{
    Backend, BackendError, Connector, Fence, Kind, ObjectKey, Op, Reply, SettingError,
};
use ops::{Answer, Call};
use redis::{Cmd, Connection, ConnectionLike, Value};
use security::Security;

/// `url` with its password (if any) replaced by `***`, for messages and summaries.
pub fn redact(url: &str) -> String {
    security::redact(url)
}
use std::collections::HashMap;
use std::time::Duration;

/// Default connect/read/write timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Redirections followed for one operation before giving up on it.
const MAX_REDIRECTS: usize = 16;

/// Connects to one Redis server (`backend = "redis"`).
#[derive(Debug, Clone)]
pub struct RedisConnector {
    info: redis::ConnectionInfo,
    url: String,
    timeout: Duration,
    security: Security,
    /// Replicas every batch waits for (`wait_replicas`).
    replicas: u32,
}

impl RedisConnector {
    /// A connector for `url` (`redis://[user:password@]host:port[/db]`, or `rediss://` for
    /// TLS trusting the system's roots).
    pub fn new(url: &str) -> Result<Self, SettingError> {
        let info = parse_url("url", url)?;
        Ok(RedisConnector {
            security: Security::for_url(&info),
            info,
            // Without its password: the connector is printed with `{:?}`.
            url: redact(url),
            timeout: DEFAULT_TIMEOUT,
            replicas: 0,
        })
    }

    /// From `[state]`: `url` (default `redis://127.0.0.1:6379`) and the driver's own keys
    /// (`timeout`, `password_file`, `ca_file`, `cert_file`, `key_file`, `tls_skip_verify`); an
    /// unknown key is an error naming it.
    pub fn from_settings<'a>(
        url: Option<&str>,
        options: impl IntoIterator<Item = (&'a str, Setting<'a>)>,
    ) -> Result<Self, SettingError> {
        let mut c = RedisConnector::new(url.unwrap_or("redis://127.0.0.1:6379"))?;
        let mut keys = security::Keys::default();
        for (key, value) in options {
            match key {
                "timeout" => c.timeout = timeout(value)?,
                "wait_replicas" => c.replicas = wait_replicas(value)?,
                k if keys.take(k, value)? => {}
                other => {
                    return Err(SettingError::new(
                        other,
                        format!(
                            "unknown key; backend \"redis\" takes url, timeout, wait_replicas, {}",
                            security::KEYS
                        ),
                    ))
                }
            }
        }
        let url_key = "url";
        c.security = keys.apply(std::slice::from_mut(&mut c.info), url_key)?;
        Ok(c)
    }

    /// Connects once and names the `[state]` key that is wrong if that fails: `password_file`
    /// (or `url`) for a refused password, `ca_file` for an untrusted server certificate,
    /// `cert_file` for a refused client certificate, `url` for a server that does not answer.
    pub fn check(&self) -> Result<(), SettingError> {
        let explain = |e| self.security.explain(e, "url");
        let mut conn = open(&self.info, &self.security, self.timeout).map_err(explain)?;
        // A server that wants a password and got none answers its first command NOAUTH.
        redis::cmd("PING")
            .query::<Value>(&mut conn)
            .map(drop)
            .map_err(|e| explain(security::OpenError::new(&self.info, e)))
    }

    /// Sets the connect, read and write timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The server's address as configured, its password (if any) replaced by `***`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Connector for RedisConnector {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        let conn =
            open(&self.info, &self.security, self.timeout).map_err(|e| e.into_backend("redis"))?;
        Ok(Box::new(RedisBackend {
            info: self.info.clone(),
            security: self.security.clone(),
            timeout: self.timeout,
            replication: Replication::new(self.replicas, self.timeout),
            conn: Some(conn),
        }))
    }

    /// Fenced batches are one script (`fenced.rs`).
    fn fences(&self) -> bool {
        true
    }
}

/// Connects to a Redis Cluster (`backend = "redis-cluster"`).
#[derive(Debug, Clone)]
pub struct RedisClusterConnector {
    seeds: Vec<redis::ConnectionInfo>,
    timeout: Duration,
    security: Security,
    /// Replicas every batch waits for, on each master it touched (`wait_replicas`).
    replicas: u32,
}

/// A driver setting's value, as the binary hands it over.
#[derive(Debug, Clone, Copy)]
pub enum Setting<'a> {
    /// A string.
    Str(&'a str),
    /// A list of strings.
    List(&'a [String]),
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// Anything else (described for the error message).
    Other(&'a str),
}

impl RedisClusterConnector {
    /// A connector that learns the cluster from `nodes` (`redis://host:port` each, or all
    /// `rediss://`).
    pub fn new<S: AsRef<str>>(nodes: &[S]) -> Result<Self, SettingError> {
        if nodes.is_empty() {
            return Err(SettingError::new(
                "nodes",
                "at least one node address (redis://host:port) is needed",
            ));
        }
        let seeds: Vec<redis::ConnectionInfo> = nodes
            .iter()
            .map(|n| parse_url("nodes", n.as_ref().trim()))
            .collect::<Result<_, _>>()?;
        let security = Security::for_url(&seeds[0]);
        if seeds
            .iter()
            .any(|s| Security::for_url(s).tls != security.tls)
        {
            return Err(SettingError::new(
                "nodes",
                "mixes redis:// and rediss:// addresses; a cluster's nodes are all TLS or none",
            ));
        }
        Ok(RedisClusterConnector {
            seeds,
            timeout: DEFAULT_TIMEOUT,
            security,
            replicas: 0,
        })
    }

    /// Connects once (learning the slot map) and names the `[state]` key that is wrong if
    /// that fails, as [`RedisConnector::check`] does (`url` or `nodes` for the address).
    pub fn check(&self, address_key: &str) -> Result<(), SettingError> {
        let mut b = self.backend();
        b.refresh_checked()
            .map_err(|e| self.security.explain(e, address_key))
    }

    fn backend(&self) -> ClusterBackend {
        ClusterBackend {
            seeds: self.seeds.clone(),
            security: self.security.clone(),
            timeout: self.timeout,
            replication: Replication::new(self.replicas, self.timeout),
            nodes: HashMap::new(),
            slots: Vec::new(),
        }
    }

    /// From `[state]`: `nodes = [...]`, or a comma-separated `url`; `timeout` and the keys of
    /// credentials and TLS (as for `redis`).
    pub fn from_settings<'a>(
        url: Option<&str>,
        options: impl IntoIterator<Item = (&'a str, Setting<'a>)>,
    ) -> Result<Self, SettingError> {
        let mut nodes: Option<Vec<String>> = None;
        let mut t = DEFAULT_TIMEOUT;
        let mut replicas = 0;
        let mut keys = security::Keys::default();
        for (key, value) in options {
            match (key, value) {
                ("nodes", Setting::List(l)) => nodes = Some(l.to_vec()),
                ("nodes", Setting::Str(s)) => {
                    nodes = Some(s.split(',').map(str::to_owned).collect());
                }
                ("nodes", _) => {
                    return Err(SettingError::new(
                        "nodes",
                        "expected a list of addresses like [\"redis://127.0.0.1:7001\"]",
                    ))
                }
                ("timeout", v) => t = timeout(v)?,
                ("wait_replicas", v) => replicas = wait_replicas(v)?,
                (k, v) if keys.take(k, v)? => {}
                (other, _) => {
                    return Err(SettingError::new(
                        other,
                        format!(
                            "unknown key; backend \"redis-cluster\" takes url, nodes, timeout, wait_replicas, {}",
                            security::KEYS
                        ),
                    ))
                }
            }
        }
        let nodes = match (nodes, url) {
            (Some(_), Some(_)) => {
                return Err(SettingError::new(
                    "nodes",
                    "give the cluster's nodes either in url or in nodes, not both",
                ))
            }
            (Some(n), None) => n,
            (None, Some(u)) => u.split(',').map(str::to_owned).collect(),
            (None, None) => vec!["redis://127.0.0.1:7001".to_owned()],
        };
        let key = if url.is_some() { "url" } else { "nodes" };
        let mut c = RedisClusterConnector::new(&nodes).map_err(|e| SettingError {
            key: key.into(),
            ..e
        })?;
        c.timeout = t;
        c.replicas = replicas;
        c.security = keys.apply(&mut c.seeds, key)?;
        Ok(c)
    }

    /// Sets the connect, read and write timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }
}

impl Connector for RedisClusterConnector {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        let mut b = self.backend();
        b.refresh()?;
        Ok(Box::new(b))
    }

    /// Fenced batches are one script on the fence's hash slot (`fenced.rs`).
    fn fences(&self) -> bool {
        true
    }
}

fn parse_url(key: &str, url: &str) -> Result<redis::ConnectionInfo, SettingError> {
    use redis::IntoConnectionInfo;
    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
        return Err(SettingError::new(
            key,
            format!(
                "expected an address like redis://127.0.0.1:6379 (rediss:// for TLS), not {:?}",
                security::redact(url)
            ),
        ));
    }
    if url.contains('#') {
        return Err(SettingError::new(
            key,
            "no #fragment: TLS without verification is `tls_skip_verify = true`",
        ));
    }
    url.into_connection_info().map_err(|e| {
        SettingError::new(
            key,
            format!("{:?} is not a Redis address: {e}", security::redact(url)),
        )
    })
}

fn timeout(v: Setting<'_>) -> Result<Duration, SettingError> {
    let d = match v {
        Setting::Str(s) => flowstate_config::parse_duration(s),
        _ => Err(flowstate_config::unit_needed(2)),
    }
    .map_err(|r| SettingError::new("timeout", r))?;
    if d.is_zero() {
        return Err(SettingError::new(
            "timeout",
            "expected a duration above zero, like \"500ms\" or \"2s\"",
        ));
    }
    Ok(d)
}

/// `wait_replicas`: an integer from 0 to [`MAX_WAIT_REPLICAS`].
fn wait_replicas(v: Setting<'_>) -> Result<u32, SettingError> {
    match v {
        Setting::Int(n) if (0..=i64::from(MAX_WAIT_REPLICAS)).contains(&n) => Ok(n as u32),
        _ => Err(SettingError::new(
            "wait_replicas",
            format!("expected the replicas a batch waits for, 0 to {MAX_WAIT_REPLICAS}"),
        )),
    }
}

/// Most replicas `wait_replicas` may ask for.
const MAX_WAIT_REPLICAS: u32 = 16;

pub(crate) fn unreachable(backend: &'static str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Unreachable {
        backend,
        reason: e.to_string(),
    }
}

/// Opens one connection (TLS and credentials as `security` says); the error keeps the
/// client's, to tell a refused password or certificate from a server that does not answer.
fn open(
    info: &redis::ConnectionInfo,
    security: &Security,
    timeout: Duration,
) -> Result<Connection, security::OpenError> {
    let client = security.client(info)?;
    let conn = client
        .get_connection_with_timeout(timeout)
        .map_err(|e| security::OpenError::new(info, e))?;
    conn.set_read_timeout(Some(timeout))
        .and_then(|()| conn.set_write_timeout(Some(timeout)))
        .map_err(|e| security::OpenError::new(info, e))?;
    Ok(conn)
}

/// Sends `cmds` as one pipeline and reads one answer per command. `Err` only when the
/// connection failed (nothing is known of which commands ran).
pub(crate) fn pipeline(conn: &mut Connection, cmds: &[&Cmd]) -> redis::RedisResult<Vec<Answer>> {
    if cmds.is_empty() {
        return Ok(Vec::new());
    }
    let mut packed = Vec::new();
    for c in cmds {
        c.write_packed_command(&mut packed);
    }
    let values = conn.req_packed_commands(&packed, 0, cmds.len())?;
    if values.len() != cmds.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "wrong number of replies to a pipeline",
        )));
    }
    let answers: Vec<Answer> = values.into_iter().map(answer).collect();
    // A server that is loading its data (after a restart) or blocked refuses every command
    // for a while: the batch was not applied, and fails as unreachable so that it is sent
    // again, rather than answering each operation with an error that would lose it.
    if let Some(Answer::Error { code, detail }) = answers
        .iter()
        .find(|a| matches!(a, Answer::Error { code, .. } if NOT_READY.contains(&code.as_str())))
    {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "server not ready",
            format!("{code} {detail}"),
        )));
    }
    Ok(answers)
}

/// Error codes of a server that refuses every command for now.
const NOT_READY: [&str; 3] = ["LOADING", "BUSY", "MASTERDOWN"];

fn answer(v: Value) -> Answer {
    match v {
        Value::ServerError(e) => Answer::Error {
            code: e.code().to_owned(),
            detail: e.details().unwrap_or_default().to_owned(),
        },
        v => Answer::Value(v),
    }
}

/// Builds the commands of a batch: `Ok(call)` to send, `Err(reply)` answered without Redis.
fn commands(ops: &[Op]) -> Vec<Result<Call, Reply>> {
    ops.iter().map(ops::command).collect()
}

/// Turns answers into replies; `WRONGTYPE` answers get a follow-up `TYPE` to name the kind
/// found (a second round trip only on that error path).
fn finish(
    backend: &'static str,
    ops: &[Op],
    built: Vec<Result<Call, Reply>>,
    mut answers: Vec<Option<Answer>>,
    replies: &mut Vec<Reply>,
    mut run: impl FnMut(&[(usize, Cmd)]) -> Result<Vec<Answer>, BackendError>,
) -> Result<(), BackendError> {
    let wrong: Vec<(usize, Cmd)> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| {
            matches!(a, Some(Answer::Error { code, detail })
                if code == "WRONGTYPE" || detail.contains("WRONGTYPE"))
        })
        .map(|(i, _)| {
            let mut c = redis::cmd("TYPE");
            c.arg(ops::key(ops[i].key()));
            (i, c)
        })
        .collect();
    let mut types: HashMap<usize, String> = HashMap::new();
    if !wrong.is_empty() {
        for ((i, _), a) in wrong.iter().zip(run(&wrong)?) {
            if let Answer::Value(Value::SimpleString(t)) = a {
                types.insert(*i, t);
            }
        }
    }
    for (i, (op, b)) in ops.iter().zip(built).enumerate() {
        replies.push(match b {
            Err(r) => r,
            Ok(_) => match answers[i].take() {
                Some(a) => ops::reply(op, a, types.get(&i).map(String::as_str)),
                None => {
                    return Err(BackendError::Protocol {
                        backend,
                        reason: format!("no reply to operation #{i}"),
                    })
                }
            },
        });
    }
    Ok(())
}

/// One connection to one Redis server.
struct RedisBackend {
    info: redis::ConnectionInfo,
    security: Security,
    timeout: Duration,
    /// `wait_replicas`.
    replication: Replication,
    conn: Option<Connection>,
}

impl RedisBackend {
    /// Every operation of `ops` in one script ([`fenced`]), with the fence's check if
    /// `checked`, marked by the fence's batch number.
    fn script(
        &mut self,
        fence: &Fence,
        checked: bool,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let built = commands(ops);
        let fence_key = ops::key(&fence.key);
        let mark = mark(fence, &fence_key, &fence_key);
        let call = fenced::call(
            &fence_key,
            if checked { &fence.value } else { b"" },
            mark.as_ref().map(|(k, v)| (&k[..], &v[..])),
            &built,
            |_| true,
        );
        let mut got = self.run(&[&call.cmd])?;
        if matches!(got.first(), Some(Answer::Error { code, .. }) if code == "NOSCRIPT") {
            // Nothing ran: the same call with the script's text.
            got = self.run(&[&fenced::with_text(&call.cmd)])?;
        }
        let answer = got.pop().ok_or_else(|| BackendError::Protocol {
            backend: "redis",
            reason: "no answer to a fenced batch".into(),
        })?;
        let answers = fenced_answers("redis", fence, ops, &call.inside, answer)?;
        self.finish(ops, built, answers, replies)
    }

    fn run(&mut self, cmds: &[&Cmd]) -> Result<Vec<Answer>, BackendError> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(
                open(&self.info, &self.security, self.timeout)
                    .map_err(|e| e.into_backend("redis"))?,
            ),
        };
        let addr = self.info.addr().to_string();
        let durable = self.replication.on() && !cmds.is_empty();
        let tail = self.replication.tail(&addr);
        let all: Vec<&Cmd> = cmds
            .iter()
            .copied()
            .chain(tail.iter().filter(|_| durable))
            .collect();
        let result = pipeline(conn, &all)
            .map_err(|e| unreachable("redis", format!("{addr}: {e}")))
            .and_then(|mut a| {
                if durable {
                    let (role, acked) = durable::take_tail(&mut a);
                    self.replication.settle("redis", &addr, conn, role, acked)?;
                }
                Ok(a)
            });
        if result.is_err() {
            // The connection's state is unknown: start afresh next time.
            self.conn = None;
        }
        result
    }

    /// [`finish`] for this backend: the follow-up `TYPE`s on the same connection.
    fn finish(
        &mut self,
        ops: &[Op],
        built: Vec<Result<Call, Reply>>,
        answers: Vec<Option<Answer>>,
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        finish("redis", ops, built, answers, replies, |cmds| {
            let refs: Vec<&Cmd> = cmds.iter().map(|(_, c)| c).collect();
            self.run(&refs)
        })
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        let built = commands(ops);
        let cmds: Vec<&Cmd> = built
            .iter()
            .filter_map(|b| Some(&b.as_ref().ok()?.cmd))
            .collect();
        let mut it = self.run(&cmds)?.into_iter();
        let answers = built
            .iter()
            .map(|b| if b.is_ok() { it.next() } else { None })
            .collect();
        self.finish(ops, built, answers, replies)
    }

    /// Every operation in one script with the fence's check ([`fenced`]): one round trip
    /// (two when the server does not have the script yet).
    fn execute_fenced(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.script(fence, true, ops, replies)
    }

    /// A batch runs whole here: what one left is all of it, the same script without the
    /// check, skipped if the batch's mark is there.
    fn execute_rest(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.script(fence, false, ops, replies)
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        let pattern = ops::pattern(nf, kind, id);
        let mut found = Vec::new();
        let mut cursor = b"0".to_vec();
        loop {
            let mut c = redis::cmd("SCAN");
            c.arg(&cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let a = self.run(&[&c])?;
            cursor = scan_step(a, nf, kind, id, &mut found, "redis")?;
            if cursor == b"0" {
                break;
            }
        }
        found.sort();
        found.dedup();
        Ok(found)
    }
}

/// The answers to a fenced batch's operations from its script's `answer` (`None` for those not
/// `inside` it); [`BackendError::Fenced`] when the fence did not hold.
fn fenced_answers(
    backend: &'static str,
    fence: &Fence,
    ops: &[Op],
    inside: &[usize],
    answer: Answer,
) -> Result<Vec<Option<Answer>>, BackendError> {
    let protocol = |reason: String| BackendError::Protocol { backend, reason };
    match fenced::answers(answer, ops, inside) {
        fenced::Outcome::Ran(got) => {
            let mut answers = vec![None; ops.len()];
            for (&i, a) in inside.iter().zip(got) {
                answers[i] = Some(a);
            }
            Ok(answers)
        }
        fenced::Outcome::Applied => {
            let mut answers = vec![None; ops.len()];
            for &i in inside {
                answers[i] = Some(Answer::Error {
                    code: "APPLIED".into(),
                    detail: "the batch ran before".into(),
                });
            }
            Ok(answers)
        }
        fenced::Outcome::Fenced => Err(BackendError::Fenced {
            backend,
            key: fence.key.to_string(),
        }),
        fenced::Outcome::NoScript => Err(protocol(
            "the fenced batch's script is unknown to a server sent its text".into(),
        )),
        fenced::Outcome::Bad(reason) => Err(protocol(reason)),
    }
}

/// The mark of `fence`'s batch on the hash slot of `key` (a Redis key), if it is numbered
/// and `key` has a hash tag (see [`fenced::call`]).
fn mark(fence: &Fence, fence_key: &[u8], key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let tag = ops::tag(key).filter(|_| fence.batch != 0)?;
    Some((
        fenced::mark_key(tag, fence_key),
        fenced::mark_value(&fence.value, fence.batch),
    ))
}

/// Reads one `SCAN` reply: adds the matching keys to `found`, returns the next cursor.
fn scan_step(
    answers: Vec<Answer>,
    nf: &str,
    kind: Kind,
    id: &str,
    found: &mut Vec<ObjectKey>,
    backend: &'static str,
) -> Result<Vec<u8>, BackendError> {
    let protocol = |reason: String| BackendError::Protocol { backend, reason };
    let Some(Answer::Value(Value::Array(mut parts))) = answers.into_iter().next() else {
        return Err(protocol("SCAN did not answer [cursor, keys]".into()));
    };
    if parts.len() != 2 {
        return Err(protocol("SCAN did not answer [cursor, keys]".into()));
    }
    let keys = parts.pop();
    let cursor = match parts.pop() {
        Some(Value::BulkString(c)) => c,
        _ => return Err(protocol("SCAN answered no cursor".into())),
    };
    if let Some(Value::Array(keys)) = keys {
        for k in keys {
            let Value::BulkString(raw) = k else { continue };
            if let Some(key) = ops::object(&raw) {
                let ours = key
                    .parse()
                    .is_some_and(|p| p.nf == nf && p.kind == kind && p.id == id);
                if ours {
                    found.push(key);
                }
            }
        }
    }
    Ok(cursor)
}

/// Connections to every master of a Redis Cluster, with its slot map.
struct ClusterBackend {
    seeds: Vec<redis::ConnectionInfo>,
    security: Security,
    timeout: Duration,
    /// `wait_replicas`, for each master's pipeline.
    replication: Replication,
    /// By address `host:port`.
    nodes: HashMap<String, Connection>,
    /// Address serving each of the 16384 slots (empty until learned).
    slots: Vec<Option<String>>,
}

const SLOTS: usize = 16384;

impl ClusterBackend {
    fn info_for(&self, addr: &str) -> Result<redis::ConnectionInfo, security::OpenError> {
        use redis::IntoConnectionInfo;
        // TLS as for the seeds (a node learned from CLUSTER SLOTS, MOVED or ASK is one of
        // theirs), with their credentials and database.
        let scheme = if self.security.tls { "rediss" } else { "redis" };
        let mut info = format!("{scheme}://{addr}")
            .into_connection_info()
            .map_err(|e| security::OpenError::Other(format!("{addr}: {e}")))?;
        if let Some(seed) = self.seeds.first() {
            info = info.set_redis_settings(seed.redis_settings().clone());
        }
        Ok(info)
    }

    fn conn(&mut self, addr: &str) -> Result<&mut Connection, BackendError> {
        self.conn_checked(addr)
            .map_err(|e| e.into_backend("redis-cluster"))
    }

    fn conn_checked(&mut self, addr: &str) -> Result<&mut Connection, security::OpenError> {
        if !self.nodes.contains_key(addr) {
            let info = self.info_for(addr)?;
            let c = open(&info, &self.security, self.timeout)?;
            self.nodes.insert(addr.to_owned(), c);
        }
        self.nodes
            .get_mut(addr)
            .ok_or_else(|| security::OpenError::Other("connection vanished".into()))
    }

    /// Learns the slot map from the first node that answers `CLUSTER SLOTS`.
    fn refresh(&mut self) -> Result<(), BackendError> {
        self.refresh_checked()
            .map_err(|e| e.into_backend("redis-cluster"))
    }

    /// [`ClusterBackend::refresh`], telling a refused password or certificate (the first such
    /// error: every node of a cluster shares them) from nodes that do not answer.
    fn refresh_checked(&mut self) -> Result<(), security::OpenError> {
        let mut candidates: Vec<String> = self.nodes.keys().cloned().collect();
        candidates.extend(self.seeds.iter().map(|s| seed_addr(s.addr())));
        let mut last = String::from("no node given");
        for addr in candidates {
            let conn = match self.conn_checked(&addr) {
                Ok(c) => c,
                Err(e @ (security::OpenError::Auth(_) | security::OpenError::Tls { .. })) => {
                    return Err(e)
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let reply = redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(conn);
            match reply {
                Ok(v) => match slot_map(v) {
                    Some(map) => {
                        self.slots = map;
                        return Ok(());
                    }
                    None => last = format!("{addr}: CLUSTER SLOTS answer not understood"),
                },
                Err(e) => {
                    self.nodes.remove(&addr);
                    let text = format!("{addr}: {e}");
                    if let Ok(info) = self.info_for(&addr) {
                        if let e @ security::OpenError::Auth(_) = security::OpenError::new(&info, e)
                        {
                            return Err(e);
                        }
                    }
                    last = text;
                }
            }
        }
        Err(security::OpenError::Other(last))
    }

    fn addr_of(&self, slot: u16) -> Option<&str> {
        self.slots.get(usize::from(slot))?.as_deref()
    }

    /// Runs `cmds` (with their ops' indexes) on the nodes serving their keys: one pipeline per
    /// node, sent to all before reading any; then the redirected ones again, one by one, in
    /// batch order.
    fn run(
        &mut self,
        cmds: &[(usize, Cmd)],
        keys: &[Vec<u8>],
    ) -> Result<Vec<Answer>, BackendError> {
        let result = self.run_once(cmds, keys);
        if result.is_err() {
            // Other nodes may still owe replies to this batch: start every connection afresh
            // so that no late reply is taken for the next batch's.
            self.nodes.clear();
            self.slots.clear();
        }
        result
    }

    fn run_once(
        &mut self,
        cmds: &[(usize, Cmd)],
        keys: &[Vec<u8>],
    ) -> Result<Vec<Answer>, BackendError> {
        if self.slots.is_empty() {
            self.refresh()?;
        }
        let mut answers: Vec<Option<Answer>> = vec![None; cmds.len()];
        // Group by node, keeping the order within each node.
        let mut by_node: Vec<(String, Vec<usize>)> = Vec::new();
        for (j, key) in keys.iter().enumerate() {
            let addr = self
                .addr_of(ops::slot(key))
                .map(str::to_owned)
                .ok_or_else(|| unreachable("redis-cluster", "a slot is served by no node"))?;
            match by_node.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, v)) => v.push(j),
                None => by_node.push((addr, vec![j])),
            }
        }
        let mut sent = Vec::new();
        for (addr, idx) in &by_node {
            let mut packed = Vec::new();
            for &j in idx {
                cmds[j].1.write_packed_command(&mut packed);
            }
            if self.replication.on() {
                for c in self.replication.tail(addr) {
                    c.write_packed_command(&mut packed);
                }
            }
            let conn = self.conn(addr)?;
            if let Err(e) = conn.send_packed_command(&packed) {
                self.drop_node(addr);
                return Err(unreachable("redis-cluster", format!("{addr}: {e}")));
            }
            sent.push((addr.clone(), idx.clone()));
        }
        for (addr, idx) in &sent {
            for &j in idx {
                let conn = self.conn(addr)?;
                match conn.recv_response() {
                    Ok(v) => answers[j] = Some(answer(v)),
                    Err(e) if e.code().is_some() && !e.is_io_error() => {
                        answers[j] = Some(Answer::Error {
                            code: e.code().unwrap_or("ERR").to_owned(),
                            detail: e.detail().unwrap_or_default().to_owned(),
                        });
                    }
                    Err(e) => {
                        self.drop_node(addr);
                        return Err(unreachable("redis-cluster", format!("{addr}: {e}")));
                    }
                }
            }
            if self.replication.on() {
                let conn = self.conn(addr)?;
                let acked = match (conn.recv_response(), conn.recv_response()) {
                    (Ok(role), Ok(acked)) => self.durable(addr, answer(role), answer(acked)),
                    (Err(e), _) | (_, Err(e)) => {
                        Err(unreachable("redis-cluster", format!("{addr}: {e}")))
                    }
                };
                if let Err(e) = acked {
                    self.drop_node(addr);
                    return Err(e);
                }
            }
        }
        // Redirections: refresh the map once, then resend in batch order.
        let redirected: Vec<usize> = (0..cmds.len())
            .filter(|&j| matches!(&answers[j], Some(a) if redirect(a).is_some()))
            .collect();
        if !redirected.is_empty() {
            self.refresh()?;
            for j in redirected {
                answers[j] = Some(self.follow(&cmds[j].1, &keys[j], answers[j].take())?);
            }
        }
        answers
            .into_iter()
            .map(|a| a.ok_or_else(|| unreachable("redis-cluster", "a command got no answer")))
            .collect()
    }

    /// Sends one command again until it is not redirected.
    fn follow(
        &mut self,
        cmd: &Cmd,
        key: &[u8],
        mut last: Option<Answer>,
    ) -> Result<Answer, BackendError> {
        let start = std::time::Instant::now();
        let mut redirects = 0;
        let mut waits: u32 = 0;
        while redirects < MAX_REDIRECTS {
            let (addr, asking) = match last.as_ref().and_then(redirect) {
                Some(Redirect::Ask(addr)) => {
                    redirects += 1;
                    (addr, true)
                }
                Some(Redirect::Moved(addr)) => {
                    redirects += 1;
                    (addr, false)
                }
                Some(Redirect::Wait) => {
                    // TRYAGAIN (a multi-key script on a slot whose keys are half moved) or
                    // CLUSTERDOWN: wait for the migration, up to the timeout.
                    if start.elapsed() >= self.timeout {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5u64 << waits.min(4)));
                    waits += 1;
                    self.refresh()?;
                    let addr =
                        self.addr_of(ops::slot(key))
                            .map(str::to_owned)
                            .ok_or_else(|| {
                                unreachable("redis-cluster", "a slot is served by no node")
                            })?;
                    (addr, false)
                }
                None => break,
            };
            let asking_cmd = redis::cmd("ASKING");
            let durable = self.replication.on();
            let tail = self.replication.tail(&addr);
            let conn = self.conn(&addr)?;
            let mut sent: Vec<&Cmd> = Vec::with_capacity(4);
            if asking {
                sent.push(&asking_cmd);
            }
            sent.push(cmd);
            if durable {
                sent.extend(&tail);
            }
            let result = pipeline(conn, &sent)
                .map_err(|e| unreachable("redis-cluster", format!("{addr}: {e}")))
                .and_then(|mut a| {
                    if durable {
                        let (role, acked) = durable::take_tail(&mut a);
                        self.durable(&addr, role, acked)?;
                    }
                    Ok(a.pop())
                });
            match result {
                Ok(a) => last = a,
                Err(e) => {
                    self.drop_node(&addr);
                    return Err(e);
                }
            }
            if matches!(last.as_ref().and_then(redirect), Some(Redirect::Moved(_))) {
                self.refresh()?;
            }
        }
        match last {
            Some(a) if redirect(&a).is_none() => Ok(a),
            _ => Err(unreachable(
                "redis-cluster",
                format!(
                    "an operation was still redirected after {redirects} redirections and {:?} \
                     (is a slot migration stuck?)",
                    start.elapsed()
                ),
            )),
        }
    }

    /// [`Replication::settle`] on the connection to `addr`, whose pipeline's `ROLE` and
    /// `WAIT` answered `role` and `acked`.
    fn durable(&mut self, addr: &str, role: Answer, acked: Answer) -> Result<(), BackendError> {
        let conn = self
            .nodes
            .get_mut(addr)
            .ok_or_else(|| unreachable("redis-cluster", format!("{addr}: connection lost")))?;
        self.replication
            .settle("redis-cluster", addr, conn, role, acked)
    }

    /// Runs a fenced batch's script (`EVALSHA`, routed by `key`, the fence's), sent again
    /// with its text if the node answers `NOSCRIPT` (nothing ran).
    fn run_fenced(&mut self, cmd: Cmd, key: Vec<u8>) -> Result<Answer, BackendError> {
        let keys = [key];
        let mut cmds = [(0, cmd)];
        let mut answer = self.run(&cmds, &keys)?.pop();
        if matches!(&answer, Some(Answer::Error { code, .. }) if code == "NOSCRIPT") {
            cmds[0].1 = fenced::with_text(&cmds[0].1);
            answer = self.run(&cmds, &keys)?.pop();
        }
        answer.ok_or_else(|| unreachable("redis-cluster", "a fenced batch got no answer"))
    }

    /// Runs the operations `rest` of a fenced batch whose fence held, off the fence's slot:
    /// a numbered batch's as one script per hash slot that runs them only if the batch's mark
    /// on that slot is not there yet (each runs once, however often it is sent); their
    /// answers into `answers`.
    fn run_rest(
        &mut self,
        fence: &Fence,
        fence_key: &[u8],
        ops: &[Op],
        built: &[Result<Call, Reply>],
        rest: &[usize],
        answers: &mut [Option<Answer>],
    ) -> Result<(), BackendError> {
        let mut plain = Vec::new();
        let mut left: Vec<usize> = rest.to_vec();
        while let Some(&first) = left.first() {
            let key = ops::key(ops[first].key());
            let slot = ops::slot(&key);
            let (here, others): (Vec<usize>, Vec<usize>) = left
                .iter()
                .partition(|&&i| ops::slot(&ops::key(ops[i].key())) == slot);
            left = others;
            let Some((mark_key, mark_value)) = mark(fence, fence_key, &key) else {
                plain.extend(here);
                continue;
            };
            let call = fenced::call(
                &mark_key,
                b"",
                Some((&mark_key, &mark_value)),
                built,
                |keys| keys.iter().all(|k| ops::slot(k) == slot),
            );
            let answer = self.run_fenced(call.cmd, mark_key)?;
            let got = fenced_answers("redis-cluster", fence, ops, &call.inside, answer)?;
            for (i, a) in got.into_iter().enumerate() {
                if a.is_some() {
                    answers[i] = a;
                }
            }
            // Operations whose keys span slots run as plain commands.
            plain.extend(here.into_iter().filter(|&i| answers[i].is_none()));
        }
        if !plain.is_empty() {
            let mut cmds = Vec::new();
            let mut keys = Vec::new();
            for i in plain {
                if let Ok(c) = &built[i] {
                    cmds.push((i, c.cmd.clone()));
                    keys.push(ops::key(ops[i].key()));
                }
            }
            for ((i, _), a) in cmds.iter().zip(self.run(&cmds, &keys)?) {
                answers[*i] = Some(a);
            }
        }
        Ok(())
    }

    /// [`finish`] for this backend: the follow-up `TYPE`s routed as any command.
    fn finish(
        &mut self,
        ops: &[Op],
        built: Vec<Result<Call, Reply>>,
        answers: Vec<Option<Answer>>,
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        finish("redis-cluster", ops, built, answers, replies, |cmds| {
            let keys: Vec<Vec<u8>> = cmds.iter().map(|(i, _)| ops::key(ops[*i].key())).collect();
            self.run(cmds, &keys)
        })
    }

    fn drop_node(&mut self, addr: &str) {
        self.nodes.remove(addr);
        // The map may be stale too: learn it again before the next batch.
        self.slots.clear();
    }

    fn masters(&self) -> Vec<String> {
        let mut m: Vec<String> = self.slots.iter().flatten().cloned().collect();
        m.sort();
        m.dedup();
        m
    }
}

/// A seed's `host:port` (the key of its connection, as `CLUSTER SLOTS` names nodes).
fn seed_addr(addr: &redis::ConnectionAddr) -> String {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

enum Redirect {
    Moved(String),
    Ask(String),
    Wait,
}

fn redirect(a: &Answer) -> Option<Redirect> {
    let Answer::Error { code, detail } = a else {
        return None;
    };
    let target = || detail.split_whitespace().nth(1).map(str::to_owned);
    match code.as_str() {
        "MOVED" => target().map(Redirect::Moved),
        "ASK" => target().map(Redirect::Ask),
        "TRYAGAIN" | "CLUSTERDOWN" => Some(Redirect::Wait),
        c if NOT_READY.contains(&c) => Some(Redirect::Wait),
        _ => None,
    }
}

/// Whether keys are all on `key`'s hash slot: the operations a cluster's fenced script holds.
fn on_slot(key: &[u8]) -> impl Fn(&[&[u8]]) -> bool {
    let slot = ops::slot(key);
    move |keys| keys.iter().all(|k| ops::slot(k) == slot)
}

/// The slot map from a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ..], ..], ..]`.
fn slot_map(v: Value) -> Option<Vec<Option<String>>> {
    let Value::Array(ranges) = v else { return None };
    let mut map = vec![None; SLOTS];
    for r in ranges {
        let Value::Array(r) = r else { return None };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (r.first(), r.get(1), r.get(2))
        else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let addr = format!("{host}:{port}");
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        for s in map.get_mut(start..=end)? {
            *s = Some(addr.clone());
        }
    }
    Some(map)
}

impl Backend for ClusterBackend {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        let built = commands(ops);
        let mut cmds = Vec::with_capacity(ops.len());
        let mut keys = Vec::with_capacity(ops.len());
        for (i, (op, b)) in ops.iter().zip(&built).enumerate() {
            if let Ok(c) = b {
                cmds.push((i, c.cmd.clone()));
                keys.push(ops::key(op.key()));
            }
        }
        let got = self.run(&cmds, &keys)?;
        let mut answers: Vec<Option<Answer>> = vec![None; ops.len()];
        for ((i, _), a) in cmds.iter().zip(got) {
            answers[*i] = Some(a);
        }
        self.finish(ops, built, answers, replies)
    }

    /// The operations on the fence's hash slot in one script with the fence's check
    /// ([`fenced`]) on the node serving it; then, only if the fence held, the others as
    /// [`Backend::execute`] sends them (see the crate's documentation).
    fn execute_fenced(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let built = commands(ops);
        let fence_key = ops::key(&fence.key);
        let mark = mark(fence, &fence_key, &fence_key);
        let call = fenced::call(
            &fence_key,
            &fence.value,
            mark.as_ref().map(|(k, v)| (&k[..], &v[..])),
            &built,
            on_slot(&fence_key),
        );
        let answer = self.run_fenced(call.cmd, fence_key.clone())?;
        let mut answers = fenced_answers("redis-cluster", fence, ops, &call.inside, answer)?;
        let rest: Vec<usize> = (0..ops.len())
            .filter(|&i| built[i].is_ok() && answers[i].is_none())
            .collect();
        if !rest.is_empty() {
            // The fence held and its slot's part ran (now or before): the others must run
            // too, whoever holds the fence by then (the state engine sends them again without
            // it).
            self.run_rest(fence, &fence_key, ops, &built, &rest, &mut answers)
                .map_err(|e| BackendError::Partial {
                    backend: "redis-cluster",
                    rest,
                    reason: e.to_string(),
                })?;
        }
        self.finish(ops, built, answers, replies)
    }

    fn execute_rest(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let built = commands(ops);
        let rest: Vec<usize> = (0..ops.len()).filter(|&i| built[i].is_ok()).collect();
        let mut answers = vec![None; ops.len()];
        self.run_rest(
            fence,
            &ops::key(&fence.key),
            ops,
            &built,
            &rest,
            &mut answers,
        )?;
        self.finish(ops, built, answers, replies)
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        if self.slots.is_empty() {
            self.refresh()?;
        }
        let pattern = ops::pattern(nf, kind, id);
        let mut found = Vec::new();
        for addr in self.masters() {
            let mut cursor = b"0".to_vec();
            loop {
                let mut c = redis::cmd("SCAN");
                c.arg(&cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let conn = self.conn(&addr)?;
                let a = match pipeline(conn, &[&c]) {
                    Ok(a) => a,
                    Err(e) => {
                        self.drop_node(&addr);
                        return Err(unreachable("redis-cluster", format!("{addr}: {e}")));
                    }
                };
                cursor = scan_step(a, nf, kind, id, &mut found, "redis-cluster")?;
                if cursor == b"0" {
                    break;
                }
            }
        }
        found.sort();
        found.dedup();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_bad_key() {
        let e = RedisConnector::from_settings(Some("http://x"), []).unwrap_err();
        assert_eq!(e.key, "url");
        let e = RedisConnector::from_settings(None, [("colour", Setting::Str("red"))]).unwrap_err();
        assert_eq!(e.key, "colour");
        let e =
            RedisConnector::from_settings(None, [("timeout", Setting::Str("soon"))]).unwrap_err();
        assert_eq!(e.key, "timeout");
        let c = RedisConnector::from_settings(None, [("timeout", Setting::Str("250ms"))]).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(250));
        let c = RedisConnector::from_settings(None, [("timeout", Setting::Str("1.5s"))]).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(1500));
        for bad in [
            Setting::Str("2"),
            Setting::Other("integer"),
            Setting::Str("0s"),
        ] {
            let e = RedisConnector::from_settings(None, [("timeout", bad)]).unwrap_err();
            assert_eq!(e.key, "timeout");
        }
        let e = RedisConnector::from_settings(None, [("timeout", Setting::Str("2"))]).unwrap_err();
        assert!(e.reason.contains("\"2s\""), "{}", e.reason);
        let nodes = vec!["redis://127.0.0.1:7001".to_owned(), "bad".to_owned()];
        let e = RedisClusterConnector::from_settings(None, [("nodes", Setting::List(&nodes))])
            .unwrap_err();
        assert_eq!(e.key, "nodes");
        let e = RedisClusterConnector::from_settings(Some("redis://a:1,nope"), []).unwrap_err();
        assert_eq!(e.key, "url");
        let c = RedisClusterConnector::from_settings(
            Some("redis://127.0.0.1:7001, redis://127.0.0.1:7002"),
            [],
        )
        .unwrap();
        assert_eq!(c.seeds.len(), 2);
        let e = RedisClusterConnector::from_settings(None, [("nodes", Setting::Other("integer"))])
            .unwrap_err();
        assert_eq!(e.key, "nodes");
    }

    #[test]
    fn a_clusters_fenced_script_holds_its_partitions_operations() {
        use flowstate_state::Owner;
        let part =
            |nf: &str, p: u32, kind: Kind| ObjectKey::partitioned(&Owner::new(nf, 3, p), kind, "x");
        let fence = ops::key(&part("cluster", 9, Kind::Value));
        let ops = [
            Op::Add {
                key: part("nat", 9, Kind::Counter),
                delta: 1,
            },
            // Two keys: the map and its deadlines.
            Op::MapSet {
                key: part("firewall", 9, Kind::Map),
                field: b"f".to_vec(),
                value: b"v".to_vec(),
            },
            Op::Add {
                key: ObjectKey::shared("counter", Kind::Counter, "packets"),
                delta: 1,
            },
            Op::Lock {
                key: part("lb", 9, Kind::Set),
                owner: 1,
                lease: Duration::from_secs(1),
            },
            Op::Add {
                key: part("nat", 10, Kind::Counter),
                delta: 1,
            },
        ];
        let built = commands(&ops);
        let call = fenced::call(&fence, b"v", None, &built, on_slot(&fence));
        assert_eq!(call.inside, vec![0, 1, 3]);
        // A single server's holds them all.
        assert_eq!(
            fenced::call(&fence, b"v", None, &built, |_| true)
                .inside
                .len(),
            5
        );
    }

    #[test]
    fn no_password_is_printed() {
        let c = RedisConnector::new("rediss://u:hunter2@127.0.0.1:6380").unwrap();
        assert_eq!(c.url(), "rediss://u:***@127.0.0.1:6380");
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        let c = RedisClusterConnector::new(&["redis://:hunter2@127.0.0.1:7001"]).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
    }

    #[test]
    fn a_dead_server_is_unreachable() {
        // Port 1 on loopback: nothing listens there.
        let c = RedisConnector::new("redis://127.0.0.1:1").unwrap();
        assert!(matches!(
            c.connect().err(),
            Some(BackendError::Unreachable {
                backend: "redis",
                ..
            })
        ));
        let c = RedisClusterConnector::new(&["redis://127.0.0.1:1"]).unwrap();
        let e = c.connect().err();
        assert!(matches!(
            e,
            Some(BackendError::Unreachable {
                backend: "redis-cluster",
                ..
            })
        ));
        // The message names the backend and "unreachable" once, then the node and its error.
        let text = e.unwrap().to_string();
        assert_eq!(text.matches("unreachable").count(), 1, "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
    }
}
