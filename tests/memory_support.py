"""Hosts' memory as doctor captures it, for the split-check tests: the real
captured outputs' file names (tests/fixtures/macos/SOURCES.md), a Mac's
capture and facts made of one of them and the probe's mlx figures, and Llama
3.3 70B's tensors as mlx-lm's class builds them (shapes only)."""

from __future__ import annotations

import json
from pathlib import Path

from mlxcluster.facts.capture import PROBE, SYSCTL_MEMORY, HostCapture
from mlxcluster.facts.facts import host_facts
from mlxcluster.fit.model_folder import ModelFolder, Tensor

MINI_MEMSIZE = "sysctl_hw_model_hw_memsize_m2pro_mini_mac14_12_32gb_macos26.5.1.txt"
MINI_WIRED = "sysctl_iogpu_wired_limit_mb_default_0_m2pro_mini_mac14_12_32gb_macos26.5.1.txt"
STUDIO_WIRED = "sysctl_iogpu_wired_limit_mb_118000_dynamic_lwm_m4max_studio_mac16_9_128gb.txt"
SET_LOG = "sysctl_set_iogpu_wired_limit_mb_114688_m5max_128gb_launchdaemon_log.txt"
MEMINFO_FILE = "proc_meminfo_linux_dev_box_debian12_24gb.txt"
# Llama 3.3 70B Instruct's public config.json (huggingface.co/meta-llama/Llama-3.3-70B-Instruct), the
# fields mlx-lm's ModelArgs reads.
LLAMA_70B = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
# Metal's recommended working set, measured (SOURCES.md): 21845.34 MB on 32 GB Macs, 107.52 GiB on 128 GiB.
WORKING_SET_32GB = 22906503168
WORKING_SET_128GB = 115448725504


def mini_sysctl(fixtures) -> str:
    """What the probe's `sysctl hw.memsize iogpu.wired_limit_mb` prints on the captured 32 GB Mac mini."""
    return (fixtures / MINI_MEMSIZE).read_text() + (fixtures / MINI_WIRED).read_text()


def mac_capture(name: str, sysctl: str, working_set: int | None = None, memory: int | None = None,
                python: str = "/usr/bin/python3") -> HostCapture:
    """A Mac's capture: its sysctl output, and the probe's mlx (with ``working_set``, what
    mlx reports as max_recommended_working_set_size) and mlx-lm 0.32.2."""
    probe = {"hostname": name, "platform": "darwin", "python": {"executable": python},
             "mlx": {"import_ok": True, "version": "0.32.4"},
             "trainer_modules": {"mlx_lm": {"distribution": "mlx-lm", "found": True, "version": "0.32.2"}}}
    if working_set:
        probe["mlx"]["gpu"] = {"max_recommended_working_set_size": working_set}
    if memory:
        probe["memory_bytes"] = memory
    return HostCapture(name, {PROBE: json.dumps(probe), SYSCTL_MEMORY: sysctl})


def mac(name: str, sysctl: str, working_set: int | None = None, memory: int | None = None):
    """A Mac's facts as doctor reads them from its capture."""
    return host_facts(mac_capture(name, sysctl, working_set, memory))


def nbytes(array) -> int:
    """An array's bytes as a checkpoint stores it: floats in bfloat16 (mlx-lm's conversions), else as is."""
    import mlx.core as mx

    return array.size * 2 if mx.issubdtype(array.dtype, mx.floating) else array.nbytes


def llama_70b_shapes() -> dict[str, ModelFolder]:
    """Llama 3.3 70B in bfloat16 and in mlx-lm's 4 and 5 bits (groups of 64), as folders would hold it: the
    tensors mlx-lm's own class builds from the public config (lazily: shapes only)."""
    import mlx.nn as nn
    import mlx_lm.utils as mu
    from mlx.utils import tree_flatten

    model_class, args_class = mu._get_classes(LLAMA_70B)
    shaped = {}
    for name, bits in (("bf16", None), ("4bit", 4), ("5bit", 5)):
        model = model_class(args_class.from_dict(LLAMA_70B))
        if bits:
            nn.quantize(model, group_size=64, bits=bits)
        tensors = tuple(Tensor(k, nbytes(v), v.ndim) for k, v in tree_flatten(model.parameters()))
        shaped[name] = ModelFolder(Path(f"Llama-3.3-70B-{name}"), LLAMA_70B, tensors, True)
    return shaped
