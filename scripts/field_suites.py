#!/usr/bin/python3
"""Helpers of scripts/field-suites.sh (podman's and runc's own bats suites, run through
gpuhook-runtime). Subcommands:

  prepare SRC DST SUITE DOC   copy a suite's bats files, marking the tests DOC lists as
                              skipped ("needs a registry" ...) with `skip`
  compare DOC TAPDIR          compare the runs' TAP results test for test; the only
                              differences allowed are the ones DOC lists, each exactly
"""
import os
import re
import shutil
import sys

RUNS = ("runc", "gpuhook", "gpu")


def table(doc, heading):
    """Rows (lists of cells) of the first markdown table under `## heading` in doc."""
    rows, inside, seen = [], False, False
    with open(doc, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                inside = line[3:].strip() == heading
                continue
            if not inside:
                continue
            s = line.strip()
            if s.startswith("|"):
                cells = [c.strip() for c in s.strip("|").split("|")]
                seen = True
                if set(cells[0]) <= set("-: ") or cells[0] == "suite":
                    continue
                rows.append([c.strip("`") for c in cells])
            elif seen:
                break
    if not seen:
        sys.exit(f"field-suites: {doc} has no table under '## {heading}'")
    return rows


def prepare(src, dst, suite, doc):
    skips = {}
    for r in table(doc, "Skipped"):
        if r[0] == suite:
            skips.setdefault(r[1], {})[r[2]] = r[3]
    found = set()
    for name in sorted(os.listdir(dst)):
        if not name.endswith(".bats") or name not in skips:
            continue
        path = os.path.join(dst, name)
        out = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                out.append(line)
                m = re.match(r'@test "(.*)" \{\s*$', line)
                if m and m.group(1) in skips[name]:
                    reason = skips[name][m.group(1)].replace('"', "'")
                    out.append(f'    skip "field-suites: {reason}"\n')
                    found.add((name, m.group(1)))
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(out)
    missing = [(f, t) for f in skips for t in skips[f] if (f, t) not in found]
    if missing:
        sys.exit(f"field-suites: listed as skipped but not found in {src}: {missing}")


def parse_tap(path):
    """{test name: 'ok' | 'fail' | 'skip'} of one bats file's TAP output."""
    res, plan = {}, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^1\.\.(\d+)$", line)
            if m:
                plan = int(m.group(1))
                continue
            m = re.match(r"^(ok|not ok) (\d+) (.*?)( # skip.*)?$", line)
            if not m:
                continue
            status = "fail" if m.group(1) == "not ok" else ("skip" if m.group(4) else "ok")
            name = m.group(3)
            if name in res:
                name = f"{name} [{m.group(2)}]"
            res[name] = status
    if plan is None or plan != len(res):
        res["<the file's TAP plan>"] = f"incomplete ({len(res)} of {plan} results)"
    return res


def compare(doc, tapdir):
    allowed = {}
    for r in table(doc, "Differences by design"):
        suite, file, test, run, base, got = r[:6]
        if run not in RUNS[1:]:
            sys.exit(f"field-suites: {doc}: unknown run {run!r} in {r}")
        allowed[(suite, file, test, run)] = (base, got)
    results = {}  # run -> {(suite, file, test): status}
    for run in RUNS:
        d = os.path.join(tapdir, run)
        if not os.path.isdir(d):
            sys.exit(f"field-suites: no results of run {run} in {tapdir}")
        results[run] = {}
        for name in sorted(os.listdir(d)):
            if not name.endswith(".tap"):
                continue
            suite, file = name[:-4].split("--", 1)
            for test, st in parse_tap(os.path.join(d, name)).items():
                results[run][(suite, file, test)] = st
    base = results["runc"]
    bad, used = [], set()
    for run in RUNS:
        counts = {}
        for (suite, _, _), st in results[run].items():
            c = counts.setdefault(suite, {"ok": 0, "fail": 0, "skip": 0, "other": 0})
            c[st if st in c else "other"] += 1
        for suite, c in sorted(counts.items()):
            print(f"{run:8} {suite:7} ok {c['ok']:3}  fail {c['fail']:3}  skip {c['skip']:3}"
                  + (f"  broken {c['other']}" if c["other"] else ""))
    for run in RUNS[1:]:
        keys = sorted(set(base) | set(results[run]))
        for k in keys:
            b, g = base.get(k, "absent"), results[run].get(k, "absent")
            key = k + (run,)
            if key in allowed:
                used.add(key)
                if (b, g) != allowed[key]:
                    bad.append(f"{run}: {k[0]} {k[1]} '{k[2]}': runc {b}, {run} {g}; "
                               f"{doc} expects runc {allowed[key][0]}, {run} {allowed[key][1]}")
                else:
                    print(f"by design ({run}): {k[0]} {k[1]} '{k[2]}': runc {b}, {run} {g}")
            elif b != g:
                bad.append(f"{run}: {k[0]} {k[1]} '{k[2]}': runc {b}, {run} {g}")
    for key in sorted(set(allowed) - used):
        bad.append(f"{doc} lists a difference for a test that did not run: {key}")
    for k, st in base.items():
        if st not in ("ok", "fail", "skip"):
            bad.append(f"runc: {k}: {st}")
    if bad:
        print("field-suites: DIFFERENCES not listed in " + doc + ":", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        sys.exit(1)
    print("field-suites: results identical test for test, but for the listed differences")


def main():
    a = sys.argv[1:]
    if a[:1] == ["prepare"] and len(a) == 5:
        src, dst, suite, doc = a[1:]
        if not os.path.isdir(dst):
            shutil.copytree(src, dst)
        prepare(src, dst, suite, doc)
    elif a[:1] == ["compare"] and len(a) == 3:
        compare(a[1], a[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
