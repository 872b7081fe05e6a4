"""The README's "Using it" example runs as pasted, on the CPU: the snippet is taken from README.md, its
device becomes "cpu" and its layer sizes small, and every name it uses without defining (the engine's
tensors: weights, prefill states, slot ids, inputs) gets a tensor of the shape its comment states."""

import ast
import builtins
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = {"num_slots": 8, "num_heads": 4, "head_dim": 8, "state_dim": 4, "num_groups": 2}


def using_it_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Using it"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no ```python block under '## Using it'"
    return match.group(1)


def free_names(code: str) -> set[str]:
    """Names the snippet reads and never binds (imports and assignments bind)."""
    tree = ast.parse(code)
    bound, read = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store) else read).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return read - bound


def engine_tensors(H, P, N, G, act, T, batch=3):
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype)

    slot_ids = torch.tensor([5, 0, 7], dtype=torch.int32)[:batch]
    return {
        "A": -(0.5 + torch.rand(H, generator=gen)), "D": rnd(H), "dt_bias": 0.1 * rnd(H),
        "prefill_states": 0.3 * rnd(batch, H, P, N), "slot_ids": slot_ids,
        "x": rnd(batch, H, P, dtype=act), "dt": rnd(batch, H, dtype=act), "B": rnd(batch, G, N, dtype=act),
        "C": rnd(batch, G, N, dtype=act), "z": rnd(batch, H, P, dtype=act),
        "xT": rnd(batch, T, H, P, dtype=act), "dtT": rnd(batch, T, H, dtype=act),
        "BT": rnd(batch, T, G, N, dtype=act), "CT": rnd(batch, T, G, N, dtype=act),
        "zT": rnd(batch, T, H, P, dtype=act),
        # flattened drafts: T, 0 and 1 of them in the three rows (num_accepted stays within each row's)
        "cu_seqlens": torch.tensor([0, T, T, T + 1], dtype=torch.int32)[:batch + 1],
        "xF": rnd(T + 1, H, P, dtype=act), "dtF": rnd(T + 1, H, dtype=act), "BF": rnd(T + 1, G, N, dtype=act),
        "CF": rnd(T + 1, G, N, dtype=act), "zF": rnd(T + 1, H, P, dtype=act),
        "num_accepted": torch.tensor([T, 0, 1], dtype=torch.int32)[:batch],
        "src_slots": slot_ids[:2].clone(), "dst_slots": torch.tensor([1, 2], dtype=torch.int32),
    }


def test_using_it_runs_as_pasted_on_the_cpu(capsys):
    code = using_it_snippet()
    assert 'device="cuda"' in code, "the example is written for the GPU; this test moves it to the CPU"
    code = code.replace('device="cuda"', 'device="cpu"')
    for name, value in SMALL.items():
        code, n = re.subn(rf"\b{name}=\d+", f"{name}={value}", code)
        assert n == 1, f"README example: expected one `{name}=<int>`, found {n}"
    act = getattr(torch, re.search(r"activation_dtype=torch\.(\w+)", code).group(1))
    T = int(re.search(r"max_draft_tokens=(\d+)", code).group(1))
    given = engine_tensors(SMALL["num_heads"], SMALL["head_dim"], SMALL["state_dim"], SMALL["num_groups"], act,
                           min(T, 2))
    unknown = free_names(code) - set(given)
    assert not unknown, f"README example uses {sorted(unknown)}: give them shapes in tests/test_readme.py"
    namespace = {name: given[name] for name in free_names(code)}
    exec(compile(code, "README.md (Using it)", "exec"), namespace)
    cache = namespace["cache"]
    assert namespace["y"].shape == given["xT"].shape
    assert namespace["y_flat"].shape == given["xF"].shape
    assert namespace["state"].shape == (3, *cache.checkpoint.shape[1:])
    assert "total" in capsys.readouterr().out
