"""The stream family's K-split fit (bench/NOTES.md, session 10): the H200's per-stage A/B
(`bench/dev_call10.sh splitk`) as data, the old rule, and the cost model that
`heuristics::stream_split_k` implements, with the grid it was chosen from.
    python3 bench/splitk_fit.py
"""
import math

cases = {  # E, k, H, I, pack values
 "qwen3_bf16": (128, 8, 2048, 768, 8), "dsv3_fp8blk": (256, 8, 7168, 2048, 16),
 "gptoss_mxfp4": (128, 4, 2880, 2880, 32), "qwen3_fp8blk": (128, 8, 2048, 768, 16),
 "gptoss_bf16": (128, 4, 2880, 2880, 8)}
# measured ratio per kw (8,4,2,1) for stage 1 and stage 2
R = {
("qwen3_bf16",1):([1.002,.957,1.173,1.761],[1.001,.972,1.048,1.264]),
("qwen3_bf16",8):([1.000,.996,1.047,1.191],[1.022,1.000,.997,1.002]),
("qwen3_bf16",64):([.999,.987,.977,.974],[1.027,.998,.986,.978]),
("qwen3_bf16",256):([1.001,.952,.939,.977],[1.056,.998,.972,.965]),
("dsv3_fp8blk",1):([1.001,.982,.976,1.207],[1.000,.985,.973,.966]),
("dsv3_fp8blk",8):([1.0,.988,.992,1.015],[.999,.959,.949,.953]),
("dsv3_fp8blk",64):([1.0,.980,.975,.978],[1.0,.952,.937,.932]),
("dsv3_fp8blk",256):([1.0,.969,.959,.935],[1.0,.951,.936,.922]),
("gptoss_mxfp4",1):([.997,1.004,1.048,1.197],[.996,1.028,1.300,1.521]),
("gptoss_mxfp4",8):([1.067,1.000,.981,.998],[1.012,.996,1.008,1.093]),
("gptoss_mxfp4",64):([1.080,.998,.943,.931],[1.025,.997,.990,1.035]),
("gptoss_mxfp4",256):([1.082,1.000,.948,.980],[1.028,1.000,1.003,1.028]),
("qwen3_fp8blk",1):([1.0,.955,1.076,1.377],[1.0,.946,1.0,1.089]),
("qwen3_fp8blk",8):([1.002,.962,.990,1.086],[1.104,1.027,1.001,1.005]),
("qwen3_fp8blk",64):([.998,.945,.927,.907],[1.129,1.026,.999,.979]),
("gptoss_bf16",1):([1.0,1.082,1.041,1.370],[.999,.971,1.167,1.662]),
("gptoss_bf16",8):([.999,.989,.998,1.043],[.999,.999,1.019,1.102]),
("gptoss_bf16",64):([.999,.983,.986,.997],[.999,.994,.998,1.027]),
("gptoss_bf16",256):([1.0,.977,.972,.994],[1.0,.986,.995,1.000]),
}
KWS = [8, 4, 2, 1]
SLOTS = 264  # resident blocks: 132 SMs x 2


def old_rule(steps, rg):
    kw = 8
    while kw > 1 and steps // kw < 4 and -(-rg // (8 // (kw // 2))) >= 792:
        kw //= 2
    return kw


def expected_tiles(M, k, E, bm=16):
    """E * E[ceil(n / bm)], n ~ Binomial(M, k / E)."""
    p, tot, pm = k / E, 0.0, (1 - k / E) ** M
    for j in range(1, M + 1):
        pm *= (M - j + 1) / j * p / (1 - p)
        tot += pm * math.ceil(j / bm)
    return E * tot


def pick(steps, rg, cap, step_cost, r, slots=SLOTS, fill=False):
    """fill: only splits whose blocks fill every resident slot (MXFP4's issue-bound warps)."""
    best = None
    for kw in KWS:
        walk, blocks = steps / kw, rg * kw / 8
        if kw < 8 and (walk > cap or (fill and blocks < slots)):
            continue
        t = max(1, math.ceil(blocks / slots)) * (walk * step_cost + r)
        if best is None or t < best[0] - 1e-9:
            best = (t, kw)
    return best[1]


CAPS = {"bf16": 32, "fp8": 64, "mxfp4": 12}
def fmt(c):
    return "mxfp4" if "mxfp4" in c else "fp8" if "fp8" in c else "bf16"

points = []
for (c, M), (r1, r2) in R.items():
    E, k, H, I, v = cases[c]
    t = expected_tiles(M, k, E)
    steps = [math.ceil(H / (4 * v)), math.ceil(I / (4 * v))]
    rg = [t * math.ceil(I / 16), t * math.ceil(H / 32)]
    old_rg = [min(M * k, E) * math.ceil(I / 16), min(M * k, E) * math.ceil(H / 32)]
    for s, ratios in enumerate([r1, r2]):
        points.append((c, M, s + 1, steps[s], rg[s], old_rule(steps[s], old_rg[s]), ratios))

def regret(kw, ratios):
    return ratios[KWS.index(kw)] - min(ratios)

print("grid: r, MXFP4 step cost, waves per -> summed regret (old rule: %.3f, best at %d of %d)" % (
    sum(regret(p[5], p[6]) for p in points), sum(regret(p[5], p[6]) == 0 for p in points), len(points)))
for r in [2, 3, 4, 6, 8]:
    for c4 in [1, 2, 3, 4]:
        for slots in [132, 264]:
            tot = sum(regret(pick(st, rg, CAPS[fmt(c)], c4 if fmt(c) == "mxfp4" else 1, r, slots), rr)
                      for c, M, s, st, rg, old, rr in points)
            print(f"  r={r} c={c4} slots={slots}: {tot:.3f}")
print("chosen: r=4, MXFP4 step cost 3 and every slot filled, 264 slots, caps", CAPS)
tot = 0.0
for c, M, s, st, rg, old, rr in points:
    kw = pick(st, rg, CAPS[fmt(c)], 3 if fmt(c) == "mxfp4" else 1, 4, fill=fmt(c) == "mxfp4")
    tot += regret(kw, rr)
    best = KWS[min(range(4), key=lambda i: rr[i])]
    print(f"{c:13s} M={M:3d} S{s}: old {old} -> {kw} (best {best}) "
          f"{rr[KWS.index(old)]:.3f} -> {rr[KWS.index(kw)]:.3f} (best {min(rr):.3f})")
print(f"summed regret of the chosen rule: {tot:.3f}")
