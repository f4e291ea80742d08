import os, sys, time, importlib
t0 = time.perf_counter()
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
which = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "stock"
import contextlib
if mode == "use":
    import precompile_executor.triton.autotune as pa
    scope = pa.use()
else:
    scope = contextlib.nullcontext()
if which == "fla":
    import fla
    from fla.layers import GatedDeltaNet
    print("fla", getattr(fla, "__version__", "?"), flush=True)
    torch.manual_seed(0)
    layer = GatedDeltaNet(hidden_size=1024, num_heads=8, mode="chunk").cuda().to(torch.bfloat16)
    x = torch.randn(2, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t1 = time.perf_counter()
    scope.__enter__()
    y = layer(x)[0]
    torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"fwd {t2-t1:.1f}s", flush=True)
    y.float().pow(2).mean().backward()
    torch.cuda.synchronize(); t3 = time.perf_counter()
    print(f"bwd {t3-t2:.1f}s", flush=True)
elif which == "gems":
    import flag_gems
    print("flag_gems", getattr(flag_gems, "__version__", "?"), flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024), torch.nn.LayerNorm(1024)).cuda()
    x = torch.randn(4096, 1024, device="cuda")
    t1 = time.perf_counter()
    scope.__enter__()
    with flag_gems.use_gems():
        y = model(x)
        loss = torch.nn.functional.cross_entropy(y, torch.zeros(4096, dtype=torch.long, device="cuda"))
        torch.cuda.synchronize(); t2 = time.perf_counter()
        print(f"fwd {t2-t1:.1f}s", flush=True)
        loss.backward()
        torch.cuda.synchronize(); t3 = time.perf_counter()
    print(f"bwd {t3-t2:.1f}s", flush=True)
scope.__exit__(None, None, None)
print(f"whole {time.perf_counter()-t0:.1f}s", flush=True)
