//! Unique object keys: `nf@instance@core@Type@id` (FlexState §III-B2), and `nf@Type@id` for
//! objects shared by every core and instance (CHC §4.3).

use core::fmt;
use std::sync::Arc;

/// The type of a state object; part of its key: [`Value`](crate::Value) (one blob),
/// [`Counter`](crate::Counter) (a signed 64-bit counter), [`List`](crate::List) (a FIFO of
/// values), [`Set`](crate::Set), [`Map`](crate::Map) (keys to values) or
/// [`CounterMap`](crate::CounterMap) (keys to counters).
pub use flowstate_objects::Kind;

/// Who owns a partition of state: an NF, one of its instances, one core of that instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// NF identifier from the configuration (e.g. `nat`).
    pub nf: Arc<str>,
    /// NF instance identifier.
    pub instance: u32,
    /// Core (worker) of the instance.
    pub core: u32,
}

impl Owner {
    /// An owner.
    pub fn new(nf: &str, instance: u32, core: u32) -> Self {
        Owner {
            nf: nf.into(),
            instance,
            core,
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}@{}", self.nf, self.instance, self.core)
    }
}

/// The store key of one object, as bytes of UTF-8 text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    /// `nf@instance@core@Type@id`: an object partitioned to one core of one instance.
    pub fn partitioned(owner: &Owner, kind: Kind, id: &str) -> Self {
        ObjectKey(format!("{owner}@{}@{id}", kind.name()).into())
    }

    /// `nf@Type@id`: an object shared by every core of every instance of `nf`.
    pub fn shared(nf: &str, kind: Kind, id: &str) -> Self {
        ObjectKey(format!("{nf}@{}@{id}", kind.name()).into())
    }

    /// A key read back from a store (e.g. by a scan), if it is one of ours.
    pub fn from_raw(text: &str) -> Option<Self> {
        let key = ObjectKey(text.into());
        key.parse().is_some().then_some(key)
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The parts of a key, or `None` if it is not one of ours. The id may itself contain `@`.
    pub fn parse(&self) -> Option<KeyParts<'_>> {
        let (nf, rest) = self.as_str().split_once('@')?;
        let kind_named = |t: &str| Kind::ALL.into_iter().find(|k| k.name() == t);
        // Partitioned: instance@core@Type@id.
        let mut it = rest.splitn(4, '@');
        if let (Some(i), Some(c), Some(t), Some(id)) = (it.next(), it.next(), it.next(), it.next())
        {
            if let (Ok(i), Ok(c), Some(kind)) = (i.parse(), c.parse(), kind_named(t)) {
                return Some(KeyParts {
                    nf,
                    partition: Some((i, c)),
                    kind,
                    id,
                });
            }
        }
        // Shared: Type@id.
        let (t, id) = rest.split_once('@')?;
        Some(KeyParts {
            nf,
            partition: None,
            kind: kind_named(t)?,
            id,
        })
    }
}

/// A key taken apart by [`ObjectKey::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyParts<'a> {
    /// The NF.
    pub nf: &'a str,
    /// `(instance, core)` of a partitioned object; `None` for a shared one.
    pub partition: Option<(u32, u32)>,
    /// The object's type.
    pub kind: Kind,
    /// The object's id.
    pub id: &'a str,
}

/// The key's bytes, as a store protocol carries keys.
impl AsRef<[u8]> for ObjectKey {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flexstate_key_layout() {
        let o = Owner::new("nf1", 1, 3);
        let k = ObjectKey::partitioned(&o, Kind::Counter, "abc");
        assert_eq!(k.as_str(), "nf1@1@3@Counter@abc");
        let p = k.parse().unwrap();
        assert_eq!(
            (p.nf, p.partition, p.kind, p.id),
            ("nf1", Some((1, 3)), Kind::Counter, "abc")
        );
        let s = ObjectKey::shared("nat", Kind::List, "pool@v4");
        assert_eq!(s.as_str(), "nat@List@pool@v4");
        let p = s.parse().unwrap();
        assert_eq!(
            (p.nf, p.partition, p.kind, p.id),
            ("nat", None, Kind::List, "pool@v4")
        );
        assert_eq!(ObjectKey("junk".into()).parse(), None);
    }
}
