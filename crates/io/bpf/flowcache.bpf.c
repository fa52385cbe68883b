/* The XDP fast path (crates/io/src/fastpath.rs): established flows forwarded by the program
 * itself, everything else handed to the slow path (the port's XDP socket, hence the chain).
 *
 *  frame --> IPv4 TCP/UDP, no options, no fragment, TTL > 1, no SYN/FIN/RST?  --no--> slow path
 *              | yes
 *              v
 *            entry for (port, addresses, ports, protocol) in `flows`?  --no--> slow path
 *              | yes
 *              v
 *            stale (now >= deadline)?  --yes--> slow path
 *            due (now >= renew)?       --yes--> renewed once (renew = deadline), slow path
 *              | no
 *              v
 *            rewrite MACs, addresses, ports, TTL - 1, both checksums; count; bpf_redirect
 *
 * Entries are installed by user space only (FastPath::observe), from what the slow path did
 * with a packet of the flow: the chain's output is the specification and the program only
 * repeats it. The program never creates or removes an entry; the only field it writes is
 * renew_ns (see "due" below).
 *
 * Checksums: RFC 1624's incremental update, eqn. 3, HC' = ~(~HC + sum), where the sum of
 * ~m + m' over every 16-bit word the rewrite changes (TTL, addresses, ports; for TCP and UDP
 * the pseudo-header's addresses too) is computed once per entry in user space (`ip_sum`,
 * `l4_sum`). One's-complement sums work on 16-bit words in either byte order (RFC 1071
 * §2(B)), so the program adds the checksum words as it loads them, in the machine's order,
 * and user space sums the words the same way.
 *
 * The maps are sized by the loader (max_entries 1 here is a placeholder).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "flowcache.h"

/* The flow directions the fast path forwards: an LRU hash of the fast path's capacity, so a
 * full table forgets its least recently used flows (which then take the slow path again). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct flow_key);
	__type(value, struct flow_entry);
	__uint(max_entries, 1);
} flows SEC(".maps");

/* Key 0: what the program forwarded, per CPU (user space adds the CPUs up). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_stats);
	__uint(max_entries, 1);
} stats SEC(".maps");

/* The ports the program is attached to, by ifindex: where their sockets are in `xsks`. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct port_sockets);
	__uint(max_entries, 1);
} ports SEC(".maps");

/* The slow path: the XDP sockets of every port, each port's queues in consecutive slots. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
} xsks SEC(".maps");

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04

/* The slow path: the socket of the frame's port and queue, untouched. A port or queue with no
 * socket (none registered yet, or a port this fast path does not know) passes the frame on to
 * the kernel stack. */
static __always_inline int slow_path(struct xdp_md *ctx)
{
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 queue = ctx->rx_queue_index;
	struct port_sockets *port = bpf_map_lookup_elem(&ports, &ifindex);

	if (!port || queue >= port->count)
		return XDP_PASS;
	return bpf_redirect_map(&xsks, port->first + queue, XDP_PASS);
}

/* RFC 1624 eqn. 3: the checksum `check` after changes whose one's-complement sum of ~m + m'
 * is `sum` (< 0x10000). ~check + sum < 0x20000, so one fold gives 16 bits. */
static __always_inline __u16 csum_add(__u16 check, __u32 sum)
{
	__u32 s = (__u16)~check + sum;

	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* What forward() returns when the frame is the slow path's. */
#define SLOW_PATH -1

/* The fast path for one frame: XDP_REDIRECT (the frame rewritten and sent out by the entry's
 * port), or SLOW_PATH with the frame untouched. */
static __always_inline int forward(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	void *l4 = data + sizeof(struct ethhdr) + sizeof(struct iphdr);
	__be16 *ports_at = l4; /* source and destination port, in TCP and UDP alike */

	/* Only IPv4 without options and TCP or UDP: Ethernet, a 20-byte IPv4 header and at least
	 * 8 bytes of transport header (a UDP header; a TCP header is checked below). Anything
	 * else (ARP, IPv6, ICMP, IPv4 with options, short frames) takes the slow path. */
	if (l4 + 8 > data_end)
		return SLOW_PATH;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return SLOW_PATH;
	if (*(__u8 *)ip != 0x45) /* version 4, header length 5 words: no options */
		return SLOW_PATH;
	/* Not a fragment: neither "more fragments" nor an offset ("don't fragment" may be set). */
	if (ip->frag_off & bpf_htons(0x3fff))
		return SLOW_PATH;
	/* TTL <= 1 would expire here: the slow path (the chain) decides what happens. */
	if (ip->ttl <= 1)
		return SLOW_PATH;

	__u8 proto = ip->protocol;
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > data_end)
			return SLOW_PATH;
		/* Control packets take the slow path: connection tracking in the NFs sees every SYN,
		 * FIN and RST, and a FIN or RST the slow path forwards removes the flow's entries
		 * (user space does that). Byte 13 of the TCP header holds the flags. */
		if (((__u8 *)tcp)[13] & (TCP_FIN | TCP_SYN | TCP_RST))
			return SLOW_PATH;
	} else if (proto != IPPROTO_UDP) {
		return SLOW_PATH;
	}

	/* The flow direction on this port: no entry, slow path. */
	struct flow_key key = {
		.ifindex = ctx->ingress_ifindex,
		.saddr = ip->saddr,
		.daddr = ip->daddr,
		.sport = ports_at[0],
		.dport = ports_at[1],
		.proto = proto,
	};
	struct flow_entry *e = bpf_map_lookup_elem(&flows, &key);
	if (!e)
		return SLOW_PATH;

	/* Bounded staleness. Past the deadline (`refresh` after the slow path last forwarded a
	 * packet of the flow) the entry is not used: the slow path decides again, and its output
	 * renews the entry. */
	__u64 now = bpf_ktime_get_ns();
	if (now >= e->deadline_ns)
		return SLOW_PATH;
	/* Past the renewal time (halfway there) the first packet goes to the slow path, whose
	 * output renews the entry, and the others keep the fast path: renew_ns moves to the
	 * deadline so that no other packet is sent for it until then (a race between CPUs sends
	 * two, which is harmless). So the chain sees every active flow about every refresh / 2. */
	if (now >= e->renew_ns) {
		e->renew_ns = e->deadline_ns;
		return SLOW_PATH;
	}

	/* The transport checksum (its pseudo-header covers the addresses), before anything is
	 * written, so that a failed bounds check leaves the frame untouched. */
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > data_end)
			return SLOW_PATH;
		tcp->check = csum_add(tcp->check, e->l4_sum);
	} else {
		struct udphdr *udp = l4;

		/* A UDP checksum of 0 means "none" and stays 0; a computed 0 is sent as all ones
		 * (RFC 768). */
		if (udp->check) {
			__u16 check = csum_add(udp->check, e->l4_sum);

			udp->check = check ? check : 0xffff;
		}
	}

	/* The rewrite: Ethernet addresses, IPv4 addresses, ports, TTL and header checksum. */
	__builtin_memcpy(eth->h_dest, e->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, e->smac, ETH_ALEN);
	ip->saddr = e->saddr;
	ip->daddr = e->daddr;
	ports_at[0] = e->sport;
	ports_at[1] = e->dport;
	ip->ttl -= 1;
	ip->check = csum_add(ip->check, e->ip_sum);

	/* Counters: packets, and bytes (the IPv4 total length plus the Ethernet header). */
	__u32 zero = 0;
	struct flow_stats *st = bpf_map_lookup_elem(&stats, &zero);
	if (st) {
		st->packets += 1;
		st->bytes += bpf_ntohs(ip->tot_len) + ETH_HLEN;
	}

	/* Out by the entry's port. */
	return bpf_redirect(e->out_ifindex, 0);
}

SEC("xdp")
int flowcache(struct xdp_md *ctx)
{
	int action = forward(ctx);

	return action == SLOW_PATH ? slow_path(ctx) : action;
}

char LICENSE[] SEC("license") = "GPL";
