"""Text-form cases: ``tdag.parse`` of real program texts, mutated line by line, token by token
and character by character, and hostile lines (huge and nested dims, deep nesting, unknown
ops, dangling names). The same mutations damage the text inside ``.tdag`` files."""
from __future__ import annotations

import functools
import random
import re
from pathlib import Path

from support import io_programs  # tests/support: tests/conftest.py puts tests/ on sys.path
import torch

import tdag
import tdag.lower
from tdag import ops

from .harness import MARK, Case

LIGHT_MODEL = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / \
    "light" / "light_squeezenet.onnx"


def programs(long: bool) -> dict[str, tdag.Program]:
    """Valid programs: traced ones, io_programs' (weights of every dtype, If/Loop/state), an
    ONNX model and lowered programs (kernel placeholders print their own specs)."""
    softmax = tdag.trace(lambda x, w: ops.softmax(x @ w, axis=-1),
                         tdag.TensorSpec(("b", 16), "float32"), tdag.TensorSpec((16, 4), "float32"))

    def with_weights(x):
        w = ops.param("enc.w", torch.arange(12.0).reshape(3, 4))
        return ops.relu(ops.matmul(x, w)) * ops.buffer("scale", torch.ones(4))

    progs = {"softmax": softmax,
             "weights": tdag.trace(with_weights, tdag.TensorSpec(("b", 3))),
             "tiny": io_programs.tiny_program(), "core": io_programs.core_program(),
             "dtypes": io_programs.dtype_program(), "control": io_programs.control_program()}
    progs["softmax-lowered"] = tdag.lower.lower(softmax)
    if long:
        squeezenet = tdag.from_onnx(str(LIGHT_MODEL))
        progs["squeezenet"] = squeezenet
        progs["squeezenet-lowered"] = tdag.lower.lower(squeezenet)
    return progs


# -- hostile material -------------------------------------------------------------------------

def _nest(open_: str, inner: str, close: str, n: int) -> str:
    return open_ * n + inner + close * n


HOSTILE_DIMS = (
    "9**9**9", "9**99999", "2**64", "2**62", "4611686018427387904", "-1", "-3", "0",
    "-9223372036854775809", "9" * 40, "b**b**b", "(b+c+d+e+f)**64", "(b+1)**64*(c+1)**64",
    "b*" * 2000 + "b", _nest("(", "b", ")", 300), _nest("floor(", "b", ")", 80),
    _nest("Max(b,", "b", ")", 60), "Mod(b,0)", "b/0", "floor(b/0)", "1/0", "b//0", "0**0",
    "nan", "inf", "zoo", "oo", "I", "E", "pi", "Symbol", "Integer(5)", "lambda", "b.real",
    "__import__", "b-b", "b-c", "3-b", "floor(b/2)+1", "ceiling(s/3)", "Min(b)", "Max()",
    "Mod(b)", "b**-1", "b**0.5", "2**b", "b**(b)", "(-1)**b", "b**99", "999999999999**64",
)
HOSTILE_NUMBERS = ("-1", "0", "99", "-99", "9223372036854775807", "-9223372036854775808",
                   "9223372036854775808", "1e999", "-1e999", "nan", "inf", "1.5", "9" * 400,
                   "True", "None", '"x"', "()", "[]", "(0,)", "%x", "9**9**9")
HOSTILE_SPEC_VALUES = (  # a keyword argument's value of the wrong type or range
    "((),)", "(())", '("x",)', "(1.5,)", "(True,)", "([0],)", "(%x,)", "0", "None", "()", "[]",
    '"str"', "(-1,)", "(99,)", "(0, 0)", "((0, 1),)", "(b,)", "(9**9**9,)", "inf", "nan",
    "-0.0", "1e999", "(2**62,)", "(-(2**62),)", "frobnicate", "((((0,),),),)", "{}")
HOSTILE_TOKENS = HOSTILE_DIMS[:20] + HOSTILE_NUMBERS + (
    "%nope", "%", '%"', '%"\\u0000"', '"\\ud800"', "frobnicate", "reduce[frob]", "q7", "f32",
    "state", "program", "tdag", "call", "if", "loop", "then", "else", "body", "return",
    "{", "}", "(", ")", "[", "]", ",", "=", ":", "@", "#", "\x00", "\t", "\u202e", "\U0001f600",
    "param", "buffer", "const", "cond=", "count=", "scanned=", "axes=", "sizes=", "perm=",
)


@functools.lru_cache(maxsize=8)
def hostile_lines(marker: str) -> tuple[str, ...]:
    inject = [f"__import__('builtins').open({marker!r},'w')", f"exec('open({marker!r},\"w\")')"]
    big = 2**62 - 1
    return (
        "const %h: f32[1000000000000] = 0.0",
        "const %h: f32[9**9**9] = 0.0",
        f"const %h: f32[{big},{big}] = 0.0",
        "const %h: f32[2,2] = " + _nest("[", "1.0", "]", 20000),
        "const %h: f32[2,2] = " + _nest("[", "1.0", "]", 70),
        "const %h: f32[3] = [1.0, 2.0]",
        "const %h: f32[] = 1e999999",
        "const %h: i64[] = 99999999999999999999999999999",
        "const %h: bool[2] = [2, nan]",
        "param %h: f32[-3]",
        f"param %h: f32[{big},{big},{big}]",
        "buffer %h: q7[3]",
        f"%h: i64[{big}] = iota(length={big}, dtype=i64)",
        "%h: i64[9**9] = iota(length=9**9, dtype=i64)",
        "%h: f32[3] = frobnicate(%x)",
        "%h: f32[3] = add(%nope, %nope)",
        "%h: f32[3] = add(%h, %h)",
        "%h: f32[3] = permute(%x, perm=" + _nest("(", "0,", ")", 5000) + ")",
        "%h: f32[3] = permute(%x, perm=" + _nest("(", "0,", ")", 60) + ")",
        "%h: f32[3] = reduce[sum](%x, axes=(" + ", ".join(["0"] * 5000) + ",))",
        "%h: f32[3] = neg(" + ", ".join(["%x"] * 5000) + ")",
        f"%h: f32[{'b,' * 5000}b] = neg(%x)",
        "state %h: f32[2**70]",
        "%o = call nowhere(%x)",
        "%o = call main(" + ", ".join(["%o"] * 100) + ")",
        "%o = loop(%x, count=9**9**9) body(%i: i64[], %h: f32[4]) {",
        "%o = loop(%x, count=-1) body(%i: i64[], %h: f32[4]) {",
        "%o = if(%x, cond=%nope) then(%a: f32[4]) {",
        "tdag main(%x: f32[3]) {", "}", "{", "program() {", "return", "return %nope",
        '%"\\ud800": f32[3] = neg(%x)', '%"' + "a" * 100000 + '": f32[3] = neg(%x)',
        "# " + "x" * 200000, "%h: f32[3] = neg(%x)  # " + "\"" * 5000,
        f"%h: f32[{inject[0]}] = neg(%x)", f"param %h: f32[3] = {inject[1]}",
        f"%h: f32[3] = permute(%x, perm={inject[0]})",
    )


# -- mutations of a text ----------------------------------------------------------------------

_TOKEN = re.compile(r'%"(?:[^"\\]|\\.)*"|%[\w.:]+|"(?:[^"\\]|\\.)*"|[\w.]+|\*\*|//|\S')


def _tokens(text: str) -> list[re.Match]:
    return list(_TOKEN.finditer(text))


def mutate_text(text: str, rng: random.Random, marker: str) -> tuple[str, str]:
    lines = text.split("\n")
    if not text.strip():  # an earlier mutation left nothing to work on
        return "a hostile line alone", rng.choice(hostile_lines(marker))
    how = rng.randrange(13)
    if how == 2 and len(lines) < 2:
        how = 1
    if how == 12:
        args = list(re.finditer(r"\b(\w+)=(\([^()]*(?:\([^()]*\)[^()]*)*\)|[^,()\s]+)", text))
        if args:
            m = rng.choice(args)
            new = rng.choice(HOSTILE_SPEC_VALUES)
            return f"argument {m.group(1)}={m.group(2)[:20]} -> {new!r}", \
                text[:m.start(2)] + new + text[m.end(2):]
    if how == 0:
        i = rng.randrange(len(lines))
        return f"delete line {i + 1}", "\n".join(lines[:i] + lines[i + 1:])
    if how == 1:
        i = rng.randrange(len(lines))
        return f"duplicate line {i + 1}", "\n".join(lines[:i + 1] + lines[i:])
    if how == 2:
        i, j = sorted(rng.sample(range(len(lines)), 2))
        lines[i], lines[j] = lines[j], lines[i]
        return f"swap lines {i + 1} and {j + 1}", "\n".join(lines)
    if how in (3, 4, 5):
        toks = _tokens(text)
        t = rng.choice(toks)
        pool = {3: HOSTILE_TOKENS, 4: HOSTILE_DIMS, 5: HOSTILE_NUMBERS}[how]
        new = rng.choice(pool)
        return f"token {t.group()[:20]!r}@{t.start()} -> {new[:30]!r}", \
            text[:t.start()] + new + text[t.end():]
    if how == 6:
        toks = _tokens(text)
        t = rng.choice(toks)
        if rng.random() < 0.5:
            return f"delete token {t.group()[:20]!r}@{t.start()}", text[:t.start()] + text[t.end():]
        other = rng.choice(toks).group()
        return f"insert token {other[:20]!r}@{t.start()}", text[:t.start()] + other + " " + \
            text[t.start():]
    if how == 7:
        cut = rng.randrange(len(text))
        return f"truncate@{cut}/{len(text)}", text[:cut]
    if how == 8:
        i = rng.randrange(len(text))
        ch = rng.choice(("\x00", "\n", "{", "}", "%", '"', "\\", "\u00e9", "\ufffd", "9", "-"))
        return f"char@{i} -> {ch!r}", text[:i] + ch + text[i + 1:]
    if how == 9:
        dims = [m for m in re.finditer(r"\[([^\[\]]*)\]", text) if m.group(1)]
        if not dims:
            return mutate_text(text, rng, marker)
        m = rng.choice(dims)
        parts = m.group(1).split(",")
        k = rng.randrange(len(parts))
        parts[k] = rng.choice(HOSTILE_DIMS)
        return f"dim {k} of [{m.group(1)[:30]}]@{m.start()} -> {parts[k][:30]!r}", \
            text[:m.start(1)] + ",".join(parts) + text[m.end(1):]
    if how == 10:
        i = rng.randrange(len(lines))
        line = rng.choice(hostile_lines(marker))
        return f"insert at line {i + 1}: {line[:50]!r}", \
            "\n".join(lines[:i] + ["  " + line] + lines[i:])
    calls = [m for m in re.finditer(r"call (\w+)\(", text)]
    if calls and rng.random() < 0.5:
        m = rng.choice(calls)
        new = rng.choice(("nowhere", "program", "main2", m.group(1) * 2))
        return f"call {m.group(1)} -> {new}", text[:m.start(1)] + new + text[m.end(1):]
    blocks = [m for m in re.finditer(r"(?ms)^tdag \w+\(.*?^}\n", text)]
    if blocks:
        m = rng.choice(blocks)
        return "duplicate a tdag block", text[:m.end()] + "\n" + m.group() + text[m.end():]
    return mutate_text(text, rng, marker)


def mutants(text: str, rng: random.Random, marker: str, stack: int) -> tuple[str, str]:
    labels = []
    for _ in range(rng.randint(1, stack)):
        label, text = mutate_text(text, rng, marker)
        labels.append(label)
    return "; ".join(labels), text


def cases(seed: int, long: bool, marker_dir: Path) -> list[Case]:
    rng = random.Random(seed)
    per_seed, stack = (400, 3) if long else (40, 2)
    out = []
    for name, prog in programs(long).items():
        text = str(prog)
        for i in range(per_seed):
            marker = str(marker_dir / f"text-{name}-{i}-EXECUTED")
            label, new = mutants(text, rng, MARK, stack)
            out.append(Case("text", f"{name}: {label}", "text", new.replace(MARK, marker),
                            marker))
    return out
