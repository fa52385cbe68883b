/* HyperSFC's table pipeline in XDP (crates/fastpath/src/xdp.rs loads it and is its slow path).
 *
 * The program is the fast path of crates/fastpath/src/fast.rs, `FastPath::pass`, with the
 * tables' caches in BPF maps: exact tables in the hash `exact`, LPM tables in the trie `lpm`,
 * the 2D Bloom filters in the array `blooms`, the caches' use counts in the count-min sketch
 * `sketch` (memory-mapped by user space, whose eviction ranks by it: HyperSFC §III-C).
 *
 *  frame on a port --> IPv4 TCP/UDP? --no--> on to the kernel, unchanged (XDP_PASS)
 *                          | yes
 *                          v
 *  frame on the recirculation port --> strip the circulation header (answers, resume point)
 *                          |
 *                          v
 *        tables from `resume`: cache hit, or carried answer, or miss
 *          busy submit (§III-A): the first miss ends the pass
 *          lazy submit (§IV): misses are pushed, the pass goes on while keys cannot depend
 *          on a missed table; a branching table's miss follows its Bloom filters' branch
 *          (§IV-A), a detected false positive ends the pass
 *                          |
 *       no miss: rewrite addresses and ports (incremental checksums), then drop, or redirect
 *                to the egress port's interface (`egress`), or, with no interface for it, on
 *                to the kernel, which routes the packet (XDP_PASS)
 *       a miss:  the headers at the first miss written back, the circulation header pushed
 *                in front (table bypass §III-B: where to resume; the searches), and the frame
 *                sent to the slow path's XDP socket of its port and queue
 *
 * The slow path searches the full tables, installs the entries in the maps, and sends the
 * frame back with the answers through the recirculation port: a circulation header is read
 * only on that port, so no other port can forge one, and a frame there without a valid one is
 * counted and dropped.
 *
 * The maps are sized by the loader (max_entries 1 here is a placeholder).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "pipeline.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fp_config);
	__uint(max_entries, 1);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fp_table);
	__uint(max_entries, FP_MAX_TABLES);
} tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fp_exact_key);
	__type(value, struct fp_rule);
	__uint(max_entries, 1);
} exact SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fp_lpm_key);
	__type(value, struct fp_lpm_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1);
} lpm SEC(".maps");

/* Every table's Bloom filters, one after another, as 64-bit words. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} blooms SEC(".maps");

/* Every table's count-min sketch: 16-bit counters, four to an element, so that the mapped
 * array is one run of counters (crates/fastpath: CountMin). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
} sketch SEC(".maps");

/* The ports the program serves, by ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct fp_port);
	__uint(max_entries, 1);
} ports SEC(".maps");

/* Egress port numbers (the `egress` header field) to ifindexes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} egress SEC(".maps");

/* The slow path: the XDP sockets of every port. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, FP_COUNTERS);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct fp_table_stats);
	__uint(max_entries, FP_MAX_TABLES);
} table_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct fp_verdict);
	__uint(max_entries, 1);
} last SEC(".maps");

/* The circulation header of the packet in hand (one per CPU: XDP runs a packet to the end
 * on its CPU). */
struct circulation {
	struct fp_circ hdr;
	struct fp_search s[FP_MAX_CARRIED];
	__u32 rng; /* the CPU's sampling state (see touch) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct circulation);
	__uint(max_entries, 1);
} scratch SEC(".maps");

/* `i & mask`, computed on the register that indexes: the verifier then sees the bound even
 * where the compiler, knowing `i` checked, would drop the mask or index with another copy. */
static __always_inline __u32 bounded(__u32 i, const __u32 mask)
{
	asm volatile("%[i] &= %[mask]" : [i] "+r"(i) : [mask] "i"(mask));
	return i;
}

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += 1;
}

/* Table::key_of: the key fields packed, first field highest. */
static __always_inline struct fp_key128 key_of(const struct fp_table *tb, const struct fp_headers *h)
{
	struct fp_key128 k = {};

	for (__u32 i = 0; i < FP_MAX_KEY; i++) {
		if (i >= tb->nkey)
			break;
		__u32 b = tb->key_bits[i] & 63; /* 8, 16 or 32 (the loader's promise) */

		if (b == 0)
			break;
		k.hi = k.hi << b | k.lo >> (64 - b);
		k.lo = k.lo << b | h->v[bounded(tb->key[i], FP_FIELDS - 1)];
	}
	return k;
}

/* crates/fastpath hash::mix: SplitMix64's finalizer over the key and a seed. */
static __always_inline __u64 mix(struct fp_key128 k, __u64 seed)
{
	__u64 x = k.lo ^ (k.hi << 29 | k.hi >> 35) ^ seed;

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* CountMin::touch on the table's sketch, for one lookup in FP_SKETCH_SAMPLE at random (a
 * sample ranks keys as all lookups would, at an eighth of the cost: the four counters were a
 * quarter of a cached pass). The choice is the CPU's xorshift32 state `rng`, seeded from
 * the kernel's generator (a helper call per lookup would cost what the sampling saves).
 * Saturating; increments racing on two CPUs may be lost, which an estimate of use can
 * afford. */
static __always_inline void touch(const struct fp_table *tb, struct fp_key128 k, __u32 *rng)
{
	__u32 x = *rng ? *rng : bpf_get_prandom_u32() | 1;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	*rng = x;
	if (x & (FP_SKETCH_SAMPLE - 1))
		return;
	for (__u32 row = 0; row < FP_SKETCH_ROWS; row++) {
		__u32 i = tb->sketch_at + row * (tb->sketch_mask + 1) +
			  ((__u32)mix(k, row + 1) & tb->sketch_mask);
		__u32 elem = i / 4;
		__u64 *e = bpf_map_lookup_elem(&sketch, &elem);

		if (!e)
			return;
		__u16 *c = (__u16 *)e + (i & 3);
		if (*c != 0xffff)
			*c += 1;
	}
}

#define SELECT_NONE -1
#define SELECT_ABSENT -2
#define SELECT_UNSURE -3

/* One Bloom filter's test of a key, as bpf_loop's state (one filter per call of
 * `bloom_filter`, so the verifier checks the body once, not once per filter). */
struct bloom_test {
	struct fp_key128 key;
	__u32 table;
	__u32 code; /* bit f: filter f says yes */
	__u32 ones;
};

static long bloom_filter(__u64 f, struct bloom_test *bt)
{
	struct fp_table *tb = bpf_map_lookup_elem(&tables, &bt->table);

	if (!tb || f >= 32)
		return 1;
	__u64 h = mix(bt->key, tb->bloom_seed ^ f * 0x9e3779b97f4a7c15ULL);
	__u32 h1 = (__u32)h, h2 = (__u32)(h >> 32) | 1;

	for (__u32 i = 0; i < 16; i++) {
		if (i >= tb->bloom_hashes)
			break;
		/* Double hashing (Kirsch-Mitzenmacher); the bit in the filter's own range. */
		__u32 b = (__u32)f * (tb->bloom_mask + 1) + ((h1 + i * h2) & tb->bloom_mask);
		__u32 w = tb->bloom_word + b / 64;
		__u64 *word = bpf_map_lookup_elem(&blooms, &w);

		if (!word || !((*word >> (b % 64)) & 1))
			return 0;
	}
	bt->code |= 1u << f;
	bt->ones += 1;
	return 0;
}

/* Bloom2d::select (§IV-A, Algorithm 1's Selector): a branch, SELECT_ABSENT (fewer filters
 * than the codes' weight say yes), or SELECT_UNSURE (more: a detected false positive; or a
 * pattern that is no branch's code). */
static __always_inline int bloom_select(const struct fp_table *tb, __u32 t, struct fp_key128 k)
{
	struct bloom_test bt = { .key = k, .table = t };

	bpf_loop(tb->bloom_filters, bloom_filter, &bt, 0);
	if (bt.ones < tb->bloom_weight)
		return SELECT_ABSENT;
	if (bt.ones > tb->bloom_weight)
		return SELECT_UNSURE;
	for (__u32 b = 0; b < FP_MAX_BRANCHES; b++) {
		if (b >= tb->nbranches)
			break;
		if (tb->codes[b] == bt.code)
			return b;
	}
	return SELECT_UNSURE;
}

/* Pipeline::next: the table after `t` for a rule's branch; FP_END or more ends the pipeline. */
static __always_inline __u32 next_table(const struct fp_table *tb, __u32 t, __u32 branch)
{
	if (tb->nbranches == 0)
		return t + 1;
	if (branch >= tb->nbranches || branch >= FP_MAX_BRANCHES)
		return FP_END;
	return tb->next[bounded(branch, FP_MAX_BRANCHES - 1)];
}

/* One pass (FastPath::pass), as bpf_loop's state: one table per call of `step`. */
struct pass {
	struct fp_headers h;  /* the headers at table t */
	struct fp_headers h0; /* the headers at the first miss */
	__u32 t;
	__u32 first_miss;  /* the table of the first miss, FP_END: none yet */
	__u32 unknown;     /* fields missed tables may write */
	__u32 mode;
	__u32 ntables;
	__u32 dropped;
	__u32 failed;      /* a map the program needs is missing: drop */
};

static long step(__u64 index, struct pass *p)
{
	__u32 zero = 0, t = p->t;

	if (t >= p->ntables || t >= FP_MAX_TABLES)
		return 1;
	struct fp_table *tb = bpf_map_lookup_elem(&tables, &t);
	struct circulation *c = bpf_map_lookup_elem(&scratch, &zero);
	struct fp_table_stats *ts = bpf_map_lookup_elem(&table_stats, &t);
	if (!tb || !c || !ts) {
		p->failed = 1;
		return 1;
	}
	/* Lazy: a key reading a field a missed table may write would be a guess. */
	if (p->first_miss != FP_END && (tb->reads & p->unknown)) {
		count(FP_DEPENDENCY_STOPS);
		return 1;
	}
	struct fp_key128 key = key_of(tb, &p->h);
	struct fp_rule rule;
	int found = 0;

	if (tb->kind == FP_EXACT) {
		struct fp_exact_key ek = { .table = t, .key = key };
		struct fp_rule *r = bpf_map_lookup_elem(&exact, &ek);

		touch(tb, key, &c->rng); /* ExactCache::lookup counts every lookup */
		if (r) {
			rule = *r;
			found = 1;
		}
	} else {
		struct fp_lpm_key lk = { .prefixlen = 64, .table = t };
		__u32 addr = bpf_htonl((__u32)key.lo);

		__builtin_memcpy(lk.addr, &addr, 4);
		struct fp_lpm_value *v = bpf_map_lookup_elem(&lpm, &lk);
		if (v) {
			/* LpmCache::lookup counts the prefix found: its key is addr << 8 | len. */
			struct fp_key128 pk = { .lo = (__u64)v->addr << 8 | (v->len & 0xff) };

			touch(tb, pk, &c->rng);
			rule = v->rule;
			found = 1;
		}
	}
	if (found)
		ts->hits += 1;
	else
		ts->misses += 1;

	/* An answer the packet carries back from the slow path. */
	if (!found) {
		for (__u32 i = 0; i < FP_MAX_CARRIED; i++) {
			if (i >= c->hdr.count)
				break;
			struct fp_search *s = &c->s[i];

			if (s->table != t || s->key.lo != key.lo || s->key.hi != key.hi)
				continue;
			if (s->answer == FP_HIT) {
				rule = s->rule;
				found = 1;
			} else if (s->answer == FP_ABSENT) {
				rule = tb->dflt;
				found = 1;
			}
			break;
		}
	}

	if (!found) {
		int sel = SELECT_NONE;

		if (p->mode == FP_LAZY && tb->bloom_filters)
			sel = bloom_select(tb, t, key);
		if (sel == SELECT_ABSENT) {
			/* Bloom filters have no false negatives: the default, no circulation. */
			count(FP_BLOOM_ABSENT);
			rule = tb->dflt;
		} else {
			/* A miss, on the packet's stack. A full stack ends a lazy pass that has a
			 * miss already; without one, the old answers make room. */
			if (c->hdr.count >= FP_MAX_CARRIED) {
				if (p->first_miss != FP_END)
					return 1;
				c->hdr.count = 0;
			}
			__u32 n = c->hdr.count;
			if (n >= FP_MAX_CARRIED)
				return 1;
			struct fp_search *s = &c->s[n];
			s->table = t;
			s->answer = FP_PENDING;
			s->key = key;
			__builtin_memset(&s->rule, 0, sizeof(s->rule));
			c->hdr.count = n + 1;
			if (p->first_miss == FP_END) {
				p->first_miss = t;
				p->h0 = p->h;
			}
			if (p->mode == FP_BUSY)
				return 1; /* busy submit, egress bypass */
			p->unknown |= tb->writes;
			if (sel == SELECT_NONE && tb->nbranches <= 1) {
				p->t = next_table(tb, t, 0);
				return 0;
			}
			if (sel >= 0) {
				count(FP_BLOOM_GUESSES);
				p->t = next_table(tb, t, sel);
				return 0;
			}
			if (sel == SELECT_UNSURE)
				count(FP_BLOOM_UNSURE);
			return 1;
		}
	}

	/* Rule::apply (the values are truncated to their fields already). */
	for (__u32 w = 0; w < 2; w++) {
		if (rule.field[w])
			p->h.v[bounded(rule.field[w] - 1, FP_FIELDS - 1)] = rule.value[w];
	}
	if (rule.drop) {
		if (p->first_miss != FP_END)
			count(FP_DROP_STOPS);
		else
			p->dropped = 1;
		return 1;
	}
	p->t = next_table(tb, t, rule.branch);
	return 0;
}

/* RFC 1624 eqn. 3: the checksum `check` after changes whose one's-complement sum of ~m + m'
 * is `sum`. One's-complement sums work on 16-bit words in either byte order (RFC 1071
 * §2(B)), so words are summed as loaded, in the machine's order. */
static __always_inline __u16 csum_add(__u16 check, __u32 sum)
{
	__u32 s = (__u16)~check + sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

static __always_inline __u32 csum_word(__u16 old, __u16 new)
{
	return (__u16)~old + (__u32)new;
}

static __always_inline __u32 csum_u32(__u32 old, __u32 new)
{
	return csum_word(old, new) + csum_word(old >> 16, new >> 16);
}

/* Where a frame's layers are. */
struct layers {
	struct iphdr *ip;
	__be16 *ports; /* source and destination port, in TCP and UDP alike */
	__u16 *l4_check;
	__u32 udp;
};

/* The IPv4 TCP/UDP layers of the frame from `data` (no later fragment). */
static __always_inline int parse(void *data, void *end, struct layers *l)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	if (ip->version != 4 || ip->ihl < 5)
		return -1;
	if (ip->frag_off & bpf_htons(0x1fff))
		return -1;
	void *l4 = (void *)ip + ip->ihl * 4;
	if (ip->protocol == IPPROTO_TCP) {
		if (l4 + 20 > end)
			return -1;
		l->l4_check = l4 + 16;
		l->udp = 0;
	} else if (ip->protocol == IPPROTO_UDP) {
		if (l4 + 8 > end)
			return -1;
		l->l4_check = l4 + 6;
		l->udp = 1;
	} else {
		return -1;
	}
	l->ip = ip;
	l->ports = l4;
	return 0;
}

/* The headers a frame holds (the circulation's mark, egress and protocol added by the
 * caller). */
static __always_inline void read_headers(const struct layers *l, struct fp_headers *h)
{
	h->v[FP_SRC_IP] = bpf_ntohl(l->ip->saddr);
	h->v[FP_DST_IP] = bpf_ntohl(l->ip->daddr);
	h->v[FP_SRC_PORT] = bpf_ntohs(l->ports[0]);
	h->v[FP_DST_PORT] = bpf_ntohs(l->ports[1]);
}

/* Writes the addresses and ports of `h` into the frame, with both checksums updated (a UDP
 * checksum of 0, "none", stays 0; a computed 0 is sent as all ones, RFC 768). */
static __always_inline void write_headers(struct layers *l, const struct fp_headers *h)
{
	__u32 saddr = bpf_htonl(h->v[FP_SRC_IP]), daddr = bpf_htonl(h->v[FP_DST_IP]);
	__u16 sport = bpf_htons(h->v[FP_SRC_PORT]), dport = bpf_htons(h->v[FP_DST_PORT]);
	__u32 addrs = csum_u32(l->ip->saddr, saddr) + csum_u32(l->ip->daddr, daddr);
	__u32 ports = csum_word(l->ports[0], sport) + csum_word(l->ports[1], dport);

	if (l->ip->saddr == saddr && l->ip->daddr == daddr && l->ports[0] == sport &&
	    l->ports[1] == dport)
		return;
	l->ip->check = csum_add(l->ip->check, addrs);
	if (!l->udp || *l->l4_check) {
		__u16 check = csum_add(*l->l4_check, addrs + ports);

		*l->l4_check = l->udp && !check ? 0xffff : check;
	}
	l->ip->saddr = saddr;
	l->ip->daddr = daddr;
	l->ports[0] = sport;
	l->ports[1] = dport;
}

/* Reads the circulation header in front of a frame from the slow path into `c` and strips
 * it: 0, or -1 when it is not a valid one. */
static __always_inline int take_circulation(struct xdp_md *ctx, struct circulation *c,
					    __u32 ntables)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct fp_circ *hdr = data;

	if ((void *)(hdr + 1) > end)
		return -1;
	if (hdr->magic != FP_MAGIC || hdr->count > FP_MAX_CARRIED || hdr->resume >= ntables)
		return -1;
	c->hdr = *hdr;
	for (__u32 i = 0; i < FP_MAX_CARRIED; i++) {
		if (i >= c->hdr.count)
			break;
		struct fp_search *s = data + sizeof(*hdr) + i * sizeof(*s);

		if ((void *)(s + 1) > end)
			return -1;
		/* Only answers come back, for tables that exist. */
		if ((s->answer != FP_HIT && s->answer != FP_ABSENT) || s->table >= ntables)
			return -1;
		c->s[i] = *s;
	}
	if (bpf_xdp_adjust_head(ctx, sizeof(*hdr) + c->hdr.count * sizeof(struct fp_search)))
		return -1;
	return 0;
}

/* Pushes the circulation header in front of the frame: 0, or -1 without the headroom. */
static __always_inline int push_circulation(struct xdp_md *ctx, const struct circulation *c)
{
	__u32 n = c->hdr.count;

	if (n > FP_MAX_CARRIED)
		return -1;
	if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(struct fp_circ) + n * sizeof(struct fp_search))))
		return -1;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct fp_circ *hdr = data;

	if ((void *)(hdr + 1) > end)
		return -1;
	*hdr = c->hdr;
	for (__u32 i = 0; i < FP_MAX_CARRIED; i++) {
		if (i >= n)
			break;
		struct fp_search *s = data + sizeof(*hdr) + i * sizeof(*s);

		if ((void *)(s + 1) > end)
			return -1;
		*s = c->s[i];
	}
	return 0;
}

SEC("xdp")
int pipeline(struct xdp_md *ctx)
{
	__u32 zero = 0, ifindex = ctx->ingress_ifindex;
	struct fp_config *cfg = bpf_map_lookup_elem(&config, &zero);
	struct circulation *c = bpf_map_lookup_elem(&scratch, &zero);

	if (!cfg || !c)
		return XDP_PASS;
	int recirculated = ifindex == cfg->recirc_ifindex;

	if (recirculated) {
		if (take_circulation(ctx, c, cfg->ntables)) {
			count(FP_FORGED);
			return XDP_DROP;
		}
	} else {
		if (!bpf_map_lookup_elem(&ports, &ifindex))
			return XDP_PASS; /* not a port of ours */
		__builtin_memset(&c->hdr, 0, sizeof(c->hdr));
		c->hdr.magic = FP_MAGIC;
		c->hdr.ifindex = ifindex;
	}
	if (!bpf_map_lookup_elem(&ports, &c->hdr.ifindex)) {
		count(FP_FORGED); /* a header naming a port that is not ours */
		return XDP_DROP;
	}

	struct layers l;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (parse(data, end, &l)) {
		if (recirculated) {
			count(FP_FORGED); /* only matched frames circulate */
			return XDP_DROP;
		}
		count(FP_UNMATCHED);
		return XDP_PASS;
	}

	struct pass p = {
		.t = c->hdr.resume,
		.first_miss = FP_END,
		.mode = cfg->mode,
		.ntables = cfg->ntables,
	};
	read_headers(&l, &p.h);
	if (recirculated) {
		p.h.v[FP_PROTO] = c->hdr.proto;
		p.h.v[FP_MARK] = c->hdr.mark;
		p.h.v[FP_EGRESS] = c->hdr.egress;
	} else {
		p.h.v[FP_PROTO] = l.ip->protocol;
	}
	count(FP_PASSES);
	bpf_loop(FP_MAX_TABLES, step, &p, 0);
	if (p.failed)
		return XDP_DROP;

	if (p.first_miss != FP_END) {
		/* Submit: the frame with the headers at the first miss, and where to resume. */
		write_headers(&l, &p.h0);
		c->hdr.resume = p.first_miss;
		c->hdr.proto = p.h0.v[FP_PROTO];
		c->hdr.mark = p.h0.v[FP_MARK];
		c->hdr.egress = p.h0.v[FP_EGRESS];
		if (c->hdr.circulations < 255)
			c->hdr.circulations += 1;
		__u32 queue = ctx->rx_queue_index;
		struct fp_port *here = bpf_map_lookup_elem(&ports, &ifindex);
		if (!here || queue >= here->count) {
			count(FP_NO_SOCKET);
			return XDP_DROP;
		}
		__u32 slot = here->first + queue;
		if (push_circulation(ctx, c)) {
			count(FP_NO_ROOM);
			return XDP_DROP;
		}
		count(FP_SUBMITS);
		return bpf_redirect_map(&xsks, slot, XDP_DROP);
	}

	count(FP_DONE);
	struct fp_verdict *v = bpf_map_lookup_elem(&last, &zero);
	if (v) {
		v->h = p.h;
		v->dropped = p.dropped;
		v->ip_id = bpf_ntohs(l.ip->id);
	}
	if (p.dropped) {
		count(FP_DROPPED);
		return XDP_DROP;
	}
	write_headers(&l, &p.h);
	__u32 port = p.h.v[FP_EGRESS], *out = bpf_map_lookup_elem(&egress, &port);
	count(FP_FORWARDED);
	return out ? bpf_redirect(*out, 0) : XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
