"""Instructions per request from callgrind files (uncompressed names).

    callgrind_self.py FILE REQUESTS TOP [--idle IDLE_FILE] [--stage NAME=REGEX ...]

Prints "<instructions per request> instructions/request" (every instruction in FILE's
window, divided by REQUESTS); with --idle, a file of the same process over a window of
the same length with no request in it, also "<n> of them the path's own, the idle
background subtracted" (FILE's count less IDLE_FILE's). Then, for each --stage, the
inclusive instructions per request of the functions whose names match REGEX (each
function's own instructions and its callees', once per call: a stage nested in another
is counted in both), and the TOP functions by their own instructions per request.
"""
import argparse
import collections
import re


def costs(path):
    """Each function's own instructions, and its inclusive ones (own plus calls)."""
    own = collections.Counter()
    inclusive = collections.Counter()
    fn, after_calls = None, False
    for line in open(path, errors="replace"):
        if line.startswith("fn="):
            fn = re.sub(r"^\(\d+\) ?", "", line[3:].strip())
        elif line.startswith("calls="):
            after_calls = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            fields = line.split()
            if len(fields) >= 2 and fn is not None:
                cost = int(fields[1])
                inclusive[fn] += cost
                if after_calls:
                    after_calls = False
                else:
                    own[fn] += cost
    return own, inclusive


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("requests", type=int)
    parser.add_argument("top", type=int)
    parser.add_argument("--idle")
    parser.add_argument("--stage", action="append", default=[])
    args = parser.parse_args()
    own, inclusive = costs(args.file)
    total = sum(own.values())
    line = f"{total // args.requests} instructions/request"
    if args.idle:
        idle = sum(costs(args.idle)[0].values())
        line += f", {(total - idle) // args.requests} of them the path's own (idle background {idle // args.requests} subtracted)"
    print(line)
    for stage in args.stage:
        name, pattern = stage.split("=", 1)
        matcher = re.compile(pattern)
        cost = sum(c for f, c in inclusive.items() if matcher.search(f))
        print(f"  stage {name}: {cost // args.requests} inclusive")
    for name, cost in own.most_common(args.top):
        print(f"{cost // args.requests:8d}  {name[:150]}")


main()
