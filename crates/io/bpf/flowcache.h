/* The fast path's tables as the program and user space share them (crates/io/src/fastpath.rs
 * mirrors each struct once, as a #[repr(C)] type, and its tests check the sizes and offsets
 * asserted here).
 *
 * Byte order: addresses and ports are kept as on the wire (network order), so that the key is
 * made of the packet's own bytes and the rewrite copies bytes back; every other field is in the
 * machine's order.
 */
#ifndef FLOWCACHE_H
#define FLOWCACHE_H

#include <linux/types.h>

/* One direction of a flow as the program sees it on a port: the key of `flows`. */
struct flow_key {
	__u32 ifindex; /* the port it came in by (xdp_md.ingress_ifindex) */
	__be32 saddr;  /* IPv4 source, destination */
	__be32 daddr;
	__be16 sport;  /* TCP or UDP source, destination port */
	__be16 dport;
	__u32 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
};

/* What the program does to the packets of one flow direction: the value of `flows`. */
struct flow_entry {
	__u64 deadline_ns; /* CLOCK_MONOTONIC: from then on the entry is stale (slow path) */
	__u64 renew_ns;    /* from then on the next packet goes to the slow path, once */
	__u8 dmac[6];      /* the new Ethernet destination and source */
	__u8 smac[6];
	__be32 saddr;      /* the new IPv4 source and destination */
	__be32 daddr;
	__be16 sport;      /* the new source and destination ports */
	__be16 dport;
	__u32 out_ifindex; /* the port to send from */
	__u32 ip_sum;      /* one's-complement sum (< 0x10000) to add to the IPv4 checksum */
	__u32 l4_sum;      /* the same for the TCP or UDP checksum */
	__u32 _pad;        /* zero: makes the end padding explicit */
};

/* The counters of `stats` (one per CPU): what the program forwarded itself. */
struct flow_stats {
	__u64 packets;
	__u64 bytes; /* IPv4 total length plus the Ethernet header */
};

/* The sockets of one port in `xsks`: its queue q's socket is at slot first + q, q < count. */
struct port_sockets {
	__u32 first;
	__u32 count;
};

/* The layout user space relies on (see fastpath.rs: `layout_matches_the_program`). */
_Static_assert(sizeof(struct flow_key) == 20, "sizeof(struct flow_key)");
_Static_assert(__builtin_offsetof(struct flow_key, saddr) == 4, "offsetof(struct flow_key, saddr)");
_Static_assert(__builtin_offsetof(struct flow_key, daddr) == 8, "offsetof(struct flow_key, daddr)");
_Static_assert(__builtin_offsetof(struct flow_key, sport) == 12, "offsetof(struct flow_key, sport)");
_Static_assert(__builtin_offsetof(struct flow_key, dport) == 14, "offsetof(struct flow_key, dport)");
_Static_assert(__builtin_offsetof(struct flow_key, proto) == 16, "offsetof(struct flow_key, proto)");
_Static_assert(sizeof(struct flow_entry) == 56, "sizeof(struct flow_entry)");
_Static_assert(__builtin_offsetof(struct flow_entry, renew_ns) == 8, "offsetof(struct flow_entry, renew_ns)");
_Static_assert(__builtin_offsetof(struct flow_entry, dmac) == 16, "offsetof(struct flow_entry, dmac)");
_Static_assert(__builtin_offsetof(struct flow_entry, smac) == 22, "offsetof(struct flow_entry, smac)");
_Static_assert(__builtin_offsetof(struct flow_entry, saddr) == 28, "offsetof(struct flow_entry, saddr)");
_Static_assert(__builtin_offsetof(struct flow_entry, daddr) == 32, "offsetof(struct flow_entry, daddr)");
_Static_assert(__builtin_offsetof(struct flow_entry, sport) == 36, "offsetof(struct flow_entry, sport)");
_Static_assert(__builtin_offsetof(struct flow_entry, dport) == 38, "offsetof(struct flow_entry, dport)");
_Static_assert(__builtin_offsetof(struct flow_entry, out_ifindex) == 40, "offsetof(struct flow_entry, out_ifindex)");
_Static_assert(__builtin_offsetof(struct flow_entry, ip_sum) == 44, "offsetof(struct flow_entry, ip_sum)");
_Static_assert(__builtin_offsetof(struct flow_entry, l4_sum) == 48, "offsetof(struct flow_entry, l4_sum)");
_Static_assert(sizeof(struct flow_stats) == 16, "sizeof(struct flow_stats)");
_Static_assert(sizeof(struct port_sockets) == 8, "sizeof(struct port_sockets)");

#endif
