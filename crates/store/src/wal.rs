//! Durability (CHC §5.4: "checkpoint + write-ahead log"): each shard appends the updates of
//! every batch it applies to its own log before it answers, and from time to time writes a
//! checkpoint of all its objects and starts a new log.
//!
//! Files in the data directory, per shard `i` and generation `g`:
//! * `shard-i-g.ckpt`: the shard's objects, leases, idempotency and clock-tag state when log
//!   `g` began (absent for generation 0);
//! * `shard-i-g.wal`: records of the batches applied since.
//!
//! A record is `length u32 | crc32c u32 | now u64 | client u64 | op id u64 | count u32 |
//! requests [| parts u32 | (shard u32 | count u32 | requests)*]` (the requests encoded as in a
//! batch frame). Recovery loads the newest checkpoint and replays its log with each record's own
//! time (so time to live and leases replay exactly). A bad record (short, or its checksum or
//! content wrong) with no good record after it is a torn tail, the last write cut short by a
//! crash: never acknowledged (a batch is answered after its record is written), so it is cut.
//! A bad record with a good one after it is damage to acknowledged data: the start stops with
//! [`RecoveryError::CorruptLog`] naming the byte, and the file is left as it is (Redis refuses
//! a damaged append-only file the same way). Starting with `salvage` keeps the records before
//! the damage, cuts the rest and keeps the whole damaged file beside as `….wal.corrupt`.
//!
//! A fenced batch over several shards is applied whole or not at all across a crash. The
//! fence's shard applies its part first and its record carries the batch's other parts (the
//! optional tail above); the other shards apply theirs only after that record is written, and
//! log them as usual. Recovery rolls forward every such part whose shard's log does not show it
//! applied (the shard's last op id of that client is lower: a client's fenced batches all pass
//! its fence's shard, so they reach every other shard in op id order). The fence's shard keeps
//! a part until its shard says it applied it, and writes the parts still open at a checkpoint
//! into the new log, so a part is never covered by nothing.
//!
//! The log is written with one `write` per group of batches (one turn of the shard's event
//! loop) before their answers go out: acknowledged updates survive the store process being
//! killed (`kill -9`). With `sync` each write is also `fdatasync`ed, for surviving the
//! machine's crash.

use crate::shard::{Entry, Objects};
use flowstate_objects::{Lease, Obj, Stored};
use flowstate_proto::{self as proto, DecodeError, Rd, Request};
use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

const CKPT_MAGIC: &[u8; 8] = b"FSCKPT01";

/// The open log of one shard.
pub(crate) struct Wal {
    dir: PathBuf,
    shard: usize,
    gen: u64,
    file: File,
    buf: Vec<u8>,
    sync: bool,
    /// Bytes in the current log (what a restart would replay).
    pub(crate) bytes: u64,
}

fn wal_path(dir: &Path, shard: usize, gen: u64) -> PathBuf {
    dir.join(format!("shard-{shard}-{gen}.wal"))
}
fn ckpt_path(dir: &Path, shard: usize, gen: u64) -> PathBuf {
    dir.join(format!("shard-{shard}-{gen}.ckpt"))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A batch's operations on one shard: (shard, operations with their index in the frame).
pub(crate) type Part = (usize, Vec<(u32, Request)>);

/// Appends a log record to `buf`: `ops` applied here, and the updates of `rest`, the parts a
/// fenced batch has on other shards (see the module documentation).
pub(crate) fn encode_record<B: AsRef<[u8]>>(
    buf: &mut Vec<u8>,
    now: Duration,
    client: u64,
    op_id: u64,
    ops: impl Iterator<Item = Request<B>>,
    rest: &[Part],
) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    proto::put_u64(buf, nanos(now));
    proto::put_u64(buf, client);
    proto::put_u64(buf, op_id);
    put_requests(buf, ops);
    let updating = |ops: &&Part| ops.1.iter().any(|(_, r)| !r.op.is_read());
    let parts = rest.iter().filter(updating).count();
    if parts > 0 {
        proto::put_u32(buf, parts as u32);
        for (shard, ops) in rest.iter().filter(updating) {
            proto::put_u32(buf, *shard as u32);
            put_requests(buf, ops.iter().map(|(_, r)| r).filter(|r| !r.op.is_read()));
        }
    }
    let len = (buf.len() - start - 8) as u32;
    let crc = proto::crc32c(0, &buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// `count u32 | requests`.
fn put_requests<R: std::borrow::Borrow<Request<B>>, B: AsRef<[u8]>>(
    buf: &mut Vec<u8>,
    ops: impl Iterator<Item = R>,
) {
    let count_at = buf.len();
    proto::put_u32(buf, 0);
    let mut n = 0u32;
    for r in ops {
        let r = r.borrow();
        proto::put_request(buf, &r.op, r.instance, r.clock);
        n += 1;
    }
    buf[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
}

impl Wal {
    /// Appends the record of one batch (its updating operations, and a fenced batch's parts
    /// on other shards) to the pending group.
    pub(crate) fn record<B: AsRef<[u8]>>(
        &mut self,
        now: Duration,
        client: u64,
        op_id: u64,
        ops: impl Iterator<Item = Request<B>>,
        rest: &[Part],
    ) {
        encode_record(&mut self.buf, now, client, op_id, ops, rest);
    }

    /// Writes the pending group; the caller answers only after this returns `Ok`.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.buf)?;
        if self.sync {
            self.file.sync_data()?;
        }
        self.bytes += self.buf.len() as u64;
        self.buf.clear();
        if self.buf.capacity() > 8 << 20 {
            self.buf.shrink_to(64 * 1024);
        }
        Ok(())
    }

    /// Writes a checkpoint of `objects` as generation `gen + 1`, starts that generation's
    /// log with the records `carry` (the parts of fenced batches still open) and removes the
    /// previous generation's files.
    pub(crate) fn checkpoint(
        &mut self,
        objects: &Objects,
        now: Duration,
        carry: &[u8],
    ) -> io::Result<()> {
        self.flush()?;
        let next = self.gen + 1;
        let body = encode_checkpoint(objects, now);
        let tmp = self
            .dir
            .join(format!("shard-{}-{next}.ckpt.tmp", self.shard));
        {
            let mut f = private()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(CKPT_MAGIC)?;
            f.write_all(&(body.len() as u64).to_le_bytes())?;
            f.write_all(&proto::crc32c(0, &body).to_le_bytes())?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, ckpt_path(&self.dir, self.shard, next))?;
        let mut file = private()
            .create(true)
            .append(true)
            .open(wal_path(&self.dir, self.shard, next))?;
        file.write_all(carry)?;
        if self.sync {
            file.sync_data()?;
        }
        sync_dir(&self.dir);
        let old = self.gen;
        self.gen = next;
        self.file = file;
        self.bytes = carry.len() as u64;
        let _ = fs::remove_file(wal_path(&self.dir, self.shard, old));
        let _ = fs::remove_file(ckpt_path(&self.dir, self.shard, old));
        Ok(())
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Why a data directory cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        source: io::Error,
    },
    /// A log is damaged before its end: acknowledged updates follow the damage. Nothing was
    /// changed on disk.
    #[error(
        "{path}: log record {record} at byte {offset} is corrupt ({reason}) and good records \
         follow it: acknowledged updates would be lost, so the store does not start and the \
         file is kept as it is; to start with the {record} records before it and lose the \
         rest, start once with --salvage-log (the whole file is kept beside as \
         {path}.corrupt)"
    )]
    CorruptLog {
        /// The log file.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// Its number (the good records before it).
        record: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A checkpoint is corrupt (checkpoints are written whole and renamed, so this is damage
    /// from outside).
    #[error("{path}: corrupt checkpoint: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RecoveryError + '_ {
    move |source| RecoveryError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The number of shards the data in `dir` was written with and whether objects were placed
/// by partition ([`crate::Shared::shard_of`]), if any (stored in `shards`: `N`, or `N
/// by-partition`).
pub(crate) fn stored_shards(dir: &Path) -> Result<Option<(usize, bool)>, RecoveryError> {
    let p = dir.join("shards");
    match fs::read_to_string(&p) {
        Ok(s) => {
            let mut words = s.split_whitespace();
            let n = words.next().and_then(|n| n.parse().ok());
            match (n, words.next(), words.next()) {
                (Some(n), None, None) => Ok(Some((n, false))),
                (Some(n), Some(BY_PARTITION), None) => Ok(Some((n, true))),
                _ => Err(RecoveryError::Corrupt {
                    path: p,
                    reason: format!("{s:?} is not a shard count and placement"),
                }),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&p)(e)),
    }
}

/// Options that create a file readable and writable by its owner only (0600): the data
/// directory holds every NF's state.
fn private() -> OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    o.mode(0o600);
    o
}

/// Writes `data` to a new file at `path` (0600), replacing any.
fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    private()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(data)
}

/// Creates the data directory `dir` (and its parents) readable by its owner only (0700).
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The `shards` file's word for objects placed by partition.
const BY_PARTITION: &str = "by-partition";

/// Records the shard count of a new data directory (its objects placed by partition).
pub(crate) fn store_shards(dir: &Path, n: usize) -> Result<(), RecoveryError> {
    let p = dir.join("shards");
    write_private(&p, format!("{n} {BY_PARTITION}\n").as_bytes()).map_err(io_err(&p))?;
    sync_dir(dir);
    Ok(())
}

/// What recovery found for one shard.
pub(crate) struct Recovered {
    pub(crate) wal: Wal,
    pub(crate) records: u64,
    pub(crate) torn_bytes: u64,
    /// The other shards' parts of the fenced batches in the log, for [`roll_forward`].
    pub(crate) parts: Vec<LoggedPart>,
}

/// A part of a fenced batch, as the log of its fence's shard has it.
pub(crate) struct LoggedPart {
    now: Duration,
    client: u64,
    op_id: u64,
    shard: usize,
    ops: Vec<Request>,
}

/// Applies on each shard the logged parts its own log does not show applied (its last op id
/// of the part's client is lower), in op id order, and logs them there; how many.
pub(crate) fn roll_forward(
    shards: &mut [(Objects, Option<Wal>)],
    mut parts: Vec<LoggedPart>,
) -> io::Result<u64> {
    parts.sort_by_key(|p| (p.client, p.op_id));
    let mut applied = 0;
    for p in parts {
        let Some((objects, wal)) = shards.get_mut(p.shard) else {
            continue;
        };
        if objects.clients.last(p.client).is_some_and(|l| p.op_id <= l) {
            continue;
        }
        objects.clients.applied(p.client, p.op_id);
        for r in &p.ops {
            objects.apply_ref(&r.borrowed(), p.now);
        }
        if let Some(w) = wal {
            w.record(p.now, p.client, p.op_id, p.ops.into_iter(), &[]);
        }
        applied += 1;
    }
    for w in shards.iter_mut().filter_map(|(_, w)| w.as_mut()) {
        w.flush()?;
    }
    Ok(applied)
}

/// Loads shard `shard` from `dir` into `objects` and opens its log for appending; with
/// `salvage`, a log damaged before its end is cut at the damage (see the module
/// documentation).
pub(crate) fn recover(
    dir: &Path,
    shard: usize,
    sync: bool,
    salvage: bool,
    objects: &mut Objects,
) -> Result<Recovered, RecoveryError> {
    // The newest generation with a checkpoint (or 0).
    let mut gen = 0u64;
    let prefix = format!("shard-{shard}-");
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(g) = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".ckpt"))
            .and_then(|g| g.parse::<u64>().ok())
        {
            gen = gen.max(g);
        }
    }
    if gen > 0 {
        let p = ckpt_path(dir, shard, gen);
        let data = fs::read(&p).map_err(io_err(&p))?;
        load_checkpoint(&data, objects).map_err(|reason| RecoveryError::Corrupt {
            path: p.clone(),
            reason,
        })?;
    }
    let wp = wal_path(dir, shard, gen);
    let mut data = Vec::new();
    match File::open(&wp) {
        Ok(mut f) => {
            f.read_to_end(&mut data).map_err(io_err(&wp))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&wp)(e)),
    }
    let mut at = 0usize;
    let mut records = 0;
    let mut parts = Vec::new();
    let mut salvaged = false;
    while at < data.len() {
        let bad = match record_at(&data, at) {
            Ok(body) => match replay(body, objects, &mut parts) {
                Ok(()) => {
                    records += 1;
                    at += 8 + body.len();
                    continue;
                }
                Err(_) => "its content does not decode",
            },
            Err(why) => why,
        };
        if (at + 1..data.len()).any(|from| record_at(&data, from).is_ok()) {
            if !salvage {
                return Err(RecoveryError::CorruptLog {
                    path: wp,
                    offset: at as u64,
                    record: records,
                    reason: bad,
                });
            }
            let kept = wp.with_extension("wal.corrupt");
            write_private(&kept, &data).map_err(io_err(&kept))?;
            tracing::warn!(
                "{}: salvaged: {records} records kept; record {records} at byte {at} is \
                 corrupt ({bad}), it and the {} bytes after it are cut (the whole file is kept \
                 as {})",
                wp.display(),
                data.len() - at,
                kept.display()
            );
            salvaged = true;
        }
        break;
    }
    let torn = (data.len() - at) as u64;
    let file = private()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&wp)
        .map_err(io_err(&wp))?;
    if torn > 0 {
        if !salvaged {
            tracing::warn!(
                "{}: cutting {torn} bytes of an unacknowledged torn record",
                wp.display()
            );
        }
        file.set_len(at as u64).map_err(io_err(&wp))?;
        file.sync_all().map_err(io_err(&wp))?;
    }
    drop(file);
    let file = OpenOptions::new()
        .append(true)
        .open(&wp)
        .map_err(io_err(&wp))?;
    objects.expired.clear();
    Ok(Recovered {
        wal: Wal {
            dir: dir.to_owned(),
            shard,
            gen,
            file,
            buf: Vec::with_capacity(64 * 1024),
            sync,
            bytes: at as u64,
        },
        records,
        torn_bytes: torn,
        parts,
    })
}

/// The body of the record at `data[at..]` if it is whole and its checksum holds; what is
/// wrong if not.
fn record_at(data: &[u8], at: usize) -> Result<&[u8], &'static str> {
    let head = data.get(at..at + 8).ok_or("it is cut short")?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    // The smallest record: its time, client, op id and operation count (so that zeros, as a
    // crash can leave at the end of a file, are never a record).
    if len < 28 {
        return Err("its length is impossible");
    }
    let body = data
        .get(at + 8..(at + 8).saturating_add(len))
        .ok_or("it is cut short")?;
    match proto::crc32c(0, body) == crc {
        true => Ok(body),
        false => Err("its checksum does not match"),
    }
}

fn replay(
    body: &[u8],
    objects: &mut Objects,
    parts: &mut Vec<LoggedPart>,
) -> Result<(), DecodeError> {
    let mut r = Rd::new(body);
    let now = Duration::from_nanos(r.u64()?);
    let client = r.u64()?;
    let op_id = r.u64()?;
    // Decode the whole record before applying any of it.
    let reqs = requests(&mut r)?;
    let found = parts.len();
    if !r.is_empty() {
        for _ in 0..r.count(8)? {
            let shard = r.u32()? as usize;
            let ops = requests(&mut r)?.iter().map(Request::owned).collect();
            parts.push(LoggedPart {
                now,
                client,
                op_id,
                shard,
                ops,
            });
        }
    }
    if !r.is_empty() {
        parts.truncate(found);
        return Err(DecodeError::Malformed("trailing bytes in a log record"));
    }
    for req in &reqs {
        objects.apply_ref(req, now);
    }
    if op_id != 0 {
        objects.clients.applied(client, op_id);
    }
    Ok(())
}

/// `count u32 | requests`, decoded.
fn requests<'a>(r: &mut Rd<'a>) -> Result<Vec<Request<&'a [u8]>>, DecodeError> {
    let n = r.count(2)?;
    let mut reqs = Vec::with_capacity(n);
    for _ in 0..n {
        reqs.push(r.request_ref()?);
    }
    Ok(reqs)
}

fn encode_checkpoint(o: &Objects, now: Duration) -> Vec<u8> {
    let mut w = Vec::with_capacity(64 * 1024);
    proto::put_u64(&mut w, nanos(now));
    proto::put_u32(&mut w, o.clients.len() as u32);
    for (c, last) in o.clients.iter() {
        proto::put_u64(&mut w, c);
        proto::put_u64(&mut w, last);
    }
    proto::put_u32(&mut w, o.objects.len() as u32);
    for (k, e) in &o.objects {
        proto::put_bytes(&mut w, k);
        proto::put_u64(&mut w, e.object.deadline.map_or(u64::MAX, nanos));
        proto::put_u64(&mut w, e.owner.map_or(u64::MAX, u64::from));
        proto::put_opt_object(&mut w, Some(&e.object.obj.to_object()));
        match &e.object.obj {
            Obj::Map(m) => {
                proto::put_u32(&mut w, m.deadlines().count() as u32);
                for (f, d) in m.deadlines() {
                    proto::put_bytes(&mut w, f);
                    proto::put_u64(&mut w, nanos(d));
                }
            }
            _ => proto::put_u32(&mut w, 0),
        }
        let tags = e.tags.as_deref();
        proto::put_u32(&mut w, tags.map_or(0, |t| t.len() as u32));
        for (i, set) in tags.into_iter().flatten() {
            proto::put_u32(&mut w, *i);
            proto::put_u32(&mut w, set.len() as u32);
            for c in set {
                proto::put_u64(&mut w, *c);
            }
        }
    }
    proto::put_u32(&mut w, o.locks.len() as u32);
    for (k, l) in o.locks.iter() {
        proto::put_bytes(&mut w, k);
        proto::put_u64(&mut w, l.owner);
        proto::put_u64(&mut w, nanos(l.until));
    }
    w
}

fn load_checkpoint(data: &[u8], o: &mut Objects) -> Result<(), String> {
    let e = |e: DecodeError| e.to_string();
    if data.get(..8) != Some(CKPT_MAGIC.as_slice()) {
        return Err("not a flowstate checkpoint".into());
    }
    let mut r = Rd::new(&data[8..]);
    let len = r.u64().map_err(e)?;
    let crc = r.u32().map_err(e)?;
    if r.buf.len() as u64 != len || proto::crc32c(0, r.buf) != crc {
        return Err("length or checksum mismatch".into());
    }
    let _when = r.u64().map_err(e)?;
    let n = r.count(16).map_err(e)?;
    for _ in 0..n {
        let c = r.u64().map_err(e)?;
        let last = r.u64().map_err(e)?;
        o.clients.applied(c, last);
    }
    let n = r.count(4).map_err(e)?;
    for _ in 0..n {
        let key = r.bytes().map_err(e)?.to_vec();
        let deadline = r.u64().map_err(e)?;
        let owner = r.u64().map_err(e)?;
        let obj = r
            .opt_object()
            .map_err(e)?
            .ok_or("an object entry without an object")?;
        let mut entry = Entry::new(Stored {
            obj: Obj::from_object(obj),
            deadline: None,
        });
        entry.object.deadline = (deadline != u64::MAX).then(|| Duration::from_nanos(deadline));
        entry.owner = u32::try_from(owner).ok();
        let nd = r.count(12).map_err(e)?;
        for _ in 0..nd {
            let f = r.bytes().map_err(e)?.to_vec();
            let d = Duration::from_nanos(r.u64().map_err(e)?);
            if let Obj::Map(m) = &mut entry.object.obj {
                m.expire(&f, d);
            }
        }
        let nt = r.count(8).map_err(e)?;
        if nt > 0 {
            let mut tags: HashMap<u32, BTreeSet<u64>> = HashMap::new();
            for _ in 0..nt {
                let i = r.u32().map_err(e)?;
                let k = r.count(8).map_err(e)?;
                let set = tags.entry(i).or_default();
                for _ in 0..k {
                    set.insert(r.u64().map_err(e)?);
                }
            }
            entry.tags = Some(Box::new(tags));
        }
        o.objects.insert(key.clone(), entry);
        o.reindex(&key);
    }
    let n = r.count(20).map_err(e)?;
    for _ in 0..n {
        let key = r.bytes().map_err(e)?.to_vec();
        let owner = r.u64().map_err(e)?;
        let until = Duration::from_nanos(r.u64().map_err(e)?);
        o.locks.restore(key, Lease { owner, until });
    }
    if !r.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_data_directory_keeps_its_placement() {
        let dir = tempfile::tempdir().unwrap();
        assert!(stored_shards(dir.path()).unwrap().is_none());
        store_shards(dir.path(), 4).unwrap();
        assert_eq!(stored_shards(dir.path()).unwrap(), Some((4, true)));
        // Written by an older version: objects placed by whole key.
        std::fs::write(dir.path().join("shards"), "4\n").unwrap();
        assert_eq!(stored_shards(dir.path()).unwrap(), Some((4, false)));
        std::fs::write(dir.path().join("shards"), "4 sideways\n").unwrap();
        assert!(stored_shards(dir.path()).is_err());
    }

    use super::*;
    use flowstate_proto::{Kind, Op, Reply};

    fn apply(o: &mut Objects, wal: &mut Wal, now: Duration, op: Op) -> Reply {
        let req: Request = op.into();
        let r = o.apply(&req, now).0;
        wal.record(now, 1, 0, std::iter::once(req.borrowed()), &[]);
        wal.flush().unwrap();
        r
    }

    #[test]
    fn log_and_checkpoint_recover_the_same_objects_and_cut_torn_tails() {
        let dir = tempfile::tempdir().unwrap();
        let t = Duration::from_secs(100);
        let mut o = Objects::default();
        let mut wal = recover(dir.path(), 0, false, false, &mut o).unwrap().wal;
        let k = |s: &str| s.as_bytes().to_vec();
        apply(
            &mut o,
            &mut wal,
            t,
            Op::Add {
                key: k("c"),
                delta: 3,
            },
        );
        apply(
            &mut o,
            &mut wal,
            t,
            Op::Push {
                key: k("l"),
                item: k("a"),
            },
        );
        wal.checkpoint(&o, t, &[]).unwrap();
        apply(
            &mut o,
            &mut wal,
            t,
            Op::Add {
                key: k("c"),
                delta: 4,
            },
        );
        apply(
            &mut o,
            &mut wal,
            t,
            Op::MapSet {
                key: k("m"),
                field: k("f"),
                value: k("v"),
            },
        );
        apply(
            &mut o,
            &mut wal,
            t,
            Op::Expire {
                key: k("m"),
                field: Some(k("f")),
                ttl: Duration::from_secs(5),
            },
        );
        drop(wal);
        // Nothing of the data is readable by others.
        for f in fs::read_dir(dir.path()).unwrap() {
            use std::os::unix::fs::PermissionsExt;
            let f = f.unwrap();
            let mode = f.metadata().unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{:?}: {mode:o}", f.path());
        }
        // A torn record at the end (never acknowledged).
        let wp = wal_path(dir.path(), 0, 1);
        let mut f = OpenOptions::new().append(true).open(&wp).unwrap();
        f.write_all(&[40, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let mut back = Objects::default();
        let rec = recover(dir.path(), 0, false, false, &mut back).unwrap();
        assert_eq!(rec.records, 3);
        assert_eq!(rec.torn_bytes, 6);
        for key in ["c", "l", "m"] {
            let kind = match key {
                "c" => Kind::Counter,
                "l" => Kind::List,
                _ => Kind::Map,
            };
            let read = Request::from(Op::ReadAll { key: k(key), kind });
            assert_eq!(back.apply(&read, t).0, o.apply(&read, t).0, "{key}");
        }
        // The field's time to live came back too.
        let read = Request::from(Op::MapGet {
            key: k("m"),
            field: k("f"),
        });
        assert_eq!(
            back.apply(&read, t + Duration::from_secs(6)).0,
            Reply::Value(None)
        );
    }

    /// A log of 1,000 acknowledged sets.
    fn thousand_sets(dir: &Path) -> (PathBuf, Vec<u8>) {
        let mut o = Objects::default();
        let mut wal = recover(dir, 0, false, false, &mut o).unwrap().wal;
        for i in 0..1000 {
            let set = Op::Set {
                key: format!("k{i:04}").into_bytes(),
                value: vec![b'v'; 20],
            };
            apply(&mut o, &mut wal, Duration::from_secs(100), set);
        }
        drop(wal);
        let wp = wal_path(dir, 0, 0);
        let data = std::fs::read(&wp).unwrap();
        (wp, data)
    }

    #[test]
    fn damage_before_the_end_stops_the_start_keeps_the_file_and_salvage_keeps_the_good_part() {
        let dir = tempfile::tempdir().unwrap();
        let (wp, mut data) = thousand_sets(dir.path());
        // One bit flipped a tenth of the way in: inside record 100 (records are equal).
        let at = data.len() / 10;
        data[at] ^= 0x10;
        std::fs::write(&wp, &data).unwrap();
        let record = data.len() / 1000;
        match recover(dir.path(), 0, false, false, &mut Objects::default()) {
            Err(RecoveryError::CorruptLog {
                offset, record: n, ..
            }) => {
                assert_eq!(n as usize, at / record);
                assert_eq!(offset as usize, n as usize * record);
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a damaged log was accepted"),
        }
        assert_eq!(
            std::fs::read(&wp).unwrap(),
            data,
            "the log is kept as it is"
        );
        // Salvage: the records before the damage, the whole file kept beside.
        let mut o = Objects::default();
        let rec = recover(dir.path(), 0, false, true, &mut o).unwrap();
        assert_eq!(rec.records as usize, at / record);
        assert_eq!(o.len(), at / record);
        assert_eq!(
            std::fs::read(wp.with_extension("wal.corrupt")).unwrap(),
            data
        );
        assert_eq!(std::fs::read(&wp).unwrap().len(), at / record * record);
    }

    #[test]
    fn a_torn_or_zeroed_tail_is_cut_and_the_start_goes_on() {
        for tail in [&[0u8; 4096][..], &[200, 0, 0, 0, 1, 2, 3][..]] {
            let dir = tempfile::tempdir().unwrap();
            let (wp, mut data) = thousand_sets(dir.path());
            // The last record damaged as a crash leaves it: cut short, then garbage or zeros.
            data.truncate(data.len() - 5);
            data.extend_from_slice(tail);
            std::fs::write(&wp, &data).unwrap();
            let mut o = Objects::default();
            let rec = recover(dir.path(), 0, false, false, &mut o).unwrap();
            assert_eq!(rec.records, 999);
            assert_eq!(o.len(), 999);
            assert!(!wp.with_extension("wal.corrupt").exists());
        }
    }

    /// Shard 0's log carries the parts of a fenced batch (client 7, op 2) on shards 1 and 2;
    /// shard 1 logged its part before the crash, shard 2 did not: only shard 2's is rolled
    /// forward, once, also from a checkpoint's carried records.
    #[test]
    fn a_fenced_batch_cut_off_by_a_crash_is_rolled_forward_where_its_part_is_missing() {
        let t = Duration::from_secs(100);
        let add = |key: &str| -> Vec<(u32, Request)> {
            let op = Op::Add {
                key: key.as_bytes().to_vec(),
                delta: 5,
            };
            vec![(1, op.into())]
        };
        let read = |o: &mut Objects, key: &str| {
            let req = Request::from(Op::GetCounter {
                key: key.as_bytes().to_vec(),
            });
            o.apply(&req, t).0
        };
        let rest = [(1, add("b")), (2, add("c"))];
        let recover_all = |dir: &Path| {
            let mut states: Vec<(Objects, Option<Wal>)> = Vec::new();
            let mut parts = Vec::new();
            for i in 0..3 {
                let mut o = Objects::default();
                let r = recover(dir, i, false, false, &mut o).unwrap();
                parts.extend(r.parts);
                states.push((o, Some(r.wal)));
            }
            let n = roll_forward(&mut states, parts).unwrap();
            (states, n)
        };
        for carried in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (mut states, _) = recover_all(dir.path());
            let fence_part = add("a");
            let (o0, w0) = &mut states[0];
            o0.apply(&fence_part[0].1, t);
            let w0 = w0.as_mut().unwrap();
            let own = fence_part.iter().map(|(_, r)| r.borrowed());
            w0.record(t, 7, 2, own, &rest);
            w0.flush().unwrap();
            if carried {
                let mut carry = Vec::new();
                encode_record(&mut carry, t, 7, 2, std::iter::empty::<Request>(), &rest);
                w0.checkpoint(o0, t, &carry).unwrap();
            }
            let (o1, w1) = &mut states[1];
            o1.apply(&rest[0].1[0].1, t);
            let w1 = w1.as_mut().unwrap();
            w1.record(t, 7, 2, rest[0].1.iter().map(|(_, r)| r.borrowed()), &[]);
            w1.flush().unwrap();
            drop(states);
            let (mut states, n) = recover_all(dir.path());
            assert_eq!(n, 1, "carried: {carried}");
            for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
                assert_eq!(
                    read(&mut states[i].0, key),
                    Reply::Int(5),
                    "{key}, {carried}"
                );
            }
            drop(states);
            // Logged where it was rolled forward: nothing more the next time.
            let (mut states, n) = recover_all(dir.path());
            assert_eq!(n, 0);
            assert_eq!(read(&mut states[2].0, "c"), Reply::Int(5));
        }
    }
}
