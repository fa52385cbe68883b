//! The XDP realization of the fast path: the pipeline's caches in BPF maps, looked up by
//! `crates/io/bpf/pipeline.bpf.c` (the program of [`fast`](crate::fast) in C, for every frame
//! of the ports it serves), and the slow path here (HyperSFC §III, with the switch replaced
//! by the XDP hook).
//!
//! ```text
//!  port --XDP--> tables (caches: hash `exact`, trie `lpm`; Bloom filters `blooms`)
//!                  | all hit: rewrite, redirect to the egress port (or drop)
//!                  | a miss: circulation header (resume point, (table, key) searches) pushed
//!                  v         in front of the frame, sent to the port's XDP socket
//!            slow path: XdpFastPath::serve searches the full tables, installs the entries
//!                  |     (user-space master copies of the caches, mirrored into the maps),
//!                  |     answers every search in the header
//!                  v
//!  recirculation port --XDP--> the same program resumes with the answers (table bypass)
//! ```
//!
//! Promises:
//! * **The verdict is the full tables'**, as in-process (`crates/fastpath/tests/xdp.rs` runs
//!   the kernel's program with `BPF_PROG_TEST_RUN` against `FullTables::reference`).
//! * **The caches are HyperSFC's**: user space keeps the master copy of each table's cache
//!   ([`ExactCache`], [`LpmCache`]: dependency-aware LPM installs, sampled-LFU eviction) and
//!   applies its changes to the maps in an order that keeps the trie's answers right at every
//!   step (an LPM prefix is put after its dependents and removed before them). Evictions rank
//!   by the count-min sketch the program counts its lookups into (one in eight, sampled at
//!   random), which user space reads in place (a memory-mapped BPF array).
//! * **Circulation headers are trusted only on the recirculation port**: the program reads a
//!   header only from frames arriving there, and drops and counts (`forged`) a frame there
//!   without a valid one. A frame from any other port is a packet, whatever its bytes.
//!
//! Limits: IPv4 TCP and UDP are matched (first fragments included), everything else goes out
//! unchanged; a header carries at most [`MAX_CARRIED`] searches (a lazy pass with more misses
//! stops at the fifth: the circulation header must fit XDP's 256-byte headroom); at most
//! [`MAX_BRANCHES`] branches per table.

use crate::bloom::Bloom2d;
use crate::cache::{sketch_size, CacheStats, Change, ExactCache, LpmCache, Prefix};
use crate::fast::{FastStats, Mode};
use crate::full::{Found, FullTables, SlowError};
use crate::headers::{Field, Headers, Rule};
use crate::sketch::{CountMin, SharedCounters, ROWS};
use crate::table::{Kind, Next, Pipeline};
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, XskMap};
use aya::Ebpf;
use flowstate_io::afxdp::XdpProgram;
use flowstate_io::bpf;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::AtomicU16;
use std::sync::{Arc, Mutex};

/// Searches a circulation header carries (`FP_MAX_CARRIED`).
pub const MAX_CARRIED: usize = 5;
/// Branches of a table the program follows (`FP_MAX_BRANCHES`).
pub const MAX_BRANCHES: usize = 16;
/// The program counts one lookup in this many in the sketch (`FP_SKETCH_SAMPLE`).
const SKETCH_SAMPLE: u64 = 8;
/// Fields in a key (`FP_MAX_KEY`).
const MAX_KEY: usize = 8;
/// The first word of a circulation header (`FP_MAGIC`).
pub const MAGIC: u16 = 0xf5c1;
/// A branch to the end of the pipeline (`FP_END`).
const END: u8 = 255;
/// Bytes of a circulation header without its searches.
pub const CIRC_BYTES: usize = std::mem::size_of::<FpCirc>();
/// Bytes of one search in a circulation header.
pub const SEARCH_BYTES: usize = std::mem::size_of::<FpSearch>();
/// Ports the program can serve, and their sockets in all.
const MAX_PORTS: u32 = 64;
/// Egress port numbers the program can map to interfaces.
const MAX_EGRESS: u32 = 1024;

const WHAT: &str = "loading the XDP table pipeline";

/// `struct fp_rule`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpRule {
    field: [u8; 2],
    drop: u8,
    branch: u8,
    value: [u32; 2],
}

impl From<&Rule> for FpRule {
    fn from(r: &Rule) -> FpRule {
        let mut out = FpRule {
            drop: u8::from(r.drop),
            branch: r.branch,
            ..FpRule::default()
        };
        for (i, w) in r.writes.iter().enumerate() {
            if let Some((f, v)) = w {
                // Truncated here as Field::set truncates, so the program only stores it.
                let mut h = Headers::default();
                f.set(&mut h, *v);
                out.field[i] = *f as u8 + 1;
                out.value[i] = f.get(&h);
            }
        }
        out
    }
}

impl FpRule {
    /// The rule, or `None` if a field is unknown.
    fn rule(&self) -> Option<Rule> {
        let mut r = Rule {
            drop: self.drop != 0,
            branch: self.branch,
            ..Rule::default()
        };
        for i in 0..Rule::MAX_WRITES {
            if self.field[i] != 0 {
                let f = *Field::ALL.get(usize::from(self.field[i] - 1))?;
                r.writes[i] = Some((f, self.value[i]));
            }
        }
        Some(r)
    }
}

/// `struct fp_key128`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FpKey128 {
    lo: u64,
    hi: u64,
}

impl From<u128> for FpKey128 {
    fn from(k: u128) -> FpKey128 {
        FpKey128 {
            lo: k as u64,
            hi: (k >> 64) as u64,
        }
    }
}

impl FpKey128 {
    fn get(&self) -> u128 {
        u128::from(self.hi) << 64 | u128::from(self.lo)
    }
}

/// `struct fp_table`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpTable {
    kind: u8,
    nkey: u8,
    key: [u8; MAX_KEY],
    nbranches: u8,
    reads: u8,
    writes: u8,
    bloom_filters: u8,
    bloom_weight: u8,
    bloom_hashes: u8,
    bloom_mask: u32,
    bloom_word: u32,
    sketch_at: u32,
    sketch_mask: u32,
    _pad: [u32; 2],
    bloom_seed: u64,
    dflt: FpRule,
    next: [u8; MAX_BRANCHES],
    codes: [u32; MAX_BRANCHES],
    key_bits: [u8; MAX_KEY],
    _pad2: u32,
}

/// `struct fp_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpConfig {
    ntables: u32,
    mode: u32,
    recirc_ifindex: u32,
    _pad: u32,
}

/// `struct fp_port`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpPort {
    first: u32,
    count: u32,
}

/// `struct fp_search`: one (table, key) of a circulation header, with its answer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpSearch {
    table: u8,
    answer: u8,
    _pad: [u8; 2],
    rule: FpRule,
    key: FpKey128,
}

/// `enum fp_answer`.
const PENDING: u8 = 0;
const HIT: u8 = 1;
const ABSENT: u8 = 2;

/// `struct fp_circ`: the circulation header in front of a frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpCirc {
    magic: u16,
    /// The table the packet resumes at.
    pub resume: u8,
    /// Searches that follow.
    pub count: u8,
    /// Times the packet went to the slow path.
    pub circulations: u8,
    proto: u8,
    egress: u16,
    mark: u32,
    /// The port the packet came in by.
    pub ifindex: u32,
}

/// `struct fp_lpm_value`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpLpmValue {
    rule: FpRule,
    addr: u32,
    len: u32,
}

/// `struct fp_exact_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FpExactKey {
    table: u32,
    _pad: u32,
    key: FpKey128,
}

/// `struct fp_verdict`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpVerdict {
    h: [u32; 8],
    dropped: u32,
    ip_id: u32,
}

/// What the program did with the last packet one CPU finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Its headers after the pipeline.
    pub headers: Headers,
    /// Whether a table dropped it.
    pub dropped: bool,
    /// Its IPv4 identification: which packet it was.
    pub ip_id: u16,
}

/// `struct fp_table_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FpTableStats {
    hits: u64,
    misses: u64,
}

// SAFETY: plain integers and arrays of them, every padding byte an explicit field (the
// layout test checks the sizes against pipeline.h's assertions).
unsafe impl aya::Pod for FpRule {}
unsafe impl aya::Pod for FpTable {}
unsafe impl aya::Pod for FpConfig {}
unsafe impl aya::Pod for FpPort {}
unsafe impl aya::Pod for FpLpmValue {}
unsafe impl aya::Pod for FpExactKey {}
unsafe impl aya::Pod for FpTableStats {}
unsafe impl aya::Pod for FpVerdict {}

/// The LPM trie's key data: the table (machine order) and the address (network order).
type LpmData = [u8; 8];

fn lpm_key(table: usize, p: Prefix) -> Key<LpmData> {
    let mut data = [0u8; 8];
    data[..4].copy_from_slice(&(table as u32).to_ne_bytes());
    data[4..].copy_from_slice(&p.addr.to_be_bytes());
    Key::new(32 + u32::from(p.len), data)
}

/// The program's counters (`enum fp_counter`), summed over the CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpCounters {
    /// What the in-process fast path counts too (passes, submits, Bloom selections, ...).
    pub fast: FastStats,
    /// Packets a table dropped.
    pub dropped: u64,
    /// Packets forwarded.
    pub forwarded: u64,
    /// Frames the tables cannot match, passed on unchanged.
    pub unmatched: u64,
    /// Frames on the recirculation port without a valid circulation header, dropped.
    pub forged: u64,
    /// Misses dropped for want of headroom for the circulation header.
    pub no_room: u64,
    /// Misses dropped for want of a slow-path socket on their port and queue.
    pub no_socket: u64,
}

impl XdpCounters {
    const COUNT: u32 = 14;

    /// From the array in `enum fp_counter`'s order.
    fn from_array(c: &[u64; Self::COUNT as usize]) -> XdpCounters {
        XdpCounters {
            fast: FastStats {
                passes: c[0],
                done: c[1],
                submits: c[2],
                dependency_stops: c[3],
                bloom_unsure: c[4],
                bloom_guesses: c[5],
                bloom_absent: c[6],
                drop_stops: c[7],
            },
            dropped: c[8],
            forwarded: c[9],
            unmatched: c[10],
            forged: c[11],
            no_room: c[12],
            no_socket: c[13],
        }
    }
}

/// Why the XDP fast path cannot run or serve.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// The pipeline uses what the program cannot do.
    #[error("table {table:?}: {reason} in the XDP fast path")]
    Unsupported {
        /// The table.
        table: String,
        /// What.
        reason: String,
    },
    /// Loading, attaching, or a map operation failed.
    #[error(transparent)]
    Io(#[from] flowstate_io::Error),
    /// A frame from the slow path's socket is not a circulating packet.
    #[error("a frame from the fast path without a valid circulation header: {0}")]
    Malformed(&'static str),
    /// A full-table search failed.
    #[error(transparent)]
    Slow(#[from] SlowError),
}

/// The memory-mapped `sketch` array: every table's count-min sketch, shared with the program.
struct SketchMemory {
    ptr: *mut AtomicU16,
    counters: usize,
    bytes: usize,
}

// SAFETY: the mapping is shared memory of atomics, unmapped only on drop.
unsafe impl Send for SketchMemory {}
unsafe impl Sync for SketchMemory {}

// SAFETY: the mapping never moves and lives as long as the value.
unsafe impl SharedCounters for SketchMemory {
    fn counters(&self) -> &[AtomicU16] {
        // SAFETY: `counters` u16s are mapped at `ptr` (see `map`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.counters) }
    }
}

impl SketchMemory {
    /// Maps the array `data` of `elements` 8-byte elements (four counters each).
    fn map(data: &MapData, elements: u32) -> io::Result<SketchMemory> {
        let bytes = elements as usize * 8;
        // SAFETY: mapping a BPF_F_MMAPABLE array's fd shared, its size rounded up by the
        // kernel to pages; the mapping keeps the map alive.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SketchMemory {
            ptr: ptr.cast(),
            counters: bytes / 2,
            bytes,
        })
    }
}

impl Drop for SketchMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped, once.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

enum Cache {
    Exact(ExactCache),
    Lpm(LpmCache),
}

/// The XDP table pipeline: the program and its maps, the master copies of the caches, and
/// the slow path's answers.
pub struct XdpFastPath {
    pipeline: Pipeline,
    ebpf: Ebpf,
    caches: Vec<Cache>,
    exact: HashMap<MapData, FpExactKey, FpRule>,
    lpm: LpmTrie<MapData, LpmData, FpLpmValue>,
    config: Array<MapData, FpConfig>,
    ports: HashMap<MapData, u32, FpPort>,
    egress: HashMap<MapData, u32, u32>,
    counters: PerCpuArray<MapData, u64>,
    table_stats: PerCpuArray<MapData, FpTableStats>,
    last: PerCpuArray<MapData, FpVerdict>,
    xsks: Arc<Mutex<XskMap<MapData>>>,
    sockets_used: u32,
}

/// What the pipeline needs of the program's maps: entries per map.
struct Sizes {
    exact: u32,
    lpm: u32,
    bloom_words: u32,
    sketch_counters: u32,
}

fn unsupported(table: &str, reason: String) -> XdpError {
    XdpError::Unsupported {
        table: table.into(),
        reason,
    }
}

fn map_err(what: &str) -> impl Fn(MapError) -> XdpError + '_ {
    move |e| XdpError::Io(bpf::aya_err("xdp table pipeline", what, &e))
}

impl XdpFastPath {
    /// Loads the program for `pipeline` (checked by the caller) in `mode` with `blooms` (from
    /// [`full::load`](crate::full::load)), its caches empty and no port served yet.
    pub fn new(
        pipeline: &Pipeline,
        mode: Mode,
        blooms: &[Option<Bloom2d>],
    ) -> Result<XdpFastPath, XdpError> {
        let mut sizes = Sizes {
            exact: 0,
            lpm: 0,
            bloom_words: 0,
            sketch_counters: 0,
        };
        let mut tables = Vec::new();
        for (t, table) in pipeline.tables.iter().enumerate() {
            tables.push(Self::table(
                pipeline,
                t,
                blooms.get(t).and_then(Option::as_ref),
                &mut sizes,
            )?);
            match table.kind {
                Kind::Exact => sizes.exact += table.cache as u32,
                Kind::Lpm => sizes.lpm += table.cache as u32,
            }
        }
        let mut ebpf = bpf::load_xdp(
            bpf::PIPELINE,
            "pipeline",
            &[
                ("exact", sizes.exact.max(1)),
                ("lpm", sizes.lpm.max(1)),
                ("blooms", sizes.bloom_words.max(1)),
                ("sketch", sizes.sketch_counters.div_ceil(4).max(1)),
                ("ports", MAX_PORTS),
                ("egress", MAX_EGRESS),
                ("xsks", MAX_PORTS),
            ],
            "xdp table pipeline",
            WHAT,
        )?;
        let dev = "xdp table pipeline";
        let mut table_map: Array<MapData, FpTable> = bpf::take_map(&mut ebpf, "tables", dev, WHAT)?;
        for (t, ft) in tables.iter().enumerate() {
            table_map
                .set(t as u32, ft, 0)
                .map_err(map_err("configuring a table"))?;
        }
        let mut bloom_map: Array<MapData, u64> = bpf::take_map(&mut ebpf, "blooms", dev, WHAT)?;
        for (t, b) in blooms.iter().enumerate() {
            if let Some(b) = b {
                for (i, w) in b.words().iter().enumerate() {
                    bloom_map
                        .set(tables[t].bloom_word + i as u32, w, 0)
                        .map_err(map_err("writing a Bloom filter"))?;
                }
            }
        }
        let sketch_err = |e| flowstate_io::Error::Device {
            device: dev.into(),
            what: "mapping the count-min sketch".into(),
            source: e,
        };
        let Some(aya::maps::Map::Array(sketch)) = ebpf.take_map("sketch") else {
            return Err(sketch_err(io::Error::other("the object has no array `sketch`")).into());
        };
        let memory: Arc<dyn SharedCounters> = Arc::new(
            SketchMemory::map(&sketch, sizes.sketch_counters.div_ceil(4).max(1))
                .map_err(sketch_err)?,
        );
        let mut caches = Vec::new();
        for (t, table) in pipeline.tables.iter().enumerate() {
            let (width, halve_every) = sketch_size(table.cache);
            let sketch = CountMin::shared(
                Arc::clone(&memory),
                tables[t].sketch_at as usize,
                width,
                halve_every,
            )
            .expect("the sketch array is sized for every table");
            caches.push(match table.kind {
                Kind::Exact => Cache::Exact(ExactCache::mirrored(table.cache, sketch)),
                Kind::Lpm => Cache::Lpm(LpmCache::mirrored(table.cache, sketch)),
            });
        }
        let mut config: Array<MapData, FpConfig> = bpf::take_map(&mut ebpf, "config", dev, WHAT)?;
        let fc = FpConfig {
            ntables: pipeline.tables.len() as u32,
            mode: u32::from(mode != Mode::Busy),
            ..FpConfig::default()
        };
        config
            .set(0, fc, 0)
            .map_err(map_err("configuring the pipeline"))?;
        Ok(XdpFastPath {
            pipeline: pipeline.clone(),
            caches,
            exact: bpf::take_map(&mut ebpf, "exact", dev, WHAT)?,
            lpm: bpf::take_map(&mut ebpf, "lpm", dev, WHAT)?,
            config,
            ports: bpf::take_map(&mut ebpf, "ports", dev, WHAT)?,
            egress: bpf::take_map(&mut ebpf, "egress", dev, WHAT)?,
            counters: bpf::take_map(&mut ebpf, "counters", dev, WHAT)?,
            table_stats: bpf::take_map(&mut ebpf, "table_stats", dev, WHAT)?,
            last: bpf::take_map(&mut ebpf, "last", dev, WHAT)?,
            xsks: Arc::new(Mutex::new(bpf::take_map(&mut ebpf, "xsks", dev, WHAT)?)),
            ebpf,
            sockets_used: 0,
        })
    }

    /// Table `t` as the program reads it; its Bloom words and sketch counters placed in
    /// `sizes`.
    fn table(
        pipeline: &Pipeline,
        t: usize,
        bloom: Option<&Bloom2d>,
        sizes: &mut Sizes,
    ) -> Result<FpTable, XdpError> {
        let table = &pipeline.tables[t];
        if table.key.len() > MAX_KEY {
            return Err(unsupported(
                &table.name,
                format!("more than {MAX_KEY} key fields"),
            ));
        }
        if table.branches.len() > MAX_BRANCHES {
            return Err(unsupported(
                &table.name,
                format!("more than {MAX_BRANCHES} branches"),
            ));
        }
        let mut ft = FpTable {
            kind: u8::from(table.kind == Kind::Lpm),
            nkey: table.key.len() as u8,
            nbranches: table.branches.len() as u8,
            reads: table.reads().0,
            writes: table.writes.0,
            dflt: FpRule::from(&table.default),
            ..FpTable::default()
        };
        for (i, f) in table.key.iter().enumerate() {
            ft.key[i] = *f as u8;
            ft.key_bits[i] = f.bits() as u8;
        }
        for (i, b) in table.branches.iter().enumerate() {
            ft.next[i] = match b {
                Next::Table(j) => *j as u8,
                Next::End => END,
            };
        }
        if let Some(b) = bloom {
            let p = b.params();
            let words = (usize::from(p.filters) * p.bits / 64) as u32;
            ft.bloom_filters = p.filters;
            ft.bloom_weight = p.weight;
            ft.bloom_hashes = p.hashes;
            ft.bloom_mask = p.bits as u32 - 1;
            ft.bloom_word = sizes.bloom_words;
            ft.bloom_seed = b.seed();
            for (i, c) in b.codes().iter().enumerate() {
                ft.codes[i] = *c;
            }
            sizes.bloom_words = sizes
                .bloom_words
                .checked_add(words)
                .filter(|w| *w < u32::MAX / 64)
                .ok_or_else(|| unsupported(&table.name, "Bloom filters too large".into()))?;
        }
        let (width, _) = sketch_size(table.cache);
        ft.sketch_at = sizes.sketch_counters;
        ft.sketch_mask = width as u32 - 1;
        sizes.sketch_counters += (ROWS * width) as u32;
        Ok(ft)
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Attaches the program to `ifname` (generic mode) and serves the port, with `queues`
    /// slow-path sockets: open them with [`AfXdp::open`](flowstate_io::afxdp::AfXdp::open) on
    /// the program returned, which stays attached while it lives.
    pub fn attach(&mut self, ifname: &str, queues: u32) -> Result<Arc<XdpProgram>, XdpError> {
        let queues = queues.max(1);
        self.room_for(queues)?;
        let program = XdpProgram::attach_loaded(
            &mut self.ebpf,
            "pipeline",
            ifname,
            Arc::clone(&self.xsks),
            self.sockets_used,
            queues,
        )?;
        self.serve_port(program.ifindex(), queues)?;
        Ok(program)
    }

    fn room_for(&self, queues: u32) -> Result<(), XdpError> {
        let first = self.sockets_used;
        if queues > MAX_PORTS - first {
            return Err(XdpError::Io(flowstate_io::Error::Option {
                name: "queues",
                reason: format!(
                    "the fast path has room for {MAX_PORTS} sockets, {first} are taken"
                ),
            }));
        }
        Ok(())
    }

    /// Serves the port `ifindex` (the program attached to it by the caller, or a test run's
    /// ingress): frames from it run the pipeline, their misses going to the sockets of its
    /// `queues` slots in `xsks`. Returns the port's first slot.
    pub fn serve_port(&mut self, ifindex: u32, queues: u32) -> Result<u32, XdpError> {
        self.room_for(queues)?;
        let first = self.sockets_used;
        let port = FpPort {
            first,
            count: queues,
        };
        self.ports
            .insert(ifindex, port, 0)
            .map_err(map_err("registering a port"))?;
        self.sockets_used += queues;
        Ok(first)
    }

    /// Makes `ifindex` the recirculation port: the only one whose frames' circulation headers
    /// the program reads (0: none).
    pub fn set_recirculation_port(&mut self, ifindex: u32) -> Result<(), XdpError> {
        let mut c = self
            .config
            .get(&0, 0)
            .map_err(map_err("reading the configuration"))?;
        c.recirc_ifindex = ifindex;
        self.config
            .set(0, c, 0)
            .map_err(map_err("configuring the recirculation port"))
    }

    /// Sends packets whose `egress` field is `port` out of `ifindex`.
    pub fn set_egress(&mut self, port: u16, ifindex: u32) -> Result<(), XdpError> {
        self.egress
            .insert(u32::from(port), ifindex, 0)
            .map_err(map_err("mapping an egress port"))
    }

    /// Installs what a full-table search of table `t` found, in the master copy of its cache
    /// and in the program's map. Evictions are ranked by the program's counts.
    pub fn install(&mut self, t: usize, found: &Found) -> Result<(), XdpError> {
        let stats = self.table_stats(t)?;
        let changes = match &mut self.caches[t] {
            Cache::Exact(c) => {
                c.sketch_mut()
                    .seen_elsewhere((stats.hits + stats.misses) / SKETCH_SAMPLE);
                for (k, r) in &found.install {
                    c.install(*k, *r);
                }
                c.take_changes()
            }
            Cache::Lpm(c) => {
                c.sketch_mut().seen_elsewhere(stats.hits / SKETCH_SAMPLE);
                let group: Vec<(Prefix, Rule)> = found
                    .install
                    .iter()
                    .map(|(k, r)| (Prefix::from_key(*k), *r))
                    .collect();
                c.install(&group);
                c.take_changes()
            }
        };
        let lpm = matches!(self.caches[t], Cache::Lpm(_));
        for change in changes {
            match (lpm, change) {
                (false, Change::Put(k, r)) => {
                    let key = FpExactKey {
                        table: t as u32,
                        _pad: 0,
                        key: FpKey128::from(k),
                    };
                    self.exact
                        .insert(key, FpRule::from(&r), 0)
                        .map_err(map_err("installing an entry"))?;
                }
                (false, Change::Remove(k)) => {
                    let key = FpExactKey {
                        table: t as u32,
                        _pad: 0,
                        key: FpKey128::from(k),
                    };
                    ignore_absent(self.exact.remove(&key)).map_err(map_err("evicting an entry"))?;
                }
                (true, Change::Put(k, r)) => {
                    let p = Prefix::from_key(k);
                    let v = FpLpmValue {
                        rule: FpRule::from(&r),
                        addr: p.addr,
                        len: u32::from(p.len),
                    };
                    self.lpm
                        .insert(&lpm_key(t, p), v, 0)
                        .map_err(map_err("installing a prefix"))?;
                }
                (true, Change::Remove(k)) => {
                    let key = lpm_key(t, Prefix::from_key(k));
                    ignore_absent(self.lpm.remove(&key)).map_err(map_err("evicting a prefix"))?;
                }
            }
        }
        Ok(())
    }

    /// The slow path for one frame from the program's sockets: searches the full tables for
    /// every search in its circulation header, installs what they found, and writes into
    /// `out` the frame to send back through the recirculation port, every search answered.
    /// Returns the header.
    pub fn serve(
        &mut self,
        full: &mut FullTables,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<FpCirc, XdpError> {
        let (mut hdr, mut searches, packet) = parse_circulation(frame, self.pipeline.tables.len())?;
        for s in &mut searches[..usize::from(hdr.count)] {
            if s.answer != PENDING {
                continue;
            }
            let t = usize::from(s.table);
            let found = full.search(t, s.key.get())?;
            self.install(t, &found)?;
            match found.rule {
                Some(r) => {
                    s.answer = HIT;
                    s.rule = FpRule::from(&r);
                }
                None => {
                    s.answer = ABSENT;
                    s.rule = FpRule::default();
                }
            }
        }
        hdr.magic = MAGIC;
        out.clear();
        out.extend_from_slice(as_bytes(&hdr));
        for s in &searches[..usize::from(hdr.count)] {
            out.extend_from_slice(as_bytes(s));
        }
        out.extend_from_slice(packet);
        Ok(hdr)
    }

    /// The program's counters, summed over the CPUs.
    pub fn counters(&self) -> Result<XdpCounters, XdpError> {
        let mut c = [0u64; XdpCounters::COUNT as usize];
        for (i, slot) in c.iter_mut().enumerate() {
            let values = self
                .counters
                .get(&(i as u32), 0)
                .map_err(map_err("reading the counters"))?;
            *slot = values.iter().sum();
        }
        Ok(XdpCounters::from_array(&c))
    }

    /// Table `t`'s fast-path lookups (hits and misses in the program) and the master copy's
    /// installs and evictions.
    pub fn cache_stats(&self, t: usize) -> Result<CacheStats, XdpError> {
        let lookups = self.table_stats(t)?;
        let mut s = match &self.caches[t] {
            Cache::Exact(c) => c.stats(),
            Cache::Lpm(c) => c.stats(),
        };
        s.hits = lookups.hits;
        s.misses = lookups.misses;
        Ok(s)
    }

    /// The last packet each CPU finished.
    pub fn last_verdicts(&self) -> Result<Vec<Verdict>, XdpError> {
        let values = self
            .last
            .get(&0, 0)
            .map_err(map_err("reading the last verdicts"))?;
        Ok(values
            .iter()
            .map(|v| Verdict {
                headers: Headers {
                    src_ip: v.h[0],
                    dst_ip: v.h[1],
                    src_port: v.h[2] as u16,
                    dst_port: v.h[3] as u16,
                    proto: v.h[4] as u8,
                    mark: v.h[5],
                    egress: v.h[6] as u16,
                },
                dropped: v.dropped != 0,
                ip_id: v.ip_id as u16,
            })
            .collect())
    }

    /// Entries cached in table `t`.
    pub fn cached(&self, t: usize) -> usize {
        match &self.caches[t] {
            Cache::Exact(c) => c.len(),
            Cache::Lpm(c) => c.len(),
        }
    }

    fn table_stats(&self, t: usize) -> Result<FpTableStats, XdpError> {
        let values = self
            .table_stats
            .get(&(t as u32), 0)
            .map_err(map_err("reading a table's counters"))?;
        Ok(values
            .iter()
            .fold(FpTableStats::default(), |a, s| FpTableStats {
                hits: a.hits + s.hits,
                misses: a.misses + s.misses,
            }))
    }

    /// Runs the program once on `frame` as if received on `ingress_ifindex`, queue 0
    /// (`BPF_PROG_TEST_RUN`): the XDP action and the frame as the program left it.
    pub fn test_run(&mut self, ingress_ifindex: u32, frame: &[u8]) -> io::Result<(u32, Vec<u8>)> {
        self.test_run_repeated(ingress_ifindex, frame, 1)
            .map(|(action, out, _)| (action, out))
    }

    /// As [`test_run`](Self::test_run), `repeat` times on the same buffer; also the kernel's
    /// average time per run in nanoseconds (for a frame the tables do not rewrite, every run
    /// is the same pass).
    pub fn test_run_repeated(
        &mut self,
        ingress_ifindex: u32,
        frame: &[u8],
        repeat: u32,
    ) -> io::Result<(u32, Vec<u8>, u32)> {
        let program = bpf::xdp(&mut self.ebpf, "pipeline").map_err(io::Error::other)?;
        let fd = program.fd().map_err(io::Error::other)?;
        bpf::test_run_repeated(fd.as_fd().as_raw_fd(), ingress_ifindex, frame, repeat)
    }
}

/// A map removal's result, an absent key being no error.
fn ignore_absent(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// The bytes of a `#[repr(C)]` value without padding.
fn as_bytes<T: aya::Pod>(v: &T) -> &[u8] {
    // SAFETY: T is Pod (plain integers, no implicit padding); the slice covers exactly it.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

// SAFETY: as for the other layouts above.
unsafe impl aya::Pod for FpCirc {}
unsafe impl aya::Pod for FpSearch {}

/// The circulation header in front of `frame`, its searches, and the packet after them; an
/// error if the header is not one the program writes for a pipeline of `tables` tables.
pub fn parse_circulation(
    frame: &[u8],
    tables: usize,
) -> Result<(FpCirc, [FpSearch; MAX_CARRIED], &[u8]), XdpError> {
    let read = |at: usize, n: usize| {
        frame
            .get(at..at + n)
            .ok_or(XdpError::Malformed("truncated"))
    };
    let b = read(0, CIRC_BYTES)?;
    // SAFETY: FpCirc is Pod and `b` holds size_of::<FpCirc>() bytes; unaligned read.
    let hdr: FpCirc = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
    if hdr.magic != MAGIC {
        return Err(XdpError::Malformed("no circulation header"));
    }
    if usize::from(hdr.count) > MAX_CARRIED {
        return Err(XdpError::Malformed("too many searches"));
    }
    if usize::from(hdr.resume) >= tables {
        return Err(XdpError::Malformed(
            "resumes at a table that does not exist",
        ));
    }
    let mut searches = [FpSearch::default(); MAX_CARRIED];
    for (i, s) in searches[..usize::from(hdr.count)].iter_mut().enumerate() {
        let b = read(CIRC_BYTES + i * SEARCH_BYTES, SEARCH_BYTES)?;
        // SAFETY: as above, for FpSearch.
        *s = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
        if usize::from(s.table) >= tables || s.answer > ABSENT || s.rule.rule().is_none() {
            return Err(XdpError::Malformed("a search names no table or rule"));
        }
    }
    let packet = &frame[CIRC_BYTES + usize::from(hdr.count) * SEARCH_BYTES..];
    Ok((hdr, searches, packet))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_program() {
        // Each is one of crates/io/bpf/pipeline.h's _Static_asserts, with the Rust figure.
        let layout = [
            ("sizeof(struct fp_rule)", size_of::<FpRule>()),
            ("sizeof(struct fp_table)", size_of::<FpTable>()),
            (
                "__builtin_offsetof(struct fp_table, bloom_mask)",
                offset_of!(FpTable, bloom_mask),
            ),
            (
                "__builtin_offsetof(struct fp_table, bloom_seed)",
                offset_of!(FpTable, bloom_seed),
            ),
            (
                "__builtin_offsetof(struct fp_table, dflt)",
                offset_of!(FpTable, dflt),
            ),
            (
                "__builtin_offsetof(struct fp_table, next)",
                offset_of!(FpTable, next),
            ),
            (
                "__builtin_offsetof(struct fp_table, codes)",
                offset_of!(FpTable, codes),
            ),
            (
                "__builtin_offsetof(struct fp_table, key_bits)",
                offset_of!(FpTable, key_bits),
            ),
            ("sizeof(struct fp_config)", size_of::<FpConfig>()),
            ("sizeof(struct fp_port)", size_of::<FpPort>()),
            ("sizeof(struct fp_search)", size_of::<FpSearch>()),
            (
                "__builtin_offsetof(struct fp_search, key)",
                offset_of!(FpSearch, key),
            ),
            ("sizeof(struct fp_circ)", size_of::<FpCirc>()),
            ("sizeof(struct fp_lpm_key)", size_of::<Key<LpmData>>()),
            ("sizeof(struct fp_lpm_value)", size_of::<FpLpmValue>()),
            ("sizeof(struct fp_exact_key)", size_of::<FpExactKey>()),
            ("sizeof(struct fp_verdict)", size_of::<FpVerdict>()),
        ];
        let header = include_str!("../../io/bpf/pipeline.h");
        for (what, rust) in layout {
            let asserted = format!("_Static_assert({what} == {rust},");
            assert!(
                header.contains(&asserted),
                "pipeline.h does not assert `{asserted}`"
            );
        }
        let defines = |name: &str, value: String| {
            header.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().take(3).collect();
                w == ["#define", name, value.as_str()]
            })
        };
        for (name, value) in [
            ("FP_MAX_CARRIED", MAX_CARRIED),
            ("FP_MAX_BRANCHES", MAX_BRANCHES),
            ("FP_MAX_KEY", MAX_KEY),
            ("FP_MAX_TABLES", crate::table::MAX_TABLES),
            ("FP_SKETCH_ROWS", ROWS),
            ("FP_SKETCH_SAMPLE", SKETCH_SAMPLE as usize),
            ("FP_END", usize::from(END)),
        ] {
            assert!(
                defines(name, value.to_string()),
                "pipeline.h: {name} is not {value}"
            );
        }
        assert!(defines("FP_MAGIC", format!("{MAGIC:#x}")));
        const { assert!(CIRC_BYTES + MAX_CARRIED * SEARCH_BYTES <= 256 - 64) };
    }

    #[test]
    fn what_the_program_cannot_do_names_the_table() {
        // Checked before anything is loaded: no root needed.
        let mut wide = crate::Table::new("wide", Kind::Exact, &[Field::Proto], &[], 4);
        wide.branches = vec![Next::End; MAX_BRANCHES + 1];
        let p = Pipeline { tables: vec![wide] };
        match XdpFastPath::new(&p, Mode::Lazy, &[]) {
            Err(XdpError::Unsupported { table, reason }) => {
                assert_eq!(table, "wide");
                assert!(reason.contains("16 branches"), "{reason}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("17 branches accepted"),
        }
    }

    #[test]
    fn rules_cross_to_the_program_and_back() {
        let r = Rule {
            writes: [Some((Field::DstIp, 7)), Some((Field::Egress, 3))],
            drop: true,
            branch: 2,
        };
        assert_eq!(FpRule::from(&r).rule(), Some(r));
        let bad = FpRule {
            field: [9, 0],
            ..FpRule::default()
        };
        assert_eq!(bad.rule(), None);
    }

    #[test]
    fn malformed_headers_are_refused() {
        let hdr = FpCirc {
            magic: MAGIC,
            resume: 1,
            count: 1,
            ..FpCirc::default()
        };
        let s = FpSearch {
            table: 1,
            ..FpSearch::default()
        };
        let mut frame = as_bytes(&hdr).to_vec();
        frame.extend_from_slice(as_bytes(&s));
        frame.extend_from_slice(&[0xaa; 60]);
        let (h, got, packet) = parse_circulation(&frame, 2).unwrap();
        assert_eq!((h, got[0], packet.len()), (hdr, s, 60));
        assert!(parse_circulation(&frame, 1).is_err(), "table 1 of 1");
        assert!(parse_circulation(&frame[..20], 2).is_err(), "truncated");
        let mut bad = frame.clone();
        bad[0] ^= 1;
        assert!(parse_circulation(&bad, 2).is_err(), "magic");
        let mut bad = frame.clone();
        bad[3] = 6;
        assert!(parse_circulation(&bad, 2).is_err(), "count");
        let mut bad = frame;
        bad[CIRC_BYTES + 1] = 3;
        assert!(parse_circulation(&bad, 2).is_err(), "answer");
    }
}
