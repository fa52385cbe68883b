//! Merging functions: one view of an object whose partitions are spread over cores and
//! instances (FlexState §VI-B "merging functions"). They read the store, so call
//! [`Partition::flush_all`](crate::Partition::flush_all) on every partition first when the
//! store is the in-process one.

use crate::backend::{Backend, Object, Op, Reply};
use crate::codec::Codec;
use crate::key::Kind;
use crate::StateError;
use std::collections::{BTreeMap, BTreeSet};

fn read_all(
    backend: &mut dyn Backend,
    nf: &str,
    kind: Kind,
    id: &str,
) -> Result<Vec<Object>, StateError> {
    let keys = backend.partitions(nf, kind, id)?;
    let ops: Vec<Op> = keys
        .into_iter()
        .map(|key| Op::ReadAll { key, kind })
        .collect();
    let mut replies = Vec::with_capacity(ops.len());
    backend.execute(&ops, &mut replies)?;
    replies
        .into_iter()
        .filter_map(|r| match r {
            Reply::Object(Some(o)) => Some(Ok(o)),
            Reply::Object(None) => None,
            Reply::Error(e) => Some(Err(StateError::Op(e))),
            _ => Some(Err(StateError::Unexpected("expected an object"))),
        })
        .collect()
}

/// The sum of every partition of counter `id` of NF `nf`.
pub fn counter_sum(backend: &mut dyn Backend, nf: &str, id: &str) -> Result<i64, StateError> {
    Ok(read_all(backend, nf, Kind::Counter, id)?
        .into_iter()
        .map(|o| if let Object::Counter(v) = o { v } else { 0 })
        .sum())
}

/// Per key, the sum over every partition of counter-map `id`.
pub fn counter_map_sum<K: Codec + Ord>(
    backend: &mut dyn Backend,
    nf: &str,
    id: &str,
) -> Result<BTreeMap<K, i64>, StateError> {
    let mut out = BTreeMap::new();
    for o in read_all(backend, nf, Kind::CounterMap, id)? {
        if let Object::CounterMap(entries) = o {
            for (k, v) in entries {
                *out.entry(K::from_bytes(&k)?).or_insert(0) += v;
            }
        }
    }
    Ok(out)
}

/// The union of every partition of map `id`; where partitions disagree on a key, `combine`
/// decides (called with the value so far and the next one).
pub fn map_union<K: Codec + Ord, V: Codec>(
    backend: &mut dyn Backend,
    nf: &str,
    id: &str,
    mut combine: impl FnMut(V, V) -> V,
) -> Result<BTreeMap<K, V>, StateError> {
    let mut out: BTreeMap<K, V> = BTreeMap::new();
    for o in read_all(backend, nf, Kind::Map, id)? {
        if let Object::Map(entries) = o {
            for (k, v) in entries {
                let (k, v) = (K::from_bytes(&k)?, V::from_bytes(&v)?);
                let merged = match out.remove(&k) {
                    Some(prev) => combine(prev, v),
                    None => v,
                };
                out.insert(k, merged);
            }
        }
    }
    Ok(out)
}

/// The union of every partition of set `id`.
pub fn set_union<T: Codec + Ord>(
    backend: &mut dyn Backend,
    nf: &str,
    id: &str,
) -> Result<BTreeSet<T>, StateError> {
    let mut out = BTreeSet::new();
    for o in read_all(backend, nf, Kind::Set, id)? {
        if let Object::Set(members) = o {
            for m in members {
                out.insert(T::from_bytes(&m)?);
            }
        }
    }
    Ok(out)
}

/// Every partition's items of list `id`, partitions in key order.
pub fn list_concat<T: Codec>(
    backend: &mut dyn Backend,
    nf: &str,
    id: &str,
) -> Result<Vec<T>, StateError> {
    let mut out = Vec::new();
    for o in read_all(backend, nf, Kind::List, id)? {
        if let Object::List(items) = o {
            for i in items {
                out.push(T::from_bytes(&i)?);
            }
        }
    }
    Ok(out)
}
