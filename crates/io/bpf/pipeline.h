/* HyperSFC's table pipeline in XDP: the layouts the program and user space share
 * (crates/fastpath/src/xdp.rs mirrors each struct once, as a #[repr(C)] type; the sizes and
 * offsets asserted here are asserted there too).
 *
 * Everything is in the machine's byte order except the LPM trie's key, whose address is in
 * network order (the trie matches bits from the first byte's most significant one). These
 * structs never leave the host: the circulation header travels only between the program and
 * the slow path on the same machine.
 */
#ifndef PIPELINE_H
#define PIPELINE_H

#include <linux/types.h>

#define FP_MAX_TABLES 16   /* tables in a pipeline (crates/fastpath: MAX_TABLES) */
#define FP_MAX_BRANCHES 16 /* branches of a table the program can follow */
#define FP_MAX_KEY 8       /* fields in a key */
#define FP_MAX_CARRIED 5   /* searches a circulation header carries */
#define FP_END 255         /* a branch to the end of the pipeline */
#define FP_MAGIC 0xf5c1    /* first word of a circulation header */

/* Header fields (crates/fastpath: Field). */
enum fp_field {
	FP_SRC_IP = 0,
	FP_DST_IP = 1,
	FP_SRC_PORT = 2,
	FP_DST_PORT = 3,
	FP_PROTO = 4,
	FP_MARK = 5,
	FP_EGRESS = 6,
};

enum fp_kind {
	FP_EXACT = 0,
	FP_LPM = 1,
};

enum fp_mode {
	FP_BUSY = 0,
	FP_LAZY = 1,
};

enum fp_answer {
	FP_PENDING = 0,
	FP_HIT = 1,
	FP_ABSENT = 2,
};

/* A table entry's action (crates/fastpath: Rule): up to two field writes (each value already
 * truncated to its field's width), a drop, the branch. */
struct fp_rule {
	__u8 field[2]; /* the written field + 1; 0: no write */
	__u8 drop;
	__u8 branch;
	__u32 value[2];
};

/* A key of up to 128 bits (crates/fastpath: Table::key_of), as two halves. */
struct fp_key128 {
	__u64 lo;
	__u64 hi;
};

/* One table, as configured (array `tables`, by table index). */
struct fp_table {
	__u8 kind;          /* enum fp_kind */
	__u8 nkey;          /* fields in the key */
	__u8 key[FP_MAX_KEY]; /* the key's fields, first highest */
	__u8 nbranches;     /* 0: the next table in order */
	__u8 reads;         /* the key's fields, as a mask of 1 << field */
	__u8 writes;        /* the fields rules may write */
	__u8 bloom_filters; /* 0: no Bloom selector */
	__u8 bloom_weight;
	__u8 bloom_hashes;
	__u32 bloom_mask;   /* bits per filter - 1 */
	__u32 bloom_word;   /* the table's first word in `blooms` */
	__u32 sketch_at;    /* the table's first counter in `sketch` */
	__u32 sketch_mask;  /* counters per sketch row - 1; the row count is FP_SKETCH_ROWS */
	__u32 _pad[2];
	__u64 bloom_seed;
	struct fp_rule dflt; /* the rule of a key the full table lacks */
	__u8 next[FP_MAX_BRANCHES]; /* branch -> table, FP_END */
	__u32 codes[FP_MAX_BRANCHES]; /* branch -> its Bloom code */
	__u8 key_bits[FP_MAX_KEY]; /* the key fields' widths: 8, 16 or 32 */
	__u32 _pad2;
};

#define FP_SKETCH_ROWS 4
#define FP_SKETCH_SAMPLE 8 /* the sketch counts one lookup in this many, chosen at random */

/* The pipeline (array `config`, key 0). */
struct fp_config {
	__u32 ntables;
	__u32 mode;           /* enum fp_mode */
	__u32 recirc_ifindex; /* the only port circulation headers are accepted on */
	__u32 _pad;
};

/* A port the program serves (hash `ports`, by ifindex): its XDP sockets in `xsks` (queue q at
 * first + q, q < count). */
struct fp_port {
	__u32 first;
	__u32 count;
};

/* One (table, key) of a circulation header: a search to do, or its answer. */
struct fp_search {
	__u8 table;
	__u8 answer;  /* enum fp_answer */
	__u8 _pad[2];
	struct fp_rule rule; /* FP_HIT: the entry */
	struct fp_key128 key;
};

/* The circulation header, in front of the Ethernet frame, followed by `count` searches. */
struct fp_circ {
	__u16 magic;        /* FP_MAGIC */
	__u8 resume;        /* the table to resume at */
	__u8 count;         /* searches that follow */
	__u8 circulations;  /* times the packet went to the slow path, this one included */
	__u8 proto;         /* the headers' protocol, egress and mark at `resume` (the frame */
	__u16 egress;       /* holds the addresses and ports) */
	__u32 mark;
	__u32 ifindex;      /* the port the packet came in by */
};

/* The LPM cache's key (trie `lpm`): prefixlen is 32 + the prefix's length. */
struct fp_lpm_key {
	__u32 prefixlen;
	__u32 table;
	__u8 addr[4];       /* network order */
};

/* The LPM cache's value: the entry and the prefix it is for (counted in the sketch). */
struct fp_lpm_value {
	struct fp_rule rule;
	__u32 addr;         /* the prefix, machine order, host bits zero */
	__u32 len;
};

/* The exact cache's key (hash `exact`). */
struct fp_exact_key {
	__u32 table;
	__u32 _pad;
	struct fp_key128 key;
};

/* Counters (per-CPU array `counters`, by index). */
enum fp_counter {
	FP_PASSES,
	FP_DONE,
	FP_SUBMITS,
	FP_DEPENDENCY_STOPS,
	FP_BLOOM_UNSURE,
	FP_BLOOM_GUESSES,
	FP_BLOOM_ABSENT,
	FP_DROP_STOPS,
	FP_DROPPED,       /* dropped by a table */
	FP_FORWARDED,
	FP_UNMATCHED,     /* not IPv4 TCP/UDP (or a later fragment): passed on unchanged */
	FP_FORGED,        /* a frame on the recirculation port without a valid header: dropped */
	FP_NO_ROOM,       /* no headroom for the circulation header: dropped */
	FP_NO_SOCKET,     /* a miss with no slow-path socket for the port and queue: dropped */
	FP_COUNTERS,
};

/* The header fields tables match and write (crates/fastpath: Headers), by enum fp_field. */
#define FP_FIELDS 8 /* 7 fields and an unused slot: a field id masked by 7 is in bounds */
struct fp_headers {
	__u32 v[FP_FIELDS];
};

/* The last packet each CPU finished (per-CPU array `last`, key 0), for tests and debugging:
 * its final headers, whether a table dropped it, and its IPv4 identification (which packet). */
struct fp_verdict {
	struct fp_headers h;
	__u32 dropped;
	__u32 ip_id;
};

/* Per-table counters (per-CPU array `table_stats`, by table): fast-path lookups. */
struct fp_table_stats {
	__u64 hits;
	__u64 misses;
};

_Static_assert(sizeof(struct fp_rule) == 12, "fp_rule");
_Static_assert(sizeof(struct fp_table) == 152, "fp_table");
_Static_assert(__builtin_offsetof(struct fp_table, key_bits) == 140, "fp_table.key_bits");
_Static_assert(__builtin_offsetof(struct fp_table, bloom_mask) == 16, "fp_table.bloom_mask");
_Static_assert(__builtin_offsetof(struct fp_table, bloom_seed) == 40, "fp_table.bloom_seed");
_Static_assert(__builtin_offsetof(struct fp_table, dflt) == 48, "fp_table.dflt");
_Static_assert(__builtin_offsetof(struct fp_table, next) == 60, "fp_table.next");
_Static_assert(__builtin_offsetof(struct fp_table, codes) == 76, "fp_table.codes");
_Static_assert(sizeof(struct fp_config) == 16, "fp_config");
_Static_assert(sizeof(struct fp_port) == 8, "fp_port");
_Static_assert(sizeof(struct fp_search) == 32, "fp_search");
_Static_assert(__builtin_offsetof(struct fp_search, key) == 16, "fp_search.key");
_Static_assert(sizeof(struct fp_circ) == 16, "fp_circ");
_Static_assert(sizeof(struct fp_lpm_key) == 12, "fp_lpm_key");
_Static_assert(sizeof(struct fp_lpm_value) == 20, "fp_lpm_value");
_Static_assert(sizeof(struct fp_exact_key) == 24, "fp_exact_key");
_Static_assert(sizeof(struct fp_verdict) == 40, "fp_verdict");

#endif
