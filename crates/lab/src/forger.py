# What a host on the cluster network that holds no key sends (see flowstate_lab::forger).
import os, socket, struct, time
ROOT, I, I1 = "{ROOT}", "{I}", "{I1}"
def geneve(kind, partition, epoch, clock, payload=b"", control=True):
    opt = struct.pack(">BBHIQ", kind, 0, partition, epoch, clock)
    return struct.pack(">BBHI", 5, (0x80 if control else 0) | 0x40, 0x6558, 0) \
        + struct.pack(">HBB", 0xfff0, 0x81, 4) + opt + payload
def csum(b):
    s = sum(struct.unpack(">%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
def frame():
    udp = struct.pack(">HHHH", 4242, 9999, 8 + 6, 0) + b"forged"
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton("10.0.0.99"), socket.inet_aton("{SERVER}"))
    ip = ip[:10] + struct.pack(">H", csum(ip)) + ip[12:]
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp
report = b"FSRP" + struct.pack(">BII4sHIQdQQQQI", 2, 0, 9, socket.inet_aton(I), 6081, 4242,
                               2**64 - 1, 0.1, 0, 0, 0, 0, 0)
lag = b"FSLG" + struct.pack(">BIIIQ", 2, 0, 1, 1, 10**10)
assignment = b"FSAS" + struct.pack(">BQII", 2, 2**62, 0, 16) + struct.pack(">II", 9, 10**9) * 16 \
    + struct.pack(">II4sHB", 1, 9, socket.inet_aton(I), 6081, 1)
sends = [
    ((ROOT, 7900), report, 2), ((ROOT, 7900), lag, 1),
    ((ROOT, 7901), assignment, 3), ((I1, 7901), assignment, 3),
    ((ROOT, 6081), geneve(0, 0, 1, (1 << 48) + 5, frame(), False), 2),
    ((ROOT, 6081), geneve(0, 0, 1, 2**64 - 1, frame(), False), 2),
    ((ROOT, 6081), geneve(7, 0, 0, 0, struct.pack(">QI", (1 << 48) + 7, 1)), 2),
    ((ROOT, 6081), geneve(2, 3, 1, 0), 2),
]
sends += [((I1, 6081), geneve(3, p, 2**32 - 1, 0), 1) for p in range(16)]
sends += [((I1, 6081), geneve(1, p, 2**32 - 1, 0), 1) for p in range(16)]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((I, 6081))
n = 0
for _ in range(3):
    for to, body, role in sends:
        # role, key 1, reserved, sender 9, nonce prefix, sequence number, tag (36 bytes)
        trailer = struct.pack(">BBHIIQ", role, 1, 0, 9, int.from_bytes(os.urandom(4), "big"),
                              time.time_ns()) + os.urandom(16)
        for d in (body, body + trailer):
            s.sendto(d, to); n += 1
    time.sleep(0.2)
print(n)
