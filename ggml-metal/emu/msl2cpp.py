#!/usr/bin/env python3
"""msl2cpp.py - translate one ggml Metal kernel file into C++ for the metal-emu runtime.

The input is assembled exactly like the embed step of ggml/src/ggml-metal/CMakeLists.txt
(common.h [+ dequantize.h] [+ quantize.h] [+ fa_common.metal] [+ fa_vec_common.metal] + the file,
internal includes removed, ggml-common.h and ggml-metal-impl.h inlined), then rewritten:

  - kernel parameter attributes become a per-kernel argument table (buffers in declaration order,
    [[threadgroup(n)]], thread-position builtins); `kernel` functions become plain functions
  - [[host_name("x")]] instantiations and kernels become registered thunks
  - [[function_constant(i)]] globals become plain globals registered with the runtime
  - `threadgroup T a[N];` in function bodies becomes one array shared by the threadgroup
  - C-style and functional casts to vector/matrix/template types become emu_cvt/emu_make
    (element-wise conversion, never a bit cast); pointer casts become checked emu_pcast
  - half literals (1.0h) become a user literal
  - in kernel bodies, every if(-else) whose condition depends on the lane (thread-position builtins
    and const locals computed from them) is bracketed by emu_simd_lockstep() calls, so the lanes of
    a SIMD group enter and leave lane-dependent branches together, as in lockstep GPU execution

usage: msl2cpp.py --ggml-metal-dir DIR --kernel NAME --out FILE [--parts K --part I]
       msl2cpp.py --index --out FILE NAME:K [NAME:K ...]
"""

import argparse
import os
import re
import sys


def fail(msg):
    sys.stderr.write(f"msl2cpp: error: {msg}\n")
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# step 1: assemble like the embed step

def assemble(mdir, name):
    kdir = os.path.join(mdir, "kernels")
    src = os.path.join(kdir, name + ".metal")
    if not os.path.exists(src):
        fail(f"kernel source not found: {src}")
    text_src = open(src).read()
    headers = [os.path.join(kdir, "common.h")]
    if re.search(r'#include "dequantize\.h"', text_src):
        headers.append(os.path.join(kdir, "dequantize.h"))
    if re.search(r'#include "quantize\.h"', text_src):
        headers.append(os.path.join(kdir, "quantize.h"))
    if re.search(r'#include "fa_common\.metal"', text_src):
        headers.append(os.path.join(kdir, "fa_common.metal"))
    if re.search(r'#include "fa_vec_common\.metal"', text_src):
        headers.append(os.path.join(kdir, "fa_vec_common.metal"))
    text = "".join(open(h).read() for h in headers) + text_src
    out = []
    drop = ['#include "common.h"', '#include "dequantize.h"', '#include "quantize.h"',
            '#include "fa_common.metal"', '#include "fa_vec_common.metal"', '#pragma once']
    common = open(os.path.join(mdir, "..", "ggml-common.h")).read()
    impl = open(os.path.join(mdir, "ggml-metal-impl.h")).read()
    for line in text.split("\n"):
        if any(d in line for d in drop):
            continue
        if "__embed_ggml-common.h__" in line:
            out.append(common.replace("#pragma once", ""))
            continue
        if '#include "ggml-metal-impl.h"' in line:
            out.append(impl.replace("#pragma once", ""))
            continue
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# lexical helpers

def strip_comments(s):
    """remove // and /* */ comments, keep strings and newlines"""
    out = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and s[j] != c:
                j += 2 if s[j] == "\\" else 1
            out.append(s[i:j + 1])
            i = j + 1
        elif s.startswith("//", i):
            j = s.find("\n", i)
            if j < 0:
                j = n
            # keep line continuations of macros intact
            i = j
        elif s.startswith("/*", i):
            j = s.find("*/", i + 2)
            if j < 0:
                j = n
            out.append("\n" * s.count("\n", i, j))
            i = j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def match_paren(s, i, open_c="(", close_c=")"):
    """s[i] == open_c; return index of matching close"""
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return i
        elif c == '"':
            j = i + 1
            while s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            i = j
        i += 1
    fail(f"unbalanced {open_c}{close_c} at offset {i}")


def split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


BUILTIN_KINDS = {
    "threadgroup_position_in_grid": "EMU_ARG_TGPIG",
    "thread_position_in_threadgroup": "EMU_ARG_TPITG",
    "thread_index_in_threadgroup": "EMU_ARG_TIITG",
    "thread_index_in_simdgroup": "EMU_ARG_TIISG",
    "simdgroup_index_in_threadgroup": "EMU_ARG_SGITG",
    "simdgroups_per_threadgroup": "EMU_ARG_NSG",
    "threads_per_threadgroup": "EMU_ARG_NTG",
    "threadgroups_per_grid": "EMU_ARG_NTGPG",
    "thread_position_in_grid": "EMU_ARG_TPIG",
    "threads_per_simdgroup": "EMU_ARG_NTPSG",
}

# builtins whose value differs between the lanes of a SIMD group
LANE_KINDS = {"EMU_ARG_TPITG", "EMU_ARG_TIITG", "EMU_ARG_TIISG", "EMU_ARG_TPIG"}

SCALARS = ["float", "half", "bfloat", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong", "bool"]
VEC_TYPES = set()
for t in SCALARS:
    for n in (2, 3, 4, 8, 16):
        VEC_TYPES.add(f"{t}{n}")
for t in ("float", "half", "bfloat"):
    for c in (2, 3, 4):
        for r in (2, 3, 4):
            VEC_TYPES.add(f"{t}{c}x{r}")
VEC_TYPES |= {"packed_float2", "packed_float3", "packed_float4", "packed_half2", "packed_half4",
              "packed_char4", "packed_uchar4", "simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8"}


# functions of msl_shim.h that kernel sources may overload
SHIM_FUNCS = """exp exp2 log log2 log1p sqrt rsqrt tanh tan sin cos sinh cosh atan asin acos erf fabs floor ceil
round rint trunc fract sign saturate pow powr atan2 fmax fmin copysign fmod step ldexp sincos fma isnan isinf
isfinite min max clamp abs dot length normalize select mix all any popcount clz ctz as_type simd_sum simd_max
simd_min simd_shuffle simd_broadcast simd_shuffle_down simd_shuffle_up simd_shuffle_xor simd_prefix_exclusive_sum
simd_prefix_inclusive_sum simd_all simd_any simdgroup_load simdgroup_store simdgroup_multiply_accumulate
simdgroup_multiply make_filled_simdgroup_matrix threadgroup_barrier simdgroup_barrier atomic_store_explicit
atomic_load_explicit atomic_fetch_add_explicit atomic_fetch_sub_explicit atomic_fetch_and_explicit atomic_fetch_or_explicit
atomic_fetch_xor_explicit atomic_fetch_max_explicit atomic_fetch_min_explicit atomic_exchange_explicit
atomic_compare_exchange_weak_explicit atomic_thread_fence""".split()

# a function that uses these synchronises threadgroups through device memory
DEVICE_SYNC = re.compile(r"\batomic_thread_fence\b|\bdevice\s+(?:const\s+)?(?:volatile\s+)?atomic(?:_\w+|\s*<)")
CALL_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_assert", "FOR_UNROLL"}

# ---------------------------------------------------------------------------------------------
# step 2: rewrite

class Translator:
    def __init__(self, text, name, parts, part):
        self.text = text
        self.name = name
        self.parts = parts
        self.part = part
        self.kinds = {}        # kernel function -> list of (kind, idx)
        self.lane_params = {}  # kernel function -> names of its lane-varying builtin parameters
        self.fcs = []          # (name, idx expr)
        self.n_inst = 0
        self.type_names = set(VEC_TYPES)
        self.coresident = set()  # functions that (transitively) synchronise through device memory

    def collect_types(self, s):
        for m in re.finditer(r"\b(?:typename|class)\s+(\w+)", s):
            self.type_names.add(m.group(1))
        for m in re.finditer(r"\btypedef\b[^;{]*?(\w+)\s*;", s):
            self.type_names.add(m.group(1))
        for m in re.finditer(r"\busing\s+(\w+)\s*=", s):
            self.type_names.add(m.group(1))
        for m in re.finditer(r"\bstruct\s+(\w+)", s):
            self.type_names.add(m.group(1))
        self.type_names -= {"metal", "namespace"}

    # -- function constants
    def do_function_constants(self, s):
        def rep(m):
            self.fcs.append((m.group(2), m.group(3)))
            return f"static {m.group(1)} {m.group(2)};"
        return re.sub(r"\bconstant\s+([\w:]+)\s+(\w+)\s*\[\[\s*function_constant\s*\(([^\]]*)\)\s*\]\]\s*;", rep, s)

    # -- kernels: parameter attributes, kernel keyword, registrations
    def parse_params(self, fname, params):
        kinds = []
        nbuf = 0
        new_params = []
        lanes = []
        for p in split_top(params):
            attrs = re.findall(r"\[\[\s*([\w]+)\s*(?:\(([^)]*)\))?\s*\]\]", p)
            clean = re.sub(r"\[\[[^\]]*\]\]", "", p)
            kind = None
            for a, arg in attrs:
                if a in BUILTIN_KINDS:
                    kind = (BUILTIN_KINDS[a], 0)
                elif a == "threadgroup":
                    kind = ("EMU_ARG_TGMEM", int(arg))
                elif a == "buffer":
                    kind = ("EMU_ARG_BUFFER", int(arg))
                    nbuf = int(arg) + 1
            if kind is None:
                kind = ("EMU_ARG_BUFFER", nbuf)
                nbuf += 1
            kinds.append(kind)
            new_params.append(clean)
            if kind[0] in LANE_KINDS:
                names = re.findall(r"\w+", clean)
                if names:
                    lanes.append(names[-1])
        if fname in self.kinds and self.kinds[fname] != kinds:
            fail(f"{self.name}: kernel {fname} declared twice with different arguments")
        self.kinds[fname] = kinds
        self.lane_params[fname] = lanes
        return ",".join(new_params)

    def emit_instance(self, host_name, fexpr, fname):
        idx = self.n_inst
        self.n_inst += 1
        if idx % self.parts != self.part:
            return ""
        cores = "true" if fname in self.coresident else "false"
        return (f"\nstatic void emu_thunk_{idx}() {{ emu_call(&{fexpr}, emu_kinds_{fname}); }}\n"
                f"static emu_registrar emu_reg_{idx}(\"{host_name}\", &emu_thunk_{idx}, \"{self.name}\", {cores});\n")

    def do_kernels(self, s):
        out = []
        i = 0
        pat = re.compile(r"(\[\[\s*host_name\s*\(\s*\"(\w+)\"\s*\)\s*\]\]\s*)?\bkernel\s+void\s+(\w+)\s*\(")
        inst = re.compile(r"template\s*\[\[\s*host_name\s*\(\s*\"(\w+)\"\s*\)\s*\]\]\s*kernel\s+\w+\s+(\w+)\s*(<)")
        while True:
            m1 = pat.search(s, i)
            m2 = inst.search(s, i)
            if not m1 and not m2:
                out.append(s[i:])
                break
            if m2 and (not m1 or m2.start() < m1.start()):
                out.append(s[i:m2.start()])
                lt = m2.start(3)
                gt = match_paren(s, lt, "<", ">")
                semi = s.index(";", gt)
                fname = m2.group(2)
                fexpr = fname + s[lt:gt + 1]
                out.append(self.emit_instance(m2.group(1), fexpr, fname))
                i = semi + 1
                continue
            # kernel definition / declaration
            out.append(s[i:m1.start()])
            fname = m1.group(3)
            po = m1.end() - 1
            pc = match_paren(s, po)
            params = self.parse_params(fname, s[po + 1:pc])
            # template kernel? look back for "template<...>" directly before
            before = "".join(out).rstrip()
            is_template = before.endswith(">") and re.search(r"template\s*<[^;{}]*>$", before, re.S) is not None
            out.append(f"void {fname}({params})")
            j = pc + 1
            # find body
            k = j
            while s[k] in " \t\n":
                k += 1
            if s[k] == "{":
                end = match_paren(s, k, "{", "}")
                out.append(s[j:k] + self.do_lockstep(s[k:end + 1], self.lane_params[fname]))
                if not is_template:
                    out.append(self.emit_instance(m1.group(2) or fname, fname, fname))
                i = end + 1
            else:
                i = j
        return "".join(out)

    # -- lockstep points around lane-dependent branches (see emu_simd_lockstep in emu-runtime.cpp)
    def do_lockstep(self, body, lanes):
        """wrap every if(-else) statement of a kernel body whose condition depends on the lane
        (a thread-position builtin, or a const local computed from one) in lockstep points"""
        if not lanes:
            return body
        names = set(lanes)
        decl = re.compile(r"\bconst\s+(?:[\w:]+\s+)+(\w+)\s*=\s*([^;{}]*);")
        for _ in range(3):  # lane-derived const locals, e.g. 'const short tx = tiisg%NL;'
            for m in decl.finditer(body):
                if re.search(r"\b(%s)\b" % "|".join(sorted(names)), m.group(2)):
                    names.add(m.group(1))
        lane_rx = re.compile(r"\b(%s)\b" % "|".join(sorted(names)))
        if_rx = re.compile(r"(?<![\w.])if\s*\(")

        def skip_ws(i):
            while i < len(body) and body[i] in " \t\n":
                i += 1
            return i

        def stmt_end(i):
            """index after the statement starting at body[i] (after white space)"""
            i = skip_ws(i)
            if body[i] == "{":
                return match_paren(body, i, "{", "}") + 1
            m = re.match(r"(if|for|while|FOR_UNROLL|switch)\s*\(", body[i:])
            if m:
                c = match_paren(body, i + m.end() - 1)
                e = stmt_end(c + 1)
                if m.group(1) == "if":
                    k = skip_ws(e)
                    if re.match(r"else\b", body[k:]):
                        e = stmt_end(k + 4)
                return e
            depth = 0
            while True:
                c = body[i]
                if c in "([{":
                    depth += 1
                elif c in ")]}":
                    depth -= 1
                elif c == ";" and depth == 0:
                    return i + 1
                i += 1

        def chain_conds(i):
            """conditions of the if / else if chain starting at body[i] == 'if'"""
            conds = []
            while True:
                o = body.index("(", i)
                c = match_paren(body, o)
                conds.append(body[o + 1:c])
                e = stmt_end(c + 1)
                k = skip_ws(e)
                m = re.match(r"else\s+if\s*\(", body[k:])
                if not m:
                    return conds
                i = skip_ws(k + 4)

        out = []
        i = 0
        while True:
            m = if_rx.search(body, i)
            if not m:
                out.append(body[i:])
                break
            before = body[:m.start()].rstrip()
            if before.endswith("else"):  # part of a chain handled at its first 'if'
                out.append(body[i:m.end()])
                i = m.end()
                continue
            conds = chain_conds(m.start())
            if any(lane_rx.search(c) for c in conds):
                e = stmt_end(m.start())
                out.append(body[i:m.start()])
                out.append("{ emu_simd_lockstep(); " + body[m.start():e] + " emu_simd_lockstep(); }")
                i = e
            else:
                out.append(body[i:m.end()])
                i = m.end()
        return "".join(out)

    # -- persistent kernels
    def find_coresident(self, s):
        """names of the functions whose parameters or bodies use device atomics or atomic_thread_fence,
        directly or through functions they call (by name, overloads merged): the kernels among them
        run as persistent dispatches (all threadgroups co-resident, PERSISTENT.md)"""
        funcs = {}
        for m in re.finditer(r"\b(\w+)\s*\(", s):
            name = m.group(1)
            if name in CALL_KEYWORDS:
                continue
            close = match_paren(s, m.end() - 1)
            k = close + 1
            while k < len(s) and s[k] in " \t\n":
                k += 1
            if k >= len(s) or s[k] != "{":
                continue  # a call or a declaration
            end = match_paren(s, k, "{", "}")
            funcs[name] = funcs.get(name, "") + s[m.end():end + 1]
        marked = {f for f, t in funcs.items() if DEVICE_SYNC.search(t)}
        while True:
            more = set()
            for f, t in funcs.items():
                if f not in marked and marked and re.search(r"\b(%s)\s*[(<]" % "|".join(sorted(marked)), t):
                    more.add(f)
            if not more:
                return marked
            marked |= more

    # -- threadgroup arrays in bodies
    def do_tg_vars(self, s):
        def rep(m):
            typ, var, dims = m.group(2), m.group(3), m.group(4)
            return (f"{m.group(1)}static char {var}__emu_key; "
                    f"auto & {var} = *emu_tg_var<{typ} {dims}>(&{var}__emu_key);")
        return re.sub(r"(?m)^(\s*)threadgroup\s+([\w:<>, ]+?)\s+(\w+)\s*((?:\[[^\]]+\])+)\s*;", rep, s)

    # -- casts
    def operand_end(self, s, i):
        """end index (exclusive) of the cast-expression operand starting at s[i:]"""
        n = len(s)
        while i < n and s[i] in " \t\n":
            i += 1
        if i >= n:
            return None
        c = s[i]
        if c in "-+!~*&":
            if s.startswith("++", i) or s.startswith("--", i):
                return self.operand_end(s, i + 2)
            return self.operand_end(s, i + 1)
        if c == "(":
            j = match_paren(s, i) + 1
            # a cast inside: (T) (x) -> the parenthesised group followed by an operand is a cast
            inner = s[i + 1:j - 1].strip()
            if self.is_cast_type(inner) is not None:
                e = self.operand_end(s, j)
                if e is not None:
                    return e
        elif re.match(r"[\w.]", c):
            m = re.match(r"(?:::)?[\w.]+(?:::\w+)*", s[i:])
            j = i + m.end()
            word = m.group(0)
            if word in ("sizeof", "alignof") :
                k = j
                while s[k] in " \t":
                    k += 1
                j = match_paren(s, k) + 1
            elif j < n and s[j] == "<" and word in ("as_type", "static_cast", "emu_cvt", "emu_make", "emu_pcast"):
                j = match_paren(s, j, "<", ">") + 1
        else:
            return None
        # postfix
        while True:
            k = j
            while k < n and s[k] in " \t":
                k += 1
            if k < n and s[k] == "(":
                j = match_paren(s, k) + 1
            elif k < n and s[k] == "[":
                j = match_paren(s, k, "[", "]") + 1
            elif s.startswith("->", k) or (k < n and s[k] == "." and not s[k + 1:k + 2].isdigit()):
                k += 2 if s[k] == "-" else 1
                m = re.match(r"\s*\w+", s[k:])
                if not m:
                    return j
                j = k + m.end()
            elif s.startswith("++", k) or s.startswith("--", k):
                j = k + 2
            else:
                return j

    def is_cast_type(self, inner):
        """'ptr' | 'val' | None for the text inside (...)"""
        t = re.sub(r"\b(device|threadgroup|constant|thread|const|volatile)\b", " ", inner).strip()
        if re.fullmatch(r"[\w:]+(\s*<[\w\s,:]*>)?\s*\*+", t):
            return "ptr"
        if t in self.type_names:
            return "val"
        return None

    def do_casts(self, s):
        out = []
        i = 0
        n = len(s)
        while i < n:
            c = s[i]
            if c == '"':
                j = i + 1
                while s[j] != '"':
                    j += 2 if s[j] == "\\" else 1
                out.append(s[i:j + 1])
                i = j + 1
                continue
            if c == "(":
                # preceded by identifier or ) or ] -> call, not cast
                k = len(out) - 1
                prev = ""
                while k >= 0 and out[k] in " \t\n":
                    k -= 1
                if k >= 0:
                    prev = out[k]
                close = match_paren(s, i)
                inner = s[i + 1:close]
                kind = None
                if "\n" not in inner and len(inner) < 80 and not (prev.isalnum() or prev in "_)]"):
                    kind = self.is_cast_type(inner.strip())
                if kind is not None:
                    e = self.operand_end(s, close + 1)
                    if e is not None and s[close + 1:e].strip():
                        operand = self.do_casts(s[close + 1:e])
                        fn = "emu_pcast" if kind == "ptr" else "emu_cvt"
                        if kind == "val" and inner.strip() in ("float", "half", "int", "uint", "short", "ushort",
                                                                "char", "uchar", "bool", "long", "ulong", "bfloat",
                                                                "int32_t", "uint32_t", "int16_t", "uint16_t",
                                                                "int8_t", "uint8_t", "int64_t", "uint64_t", "size_t"):
                            out.append(s[i:close + 1] + operand)
                        else:
                            out.append(f"{fn}<{inner.strip()}>({operand.strip()})")
                        i = e
                        continue
            out.append(c)
            i += 1
        return "".join(out)

    def do_ctors(self, s):
        names = sorted((t for t in self.type_names if re.fullmatch(r"\w+", t)), key=len, reverse=True)
        rx = re.compile(r"(?<![\w.:>])(" + "|".join(names) + r")\s*\(")

        def rep(m):
            # skip declarations/definitions like 'T foo(' (handled: we only match T directly before '(')
            return f"emu_make<{m.group(1)}>("
        return rx.sub(rep, s)

    def translate(self):
        s = strip_comments(self.text)
        s = re.sub(r"(?m)^\s*#\s*include\s*<[^>]*>\s*$", "", s)
        s = re.sub(r"(?m)^\s*#\s*pragma\s+(unroll|METAL).*$", "", s)
        s = re.sub(r"(?m)^\s*using\s+namespace\s+metal\s*;", "", s)
        self.collect_types(s)
        self.coresident = self.find_coresident(s)
        s = self.do_function_constants(s)
        s = self.do_kernels(s)
        # leftover parameter attributes, e.g. in typedef'd kernel function types
        s = re.sub(r"\[\[\s*(?:threadgroup|buffer|%s)\s*(?:\(\s*\d+\s*\))?\s*\]\]" % "|".join(BUILTIN_KINDS), "", s)
        s = self.do_tg_vars(s)
        s = self.do_casts(s)
        s = self.do_ctors(s)
        # half literals
        s = re.sub(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)h\b", r"\1_emu_h", s)
        # MSL has no double: unsuffixed floating literals are float
        s = re.sub(r"(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])", r"\1f", s)
        return s

    def output(self):
        body = self.translate()
        head = [
            f"// generated by msl2cpp.py from ggml-metal kernels/{self.name}.metal (part {self.part}/{self.parts})",
            "// do not edit: edit the .metal source or the translator",
            "#define GGML_METAL_EMBED_LIBRARY 1",
            "#include \"msl_shim.h\"",
            "#include \"emu-kernel.h\"",
            f"namespace emu_{self.name}_p{self.part} {{",
            "using namespace metal;",
            "using " + "; using ".join("metal::" + f for f in SHIM_FUNCS) + ";",
        ]
        for f, ks in self.kinds.items():
            arr = ", ".join(f"{{{k}, {i}}}" for k, i in ks)
            head.append(f"constexpr emu_arg_desc emu_kinds_{f}[] = {{ {arr} }};")
        tail = ["", "struct emu_fc_registrar { emu_fc_registrar() {"]
        for fname, idx in self.fcs:
            tail.append(f"    emu_register_fc(({idx}), (void *) &{fname}, sizeof({fname}));")
        tail.append("} };")
        # every part has its own copy of the function-constant globals
        tail.append("emu_fc_registrar emu_fc_reg;")
        tail.append("} // namespace")
        tail.append(f"using namespace emu_{self.name}_p{self.part};")
        tail.append(f"void emu_register_{self.name}_p{self.part}() {{}}")
        return "\n".join(head) + "\n" + body + "\n" + "\n".join(tail) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml-metal-dir")
    ap.add_argument("--kernel")
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--index", action="store_true")
    ap.add_argument("--source", help="translate this .metal file instead of an assembled ggml one")
    ap.add_argument("-I", "--include-dir", action="append", default=[],
                    help="with --source: directory searched for #include \"...\" files (after the source's own)")
    ap.add_argument("--extract-supports-op", metavar="DEVICE_M",
                    help="extract ggml_metal_device_supports_op() from ggml-metal-device.m")
    ap.add_argument("items", nargs="*")
    a = ap.parse_args()

    if a.extract_supports_op:
        src = open(a.extract_supports_op).read()
        start = src.find("static bool ggml_metal_supports_mul_mat_op(")
        fn = src.find("bool ggml_metal_device_supports_op(ggml_metal_device_t dev")
        if start < 0 or fn < 0:
            fail(f"{a.extract_supports_op}: ggml_metal_device_supports_op() not found")
        end = match_paren(src, src.index("{", fn), "{", "}") + 1
        body = src[start:end]
        body = body.replace("bool ggml_metal_device_supports_op(", "static bool ggml_metal_device_supports_op_upstream(", 1)
        if re.search(r"\[\w+ |@\w|\bnil\b|\bNS[A-Z]\w*", body):
            fail("ggml_metal_device_supports_op() uses Objective-C; the emulator cannot reuse it as is")
        text = (f"// extracted by msl2cpp.py from {os.path.basename(a.extract_supports_op)} - do not edit\n" + body + "\n")
        write_if_changed(a.out, text)
        return

    if a.index:
        lines = ["// generated by msl2cpp.py --index", "#include \"emu-runtime.h\""]
        calls = []
        for it in a.items:
            name, k = it.split(":")
            for p in range(int(k)):
                lines.append(f"void emu_register_{name}_p{p}();")
                calls.append(f"    emu_register_{name}_p{p}();")
        lines.append("void emu_register_all_kernels(void) {")
        lines += calls
        lines.append("}")
        text = "\n".join(lines) + "\n"
    else:
        if a.source:
            src = inline_includes(a.source, a.include_dir, set())
            name = a.kernel or os.path.splitext(os.path.basename(a.source))[0]
        else:
            src = assemble(a.ggml_metal_dir, a.kernel)
            name = a.kernel
        text = Translator(src, name, a.parts, a.part).output()

    write_if_changed(a.out, text)


def inline_includes(path, dirs, seen):
    """the text of an MSL source with its #include "..." files inlined (each file once, as with
    #pragma once); <...> includes stay (the translator drops them)"""
    out = []
    for line in open(path).read().split("\n"):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        if not m:
            out.append("" if re.match(r"\s*#\s*pragma\s+once\b", line) else line)
            continue
        for d in [os.path.dirname(os.path.abspath(path))] + dirs:
            cand = os.path.abspath(os.path.join(d, m.group(1)))
            if os.path.exists(cand):
                break
        else:
            fail(f"{path}: #include \"{m.group(1)}\" not found (searched the source's directory and {dirs})")
        if cand not in seen:
            seen.add(cand)
            out.append(inline_includes(cand, dirs, seen))
    return "\n".join(out)


def write_if_changed(path, text):
    if os.path.exists(path) and open(path).read() == text:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
