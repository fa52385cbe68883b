//! Spare byte buffers, reused instead of allocated.

use crate::Obj;
use std::collections::VecDeque;

/// Most spare buffers kept.
const SPARE_BUFFERS: usize = 1024;
/// Largest spare buffer kept (bytes of capacity).
const SPARE_BYTES: usize = 4096;
/// Most spare lists kept.
const SPARE_LISTS: usize = 256;
/// Largest spare list kept (items of capacity).
const SPARE_LIST_ITEMS: usize = 64;

/// Spare byte buffers: the values of answers already sent, popped list items, deleted map
/// fields and the keys and values of removed objects, reused for the next answer's value,
/// list item, field or new object's key, so that in steady state reading a value, moving
/// items through a list or creating an object where one was removed allocates nothing.
/// Bounded in count and size; a buffer is reused only where it fits snugly (no stored item
/// keeps much more memory than it needs).
#[derive(Default)]
pub struct Spare {
    bufs: Vec<Vec<u8>>,
    /// Empty lists with room, from lists removed (popped empty or deleted): a list emptied
    /// and filled again, a NAT's free-port list or a work queue, allocates nothing.
    lists: Vec<VecDeque<Vec<u8>>>,
}

impl Spare {
    /// A buffer holding a copy of `b`.
    pub fn copy(&mut self, b: &[u8]) -> Vec<u8> {
        match self.bufs.pop() {
            Some(mut v) if v.capacity() >= b.len() && v.capacity() <= 2 * b.len() + 64 => {
                v.clear();
                v.extend_from_slice(b);
                v
            }
            // A buffer that does not fit is freed: the spares follow the sizes in use.
            _ => b.to_vec(),
        }
    }

    /// Takes `v` back for reuse (or frees it).
    pub fn put(&mut self, v: Vec<u8>) {
        if v.capacity() > 0 && v.capacity() <= SPARE_BYTES && self.bufs.len() < SPARE_BUFFERS {
            self.bufs.push(v);
        }
    }

    /// An empty list, with room if one was retired.
    pub fn list(&mut self) -> VecDeque<Vec<u8>> {
        self.lists.pop().unwrap_or_default()
    }

    /// Takes back the buffers of a removed object: a value, or a list's items and (if small)
    /// the list.
    pub fn retire(&mut self, obj: Obj) {
        match obj {
            Obj::List(mut l) => {
                for item in l.drain(..) {
                    self.put(item);
                }
                if l.capacity() <= SPARE_LIST_ITEMS && self.lists.len() < SPARE_LISTS {
                    self.lists.push(l);
                }
            }
            Obj::Value(v) => self.put(v),
            _ => {}
        }
    }

    /// Spare lists held (for tests).
    pub fn lists(&self) -> usize {
        self.lists.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_are_reused_only_where_they_fit_and_are_bounded() {
        let mut sp = Spare::default();
        let v = sp.copy(b"0123456789abcdef");
        let at = v.as_ptr() as usize;
        sp.put(v);
        let w = sp.copy(b"fedcba9876543210");
        assert_eq!(
            w.as_ptr() as usize,
            at,
            "a buffer of the same size is reused"
        );
        assert_eq!(w, b"fedcba9876543210");
        // A buffer far too big for a small value is not handed out (and is let go).
        sp.put(Vec::with_capacity(1024));
        let small = sp.copy(b"x");
        assert!(small.capacity() < 64);
        assert!(sp.bufs.is_empty());
        // Bounded in size and count.
        sp.put(Vec::with_capacity(SPARE_BYTES + 1));
        assert!(sp.bufs.is_empty());
        for _ in 0..SPARE_BUFFERS + 10 {
            sp.put(Vec::with_capacity(8));
        }
        assert_eq!(sp.bufs.len(), SPARE_BUFFERS);
    }
}
