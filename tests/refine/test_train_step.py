"""tdag.train_step: a training step as one Program, run through to_torch, to_onnx (a stock
onnxruntime, the state fed back from the ``.next`` outputs) and to_jax, equal to torch's own
loop (``loss.backward(); optimizer.step()``) at every step, within 1e-5 relative.
"""
from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tdag

STEPS = 20
RELATIVE = 1e-5


class RegressionLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 3))

    def forward(self, x, y):
        return (self.net(x) - y).pow(2).mean()


def _torch_losses(model, optimizer, batches) -> list[float]:
    losses = []
    for k in range(STEPS):
        optimizer.zero_grad()
        loss = model(*batches[k % len(batches)])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _onnx_losses(step: tdag.Program, batches) -> list[float]:
    model = tdag.to_onnx(step)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    batch_names = [v.name for v in step.main.inputs]
    outputs = [o.name for o in session.get_outputs()]
    state = {name: w.value.numpy() for name, w in step.state.items()}
    losses = []
    for k in range(STEPS):
        feed = dict(zip(batch_names, (t.numpy() for t in batches[k % len(batches)])))
        results = dict(zip(outputs, session.run(None, {**feed, **state})))
        losses.append(float(results[outputs[0]]))
        state.update({n.removesuffix(".next"): v for n, v in results.items()
                      if n.endswith(".next")})
    return losses


def _jax_losses(step: tdag.Program, batches) -> list[float]:
    jnp = pytest.importorskip("jax.numpy")
    fn = tdag.to_jax(step)
    state, losses = {}, []
    for k in range(STEPS):
        arrays = [jnp.asarray(t.numpy()) for t in batches[k % len(batches)]]
        loss, state = fn(*arrays, state=state, return_state=True)
        losses.append(float(loss))
    return losses


def _torch_module_losses(step: tdag.Program, batches) -> list[float]:
    module = tdag.to_torch(step)
    return [module(*batches[k % len(batches)]).item() for k in range(STEPS)]


def _assert_close(got, want, what):
    errors = [abs(a - b) / abs(b) for a, b in zip(got, want)]
    assert max(errors) <= RELATIVE, f"{what}: worst step {int(np.argmax(errors))}, " \
        f"relative error {max(errors):.2e}"


def test_adamw_gpt2_language_model_matches_torch_in_every_framework():
    transformers = pytest.importorskip("transformers")
    from support.grad_models import CrossEntropyLM
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=32, attn_implementation="eager")
    model = CrossEntropyLM(transformers.GPT2LMHeadModel(config)).eval()
    batches = [(torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8)))
               for _ in range(4)]
    reference = copy.deepcopy(model)
    want = _torch_losses(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2),
                         batches)
    step = tdag.train_step(tdag.from_torch(model, batches[0]), tdag.optim.AdamW(lr=1e-2))
    _assert_close(_torch_module_losses(step, batches), want, "to_torch")
    _assert_close(_onnx_losses(step, batches), want, "to_onnx")
    _assert_close(_jax_losses(step, batches), want, "to_jax")


@pytest.mark.parametrize("settings", [
    dict(lr=0.05),
    dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
    dict(lr=0.05, momentum=0.9, dampening=0.1),
    dict(lr=0.05, momentum=0.9, nesterov=True),
], ids=["plain", "momentum-decay", "dampening", "nesterov"])
def test_sgd_matches_torch(settings):
    torch.manual_seed(0)
    model = RegressionLoss().eval()
    batches = [(torch.randn(5, 6), torch.randn(5, 3)) for _ in range(3)]
    reference = copy.deepcopy(model)
    want = _torch_losses(reference, torch.optim.SGD(reference.parameters(), **settings),
                         batches)
    step = tdag.train_step(tdag.from_torch(model, batches[0]), tdag.optim.SGD(**settings))
    _assert_close(_torch_module_losses(step, batches), want, "to_torch")
    state, got = None, []
    for k in range(STEPS):
        loss, state = tdag.run(step, *batches[k % 3], state=state, return_state=True)
        got.append(loss.item())
    _assert_close(got, want, "tdag.run")


def test_state_holds_parameters_slots_and_step():
    torch.manual_seed(0)
    model = RegressionLoss().eval()
    step = tdag.train_step(tdag.from_torch(model, (torch.randn(5, 6), torch.randn(5, 3))),
                           tdag.optim.AdamW())
    names = [n for n, _ in model.named_parameters()]
    assert set(step.state) == set(names) | {f"adamw.{s}.{n}" for n in names
                                            for s in ("exp_avg", "exp_avg_sq")} | {"adamw.step"}
    assert step.main.outputs and len(step.main.outputs) == 1



def test_adamw_lstm_tagger_trains_through_its_loop():
    """A program with a Loop: its TDAGs read the parameters from the state, and one update
    after the gradient program writes them back."""
    from support.grad_models import Tagger

    torch.manual_seed(0)
    model = Tagger().eval()
    batches = [(torch.randint(0, 20, (2, 6)), torch.randint(0, 5, (2, 6))) for _ in range(3)]
    reference = copy.deepcopy(model)
    want = _torch_losses(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2),
                         batches)
    step = tdag.train_step(tdag.from_torch(model, batches[0]), tdag.optim.AdamW(lr=1e-2))
    tdag.verify(step)
    assert any(isinstance(s, tdag.Loop) for s in step.main.steps)
    _assert_close(_torch_module_losses(step, batches), want, "to_torch")
    _assert_close(_onnx_losses(step, batches), want, "to_onnx")
