//! Dispatch rules from matching ranges (HashMVT §IV-D3): the prefixes an instance must keep
//! receiving, each tagged with its instance, aggregated into a small longest-prefix-match rule
//! set a NIC or switch with a limited rule budget can hold.
//!
//! [`aggregate`] is ORTC (Draves et al., "Constructing Optimal IP Routing Tables", 1999)
//! extended with "don't care" space: the rule set it returns is the smallest on the binary
//! trie of the input that steers every key the way the input's longest matching prefix does.
//! [`fit_budget`] then trades precision for size the migration-free way (§IV-B): it widens
//! prefixes of the *old* instances into space nobody pins, which can only send some new flows
//! to an old instance (that is why 20% of its pool stays there), never move a pinned flow.

use crate::key::{Match, KEY_BITS};

/// A dispatch rule: keys matching `prefix` (longest match wins) go to instance `target`.
pub type Rule = (Match, u32);

/// Why rules do not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{needed} dispatch rules needed at least, budget {budget}")]
pub struct OverBudget {
    /// Rules of the smallest set found.
    pub needed: usize,
    /// The budget.
    pub budget: usize,
}

struct Node {
    kids: [u32; 2],
    pin: Option<u32>,
    /// Candidate targets (sorted), `None` for "any" (don't care).
    set: Option<Vec<u32>>,
    /// What a missing child (a leaf of the completed trie) must steer to, if anything.
    fill: Option<u32>,
}

const NIL: u32 = u32::MAX;

/// The smallest LPM rule set (on the input's binary trie) under which every key covered by a
/// prefix of `pins` goes to the target of its longest covering pin, and every other key goes
/// to `default` when it is `Some` (anywhere when `None`). Conflicting pins of one prefix: the
/// last wins. Rules come out shortest prefix first.
pub fn aggregate(pins: &[Rule], default: Option<u32>) -> Vec<Rule> {
    let mut nodes = vec![Node {
        kids: [NIL; 2],
        pin: default,
        set: None,
        fill: None,
    }];
    let mut prefixes = vec![Match::ANY];
    for (m, t) in pins {
        let key = m.as_key();
        let mut n = 0usize;
        for i in 0..m.len().min(KEY_BITS) {
            let b = usize::from(key.bit(i));
            if nodes[n].kids[b] == NIL {
                nodes.push(Node {
                    kids: [NIL; 2],
                    pin: None,
                    set: None,
                    fill: None,
                });
                prefixes.push(Match::prefix(&key, i + 1));
                nodes[n].kids[b] = (nodes.len() - 1) as u32;
            }
            n = nodes[n].kids[b] as usize;
        }
        nodes[n].pin = Some(*t);
    }
    // Pass 1 and 2 (bottom-up): a leaf's set is its inherited target (or "any"); an inner
    // node's is the intersection of its children's, or their union if that is empty. A
    // missing child is a leaf inheriting the node's own target.
    fn up(nodes: &mut [Node], n: usize, inherited: Option<u32>) -> Option<Vec<u32>> {
        let here = nodes[n].pin.or(inherited);
        nodes[n].fill = here;
        let kids = nodes[n].kids;
        let set = if kids == [NIL; 2] {
            here.map(|t| vec![t])
        } else {
            let mut sets = [None, None];
            for (j, k) in kids.iter().enumerate() {
                sets[j] = if *k == NIL {
                    here.map(|t| vec![t])
                } else {
                    up(nodes, *k as usize, here)
                };
            }
            let [a, b] = sets;
            match (a, b) {
                (None, x) | (x, None) => x,
                (Some(a), Some(b)) => {
                    let both: Vec<u32> = a.iter().copied().filter(|t| b.contains(t)).collect();
                    if both.is_empty() {
                        let mut u = a;
                        u.extend(b);
                        u.sort_unstable();
                        u.dedup();
                        Some(u)
                    } else {
                        Some(both)
                    }
                }
            }
        };
        nodes[n].set = set.clone();
        set
    }
    up(&mut nodes, 0, None);
    // Pass 3 (top-down): a node needs a rule only when what it inherits is not a candidate.
    fn down(
        nodes: &[Node],
        prefixes: &[Match],
        n: usize,
        inherited: Option<u32>,
        out: &mut Vec<Rule>,
    ) {
        let mut here = inherited;
        if let Some(set) = &nodes[n].set {
            if !inherited.is_some_and(|t| set.contains(&t)) {
                let t = set[0];
                out.push((prefixes[n], t));
                here = Some(t);
            }
        }
        let kids = nodes[n].kids;
        for (j, k) in kids.into_iter().enumerate() {
            if k != NIL {
                down(nodes, prefixes, k as usize, here, out);
            } else if kids != [NIL; 2] {
                // A leaf the completion added: it needs a rule when what it must steer to is
                // not what it inherits.
                if let (Some(f), Some((lo, hi))) = (nodes[n].fill, prefixes[n].halves(KEY_BITS)) {
                    if here != Some(f) {
                        out.push((if j == 0 { lo } else { hi }, f));
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    down(&nodes, &prefixes, 0, None, &mut out);
    out.sort_by_key(|(m, _)| m.len());
    out
}

/// [`aggregate`]d rules of at most `budget`: while too many, pins of the longest length are
/// widened one bit (siblings of one target become their parent; a parent already pinned to
/// another target blocks), so only unpinned space changes hands, never a pinned key.
pub fn fit_budget(
    pins: &[Rule],
    default: Option<u32>,
    budget: usize,
) -> Result<Vec<Rule>, OverBudget> {
    let mut pins: Vec<Rule> = pins.to_vec();
    loop {
        let rules = aggregate(&pins, default);
        if rules.len() <= budget {
            return Ok(rules);
        }
        let Some(deepest) = pins.iter().map(|(m, _)| m.len()).filter(|&l| l > 0).max() else {
            return Err(OverBudget {
                needed: rules.len(),
                budget,
            });
        };
        let mut next: Vec<Rule> = Vec::with_capacity(pins.len());
        let mut changed = false;
        let mut deep: Vec<Rule> = Vec::new();
        for r in &pins {
            if r.0.len() == deepest {
                deep.push(*r);
            } else {
                next.push(*r);
            }
        }
        deep.sort_by(|a, b| a.0.bytes().cmp(b.0.bytes()));
        let mut i = 0;
        while i < deep.len() {
            let parent = deep[i].0.parent().unwrap_or(Match::ANY);
            let mut j = i;
            while j < deep.len() && deep[j].0.parent() == Some(parent) {
                j += 1;
            }
            let t = deep[i].1;
            let same = deep[i..j].iter().all(|r| r.1 == t);
            let blocked = next.iter().any(|(m, u)| *m == parent && *u != t);
            if same && !blocked {
                if !next.contains(&(parent, t)) {
                    next.push((parent, t));
                }
                changed = true;
            } else {
                next.extend_from_slice(&deep[i..j]);
            }
            i = j;
        }
        if !changed {
            return Err(OverBudget {
                needed: rules.len(),
                budget,
            });
        }
        pins = next;
    }
}

/// The target of `key` under LPM rules `rules` (a linear scan; for tests and tools).
pub fn steer(rules: &[Rule], key: &crate::Key) -> Option<u32> {
    rules
        .iter()
        .filter(|(m, _)| m.matches(key))
        .max_by_key(|(m, _)| m.len())
        .map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Key;
    use std::net::Ipv4Addr;

    fn p(a: [u8; 4], l: u8) -> Match {
        Match::v4(Ipv4Addr::from(a), l)
    }

    #[test]
    fn siblings_of_one_target_merge() {
        let pins = [
            (p([10, 0, 0, 0], 9), 1),
            (p([10, 128, 0, 0], 9), 1),
            (p([10, 1, 0, 0], 16), 2),
        ];
        let rules = aggregate(&pins, Some(0));
        assert_eq!(
            rules,
            vec![
                (Match::ANY, 0),
                (p([10, 0, 0, 0], 8), 1),
                (p([10, 1, 0, 0], 16), 2)
            ]
        );
        // Without a default, `*` can take the majority.
        let rules = aggregate(&pins, None);
        assert_eq!(rules.len(), 2);
        for (m, t) in pins {
            assert_eq!(steer(&rules, &m.as_key()), Some(t));
        }
    }

    #[test]
    fn unpinned_space_goes_to_the_default() {
        let pins: Vec<Rule> = (1..=125u32)
            .map(|h| (Match::exact(&Key::v4_u32(0x0a00_0000 | h)), 0))
            .collect();
        let rules = aggregate(&pins, Some(1));
        for h in 0..300u32 {
            let want = if (1..=125).contains(&h) { 0 } else { 1 };
            assert_eq!(
                steer(&rules, &Key::v4_u32(0x0a00_0000 | h)),
                Some(want),
                "{h}"
            );
        }
        assert!(rules.len() <= 10, "{rules:?}");
    }

    /// Random pins against a linear oracle: every pinned key keeps its target; with a
    /// default, every other key gets the default.
    #[test]
    fn aggregation_is_exact_on_random_pins() {
        let mut x: u32 = 99;
        let mut next = || {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            x >> 8
        };
        for _ in 0..200 {
            let pins: Vec<Rule> = (0..next() % 12)
                .map(|_| {
                    (
                        p(
                            [10, (next() % 4) as u8, next() as u8, next() as u8],
                            (6 + next() % 27) as u8,
                        ),
                        next() % 3,
                    )
                })
                .collect();
            let rules = aggregate(&pins, Some(7));
            for _ in 0..200 {
                let k = Key::v4_u32((10 << 24) | (next() & 0x03ff_ffff));
                let want = steer(&pins, &k).unwrap_or(7);
                assert_eq!(steer(&rules, &k), Some(want), "{pins:?} {rules:?} {k:?}");
            }
            assert!(rules.len() <= pins.len() + 1);
        }
    }

    #[test]
    fn budget_widens_into_unpinned_space_only() {
        // Hosts pinned to instance 1, the rest to the new instance 2.
        let pins: Vec<Rule> = (0..16u8).map(|i| (p([10, 0, i * 16, 1], 32), 1)).collect();
        let exact = aggregate(&pins, Some(2));
        assert_eq!(exact.len(), 17);
        let fitted = fit_budget(&pins, Some(2), 4).unwrap();
        assert!(fitted.len() <= 4, "{fitted:?}");
        for (m, t) in &pins {
            assert_eq!(steer(&fitted, &m.as_key()), Some(*t));
        }
        assert_eq!(
            steer(&fitted, &Key::v4(Ipv4Addr::new(11, 0, 0, 1))),
            Some(2)
        );
        let mixed = [(p([10, 0, 0, 0], 32), 1), (p([10, 0, 0, 1], 32), 3)];
        assert_eq!(
            fit_budget(&mixed, Some(2), 1),
            Err(OverBudget {
                needed: 3,
                budget: 1
            })
        );
    }
}
