#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare strata-bench pingpong over the libfabric transport with fi_pingpong.

Both bounce one message between two processes over the same libfabric
provider (RDM endpoints, tagged messages) and report the one-way time per
message; bandwidth is size / one-way time for both. Alternates the two
programs --runs times (the machines are shared and noisy) and prints medians
and the ratios. fi_pingpong comes with Debian's libfabric-bin; its servers
use control ports from --port upwards on 127.0.0.1.
Examples:
    compare_pingpong.py --bench build/bin/strata-bench --provider 'tcp;ofi_rxm' --runs 5
    compare_pingpong.py --bench build/bin/strata-bench --provider shm --sizes 64,65536,4194304
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def fi_pingpong(provider, size, iters, port):
    args = ['fi_pingpong', '-p', provider, '-e', 'rdm', '-m', 'tagged', '-I', str(iters), '-S', str(size)]
    server = subprocess.Popen(args + ['-B', str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)  # the server binds its control port
        client = subprocess.run(args + ['-P', str(port), '127.0.0.1'], capture_output=True, text=True, timeout=300)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if client.returncode != 0:
        sys.exit('fi_pingpong failed (provider %s, size %d):\n%s%s' % (provider, size, client.stdout, client.stderr))
    # One size per run: the row after the header ("64k 1k =1k 128m 0.19s 717.00 91.40 0.01"),
    # its size written with a k/m/g suffix.
    for line in client.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0][:1].isdigit():
            return float(f[6])  # usec/xfer: one-way time
    sys.exit('fi_pingpong printed no result row:\n' + client.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--bench', required=True, help='path of strata-bench')
    ap.add_argument('--provider', default='tcp;ofi_rxm')
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--sizes', default='64,65536,262144,1048576,4194304', help='bytes, comma-separated')
    ap.add_argument('--iters', type=int, default=0, help='round trips per size (0 = as strata-bench picks)')
    ap.add_argument('--port', type=int, default=47700)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(',')]
    res = {}
    port = a.port
    for run in range(a.runs):
        cmd = [a.bench, 'pingpong', '--transport', 'libfabric', '--option', 'provider=' + json.dumps(a.provider),
               '-n', '2', '--sizes', a.sizes, '--repeats', '3', '--json']
        if a.provider.startswith('tcp'):
            cmd += ['--option', 'iface="lo"']
        if a.iters:
            cmd += ['--iters', str(a.iters)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            sys.exit('strata-bench failed:\n' + out.stderr)
        iters = {}
        for r in json.loads(out.stdout)['results']:
            res.setdefault(('strata', r['bytes']), []).append(r['time_us'])
            iters[r['bytes']] = r['iters']
        for s in sizes:
            port += 1
            res.setdefault(('fi', s), []).append(fi_pingpong(a.provider, s, a.iters or iters.get(s, 1000), port))
        print('run %d of %d done' % (run + 1, a.runs), file=sys.stderr)
    print('provider %s; one-way time per message, medians of %d alternating runs' % (a.provider, a.runs))
    print('%10s | %11s %10s | %11s %10s | %10s %10s' % ('bytes', 'strata(us)', 'GB/s', 'fi_pp(us)', 'GB/s',
                                                        'time s/f', 'bw s/f'))
    for s in sizes:
        st, ft = statistics.median(res[('strata', s)]), statistics.median(res[('fi', s)])
        sb, fb = s / st / 1e3, s / ft / 1e3
        print('%10d | %11.2f %10.3f | %11.2f %10.3f | %10.2f %10.2f' % (s, st, sb, ft, fb, st / ft, sb / fb))


if __name__ == '__main__':
    main()
