//! Running operations: the session, prepared statements, schema creation, and each [`Op`] as
//! CQL (FlexState §IV-B, Table 2).

use crate::config::CassandraConfig;
use crate::names::keyspace_name;
use crate::NAME;
use flowstate_state::{BackendError, Bytes, Kind, Object, ObjectKey, Op, OpError, Reply};
use futures_util::future::{join_all, try_join_all};
use futures_util::StreamExt;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::cluster::{ClusterState, NodeRef};
use scylla::deserialize::row::DeserializeRow;
use scylla::errors::{DbError, ExecutionError, PrepareError, RequestAttemptError};
use scylla::policies::load_balancing::{FallbackPlan, LoadBalancingPolicy, RoutingInfo};
use scylla::response::query_result::QueryResult;
use scylla::routing::Shard;
use scylla::serialize::batch::BatchValues;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::unprepared::Statement;
use scylla::value::{Counter, CqlValue, Row};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::runtime::Runtime;

/// The registry keyspace: which keyspace holds which partition.
const REGISTRY: &str = "flowstate";
/// Locks serialising operations on one object among this connector's connections.
const STRIPES: usize = 1024;
/// Most statements in one batch, and most bytes of values (Cassandra refuses mutations above
/// `max_mutation_size`, 16 MiB by default).
const BATCH_MAX_STATEMENTS: usize = 256;
const BATCH_MAX_BYTES: usize = 4 << 20;
/// Time limit of one schema change.
const DDL_TIMEOUT: Duration = Duration::from_secs(120);
/// Schema changes sent at once by [`Shared::drop_nfs`].
const DROPS_AT_ONCE: usize = 4;
/// Cassandra's longest time to live (20 years).
const MAX_TTL: u128 = 630_720_000;

/// Where schema changes go: the node with the lowest host id, then the others in that order
/// (the driver skips those it has no connection to), so that every flowstate process sends
/// its schema changes to the same node while it is up. Cassandra serialises schema changes on each node,
/// but two `CREATE TABLE IF NOT EXISTS` of one table on two nodes at once may both create it,
/// with different table ids, and writes then fail on the nodes that kept the other one
/// (CASSANDRA-10699); instances writing an NF's shared objects for the first time do exactly
/// that.
#[derive(Debug)]
struct SchemaCoordinator;

impl LoadBalancingPolicy for SchemaCoordinator {
    fn pick<'a>(
        &'a self,
        request: &'a RoutingInfo,
        cluster: &'a ClusterState,
    ) -> Option<(NodeRef<'a>, Option<Shard>)> {
        self.fallback(request, cluster).next()
    }

    fn fallback<'a>(&'a self, _: &'a RoutingInfo, cluster: &'a ClusterState) -> FallbackPlan<'a> {
        let mut nodes: Vec<NodeRef<'a>> = cluster.get_nodes_info().iter().collect();
        nodes.sort_by_key(|n| n.host_id);
        Box::new(nodes.into_iter().map(|n| (n, None)))
    }

    fn name(&self) -> String {
        "flowstate schema coordinator".into()
    }
}

/// Why one statement did not give a result.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The keyspace or table does not exist (nothing was ever written there).
    Missing,
    /// The store refused this statement; the operation fails alone.
    Refused(String),
    /// The whole batch fails.
    Batch(BackendError),
}

type R<T> = Result<T, Fail>;

fn unreachable(reason: impl ToString) -> Fail {
    Fail::Batch(BackendError::Unreachable {
        backend: NAME,
        reason: reason.to_string(),
    })
}

fn protocol(reason: impl ToString) -> Fail {
    Fail::Batch(BackendError::Protocol {
        backend: NAME,
        reason: reason.to_string(),
    })
}

fn classify_db(db: &DbError, msg: &str) -> Fail {
    match db {
        DbError::Invalid | DbError::ConfigError
            if msg.contains("unconfigured table")
                || msg.contains("does not exist")
                || msg.contains("non-existing keyspace") =>
        {
            Fail::Missing
        }
        DbError::Unavailable { .. }
        | DbError::ReadTimeout { .. }
        | DbError::WriteTimeout { .. }
        | DbError::ReadFailure { .. }
        | DbError::WriteFailure { .. }
        | DbError::Overloaded
        | DbError::IsBootstrapping
        | DbError::ServerError
        | DbError::ProtocolError
        | DbError::TruncateError => unreachable(format!("{db}: {msg}")),
        _ => Fail::Refused(format!("{db}: {msg}")),
    }
}

fn classify_attempt(e: &RequestAttemptError) -> Fail {
    match e {
        RequestAttemptError::DbError(db, msg) => classify_db(db, msg),
        RequestAttemptError::BrokenConnectionError(_)
        | RequestAttemptError::UnableToAllocStreamId => unreachable(e),
        _ => protocol(e),
    }
}

fn classify_prepare(e: &PrepareError) -> Fail {
    match e {
        PrepareError::AllAttemptsFailed { first_attempt } => classify_attempt(first_attempt),
        PrepareError::ConnectionPoolError(_) => unreachable(e),
        _ => protocol(e),
    }
}

fn classify(e: &ExecutionError) -> Fail {
    match e {
        ExecutionError::LastAttemptError(a) => classify_attempt(a),
        ExecutionError::PrepareError(p) => classify_prepare(p),
        ExecutionError::BadQuery(_) => protocol(e),
        _ => unreachable(e),
    }
}

/// `USING TTL` seconds for a time to live of `d`: whole seconds rounded up, plus one. Cassandra
/// truncates the write's time to the second (expiry at `now_secs + ttl`), so `USING TTL n`
/// lives between `n - 1` and `n` seconds; one more second makes every object live at least `d`
/// and at most a second longer (an NF's mapping expiring early would break its connection).
fn ttl_secs(d: Duration) -> i32 {
    let s = (d.as_nanos().div_ceil(1_000_000_000) + 1).min(MAX_TTL);
    i32::try_from(s).unwrap_or(i32::MAX)
}

/// Where an object lives.
pub(crate) struct Loc<'a> {
    key: &'a ObjectKey,
    nf: &'a str,
    /// `instance@core`, or empty for a shared object.
    part: String,
    ks: String,
    kind: Kind,
    id: &'a str,
}

impl<'a> Loc<'a> {
    fn new(key: &'a ObjectKey) -> Option<Loc<'a>> {
        let p = key.parse()?;
        let part = p
            .partition
            .map(|(i, c)| format!("{i}@{c}"))
            .unwrap_or_default();
        let name = if part.is_empty() {
            p.nf.to_string()
        } else {
            format!("{}@{part}", p.nf)
        };
        Some(Loc {
            key,
            nf: p.nf,
            part,
            ks: keyspace_name(&name),
            kind: p.kind,
            id: p.id,
        })
    }

    /// The lock row's id: the key without its partition (`Type@id`).
    fn lock_id(&self) -> String {
        format!("{}@{}", self.kind.name(), self.id)
    }

    fn wrong(&self, wanted: Kind) -> Reply {
        Reply::Error(OpError::WrongKind {
            key: self.key.to_string(),
            wanted: wanted.name(),
            found: self.kind.name(),
        })
    }
}

/// The tables of one kind, first the one whose rows say the object exists.
fn tables(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Value => &["value"],
        Kind::Counter => &["counter", "counter_raw"],
        Kind::List => &["list"],
        Kind::Set => &["set_members"],
        Kind::Map => &["map"],
        Kind::CounterMap => &["cmap", "cmap_raw"],
    }
}

fn table_ddl(ks: &str, table: &str) -> String {
    let cols = match table {
        "value" => "id text PRIMARY KEY, v blob",
        "counter" => "id text PRIMARY KEY, base bigint",
        "counter_raw" => "id text PRIMARY KEY, c counter",
        "list" => {
            "id text, head bigint static, tail bigint static, pos bigint, item blob, \
             PRIMARY KEY (id, pos)"
        }
        "set_members" => "id text, member blob, x boolean, PRIMARY KEY (id, member)",
        "map" => "id text, field blob, v blob, PRIMARY KEY (id, field)",
        "cmap" => "id text, field blob, base bigint, PRIMARY KEY (id, field)",
        "cmap_raw" => "id text, field blob, c counter, PRIMARY KEY (id, field)",
        _ => "id text PRIMARY KEY, owner bigint", // locks
    };
    format!("CREATE TABLE IF NOT EXISTS {ks}.{table} ({cols})")
}

/// The kind an operation needs, if any (delete, whole-object expire and locks take any).
fn op_kind(op: &Op, key_kind: Kind) -> Option<Kind> {
    Some(match op {
        Op::Get { .. } | Op::Set { .. } | Op::CompareAndSet { .. } => Kind::Value,
        Op::Add { .. } | Op::GetCounter { .. } | Op::SetCounter { .. } => Kind::Counter,
        Op::Push { .. } | Op::Pop { .. } => Kind::List,
        Op::Insert { .. } | Op::Remove { .. } | Op::Contains { .. } => Kind::Set,
        Op::MapGet { .. } | Op::MapSet { .. } => Kind::Map,
        Op::Expire { field: Some(_), .. } => Kind::Map,
        Op::MapAdd { .. } | Op::MapGetCounter { .. } => Kind::CounterMap,
        Op::MapDelete { .. } => match key_kind {
            Kind::CounterMap => Kind::CounterMap,
            _ => Kind::Map,
        },
        Op::Len { kind, .. } | Op::ReadAll { kind, .. } => *kind,
        Op::Delete { .. }
        | Op::Expire { field: None, .. }
        | Op::Lock { .. }
        | Op::Unlock { .. } => return None,
    })
}

/// The consecutive adds at the start of `idx`, if its first op is one on an object of its
/// own kind: `(field, delta)` each.
fn add_run<'o>(ops: &'o [Op], idx: &[usize], kind: Kind) -> Option<Vec<(Option<&'o Bytes>, i64)>> {
    let one = |op: &'o Op| match (op, kind) {
        (Op::Add { delta, .. }, Kind::Counter) => Some((None, *delta)),
        (Op::MapAdd { field, delta, .. }, Kind::CounterMap) => Some((Some(field), *delta)),
        _ => None,
    };
    let run: Vec<_> = idx.iter().map_while(|&k| one(&ops[k])).collect();
    (!run.is_empty()).then_some(run)
}

fn len(n: i64) -> Reply {
    Reply::Len(u64::try_from(n).unwrap_or(0))
}

/// A row of `list`: head, tail, TTL(tail), pos, item.
type ListRow = (
    Option<i64>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<Bytes>,
);

/// A list's head and tail (static columns), if the list exists.
struct ListState {
    head: i64,
    tail: i64,
    /// Remaining time to live in seconds, 0 for none.
    ttl: i32,
    /// Rows remain of an expired list (items outlive their list by up to a second).
    leftovers: bool,
    /// The first item, `(pos, item)`.
    first: Option<(i64, Bytes)>,
}

impl ListState {
    fn live(&self) -> bool {
        self.tail > self.head
    }
}

/// The session, the runtime it runs on, and what the connector learned.
pub(crate) struct Shared {
    session: Session,
    pub(crate) config: CassandraConfig,
    prepared: Mutex<HashMap<String, PreparedStatement>>,
    /// Keyspaces (`ks`) and tables (`ks.table`) known to exist.
    created: Mutex<HashSet<String>>,
    ddl: tokio::sync::Mutex<()>,
    stripes: Vec<tokio::sync::Mutex<()>>,
    /// Last, so that it outlives the session when dropped.
    rt: Runtime,
}

impl Shared {
    pub(crate) fn connect(config: CassandraConfig) -> Result<Shared, BackendError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("flowstate-cassandra")
            .enable_all()
            .build()
            .map_err(|e| BackendError::Unreachable {
                backend: NAME,
                reason: format!("cannot start the driver's runtime: {e}"),
            })?;
        let profile = ExecutionProfile::builder()
            .consistency(config.consistency)
            .request_timeout(Some(config.request_timeout))
            .build();
        let nodes = config.nodes.join(", ");
        let mut builder = SessionBuilder::new()
            .known_nodes(&config.nodes)
            .connection_timeout(config.connect_timeout)
            .default_execution_profile_handle(profile.into_handle());
        if let (Some(user), Some(password)) = (&config.username, &config.password) {
            builder = builder.user(user.clone(), password.expose().to_owned());
        }
        if let Some(ca) = &config.ca_file {
            // Each node's certificate is checked against the CA and the node's address.
            let tls = |e: openssl::error::ErrorStack| BackendError::Protocol {
                backend: NAME,
                reason: format!("TLS: ca_file {}: {e}", ca.display()),
            };
            let mut b = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
                .map_err(tls)?;
            b.set_ca_file(ca).map_err(tls)?;
            b.set_verify(openssl::ssl::SslVerifyMode::PEER);
            builder = builder.tls_context(Some(b));
        }
        let session = rt
            .block_on(builder.build())
            .map_err(|e| BackendError::Unreachable {
                backend: NAME,
                reason: format!("cannot connect to {nodes}: {e}"),
            })?;
        let shared = Shared {
            session,
            config,
            prepared: Mutex::new(HashMap::new()),
            created: Mutex::new(HashSet::new()),
            ddl: tokio::sync::Mutex::new(()),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            rt,
        };
        shared.block_on(async {
            shared.ddl(&shared.keyspace_ddl(REGISTRY)).await?;
            shared
                .ddl(&format!(
                    "CREATE TABLE IF NOT EXISTS {REGISTRY}.partitions \
                     (nf text, part text, ks text, PRIMARY KEY (nf, part))"
                ))
                .await
        })?;
        Ok(shared)
    }

    pub(crate) fn block_on<T>(
        &self,
        f: impl std::future::Future<Output = R<T>>,
    ) -> Result<T, BackendError> {
        match self.rt.block_on(f) {
            Ok(v) => Ok(v),
            Err(Fail::Batch(e)) => Err(e),
            Err(Fail::Missing) => Err(BackendError::Protocol {
                backend: NAME,
                reason: "a table the driver created has disappeared".into(),
            }),
            Err(Fail::Refused(r)) => Err(BackendError::Protocol {
                backend: NAME,
                reason: r,
            }),
        }
    }

    fn keyspace_ddl(&self, ks: &str) -> String {
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': {}}}",
            self.config.replication_factor
        )
    }

    /// A schema change: Cassandra applies them one at a time and waits for the cluster to
    /// agree, so they get a longer time limit than reads and writes. Sent to the
    /// [`SchemaCoordinator`].
    async fn ddl(&self, cql: &str) -> R<()> {
        let mut statement = Statement::new(cql);
        statement.set_request_timeout(Some(DDL_TIMEOUT));
        statement.set_load_balancing_policy(Some(Arc::new(SchemaCoordinator)));
        self.session
            .query_unpaged(statement, ())
            .await
            .map(|_| ())
            .map_err(|e| classify(&e))
    }

    fn lock_sets(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.created.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn prepare(&self, cql: &str) -> R<PreparedStatement> {
        if let Some(p) = self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(cql)
        {
            return Ok(p.clone());
        }
        let p = self
            .session
            .prepare(cql)
            .await
            .map_err(|e| classify_prepare(&e))?;
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cql.to_string(), p.clone());
        Ok(p)
    }

    async fn run(&self, cql: &str, values: impl SerializeRow) -> R<QueryResult> {
        let p = self.prepare(cql).await?;
        self.session
            .execute_unpaged(&p, values)
            .await
            .map_err(|e| classify(&e))
    }

    /// Rows of a read; none when the table does not exist.
    async fn rows<T>(&self, cql: &str, values: impl SerializeRow) -> R<Vec<T>>
    where
        T: for<'f> DeserializeRow<'f, 'f>,
    {
        let qr = match self.run(cql, values).await {
            Err(Fail::Missing) => return Ok(Vec::new()),
            r => r?,
        };
        let rows = qr.into_rows_result().map_err(protocol)?;
        let out = rows
            .rows::<T>()
            .map_err(protocol)?
            .collect::<Result<Vec<T>, _>>()
            .map_err(protocol);
        out
    }

    async fn first<T>(&self, cql: &str, values: impl SerializeRow) -> R<Option<T>>
    where
        T: for<'f> DeserializeRow<'f, 'f>,
    {
        Ok(self.rows(cql, values).await?.into_iter().next())
    }

    /// A lightweight transaction: whether it applied, and the current row when it did not.
    async fn lwt(
        &self,
        cql: &str,
        values: impl SerializeRow,
    ) -> R<(bool, Vec<(String, Option<CqlValue>)>)> {
        let qr = self.run(cql, values).await?;
        let rows = qr.into_rows_result().map_err(protocol)?;
        let names: Vec<String> = rows
            .column_specs()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let row: Row = rows.first_row().map_err(protocol)?;
        let applied = match row.columns.first() {
            Some(Some(CqlValue::Boolean(b))) => *b,
            other => return Err(protocol(format!("no [applied] column in {other:?}"))),
        };
        Ok((applied, names.into_iter().zip(row.columns).collect()))
    }

    /// A write; creates its keyspace and tables first, and again if they were dropped.
    async fn write(
        &self,
        loc: &Loc<'_>,
        tables: &[&str],
        cql: &str,
        values: impl SerializeRow + Clone,
    ) -> R<QueryResult> {
        self.ensure(loc, tables).await?;
        match self.run(cql, values.clone()).await {
            Err(Fail::Missing) => {
                self.forget(&loc.ks);
                self.ensure(loc, tables).await?;
                self.run(cql, values).await
            }
            r => r,
        }
    }

    async fn batch(
        &self,
        loc: &Loc<'_>,
        tables: &[&str],
        cqls: &[&str],
        values: impl BatchValues + Clone,
    ) -> R<()> {
        self.ensure(loc, tables).await?;
        let mut batch = Batch::new(BatchType::Unlogged);
        for cql in cqls {
            batch.append_statement(self.prepare(cql).await?);
        }
        self.session
            .batch(&batch, values)
            .await
            .map(|_| ())
            .map_err(|e| classify(&e))
    }

    fn forget(&self, ks: &str) {
        self.lock_sets()
            .retain(|s| s != ks && !s.starts_with(&format!("{ks}.")));
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|cql, _| !cql.contains(&format!(" {ks}.")));
    }

    /// Creates the object's keyspace (and registers it) and `tables`, once per connector.
    async fn ensure(&self, loc: &Loc<'_>, tables: &[&str]) -> R<()> {
        let ks = &loc.ks;
        let missing = |sets: &HashSet<String>| {
            !sets.contains(ks) || tables.iter().any(|t| !sets.contains(&format!("{ks}.{t}")))
        };
        if !missing(&self.lock_sets()) {
            return Ok(());
        }
        let _ddl = self.ddl.lock().await;
        if !self.lock_sets().contains(ks) {
            self.ddl(&self.keyspace_ddl(ks)).await?;
            self.run(
                &format!("INSERT INTO {REGISTRY}.partitions (nf, part, ks) VALUES (?, ?, ?)"),
                (loc.nf, loc.part.as_str(), ks.as_str()),
            )
            .await?;
            self.lock_sets().insert(ks.clone());
        }
        for t in tables {
            let name = format!("{ks}.{t}");
            if !self.lock_sets().contains(&name) {
                self.ddl(&table_ddl(ks, t)).await?;
                self.lock_sets().insert(name);
            }
        }
        Ok(())
    }

    pub(crate) fn drop_nfs(&self, drop: &dyn Fn(&str) -> bool) -> Result<usize, BackendError> {
        self.block_on(async {
            let rows: Vec<(String, String, String)> = self
                .rows(
                    &format!("SELECT nf, part, ks FROM {REGISTRY}.partitions"),
                    (),
                )
                .await?;
            let doomed: Vec<(String, String, String)> =
                rows.into_iter().filter(|(nf, _, _)| drop(nf)).collect();
            let _ddl = self.ddl.lock().await;
            // Concurrently: each drop waits for schema agreement, which is most of its time.
            let drops = doomed.iter().map(|(nf, part, ks)| async move {
                self.ddl(&format!("DROP KEYSPACE IF EXISTS {ks}")).await?;
                self.forget(ks);
                self.run(
                    &format!("DELETE FROM {REGISTRY}.partitions WHERE nf = ? AND part = ?"),
                    (nf.as_str(), part.as_str()),
                )
                .await
            });
            let results: Vec<R<QueryResult>> = futures_util::stream::iter(drops)
                .buffer_unordered(DROPS_AT_ONCE)
                .collect()
                .await;
            for r in results {
                r?;
            }
            let n = doomed.len();
            Ok(n)
        })
    }

    fn stripe(&self, key: &ObjectKey) -> &tokio::sync::Mutex<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let i = usize::try_from(h.finish() % STRIPES as u64).unwrap_or(0);
        &self.stripes[i]
    }

    // -----------------------------------------------------------------------------------------
    // Batches

    pub(crate) async fn execute(&self, ops: &[Op]) -> R<Vec<Reply>> {
        let mut order: Vec<&ObjectKey> = Vec::new();
        let mut groups: HashMap<&ObjectKey, Vec<usize>> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let k = op.key();
            groups
                .entry(k)
                .or_insert_with(|| {
                    order.push(k);
                    Vec::new()
                })
                .push(i);
        }
        let chains = order.iter().map(|k| self.chain(k, ops, &groups[k]));
        let mut replies: Vec<Option<Reply>> = vec![None; ops.len()];
        for chain in try_join_all(chains).await? {
            for (i, r) in chain {
                replies[i] = Some(r);
            }
        }
        replies
            .into_iter()
            .map(|r| r.ok_or_else(|| protocol("an operation got no reply")))
            .collect()
    }

    /// The operations of one object, in order.
    async fn chain(&self, key: &ObjectKey, ops: &[Op], idx: &[usize]) -> R<Vec<(usize, Reply)>> {
        let _one_at_a_time = self.stripe(key).lock().await;
        let Some(loc) = Loc::new(key) else {
            return Ok(idx
                .iter()
                .map(|&i| {
                    (
                        i,
                        Reply::Error(OpError::Refused(format!(
                            "{key}: not a key of the form nf@instance@core@Type@id"
                        ))),
                    )
                })
                .collect());
        };
        let mut out = Vec::with_capacity(idx.len());
        let mut i = 0;
        while i < idx.len() {
            let op = &ops[idx[i]];
            let run_end = |pred: &dyn Fn(&Op) -> bool| {
                let mut j = i;
                while j < idx.len() && pred(&ops[idx[j]]) {
                    j += 1;
                }
                j
            };
            // Operations that change nothing: consecutive ones on one object go out together.
            if op.is_read() {
                let j = run_end(&Op::is_read);
                let rs = join_all(idx[i..j].iter().map(|&k| self.op(&loc, &ops[k]))).await;
                for (&k, r) in idx[i..j].iter().zip(rs) {
                    out.push((k, self.reply(&loc, r)?));
                }
                i = j;
            } else if matches!(op, Op::MapSet { .. }) && loc.kind == Kind::Map {
                let j = run_end(&|o| matches!(o, Op::MapSet { .. }));
                let r = self.map_set_many(&loc, ops, &idx[i..j]).await;
                let r = self.reply(&loc, r)?;
                out.extend(idx[i..j].iter().map(|&k| (k, r.clone())));
                i = j;
            } else if matches!(op, Op::Push { .. }) && loc.kind == Kind::List {
                let j = run_end(&|o| matches!(o, Op::Push { .. }));
                let items: Vec<&[u8]> = idx[i..j]
                    .iter()
                    .filter_map(|&k| match &ops[k] {
                        Op::Push { item, .. } => Some(item.as_slice()),
                        _ => None,
                    })
                    .collect();
                match self.push_many(&loc, &items).await {
                    Ok(rs) => out.extend(idx[i..j].iter().copied().zip(rs)),
                    Err(e) => {
                        let r = self.reply(&loc, Err(e))?;
                        out.extend(idx[i..j].iter().map(|&k| (k, r.clone())));
                    }
                }
                i = j;
            } else if let Some(adds) = add_run(ops, &idx[i..], loc.kind) {
                let j = i + adds.len();
                match self.add_many(&loc, &adds).await {
                    Ok(rs) => out.extend(idx[i..j].iter().copied().zip(rs)),
                    Err(e) => {
                        let r = self.reply(&loc, Err(e))?;
                        out.extend(idx[i..j].iter().map(|&k| (k, r.clone())));
                    }
                }
                i = j;
            } else {
                let r = self.op(&loc, op).await;
                out.push((idx[i], self.reply(&loc, r)?));
                i += 1;
            }
        }
        Ok(out)
    }

    fn reply(&self, loc: &Loc<'_>, r: R<Reply>) -> R<Reply> {
        match r {
            Ok(r) => Ok(r),
            Err(Fail::Refused(m)) => {
                Ok(Reply::Error(OpError::Refused(format!("{}: {m}", loc.key))))
            }
            Err(Fail::Missing) => Err(protocol(format!(
                "{}: a table the driver created has disappeared",
                loc.key
            ))),
            Err(e) => Err(e),
        }
    }

    /// Consecutive map writes: one batch per chunk, the last write of each field.
    async fn map_set_many(&self, loc: &Loc<'_>, ops: &[Op], idx: &[usize]) -> R<Reply> {
        let mut last: Vec<(&[u8], &[u8])> = Vec::new();
        let mut at: HashMap<&[u8], usize> = HashMap::new();
        for &k in idx {
            if let Op::MapSet { field, value, .. } = &ops[k] {
                match at.get(field.as_slice()) {
                    Some(&p) => last[p].1 = value,
                    None => {
                        at.insert(field, last.len());
                        last.push((field, value));
                    }
                }
            }
        }
        let cql = format!("INSERT INTO {}.map (id, field, v) VALUES (?, ?, ?)", loc.ks);
        if last.len() == 1 {
            self.write(loc, &["map"], &cql, (loc.id, last[0].0, last[0].1))
                .await?;
            return Ok(Reply::Done);
        }
        let mut start = 0;
        while start < last.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < last.len()
                && end - start < BATCH_MAX_STATEMENTS
                && (end == start
                    || bytes + last[end].0.len() + last[end].1.len() <= BATCH_MAX_BYTES)
            {
                bytes += last[end].0.len() + last[end].1.len();
                end += 1;
            }
            let values: Vec<(&str, &[u8], &[u8])> = last[start..end]
                .iter()
                .map(|(f, v)| (loc.id, *f, *v))
                .collect();
            let cqls = vec![cql.as_str(); values.len()];
            self.batch(loc, &["map"], &cqls, values).await?;
            start = end;
        }
        Ok(Reply::Done)
    }

    // -----------------------------------------------------------------------------------------
    // Objects

    /// Whether the object under `loc` exists.
    async fn exists(&self, loc: &Loc<'_>) -> R<bool> {
        let (ks, id) = (&loc.ks, loc.id);
        Ok(match loc.kind {
            Kind::List => self.list_state(loc, false).await?.live(),
            kind => {
                let t = tables(kind)[0];
                self.first::<(String,)>(
                    &format!("SELECT id FROM {ks}.{t} WHERE id = ? LIMIT 1"),
                    (id,),
                )
                .await?
                .is_some()
            }
        })
    }

    async fn list_state(&self, loc: &Loc<'_>, with_first: bool) -> R<ListState> {
        let row: Option<ListRow> = if with_first {
            self.first(
                &format!(
                    "SELECT head, tail, TTL(tail), pos, item FROM {}.list WHERE id = ? LIMIT 1",
                    loc.ks
                ),
                (loc.id,),
            )
            .await?
        } else {
            self.first::<(Option<i64>, Option<i64>, Option<i32>)>(
                &format!(
                    "SELECT head, tail, TTL(tail) FROM {}.list WHERE id = ? LIMIT 1",
                    loc.ks
                ),
                (loc.id,),
            )
            .await?
            .map(|(h, t, ttl)| (h, t, ttl, None, None))
        };
        Ok(match row {
            None => ListState {
                head: 0,
                tail: 0,
                ttl: 0,
                leftovers: false,
                first: None,
            },
            Some((Some(head), Some(tail), ttl, pos, item)) => ListState {
                head,
                tail,
                ttl: ttl.unwrap_or(0),
                leftovers: false,
                first: pos.zip(item),
            },
            Some(_) => ListState {
                head: 0,
                tail: 0,
                ttl: 0,
                leftovers: true,
                first: None,
            },
        })
    }

    /// An operation of another kind than its key's.
    async fn mismatch(&self, loc: &Loc<'_>, op: &Op, wanted: Kind) -> R<Reply> {
        if self.exists(loc).await? {
            return Ok(loc.wrong(wanted));
        }
        Ok(match op {
            Op::Get { .. } | Op::Pop { .. } | Op::MapGet { .. } => Reply::Value(None),
            Op::GetCounter { .. } | Op::MapGetCounter { .. } => Reply::Int(0),
            Op::Remove { .. } | Op::Contains { .. } | Op::MapDelete { .. } | Op::Expire { .. } => {
                Reply::Bool(false)
            }
            Op::CompareAndSet {
                expected: Some(_), ..
            } => Reply::Bool(false),
            Op::CompareAndSet {
                expected: None,
                new: None,
                ..
            } => Reply::Bool(true),
            Op::Len { .. } => Reply::Len(0),
            Op::ReadAll { .. } => Reply::Object(None),
            _ => Reply::Error(OpError::Refused(format!(
                "{}: this key names a {}; the cassandra backend keeps each kind in its own \
                 table and cannot store a {} under it",
                loc.key,
                loc.kind.name(),
                wanted.name()
            ))),
        })
    }

    async fn op(&self, loc: &Loc<'_>, op: &Op) -> R<Reply> {
        if let Op::Len {
            kind: Kind::Value | Kind::Counter,
            ..
        } = op
        {
            return Ok(Reply::Error(OpError::Refused(format!(
                "{}: Len needs a collection kind",
                loc.key
            ))));
        }
        if let Some(wanted) = op_kind(op, loc.kind) {
            if wanted != loc.kind {
                return self.mismatch(loc, op, wanted).await;
            }
        }
        let (ks, id) = (loc.ks.as_str(), loc.id);
        match op {
            Op::Get { .. } => Ok(Reply::Value(self.get_value(loc).await?)),
            Op::Set { value, .. } => {
                let cql = format!("INSERT INTO {ks}.value (id, v) VALUES (?, ?)");
                self.write(loc, &["value"], &cql, (id, value.as_slice()))
                    .await?;
                Ok(Reply::Done)
            }
            Op::CompareAndSet { expected, new, .. } => self.cas(loc, expected, new).await,
            Op::Delete { .. } => self.delete(loc).await,
            Op::Expire {
                field: None, ttl, ..
            } => self.expire(loc, ttl_secs(*ttl)).await,
            Op::Expire {
                field: Some(f),
                ttl,
                ..
            } => {
                let Some(v) = self.map_get(loc, f).await? else {
                    return Ok(Reply::Bool(false));
                };
                let cql =
                    format!("INSERT INTO {ks}.map (id, field, v) VALUES (?, ?, ?) USING TTL ?");
                self.write(
                    loc,
                    &["map"],
                    &cql,
                    (id, f.as_slice(), v.as_slice(), ttl_secs(*ttl)),
                )
                .await?;
                Ok(Reply::Bool(true))
            }
            Op::Add { delta, .. } => self.add(loc, None, *delta).await,
            Op::MapAdd { field, delta, .. } => self.add(loc, Some(field), *delta).await,
            Op::GetCounter { .. } => Ok(Reply::Int(self.counter(loc, None).await?.unwrap_or(0))),
            Op::MapGetCounter { field, .. } => Ok(Reply::Int(
                self.counter(loc, Some(field)).await?.unwrap_or(0),
            )),
            Op::SetCounter { value, .. } => {
                let raw = self.raw(loc, None).await?;
                let cql = format!("INSERT INTO {ks}.counter (id, base) VALUES (?, ?)");
                self.write(
                    loc,
                    tables(Kind::Counter),
                    &cql,
                    (id, raw.wrapping_sub(*value)),
                )
                .await?;
                Ok(Reply::Done)
            }
            Op::Push { item, .. } => Ok(self.push_many(loc, &[item]).await?.remove(0)),
            Op::Pop { .. } => self.pop(loc).await,
            Op::Insert { member, .. } => {
                let q_has = format!("SELECT id FROM {ks}.set_members WHERE id = ? AND member = ?");
                let q_ttl = format!("SELECT TTL(x) FROM {ks}.set_members WHERE id = ? LIMIT 1");
                let (has, ttl) = futures_util::try_join!(
                    self.first::<(String,)>(&q_has, (id, member.as_slice())),
                    self.first::<(Option<i32>,)>(&q_ttl, (id,)),
                )?;
                if has.is_some() {
                    return Ok(Reply::Bool(false));
                }
                let ttl = ttl.and_then(|t| t.0).unwrap_or(0);
                let cql = format!(
                    "INSERT INTO {ks}.set_members (id, member, x) VALUES (?, ?, true) USING TTL ?"
                );
                self.write(loc, &["set_members"], &cql, (id, member.as_slice(), ttl))
                    .await?;
                Ok(Reply::Bool(true))
            }
            Op::Contains { member, .. } => Ok(Reply::Bool(self.has_member(loc, member).await?)),
            Op::Remove { member, .. } => {
                if !self.has_member(loc, member).await? {
                    return Ok(Reply::Bool(false));
                }
                let cql = format!("DELETE FROM {ks}.set_members WHERE id = ? AND member = ?");
                self.write(loc, &["set_members"], &cql, (id, member.as_slice()))
                    .await?;
                Ok(Reply::Bool(true))
            }
            Op::MapGet { field, .. } => Ok(Reply::Value(self.map_get(loc, field).await?)),
            Op::MapSet { field, value, .. } => {
                let cql = format!("INSERT INTO {ks}.map (id, field, v) VALUES (?, ?, ?)");
                self.write(
                    loc,
                    &["map"],
                    &cql,
                    (id, field.as_slice(), value.as_slice()),
                )
                .await?;
                Ok(Reply::Done)
            }
            Op::MapDelete { field, .. } => {
                let t = tables(loc.kind)[0];
                let found = self
                    .first::<(String,)>(
                        &format!("SELECT id FROM {ks}.{t} WHERE id = ? AND field = ?"),
                        (id, field.as_slice()),
                    )
                    .await?;
                if found.is_none() {
                    return Ok(Reply::Bool(false));
                }
                let cql = format!("DELETE FROM {ks}.{t} WHERE id = ? AND field = ?");
                self.write(loc, tables(loc.kind), &cql, (id, field.as_slice()))
                    .await?;
                Ok(Reply::Bool(true))
            }
            Op::Len { .. } => match loc.kind {
                Kind::List => {
                    let s = self.list_state(loc, false).await?;
                    Ok(len(if s.live() { s.tail - s.head } else { 0 }))
                }
                kind => {
                    let t = tables(kind)[0];
                    let n = self
                        .first::<(i64,)>(
                            &format!("SELECT COUNT(*) FROM {ks}.{t} WHERE id = ?"),
                            (id,),
                        )
                        .await?
                        .map_or(0, |c| c.0);
                    Ok(len(n))
                }
            },
            Op::ReadAll { .. } => Ok(Reply::Object(self.read_all(loc).await?)),
            Op::Lock { owner, lease, .. } => self.lock(loc, *owner, ttl_secs(*lease)).await,
            Op::Unlock { owner, .. } => {
                let cql = format!("DELETE FROM {ks}.locks WHERE id = ? IF owner = ?");
                match self.lwt(&cql, (loc.lock_id(), *owner as i64)).await {
                    Err(Fail::Missing) => Ok(Reply::Bool(false)),
                    r => Ok(Reply::Bool(r?.0)),
                }
            }
        }
    }

    async fn get_value(&self, loc: &Loc<'_>) -> R<Option<Bytes>> {
        Ok(self
            .first::<(Option<Bytes>,)>(
                &format!("SELECT v FROM {}.value WHERE id = ?", loc.ks),
                (loc.id,),
            )
            .await?
            .map(|r| r.0.unwrap_or_default()))
    }

    async fn map_get(&self, loc: &Loc<'_>, field: &[u8]) -> R<Option<Bytes>> {
        Ok(self
            .first::<(Option<Bytes>,)>(
                &format!("SELECT v FROM {}.map WHERE id = ? AND field = ?", loc.ks),
                (loc.id, field),
            )
            .await?
            .map(|r| r.0.unwrap_or_default()))
    }

    async fn has_member(&self, loc: &Loc<'_>, member: &[u8]) -> R<bool> {
        Ok(self
            .first::<(String,)>(
                &format!(
                    "SELECT id FROM {}.set_members WHERE id = ? AND member = ?",
                    loc.ks
                ),
                (loc.id, member),
            )
            .await?
            .is_some())
    }

    async fn cas(&self, loc: &Loc<'_>, expected: &Option<Bytes>, new: &Option<Bytes>) -> R<Reply> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        self.ensure(loc, &["value"]).await?;
        let applied = match (expected, new) {
            (None, None) => return Ok(Reply::Bool(self.get_value(loc).await?.is_none())),
            (None, Some(n)) => {
                let cql = format!("INSERT INTO {ks}.value (id, v) VALUES (?, ?) IF NOT EXISTS");
                self.lwt(&cql, (id, n.as_slice())).await?.0
            }
            (Some(e), Some(n)) => {
                let cql = format!("UPDATE {ks}.value SET v = ? WHERE id = ? IF v = ?");
                self.lwt(&cql, (n.as_slice(), id, e.as_slice())).await?.0
            }
            (Some(e), None) => {
                let cql = format!("DELETE FROM {ks}.value WHERE id = ? IF v = ?");
                self.lwt(&cql, (id, e.as_slice())).await?.0
            }
        };
        Ok(Reply::Bool(applied))
    }

    /// The raw Cassandra counter (0 when never added to).
    async fn raw(&self, loc: &Loc<'_>, field: Option<&[u8]>) -> R<i64> {
        let ks = &loc.ks;
        let row = match field {
            None => {
                self.first::<(Option<Counter>,)>(
                    &format!("SELECT c FROM {ks}.counter_raw WHERE id = ?"),
                    (loc.id,),
                )
                .await?
            }
            Some(f) => {
                self.first::<(Option<Counter>,)>(
                    &format!("SELECT c FROM {ks}.cmap_raw WHERE id = ? AND field = ?"),
                    (loc.id, f),
                )
                .await?
            }
        };
        Ok(row.and_then(|r| r.0).map_or(0, |c| c.0))
    }

    /// The base of a counter or counter-map field, if it exists.
    async fn base(&self, loc: &Loc<'_>, field: Option<&[u8]>) -> R<Option<i64>> {
        let ks = &loc.ks;
        let row = match field {
            None => {
                self.first::<(Option<i64>,)>(
                    &format!("SELECT base FROM {ks}.counter WHERE id = ?"),
                    (loc.id,),
                )
                .await?
            }
            Some(f) => {
                self.first::<(Option<i64>,)>(
                    &format!("SELECT base FROM {ks}.cmap WHERE id = ? AND field = ?"),
                    (loc.id, f),
                )
                .await?
            }
        };
        Ok(row.map(|r| r.0.unwrap_or(0)))
    }

    async fn counter(&self, loc: &Loc<'_>, field: Option<&[u8]>) -> R<Option<i64>> {
        let (base, raw) = futures_util::try_join!(self.base(loc, field), self.raw(loc, field))?;
        Ok(base.map(|b| raw.wrapping_sub(b)))
    }

    /// Adds to a Cassandra counter and reads it back; a missing object starts at 0 by
    /// setting its base to the counter's value before the add.
    async fn add(&self, loc: &Loc<'_>, field: Option<&Bytes>, delta: i64) -> R<Reply> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        let field = field.map(Vec::as_slice);
        let tabs = tables(loc.kind);
        let update = async {
            match field {
                None => {
                    let cql = format!("UPDATE {ks}.counter_raw SET c = c + ? WHERE id = ?");
                    self.write(loc, tabs, &cql, (Counter(delta), id)).await
                }
                Some(f) => {
                    let cql =
                        format!("UPDATE {ks}.cmap_raw SET c = c + ? WHERE id = ? AND field = ?");
                    self.write(loc, tabs, &cql, (Counter(delta), id, f)).await
                }
            }
        };
        let (_, base) = futures_util::try_join!(update, self.base(loc, field))?;
        let raw = self.raw(loc, field).await?;
        if let Some(base) = base {
            return Ok(Reply::Int(raw.wrapping_sub(base)));
        }
        let base = raw.wrapping_sub(delta);
        match field {
            None => {
                let cql = format!("INSERT INTO {ks}.counter (id, base) VALUES (?, ?)");
                self.write(loc, tabs, &cql, (id, base)).await?;
            }
            Some(f) => {
                let cql = format!("INSERT INTO {ks}.cmap (id, field, base) VALUES (?, ?, ?)");
                self.write(loc, tabs, &cql, (id, f, base)).await?;
            }
        }
        Ok(Reply::Int(delta))
    }

    /// Appends items: one read of the list's head and tail, the items in bounded batches, then
    /// the new tail (items past the tail are invisible until it moves).
    async fn push_many(&self, loc: &Loc<'_>, items: &[&[u8]]) -> R<Vec<Reply>> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        let s = self.list_state(loc, false).await?;
        if s.leftovers {
            let cql = format!("DELETE FROM {ks}.list WHERE id = ?");
            self.write(loc, &["list"], &cql, (id,)).await?;
        }
        let (head, tail, ttl) = if s.live() {
            (s.head, s.tail, s.ttl)
        } else {
            (0, 0, 0)
        };
        let cql = format!("INSERT INTO {ks}.list (id, pos, item) VALUES (?, ?, ?) USING TTL ?");
        let rows: Vec<(&str, i64, &[u8], i32)> = items
            .iter()
            .zip(tail..)
            .map(|(item, pos)| (id, pos, *item, ttl))
            .collect();
        let new_tail = tail.saturating_add(i64::try_from(items.len()).unwrap_or(i64::MAX));
        self.rewrite(loc, &cql, rows, |r| r.2.len()).await?;
        let cql = format!("UPDATE {ks}.list USING TTL ? SET head = ?, tail = ? WHERE id = ?");
        self.write(loc, &["list"], &cql, (ttl, head, new_tail, id))
            .await?;
        Ok((tail..new_tail).map(|pos| len(pos + 1 - head)).collect())
    }

    /// Adds to counters (or counter-map fields): one add of the sum per counter, the replies
    /// are the running totals (the adds are serialised by the object's stripe lock).
    async fn add_many(&self, loc: &Loc<'_>, adds: &[(Option<&Bytes>, i64)]) -> R<Vec<Reply>> {
        let mut order: Vec<Option<&Bytes>> = Vec::new();
        let mut sums: HashMap<Option<&Bytes>, i64> = HashMap::new();
        for (f, d) in adds {
            let sum = sums.entry(*f).or_insert_with(|| {
                order.push(*f);
                0
            });
            *sum = sum.wrapping_add(*d);
        }
        let finals = try_join_all(order.iter().map(|f| self.add(loc, *f, sums[f]))).await?;
        let mut running: HashMap<Option<&Bytes>, i64> = HashMap::new();
        for (f, r) in order.iter().zip(finals) {
            let Reply::Int(v) = r else {
                return Ok(vec![r; adds.len()]);
            };
            running.insert(*f, v.wrapping_sub(sums[f]));
        }
        Ok(adds
            .iter()
            .map(|(f, d)| {
                let v = running.entry(*f).or_insert(0);
                *v = v.wrapping_add(*d);
                Reply::Int(*v)
            })
            .collect())
    }

    async fn pop(&self, loc: &Loc<'_>) -> R<Reply> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        let s = self.list_state(loc, true).await?;
        if !s.live() {
            return Ok(Reply::Value(None));
        }
        // Items before the head are deleted. An item missing at the head (its time to live ran
        // out a second before its list's) is skipped; with none left the list is removed.
        let (pos, item) = match s.first {
            Some((pos, item)) if (s.head..s.tail).contains(&pos) => (pos, Some(item)),
            _ => (s.tail - 1, None),
        };
        if pos + 1 >= s.tail {
            self.write(
                loc,
                &["list"],
                &format!("DELETE FROM {ks}.list WHERE id = ?"),
                (id,),
            )
            .await?;
        } else {
            // A range tombstone, not one per item: reads skip it at once.
            let cqls = [
                format!("DELETE FROM {ks}.list WHERE id = ? AND pos <= ?"),
                format!("UPDATE {ks}.list USING TTL ? SET head = ? WHERE id = ?"),
            ];
            let cqls: Vec<&str> = cqls.iter().map(String::as_str).collect();
            self.batch(loc, &["list"], &cqls, ((id, pos), (s.ttl, pos + 1, id)))
                .await?;
        }
        Ok(Reply::Value(item))
    }

    async fn delete(&self, loc: &Loc<'_>) -> R<Reply> {
        if !self.exists(loc).await? {
            return Ok(Reply::Bool(false));
        }
        let t = tables(loc.kind)[0];
        let cql = format!("DELETE FROM {}.{t} WHERE id = ?", loc.ks);
        self.write(loc, tables(loc.kind), &cql, (loc.id,)).await?;
        Ok(Reply::Bool(true))
    }

    /// Time to live on a whole object: its rows are written again with `USING TTL`.
    async fn expire(&self, loc: &Loc<'_>, ttl: i32) -> R<Reply> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        let Some(obj) = self.read_all(loc).await? else {
            return Ok(Reply::Bool(false));
        };
        let tabs = tables(loc.kind);
        match obj {
            Object::Value(v) => {
                let cql = format!("INSERT INTO {ks}.value (id, v) VALUES (?, ?) USING TTL ?");
                self.write(loc, tabs, &cql, (id, v.as_slice(), ttl)).await?;
            }
            Object::Counter(_) => {
                let base = self.base(loc, None).await?.unwrap_or(0);
                let cql = format!("INSERT INTO {ks}.counter (id, base) VALUES (?, ?) USING TTL ?");
                self.write(loc, tabs, &cql, (id, base, ttl)).await?;
            }
            Object::List(items) => {
                let s = self.list_state(loc, false).await?;
                let cql =
                    format!("UPDATE {ks}.list USING TTL ? SET head = ?, tail = ? WHERE id = ?");
                self.write(loc, tabs, &cql, (ttl, s.head, s.tail, id))
                    .await?;
                let cql =
                    format!("INSERT INTO {ks}.list (id, pos, item) VALUES (?, ?, ?) USING TTL ?");
                let rows: Vec<(&str, i64, &[u8], i32)> = items
                    .iter()
                    .zip(s.head..)
                    .map(|(item, pos)| (id, pos, item.as_slice(), ttl))
                    .collect();
                self.rewrite(loc, &cql, rows, |r| r.2.len()).await?;
            }
            Object::Set(members) => {
                let cql = format!(
                    "INSERT INTO {ks}.set_members (id, member, x) VALUES (?, ?, true) USING TTL ?"
                );
                let rows: Vec<(&str, &[u8], i32)> =
                    members.iter().map(|m| (id, m.as_slice(), ttl)).collect();
                self.rewrite(loc, &cql, rows, |r| r.1.len()).await?;
            }
            Object::Map(fields) => {
                let cql =
                    format!("INSERT INTO {ks}.map (id, field, v) VALUES (?, ?, ?) USING TTL ?");
                let rows: Vec<(&str, &[u8], &[u8], i32)> = fields
                    .iter()
                    .map(|(f, v)| (id, f.as_slice(), v.as_slice(), ttl))
                    .collect();
                self.rewrite(loc, &cql, rows, |r| r.1.len() + r.2.len())
                    .await?;
            }
            Object::CounterMap(_) => {
                let bases: Vec<(Bytes, Option<i64>)> = self
                    .rows(
                        &format!("SELECT field, base FROM {ks}.cmap WHERE id = ?"),
                        (id,),
                    )
                    .await?;
                let cql =
                    format!("INSERT INTO {ks}.cmap (id, field, base) VALUES (?, ?, ?) USING TTL ?");
                let rows: Vec<(&str, &[u8], i64, i32)> = bases
                    .iter()
                    .map(|(f, b)| (id, f.as_slice(), b.unwrap_or(0), ttl))
                    .collect();
                self.rewrite(loc, &cql, rows, |r| r.1.len()).await?;
            }
        }
        Ok(Reply::Bool(true))
    }

    /// Writes rows of one partition in batches of bounded size.
    async fn rewrite<T: SerializeRow + Clone>(
        &self,
        loc: &Loc<'_>,
        cql: &str,
        rows: Vec<T>,
        size: impl Fn(&T) -> usize,
    ) -> R<()> {
        let tabs = tables(loc.kind);
        let mut start = 0;
        while start < rows.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < rows.len()
                && end - start < BATCH_MAX_STATEMENTS
                && (end == start || bytes + size(&rows[end]) <= BATCH_MAX_BYTES)
            {
                bytes += size(&rows[end]);
                end += 1;
            }
            let chunk = rows[start..end].to_vec();
            let cqls = vec![cql; chunk.len()];
            self.batch(loc, tabs, &cqls, chunk).await?;
            start = end;
        }
        Ok(())
    }

    async fn read_all(&self, loc: &Loc<'_>) -> R<Option<Object>> {
        let (ks, id) = (loc.ks.as_str(), loc.id);
        Ok(match loc.kind {
            Kind::Value => self.get_value(loc).await?.map(Object::Value),
            Kind::Counter => self.counter(loc, None).await?.map(Object::Counter),
            Kind::List => {
                let rows: Vec<ListRow> = self
                    .rows(
                        &format!(
                            "SELECT head, tail, TTL(tail), pos, item FROM {ks}.list WHERE id = ?"
                        ),
                        (id,),
                    )
                    .await?;
                let Some((Some(head), Some(tail), ..)) = rows.first().cloned() else {
                    return Ok(None);
                };
                let items: Vec<Bytes> = rows
                    .into_iter()
                    .filter_map(|(_, _, _, pos, item)| {
                        pos.filter(|p| (head..tail).contains(p))
                            .map(|_| item.unwrap_or_default())
                    })
                    .collect();
                (!items.is_empty()).then_some(Object::List(items))
            }
            Kind::Set => {
                let rows: Vec<(Bytes,)> = self
                    .rows(
                        &format!("SELECT member FROM {ks}.set_members WHERE id = ?"),
                        (id,),
                    )
                    .await?;
                (!rows.is_empty()).then(|| Object::Set(rows.into_iter().map(|r| r.0).collect()))
            }
            Kind::Map => {
                let rows: Vec<(Bytes, Option<Bytes>)> = self
                    .rows(
                        &format!("SELECT field, v FROM {ks}.map WHERE id = ?"),
                        (id,),
                    )
                    .await?;
                (!rows.is_empty()).then(|| {
                    Object::Map(
                        rows.into_iter()
                            .map(|(f, v)| (f, v.unwrap_or_default()))
                            .collect(),
                    )
                })
            }
            Kind::CounterMap => {
                let q_bases = format!("SELECT field, base FROM {ks}.cmap WHERE id = ?");
                let q_raws = format!("SELECT field, c FROM {ks}.cmap_raw WHERE id = ?");
                let (bases, raws) = futures_util::try_join!(
                    self.rows::<(Bytes, Option<i64>)>(&q_bases, (id,)),
                    self.rows::<(Bytes, Option<Counter>)>(&q_raws, (id,)),
                )?;
                let raws: HashMap<Bytes, i64> = raws
                    .into_iter()
                    .map(|(f, c)| (f, c.map_or(0, |c| c.0)))
                    .collect();
                (!bases.is_empty()).then(|| {
                    Object::CounterMap(
                        bases
                            .into_iter()
                            .map(|(f, b)| {
                                let raw = raws.get(&f).copied().unwrap_or(0);
                                (f, raw.wrapping_sub(b.unwrap_or(0)))
                            })
                            .collect(),
                    )
                })
            }
        })
    }

    async fn lock(&self, loc: &Loc<'_>, owner: u64, ttl: i32) -> R<Reply> {
        let ks = &loc.ks;
        let lid = loc.lock_id();
        // Owners are stored as the bigint with the same bits.
        let me = owner as i64;
        self.ensure(loc, &["locks"]).await?;
        let cql =
            format!("INSERT INTO {ks}.locks (id, owner) VALUES (?, ?) IF NOT EXISTS USING TTL ?");
        let (applied, row) = self.lwt(&cql, (lid.as_str(), me, ttl)).await?;
        if applied {
            return Ok(Reply::Bool(true));
        }
        let holder = row.iter().find_map(|(name, v)| match (name.as_str(), v) {
            ("owner", Some(CqlValue::BigInt(o))) => Some(*o),
            _ => None,
        });
        if holder != Some(me) {
            return Ok(Reply::Bool(false));
        }
        let cql = format!("UPDATE {ks}.locks USING TTL ? SET owner = ? WHERE id = ? IF owner = ?");
        Ok(Reply::Bool(
            self.lwt(&cql, (ttl, me, lid.as_str(), me)).await?.0,
        ))
    }

    // -----------------------------------------------------------------------------------------
    // Partitions

    pub(crate) async fn partitions(&self, nf: &str, kind: Kind, id: &str) -> R<Vec<ObjectKey>> {
        let rows: Vec<(String, String)> = self
            .rows(
                &format!("SELECT part, ks FROM {REGISTRY}.partitions WHERE nf = ?"),
                (nf,),
            )
            .await?;
        let keys: Vec<ObjectKey> = rows
            .iter()
            .filter_map(|(part, _)| {
                if part.is_empty() {
                    return Some(ObjectKey::shared(nf, kind, id));
                }
                let (i, c) = part.split_once('@')?;
                let owner = flowstate_state::Owner::new(nf, i.parse().ok()?, c.parse().ok()?);
                Some(ObjectKey::partitioned(&owner, kind, id))
            })
            .collect();
        let found = try_join_all(keys.iter().map(|k| async move {
            match Loc::new(k) {
                Some(loc) => Ok::<bool, Fail>(self.exists(&loc).await?),
                None => Ok(false),
            }
        }))
        .await?;
        let mut out: Vec<ObjectKey> = keys
            .into_iter()
            .zip(found)
            .filter_map(|(k, f)| f.then_some(k))
            .collect();
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::Owner;
    use scylla::frame::types::Consistency;

    #[test]
    fn store_errors_fail_the_batch_or_the_operation() {
        let missing = classify_db(&DbError::Invalid, "unconfigured table value");
        assert!(matches!(missing, Fail::Missing));
        let missing = classify_db(&DbError::Invalid, "Keyspace fs_x does not exist");
        assert!(matches!(missing, Fail::Missing));
        let down = classify_db(
            &DbError::Unavailable {
                consistency: Consistency::Quorum,
                required: 2,
                alive: 1,
            },
            "Cannot achieve consistency level QUORUM",
        );
        assert!(matches!(
            down,
            Fail::Batch(BackendError::Unreachable { .. })
        ));
        assert!(matches!(
            classify_db(&DbError::Overloaded, "busy"),
            Fail::Batch(BackendError::Unreachable { .. })
        ));
        let refused = classify_db(&DbError::Invalid, "Mutation of 20 MiB is too large");
        assert!(matches!(refused, Fail::Refused(m) if m.contains("too large")));
    }

    #[test]
    fn ttls_are_whole_seconds_rounded_up_plus_the_truncated_second() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 3);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
        assert_eq!(ttl_secs(Duration::from_secs(u64::MAX)), 630_720_000);
    }

    #[test]
    fn keys_map_to_keyspaces_and_runs_of_adds_are_found() {
        let k = ObjectKey::partitioned(&Owner::new("nat", 1, 2), Kind::Counter, "a@b");
        let loc = Loc::new(&k).unwrap();
        assert_eq!(loc.ks, keyspace_name("nat@1@2"));
        assert_eq!(
            (loc.part.as_str(), loc.id, loc.kind),
            ("1@2", "a@b", Kind::Counter)
        );
        assert_eq!(loc.lock_id(), "Counter@a@b");
        let s = ObjectKey::shared("nat", Kind::Map, "m");
        assert_eq!(Loc::new(&s).unwrap().ks, keyspace_name("nat"));

        let ops = [
            Op::Add {
                key: k.clone(),
                delta: 2,
            },
            Op::Add {
                key: k.clone(),
                delta: -1,
            },
            Op::GetCounter { key: k.clone() },
            Op::Add {
                key: k.clone(),
                delta: 5,
            },
        ];
        let run = add_run(&ops, &[0, 1, 2, 3], Kind::Counter).unwrap();
        assert_eq!(run, vec![(None, 2), (None, -1)]);
        assert_eq!(add_run(&ops, &[2, 3], Kind::Counter), None);
        assert_eq!(add_run(&ops, &[0], Kind::CounterMap), None);
        // Ops of another kind than their key's are told apart.
        assert_eq!(op_kind(&ops[0], Kind::Counter), Some(Kind::Counter));
        let del = Op::MapDelete {
            key: k.clone(),
            field: vec![],
        };
        assert_eq!(op_kind(&del, Kind::CounterMap), Some(Kind::CounterMap));
        assert_eq!(op_kind(&del, Kind::Set), Some(Kind::Map));
        assert_eq!(op_kind(&Op::Delete { key: k }, Kind::Set), None);
    }
}
