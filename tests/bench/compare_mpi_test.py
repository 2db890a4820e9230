#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests of hosts/strata-bench/compare_mpi.py's own logic with stand-in
programs (strata-bench, mpirun with its benchmark, gloo_bench) that print
known figures and log when they ran and how many busy loops ran beside them:
the programs take turns starting a run, --load's busy loops run during every
block and are gone afterwards (also when a program fails), the per-run ratio
is the median of each run's ratio, and bad arguments and wrong results fail.
Usage: compare_mpi_test.py PATH/compare_mpi.py"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import unittest

SCRIPT = None

# Every stand-in logs "name run busy-loop-pids" and prints figures that
# depend on how often it ran: busbw per run (GB/s) for strata, mpi, gloo.
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
d = os.environ['FAKE_DIR']
count_file = os.path.join(d, name + '.count')
run = int(open(count_file).read()) if os.path.exists(count_file) else 0
open(count_file, 'w').write(str(run + 1))
parent = os.getppid()
if name == 'mpi_bench':  # started by the stand-in mpirun
    parent = int(os.environ['FAKE_MPIRUN_PARENT'])
busy = []
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        fields = open('/proc/%s/stat' % pid).read().rsplit(')', 1)[1].split()
        comm = open('/proc/%s/comm' % pid).read().strip()
    except OSError:
        continue
    if comm == 'yes' and int(fields[1]) == parent:
        busy.append(pid)
with open(os.path.join(d, 'log'), 'a') as f:
    f.write('%s %d %s\n' % (name, run, ','.join(sorted(busy))))
if os.environ.get('FAKE_HANG') == name:
    import time
    time.sleep(30)
if os.environ.get('FAKE_EXIT') == name:
    sys.stderr.write('%s: cannot start\n' % name)
    sys.exit(3)
busbw = {'strata_bench': [1.0, 4.0, 2.0], 'mpi_bench': [2.0, 1.0, 4.0], 'gloo_bench': [0.5, 0.5, 0.5]}[name][run % 3]
sizes = []
for i, a in enumerate(sys.argv):
    if a in ('--sizes', '-s'):
        sizes = [int(x) for x in sys.argv[i + 1].split(',')]
wrong = os.environ.get('FAKE_WRONG') == name
if name == 'strata_bench':
    print(json.dumps({'results': [{'bytes': b, 'time_us': 1000.0 / busbw, 'busbw_gbps': busbw,
                                   'wrong': 1 if wrong else 0} for b in sizes]}))
elif name == 'mpi_bench':
    for b in sizes:
        print('%14d %6d %12.1f %12.1f %12.1f %10.3f %10.3f   %s' % (b, 1, 1000.0 / busbw, 1, 1, busbw, busbw,
                                                                  'no' if wrong else 'yes'))
else:
    for b in sizes:
        print('%d %d float32 %.1f 1 1 %.3f %.3f %d' % (b, b // 4, 1000.0 / busbw, busbw, busbw, 1 if wrong else 0))
'''

MPIRUN = r'''#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
prog = args[args.index('-np') + 2:]
os.environ['FAKE_MPIRUN_PARENT'] = str(os.getppid())
os.execv(prog[0], prog)
'''


class CompareMpiTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        for name, text in (('strata_bench', FAKE), ('mpi_bench', FAKE), ('gloo_bench', FAKE), ('mpirun', MPIRUN)):
            path = os.path.join(self.dir, name)
            with open(path, 'w') as f:
                f.write(text)
            os.chmod(path, 0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def start(self, *extra, env=None):
        """The script on the stand-ins, started; later arguments override earlier ones."""
        e = dict(os.environ, FAKE_DIR=self.dir, PATH=self.dir + os.pathsep + os.environ.get('PATH', ''))
        e.update(env or {})
        cmd = [sys.executable, SCRIPT, '--bench', os.path.join(self.dir, 'strata_bench'),
               '--mpi-bench', os.path.join(self.dir, 'mpi_bench'), '--gloo-bench', os.path.join(self.dir, 'gloo_bench'),
               '--torch-bench', '', '--ranks', '2', '--sizes', '4K,64K'] + list(extra)
        return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def compare(self, *extra, env=None):
        p = self.start(*extra, env=env)
        try:
            out, err = p.communicate(timeout=60)
        finally:
            p.kill()
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def log(self):
        with open(os.path.join(self.dir, 'log')) as f:
            return [line.split(' ') for line in f.read().splitlines()]

    def started(self):
        """The stand-ins started so far (none before the first logs)."""
        return [x[0] for x in self.log()] if os.path.exists(os.path.join(self.dir, 'log')) else []

    def forget_log(self):
        if os.path.exists(os.path.join(self.dir, 'log')):
            os.remove(os.path.join(self.dir, 'log'))

    def row(self, out, size):
        for line in out.splitlines():
            f = line.split()
            if len(f) > 2 and f[0] == '2' and f[1] == str(size):
                return [x for x in f if x != '|']
        self.fail('no row for %d bytes in:\n%s' % (size, out))

    def assert_gone(self, pids):
        for pid in pids:
            self.assertFalse(os.path.exists('/proc/%s' % pid), 'busy loop %s is still running' % pid)

    def test_programs_take_turns_and_run_beside_the_busy_loops(self):
        r = self.compare('--runs', '3', '--load', '2')
        self.assertEqual(r.returncode, 0, r.stderr)
        log = self.log()
        self.assertEqual([(x[0], int(x[1])) for x in log],
                         [('strata_bench', 0), ('mpi_bench', 0), ('gloo_bench', 0),
                          ('mpi_bench', 1), ('gloo_bench', 1), ('strata_bench', 1),
                          ('gloo_bench', 2), ('strata_bench', 2), ('mpi_bench', 2)])
        busy = set()
        for x in log:
            pids = [p for p in x[2].split(',') if p]
            self.assertEqual(len(pids), 2, 'block %s ran beside %s busy loops' % (x, len(pids)))
            busy.update(pids)
        self.assertEqual(len(busy), 2, 'the same two loops serve every block')
        self.assert_gone(busy)
        self.assertIn('LOADED: 2 busy loops', r.stdout)
        # strata busbw 1, 4, 2 and mpi 2, 1, 4 over the runs: the medians are
        # equal (busbw s/m 1.00), the runs' ratios 0.5, 4, 0.5 (run s/m 0.50).
        # Three runs are too few for a 90 % interval of that median ('-').
        row = self.row(r.stdout, 4096)
        self.assertEqual(row[2:11], ['500.0', '2.000', '500.0', '2.000', '1.00', '1.00', '0.50', '-', '2000.0'])
        self.assertEqual(row[12], '4.00')  # over gloo's 0.5
        self.assertEqual(row[13], '3+3')

    def test_five_runs_give_an_interval_of_the_per_run_median(self):
        # Runs' ratios 0.5, 4, 0.5, 0.5, 4: median 0.50, and with five runs
        # the 90 % interval is min-max (coverage 94 %).
        r = self.compare('--runs', '5')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('90% of run', r.stdout)
        row = self.row(r.stdout, 65536)
        self.assertEqual(row[8:10], ['0.50', '0.50-4.00'])
        self.assertEqual(row[13], '5+5')

    def test_median_interval_takes_the_order_statistics_that_cover_90_percent(self):
        spec = importlib.util.spec_from_file_location('compare_mpi', SCRIPT)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        self.assertIsNone(m.median_interval([3, 1, 2, 4]))  # min-max covers 87.5 %
        self.assertEqual(m.median_interval([5, 4, 3, 2, 1]), (1, 5))  # 93.8 %
        self.assertEqual(m.median_interval(list(range(10, 0, -1))), (2, 9))  # 97.9 %; (3, 8) is 89.1 %
        self.assertEqual(m.median_interval(list(range(1, 21))), (6, 15))  # 95.9 %; (7, 14) is 88.5 %
        self.assertEqual(m.median_interval(list(range(1, 21)), level=0.5), (8, 13))  # 73.7 %; (9, 12) 49.7 %

    def test_idle_starts_no_busy_loop(self):
        r = self.compare('--runs', '1')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(all(x[2] == '' for x in self.log()), self.log())
        self.assertIn('idle: nothing started beside the programs', r.stdout)

    def test_a_wrong_result_fails_and_stops_the_busy_loops(self):
        for name, message in (('mpi_bench', 'mpi_coll_bench: wrong result at 4096 bytes'),
                              ('strata_bench', 'strata-bench: 1 wrong elements at 4096 bytes'),
                              ('gloo_bench', 'gloo: 1 wrong elements at 4096 bytes')):
            self.forget_log()
            r = self.compare('--runs', '3', '--load', '1', env={'FAKE_WRONG': name})
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(message, r.stderr)
            self.assert_gone({p for x in self.log() for p in x[2].split(',') if p})

    def test_a_failed_or_hung_program_is_named_and_the_busy_loops_stop(self):
        for env, extra, message in (
                ({'FAKE_EXIT': 'gloo_bench'}, [], 'gloo failed (exit status 3, '),
                ({'FAKE_EXIT': 'strata_bench'}, [], 'strata-bench failed (exit status 3, '),
                ({'FAKE_HANG': 'mpi_bench'}, ['--timeout', '1'], 'mpirun did not finish within --timeout 1 s')):
            self.forget_log()
            r = self.compare('--runs', '1', '--load', '1', *extra, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(message, r.stderr)
            self.assert_gone({p for x in self.log() for p in x[2].split(',') if p})

    def test_a_terminated_comparison_stops_its_busy_loops(self):
        # As timeout(1) or kill would: SIGTERM while a program (the hanging
        # mpi_bench, which runs second) runs.
        p = self.start('--runs', '1', '--load', '2', '--timeout', '60', env={'FAKE_HANG': 'mpi_bench'})
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and 'mpi_bench' not in self.started():
                time.sleep(0.05)
            self.assertIn('mpi_bench', self.started(), 'the hanging program never started')
            p.terminate()
            _, err = p.communicate(timeout=30)
        finally:
            p.kill()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('stopped by signal 15 (SIGTERM)', err)
        self.assert_gone({q for x in self.log() for q in x[2].split(',') if q})

    def test_bad_arguments_are_refused(self):
        for args, message in ((['--runs', '0'], '--runs: 0; give at least 1'),
                              (['--load', '-1'], '--load: -1 busy loops; give 0 (idle) to 64'),
                              (['--load', '65'], '--load: 65 busy loops; give 0 (idle) to 64'),
                              (['--timeout', '0'], '--timeout: 0 s; give a positive number of seconds')):
            r = self.compare(*args)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(message, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.dir, 'log')), 'nothing ran')


if __name__ == '__main__':
    if len(sys.argv) < 2 or not os.path.exists(sys.argv[1]):
        sys.exit('usage: compare_mpi_test.py PATH/compare_mpi.py')
    SCRIPT = sys.argv.pop(1)
    unittest.main()
