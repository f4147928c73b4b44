"""The main job: ``python -m tdag.demo``.

On TinyViT (a small vision transformer shipped in tdag.models, random weights): import it from
torch, check the Program against eager, report its cost beside torch's flop counter, extract a
transformer block and run it standalone, export to ONNX (run on onnxruntime, and imported back
with from_onnx) and back to torch, and check every result against the original; last, write
the program as a page (graph.html, what ``tdag show -o`` writes). Exits non-zero if any check
fails.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import onnx
import onnxruntime as ort
import torch
from torch.utils.flop_counter import FlopCounterMode

import tdag
from tdag.models import tiny_vit
from tdag.view import write_page

RTOL, ATOL = 1e-4, 1e-5


def _check(label: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    err = (got - want).abs().max().item()
    ok = torch.allclose(got, want, rtol=RTOL, atol=ATOL)
    print(f"  {'ok  ' if ok else 'FAIL'} {label}: max abs error {err:.2e}")
    return ok


def _step(title: str) -> float:
    print(f"\n== {title}")
    return time.perf_counter()


def _done(start: float) -> None:
    print(f"  ({time.perf_counter() - start:.2f} s)")


def main(out_dir: str | None = None) -> int:
    model, (images,) = tiny_vit()
    with torch.no_grad():
        expected = model(images)
    out_dir = out_dir or tempfile.mkdtemp(prefix="tdag-demo-")
    os.makedirs(out_dir, exist_ok=True)
    ok = True

    t = _step("1. import: tdag.from_torch(TinyViT, dynamic_batch=True)")
    prog = tdag.from_torch(model, (images,), dynamic_batch=True)
    tdag.verify(prog)
    print(f"  {prog.num_nodes} primitive nodes, {len(prog.graph.weights)} weights, "
          f"inputs {[str(v.type) for v in prog.inputs]}")
    ok &= _check("tdag.run vs eager (batch 2)", tdag.run(prog, images), expected)
    other = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        ok &= _check("tdag.run vs eager (batch 5)", tdag.run(prog, other), model(other))
    _done(t)

    t = _step("2. cost: tdag.cost(prog)")
    report = tdag.cost(prog)
    print("\n".join("  " + line for line in report.table(by="layer", depth=2).splitlines()))
    batch_symbol = str(prog.inputs[0].type.shape[0])  # the dynamic batch dimension's name
    sizes = report.evaluate(**{batch_symbol: 2})
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    # FlopCounterMode does not see scaled_dot_product_attention on CPU; count it by hand:
    # per block, q @ k^T and attn @ v each cost 2 * batch * heads * tokens^2 * head_dim.
    batch, heads, tokens, dim = 2, 4, 64, 64
    attention = len(model.blocks) * 2 * (2 * batch * heads * tokens * tokens * (dim // heads))
    print(f"  matmul flops at batch 2: tdag {sizes['matmul_flops']:,} | torch FlopCounterMode "
          f"{counter.get_total_flops():,} + attention it misses {attention:,}")
    ok &= sizes["matmul_flops"] == counter.get_total_flops() + attention
    _done(t)

    t = _step("3. extract: tdag.extract(prog, scope='blocks.1')")
    block = tdag.extract(prog, scope="blocks.1")
    tdag.verify(block)
    captured = {}
    handle = model.blocks[1].register_forward_hook(
        lambda m, args, out: captured.update(x=args[0], y=out))
    with torch.no_grad():
        model(images)
    handle.remove()
    print(f"  block: {block.num_nodes} nodes, {len(block.graph.weights)} weights, "
          f"inputs {[str(v.type) for v in block.inputs]}")
    ok &= _check("extracted block vs the block inside the model",
                 tdag.run(block, captured["x"]), captured["y"])
    block_path = os.path.join(out_dir, "block1.tdag")
    tdag.save(block, block_path)
    ok &= _check("saved + loaded block", tdag.run(tdag.load(block_path), captured["x"]),
                 captured["y"])
    _done(t)

    t = _step("4. export: tdag.to_onnx(prog) on onnxruntime")
    onnx_path = os.path.join(out_dir, "tiny_vit.onnx")
    onnx_model = tdag.to_onnx(prog)
    onnx.checker.check_model(onnx_model, full_check=True)
    onnx.save(onnx_model, onnx_path)
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for batch in (images, other):
        with torch.no_grad():
            want = model(batch)
        got = torch.from_numpy(session.run(None, {name: batch.numpy()})[0])
        ok &= _check(f"onnxruntime vs eager (batch {batch.shape[0]})", got, want)
    print(f"  wrote {onnx_path}")
    reimported = tdag.from_onnx(onnx_path)
    tdag.verify(reimported)
    ok &= _check("tdag.from_onnx(that file) vs eager (batch 5)", tdag.run(reimported, other),
                 model(other).detach())
    _done(t)

    t = _step("5. export: tdag.to_torch(prog)")
    module = tdag.to_torch(prog)
    module.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        ok &= _check("reified module vs eager", module(images), expected)
    same_names = set(model.state_dict()) <= set(module.state_dict())
    print(f"  {'ok  ' if same_names else 'FAIL'} state_dict keys kept: "
          f"{len(model.state_dict())} of {len(model.state_dict())}" if same_names else
          f"  FAIL missing keys: {sorted(set(model.state_dict()) - set(module.state_dict()))[:5]}")
    ok &= same_names
    _done(t)

    t = _step("6. look at it: tdag.view.write_page (tdag show model -o graph.html)")
    page_path = os.path.join(out_dir, "graph.html")
    size = write_page(prog, page_path, "TinyViT")
    print(f"  wrote {page_path} ({size / 1024:.0f} KB, self-contained: open it in a browser)")
    _done(t)

    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'}; files in {out_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
