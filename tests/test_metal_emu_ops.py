"""test-backend-ops on the metal-emu backend (the real ggml-metal host code and kernels, emulated on
the CPU) compared with the CPU backend, per op group.

The build comes from the `metal_emu_build` fixture (harness backend `metal-emu`; env
STQ_METAL_EMU_BUILD=<build dir> overrides). A group passes when test-backend-ops exits 0, at least
one case ran on MTL0 and no case failed; unsupported cases are counted and printed, never passed.
"""
import os
import re
import subprocess
import time

import pytest

Q = "(f32|f16|q4_0|q8_0|q4_K|q1_0)"

# (id, -o ops, -p params regex or None): chosen to cover the kernel paths (mul_mv batch 1,
# mul_mv_ext batch 2..8, mul_mm batch >= 9) for the types the decode of Gemma and Hy4 needs,
# with shapes small enough for a 2-core CI machine
GROUPS = [
    ("mul_mat_mv",     "MUL_MAT",        rf"type_a={Q},type_b=f32,m=16,n=1,k=(256|1024),"),
    ("mul_mat_mv_ext", "MUL_MAT",        rf"type_a={Q},type_b=f32,m=16,n=[2-8],k=256,bs=\[1,1\]"),
    ("mul_mat_mm",     "MUL_MAT",        rf"type_a={Q},type_b=f32,m=16,n=(9|16|32),k=256,bs=\[1,1\]"),
    ("mul_mat_id",     "MUL_MAT_ID",     rf"type_a={Q},type_b=f32,n_mats=4,n_used=(1|2|4),b=.,m=512,n=(1|4|15|32),k=256"),
    ("get_rows",       "GET_ROWS",       r"type=(f32|f16|q4_0|q8_0|q4_K|q6_K|q5_0|q1_0),n=(1|256),m=(5|8),r=(2|4),be1=(1|7),be2=1,"),
    ("set_rows",       "SET_ROWS",       None),
    ("cpy",            "CPY",            r"type_src=(f32|f16),type_dst=(f32|f16|q4_0|q8_0)"),
    ("rms_norm",       "RMS_NORM",       None),
    ("rope",           "ROPE",           r"type=f32,ne_a=\[128,(32|40),2,1\]"),
    ("soft_max",       "SOFT_MAX",       r"type=f32"),
    ("add_mul",        "ADD,MUL",        r"type=f32"),
    ("glu",            "SWIGLU,GEGLU,REGLU", r"type=f32"),
    # bf16 (has_bfloat with GGML_METAL_EMU_BF16=ON, the default): mul_mv, mul_mv_ext, mul_mm, MUL_MAT_ID,
    # GET_ROWS, CPY to and from f32
    ("bf16",           "MUL_MAT,MUL_MAT_ID,GET_ROWS,CPY",
                       r"type_a=bf16,type_b=f32,m=16,n=(1|2|4|9|16),k=256|type_a=bf16,type_b=f32,n_mats=4,n_used=(1|2),"
                       r"b=.,m=512,n=(1|4|32),k=256|type=bf16,n=(1|256),m=(5|8)|type_src=(f32|bf16),type_dst=(f32|bf16)"),
    # f16 K/V, head sizes 64/128/256 (Gemma 3: 256, Hy4: 128), GQA (nr23=[4,1]), sinks, KV length
    # 113 (padded last block) and 512, batch 1 and 3 (vec kernels: NE = 2/1, reduce over 32
    # workgroups) and 32 (simdgroup-matrix kernel); the vec (Q,NE) slice of test-backend-ops
    # (dk 128 and 576, NE 1/2/4, Q 1/2/4, nsg 1 and 4) runs with it
    ("flash_attn_ext", "FLASH_ATTN_EXT", r"hsk=(64|128|256),hsv=(64|128|256),nh=4,nr23=\[(1|4),1\],kv=(113|512),"
                                         r"nb=(1|3|32),mask=1,sinks=(0|1),max_bias=0.000000,logit_softcap=0.000000,"
                                         r"prec=f32,type_K=f16,type_V=f16,permute=\[0,1,2,3\]"),
    # no mask, ALiBi, logit softcap, f16 precision; Gemma 4's 512 and the MLA 576/512 head sizes
    ("flash_attn_ext_flags", "FLASH_ATTN_EXT", r"(hsk=128,hsv=128,nh=4,nr23=\[1,1\],kv=113,nb=(1|32),mask=(0|1),sinks=0,"
                                               r"max_bias=(0|8).000000,logit_softcap=(0|10).000000,prec=(f32|def),"
                                               r"type_K=f16,type_V=f16,permute=\[0,1,2,3\]"
                                               r"|hsk=(512|576),hsv=512,nh=(1|4),nr23=\[1,1\],kv=113,nb=(1|32),mask=1,sinks=0,"
                                               r"max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16)"),
]

# known gaps: not verified on the emulator, so the device reports them unsupported; the test checks
# that no such case is ever reported as passed
GAPS = [
    ("flash_attn_ext_quant_kv", "FLASH_ATTN_EXT", r"hsk=64,hsv=64,nh=4,nr23=\[1,1\],kv=113,nb=1,.*type_K=(q8_0|q4_0)"),
]

SLICE = re.compile(r"fa_vec \(Q,NE\) slice: (\d+) cases run, (\d+) failed")

LINE = re.compile(r"^\s+(\S+\(.*\)): (.*)$")


def _strip(s):
    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def run_group(build, ops, params, timeout=1800, env=None):
    exe = build / "bin" / "test-backend-ops"
    if not exe.exists():
        pytest.fail(f"{exe} does not exist (build the test-backend-ops target)")
    cmd = [str(exe), "test", "-b", "MTL0", "-o", ops]
    if params:
        cmd += ["-p", params]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, GGML_METAL_EMU_THREADS=os.environ.get("GGML_METAL_EMU_THREADS", "2"),
                                **(env or {})))
    dt = time.time() - t0
    out = _strip(r.stdout + r.stderr)
    res = {"ok": 0, "fail": 0, "unsupported": 0}
    failed = []
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        status = m.group(2)
        if status.startswith("OK"):
            res["ok"] += 1
        elif "FAIL" in status:
            res["fail"] += 1
            failed.append(m.group(1))
        elif status.startswith("not supported"):
            res["unsupported"] += 1
    failed += [_strip(l).strip() for l in out.splitlines() if "ERR =" in l]
    m = SLICE.search(out)
    if m:  # test-backend-ops' FA vec slice prints failures only, and a summary
        res["slice_run"], res["slice_fail"] = int(m.group(1)), int(m.group(2))
    return r.returncode, res, failed, dt, out, cmd


@pytest.mark.parametrize("gid,ops,params", GROUPS, ids=[g[0] for g in GROUPS])
def test_backend_ops_metal_emu(metal_emu_build, gid, ops, params):
    # test-backend-ops runs its FA vec slice with every FLASH_ATTN_EXT selection: once is enough
    env = {} if gid == "flash_attn_ext" else {"LLAMA_TEST_FA_VEC_DISABLE": "1"}
    rc, res, failed, dt, out, cmd = run_group(metal_emu_build, ops, params, env=env)
    slice = f", vec slice {res['slice_run'] - res['slice_fail']}/{res['slice_run']} ok" if "slice_run" in res else ""
    print(f"\n[metal-emu] {gid}: {res['ok']} ok, {res['fail']} failed, {res['unsupported']} unsupported{slice}, {dt:.1f} s")
    assert "metal-emu" in out, "the MTL0 backend of this build is not the emulator"
    assert res["fail"] == 0 and rc == 0, (f"{' '.join(cmd)} failed (rc {rc}):\n" + "\n".join(failed[:40])
                                          + "\n--- tail ---\n" + out[-3000:])
    assert res["ok"] > 0, f"no {ops} case ran on MTL0 (all unsupported?):\n{out[-3000:]}"
    if gid == "flash_attn_ext":
        assert res.get("slice_run", 0) > 0 and res["slice_fail"] == 0, f"FA vec slice did not run or failed:\n{out[-3000:]}"


@pytest.mark.parametrize("gid,ops,params", GAPS, ids=[g[0] for g in GAPS])
def test_backend_ops_metal_emu_gaps_unsupported(metal_emu_build, gid, ops, params):
    rc, res, failed, dt, out, cmd = run_group(metal_emu_build, ops, params, env={"LLAMA_TEST_FA_VEC_DISABLE": "1"})
    print(f"\n[metal-emu] gap {gid}: {res['ok']} ok, {res['fail']} failed, {res['unsupported']} unsupported, {dt:.1f} s")
    assert res["ok"] == 0 and res["fail"] == 0, f"{ops} is a known gap and must be reported unsupported:\n{out[-3000:]}"
    assert res["unsupported"] > 0


def test_flash_attn_ext_needs_lockstep(metal_emu_build):
    """The FA vec kernels rely on lockstep SIMD-group execution (lane 0 overwrites ss[0..1] right after
    the other lanes read them, with no simdgroup_barrier): with the emulator's lockstep points off
    (GGML_METAL_EMU_LOCKSTEP=0) the NE = 1 kernel (dk = 128) must fail, so the FA group can fail."""
    params = (r"hsk=128,hsv=128,nh=4,nr23=\[1,1\],kv=113,nb=1,mask=1,sinks=0,max_bias=0.000000,"
              r"logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=\[0,1,2,3\]")
    env = {"LLAMA_TEST_FA_VEC_DISABLE": "1"}
    rc, res, failed, dt, out, cmd = run_group(metal_emu_build, "FLASH_ATTN_EXT", params, env=env)
    assert rc == 0 and res["ok"] == 1 and res["fail"] == 0, out[-3000:]
    rc, res, failed, dt, out, cmd = run_group(metal_emu_build, "FLASH_ATTN_EXT", params,
                                              env=dict(env, GGML_METAL_EMU_LOCKSTEP="0"))
    n_err = sum("ERR =" in f for f in failed)
    print(f"\n[metal-emu] FA without lockstep points: {res['ok']} ok, {n_err} failed, {dt:.1f} s")
    assert rc != 0 and res["ok"] == 0 and n_err == 1, out[-3000:]
