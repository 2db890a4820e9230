#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare strata-bench's all-reduce with Open MPI's.

By default Strata's ring over tcp against Open MPI restricted to TCP
(--mca btl tcp,self). --transport picks Strata's transport (auto, libfabric,
...; --option KEY=JSON passes its options) and --mpi-btl Open MPI's; an empty
--mpi-btl lets Open MPI choose, which on one host is its shared-memory path
(the peer for Strata's same-host path). Alternates the two programs --runs
times (the machines are shared and noisy) and prints, per rank count and
size, the median time and busbw of each with the ratios, and the machine's
1-minute load average read before each block (min-max over the blocks of
that row; above the core count the machine is oversubscribed and polling
peers such as Open MPI lose most). Build the MPI side
as /work/shared/bench/README.md says:
    mpicc -O2 -o /tmp/mpi_coll_bench /work/shared/bench/mpi_coll_bench.c
Examples:
    compare_mpi.py --bench build/bin/strata-bench --runs 5 --ranks 2,4
    compare_mpi.py --bench build/bin/strata-bench --transport auto --mpi-btl '' --runs 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--bench', required=True, help='path of strata-bench')
    ap.add_argument('--mpi-bench', default='/tmp/mpi_coll_bench', help='path of the built mpi_coll_bench')
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--ranks', default='2,4')
    ap.add_argument('--sizes', default='4096,1048576,16777216,67108864', help='bytes, comma-separated')
    ap.add_argument('--transport', default='tcp', help="Strata's transport (tcp, auto, libfabric, ...)")
    ap.add_argument('--option', action='append', default=[], help='transport option KEY=JSON (repeatable)')
    ap.add_argument('--mpi-btl', default='tcp,self', help="Open MPI's --mca btl ('' = its own choice)")
    a = ap.parse_args()
    options = [x for o in a.option for x in ('--option', o)]
    mpi_btl = ['--mca', 'btl', a.mpi_btl] if a.mpi_btl else []
    ranks = [int(x) for x in a.ranks.split(',')]
    sizes = [int(x) for x in a.sizes.split(',')]
    res = {}
    loads = {}

    def load(n):
        with open('/proc/loadavg') as f:
            loads.setdefault(n, []).append(float(f.read().split()[0]))

    for run in range(a.runs):
        for n in ranks:
            load(n)
            out = subprocess.run([a.bench, 'allreduce', '--transport', a.transport, '-n', str(n), '--sizes', a.sizes,
                                  '--json'] + options, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                sys.exit('strata-bench failed:\n' + out.stderr)
            for r in json.loads(out.stdout)['results']:
                if r['wrong'] != 0:
                    sys.exit('strata-bench: %d wrong elements at %d bytes' % (r['wrong'], r['bytes']))
                res.setdefault(('strata', n, r['bytes']), []).append((r['time_us'], r['busbw_gbps']))
            load(n)
            out = subprocess.run(['mpirun', '--allow-run-as-root', '--oversubscribe'] + mpi_btl +
                                 ['-np', str(n), a.mpi_bench, '-c', 'allreduce', '-s', a.sizes],
                                 capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                sys.exit('mpirun failed:\n' + out.stderr)
            for line in out.stdout.splitlines():
                f = line.split()
                if line.startswith('#') or len(f) < 8:
                    continue
                if f[7] != 'yes':
                    sys.exit('mpi_coll_bench: wrong result at %s bytes' % f[0])
                res.setdefault(('mpi', n, int(f[0])), []).append((float(f[2]), float(f[6])))
        print('run %d of %d done' % (run + 1, a.runs), file=sys.stderr)
    print('# %d cores; load = 1-minute load average before each block, min-max' % len(os.sched_getaffinity(0)))
    print('%5s %10s | %11s %9s | %11s %9s | %9s %9s | %4s | %s' % ('ranks', 'bytes', 'strata(us)', 'busbw', 'mpi(us)',
                                                                   'busbw', 'time s/m', 'busbw s/m', 'runs', 'load'))
    for n in ranks:
        for b in sizes:
            s = res.get(('strata', n, b), [])
            m = res.get(('mpi', n, b), [])
            if not s or not m:
                continue
            st, sb = statistics.median(x[0] for x in s), statistics.median(x[1] for x in s)
            mt, mb = statistics.median(x[0] for x in m), statistics.median(x[1] for x in m)
            ld = loads.get(n, [0.0])
            print('%5d %10d | %11.1f %9.3f | %11.1f %9.3f | %9.2f %9.2f | %d+%d | %.1f-%.1f' % (
                n, b, st, sb, mt, mb, st / mt, sb / mb, len(s), len(m), min(ld), max(ld)))


if __name__ == '__main__':
    main()
