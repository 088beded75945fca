"""Instructions per request from a callgrind file (uncompressed names).

    callgrind_self.py FILE REQUESTS TOP

Prints "<instructions per request> instructions/request", then the TOP functions by
their own instructions (not their callees') per request.
"""
import collections
import re
import sys


def own_costs(path):
    """Each function's own instruction count (cost lines not attributed to a call)."""
    own = collections.Counter()
    fn, after_calls = None, False
    for line in open(path, errors="replace"):
        if line.startswith("fn="):
            fn = re.sub(r"^\(\d+\) ?", "", line[3:].strip())
        elif line.startswith("calls="):
            after_calls = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            fields = line.split()
            if len(fields) >= 2 and fn is not None:
                if after_calls:
                    after_calls = False
                else:
                    own[fn] += int(fields[1])
    return own


def main():
    path, requests, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    own = own_costs(path)
    print(f"{sum(own.values()) // requests} instructions/request")
    for name, cost in own.most_common(top):
        print(f"{cost // requests:8d}  {name[:150]}")


main()
