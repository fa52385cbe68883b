//! Scope and access pattern of a state object, and the caching strategy they imply
//! (CHC §4.1 scopes, §4.3 and Table 1).

/// A packet header field a cross-flow object is keyed by (CHC §4.1 `.scope()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Source address.
    SrcIp,
    /// Destination address.
    DstIp,
    /// Source port.
    SrcPort,
    /// Destination port.
    DstPort,
    /// IP protocol.
    Proto,
}

/// Which flows share one piece of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// State of one flow (keyed by its 5-tuple). Partitioned: each worker owns the flows the
    /// traffic split sends it, and the key carries `instance@core` (FlexState §III-B).
    PerFlow,
    /// State shared by the flows that agree on these fields (e.g. `[SrcIp]`: per host).
    /// Partitioned like per-flow state: each core keeps its own part, merged on demand
    /// (FlexState §III-B1). A split on these fields (or a coarser one) keeps it exact.
    CrossFlow(&'static [Field]),
    /// One copy shared by every core and instance; its key drops `instance@core` (CHC §4.3).
    Shared,
}

impl Scope {
    /// Whether each worker owns its own partition of the object.
    pub const fn is_partitioned(self) -> bool {
        !matches!(self, Scope::Shared)
    }
}

/// How an object is used on the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read on most packets, written rarely (a NAT mapping, a rule set).
    ReadMostly,
    /// Written on most packets, read rarely (packet counters).
    WriteMostly,
    /// Both, often.
    ReadWrite,
}

/// How the engine keeps an object, chosen from its scope and access pattern (CHC Table 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Write-mostly, any scope: no cache; updates queue as offloaded, non-blocking operations
    /// (coalesced per flush) and the store applies them; a read first sends what is queued.
    Offload,
    /// Per-flow or partitioned cross-flow: cached at the owner, changes flushed without
    /// blocking every flush interval.
    CacheFlush,
    /// Shared and read-mostly: cached at every instance for reads; updates go to the store at
    /// once and the cache is refreshed every flush interval (CHC's callbacks, by polling until
    /// the store pushes them).
    CacheRefresh,
    /// Shared and read-write: cached only while one worker of one instance uses it (the
    /// traffic split allows it); otherwise every call goes to the store.
    CacheExclusive,
}

impl Strategy {
    /// CHC Table 1.
    pub const fn choose(scope: Scope, access: Access) -> Strategy {
        match (scope, access) {
            (_, Access::WriteMostly) => Strategy::Offload,
            (Scope::PerFlow | Scope::CrossFlow(_), _) => Strategy::CacheFlush,
            (Scope::Shared, Access::ReadMostly) => Strategy::CacheRefresh,
            (Scope::Shared, Access::ReadWrite) => Strategy::CacheExclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chc_table_1() {
        use Access::*;
        assert_eq!(
            Strategy::choose(Scope::PerFlow, WriteMostly),
            Strategy::Offload
        );
        assert_eq!(
            Strategy::choose(Scope::Shared, WriteMostly),
            Strategy::Offload
        );
        assert_eq!(
            Strategy::choose(Scope::PerFlow, ReadWrite),
            Strategy::CacheFlush
        );
        assert_eq!(
            Strategy::choose(Scope::PerFlow, ReadMostly),
            Strategy::CacheFlush
        );
        assert_eq!(
            Strategy::choose(Scope::CrossFlow(&[Field::SrcIp]), ReadWrite),
            Strategy::CacheFlush
        );
        assert_eq!(
            Strategy::choose(Scope::Shared, ReadMostly),
            Strategy::CacheRefresh
        );
        assert_eq!(
            Strategy::choose(Scope::Shared, ReadWrite),
            Strategy::CacheExclusive
        );
    }
}
