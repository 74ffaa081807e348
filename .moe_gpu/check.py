"""Ad-hoc GPU check for the fused-MoE problem (not part of the test suite)."""
import sys, time, json, os
import torch, triton
sys.path.insert(0, "python")
from tunelab.problems.moe import FusedMoE, vllm_default_config, _full_config
from tunelab.kernels import fused_moe as fm

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
props = torch.cuda.get_device_properties(0)
L2 = getattr(props, "L2_cache_size", 50 << 20)
flush_buf = torch.empty(max(2 * L2, 32 << 20), dtype=torch.uint8, device=dev)
PEAK_BW = 3.35e12 if "H100" in torch.cuda.get_device_name() else 4.8e12

def check(p, out, ref):
    o, r = out.float(), ref.float()
    err = (o - r).abs()
    bad = err > (1e-2 + 1e-2 * r.abs())
    return dict(max_abs=err.max().item(), mismatch=bad.float().mean().item(), nan=int(torch.isnan(o).sum()))

def time_cold(fn, n=30):
    ts = []
    for _ in range(3): fn()
    for _ in range(n):
        flush_buf.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    v = sorted(s.elapsed_time(e) * 1000 for s, e in ts)
    return v[len(v) // 2]

def time_graph(launch, n=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): launch()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    return time_cold(g.replay, n)

results = []
mode = sys.argv[1] if len(sys.argv) > 1 else "all"

if mode in ("all", "correct"):
    cases = [
        dict(M=1, E=128, N=2880, activation="silu"),
        dict(M=1, E=128, N=2880, activation="swiglu_oai"),
        dict(M=7, E=32, N=360, activation="swiglu_oai"),
        dict(M=33, E=32, N=720, activation="silu", routing="uniform"),
        dict(M=256, E=128, N=720, activation="silu"),
        dict(M=1024, E=32, N=1440, activation="swiglu_oai"),
        dict(M=4096, E=128, N=2880, activation="silu"),
        dict(M=4096, E=32, N=360, activation="swiglu_oai", dtype="fp16"),
    ]
    for c in cases:
        shape = dict(topk=4, K=2880, dtype="bf16"); shape.update(c)
        p = FusedMoE(shape)
        inp = p.inputs(0, dev)
        ref = p.reference(inp)
        m = p.methods()["fused_moe"]
        cfg = _full_config(p, {})
        t0 = time.time(); m.compile(p, cfg); tc = time.time() - t0
        caches = [len(k.device_caches[0][0]) for k in (fm.moe_align_kernel, fm.moe_gemm1_kernel, fm.moe_gemm2_kernel)]
        L = m.bind(p, inp, cfg)
        L.out.fill_(float("nan")); L.inter.fill_(float("nan")); L.out2.fill_(float("nan"))
        L(); torch.cuda.synchronize()
        caches2 = [len(k.device_caches[0][0]) for k in (fm.moe_align_kernel, fm.moe_gemm1_kernel, fm.moe_gemm2_kernel)]
        r = check(p, L.out, ref)
        T = p.methods()["torch"].bind(p, inp, {}); T(); rt = check(p, T.out, ref)
        print(json.dumps(dict(shape=c, cfg=cfg, fused=r, torch=rt, compile_s=round(tc, 2),
                              recompiled=caches2 != caches)), flush=True)
        del inp, L, T, ref
        torch.cuda.empty_cache()

if mode in ("all", "perf"):
    def perf(shape, cfgs, with_torch=False):
        p = FusedMoE(shape)
        inp = p.inputs(0, dev)
        bound = p.bound_us(PEAK_BW)
        for cfg in cfgs:
            cfg = _full_config(p, cfg)
            try:
                L = p.methods()["fused_moe"].bind(p, inp, cfg); L()
            except Exception as ex:
                print("FAIL", cfg, type(ex).__name__, str(ex)[:200]); continue
            ev = time_cold(L); gr = time_graph(L)
            # per-kernel breakdown (events, cold)
            parts = []
            for run in L._runners:
                parts.append(round(time_graph(run, 15), 1))
            tf = p.flops() / (gr * 1e-6) / 1e12
            print(json.dumps(dict(M=p.M, E=p.E, N=p.N, act=p.activation, cfg=[cfg[k] for k in fm.MoEPlan.__annotations__ and
                  ("BLOCK_SIZE_M","BLOCK_SIZE_N","BLOCK_SIZE_K","GROUP_SIZE_M","num_warps","num_stages")],
                  events_us=round(ev, 1), graph_us=round(gr, 1), bound_us=round(bound, 1),
                  pct_bound=round(100 * bound / gr, 1), tflops=round(tf, 1), parts_us=parts)), flush=True)
        if with_torch:
            T = p.methods()["torch"].bind(p, inp, {})
            print(json.dumps(dict(M=p.M, torch_events_us=round(time_cold(T, 10), 1))), flush=True)
        del inp; torch.cuda.empty_cache()

    base = dict(E=128, topk=4, K=2880, N=2880, dtype="bf16")
    perf(dict(base, M=1), [{}, dict(BLOCK_SIZE_N=32), dict(BLOCK_SIZE_N=128), dict(BLOCK_SIZE_K=256),
                           dict(BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, num_stages=3),
                           dict(BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_stages=5)], with_torch=True)
    perf(dict(base, M=1, activation="swiglu_oai"), [{}])
    perf(dict(base, M=16), [{}])
    perf(dict(base, M=256), [{}, dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, num_stages=4)])
    perf(dict(base, M=4096), [{}, dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_warps=8, num_stages=3)])

if mode == "perf2":
    def host_us(L, n=40):
        L(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): L()
        h = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        return round(h, 1)
    base = dict(E=128, topk=4, K=2880, N=2880, dtype="bf16")
    for M in (1, 16):
        p = FusedMoE(dict(base, M=M)); inp = p.inputs(0, dev); cfg = _full_config(p, {})
        plan = fm.make_plan(p, cfg)
        for direct in (False, True):
            L = fm.FusedMoELaunch(plan, inp, direct=direct)
            L.out.fill_(float("nan")); L(); ref = p.reference(inp)
            print(json.dumps(dict(M=M, direct=L.direct, ok=check(p, L.out, ref), host_us=host_us(L),
                                  events_us=round(time_cold(L, 40), 1), graph_us=round(time_graph(L, 40), 1))), flush=True)
        del inp
    # alignment alone, by warps
    for M, E, bm in ((1, 128, 16), (256, 128, 64), (4096, 128, 128), (4096, 32, 64)):
        ids = torch.stack([torch.randperm(E, device=dev)[:4] for _ in range(M)]).to(torch.int32)
        numel = ids.numel(); mb, mp = fm.align_sizes(numel, E, bm); meta = fm._align_meta(numel, E, mp)
        so = torch.empty(mp, dtype=torch.int32, device=dev); eo = torch.empty(mb, dtype=torch.int32, device=dev)
        npo = torch.empty(1, dtype=torch.int32, device=dev); cur = torch.empty(meta["E_PAD"], dtype=torch.int32, device=dev)
        row = dict(M=M, E=E, bm=bm)
        for w in (4, 8, 16):
            for chunk in (meta["CHUNK"], min(4096, meta["CHUNK"] * 4)):
                m2 = dict(meta, CHUNK=chunk)
                f = lambda: fm.moe_align_kernel[(1,)](ids, so, eo, npo, cur, numel, E, mp, mb, BLOCK_SIZE_M=bm, **m2, num_warps=w)
                f(); torch.cuda.synchronize()
                row[f"w{w}c{chunk}"] = round(time_graph(f, 20), 1)
        print(json.dumps(row), flush=True)
    for M in (1, 256, 4096):
        o2 = torch.randn(M * 4, 2880, device=dev, dtype=torch.bfloat16); out = torch.empty(M, 2880, device=dev, dtype=torch.bfloat16)
        ft = lambda: torch.sum(o2.view(M, 4, 2880), dim=1, out=out)
        fk = lambda: fm.moe_sum_kernel[(M, triton.cdiv(2880, 1024))](o2, out, 2880, TOPK=4, BLOCK=1024, num_warps=4)
        fk2 = lambda: fm.moe_sum_kernel[(M, triton.cdiv(2880, 512))](o2, out, 2880, TOPK=4, BLOCK=512, num_warps=4)
        ft(); fk(); fk2()
        print(json.dumps(dict(M=M, torch_sum=round(time_graph(ft, 20), 1), triton_sum1024=round(time_graph(fk, 20), 1),
                              triton_sum512=round(time_graph(fk2, 20), 1))), flush=True)
