"""The element types beyond torch's everyday ones: uint16/32/64 and the float8 kinds.

Each goes through the text form, a .tdag file, the reference interpreter, the torch module
and the ONNX model on onnxruntime with the same values. torch eager and onnxruntime lack
kernels for some of them; tdag computes those on a carrier type (exactly) or says which op,
type and framework it cannot serve. The 4-bit types of ONNX are refused at import by name.
"""
from __future__ import annotations


import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag import ops
from tdag.errors import UnsupportedOpError
from tdag.ir.types import FLOAT8, UNSIGNED, DType

from onnx_conformance import _ort_run

NEW = sorted(UNSIGNED - {DType.u8} | FLOAT8, key=lambda d: d.value)


def _torch_name(dtype: DType) -> str:
    return str(dtype.torch).removeprefix("torch.")


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy; float8 as ml_dtypes' type of the same bits."""
    dtype = DType.of(t.dtype)
    if dtype.is_float8:
        return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, _torch_name(dtype)))
    return t.numpy()


def _same(actual, expected: torch.Tensor) -> None:
    """Equal dtype and bits (NaN equals NaN)."""
    actual = torch.as_tensor(actual) if not isinstance(actual, np.ndarray) else actual
    if isinstance(actual, np.ndarray):
        wanted = _numpy(expected)
        assert actual.dtype == wanted.dtype, (actual.dtype, wanted.dtype)
        assert actual.tobytes() == wanted.tobytes(), (actual, wanted)
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert _numpy(actual).tobytes() == _numpy(expected).tobytes(), (actual, expected)


def _program(dtype: DType) -> tdag.Program:
    """x * w + c and x < w, with a parameter and a const of ``dtype``."""
    def fn(x):
        w = ops.param("w", torch.tensor([1, 2, 3]).to(dtype.torch))
        c = ops.const(torch.tensor([4, 5, 6]).to(dtype.torch))
        return ops.add(ops.mul(x, w), c), ops.lt(x, w)
    return tdag.trace(fn, tdag.TensorSpec((3,), _torch_name(dtype)))


def _expected(dtype: DType, x: torch.Tensor) -> torch.Tensor:
    """x * w + c with one rounding per op (float8) or wrapping (integers), computed apart."""
    w, c = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    if dtype.is_float8:  # w and c as stored: rounded to the type
        w, c = (v.to(dtype.torch).double() for v in (w, c))
        prod = (x.double() * w).to(dtype.torch)
        return (prod.double() + c).to(dtype.torch)
    values = [(int(a) * int(b) + int(d)) % 2 ** (8 * dtype.itemsize)
              for a, b, d in zip(x.tolist(), w.tolist(), c.tolist())]
    return torch.tensor(values, dtype=torch.uint64).to(dtype.torch)


@pytest.mark.parametrize("dtype", NEW, ids=lambda d: d.value)
def test_round_trips_and_runs_everywhere(dtype, tmp_path):
    prog = _program(dtype)
    assert tdag.parse(str(prog)) == prog
    tdag.save(prog, tmp_path / "m.tdag")
    assert tdag.load(tmp_path / "m.tdag") == prog
    x = torch.tensor([7, 2, 1]).to(dtype.torch)
    out, less = tdag.run(prog, x)
    _same(out, _expected(dtype, x))
    assert less.tolist() == [False, False, True]
    torch_out, torch_less = tdag.to_torch(prog)(x)
    _same(torch_out, out)
    assert torch.equal(torch_less, less)
    ort_out, ort_less = _ort_run(tdag.to_onnx(prog), [_numpy(x)])
    _same(ort_out, out)
    assert ort_less.tolist() == less.tolist()


def test_itemsizes_and_predicates():
    assert [d.itemsize for d in (DType.u16, DType.u32, DType.u64)] == [2, 4, 8]
    assert all(d.itemsize == 1 and d.is_float and d.is_float8 for d in FLOAT8)
    assert DType.u32.is_integer and DType.u32.is_unsigned and not DType.i32.is_unsigned
    assert not DType.bool.is_integer and not DType.bool.is_float
    assert DType.of("uint16") is DType.u16 and DType.of(torch.float8_e5m2) is DType.f8e5m2


def test_cost_by_dtype_counts_float8_bytes():
    report = tdag.cost(_program(DType.f8e4m3fn))
    assert set(report.per_dtype) == {"f8e4m3fn", "bool"}
    assert report.per_dtype["f8e4m3fn"].bytes_written == 6  # two nodes, 3 one-byte values


# -- wrapping and order where torch has no kernel ---------------------------------------------

def _binary(fn, dtype: DType, a, b) -> tuple:
    """fn(a, b) through run, to_torch and onnxruntime (all must agree bit for bit)."""
    spec = tdag.TensorSpec((len(a),), _torch_name(dtype))
    prog = tdag.trace(fn, spec, spec)
    ta, tb = (torch.tensor(v, dtype=torch.uint64 if dtype is DType.u64 else torch.int64)
              .to(dtype.torch) for v in (a, b))
    out = tdag.run(prog, ta, tb)
    torch_out = tdag.to_torch(prog)(ta, tb)
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [_numpy(ta), _numpy(tb)])
    _same(torch_out, out)
    assert _numpy(out).tolist() == np.asarray(ort_out).tolist()
    return out


TOP = 2 ** 63 + 5  # a uint64 with its top bit set: negative as int64 bits


@pytest.mark.parametrize("dtype,a,b,want", [
    (DType.u16, [65535, 3], [1, 5], [0, 8]),
    (DType.u32, [2 ** 32 - 1, 3], [2, 5], [1, 8]),
    (DType.u64, [2 ** 64 - 1, TOP], [1, TOP], [0, 10]),
])
def test_unsigned_add_wraps(dtype, a, b, want):
    assert _binary(ops.add, dtype, a, b).tolist() == want


@pytest.mark.parametrize("dtype", [DType.u16, DType.u32, DType.u64], ids=lambda d: d.value)
def test_unsigned_subtract_wraps(dtype):
    out = _binary(ops.sub, dtype, [0, 9], [1, 4])
    assert out.tolist() == [2 ** (8 * dtype.itemsize) - 1, 5]


def test_uint64_orders_past_the_int64_range():
    assert _binary(ops.lt, DType.u64, [TOP, 1, TOP], [1, TOP, TOP]).tolist() == \
        [False, True, False]
    assert _binary(ops.maximum, DType.u64, [TOP, 1], [1, 2]).tolist() == [TOP, 2]


def test_uint64_division_past_the_int64_range():
    """torch has no uint64 division: tdag divides on int64 bits (shift, divide, correct)."""
    rng = np.random.default_rng(0)
    a = [int(v) for v in rng.integers(0, 2 ** 64, 64, dtype=np.uint64)] + [2 ** 64 - 1] * 4
    b = [int(v) >> int(s) for v, s in zip(rng.integers(1, 2 ** 64, 64, dtype=np.uint64),
                                          rng.integers(0, 64, 64))]
    b = [max(v, 1) for v in b] + [1, 2 ** 63, 2 ** 64 - 1, 3]
    assert _binary(ops.floor_divide, DType.u64, a, b).tolist() == \
        [x // y for x, y in zip(a, b)]
    assert _binary(ops.remainder, DType.u64, a, b).tolist() == [x % y for x, y in zip(a, b)]


def test_uint64_op_torch_lacks_names_op_type_and_framework():
    spec = tdag.TensorSpec((2,), "uint64")
    prog = tdag.trace(lambda a, b: ops.pow(a, b), spec, spec)
    with pytest.raises(UnsupportedOpError, match=r"pow on uint64: torch has no uint64 kernel"):
        tdag.to_torch(prog)
    args = [torch.tensor([TOP, 3], dtype=torch.uint64), torch.tensor([1, 2], dtype=torch.uint64)]
    with pytest.raises(UnsupportedOpError, match="pow on uint64"):
        tdag.run(prog, *args)


# -- casts to float8 --------------------------------------------------------------------------

SPECIAL = [1e6, float("inf"), float("-inf"), float("nan"), 464.0, 465.0, 0.3, -1e-7]


@pytest.mark.parametrize("dtype", sorted(FLOAT8 - {DType.f8e8m0fnu}, key=lambda d: d.value),
                         ids=lambda d: d.value)
def test_cast_to_float8_overflows_as_onnx_saturate_0(dtype):
    """tdag's cast does not saturate: as ml_dtypes (ONNX's reference) for every kind, though
    torch's own conversion saturates float8_e4m3fn."""
    prog = tdag.trace(lambda x: ops.cast(x, dtype), tdag.TensorSpec((len(SPECIAL),)))
    x = torch.tensor(SPECIAL)
    want = x.numpy().astype(getattr(ml_dtypes, _torch_name(dtype)))
    out = tdag.run(prog, x)
    _same_values(_numpy(out), want)
    _same(tdag.to_torch(prog)(x), out)
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [x.numpy()])
    _same_values(ort_out, want)


def _same_values(a: np.ndarray, b: np.ndarray) -> None:
    """Equal values and signs of zero; any NaN equals any NaN (their bits may differ)."""
    assert a.dtype == b.dtype
    a, b = a.astype(np.float64), b.astype(np.float64)
    assert np.array_equal(a, b, equal_nan=True), (a, b)
    assert np.array_equal(np.signbit(a[a == 0]), np.signbit(b[b == 0]))


def _cast_model(to: int, source: int = TensorProto.FLOAT, n: int = len(SPECIAL),
                **attrs) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", source, [n])],
                              [helper.make_tensor_value_info("y", to, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("source", [TensorProto.INT32, TensorProto.FLOAT8E5M2],
                         ids=["int32", "float8e5m2"])
def test_onnx_cast_saturate_from_integers_and_float8(source, saturate):
    """saturate applies to any source type: int32 1000 and float8e5m2 57344 become 448."""
    model = _cast_model(TensorProto.FLOAT8E4M3FN, source, 4, saturate=saturate)
    values = torch.tensor([1000.0, -3.0, 57344.0, 2.0])
    x = values.to(torch.int32 if source == TensorProto.INT32 else torch.float8_e5m2)
    out = tdag.run(tdag.from_onnx(model), x)
    (ort_out,) = _ort_run(model, [_numpy(x)])
    _same_values(_numpy(out), ort_out)
    assert (out.float()[0].item() == 448.0) == bool(saturate)


@pytest.mark.parametrize("saturate", [0, 1])
def test_onnx_cast_saturate_attribute(saturate):
    prog = tdag.from_onnx(_cast_model(TensorProto.FLOAT8E4M3FN, saturate=saturate))
    out = tdag.run(prog, torch.tensor(SPECIAL))
    values = out.float().tolist()
    if saturate:
        assert values[:3] == [448.0, 448.0, -448.0]
    else:
        assert all(v != v for v in values[:3])  # NaN: e4m3fn has no infinity
    assert values[3] != values[3]  # NaN stays NaN either way


# -- types no framework computes in -----------------------------------------------------------

@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1])
def test_packed_types_are_refused_by_name(elem):
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [4])],
                              [helper.make_tensor_value_info("y", elem, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    name = TensorProto.DataType.Name(elem)
    with pytest.raises(UnsupportedOpError, match=f"element type {name} .*packed sub-byte"):
        tdag.from_onnx(model)


def test_float8e8m0_needs_opset_24():
    prog = tdag.trace(lambda x: ops.cast(x, DType.f8e8m0fnu), tdag.TensorSpec((2,)))
    assert tdag.to_onnx(prog).opset_import[0].version == 24
    with pytest.raises(UnsupportedOpError, match="f8e8m0fnu .*needs ONNX opset 24"):
        tdag.to_onnx(prog, opset=20)


def test_uint64_right_shift_is_logical():
    """BitShift RIGHT of a uint64 with its top bit set shifts in zeros, though tdag computes
    it on int64 bits."""
    spec = [helper.make_tensor_value_info(n, TensorProto.UINT64, [4]) for n in ("x", "s")]
    node = helper.make_node("BitShift", ["x", "s"], ["y"], direction="RIGHT")
    graph = helper.make_graph([node], "g", spec,
                              [helper.make_tensor_value_info("y", TensorProto.UINT64, [4])])
    prog = tdag.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    x = torch.tensor([TOP, 2 ** 64 - 1, 8, TOP], dtype=torch.uint64)
    s = torch.tensor([1, 63, 3, 0], dtype=torch.uint64)
    out = tdag.run(prog, x, s)
    assert out.tolist() == [TOP >> 1, 1, 1, TOP]
    _same(tdag.to_torch(prog)(x, s), out)
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [x.numpy(), s.numpy()])
    assert ort_out.tolist() == out.tolist()


class _ToFloat8(torch.nn.Module):
    def forward(self, x, i):
        return x.to(torch.float8_e4m3fn), x.to(torch.float8_e5m2), i.to(torch.float8_e4m3fn)


def test_from_torch_keeps_torchs_float8_conversions():
    """torch saturates a conversion to float8_e4m3fn (not to e5m2); the imported program
    says so with a clamp before tdag's cast, and computes what torch does."""
    x = torch.tensor([1.0, 500.0, 0.3, float("inf"), float("nan"), -1e6])
    i = torch.tensor([3, 1000, -2000])
    prog = tdag.from_torch(_ToFloat8(), (x, i))
    for ours, theirs, module in zip(tdag.run(prog, x, i), _ToFloat8()(x, i),
                                    tdag.to_torch(prog)(x, i)):
        _same_values(_numpy(ours), _numpy(theirs))
        _same_values(_numpy(module), _numpy(theirs))


@pytest.mark.parametrize("kind,want", [("sum", (2 ** 64 - 1 + 2 ** 63 + 5) % 2 ** 64),
                                       ("max", 2 ** 64 - 1), ("min", 5)])
def test_uint64_reductions_past_the_int64_range(kind, want):
    """onnxruntime has no uint64 reductions and torch none either: both run on int64, with
    the top bit flipped for max / min and in 32-bit halves for a sum (int64 sums overflow)."""
    from tdag.deinops.reduce import Reduce, ReduceKind  # noqa: PLC0415
    from tdag.ir.op import Op  # noqa: PLC0415
    prog = tdag.trace(lambda x: x.builder.emit(Op.reduce, Reduce(ReduceKind(kind), (0,)), x),
                      tdag.TensorSpec((3,), "uint64"))
    x = torch.tensor([2 ** 64 - 1, 2 ** 63, 5], dtype=torch.uint64)
    out = tdag.run(prog, x)
    assert out.dtype == torch.uint64 and out.item() == want
    _same(tdag.to_torch(prog)(x), out)
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [x.numpy()])
    assert ort_out.dtype == np.uint64 and int(ort_out) == want


class _ViewBits(torch.nn.Module):
    def forward(self, x):
        return x.view(torch.int32) + 1, x.view(torch.uint8)


def test_from_torch_view_dtype_is_a_bitcast():
    x = torch.tensor([1.0, -2.5, float("nan")])
    with pytest.raises(UnsupportedOpError, match="view of f32 as u8, a type of another width"):
        tdag.from_torch(_ViewBits(), (x,))
    prog = tdag.from_torch(lambda_module(lambda x: x.view(torch.int32) + 1), (x,))
    assert torch.equal(tdag.run(prog, x), x.view(torch.int32) + 1)
    assert torch.equal(tdag.to_torch(prog)(x), x.view(torch.int32) + 1)


def lambda_module(fn) -> torch.nn.Module:
    class Wrapped(torch.nn.Module):
        def forward(self, x):
            return fn(x)
    return Wrapped()


def test_float_bitcast_needs_onnx_opset_26():
    from tdag.deinops.bitcast import bitcast  # noqa: PLC0415
    prog = tdag.trace(lambda x: bitcast(x, DType.i32), tdag.TensorSpec((2,)))
    x = torch.tensor([1.0, -0.0])
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [x.numpy()])
    assert ort_out.tolist() == x.view(torch.int32).tolist()
    with pytest.raises(UnsupportedOpError, match="needs ONNX opset 26"):
        tdag.to_onnx(prog, opset=21)
    ints = tdag.trace(lambda x: bitcast(x, DType.u16), tdag.TensorSpec((2,), "int16"))
    assert tdag.to_onnx(ints, opset=18).opset_import[0].version == 18  # a wrapping Cast


@pytest.mark.parametrize("dtype", [DType.u8, DType.i8, DType.u16], ids=lambda d: d.value)
def test_small_integer_pow_wraps_everywhere(dtype):
    """ONNX's Pow takes no 8-bit integer: int32 carries it on onnxruntime."""
    out = _binary(ops.pow, dtype, [7, 2, 3], [7, 9, 2])
    bits = 8 * dtype.itemsize
    want = [pow(a, b, 2 ** bits) for a, b in [(7, 7), (2, 9), (3, 2)]]
    if dtype is DType.i8:
        want = [v - 256 if v > 127 else v for v in want]
    assert out.tolist() == want


def test_uint64_pow_is_a_clear_onnx_error():
    spec = tdag.TensorSpec((2,), "uint64")
    prog = tdag.trace(lambda a, b: ops.pow(a, b), spec, spec)
    with pytest.raises(UnsupportedOpError, match="pow on uint64: ONNX's Pow takes no uint64"):
        tdag.to_onnx(prog)


WEIGHTS = [(TensorProto.FLOAT8E4M3FN, [1.0, -2.5, 448.0]), (TensorProto.FLOAT8E5M2FNUZ,
                                                            [1.0, -3.0, 57344.0]),
           (TensorProto.FLOAT8E8M0, [1.0, 4.0, 0.5]), (TensorProto.UINT16, [1, 65535, 7]),
           (TensorProto.UINT32, [1, 2 ** 32 - 1, 7]), (TensorProto.UINT64, [1, 2 ** 64 - 1, 7])]


@pytest.mark.parametrize("raw", [False, True], ids=["typed_fields", "raw_data"])
@pytest.mark.parametrize("elem,values", WEIGHTS,
                         ids=[TensorProto.DataType.Name(e) for e, _ in WEIGHTS])
def test_onnx_initializers_of_each_storage_form(elem, values, raw):
    """An initializer in int32_data / uint64_data (float8 and uint16 as int32 bits) or in
    raw_data reads the same; the re-emitted model (raw_data) gives it back."""
    dtype = DType.of(_torch_name_of_onnx(elem))
    expected = torch.tensor(values, dtype=torch.float64 if dtype.is_float else torch.uint64) \
        .to(dtype.torch)
    stored = _numpy(expected).tobytes() if raw else values
    init = helper.make_tensor("w", elem, [3], stored, raw=raw)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", elem, [3])], initializer=[init])
    prog = tdag.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]))
    _same(tdag.run(prog), expected)
    (ort_out,) = _ort_run(tdag.to_onnx(prog), [])
    _same(ort_out, expected)


def _torch_name_of_onnx(elem: int) -> str:
    from tdag.canonicalize.onnx.load import ONNX_TO_DTYPE  # noqa: PLC0415
    return _torch_name(ONNX_TO_DTYPE[elem])


_TEXT = """tdag main(%x: T[2]) {
  const %c0: T[2] = V
  %1: T[2] = add(%x, %c0)
  return %1
}

program(%x: T[2]) {
  %out0 = call main(%x)
  return %out0
}
"""


@pytest.mark.parametrize("dtype,values,ok", [
    ("u64", "[18446744073709551615, 9223372036854775808]", True),
    ("i64", "[-9223372036854775808, 0]", True),
    ("u8", "[-1, 0]", False),
    ("u16", "[70000, 0]", False),
    ("i64", "[9223372036854775808, 0]", False),
    ("u64", "[18446744073709551616, 0]", False),
])
def test_inline_integers_must_fit_their_type(dtype, values, ok):
    text = _TEXT.replace("T", dtype).replace("V", values)
    if ok:
        prog = tdag.parse(text)
        assert str(prog).count(values) == 1 and tdag.parse(str(prog)) == prog
    else:
        with pytest.raises(tdag.errors.FileFormatError, match="line 2"):
            tdag.parse(text)


def test_constant_folding_computes_as_the_interpreter():
    """Folding runs each node as tdag.run does: float8_e4m3fn overflow is NaN (torch's own
    conversion would fold 448), uint32 sums wrap (torch has no uint32 add)."""
    from tdag.refine.constants import fold_constants  # noqa: PLC0415

    def fn(x):
        big = ops.cast(ops.const(torch.tensor([1e6, 2.0])), DType.f8e4m3fn)
        wrapped = ops.add(ops.const(torch.tensor([2 ** 32 - 1, 7], dtype=torch.uint32)),
                          ops.const(torch.tensor([3, 1], dtype=torch.uint32)))
        return ops.add(ops.cast(big, "float32"), x), ops.add(wrapped, ops.cast(x, "uint32"))
    prog = tdag.trace(fn, tdag.TensorSpec((2,)))
    folded, changed = fold_constants(prog.graphs["main"])
    assert changed
    values = [w.value for w in folded.weights.values() if w.value.dtype in
              (torch.float8_e4m3fn, torch.uint32) and w.value.tolist() != [3, 1]]
    assert any(v.dtype == torch.uint32 and v.tolist() == [2, 8] for v in values)
    assert any(v.dtype == torch.float8_e4m3fn and v.float().isnan().tolist() == [True, False]
               for v in values)


def test_literal_operand_through_a_float8_cast():
    """The torch code writes a broadcast const as a Python literal, through the casts that
    lead to it: tdag's, so 1e6 cast to float8_e4m3fn is NaN there as in tdag.run."""
    def fn(x):
        big = ops.cast(ops.full((3,), 1e6, DType.f32, like=x), DType.f8e4m3fn)
        return ops.mul(x, ops.cast(big, "float32"))
    prog = tdag.trace(fn, tdag.TensorSpec((3,)))
    x = torch.ones(3)
    assert tdag.run(prog, x).isnan().all() and tdag.to_torch(prog)(x).isnan().all()


def test_roofline_peaks_of_the_new_types():
    """Datasheets list one float8 rate ("f8") and int8's for uint8 too."""
    from tdag.refine.cost.roofline import DEVICES  # noqa: PLC0415
    h100 = DEVICES["h100-sxm"]
    assert h100.peak("f8e4m3fn") == h100.peak("f8e5m2") == h100.peak_flops["f8"]
    assert h100.peak("u8") == h100.peak_flops["i8"]
    assert h100.peak("u32") == h100.peak_flops["f32"]  # not listed: the f32 rate


@pytest.mark.parametrize("dtype", [DType.u8, DType.u32, DType.u64], ids=lambda d: d.value)
def test_abs_of_unsigned_is_itself(dtype):
    values = [3, 2 ** (8 * dtype.itemsize) - 1, 0]
    assert _binary(lambda a, b: ops.add(ops.abs(a), b), dtype, values, [0, 0, 0]).tolist() == \
        values
