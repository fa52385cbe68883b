//! A binary trie for longest-prefix match: the baseline HashMVT §II-C and §VI compare hash
//! matching against (one node per bit, a walk of up to `width` dependent memory accesses),
//! and the oracle the tests check [`crate::Mvt`] against.

use crate::key::{Key, Match};

const NIL: u32 = u32::MAX;

/// A binary trie mapping prefixes to `u32` values.
#[derive(Debug, Clone)]
pub struct BinaryTrie {
    /// Children (0, 1) of every node; node 0 is the root.
    kids: Vec<[u32; 2]>,
    /// Value stored at each node, or `NIL`.
    vals: Vec<u32>,
    len: usize,
}

impl Default for BinaryTrie {
    fn default() -> Self {
        Self::new()
    }
}

impl BinaryTrie {
    /// An empty trie.
    pub fn new() -> Self {
        BinaryTrie {
            kids: vec![[NIL; 2]],
            vals: vec![NIL],
            len: 0,
        }
    }

    /// Prefixes stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no prefix is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Nodes allocated.
    pub fn nodes(&self) -> usize {
        self.kids.len()
    }

    /// Stores `value` (not `u32::MAX`) for prefix `m`; a later insert of the same prefix wins.
    pub fn insert(&mut self, m: &Match, value: u32) {
        let key = m.as_key();
        let mut n = 0usize;
        for i in 0..m.len() {
            let b = usize::from(key.bit(i));
            if self.kids[n][b] == NIL {
                self.kids.push([NIL; 2]);
                self.vals.push(NIL);
                self.kids[n][b] = (self.kids.len() - 1) as u32;
            }
            n = self.kids[n][b] as usize;
        }
        if self.vals[n] == NIL {
            self.len += 1;
        }
        self.vals[n] = value;
    }

    /// The value of the longest stored prefix of `key`.
    #[inline]
    pub fn lookup(&self, key: &Key) -> Option<u32> {
        let mut n = 0usize;
        let mut best = self.vals[0];
        for i in 0..key.bits() {
            let next = self.kids[n][usize::from(key.bit(i))];
            if next == NIL {
                break;
            }
            n = next as usize;
            if self.vals[n] != NIL {
                best = self.vals[n];
            }
        }
        (best != NIL).then_some(best)
    }
}
