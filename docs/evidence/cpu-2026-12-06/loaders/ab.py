import torch, sglang.srt.server_args, sys, time, gc, importlib
mod = sys.argv[1]
t0=time.perf_counter()
m = importlib.import_module(mod)
m.register()
t1=time.perf_counter()
print("MS %.3f" % ((t1-t0)*1e3))
