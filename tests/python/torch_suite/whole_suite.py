"""torch's whole distributed_test.py as torch runs it for gloo, twice in one run: on gloo, then
with every group torch would make on gloo made on fastgather (distributed_suite.py, FG_AS_GLOO=1).
Prints each backend's pass/fail/skip counts and every test that passes on gloo but not on
fastgather, with the last line of its error.

    PYTHONPATH=build/python .venv/bin/python tests/python/torch_suite/whole_suite.py --world 2 [-k PATTERN]

Exit status 0 whatever the counts: it reports, the test command's named tests assert."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT = re.compile(r"^(test_\w+) \(__main__\.TestFastgatherBackend\.\w+\) \.\.\. (.*)$")


def run(world, as_gloo, pattern, timeout):
    env = dict(os.environ, BACKEND="gloo", WORLD_SIZE=str(world), TEMP_DIR=tempfile.mkdtemp(prefix="fg-suite-"))
    if as_gloo:
        env["FG_AS_GLOO"] = "1"
    args = [sys.executable, os.path.join(HERE, "distributed_suite.py"), "-v"] + (["-k", pattern] if pattern else [])
    t0 = time.time()
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    # unittest -v: "test_x (...) ... " then the verdict, on the same line or, when the ranks
    # print in between, on a line of its own.
    results, current = {}, None

    def verdict(text):
        text = text.strip()
        if text == "ok" or text.endswith(" ok"):
            return "pass"
        if text.startswith("skipped") or text.startswith("skip"):
            return "skip"
        if text in ("FAIL", "ERROR") or text.endswith(" FAIL") or text.endswith(" ERROR"):
            return "fail"
        return None
    for line in out.splitlines():
        m = RESULT.match(line)
        if m:
            current = m.group(1)
            v = verdict(m.group(2))
        else:
            v = verdict(line) if current else None
        if current and v:
            results[current] = v
            current = None
    errors = {}
    for m in re.finditer(r"^(?:FAIL|ERROR): (test_\w+) .*?\n-{20,}\n(.*?)(?=\n={20,}|\n-{20,}\nRan )", out, re.M | re.S):
        lines = [l.strip() for l in m.group(2).strip().splitlines() if l.strip()]
        # The exception's own line (torch's runner adds advice after it), else the last.
        said = [l for l in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", l) or "Expected" in l]
        errors[m.group(1)] = (said[-1] if said else lines[-1] if lines else "")[:200]
    return results, errors, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("-k", default="", help="only the tests whose name matches (unittest -k)")
    ap.add_argument("--timeout", type=int, default=5400)
    ap.add_argument("--json", default="", help="also write both runs' verdicts here")
    a = ap.parse_args()
    gloo, _, t_gloo = run(a.world, False, a.k, a.timeout)
    ours, errors, t_ours = run(a.world, True, a.k, a.timeout)

    def counts(r):
        return {v: sum(1 for x in r.values() if x == v) for v in ("pass", "fail", "skip")}
    print(f"torch's distributed_test.py, world size {a.world}, BACKEND=gloo; {len(gloo)} tests\n")
    print("| run | pass | fail | skip | minutes |")
    print("|---|---:|---:|---:|---:|")
    for name, r, t in (("gloo", gloo, t_gloo), ("every gloo group on fastgather", ours, t_ours)):
        c = counts(r)
        print(f"| {name} | {c['pass']} | {c['fail']} | {c['skip']} | {t / 60:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world": a.world, "gloo": gloo, "fastgather": ours, "errors": errors}, f, indent=1)
    lost = sorted(t for t, v in gloo.items() if v == "pass" and ours.get(t) != "pass")
    print(f"\nPass on gloo, not on fastgather ({len(lost)}):\n")
    for t in lost:
        print(f"- {t}: {ours.get(t, 'not run')}: {errors.get(t, '')}")


if __name__ == "__main__":
    main()
