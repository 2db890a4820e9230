#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare strata-bench's all-reduce with Open MPI's, Gloo's and torch.distributed's.

By default Strata's ring over tcp against Open MPI restricted to TCP
(--mca btl tcp,self). --transport picks Strata's transport (auto, libfabric,
...; --option KEY=JSON passes its options) and --mpi-btl Open MPI's; an empty
--mpi-btl lets Open MPI choose, which on one host is its shared-memory path
(the peer for Strata's same-host path). Gloo (Debian libgloo-dev, tcp on
127.0.0.1) and torch.distributed with the gloo backend (Debian python3-torch)
join the comparison when their programs are there (--gloo-bench,
--torch-bench; '' leaves one out). Alternates the programs --runs times
(the machines are shared and noisy) and prints, per rank count and size, the
median time and busbw of each, the ratios (s/m: Strata over Open MPI, time
and busbw; s/g, s/t: Strata's busbw over Gloo's and torch's, above 1 Strata
is faster; 'run s/m' is the median over the runs of each run's busbw ratio,
which a run that caught the machine in a slow spell moves less; '90% of run'
is a 90 % confidence interval of that median from the runs' order
statistics, from 5 runs on: where it holds 1.0 the runs do not show either
program faster, and only where its low end is 1.1 or more do they show
Strata 1.1x ahead), and the machine's 1-minute load average read before each
block (min-max over the blocks of that row; above the core count the machine
is oversubscribed and polling peers such as Open MPI lose most). Each run starts with the next
program in turn (Strata, Open MPI, Gloo, torch, then Open MPI first, ...), so
no program always runs right after the same one. --load N measures under
load: N busy loops (yes >/dev/null) run beside every block, are checked to
be alive before each block, and are stopped at the end (also when a program
fails or the comparison is stopped with Ctrl-C, SIGTERM or SIGHUP). Build the
peers as /work/shared/bench/README.md says:
    mpicc -O2 -o /tmp/mpi_coll_bench /work/shared/bench/mpi_coll_bench.c
    g++ -std=c++17 -O2 -o /tmp/gloo_bench /work/shared/bench/gloo_bench.cc -lgloo -lpthread
Examples:
    compare_mpi.py --bench build/bin/strata-bench --runs 5 --ranks 2,4
    compare_mpi.py --bench build/bin/strata-bench --transport auto --mpi-btl '' --runs 3
    compare_mpi.py --bench build/bin/strata-bench --runs 3 --load 2   # beside two busy loops
"""
import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys


def parse_columns(text, what):
    """Rows of the nccl-tests style table gloo_bench and torch_gloo_bench.py
    print: size count dtype time(us) t_min t_max algbw busbw wrong."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if line.startswith('#') or len(f) < 9 or not f[0].isdigit():
            continue
        if int(f[8]) != 0:
            sys.exit('%s: %s wrong elements at %s bytes' % (what, f[8], f[0]))
        rows[int(f[0])] = (float(f[3]), float(f[7]))
    return rows


def median_interval(xs, level=0.9):
    """A distribution-free confidence interval of the median of xs: the order statistics x(k), x(n+1-k) with the
    largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at least `level`. None when even min-max covers
    less (fewer than 5 values at 90 %). Per-run ratios on a noisy machine are far from normal, hence no t-test."""
    xs = sorted(xs)
    n = len(xs)
    best = None
    below = 0.0  # P(Binomial(n, 1/2) < k)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2.0 ** n
        if 1 - 2 * below < level:
            break
        best = (xs[k - 1], xs[n - k])
    return best


def parse_sizes(text):
    """--sizes in strata-bench's forms (hosts/strata-bench/sizes.h): a comma list '4096,4K,16M' or a doubling
    range '4K:64M'; K, M, G are powers of 1024. Returns bytes: the peers' programs take bytes only."""
    def one(item):
        t = item.strip().upper()
        scale = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}.get(t[-1:], 1)
        digits = t[:-1] if scale > 1 else t
        if not digits.isdigit() or int(digits) == 0:
            sys.exit("--sizes: %r is not a size; give bytes or a number with K, M or G, as a list or a doubling "
                     "range (e.g. 4K,64K,1M or 4K:16M)" % item)
        return int(digits) * scale
    if ':' not in text:
        return [one(x) for x in text.split(',')]
    lo, hi = (one(x) for x in text.split(':', 1))
    if lo > hi:
        sys.exit("--sizes: range %r goes down; use LOW:HIGH with LOW <= HIGH (e.g. 4K:16M)" % text)
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= 2
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--bench', required=True, help='path of strata-bench')
    ap.add_argument('--mpi-bench', default='/tmp/mpi_coll_bench', help='path of the built mpi_coll_bench')
    ap.add_argument('--gloo-bench', default='/tmp/gloo_bench',
                    help="path of the built gloo_bench ('' or a missing file: no Gloo column)")
    ap.add_argument('--torch-bench', default='/work/shared/bench/torch_gloo_bench.py',
                    help="path of torch_gloo_bench.py ('' or no python3-torch: no torch column)")
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--ranks', default='2,4')
    ap.add_argument('--sizes', default='4K,1M,16M,64M',
                    help='bytes, or K/M/G (powers of 1024), as a list or a doubling range: 4K,64K,1M or 4K:16M')
    ap.add_argument('--transport', default='tcp', help="Strata's transport (tcp, auto, libfabric, ...)")
    ap.add_argument('--option', action='append', default=[], help='transport option KEY=JSON (repeatable)')
    ap.add_argument('--mpi-btl', default='tcp,self', help="Open MPI's --mca btl ('' = its own choice)")
    ap.add_argument('--load', type=int, default=0,
                    help='busy loops (yes >/dev/null) to run beside every block: measure under load (default 0)')
    ap.add_argument('--timeout', type=float, default=900,
                    help='seconds one program may take for all the sizes of one block (default 900)')
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit('--runs: %d; give at least 1 (3 or more: the medians need several runs)' % a.runs)
    if a.load < 0 or a.load > 64:
        sys.exit('--load: %d busy loops; give 0 (idle) to 64, e.g. --load 2 on a 2-core machine' % a.load)
    if a.timeout <= 0:
        sys.exit('--timeout: %g s; give a positive number of seconds (default 900)' % a.timeout)
    options = [x for o in a.option for x in ('--option', o)]
    mpi_btl = ['--mca', 'btl', a.mpi_btl] if a.mpi_btl else []
    ranks = [int(x) for x in a.ranks.split(',')]
    sizes = parse_sizes(a.sizes)
    size_list = ','.join(str(x) for x in sizes)
    peers = []  # (key, column name, command for n ranks)
    if a.gloo_bench and os.path.exists(a.gloo_bench):
        peers.append(('gloo', 'gloo', lambda n: [a.gloo_bench, '-n', str(n), '-s', size_list]))
    else:
        print('# no Gloo column: %r is not there (build it as /work/shared/bench/README.md says)' % a.gloo_bench)
    torch_ok = a.torch_bench and os.path.exists(a.torch_bench) and subprocess.run(
        ['/usr/bin/python3', '-c', 'import torch.distributed'], capture_output=True).returncode == 0
    if torch_ok:
        peers.append(('torch', 'torch', lambda n: ['/usr/bin/python3', a.torch_bench, '-n', str(n), '-s', size_list]))
    else:
        print('# no torch.distributed column: needs %r and python3-torch' % a.torch_bench)
    by_run = {}   # (program, ranks, bytes, run) -> (time us, busbw)
    loads = {}

    def load(n):
        with open('/proc/loadavg') as f:
            loads.setdefault(n, []).append(float(f.read().split()[0]))

    def run_checked(command, what):
        """The program's standard output; exits naming it when it fails or outlasts --timeout."""
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            sys.exit('%s did not finish within --timeout %g s (%s): run it alone to see where it stops, or give '
                     'fewer --sizes or a longer --timeout' % (what, a.timeout, ' '.join(command)))
        if out.returncode != 0:
            sys.exit('%s failed (exit status %d, %s):\n%s' % (what, out.returncode, ' '.join(command), out.stderr))
        return out.stdout

    def strata(n):
        stdout = run_checked([a.bench, 'allreduce', '--transport', a.transport, '-n', str(n), '--sizes', size_list,
                              '--json'] + options, 'strata-bench')
        rows = {}
        for r in json.loads(stdout)['results']:
            if r['wrong'] != 0:
                sys.exit('strata-bench: %d wrong elements at %d bytes' % (r['wrong'], r['bytes']))
            rows[r['bytes']] = (r['time_us'], r['busbw_gbps'])
        return rows

    def mpi(n):
        stdout = run_checked(['mpirun', '--allow-run-as-root', '--oversubscribe'] + mpi_btl +
                             ['-np', str(n), a.mpi_bench, '-c', 'allreduce', '-s', size_list], 'mpirun')
        rows = {}
        for line in stdout.splitlines():
            f = line.split()
            if line.startswith('#') or len(f) < 8:
                continue
            if f[7] != 'yes':
                sys.exit('mpi_coll_bench: wrong result at %s bytes' % f[0])
            rows[int(f[0])] = (float(f[2]), float(f[6]))
        return rows

    def peer(command, name):
        return lambda n: parse_columns(run_checked(command(n), name), name)

    programs = [('strata', strata), ('mpi', mpi)] + [(key, peer(command, name)) for key, name, command in peers]
    # A comparison stopped by kill or timeout(1) still stops its busy loops
    # and the program running (subprocess.run kills it on the way out).
    def stopped_by(signum, _frame):
        sys.exit('compare_mpi.py: stopped by signal %d (%s)' % (signum, signal.Signals(signum).name))

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stopped_by)
    busy = []
    if a.load:
        yes = shutil.which('yes')
        if yes is None:
            sys.exit('--load needs the yes program (coreutils) for its busy loops')
        busy = [subprocess.Popen([yes], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(a.load)]

    def check_busy():
        stopped = [p for p in busy if p.poll() is not None]
        if stopped:
            sys.exit('--load: %d of the %d busy loops stopped (exit status %s), so the figures would not be loaded '
                     'ones; something on this machine killed them: run again once it no longer does'
                     % (len(stopped), len(busy), stopped[0].returncode))

    try:
        for run in range(a.runs):
            for n in ranks:
                k = run % len(programs)
                for key, go in programs[k:] + programs[:k]:
                    check_busy()
                    load(n)
                    for b, row in go(n).items():
                        by_run[(key, n, b, run)] = row
            check_busy()
            print('run %d of %d done' % (run + 1, a.runs), file=sys.stderr)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print('# %d cores; %s; load = 1-minute load average before each block, min-max'
          % (len(os.sched_getaffinity(0)), 'LOADED: %d busy loops (yes) beside every block' % a.load if a.load
             else 'idle: nothing started beside the programs'))
    head = '%5s %10s | %11s %9s | %11s %9s | %9s %9s %9s %11s' % (
        'ranks', 'bytes', 'strata(us)', 'busbw', 'mpi(us)', 'busbw', 'time s/m', 'busbw s/m', 'run s/m', '90% of run')
    for key, name, _ in peers:
        head += ' | %11s %9s %6s' % (name + '(us)', 'busbw', 's/' + name[0])
    print(head + ' | %4s | %s' % ('runs', 'load'))
    def rows(key, n, b):
        return [by_run[(key, n, b, i)] for i in range(a.runs) if (key, n, b, i) in by_run]

    def medians(rs):
        return statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs)

    for n in ranks:
        for b in sizes:
            s, m = rows('strata', n, b), rows('mpi', n, b)
            if not s or not m:
                continue
            (st, sb), (mt, mb) = medians(s), medians(m)
            ld = loads.get(n, [0.0])
            per_run = [by_run[('strata', n, b, i)][1] / by_run[('mpi', n, b, i)][1] for i in range(a.runs)
                       if ('strata', n, b, i) in by_run and by_run.get(('mpi', n, b, i), (0, 0))[1] > 0]
            ci = median_interval(per_run)
            line = '%5d %10d | %11.1f %9.3f | %11.1f %9.3f | %9.2f %9.2f %9.2f %11s' % (
                n, b, st, sb, mt, mb, st / mt, sb / mb, statistics.median(per_run) if per_run else float('nan'),
                '%.2f-%.2f' % ci if ci else '-')
            for key, _, _ in peers:
                p = rows(key, n, b)
                if not p:
                    line += ' | %11s %9s %6s' % ('-', '-', '-')
                    continue
                pt, pb = medians(p)
                line += ' | %11.1f %9.3f %6.2f' % (pt, pb, sb / pb if pb > 0 else float('inf'))
            print(line + ' | %d+%d | %.1f-%.1f' % (len(s), len(m), min(ld), max(ld)))


if __name__ == '__main__':
    main()
