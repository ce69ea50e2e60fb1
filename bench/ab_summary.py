"""Summary of bench/ab.sh: DIR then the variants in order; reads DIR/ab_<variant>_<round>.json.
Rows whose check failed are left out, unless AB_ANY_RESULT=1 (timing ablations, whose results
are wrong by construction)."""
import json
import os
import statistics
import sys
from pathlib import Path

out, variants = Path(sys.argv[1]), sys.argv[2:]
any_result = os.environ.get("AB_ANY_RESULT") == "1"
times = {}  # (case, M) -> variant -> [graph_us per round]
for f in sorted(out.glob("ab_*_*.json")):
    v = int(f.stem.split("_")[1])
    for row in json.loads(f.read_text())["rows"]:
        if row.get("peer") == "moeplug" and row.get("graph_us") and (row.get("ok") or any_result):
            times.setdefault((row["case"], row["M"]), {}).setdefault(v, []).append(row["graph_us"])
print("case M " + " | ".join(f"[{i}] median spread ratio" for i in range(len(variants))))
for i, v in enumerate(variants):
    print(f"  [{i}] {v}")
for (case, m), per in times.items():
    base = statistics.median(per[0]) if 0 in per else None
    cells = []
    for i in range(len(variants)):
        t = per.get(i)
        if not t:
            cells.append("-")
            continue
        med = statistics.median(t)
        ratio = f"{med / base:.3f}" if base else "-"
        cells.append(f"{med:8.1f} {max(t) / min(t) - 1:5.1%} {ratio}")
    print(f"{case} {m} " + " | ".join(cells))
