import statistics as s, collections, sys, random
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    a,b=l.split(); d[a].append(float(b))
for k,v in sorted(d.items()):
    meds=sorted(s.median(random.choices(v,k=len(v))) for _ in range(2000))
    print(k, "n %d median %.2f [%.2f, %.2f] min %.2f mean %.2f"%(len(v), s.median(v), meds[50], meds[1950], min(v), s.mean(v)))
