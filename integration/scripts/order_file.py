"""link/qoslet.order: the mangled names of the qoslet binary's functions that ran, in lld's
--symbol-ordering-file format ('#' starts a comment), and the check that a build finds them.

  order_file.py BINARY demo=DIR cluster=DIR agent=DIR nri=DIR   prints the file (each DIR holds one
                                                                 workload's callgrind outputs)
  order_file.py --check BINARY [ORDER_FILE]                      exit 1 unless the binary has >= 90 %
                                                                 of the names and they lead its code

Functions that ran in the same workloads form one stretch, most instructions first, so that an
agent that runs none of a stretch's code has at most its two edge pages resident. The stretches are
ordered by the mean position of their workloads on the line demo (-2) - cluster (-1) - agent (0) -
nri (+2): code only the CRI front end runs first, code only the NRI front end runs last."""
import collections
import os
import re
import subprocess
import sys

POSITION = {"demo": -2, "cluster": -1, "agent": 0, "nri": 2}


def functions_of(binary):
    """The binary's functions: name -> (address, size), from nm."""
    out = subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            found[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return found


def check(binary, order_path):
    names = [l.strip() for l in open(order_path) if l.strip() and not l.startswith("#")]
    have = functions_of(binary)
    found = [n for n in names if n in have]
    share = len(found) / max(len(names), 1)
    # placed first: the listed functions' addresses are the lowest of the binary's functions
    lowest = sorted(a for a, _ in have.values())[: len(found)]
    placed = sum(1 for n in found if have[n][0] <= lowest[-1]) / max(len(found), 1) if found else 0
    print(f"{binary}: {len(found)} of {len(names)} functions of {order_path} found ({share:.1%}), "
          f"{placed:.1%} of them placed first", flush=True)
    if share < 0.9:
        made = [l[len("# made with: "):].strip() for l in open(order_path) if l.startswith("# made with: ")]
        rustc = subprocess.run([os.environ.get("RUSTC", "rustc"), "-V"], capture_output=True,
                               text=True).stdout.strip()
        print(f"the functions have other names in this build (the file was made with {made}; this "
              f"is {rustc}): rustc, Cargo.lock, a feature or the profile changed since; make the file "
              "again with integration/scripts/order-file.sh", file=sys.stderr)
        sys.exit(1)
    if placed < 0.9:
        print("the linker did not place them first: it ignored the file (see build.rs's warning in "
              "the build's output; the layout needs lld, rustc's default linker on x86_64 Linux "
              "since 1.90)", file=sys.stderr)
        sys.exit(1)


spec = re.compile(r"^(c?ob|c?fl|c?fi|c?fe|c?fn)=\((\d+)\)(?: (.*))?$")


def self_cost(path, binary, cost):
    """Adds each function's own instructions in one callgrind output to cost. Callgrind's format:
    names compressed ('(id) name' defines, '(id)' refers), one position column (line), Ir first."""
    objects, functions = {}, {}
    current_ob = current_fn = None
    after_calls = False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("positions:") and line.split()[1:] != ["line"]:
            sys.exit(f"{path}: positions {line}, want line only")
        if line.startswith("events:") and line.split()[1:2] != ["Ir"]:
            sys.exit(f"{path}: {line}, want Ir first")
        m = spec.match(line)
        if m:
            kind, ident, name = m.groups()
            table = objects if kind.endswith("ob") else functions if kind.endswith("fn") else None
            if table is not None and name is not None:
                table[ident] = name
            if kind == "ob":
                current_ob = objects.get(ident)
            elif kind == "fn":
                # callgrind names a recursive function's deeper levels name'2, name'3, ...
                current_fn = re.sub(r"'\d+$", "", functions.get(ident, "")) if current_ob == binary else None
            continue
        if line.startswith(("fn=", "ob=")):
            sys.exit(f"{path}: uncompressed names, run callgrind with its default --compress-strings=yes")
        if line.startswith("calls="):
            after_calls = True  # the next cost line is the call's inclusive cost, not this function's
            continue
        if line[:1].isdigit() or line[:1] in "+-*":
            if after_calls:
                after_calls = False
            elif current_fn:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    cost[current_fn] += int(parts[1])


def make(binary, workloads):
    sizes = {n: s for n, (_, s) in functions_of(binary).items()}
    costs, ran = collections.Counter(), collections.defaultdict(set)
    for workload, directory in workloads.items():
        per = collections.Counter()
        files = [os.path.join(directory, f) for f in sorted(os.listdir(directory))]
        if not files:
            sys.exit(f"no callgrind output for {workload} in {directory}")
        for path in files:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4096))
                complete = b"\ntotals:" in f.read()
            if not complete:  # the process was killed while callgrind wrote this dump
                print(f"skipped, incomplete: {path}", file=sys.stderr)
                continue
            self_cost(path, binary, per)
        for name, c in per.items():
            if name in sizes:
                costs[name] += c
                ran[name].add(workload)
    groups = collections.defaultdict(list)
    for name, where in ran.items():
        groups[frozenset(where)].append(name)
    order = sorted(groups, key=lambda g: (sum(POSITION[w] for w in g) / len(g), sorted(g)))
    rustc = subprocess.run([os.environ.get("RUSTC", "rustc"), "-V"], capture_output=True, text=True,
                           check=True).stdout.strip()
    lock = 0xCBF29CE484222325  # FNV-1a 64 of Cargo.lock: which lock the names were made with
    for byte in open("Cargo.lock", "rb").read():
        lock = ((lock ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    print("# qoslet's functions that ran, which release builds place first, in this order (build.rs).")
    print("# Made by integration/scripts/order-file.sh from callgrind runs of the agent; do not edit.")
    print(f"# made with: {rustc}; Cargo.lock {lock:016x}")
    print(f"# {len(ran)} functions, {sum(sizes[n] for n in ran)} bytes of {sum(sizes.values())} bytes of code")
    for group in order:
        members = sorted(groups[group], key=lambda n: (-costs[n], n))
        print(f"# ran in: {' '.join(sorted(group))} ({len(members)} functions, "
              f"{sum(sizes[n] for n in members)} bytes)")
        for name in members:
            print(name)


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "link/qoslet.order")
    else:
        workloads = dict(arg.split("=", 1) for arg in sys.argv[2:])
        if set(workloads) != set(POSITION):
            sys.exit(f"want {' '.join(w + '=DIR' for w in POSITION)}")
        make(sys.argv[1], workloads)
