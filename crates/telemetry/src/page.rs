//! Paging of long documents (`/api/v1/tables/NF/TABLE?limit=N&after=CURSOR`): an answer holds
//! at most [`Page::limit`] rows, and a cursor to ask for the rows after them.
//!
//! Rows are ordered by a key the provider gives each (an entry's identity: its addresses,
//! ports, protocol); the cursor names the last row answered, so the next page starts after it
//! even when rows came or went in between: a row present from the first page to the last is
//! answered exactly once.
//!
//! Promises:
//! * A page holds at most [`MAX_ROWS`] rows; without `limit`, [`DEFAULT_ROWS`].
//! * A bad `limit` or `after` is an error naming it (the server answers `400`); other query
//!   parameters are left to the provider.

use std::cmp::Ordering;

/// Rows in a page when the request gives no `limit`.
pub const DEFAULT_ROWS: usize = 1000;

/// The most rows a page holds (`limit` above it is refused).
pub const MAX_ROWS: usize = 10_000;

/// The longest cursor accepted, in hex digits (a row's key is its identity, far shorter).
pub const MAX_CURSOR: usize = 4096;

/// What part of a document a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// At most this many rows (1..=[`MAX_ROWS`]).
    pub limit: usize,
    /// Only rows after this one (a cursor from an earlier page), or from the first.
    pub after: Option<Cursor>,
}

impl Default for Page {
    /// The first [`DEFAULT_ROWS`] rows.
    fn default() -> Self {
        Page {
            limit: DEFAULT_ROWS,
            after: None,
        }
    }
}

/// Where a page ended: the key of its last row and how many rows before it had that same key
/// (rows of equal keys are told apart by their order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    key: Vec<u8>,
    index: u32,
}

impl Cursor {
    /// The cursor as the `after` parameter carries it: hex of the key, then of the index (8
    /// digits).
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(self.key.len() * 2 + 8);
        for b in &self.key {
            s.push_str(&format!("{b:02x}"));
        }
        s.push_str(&format!("{:08x}", self.index));
        s
    }

    /// Reads what [`Cursor::encode`] wrote.
    pub fn decode(s: &str) -> Result<Cursor, String> {
        let bad = || {
            format!(
                "after: expected a cursor from an earlier page's \"next\" (hex digits), got {:?}",
                s.chars().take(40).collect::<String>()
            )
        };
        if s.len() > MAX_CURSOR {
            return Err(format!("after: longer than {MAX_CURSOR} characters"));
        }
        if s.len() < 8 || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let (key, index) = s.split_at(s.len() - 8);
        let key = (0..key.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&key[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        let index = u32::from_str_radix(index, 16).map_err(|_| bad())?;
        Ok(Cursor { key, index })
    }
}

impl Page {
    /// Reads `limit` and `after` from a query string (`limit=100&after=...`); other
    /// parameters are ignored, the same parameter twice is an error.
    pub fn parse(query: Option<&str>) -> Result<Page, String> {
        let mut page = Page::default();
        let (mut limit, mut after) = (false, false);
        for pair in query.unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "limit" => {
                    if std::mem::replace(&mut limit, true) {
                        return Err("limit: given twice".into());
                    }
                    page.limit = match value.parse::<usize>() {
                        Ok(n @ 1..=MAX_ROWS) => n,
                        _ => {
                            return Err(format!(
                                "limit: expected a number of rows from 1 to {MAX_ROWS}, got {:?}",
                                value.chars().take(40).collect::<String>()
                            ))
                        }
                    };
                }
                "after" => {
                    if std::mem::replace(&mut after, true) {
                        return Err("after: given twice".into());
                    }
                    page.after = Some(Cursor::decode(value)?);
                }
                _ => {}
            }
        }
        Ok(page)
    }

    /// The rows of this page among `rows` (each with its key, in any order): those after the
    /// cursor in key order, at most `limit` of them, and the cursor of the next page if rows
    /// remain after them.
    pub fn select<T>(&self, rows: Vec<(Vec<u8>, T)>) -> (Vec<T>, Option<Cursor>) {
        let mut rows = rows;
        // A stable sort: rows of equal keys keep the order they were given in.
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(self.limit.min(rows.len()));
        let mut last: Option<Cursor> = None;
        let mut index = 0u32;
        let mut previous: Option<Vec<u8>> = None;
        for (key, row) in rows {
            index = match &previous {
                Some(p) if *p == key => index.saturating_add(1),
                _ => 0,
            };
            previous = Some(key.clone());
            let cursor = Cursor { key, index };
            if let Some(after) = &self.after {
                if cursor.cmp(after) != Ordering::Greater {
                    continue;
                }
            }
            if out.len() == self.limit {
                return (out, last);
            }
            out.push(row);
            last = Some(cursor);
        }
        (out, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keyed(rows: &[&str]) -> Vec<(Vec<u8>, String)> {
        rows.iter()
            .map(|r| (r.as_bytes().to_vec(), (*r).to_owned()))
            .collect()
    }

    #[test]
    fn pages_walk_every_row_once_in_key_order() {
        let rows = ["d", "a", "c", "b", "b", "e"];
        let mut page = Page {
            limit: 2,
            after: None,
        };
        let mut seen = Vec::new();
        loop {
            let (got, next) = page.select(keyed(&rows));
            assert!(got.len() <= 2);
            seen.extend(got);
            match next {
                Some(c) => page.after = Some(Cursor::decode(&c.encode()).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, ["a", "b", "b", "c", "d", "e"]);
    }

    #[test]
    fn rows_that_come_and_go_between_pages_do_not_shift_the_others() {
        let page = Page {
            limit: 2,
            after: None,
        };
        let (first, next) = page.select(keyed(&["a", "b", "c", "d"]));
        assert_eq!(first, ["a", "b"]);
        // "a" went, "aa" came (before the cursor), "bb" came (after it).
        let page = Page {
            limit: 10,
            after: next,
        };
        let (rest, next) = page.select(keyed(&["aa", "b", "bb", "c", "d"]));
        assert_eq!(rest, ["bb", "c", "d"]);
        assert_eq!(next, None);
    }

    #[test]
    fn parameters() {
        assert_eq!(Page::parse(None).unwrap(), Page::default());
        assert_eq!(Page::parse(Some("pretty=1")).unwrap(), Page::default());
        assert_eq!(Page::parse(Some("limit=5")).unwrap().limit, 5);
        let c = Cursor {
            key: b"k\x00\xff".to_vec(),
            index: 3,
        };
        assert_eq!(c.encode(), "6b00ff00000003");
        let p = Page::parse(Some(&format!("after={}&limit={MAX_ROWS}", c.encode()))).unwrap();
        assert_eq!((p.limit, p.after), (MAX_ROWS, Some(c)));
        for (bad, names) in [
            ("limit=0", "limit"),
            ("limit=-1", "limit"),
            ("limit=", "limit"),
            ("limit=10001", "limit"),
            ("limit=1&limit=2", "limit"),
            ("after=xyz00000000", "after"),
            ("after=abc", "after"),
            ("after=", "after"),
            ("after=00000000&after=00000000", "after"),
        ] {
            let e = Page::parse(Some(bad)).unwrap_err();
            assert!(e.starts_with(&format!("{names}: ")), "{bad}: {e}");
        }
        let long = "0".repeat(MAX_CURSOR + 2);
        assert!(Page::parse(Some(&format!("after={long}"))).is_err());
    }

    proptest! {
        #[test]
        fn never_panics_on_any_query(q in "[ -~]{0,80}") {
            let _ = Page::parse(Some(&q));
        }

        #[test]
        fn paging_returns_each_row_once(
            rows in proptest::collection::vec("[a-c]{0,2}", 0..40),
            limit in 1usize..7,
        ) {
            let mut page = Page { limit, after: None };
            let mut seen = Vec::new();
            for _ in 0..=rows.len() {
                let (got, next) = page.select(
                    rows.iter().map(|r| (r.as_bytes().to_vec(), r.clone())).collect(),
                );
                prop_assert!(got.len() <= limit);
                seen.extend(got);
                match next {
                    Some(c) => page.after = Some(c),
                    None => break,
                }
            }
            let mut want = rows.clone();
            want.sort();
            prop_assert_eq!(seen, want);
        }
    }
}
