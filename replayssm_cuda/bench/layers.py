"""`bench mamba2 layers` and `bench gdn layers`: the slot and fold ops of every layer of a model of one
family, the per-layer loop (the baseline: each layer's own method, one launch per layer, two for commit,
flush and a staggered reset) against LayerCaches' one launch per call (two for commit and flush: the fold
and the cursor kernel).

A model of --layers layers (default 40; Mamba-2 super120b@tp4: H=32 P=64 N=128 G=2, GDN qwen122b@tp4:
H=4 HV=16 K=V=128), --slots slots (default 512), fp32 checkpoints with the --copies read copy, buffer_len
L, T = --tokens draft tokens, staggered_flush. Each op runs on `batch` rows on distinct random slots,
captured in a CUDA graph (µs per call, median of replays; --kernel-times: also each kernel's GPU time per
call); before each replay, outside the timed region, the cursors are put back at random positions in
[0, L - T] with a pending verify of T entries in every slot, so commit and flush fold what a serving step
folds. GB/s: the bytes the op must move over all layers (reset: every byte of the rows' slots written;
copy_slots: read and written; materialize: the checkpoint rows read and the fp32 states written); commit
and flush have none (what they move follows the cursors). LayerCaches.load runs the per-layer loads on
both paths, so it is not timed here.
"""

from __future__ import annotations

import functools
import warnings

import torch

from . import gdn, mamba2, timing
from .mamba2 import COPIES
from .registry import Bench, Case, Measurement

OPS = ("reset", "copy_slots", "commit", "flush", "materialize")


def _mamba2_cache(d, slots, **kw):
    from replayssm_cuda import Mamba2Cache, Mamba2Weights

    cache = Mamba2Cache(slots, d.H, d.P, d.N, d.G, Mamba2Weights(A=-0.5 - torch.rand(d.H, device="cuda")), **kw)
    cache.x_buf.normal_()
    cache.B_buf.normal_()
    cache.dt_buf.uniform_(0, 0.1)
    return cache


def _gdn_cache(d, slots, **kw):
    from replayssm_cuda import DeltaRuleWeights, GDNCache

    weights = DeltaRuleWeights(A_log=torch.log(0.05 + 0.45 * torch.rand(d.HV, device="cuda")),
                               dt_bias=0.5 * torch.randn(d.HV, device="cuda"))
    cache = GDNCache(slots, d.H, d.HV, d.K, d.V, weights, **kw)
    for t in (cache.k_buf, cache.v_buf, cache.u_buf):
        t.normal_(std=0.1)
    cache.g_buf.uniform_(-0.5, 0)
    cache.beta_buf.uniform_(0, 1)
    return cache


MAKE_CACHE = {"mamba2": _mamba2_cache, "gdn": _gdn_cache}


class Model:
    """The --layers caches (and a LayerCaches over them) of one (dims, copy) configuration."""

    def __init__(self, family: str, d, copy: str, layers: int, slots: int, L: int, T: int):
        from replayssm_cuda import LayerCaches

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.caches = [MAKE_CACHE[family](d, slots, buffer_len=L, max_draft_tokens=T,
                                              read_copy_dtype=COPIES[copy], device="cuda", staggered_flush=True,
                                              backend="cuda") for _ in range(layers)]
        self.layers = LayerCaches(self.caches)
        if not (self.layers.one_launch and self.layers.one_launch_fold):
            raise RuntimeError(f"bench {family} layers: this build does not run LayerCaches in one launch "
                               f"({self.layers!r})")
        self.slots, self.L, self.T = slots, L, T
        self.device = self.caches[0].device

    def restore(self, gen_cursors: torch.Tensor):
        """Cursors at the drawn positions and a pending verify of T entries in every slot, every layer."""
        for c in self.caches:
            c.num_committed.copy_(gen_cursors)
            c.num_verified.fill_(self.T)


def op_bytes(op: str, caches, batch: int) -> float | None:
    """The bytes `op` must move on `batch` rows of every cache in `caches` (the byte model above); None for
    commit and flush."""
    slot_bytes = sum(c.bytes_per_slot()["total"] for c in caches)
    ck = caches[0].checkpoint
    if op == "reset":
        return batch * slot_bytes
    if op == "copy_slots":
        return 2 * batch * slot_bytes
    if op == "materialize":
        return batch * len(caches) * ck[0].numel() * (ck.element_size() + 4)
    return None


def measure(model: Model, op: str, path: str, batch: int) -> Measurement:
    m, caches, layers, dev = model, model.caches, model.layers, model.device
    perm = torch.randperm(m.slots, device=dev)
    slots, dst = perm[:batch].clone(), perm[batch:2 * batch].clone() if 2 * batch <= m.slots else perm[:batch].clone()
    accepted = torch.randint(1, m.T + 1, (batch,), device=dev, dtype=torch.int32)
    cursors = torch.randint(0, m.L - m.T + 1, (m.slots,), device=dev, dtype=torch.int32)
    first = caches[0]
    # materialize's output only (fp32 states of every layer's rows: 10 GiB at 40 layers x 256 rows of 1 MiB).
    states = (torch.zeros(len(caches), batch, *first.checkpoint.shape[1:], device=dev) if op == "materialize"
              else None)
    one = path == "one launch"
    calls = {
        "reset": (lambda: layers.reset(slots)) if one else (lambda: [c.reset(slots) for c in caches]),
        "copy_slots": ((lambda: layers.copy_slots(slots, dst)) if one
                       else (lambda: [c.copy_slots(slots, dst) for c in caches])),
        "commit": ((lambda: layers.commit(accepted, slots)) if one
                   else (lambda: [c.commit(accepted, slots) for c in caches])),
        "flush": (lambda: layers.flush(slots)) if one else (lambda: [c.flush(slots) for c in caches]),
        "materialize": ((lambda: layers.materialize(slots, out=states)) if one
                        else (lambda: [c.materialize(slots, out=states[i]) for i, c in enumerate(caches)])),
    }
    seconds, kernels = timing.timed(calls[op], 1, before_replay=lambda: model.restore(cursors))
    return Measurement(seconds, op_bytes(op, caches, batch), kernels=kernels)


@functools.lru_cache(maxsize=1)  # one model at a time: 40 layers of 512 slots are tens of GB
def _model(family, dims_label, d, copy, layers, slots, L, T):
    return Model(family, d, copy, layers, slots, L, T)


def plan_layers(family, args, dims_list):
    cases, notes = [], []
    for d in dims_list:
        for copy in args.copies:
            model = functools.partial(_model, family, d.label, d, copy, args.layers, args.slots, args.buffer_len,
                                      args.tokens)
            for batch in args.batches:
                if batch > args.slots:
                    notes.append(f"batch {batch} skipped: more than --slots {args.slots}")
                    continue
                common = {"dims": d.label, "layers": args.layers, "batch": batch, "copy": copy, "L": args.buffer_len,
                          "T": args.tokens}
                for op in args.ops:
                    base = {**common, "op": op, "path": "loop"}
                    for path in ("loop", "one launch"):
                        cfg = {**common, "op": op, "path": path}
                        cases.append(Case(cfg, lambda model=model, op=op, path=path, batch=batch:
                                          measure(model(), op, path, batch), baseline=base, overridable=False,
                                          meta={"dims": d.text()}))
    return cases, notes


def _arguments(parser):
    parser.add_argument("--layers", type=int, default=40, help="layers of the model (default 40)")
    parser.add_argument("--slots", type=int, default=512, help="slots of every layer's cache (default 512)")
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens T (max_draft_tokens; default 4)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), metavar="OP",
                        help=f"ops to time, of {', '.join(OPS)} (default all)")


def check_args(args) -> None:
    if args.layers < 1 or args.slots < 1:
        raise ValueError(f"--layers and --slots must be >= 1, got {args.layers} and {args.slots}")
    mamba2.check_tokens(args)


LAYERS_DOC = ("µs per call over all layers: each op as the per-layer loop (the baseline) and as LayerCaches' "
              "one launch (CUDA-graph replay).")

for _family, _module, _dims in (("mamba2", mamba2, "super120b@tp4"), ("gdn", gdn, "qwen122b@tp4")):
    _module.FAMILY.add(Bench(
        "layers", "every layer's reset / copy_slots / commit / flush / materialize: loop vs one launch",
        LAYERS_DOC + "\n\n" + __doc__, functools.partial(plan_layers, _family), _arguments, default_dims=(_dims,),
        default_batches=(8, 64, 256), default_copies=("bf16",),
        needs_ops=(*(f"{_family}_{kind}_layers" for kind in ("commit", "flush", "materialize")),
                   "fill_slots_table", "copy_slots_table"),
        check=check_args))
