import json, statistics, sys
def load(p):
    d=json.load(open(p)); return {(r['M'],r['N'],r['K'],r['r'],r['impl'].split(' ')[0]):r for r in d['rows']}
old=load('../unseen/lora.json')
aft=load('after/lora.json'); heu=load('heuristic/lora.json')
keys=sorted({k[:4] for k in old}, key=lambda k:(k[1],k[2],k[3],k[0]))
ro,ra,rh=[],[],[]
worse_unf=0
for k in keys:
    o=old[k+('auto',)]['ratio_cublas']; a=aft[k+('auto',)]['ratio_cublas']; h=heu[k+('auto',)]['ratio_cublas']
    u=aft[k+('torch_unfused',)]['ratio_cublas']
    ap=aft[k+('auto',)].get('ratio_paired'); 
    ro.append(o); ra.append(a); rh.append(h)
    if a>u: worse_unf+=1
    print(f"K={k[2]:5} N={k[1]:5} r={k[3]:2} M={k[0]:4}  before={o:.3f}  after={a:.3f} (paired {ap})  heuristic-only={h:.3f}  unfused={u:.2f} {'SLOWER-THAN-UNFUSED' if a>u else ''}")
print('median before/after/heur', statistics.median(ro), statistics.median(ra), statistics.median(rh))
print('max', max(ro), max(ra), max(rh), 'after>unfused', worse_unf, 'of', len(keys))
print('heuristic > after*1.15:', sum(1 for h,a in zip(rh,ra) if h>a*1.15))
