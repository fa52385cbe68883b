# The upstream's health check of its ECMP paths to the roots (the lab's stand-in for a routing
# daemon's BFD): every INTERVAL, an ARP who-has GATEWAY on each link; a path whose gateway
# missed MISSED answers in a row leaves the multipath routes to DESTINATIONS, one answer
# brings it back. Rewriting a route also makes local sockets look their route up again.
#
# usage: ecmp_check.py GATEWAY SOURCE DEV,DEV,... DESTINATION...
import select
import socket
import subprocess
import sys
import time

INTERVAL = 0.1
MISSED = 3
gateway, source, devs, destinations = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
gw, src = socket.inet_aton(gateway), socket.inet_aton(source)

socks = {}
for dev in devs:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    s.bind((dev, 0x0806))
    s.setblocking(False)
    socks[dev] = s


def request(s):
    mac = s.getsockname()[4]
    arp = b"\x00\x01\x08\x00\x06\x04\x00\x01" + mac + src + b"\x00" * 6 + gw
    s.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)


def answered(s):
    got = False
    while True:
        try:
            f = s.recv(128)
        except BlockingIOError:
            return got
        # An ARP reply (op 2) from the gateway.
        if len(f) >= 42 and f[12:14] == b"\x08\x06" and f[20:22] == b"\x00\x02" and f[28:32] == gw:
            got = True


def install(up):
    for d in destinations:
        argv = ["ip", "route", "replace", d]
        if len(up) == 1:
            argv += ["via", gateway, "dev", up[0], "onlink"]
        else:
            for dev in up:
                argv += ["nexthop", "via", gateway, "dev", dev, "onlink"]
        subprocess.run(argv, check=False)
    print(time.strftime("%H:%M:%S"), "paths up:", ",".join(up), flush=True)


missed = {dev: 0 for dev in devs}
up = list(devs)
while True:
    for s in socks.values():
        request(s)
    deadline = time.time() + INTERVAL
    heard = set()
    while time.time() < deadline:
        ready, _, _ = select.select(list(socks.values()), [], [], max(0, deadline - time.time()))
        for dev, s in socks.items():
            if s in ready and answered(s):
                heard.add(dev)
    for dev in devs:
        missed[dev] = 0 if dev in heard else missed[dev] + 1
    now = [dev for dev in devs if missed[dev] < MISSED]
    if now and now != up:
        up = now
        install(up)
