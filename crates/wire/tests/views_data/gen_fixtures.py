"""Builds the Ethernet frames of `mod.rs` with an independent RFC 1071 checksum.

Usage: python3 gen_fixtures.py OUT_DIR   (writes OUT_DIR/fixtures.json and OUT_DIR/fixtures.pcap)
Check:  tshark -r OUT_DIR/fixtures.pcap -o ip.check_checksum:TRUE -o tcp.check_checksum:TRUE \
            -o udp.check_checksum:TRUE -o ip.defragment:FALSE -o ipv6.defragment:FALSE -V
"""
import json, os, struct, sys

def csum(data):
    if len(data) % 2: data += b'\0'
    s = sum(struct.unpack('!%dH' % (len(data)//2), data))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff

def mac(s): return bytes(int(x,16) for x in s.split(':'))
def ip4(s): return bytes(int(x) for x in s.split('.'))
import ipaddress
def ip6(s): return ipaddress.IPv6Address(s).packed

def eth(dst, src, et, payload, tags=()):
    b = mac(dst)+mac(src)
    for tpid, tci in tags: b += struct.pack('!HH', tpid, tci)
    return b + struct.pack('!H', et) + payload

def ipv4(src, dst, proto, payload, ident=0x1c46, flags_off=0x4000, ttl=64, opts=b'', tos=0):
    ihl = 5 + len(opts)//4
    h = struct.pack('!BBHHHBBH4s4s', 0x40|ihl, tos, 4*ihl+len(payload), ident, flags_off, ttl, proto, 0, ip4(src), ip4(dst)) + opts
    c = csum(h)
    h = h[:10] + struct.pack('!H', c) + h[12:]
    return h + payload

def ph4(src, dst, proto, n): return ip4(src)+ip4(dst)+struct.pack('!BBH', 0, proto, n)
def ph6(src, dst, nh, n): return ip6(src)+ip6(dst)+struct.pack('!IxxxB', n, nh)

def tcp(sp, dp, seq, ack, flags, win, opts=b'', payload=b'', ph=None):
    off = 5 + len(opts)//4
    h = struct.pack('!HHIIBBHHH', sp, dp, seq, ack, off<<4, flags, win, 0, 0) + opts
    seg = h + payload
    c = csum(ph + seg)
    return seg[:16] + struct.pack('!H', c) + seg[18:]

def udp(sp, dp, payload, ph_fn):
    n = 8 + len(payload)
    seg = struct.pack('!HHHH', sp, dp, n, 0) + payload
    c = csum(ph_fn(n) + seg)
    if c == 0: c = 0xffff
    return seg[:6] + struct.pack('!H', c) + seg[8:]

def icmp4(t, code, rest, body):
    m = struct.pack('!BBH', t, code, 0) + rest + body
    c = csum(m)
    return m[:2] + struct.pack('!H', c) + m[4:]

def icmp6(src, dst, t, code, rest, body):
    m = struct.pack('!BBH', t, code, 0) + rest + body
    c = csum(ph6(src, dst, 58, len(m)) + m)
    return m[:2] + struct.pack('!H', c) + m[4:]

def ipv6(src, dst, nh, payload, hlim=64, tc=0, fl=0):
    return struct.pack('!IHBB', (6<<28)|(tc<<20)|fl, len(payload), nh, hlim) + ip6(src) + ip6(dst) + payload

F = {}
M1, M2 = '52:54:00:12:34:56', '52:54:00:ab:cd:ef'
# 1. TCP SYN with Linux options
opts = bytes([2,4,0x05,0xb4, 4,2, 8,10]) + struct.pack('!II', 0x0a1b2c3d, 0) + bytes([1, 3,3,7])
s, d = '10.0.0.1', '10.0.0.2'
seg = tcp(54321, 80, 0x3ade68b1, 0, 0x02, 64240, opts, ph=ph4(s, d, 6, 20+len(opts)))
F['tcp_syn'] = eth(M2, M1, 0x0800, ipv4(s, d, 6, seg, ident=0x7c1e))
# 2. DNS query example.com A
dns = struct.pack('!HHHHHH', 0xbeef, 0x0100, 1, 0, 0, 0) + b'\x07example\x03com\x00' + struct.pack('!HH', 1, 1)
s, d = '192.168.1.100', '192.168.1.1'
u = udp(53000, 53, dns, lambda n: ph4(s, d, 17, n))
dns_ip = ipv4(s, d, 17, u, ident=0x4d2e)
F['udp_dns'] = eth(M2, M1, 0x0800, dns_ip)
# 3. ICMP echo request, Linux ping payload
body = struct.pack('!II', 0x65a1b2c3, 0x000d4e5f) + bytes(range(0x10, 0x38))
F['icmp_echo'] = eth(M2, M1, 0x0800, ipv4(s, '8.8.8.8', 1, icmp4(8, 0, struct.pack('!HH', 0x1234, 1), body), ident=0xabcd))
# 4. ICMP port unreachable from 192.168.1.1 carrying the DNS query
F['icmp_unreach'] = eth(M1, M2, 0x0800, ipv4(d, s, 1, icmp4(3, 3, b'\0\0\0\0', dns_ip), ident=0x0e1f, flags_off=0, tos=0xc0))
# 5. IPv6 TCP with hop-by-hop (router alert + PadN) and destination options (PadN)
s6, d6 = '2001:db8::1', '2001:db8::2'
data = b'GET / HTTP/1.1\r\n\r\n'
seg6 = tcp(40000, 80, 1000, 2000, 0x18, 502, b'', data, ph=ph6(s6, d6, 6, 20+len(data)))
hbh = bytes([60, 0, 5, 2, 0, 0, 1, 0])          # next=DstOpts, len 0; Router Alert (MLD=0); PadN(0)
dst = bytes([6, 1, 1, 12]) + bytes(12)           # next=TCP, len 1 (16 bytes), PadN 12
F['ipv6_ext_tcp'] = eth(M2, M1, 0x86dd, ipv6(s6, d6, 0, hbh + dst + seg6, tc=0, fl=0x12345))
# 6. IPv6 fragments of a UDP datagram (payload 1300 bytes split at 1232)
updata = bytes((i * 7) & 0xff for i in range(100))
u6 = udp(5353, 9999, updata, lambda n: ph6(s6, d6, 17, n))
first, rest = u6[:56], u6[56:]
F['ipv6_frag_first'] = eth(M2, M1, 0x86dd, ipv6(s6, d6, 44, bytes([17, 0]) + struct.pack('!HI', (0 << 3) | 1, 0xcafe0001) + first))
F['ipv6_frag_later'] = eth(M2, M1, 0x86dd, ipv6(s6, d6, 44, bytes([17, 0]) + struct.pack('!HI', (56 // 8) << 3, 0xcafe0001) + rest))
# 7. QinQ UDP (small payload, padded to 64 bytes)
u = udp(5000, 6000, b"hi", lambda n: ph4('10.1.1.1', '10.2.2.2', 17, n))
fr = eth(M2, M1, 0x0800, ipv4('10.1.1.1', '10.2.2.2', 17, u, ident=1), tags=((0x88a8, (3 << 13) | 100), (0x8100, 200)))
F['qinq_udp'] = fr + bytes(64 - len(fr)) if len(fr) < 64 else fr
# 8. ARP request, padded to 60
arp = struct.pack('!HHBBH', 1, 0x0800, 6, 4, 1) + mac(M1) + ip4('192.168.1.100') + bytes(6) + ip4('192.168.1.1')
fr = eth('ff:ff:ff:ff:ff:ff', M1, 0x0806, arp)
F['arp_request'] = fr + bytes(60 - len(fr))
# 9. IGMPv2 membership report with router alert option
igmp = bytes([0x16, 0, 0, 0]) + ip4('239.1.2.3')
igmp = igmp[:2] + struct.pack('!H', csum(igmp)) + igmp[4:]
fr = eth('01:00:5e:01:02:03', M1, 0x0800, ipv4('192.168.1.100', '239.1.2.3', 2, igmp, ident=0, ttl=1, opts=bytes([0x94, 4, 0, 0]), tos=0xc0))
F['ipv4_options_igmp'] = fr + bytes(60 - len(fr))
# 10. Short TCP ACK padded to 60 bytes
s, d = '10.0.0.2', '10.0.0.1'
seg = tcp(80, 54321, 0x11223344, 0x3ade68b2, 0x10, 509, ph=ph4(s, d, 6, 20))
fr = eth(M1, M2, 0x0800, ipv4(s, d, 6, seg, ident=0))
F['tcp_ack_padded'] = fr + bytes(60 - len(fr))
# 11. ICMPv6 echo request
F['icmpv6_echo'] = eth(M2, M1, 0x86dd, ipv6(s6, d6, 58, icmp6(s6, d6, 128, 0, struct.pack('!HH', 0x0777, 3), b'abcdefgh')))
# 12. IPv4 fragments: first and later fragment of a UDP datagram
big = udp(40001, 40002, bytes(range(200)), lambda n: ph4('10.0.0.1', '10.0.0.2', 17, n))
F['ipv4_frag_first'] = eth(M2, M1, 0x0800, ipv4('10.0.0.1', '10.0.0.2', 17, big[:104], ident=0x5555, flags_off=0x2000))
F['ipv4_frag_later'] = eth(M2, M1, 0x0800, ipv4('10.0.0.1', '10.0.0.2', 17, big[104:], ident=0x5555, flags_off=104 // 8))

out = sys.argv[1] if len(sys.argv) > 1 else '.'
json.dump({k: v.hex() for k, v in F.items()}, open(os.path.join(out, 'fixtures.json'), 'w'), indent=1)
# pcap
with open(os.path.join(out, 'fixtures.pcap'), 'wb') as f:
    f.write(struct.pack('<IHHiIII', 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
    for i, (k, v) in enumerate(F.items()):
        f.write(struct.pack('<IIII', i, 0, len(v), len(v)) + v)
for i, k in enumerate(F): print(i + 1, k, len(F[k]))
