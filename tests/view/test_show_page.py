"""The program page (``tdag show FILE -o graph.html``), opened in a real headless browser.

The page runs its own check when opened at ``#selftest``: it clicks a closed group, switches
the colours to bytes and back, searches a node in the deepest scope, and writes what happened
(and any script error) into ``<pre id="selftest">``, which ``chromium --dump-dom`` prints.
A screenshot must not be blank. Without a chromium binary the browser tests skip; the page's
data is checked either way.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections import Counter

import pytest
import torch

import tdag
from tdag import ops
from support.io_programs import control_program
from tdag.cli import main as cli_main
from tdag.ir.program import all_steps
from tdag.models import tiny_vit
from tdag.refine.cost.report import cost as cost_of_primitives
from tdag.view.page import CHUNK, page_data, page_html, write_page

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                               "google-chrome"))), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium binary on PATH "
                                   "(Debian: apt-get install chromium)")
MAX_BYTES = 5_000_000  # a 32-layer Llama's page stays under 5 MB


@pytest.fixture(scope="module")
def demo():
    model, args = tiny_vit()
    return tdag.from_torch(model, args, dynamic_batch=True)


@pytest.fixture(scope="module")
def llama32():
    """A Llama with 7B's shapes and 32 layers, on the meta device: no weights in memory."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=32, hidden_size=4096,
                                      intermediate_size=11008, num_attention_heads=32,
                                      num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = model

        def forward(self, ids):
            return self.llama(ids, use_cache=False).logits

    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    return tdag.from_torch(Logits().eval(), (ids,))


def _browser(*flags: str, url: str) -> str:
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=10000", *flags, url],
                          capture_output=True, text=True, timeout=180)
    return done.stdout


def selftest(path) -> dict:
    dom = _browser("--dump-dom", url=path.as_uri() + "#selftest")
    found = re.search(r'<pre id="selftest">(.*?)</pre>', dom, re.S)
    assert found, f"the page wrote no self-test result: {dom[-500:]!r}"
    return json.loads(html.unescape(found.group(1)))


def screenshot_colours(path, tmp_path) -> int:
    image = pytest.importorskip("PIL.Image")
    png = tmp_path / "page.png"
    _browser(f"--screenshot={png}", "--window-size=1200,800", "--hide-scrollbars",
             url=path.as_uri())
    with image.open(png) as shot:
        return len(shot.convert("RGB").getcolors(maxcolors=1 << 24))


def check_opens_expands_and_finds(path, tmp_path, tensors: int) -> dict:
    result = selftest(path)
    assert result["errors"] == []
    assert result["tensors"] == tensors
    expand = result["expand"]
    assert expand["open"] and expand["shownAfter"] > result["shownAtStart"], expand
    assert result["colour"]["changed"]  # the switch to bytes recolours the boxes
    search = result["search"]
    assert search["found"] and search["panel"], search
    assert screenshot_colours(path, tmp_path) > 50  # boxes, text, colours: not a blank page
    return result


def _tensors(prog) -> int:
    return sum(len(g.inputs) + len(g.weights) + len(g.nodes) for g in prog.graphs.values())


def test_page_data_is_the_program(demo):
    data = page_data(demo, batch=4)
    (graph,) = data["graphs"]
    nodes = graph["nodes"]
    g = demo.graph
    assert len(nodes["name"]) == _tensors(demo)
    assert set(nodes["name"]) == {v.name for v in g.inputs} | set(g.weights) | \
        {n.name for n in g.nodes}
    report = cost_of_primitives(demo).evaluate(batch=4)  # the nodes as captured, op by op
    assert sum(nodes["flops"]) == data["total"]["flops"] == report.flops
    assert sum(nodes["bytes_read"]) + sum(nodes["bytes_written"]) == report.bytes
    assert data["sizes"] == {"batch": 4}
    # each node's inputs, by index; its provenance and type through the string table
    index = {name: i for i, name in enumerate(nodes["name"])}
    for node in g.nodes:
        i = index[node.name]
        assert [nodes["name"][j] for j in nodes["in"][i]] == list(node.inputs)
        assert data["strings"][nodes["prov"][i]] == str(node.origin)
        assert data["strings"][nodes["type"][i]] == str(node.type)
    # a scope with nothing of its own and one child is shown as that child: blocks.0.attn
    labels = graph["scopes"]["label"]
    assert "patch_embed" in labels and "attn" in labels


def _flat(steps: int):
    """A program with no module scopes: 5 * steps nodes in one chain."""
    def chain(x):
        for _ in range(steps):
            x = ops.exp(x) * 0.5 + x
        return x
    return tdag.trace(chain, tdag.TensorSpec((4, 8)))


def test_a_program_without_scopes_opens_in_chunks(tmp_path):
    prog = _flat(300)
    (graph,) = page_data(prog)["graphs"]
    own = Counter(graph["nodes"]["scope"])
    assert max(own.values()) <= CHUNK < len(prog.graph.nodes)
    labels, parents = graph["scopes"]["label"], graph["scopes"]["parent"]
    chunks = [s for s, p in enumerate(parents) if p == 0]
    assert [labels[s] for s in chunks[:2]] == ["tensors 1-100", "tensors 101-200"]
    if BROWSER is not None:
        path = tmp_path / "flat.html"
        write_page(prog, str(path))
        check_opens_expands_and_finds(path, tmp_path, _tensors(prog))


def test_page_is_self_contained(demo):
    text = page_html(demo)
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert "fetch(" not in text and "XMLHttpRequest" not in text


@needs_browser
def test_demo_page_opens_expands_and_finds(demo, tmp_path):
    path = tmp_path / "demo.html"
    write_page(demo, str(path), "TinyViT")
    check_opens_expands_and_finds(path, tmp_path, _tensors(demo))


# in the default run (about 15 s, most of it the capture): the must-show page
def test_llama_32_layers_page_is_under_5_mb(llama32, tmp_path):
    path = tmp_path / "llama.html"
    size = write_page(llama32, str(path), "Llama, 32 layers, 7B shapes (meta)")
    assert size == path.stat().st_size < MAX_BYTES
    if BROWSER is not None:
        result = check_opens_expands_and_finds(path, tmp_path, _tensors(llama32))
        # collapsed at start: a few boxes of thousands of tensors
        assert result["shownAtStart"] < 100 < result["tensors"]


@needs_browser
def test_controllers_and_several_tdags(tmp_path):
    prog = control_program()
    path = tmp_path / "control.html"
    write_page(prog, str(path))
    result = selftest(path)
    assert result["errors"] == [] and result["tensors"] == _tensors(prog)
    assert result["search"]["found"]
    # a frame for the controllers and one per TDAG; a box per controller, nested ones too
    assert result["frames"] == 1 + len(prog.graphs)
    assert result["controllers"] == len(list(all_steps(prog.main))) > len(prog.main.steps)


def test_cli_show_writes_the_page(demo, tmp_path):
    source, page = tmp_path / "demo.tdag", tmp_path / "demo.html"
    tdag.save(demo, str(source))
    assert cli_main(["show", str(source), "-o", str(page), "--size", "batch=8"]) == 0
    assert json.loads(re.search(r'<script id="program" type="application/json">(.*?)</script>',
                                page.read_text(), re.S).group(1))["sizes"] == {"batch": 8}
    if BROWSER is not None:
        assert selftest(page)["errors"] == []
    assert cli_main(["show", str(source), "-o", str(tmp_path / "demo.txt")]) == 1


def _training_step():
    torch.manual_seed(0)
    weights = [torch.randn(32, 32) / 6 for _ in range(2)]

    def fn(x):
        for i, w in enumerate(weights):
            x = ops.tanh(x @ ops.param(f"w{i}", w))
        return ops.sum(x)
    return tdag.train_step(tdag.trace(fn, tdag.TensorSpec((64, 32))), tdag.optim.SGD(lr=0.1))


def test_page_data_marks_the_memory_peak_and_its_live_set():
    step = _training_step()
    report = tdag.memory(step)
    data = page_data(step, memory=report)
    graph_index, row = data["memory"]["at"]
    nodes = data["graphs"][graph_index]["nodes"]
    assert f"{data['graphs'][graph_index]['name']}:{nodes['name'][row]}" == report.peak_at
    assert data["memory"]["peak"] == data["total"]["memory"] == report.peak
    shown = sum(sum(g["nodes"]["live"]) for g in data["graphs"])
    live = {x.name: x.bytes for x in report.live_at_peak}
    marked = {n: b for g in data["graphs"] for n, b in zip(g["nodes"]["name"], g["nodes"]["live"])
              if b}
    assert marked and all(live[n] == b for n, b in marked.items())
    # what no row shows is a value only the lowered program has (a kernel's own)
    missing = sum(b for n, b in live.items() if n not in marked)
    assert shown + missing == report.peak and data["memory"]["unmatched"] == \
        len(live) - len(marked)
    assert "memory" not in page_data(step)  # no report given: no memory colouring


@needs_browser
def test_the_memory_colouring_outlines_the_peak(tmp_path):
    step = _training_step()
    path = tmp_path / "step.html"
    write_page(step, str(path), memory=tdag.memory(step))
    result = selftest(path)
    assert result["errors"] == [] and result["memory"]["peak"] and result["memory"]["changed"]


def test_cli_show_page_has_the_memory_peak(tmp_path):
    source, page = tmp_path / "step.tdag", tmp_path / "step.html"
    tdag.save(_training_step(), str(source))
    assert cli_main(["show", str(source), "-o", str(page)]) == 0
    data = json.loads(re.search(r'<script id="program" type="application/json">(.*?)</script>',
                                page.read_text(), re.S).group(1))
    assert data["memory"]["peak"] == tdag.memory(tdag.load(str(source))).peak
