"""The kernels compiled for a GPU without one: shared memory, registers and spills per tile configuration.

    python -m dietpe.attention.kernels.resources            every configuration of every list, Hopper (sm_90)
    python -m dietpe.attention.kernels.resources --check    the first of each list, every term on; exit 1 if
                                                            one fails to compile or exceeds shared memory
    python -m dietpe.attention.kernels.resources --reads    the offset table read per score against by window,
                                                            per method as the models use the kernels

Triton compiles a kernel to a cubin with the ptxas it ships, for any target, with no GPU and no driver; the
cubin's resource usage (`cuobjdump --dump-resource-usage`) says what a GPU would allocate, and its code
(`nvdisasm`) how many instructions and global loads a kernel holds. This is how the
tile lists of `dietpe.attention.kernels.attention` were chosen, and a compile error only a GPU build shows (a
kernel reading a non-constexpr global: the interpreter allows it) fails here too. Needs Triton's interpreter
off (TRITON_INTERPRET unset), which this module checks.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

#: Hopper's shared memory per block (227 KiB)
SHARED_LIMIT = {90: 232448}
#: every term on: the offset table with its reset, two segments, padding, dropout (the table read as
#: DIETPE_FUSED_TABLE says: `cases` sets HAS_TAB)
EVERY_TERM = dict(HAS_TAB=2, HAS_KEEP=True, NSEG=2, MASK_KIND=1, CAUSAL=False, DROPOUT=True, PIECES=0, LOGKP=0)
#: a piecewise table (FIRE's 32 kinks) in the offset table's place, with the other terms and a dense 4-D mask
#: (packed documents: tiles it wholly blocks are skipped one by one)
PIECEWISE = dict(EVERY_TERM, HAS_KEEP=False, PIECES=32, LOGKP=5, MASK_KIND=2)
FLOATS = ("qk_scale", "scale", "p_drop", "inv_keep", "sign")
ELEMENT_POINTERS = ("Q", "K", "V", "O", "DO", "DK", "DV", "DQ_", "QO", "KO", "Q2", "K2", "DQ2_", "DK2")
INT_POINTERS = ("QSEG", "KSEG")
LONG_POINTERS = ("SEED",)  # attention dropout's seed, one int64
FLOAT_POINTERS = ("LSE", "DELTA", "TAB", "KEEPQ", "KEEPK", "SEGT", "PART", "SPART", "MASK", "OUT", "CQ", "SQ", "CK",
                  "SK", "DEN", "PW", "DPART", "PWPART")


def _signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ELEMENT_POINTERS:
            sig[name] = f"*{dtype}"
        elif name in INT_POINTERS:
            sig[name] = "*i32"
        elif name in LONG_POINTERS:
            sig[name] = "*i64"
        elif name in FLOAT_POINTERS:
            sig[name] = "*fp32"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


def compile_for(fn, dtype: str, constexprs: dict, warps: int, stages: int, arch: int = 90,
                count: bool = False) -> dict:
    """{shared, registers, spill bytes} of `fn` compiled for sm_`arch` (dtype: "bf16", "fp32", ...); with
    `count`, its instructions and global loads too."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = _signature(fn, dtype, constexprs)
    try:
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    except TypeError:  # Triton before 3.3 names them `constants`
        source = ASTSource(fn=fn, signature=signature, constants=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": warps, "num_stages": stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    number = lambda key: int(m.group(1)) if (m := re.search(key + r":(\d+)", usage)) else None  # noqa: E731
    result = {"shared": kernel.metadata.shared, "registers": number("REG"), "spills": number("STACK")}
    if count:
        result.update(_instructions(kernel.asm["cubin"]))
    return result


def _instructions(cubin: bytes) -> dict:
    """{instructions, global loads (LDG and LDGSTS, the asynchronous copies to shared memory)} in the code."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        code = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = [m.group(1) for line in code.splitlines()
           if (m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line))]
    return {"instructions": len(ops), "global loads": sum(op in ("LDG", "LDGSTS") for op in ops)}


def cases(first_only: bool):
    """(label, kernel, dtype, constexprs, warps, stages) for the attention kernels' tile lists: every length
    masked (the most code) and, in the full listing, the interior tiles of lengths that are multiples of them."""
    from dietpe.attention.kernels import attention as A

    widths = [(64, 0, 64), (128, 0, 128), (128, 16, 64)]
    evens = [False] if first_only else [False, True]
    grid = [(t, w, e, terms) for t in ("bf16", "fp32") for w in widths for e in evens
            for terms in ("every term", "piecewise")]
    for dtype, (d1, d2, dvp), even, terms in grid:
        if (first_only or even or terms == "piecewise") and (dtype, d1, d2) != ("bf16", 64, 0):
            continue
        size = 2 if dtype == "bf16" else 4
        flags = dict(EVERY_TERM if terms == "every term" else PIECEWISE, HAS_TAB=A.TABLE_READS[A.current_table_read()],
                     PREC="ieee" if dtype == "fp32" else "tf32",
                     D1=d1, D2=d2, DVP=dvp, EVEN_M=even, EVEN_N=even, EVEN_D=even and d2 == 0)
        tiles = lambda c: dict(BM=c[0], BN=c[1])  # noqa: E731
        lists = [(A._forward_kernel, A.FORWARD_CONFIGS, {}),
                 (A._backward_kv_kernel, A.BACKWARD_KV_CONFIGS, {}),
                 (A._backward_q_kernel, A.BACKWARD_Q_CONFIGS, dict(NSEG2P=4, TAB_GRAD=True, SEG_GRAD=True))]
        if terms == "every term":  # the offset table's gradient by block diagonals (not FIRE's: the dQ kernel's)
            lists += [(A._backward_q_kernel, A.BACKWARD_Q_CONFIGS, dict(NSEG2P=4, TAB_GRAD=False, SEG_GRAD=True)),
                      (A._band_kernel, A.BAND_CONFIGS, dict(BAND=True))]
        for kernel, configs, extra in lists:
            chosen = A._configs(configs, _torch_dtype(size), max(d1, dvp))
            if extra.get("TAB_GRAD"):
                chosen = [c for c in chosen if c[0] == c[1]]
            for config in chosen[:1 if first_only else None]:
                label = f"{kernel.__name__} {dtype} {d1}+{d2}/{dvp}{' even' if even else ''} {config} {terms}"
                constexprs = {**flags, **extra, **tiles(config)}
                if constexprs.pop("BAND", False):  # one square tile, none of the piecewise term's flags
                    constexprs = {k: v for k, v in constexprs.items() if k not in ("BM", "BN", "PIECES", "LOGKP")}
                    constexprs["BLK"] = config[0]
                yield label, kernel, dtype, constexprs, *config[2:]


#: the table terms as the models use them (bf16, head size 64, lengths a multiple of the tiles, the presets'
#: attention dropout): each compiled with its table read per score and by window
READ_CASES = {
    "diet-rel": {}, "diet-rel + segments": dict(NSEG=2), "tupe-r (reset)": dict(HAS_KEEP=True),
    "diet-rel, padding": dict(MASK_KIND=1), "fire": dict(PIECES=32, LOGKP=5),
    "diet-rel, no dropout": dict(DROPOUT=False), "fire, no dropout": dict(PIECES=32, LOGKP=5, DROPOUT=False)}


def read_rows():
    """Markdown rows: per method and kernel (the first tile of the forward's and dK/dV's lists, the dQ kernel's
    square tiles), shared memory, registers, spills, instructions and global loads, per score → by window."""
    from dietpe.attention.kernels import attention as A

    base = dict(EVERY_TERM, HAS_KEEP=False, NSEG=0, MASK_KIND=0, PREC="tf32", D1=64, D2=0, DVP=64, EVEN_M=True,
                EVEN_N=True, EVEN_D=True)
    q_extra = dict(NSEG2P=4, TAB_GRAD=True)
    kernels = [("forward", A._forward_kernel, A.FORWARD_CONFIGS[2][64][:1], {}),
               ("dK/dV", A._backward_kv_kernel, A.BACKWARD_KV_CONFIGS[2][64][:1], {}),
               ("dQ", A._backward_q_kernel, [c for c in A.BACKWARD_Q_CONFIGS[2][64] if c[0] == c[1]], q_extra)]
    yield "| method | kernel, tile | shared KiB | registers | spilled B | instructions | global loads |"
    yield "|---|---|--:|--:|--:|--:|--:|"
    for method, terms in READ_CASES.items():
        for name, kernel, configs, extra in kernels:
            for bm, bn, warps, stages in configs:
                flags = dict(base, **terms, **extra, BM=bm, BN=bn)
                if extra:
                    flags["SEG_GRAD"] = flags["NSEG"] > 0
                by = [compile_for(kernel, "bf16", dict(flags, HAS_TAB=A.TABLE_READS[read]), warps, stages, count=True)
                      for read in ("score", "window")]
                unit = {"shared": 1024}
                cells = [f"{by[0][k] // unit.get(k, 1)} → {by[1][k] // unit.get(k, 1)}"
                         for k in ("shared", "registers", "spills", "instructions", "global loads")]
                yield f"| {method} | {name} {bm} × {bn}, {warps} warps | " + " | ".join(cells) + " |"


def _torch_dtype(size: int):
    import torch

    return torch.bfloat16 if size == 2 else torch.float32


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dietpe.attention.kernels.resources", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="the first configuration of each list only")
    parser.add_argument("--arch", type=int, default=90, choices=sorted(SHARED_LIMIT), help="sm_ARCH")
    parser.add_argument("--reads", action="store_true", help="the offset table read per score against by window")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("resources: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    from dietpe.attention.kernels import attention as A, rotary as R

    if args.reads:
        for row in read_rows():
            print(row, flush=True)
        return 0
    failed = 0
    todo = list(cases(args.check)) + [
        ("_offset_sum_kernel", A._offset_sum_kernel, "fp32", dict(BLK=64, RB=256, CAUSAL=True), 4, 1),
        ("_rotary_kernel bf16", R._rotary_kernel, "bf16", dict(ROWS=R.ROWS, HALF=32), 4, 1)]
    for label, kernel, dtype, constexprs, warps, stages in todo:
        try:
            r = compile_for(kernel, dtype, constexprs, warps, stages, args.arch)
        except Exception as e:  # a compile error is the finding: report it and go on
            failed += 1
            print(f"{label}: FAILED {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}", flush=True)
            continue
        fits = r["shared"] <= SHARED_LIMIT[args.arch]
        failed += not fits
        print(f"{label}: shared {r['shared']} B{'' if fits else ' (too much)'}, {r['registers']} registers, "
              f"{r['spills']} B spilled", flush=True)
    print(f"resources: {'OK' if not failed else f'{failed} FAILED'} (sm_{args.arch})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
