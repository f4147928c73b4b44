"""``tdag grad`` and ``tdag train-step`` on .pt2, .onnx and .tdag files: the written
gradient program on onnxruntime equals torch.autograd (1e-4 relative to the largest
gradient), and the written step, run on onnxruntime with its ``.next`` outputs fed back,
gives torch.optim's losses (1e-5 relative)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import tdag
from tdag.cli import main

STEPS = 3


class ClassifierLoss(torch.nn.Module):
    """A tiny classifier's cross-entropy on integer labels (which get no gradient)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16),
                                       torch.nn.GELU(), torch.nn.Linear(16, 3))

    def forward(self, x, labels):
        return torch.nn.functional.cross_entropy(self.net(x), labels)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same model as .pt2 (torch.export.save), .onnx (torch.onnx.export) and .tdag."""
    torch.manual_seed(0)
    model = ClassifierLoss().eval()
    batches = [(torch.randn(5, 6), torch.randint(0, 3, (5,))) for _ in range(STEPS)]
    folder = tmp_path_factory.mktemp("cli_train")
    paths = {suffix: folder / f"model.{suffix}" for suffix in ("pt2", "onnx", "tdag")}
    exported = torch.export.export(model, batches[0])
    torch.export.save(exported, str(paths["pt2"]))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, batches[0], str(paths["onnx"]), input_names=["x", "labels"],
                          dynamo=False)
    tdag.save(tdag.from_torch(exported), str(paths["tdag"]))
    return paths, model, batches


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the state inputs are initializers too: a warning each
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("suffix", ["pt2", "onnx", "tdag"])
def test_grad_file_matches_torch_autograd(files, suffix, tmp_path):
    paths, model, batches = files
    out = tmp_path / "grad.onnx"
    assert main(["grad", str(paths[suffix]), "-o", str(out)]) == 0
    session = _session(out)
    x, y = batches[0]
    got = dict(zip((o.name for o in session.get_outputs()),
                   session.run(None, {"x": x.numpy(), "labels": y.numpy()})))
    reference = copy.deepcopy(model)
    loss = reference(x, y)
    loss.backward()
    np.testing.assert_allclose(got[session.get_outputs()[0].name], loss.item(), rtol=1e-5)
    grads = {n: p.grad for n, p in reference.named_parameters()}
    assert sorted(n for n in got if n.startswith("grad.")) == sorted(f"grad.{n}" for n in grads)
    for name, want in grads.items():
        error = np.abs(got[f"grad.{name}"] - want.numpy()).max()
        assert error <= 1e-4 * want.abs().max().item(), (name, error)


def test_grad_summary_and_tdag_output(files, tmp_path, capsys):
    paths, model, batches = files
    assert main(["grad", str(paths["onnx"])]) == 0
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    assert f"{len(params)} gradient(s) of {count} value(s) (net.0.weight" in \
        capsys.readouterr().out
    out = tmp_path / "grad.tdag"
    assert main(["grad", str(paths["pt2"]), "--wrt", "x", "-o", str(out)]) == 0
    x = batches[0][0].clone().requires_grad_(True)
    model(x, batches[0][1]).backward()
    _, dx = tdag.run(tdag.load(str(out)), *batches[0])
    torch.testing.assert_close(dx, x.grad, rtol=1e-4, atol=1e-6)


def _torch_losses(model, optimizer, batches) -> list[float]:
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _onnx_losses(path, batches) -> list[float]:
    """The step as a user runs it: the state starts at the file's initializers that the
    session lets a caller override, and each ``<name>.next`` output feeds ``<name>``."""
    session = _session(path)
    initial = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    state = {i.name: initial[i.name] for i in session.get_overridable_initializers()}
    outputs = [o.name for o in session.get_outputs()]
    losses = []
    for x, y in batches:
        results = dict(zip(outputs, session.run(None, {"x": x.numpy(), "labels": y.numpy(),
                                                       **state})))
        losses.append(float(results[outputs[0]]))
        state.update({n.removesuffix(".next"): v for n, v in results.items()
                      if n.endswith(".next")})
    return losses


OPTIMIZERS = {
    "adamw": (["--optimizer", "adamw", "--lr", "1e-2", "--betas", "0.8", "0.99"],
              lambda params: torch.optim.AdamW(params, lr=1e-2, betas=(0.8, 0.99))),
    "sgd": (["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay",
             "1e-2"],
            lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-2)),
}


@pytest.mark.parametrize("suffix, optimizer", [("pt2", "adamw"), ("onnx", "adamw"),
                                               ("tdag", "adamw"), ("onnx", "sgd")])
def test_train_step_file_matches_torch_optim(files, suffix, optimizer, tmp_path):
    paths, model, batches = files
    flags, make = OPTIMIZERS[optimizer]
    out = tmp_path / "step.onnx"
    assert main(["train-step", str(paths[suffix]), *flags, "-o", str(out)]) == 0
    reference = copy.deepcopy(model)
    want = _torch_losses(reference, make(reference.parameters()), batches)
    got = _onnx_losses(out, batches)
    assert got[0] != got[-1]  # the state was fed back: the steps trained
    np.testing.assert_allclose(got, want, rtol=1e-5)


class Scores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x), self.fc(x).square().sum()


class NoParameters(torch.nn.Module):
    def forward(self, x):
        return (x * x).sum()


@pytest.mark.parametrize("module, argv, message", [
    (Scores, ["grad"], "output 'out0' of "),
    (Scores, ["grad", "--loss", "2"], "--loss 2: "),
    (NoParameters, ["grad"], "no floating-point parameters; name inputs to differentiate "
                             "with --wrt NAME"),
    (NoParameters, ["train-step", "--optimizer", "sgd", "-o", "step.onnx"],
     "no floating-point parameters"),
    (Scores, ["train-step", "--optimizer", "sgd", "--loss", "1", "--eps", "1e-6", "-o",
              "step.onnx"], "--eps is not a setting of sgd"),
], ids=["not-a-scalar", "no-such-output", "no-parameters", "no-parameters-step",
        "other-optimizer-flag"])
def test_errors_are_one_line(module, argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a wrongly accepted -o step.onnx would go
    path = tmp_path / "model.tdag"
    tdag.save(tdag.from_torch(module().eval(), (torch.randn(3, 4),)), str(path))
    command, *flags = argv
    assert main([command, str(path), *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_unknown_optimizer_is_a_usage_error(files, capsys):
    paths, _, _ = files
    with pytest.raises(SystemExit) as exit_:
        main(["train-step", str(paths["tdag"]), "--optimizer", "adam", "-o", "step.onnx"])
    assert exit_.value.code == 2
    assert "invalid choice: 'adam'" in capsys.readouterr().err
