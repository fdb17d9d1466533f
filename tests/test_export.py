"""ONNX export: ONNX Runtime matches PyTorch (max abs diff <= 1e-4) at two batch/sequence sizes, with padding."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
ort = pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from bertforge.cli import app  # noqa: E402
from bertforge.export import INPUTS, check_onnx, export_onnx, onnx_session, sample_inputs  # noqa: E402
from bertforge.model import (  # noqa: E402
    BertConfig,  # noqa: E402
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertModel,
)

TOLERANCE = 1e-4


def _config() -> BertConfig:
    return BertConfig.from_preset("tiny", vocab_size=500, max_position_embeddings=96)


def _symbolic_dims(path: Path) -> dict[str, list[str | int]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


@pytest.mark.slow
def test_qa_parity_at_two_sizes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = BertForQuestionAnswering(_config()).eval()
    out = tmp_path / "qa.onnx"
    result = export_onnx(model, out, check=False)
    assert result.outputs == ["start_logits", "end_logits"]
    dims = _symbolic_dims(out)
    assert set(dims) == set(INPUTS)
    for name in INPUTS:  # both axes of every input are symbolic, not baked-in numbers
        assert all(isinstance(d, str) and d for d in dims[name]), dims

    session = onnx_session(out, threads=1)
    for seed, (batch, length) in enumerate([(1, 9), (5, 61)]):
        inputs = sample_inputs(model, batch=batch, length=length, seed=seed)
        assert inputs["attention_mask"].min() == 0  # padding is present, so the mask path is exercised
        assert check_onnx(model, out, inputs, session) <= TOLERANCE
    # an unpadded batch too: the exported graph always builds the (all-zero) padding bias
    full = sample_inputs(model, batch=2, length=30, seed=9)
    full["attention_mask"].fill_(1)
    assert check_onnx(model, out, full, session) <= TOLERANCE
    # the model itself is left as it was (fast path back on)
    assert all(getattr(m, "unpad", True) for m in model.modules())


@pytest.mark.slow
def test_multiple_choice_has_three_dynamic_axes(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = BertForMultipleChoice(_config()).eval()
    result = export_onnx(model, tmp_path / "mc.onnx")
    assert result.dynamic_axes["input_ids"] == ["batch", "choices", "sequence"]
    assert result.max_abs_diff is not None and result.max_abs_diff <= TOLERANCE
    assert {s[1] for s in result.checked_shapes} == {3, 2}  # two numbers of choices
    assert len({s[2] for s in result.checked_shapes}) == 2  # two lengths


@pytest.mark.slow
def test_cli_export_of_a_checkpoint_dir(tmp_path: Path) -> None:
    torch.manual_seed(2)
    BertModel(_config()).save_pretrained(tmp_path / "encoder")
    out = tmp_path / "encoder.onnx"
    runner = CliRunner()
    result = runner.invoke(app, ["export-onnx", "--model", str(tmp_path / "encoder"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "last_hidden_state, pooled_output" in result.output and "max abs diff" in result.output
    model = BertModel.from_pretrained(tmp_path / "encoder").eval()
    session = onnx_session(out)
    for seed, (batch, length) in enumerate([(2, 12), (4, 33)]):
        assert check_onnx(model, out, sample_inputs(model, batch=batch, length=length, seed=seed), session) <= TOLERANCE

    bad = runner.invoke(app, ["export-onnx", "--model", str(tmp_path / "missing"), "--out", str(out)])
    assert bad.exit_code == 2 and "no config.json" in bad.output
    wrong = runner.invoke(app, ["export-onnx", "--model", str(tmp_path / "encoder"), "--out", str(tmp_path / "x.txt")])
    assert wrong.exit_code == 2 and ".onnx" in wrong.output


def test_unknown_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot export Linear"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "x.onnx")


@pytest.mark.slow
def test_int8_export_is_quantized_smaller_and_close(tmp_path: Path) -> None:
    """ONNX Runtime's dynamic quantization: integer matrix products, a smaller file, outputs near fp32."""
    torch.manual_seed(3)
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=96, initializer_range=0.1)
    BertModel(config).save_pretrained(tmp_path / "encoder")
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    export_onnx(tmp_path / "encoder", fp32, check=False)
    result = CliRunner().invoke(app, ["export-onnx", "--model", str(tmp_path / "encoder"), "--out", str(int8),
                                      "--int8"])
    assert result.exit_code == 0, result.output
    assert "int8" in result.output and "max abs diff" in result.output
    ops = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    assert int8.stat().st_size < 0.5 * fp32.stat().st_size
    # no temp files left; the int8 report beside the graph
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder", "fp32.onnx", "int8.onnx",
                                                          "int8.quantization_report.json"]
    model = BertModel.from_pretrained(tmp_path / "encoder").eval()
    # outputs (hidden states up to 3.5 in magnitude) within 0.15 of fp32: measured 0.057 here
    assert check_onnx(model, int8, sample_inputs(model, batch=3, length=20, seed=4)) <= 0.15


@pytest.mark.slow
def test_int8_uses_seven_bit_weights_where_the_cpu_lacks_vnni(tmp_path: Path) -> None:
    """Without VNNI, full-range int8 weights saturate ONNX Runtime's 16-bit sums (0.25 off on an AVX2-only
    EPYC): the choice follows the CPU's flags, and 7-bit weights keep the bound (checked here on any CPU)."""
    from bertforge.export import int8_reduce_range, quantize_onnx_int8

    assert int8_reduce_range({"avx2", "avx512f"}) and int8_reduce_range({"avx2"})
    assert not int8_reduce_range({"avx2", "avx512_vnni"}) and not int8_reduce_range({"avx2", "avx_vnni"})
    torch.manual_seed(3)
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=96, initializer_range=0.1)
    model = BertModel(config).eval()
    export_onnx(model, tmp_path / "fp32.onnx", check=False)
    quantize_onnx_int8(tmp_path / "fp32.onnx", tmp_path / "int8-7bit.onnx", reduce_range=True)
    assert check_onnx(model, tmp_path / "int8-7bit.onnx", sample_inputs(model, batch=3, length=20, seed=4)) <= 0.15



# Runs under `qemu-x86_64 -cpu Haswell` (AVX2 without AVX-512 or VNNI): bertforge's own int8 choice for
# the CPU it finds, and full-range weights for comparison, each against PyTorch's outputs.
AVX2_ONLY_CHECK = """
import json, sys
from pathlib import Path
import numpy as np
from bertforge.export import int8_reduce_range, onnx_session, quantize_onnx_int8
from bertforge.precision import cpu_flags

work = Path(sys.argv[1])
data = np.load(work / "reference.npz")
mask = data["attention_mask"].astype(bool)
report = {"flags": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx_vnni"}),
          "reduce_range": int8_reduce_range()}
for name, reduce_range in (("chosen", None), ("full_range", False)):
    quantize_onnx_int8(work / "fp32.onnx", work / f"{name}.onnx", reduce_range=reduce_range)
    session = onnx_session(work / f"{name}.onnx", threads=1)
    hidden, pooled = session.run(None, {i.name: data[i.name] for i in session.get_inputs()})[:2]
    report[name] = max(float(np.abs(hidden - data["hidden"])[mask].max()), float(np.abs(pooled - data["pooled"]).max()))
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None or platform.machine() != "x86_64",
                    reason="emulating an AVX2-only CPU needs qemu-user (apt install qemu-user)")
def test_int8_keeps_its_bound_on_an_emulated_avx2_only_cpu(tmp_path: Path) -> None:
    """The int8 test above on the CPU the bound failed on: qemu's Haswell model has AVX2 but neither
    AVX-512 nor VNNI, so ONNX Runtime takes the same 16-bit-sum kernels as an AVX2-only EPYC. bertforge
    must see that CPU (cpuid, not the host's /proc/cpuinfo, which qemu passes through) and choose 7-bit
    weights that keep the 0.15 bound; full-range weights must not (measured 0.25, the failure seen on
    the real AVX2-only machine), which shows the emulation reproduces it."""
    torch.manual_seed(3)
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=96, initializer_range=0.1)
    model = BertModel(config).eval()
    export_onnx(model, tmp_path / "fp32.onnx", check=False)
    inputs = sample_inputs(model, batch=3, length=20, seed=4)
    with torch.no_grad():
        expected = model(*(inputs[name] for name in INPUTS))
    numpy_inputs = {name: inputs[name].numpy() for name in INPUTS}
    np.savez(tmp_path / "reference.npz", hidden=expected.last_hidden_state.numpy(),
            pooled=expected.pooled_output.numpy(), **numpy_inputs)
    done = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c", AVX2_ONLY_CHECK, str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "avx2" not in report["flags"]:
        pytest.skip("this qemu emulates no AVX2 (qemu 7.2 or later does)")
    assert report["flags"] == ["avx2"] and report["reduce_range"], report
    assert report["chosen"] <= 0.15, report
    assert report["full_range"] > 0.15, report
