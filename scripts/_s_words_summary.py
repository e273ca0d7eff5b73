"""One line per row of a ``probe_s_words.py`` JSON (M, K, r, impl, graph µs, paired ratio, bit-identical, why skipped).

    python3 scripts/_s_words_summary.py DIR/s_words.json
"""
import json
import sys

for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["K"], r["r"], r["impl"], r.get("graph_us"), r.get("ratio_paired"), r.get("bit_identical"),
          r.get("skipped", r.get("error", "")))
