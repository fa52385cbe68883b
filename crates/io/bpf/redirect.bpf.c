/* The AF_XDP redirect program (crates/io/src/afxdp.rs, `XdpProgram::attach`): every frame of
 * the port goes to the XDP socket registered for its queue.
 *
 * Promise: a frame of a queue with no socket, and every frame while no socket is registered,
 * goes on to the kernel stack (XDP_PASS) unchanged.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* The port's XDP sockets, indexed by queue; sized by the loader (one slot per queue). */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
} xsks SEC(".maps");

SEC("xdp")
int redirect(struct xdp_md *ctx)
{
	/* The third argument is the action when the slot is empty: XDP_PASS. */
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
