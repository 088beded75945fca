"""The gaps between a proxy's system calls, from `perf trace` output: for each pair of
consecutive calls (a wake-up from epoll_wait, the read of the client's request, the
write to the backend, the read of the backend's answer, the write to the client), the
median time from the end of one to the start of the next, which is the proxy's own
work between them.

    syscall_gaps.py TRACE BACKEND_SOCKETS

BACKEND_SOCKETS is a file of the inode numbers of the proxy's sockets to the backend
(`ss -tnie dport = :PORT` lists them): a read of one of them is the backend's answer,
a read of any other socket the client's request; a write after the client's request
goes to the backend, any other write (but an eventfd's) to the client. Pairs seen
fewer than 20 times are left out.
"""

import re
import statistics
import sys

CALL = re.compile(r"^\s*([\d.]+) \(\s*([\d.]+) ms\): (?:\S+ )?(\w+)\((.*)\)\s+=\s+(-?\d+)")
READS = ("recvfrom", "read", "readv")
WRITES = ("sendto", "writev", "write", "sendmsg")


def calls(lines, backend):
    """(start ms, end ms, role) of every call, in order."""
    last_read = None
    for line in lines:
        m = CALL.match(line)
        if not m:
            continue
        start, took, name, args, ret = float(m[1]), float(m[2]), m[3], m[4], int(m[5])
        socket = re.search(r"socket:\[(\d+)\]", args)
        if name in READS and socket and ret > 0:
            role = last_read = "read of the backend" if socket[1] in backend else "read of the client"
        elif name in WRITES and "eventfd" not in args and ret > 8:
            role = "write to the backend" if last_read == "read of the client" else "write to the client"
        elif name == "epoll_wait":
            role = "epoll_wait returns"
        else:
            role = name
        yield start, start + took, role


def gaps(lines, backend):
    """{(from, to): [µs, ...]} over consecutive calls."""
    found = {}
    seen = list(calls(lines, backend))
    for (_, ended, first), (started, _, then) in zip(seen, seen[1:]):
        found.setdefault((first, then), []).append((started - ended) * 1000)
    return found


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        backend = set(f.read().split())
    with open(sys.argv[1]) as f:
        found = gaps(f, backend)
    for (first, then), us in sorted(found.items(), key=lambda kv: -len(kv[1])):
        if len(us) >= 20:
            print(f"  {first + ' -> ' + then:<52} n={len(us):<5} median {statistics.median(us):6.1f} µs")
