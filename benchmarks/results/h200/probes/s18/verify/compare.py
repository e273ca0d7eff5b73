"""Session 18's heuristic-only `bench lora` (this directory) against session 17's runs of the same rules' cells
(s17/verify/heuristic: Llama-3-8B, table hidden; s17/heldout: no tuned entries then), and the multi-LoRA run
against s18/down (the heuristic before its appended-expand rule). Run from this directory."""
import json
import statistics


def lora(p):
    return {(r['M'], r['N'], r['K'], r['r'], r['impl'].split(' ')[0]): r for r in json.load(open(p))['rows']}


new = lora('heuristic/lora.json')
old = {**lora('../../s17/verify/heuristic/lora.json'), **lora('../../s17/heldout/lora.json')}
keys = sorted({k[:4] for k in new}, key=lambda k: (k[2], k[1], k[3], k[0]))
rn, ro, slow_new = [], [], 0
for k in keys:
    a = new[k + ('auto',)]['ratio_cublas']
    u = new[k + ('torch_unfused',)]['ratio_cublas']
    o = old[k + ('auto',)]['ratio_cublas']
    rn.append(a)
    ro.append(o)
    slow_new += a > u
    print(f"K={k[2]:5} N={k[1]:5} M={k[0]:4} r={k[3]:2}  s17={o:.3f}  s18={a:.3f} "
          f"(paired {new[k + ('auto',)].get('ratio_paired')}, {new[k + ('auto',)]['plan']})  "
          f"unfused={u:.2f}{'  SLOWER-THAN-UNFUSED' if a > u else ''}")
print(f"{len(keys)} cells: median s17 {statistics.median(ro):.3f} → s18 {statistics.median(rn):.3f}; "
      f"worst {max(ro):.2f} → {max(rn):.2f}; slower than unfused (s18) {slow_new}")


def ml(p):
    out = {}
    for r in json.load(open(p))['rows']:
        out[(r['K'], r['N'], r['r'], r['M'], r['adapters'], r['impl'])] = r.get('graph_us') or r.get('median_us')
    return out


n, o = ml('ml_unseen/multilora.json'), ml('../down/multilora.json')
cases = sorted({k[:5] for k in n})
x = lambda d, c, i: d[c + (i,)] / d[c + ('cublas_base',)]  # noqa: E731
print(f"multi-LoRA, {len(cases)} cells: fused median × cuBLAS {statistics.median(x(o, c, 'fused') for c in cases):.2f}"
      f" → {statistics.median(x(n, c, 'fused') for c in cases):.2f}; worst "
      f"{max(x(o, c, 'fused') for c in cases):.2f} → {max(x(n, c, 'fused') for c in cases):.2f}; faster than "
      f"shrink + expand {sum(o[c + ('fused',)] < o[c + ('shrink_expand',)] for c in cases)} → "
      f"{sum(n[c + ('fused',)] < n[c + ('shrink_expand',)] for c in cases)}")
for c in cases:
    if n[c + ('fused',)] >= n[c + ('shrink_expand',)]:
        print(f"  still behind shrink + expand: K,N,r,M,a={c}: fused {x(n, c, 'fused'):.2f}× vs "
              f"{x(n, c, 'shrink_expand'):.2f}×")
